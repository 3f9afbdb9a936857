// The scripts alone, without HTTP, all driven the same way (`keys` buckets,
// each decided `calls / keys` times, pipelined, every decision allowed):
// tollgate's lua/token-bucket.lua, the design note's two-field hash script,
// @fastify/rate-limit's counter, and an empty script as the floor of any
// EVALSHA. Per script: Redis time per call (usec / calls of EVALSHA, a
// wall-clock figure that grows when Redis is descheduled mid-call on a busy
// machine), Redis CPU time per call (INFO cpu: the whole server, reading
// and answering included) and bytes per bucket.

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { bucketMemory, commandStats, redisCpuUs, statsDelta } from './stats.mjs'

const require = createRequire(import.meta.url)
const RateLimitRedisStore = require('@fastify/rate-limit/store/RedisStore.js')

const TOLLGATE_LUA = readFileSync(new URL('../lua/token-bucket.lua', import.meta.resolve('tollgate')), 'utf8')
const SEED_LUA = readFileSync(new URL('./seed-token-bucket.lua', import.meta.url), 'utf8')

const CAPACITY = 100
const REFILL = 10
const BATCH = 200

export const SCRIPTS = [
  { name: 'tollgate', label: 'tollgate lua/token-bucket.lua (one integer)' },
  { name: 'seed', label: 'design note script (two-field hash)' },
  { name: 'frl', label: '@fastify/rate-limit Redis store (INCR counter)' },
  { name: 'empty', label: 'empty script (`return 1`): what any EVALSHA costs' }
]

/** Defines the scripts on `redis`; returns, per name, its key names and how to queue one decision on a pipeline. */
export function defineScripts (redis) {
  redis.defineCommand('benchTollgate', { numberOfKeys: 1, lua: TOLLGATE_LUA })
  redis.defineCommand('benchSeed', { numberOfKeys: 1, lua: SEED_LUA })
  redis.defineCommand('benchEmpty', { numberOfKeys: 1, lua: 'return 1' })
  const frl = new RateLimitRedisStore(false, false, redis)
  const windowMs = Math.round(CAPACITY / REFILL * 1000)
  // Each on keys named as in the Fastify runs: tollgate's `<prefix>:{<client>}:<bucket>`
  // (the design note's script is the alternative encoding of the same bucket),
  // @fastify/rate-limit's `<nameSpace><method><url>-<client>`.
  return {
    tollgate: { keyOf: (i) => `tollgate:{c${i}}:GET /w`, call: (p, key) => p.benchTollgate(key, '1', CAPACITY, REFILL, 1) },
    seed: { keyOf: (i) => `tollgate:{c${i}}:GET /w`, call: (p, key) => p.benchSeed(key, CAPACITY, REFILL, 1) },
    frl: { keyOf: (i) => `${frl.key}GET/w-c${i}`, call: (p, key) => p.rateLimit(key, windowMs, CAPACITY, false, false) },
    empty: { keyOf: (i) => `tollgate:{c${i}}:GET /w`, call: (p, key) => p.benchEmpty(key, '1', CAPACITY, REFILL, 1) }
  }
}

/** One measurement of one script on an empty database. */
export async function measureScript (redis, { keyOf, call }, { calls, keys }) {
  await redis.flushall()
  const key = (i) => keyOf(i % keys)
  await run(redis, call, keys, key) // creates every bucket and loads the script
  const before = await commandStats(redis)
  const cpuBefore = await redisCpuUs(redis)
  await run(redis, call, calls, key)
  const cpu = await redisCpuUs(redis) - cpuBefore
  const delta = statsDelta(before, await commandStats(redis))
  return {
    usPerCall: delta.scriptUsec / delta.scriptCalls,
    cpuUsPerCall: cpu / delta.scriptCalls,
    memory: await bucketMemory(redis, '*')
  }
}

async function run (redis, call, calls, keyOf) {
  for (let done = 0; done < calls; done += BATCH) {
    const pipeline = redis.pipeline()
    for (let i = done; i < Math.min(calls, done + BATCH); i++) call(pipeline, keyOf(i))
    for (const [err] of await pipeline.exec()) if (err !== null) throw err
  }
}
