// Deliberately broken limiters, the two mistakes of the design note, to show
// that the race and clock tests catch them:
// - `naiveBucketHook`: the read-modify-write in application code (GET the
//   bucket, decide in JavaScript, SET it back), which races across servers;
// - `trustAppClock`: lua/token-bucket.lua changed to take `now` from the
//   app server instead of Redis TIME.

import { createHash } from 'node:crypto'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { Cluster, Redis } from 'ioredis'
import { TOKEN_BUCKET } from '../../lib/store/redis-store.js'

type RedisClient = Redis | Cluster

export interface NaiveOptions {
  key: string
  capacity: number
  refillPerSecond: number
}

/**
 * An onRequest hook limiting with a token bucket kept as "tokens:timestampMs"
 * in one key: GET, refill and decide in JavaScript, SET. Two requests that
 * both GET before either SETs both spend the same token. Nothing is added
 * between the read and the write to widen the race: the round trip of the
 * GET's reply and the requests the event loop serves meanwhile are enough.
 */
export function naiveBucketHook (redis: Redis, options: NaiveOptions) {
  const { key, capacity, refillPerSecond } = options
  return async function naiveCheck (_request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const stored = await redis.get(key)
    const now = Date.now()
    let tokens = capacity
    if (stored !== null) {
      const [held, at] = stored.split(':').map(Number) as [number, number]
      tokens = Math.min(capacity, held + Math.max(0, now - at) / 1000 * refillPerSecond)
    }
    const allowed = tokens >= 1
    if (allowed) tokens -= 1
    await redis.set(key, `${tokens}:${now}`, 'PX', 60_000)
    if (!allowed) await reply.code(429).send({ error: 'naive limiter: rate limited' })
  }
}

/**
 * The token-bucket script with its clock taken from the last ARGV (the app's
 * microseconds) instead of Redis TIME. Everything else is unchanged.
 */
export function clockTrustingScript (lua: string): string {
  const readsTime = /local t = redis\.call\('TIME'\)\r?\nlocal now = [^\n]*\n/
  if (!readsTime.test(lua)) {
    throw new Error('lua/token-bucket.lua no longer reads TIME the way clockTrustingScript expects; update the helper')
  }
  return lua.replace(readsTime, 'local now = tonumber(ARGV[#ARGV])\n')
}

/**
 * Makes tollgate, on this client, run the clock-trusting variant of `lua`
 * with this process's Date.now() (in microseconds) appended to the
 * arguments: the client's EVALSHA of tollgate's token-bucket script runs
 * the variant instead (EVAL on NOSCRIPT), every other call goes through.
 * Works on Redis and Cluster alike: EVALSHA/EVAL are routed by their keys.
 */
export function trustAppClock (redis: RedisClient, lua: string): void {
  const variant = clockTrustingScript(lua)
  const sha = createHash('sha1').update(variant).digest('hex')
  type Args = Array<string | number>
  const evalsha = redis.evalsha.bind(redis) as (sha: string, numKeys: number, ...args: Args) => Promise<unknown>
  const evalLua = redis.eval.bind(redis) as (lua: string, numKeys: number, ...args: Args) => Promise<unknown>
  const replaced = async (script: string, numKeys: number, ...args: Args): Promise<unknown> => {
    if (script !== TOKEN_BUCKET.sha) return await evalsha(script, numKeys, ...args)
    const withClock = [...args, Date.now() * 1000]
    try {
      return await evalsha(sha, numKeys, ...withClock)
    } catch (err) {
      if (!(err instanceof Error) || !err.message.startsWith('NOSCRIPT')) throw err
      return await evalLua(variant, numKeys, ...withClock)
    }
  }
  // Object.assign types the client as having both the overloads and `replaced`.
  Object.assign(redis, { evalsha: replaced })
}

/**
 * A concurrency slot taken in application code: drop ended leases and count
 * (one round trip), decide in JavaScript, then add (another). Two requests
 * that both count before either adds both take the last slot: the race
 * lua/concurrency.lua exists to prevent (test/concurrency.test.ts).
 */
export async function naiveAcquire (redis: Redis, key: string, max: number, id: string, leaseMs: number): Promise<boolean> {
  const now = Date.now()
  await redis.zremrangebyscore(key, '-inf', now)
  const taken = await redis.zcard(key)
  if (taken >= max) return false
  await redis.zadd(key, now + leaseMs, id)
  await redis.pexpire(key, leaseMs)
  return true
}
