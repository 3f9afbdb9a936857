// The scripts alone, without HTTP, all driven the same way (`keys` buckets,
// each decided `calls / keys` times, pipelined, every decision allowed):
// tollgate's lua/token-bucket.lua, the design note's two-field hash script,
// @fastify/rate-limit's counter, and an empty script as the floor of any
// EVALSHA. Per script: Redis time per call (usec / calls of EVALSHA, a
// wall-clock figure that grows when Redis is descheduled mid-call on a busy
// machine), Redis CPU time per call (INFO cpu: the whole server, reading
// and answering included) and bytes per bucket. tollgate's batched script
// is measured as lib sends it, 32 decisions a call, and read per decision.
//
// bench/run.mjs uses SCRIPTS, defineScripts and measureScript. Run alone
// (`node bench/lua.mjs`), this file starts its own redis-server and prints
// the Redis time per call of the seed script, tollgate with one, two and
// three policies, @fastify/rate-limit's counter and the empty script,
// medians of interleaved rounds, with the ratio to the seed: BENCH_ROUNDS
// (default 7), BENCH_LUA_CALLS (20 000).

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { bucketMemory, commandStats, redisCpuUs, statsDelta } from './stats.mjs'

const require = createRequire(import.meta.url)
const RateLimitRedisStore = require('@fastify/rate-limit/store/RedisStore.js')

const TOLLGATE_LUA = readFileSync(new URL('../lua/token-bucket.lua', import.meta.resolve('tollgate')), 'utf8')
const TOLLGATE_BATCH_LUA = readFileSync(new URL('../lua/token-bucket-batch.lua', import.meta.resolve('tollgate')), 'utf8')
const SEED_LUA = readFileSync(new URL('./seed-token-bucket.lua', import.meta.url), 'utf8')

const CAPACITY = 100
const REFILL = 10
const BATCH = 200
/** Decisions per call of the batched script: a turn of 32 requests in flight. */
const PER_BATCH = 32

export const SCRIPTS = [
  { name: 'tollgate', label: 'tollgate lua/token-bucket.lua (one integer)' },
  { name: 'tollgateBatch', label: `tollgate lua/token-bucket-batch.lua, ${PER_BATCH} decisions a call`, per: PER_BATCH },
  { name: 'seed', label: 'design note script (two-field hash)' },
  { name: 'frl', label: '@fastify/rate-limit Redis store (INCR counter)' },
  { name: 'empty', label: 'empty script (`return 1`): what any EVALSHA costs' }
]

/** What the standalone run measures: the seed, tollgate with 1 to 3 policies, the counter, the empty script. */
const ALONE = [
  { name: 'seed', label: 'seed script (two-field hash), one policy' },
  { name: 'tollgate', label: 'tollgate, one policy' },
  { name: 'tollgate2', label: 'tollgate, two policies' },
  { name: 'tollgate3', label: 'tollgate, three policies' },
  { name: 'tollgateBatch', label: `tollgate, batched, ${PER_BATCH} decisions a call (time per decision)`, per: PER_BATCH },
  { name: 'frl', label: '@fastify/rate-limit Redis store (INCR counter)' },
  { name: 'empty', label: 'empty script (`return 1`)' }
]

/**
 * lua/token-bucket.lua's arguments after the keys, as lib's RedisStore sends
 * them: the mode, then per policy its window, the need of its cost and the
 * move of its full-at time, in microseconds.
 */
function tollgateArgs (policies) {
  const step = 1e6 / REFILL
  const args = ['1']
  for (let i = 0; i < policies; i++) args.push(CAPACITY * step, 1 * step, 1 * 1e6 / REFILL)
  return args
}

/** Defines the scripts on `redis`; returns, per name, its key names and how to queue one decision on a pipeline. */
export function defineScripts (redis) {
  redis.defineCommand('benchTollgate', { lua: TOLLGATE_LUA })
  redis.defineCommand('benchTollgateBatch', { lua: TOLLGATE_BATCH_LUA })
  redis.defineCommand('benchSeed', { numberOfKeys: 1, lua: SEED_LUA })
  redis.defineCommand('benchEmpty', { numberOfKeys: 1, lua: 'return 1' })
  const frl = new RateLimitRedisStore(false, false, redis)
  const windowMs = Math.round(CAPACITY / REFILL * 1000)
  const one = tollgateArgs(1)
  // Several policies of one client: the route's bucket and one or two more.
  const several = (policies) => ({
    keyOf: (i) => `tollgate:{c${i}}:GET /w`,
    call: (p, key) => {
      const keys = [key]
      for (let j = 1; j < policies; j++) keys.push(`${key}#${j}`)
      return p.benchTollgate(policies, ...keys, ...tollgateArgs(policies))
    }
  })
  // Each on keys named about as in the Fastify runs: tollgate's `<prefix>:{<tag>}<client>:<bucket>`
  // less its 8-character keyed tag (docs/reference/keys.md), the client in the braces instead
  // (the design note's script is the alternative encoding of the same bucket),
  // @fastify/rate-limit's `<nameSpace><method><url>-<client>`.
  return {
    tollgate: { keyOf: (i) => `tollgate:{c${i}}:GET /w`, call: (p, key) => p.benchTollgate(1, key, ...one) },
    // PER_BATCH decisions from key i on, as lib's RedisStore sends a turn's:
    // the keys, then per decision its mode, its number of buckets, and per
    // bucket its key's index and the three figures of tollgateArgs.
    tollgateBatch: {
      keyOf: (i) => `tollgate:{c${i}}:GET /w`,
      per: PER_BATCH,
      call: (p, _key, i, keyOf) => {
        const keys = []
        const args = []
        for (let j = 0; j < PER_BATCH; j++) {
          keys.push(keyOf(i + j))
          args.push('1', 1, j + 1, ...tollgateArgs(1).slice(1))
        }
        return p.benchTollgateBatch(keys.length, ...keys, ...args)
      }
    },
    tollgate2: several(2),
    tollgate3: several(3),
    seed: { keyOf: (i) => `tollgate:{c${i}}:GET /w`, call: (p, key) => p.benchSeed(key, CAPACITY, REFILL, 1) },
    frl: { keyOf: (i) => `${frl.key}GET/w-c${i}`, call: (p, key) => p.rateLimit(key, windowMs, CAPACITY, false, false) },
    empty: { keyOf: (i) => `tollgate:{c${i}}:GET /w`, call: (p, key) => p.benchEmpty(key, '1', CAPACITY, REFILL, 1) }
  }
}

/**
 * One measurement of one script on an empty database: Redis time per call
 * and per decision (the same but for a batched script), Redis CPU per call,
 * bytes per bucket.
 */
export async function measureScript (redis, { keyOf, call, per = 1 }, { calls, keys }) {
  await redis.flushall()
  const key = (i) => keyOf(i % keys)
  await run(redis, call, per, keys, key) // creates every bucket and loads the script
  const before = await commandStats(redis)
  const cpuBefore = await redisCpuUs(redis)
  await run(redis, call, per, calls, key)
  const cpu = await redisCpuUs(redis) - cpuBefore
  const delta = statsDelta(before, await commandStats(redis))
  return {
    usPerCall: delta.scriptUsec / delta.scriptCalls,
    usPerDecision: delta.scriptUsec / (delta.scriptCalls * per),
    cpuUsPerCall: cpu / delta.scriptCalls,
    memory: await bucketMemory(redis, '*')
  }
}

/** `calls` decisions, `per` a call, pipelined BATCH calls at a time. */
async function run (redis, call, per, calls, keyOf) {
  for (let done = 0; done < calls; done += BATCH * per) {
    const pipeline = redis.pipeline()
    for (let i = done; i < Math.min(calls, done + BATCH * per); i += per) call(pipeline, keyOf(i), i, keyOf)
    for (const [err] of await pipeline.exec()) if (err !== null) throw err
  }
}

function median (values) {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2
}

async function main () {
  const { Redis } = await import('ioredis')
  const { startRedis } = await import('./redis.mjs')
  const rounds = Math.round(Number(process.env.BENCH_ROUNDS ?? 7))
  const calls = Math.round(Number(process.env.BENCH_LUA_CALLS ?? 20_000))
  const server = await startRedis()
  const redis = new Redis({ host: server.host, port: server.port })
  try {
    const version = /redis_version:(\S+)/.exec(await redis.info('server'))?.[1] ?? 'unknown'
    const scripts = defineScripts(redis)
    const times = Object.fromEntries(ALONE.map((s) => [s.name, []]))
    for (let round = 0; round < rounds; round++) {
      // A different script goes first in each round, so none always runs on a cold machine.
      for (let i = 0; i < ALONE.length; i++) {
        const { name } = ALONE[(i + round) % ALONE.length]
        times[name].push((await measureScript(redis, scripts[name], { calls, keys: 1000 })).usPerDecision)
      }
    }
    const seed = median(times.seed)
    const out = [
      `Redis ${version}; ${rounds} rounds of ${calls} pipelined decisions over 1,000 buckets (capacity ${CAPACITY}, ${REFILL}/s, cost 1, ` +
        'all allowed); Redis µs per decision = usec of EVALSHA in INFO commandstats / decisions (a call decides one, but for the batched script); medians of the rounds.',
      '',
      '| script | Redis µs/decision | ratio to the seed | rounds |',
      '| --- | ---: | ---: | --- |'
    ]
    for (const { name, label } of ALONE) {
      const us = median(times[name])
      out.push(`| ${label} | ${us.toFixed(2)} | ${(us / seed).toFixed(3)} | ${times[name].map((x) => x.toFixed(2)).join(' ')} |`)
    }
    const one = median(times.tollgate)
    const perExtra = (median(times.tollgate3) - one) / 2
    out.push('', `tollgate: ${perExtra.toFixed(2)} µs per extra policy (three policies less one, halved), ` +
      `against ${one.toFixed(2)} µs for one policy (${(one - median(times.empty)).toFixed(2)} µs above the empty script).`)
    process.stdout.write(out.join('\n') + '\n')
  } finally {
    redis.disconnect()
    await server.stop()
  }
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) await main()
