// Property test: lua/token-bucket-batch.lua decides a batch of requests
// exactly as lua/token-bucket.lua decides the same requests one call each,
// in the same order: the same reply integers, and the same stored full-at
// times and TTLs, to the last microsecond and millisecond.
//
// To compare exactly, both script texts run on a clock the test sets: in
// each, and in the same way, `redis.call('TIME')` becomes a read of a list
// the test writes (seconds, microseconds), and `redis.call('PSETEX', k, ms,
// v)` becomes a SET of k plus the TTL recorded in a hash, so no key expires
// by Redis's own clock while the test's clock stands still (withTestClock
// below). The batch runs on keys under one prefix, the single calls on the
// same keys under another, at the same instant; then both are read back.
// The clock moves by random gaps between batches, forward and, now and
// then, back by more than a window (the clock-step clamp).
//
// The random sequences hold multi-policy requests, peeks, costs above and
// below what is left, fractional rates and costs, and the same client
// several times in one batch (which must see the earlier request's spend).
//
// What it catches: the last test runs a mutant of the batch script that
// reads every key as it was before the batch (it forgets to carry a
// request's spend to the next request on the same key), and requires the
// comparison to find it. TOLLGATE_TEST_BATCH_LUA=<file> swaps in another
// text of the batch script; TOLLGATE_SEED=<seed> replays a run.

import { randomInt } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { Redis } from 'ioredis'
import t from 'tap'
import { LUA, LuaRunner, randomSource, scriptArgs, uniqueTag, type ScriptSpec } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'

const BATCH_LUA = readFileSync(process.env.TOLLGATE_TEST_BATCH_LUA ?? new URL('../lua/token-bucket-batch.lua', import.meta.url), 'utf8')

const seed = process.env.TOLLGATE_SEED === undefined ? randomInt(2 ** 31) : Number(process.env.TOLLGATE_SEED)
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)

const url = await redisUrl(t)
const redis = new Redis(url)
t.teardown(() => { redis.disconnect() })

const run = uniqueTag('batch')
const CLOCK = `test:${run}:clock`
const TTLS = `test:${run}:ttls`

/**
 * `lua` on the test's clock: TIME read from the list CLOCK, each PSETEX a
 * SET plus its TTL in the hash TTLS. Throws when the text no longer has
 * the lines this rewrites.
 */
function withTestClock (lua: string): string {
  const time = "redis.call('TIME')"
  const psetex = "redis.call('PSETEX', "
  if (!lua.includes(time) || !lua.includes(psetex)) throw new Error('the script no longer reads TIME or writes with PSETEX; update withTestClock')
  const helper = `local function psetex (k, ms, v)\n  redis.call('SET', k, v)\n  redis.call('HSET', '${TTLS}', k, ms)\nend\n`
  return helper + lua.replaceAll(time, `redis.call('LRANGE', '${CLOCK}', 0, 1)`).replaceAll(psetex, 'psetex(')
}

const single = new LuaRunner(redis, withTestClock(LUA))

interface Policy { bucket: string, capacity: number, refillPerSecond: number, costs: number[] }

// Windows from 0.1 s to 100 s; token intervals whole and not.
const POLICIES: Policy[] = [
  { bucket: 'a', capacity: 5, refillPerSecond: 10, costs: [1, 2, 0.5] },
  { bucket: 'b', capacity: 2.5, refillPerSecond: 37.5, costs: [0.5, 1, 1.25, 2.5] },
  { bucket: 'c', capacity: 3, refillPerSecond: 0.3, costs: [0.05, 0.1, 1, 3] },
  { bucket: 'd', capacity: 100, refillPerSecond: 1000 / 7, costs: [1, 5, 25] },
  { bucket: 'e', capacity: 1, refillPerSecond: 60, costs: [1] }
]

interface Request { client: string, policies: Policy[], costs: number[], consume: boolean }

/** The specs of a request under `prefix`. */
function specsOf (prefix: string, request: Request): ScriptSpec[] {
  return request.policies.map((p, i) => ({
    key: `${prefix}:{${request.client}}:${p.bucket}`, capacity: p.capacity, refillPerSecond: p.refillPerSecond, cost: request.costs[i] as number
  }))
}

/** The batch script's keys and arguments, as lib's RedisStore builds them. */
function batchArgs (requests: ReadonlyArray<readonly ScriptSpec[]>, consumes: readonly boolean[]): [string[], Array<string | number>] {
  const keys: string[] = []
  const index = new Map<string, number>()
  const args: Array<string | number> = []
  requests.forEach((specs, r) => {
    args.push(consumes[r] === true ? '1' : '0', specs.length)
    for (const s of specs) {
      let k = index.get(s.key)
      if (k === undefined) {
        keys.push(s.key)
        index.set(s.key, k = keys.length)
      }
      const step = 1e6 / s.refillPerSecond
      args.push(k, s.capacity * step, s.cost * step, s.cost * 1e6 / s.refillPerSecond)
    }
  })
  return [keys, args]
}

async function setClock (us: number): Promise<void> {
  await redis.multi().del(CLOCK).rpush(CLOCK, Math.floor(us / 1e6), us % 1e6).exec()
}

/** What one stored bucket holds: its full-at time and the TTL of its last write, as strings (null: none). */
async function stored (keys: readonly string[]): Promise<Array<[string | null, string | null]>> {
  if (keys.length === 0) return []
  const values = await redis.mget(...keys)
  const ttls = await redis.hmget(TTLS, ...keys)
  return keys.map((_, i) => [values[i] ?? null, ttls[i] ?? null])
}

/**
 * Runs `steps` random batches with `batchLua` against single calls; the
 * first difference found, or undefined.
 */
async function compare (batchLua: string, runSeed: number, steps: number, label: string): Promise<string | undefined> {
  const batch = new LuaRunner(redis, withTestClock(batchLua))
  const random = randomSource(runSeed)
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)] as T
  const tag = uniqueTag(label).slice(1, -1)
  const clients = ['x', 'y', 'z', 'w'].map((c) => `${tag}-${c}`)
  const A = `test:${tag}:A`
  const B = `test:${tag}:B`
  let now = 1_700_000_000_000_000 + Math.floor(random() * 1e6)
  const allKeys = (prefix: string): string[] => clients.flatMap((c) => POLICIES.map((p) => `${prefix}:{${c}}:${p.bucket}`))
  for (let step = 0; step < steps; step++) {
    // Mostly short gaps (a few ms), some long ones, now and then a step back.
    const roll = random()
    now += roll < 0.05 ? -Math.floor(random() * 200e6) : roll < 0.15 ? Math.floor(random() * 5e6) : Math.floor(random() * 20_000)
    await setClock(now)
    const size = 1 + Math.floor(random() * 12)
    const requests: Request[] = []
    for (let r = 0; r < size; r++) {
      const count = 1 + Math.floor(random() * 3)
      const policies: Policy[] = []
      while (policies.length < count) {
        const p = pick(POLICIES)
        if (!policies.includes(p)) policies.push(p)
      }
      requests.push({ client: pick(clients.slice(0, 2 + Math.floor(random() * 3))), policies, costs: policies.map((p) => pick(p.costs)), consume: random() >= 0.2 })
    }
    const [keys, args] = batchArgs(requests.map((q) => specsOf(A, q)), requests.map((q) => q.consume))
    const batched = await batch.eval(keys, args) as unknown
    const singles: number[] = []
    for (const q of requests) {
      const specs = specsOf(B, q)
      const all = scriptArgs(specs, q.consume)
      const reply = await single.eval(all.slice(0, specs.length) as string[], all.slice(specs.length))
      singles.push(...(Array.isArray(reply) ? reply as number[] : [reply as number]))
    }
    const where = `step ${step} at ${now}, requests ${JSON.stringify(requests.map((q) => ({ client: q.client.slice(-1), buckets: q.policies.map((p) => p.bucket), costs: q.costs, consume: q.consume })))}`
    if (JSON.stringify(batched) !== JSON.stringify(singles)) return `${where}: batch replied ${JSON.stringify(batched)}, single calls ${JSON.stringify(singles)}`
    const [a, b] = [await stored(allKeys(A)), await stored(allKeys(B))]
    if (JSON.stringify(a) !== JSON.stringify(b)) return `${where}: batch left ${JSON.stringify(a)}, single calls ${JSON.stringify(b)}`
  }
  return undefined
}

t.test('the batch script decides as the single script does, request by request', async (t) => {
  for (let i = 0; i < 6; i++) {
    const difference = await compare(BATCH_LUA, seed + i * 7919, 150, `prop${i}`)
    t.equal(difference, undefined, `run ${i} (seed ${seed + i * 7919}): no difference`)
  }
})

t.test('the comparison catches a batch that does not carry a spend to the next request on the same key', async (t) => {
  const carry = '      busy[k] = b\n'
  t.ok(BATCH_LUA.includes(carry), 'the batch script carries each spend forward on this line')
  const mutant = BATCH_LUA.replace(carry, '')
  let caught: string | undefined
  for (let i = 0; i < 6 && caught === undefined; i++) caught = await compare(mutant, seed + i * 104729, 100, `mutant${i}`)
  t.type(caught, 'string', 'the mutant is caught')
  t.comment(caught)
})

t.test('an error writes nothing: a stored value that is not a bucket, a key of another type, a bad argument', async (t) => {
  const batch = new LuaRunner(redis, BATCH_LUA)
  const tag = uniqueTag('errors')
  const good = `test:${tag}:good`
  const one = (k: number): Array<string | number> => ['1', 1, k, 1e6, 1e5, 1e5]
  for (const text of ['abc', 'nan', 'inf', '123456789012345678901234567890']) {
    await redis.set(`test:${tag}:text`, text)
    await t.rejects(batch.eval([good, `test:${tag}:text`], [...one(1), ...one(2)]), /^WRONGTYPE test:\{.*\}:text holds a string that is not a tollgate bucket/,
      `${JSON.stringify(text)} fails the call, naming the key`)
    t.equal(await redis.exists(good), 0, 'the good key before it was not written')
    t.equal(await redis.get(`test:${tag}:text`), text, 'nor the bad one')
  }
  await redis.hset(`test:${tag}:hash`, 'f', '1')
  await t.rejects(batch.eval([good, `test:${tag}:hash`], [...one(1), ...one(2)]), /^WRONGTYPE test:\{.*\}:hash holds a hash that is not a tollgate bucket/, 'a key of another type fails the call')
  t.equal(await redis.exists(good), 0, 'nothing written')
  await t.rejects(batch.eval([good, `test:${tag}:other`], [...one(1), '1', 1, 2, 1e6, 1e5, 'nan']), /not a whole number of microseconds below 1e17/,
    'a computed full-at time that is not a number fails the call before the first write')
  t.equal(await redis.exists(good), 0, 'the good key before it was not written')
  await t.rejects(batch.eval([good], [...one(1), '1', 1, 1, 'x', 1e5, 1e5]), /arithmetic|number|compare/, 'a window that is not a number fails the call')
  await t.rejects(batch.eval([good], [...one(1), '1', 1, 2, 1e6, 1e5, 1e5]), /compare|nil/, 'a key index out of range fails the call')
  t.equal(await redis.exists(good), 0, 'nothing written')
  t.same(await batch.eval([good], [...one(1), ...one(1)]), [100000, 200000], 'the same arguments without the bad request: both spend, the second after the first')
  const pttl = await redis.pttl(good)
  t.ok(pttl > 190 && pttl <= 201, `its TTL is that of the last write (201 ms, read ${pttl})`)
})
