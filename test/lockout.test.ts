// Lockouts (`lockout: { after, withinMs, forMs }`): after `after` denials
// within `withinMs` of the first, the client is blocked for `forMs`,
// decided in the same script call as its bucket (lua/token-bucket-ext.lua),
// the same for every limiter of a fleet, with the rest of the block as
// Retry-After; reset clears it. The in-process store decides alike. This
// file runs its own redis-server, so script calls can be counted.

import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { createLimiter, type Decision, type Policy } from '../lib/index.js'
import { MemoryStore } from '../lib/memory-store.js'
import { lockKey, type ExtSpec } from '../lib/store.js'
import { buildApp } from './helpers/app.js'
import { redisMicros, scriptCalls } from './helpers/model.js'
import { startRedisServer } from './helpers/redis.js'

const server = await startRedisServer()
t.teardown(() => server.stop())

async function connect (tt: { teardown: (fn: () => unknown) => void }): Promise<Redis> {
  const redis = new Redis(server.url, { lazyConnect: true })
  await redis.connect()
  tt.teardown(() => { redis.disconnect() })
  return redis
}
const admin = await connect(t)

const NO_REFILL = 1e-6
const login: Policy = { bucket: 'login', capacity: 1, refillPerSecond: NO_REFILL, failureMode: 'closed', lockout: { after: 3, withinMs: 60_000, forMs: 300 } }
let prefixes = 0

/** [allowed, locked, retryAfterMs rounded to 10 ms] of each decision. */
const shape = (list: Decision[]): Array<[boolean, boolean]> => list.map((d) => [d.allowed, d.locked === true])

t.test('the third denial starts the block; every call is then denied with the rest of it; after it, denials count again', async (t) => {
  const limiter = createLimiter({ redis: await connect(t), prefix: `lock${++prefixes}`, timeout: 1000 })
  t.teardown(() => limiter.close())
  const got: Decision[] = []
  for (let i = 0; i < 5; i++) got.push(await limiter.consume('alice', login, 1))
  t.same(shape(got), [[true, false], [false, false], [false, false], [false, true], [false, true]])
  t.equal((got[3] as Decision).retryAfterMs, 300, 'the denial that starts the block says its whole length')
  t.ok((got[4] as Decision).retryAfterMs <= 300 && (got[4] as Decision).retryAfterMs > 0, 'then the rest of it')
  t.same(shape([await limiter.consume('bob', login)]), [[true, false]], 'another client is not blocked')
  await sleep(350)
  const after: Decision[] = []
  for (let i = 0; i < 3; i++) after.push(await limiter.consume('alice', login))
  t.same(shape(after), [[false, false], [false, false], [false, true]], 'after the block, the bucket is still empty and denials count from zero')
})

t.test('exact across a fleet: two limiters on their own clients count the same denials', async (t) => {
  const a = createLimiter({ redis: await connect(t), prefix: `lock${++prefixes}`, timeout: 1000 })
  const b = createLimiter({ redis: await connect(t), prefix: `lock${prefixes}`, timeout: 1000 })
  t.teardown(async () => { await a.close(); await b.close() })
  const policy = { ...login, lockout: { after: 4, withinMs: 60_000, forMs: 60_000 } }
  const got: Decision[] = []
  for (let i = 0; i < 6; i++) got.push(await (i % 2 === 0 ? a : b).consume('alice', policy))
  t.same(shape(got), [[true, false], [false, false], [false, false], [false, false], [false, true], [false, true]], 'the 4th denial across both starts the block')
})

t.test('reset clears the block and the count; a peek sees the block and writes nothing', async (t) => {
  const limiter = createLimiter({ redis: await connect(t), prefix: `lock${++prefixes}`, timeout: 1000 })
  t.teardown(() => limiter.close())
  const policy = { ...login, lockout: { after: 1, withinMs: 1000, forMs: 60_000 } }
  await limiter.consume('alice', policy)
  t.equal((await limiter.consume('alice', policy)).locked, true)
  const peek = await limiter.peek('alice', policy)
  t.same([peek.allowed, peek.locked], [false, true], 'a peek sees the block')
  await limiter.reset('alice', 'login')
  t.equal(await admin.exists(`lock${prefixes}:{alice}:login!lockout`), 0, 'the lockout key is gone')
  t.same(shape([await limiter.consume('alice', policy)]), [[true, false]], 'allowed again')
})

t.test('a block is cached: a flooding blocked client costs no store call', async (t) => {
  const limiter = createLimiter({ redis: await connect(t), prefix: `lock${++prefixes}`, timeout: 1000 })
  t.teardown(() => limiter.close())
  const policy = { ...login, lockout: { after: 1, withinMs: 1000, forMs: 60_000 } }
  await limiter.consume('alice', policy)
  await limiter.consume('alice', policy)
  const before = await scriptCalls(admin)
  for (let i = 0; i < 20; i++) t.equal((await limiter.consume('alice', policy)).locked, true)
  t.equal(await scriptCalls(admin) - before, 0, 'no call during the block')
})

t.test('a block read as further away than forMs (Redis\'s clock stepped back) counts as forMs, and is written back', async (t) => {
  const prefix = `lock${++prefixes}`
  const limiter = createLimiter({ redis: await connect(t), prefix, timeout: 1000, denialCache: false })
  t.teardown(() => limiter.close())
  const key = lockKey(`${prefix}:{alice}:login`)
  await admin.set(key, String(-(await redisMicros(admin) + 3600e6)))
  const peek = await limiter.peek('alice', login)
  t.ok(peek.retryAfterMs <= 300, `a peek reads it as at most forMs (${peek.retryAfterMs})`)
  t.ok(Number(await admin.get(key)) < -(await redisMicros(admin) + 1000e6), 'and writes nothing')
  const decision = await limiter.consume('alice', login)
  t.ok(decision.locked === true && decision.retryAfterMs <= 300, `a consume too (${decision.retryAfterMs})`)
  t.ok(-Number(await admin.get(key)) <= await redisMicros(admin) + 300e3, 'and writes the clamped block back')
})

t.test('failureMode local: the local store locks out as well', async (t) => {
  const redis = new Redis('redis://127.0.0.1:1', { lazyConnect: true })
  t.teardown(() => { redis.disconnect() })
  const limiter = createLimiter({ redis, prefix: `lock${++prefixes}` })
  t.teardown(() => limiter.close())
  const policy: Policy = { ...login, failureMode: 'local', local: { capacity: 1, refillPerSecond: NO_REFILL } }
  const got: Decision[] = []
  for (let i = 0; i < 5; i++) got.push(await limiter.consume('alice', policy))
  t.same(shape(got), [[true, false], [false, false], [false, false], [false, true], [false, true]])
  t.ok(got.every((d) => d.source === 'local'))
  const open = await limiter.consume('alice', { ...policy, bucket: 'other', failureMode: 'open' })
  t.equal(open.source, 'fail-open', 'without a local limit, the failure mode decides')
})

t.test('the in-process store decides like the script, on the same clock', async (t) => {
  let clock = 0
  const memory = new MemoryStore({ now: () => clock })
  const spec: ExtSpec = { key: 'k', capacity: 1, refillPerSecond: 1, cost: 1, maxWaitUs: 0, mayWait: false, lockout: { after: 2, withinMs: 10, forMs: 5 } }
  const values = (): [boolean, number, boolean] => {
    const r = memory.decideExtSync(spec, true)
    return [r.allowed, r.bucket.waitUs, r.locked]
  }
  t.same(values(), [true, 0, false], 'allowed')
  t.same(values(), [false, 1e6, false], 'first denial')
  clock = 11_000
  t.same(values(), [false, 989_000, false], 'the period ended: this denial is the first again')
  t.same(values(), [false, 5000, true], 'second: blocked for 5 ms')
  clock = 16_000
  t.same(values(), [false, 984_000, false], 'at the block\'s end (its entry not yet expired), denials count from zero')
  t.same(values(), [false, 5000, true])
  const peekStep = memory.decideExtSync(spec, false)
  t.same([peekStep.allowed, peekStep.locked], [false, true])
  clock = 10_000 // a step back of 6 ms: the block is read (and by a consume written back) as 5 ms from now
  t.same([memory.decideExtSync(spec, false).bucket.waitUs, values()[1], values()[1]], [5000, 5000, 5000])
  await memory.reset('k')
  clock = 2e6
  t.same(values(), [true, 0, false], 'reset forgets the block')
})

t.test('a route: the block is a 429 whose Retry-After is its rest', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { redis: await connect(t), capacity: 1, refillPerSecond: NO_REFILL },
    routes (app) {
      app.post('/login', { config: { rateLimit: { lockout: { after: 2, withinMs: 60_000, forMs: 600_000 } } } }, async () => 'ok')
    }
  })
  const codes: number[] = []
  let last
  for (let i = 0; i < 4; i++) {
    last = await app.inject({ method: 'POST', url: '/login' })
    codes.push(last.statusCode)
  }
  t.same(codes, [200, 429, 429, 429])
  t.equal(last?.headers['retry-after'], '600', 'ten minutes')
})

t.test('options: lockout is checked, and serves single-policy checks only', async (t) => {
  const limiter = createLimiter()
  t.teardown(() => limiter.close())
  const bad = (lockout: unknown): Promise<Decision> => limiter.consume('c', { ...login, lockout: lockout as Policy['lockout'] })
  await t.rejects(bad(5), { code: 'TOLLGATE_INVALID_OPTION', message: /`policy.lockout` must be an object \{ after, withinMs, forMs \}, got 5/ })
  await t.rejects(bad({ after: 1.5, withinMs: 1, forMs: 1 }), { message: /`policy.lockout.after` must be an integer > 0, got 1.5/ })
  await t.rejects(bad({ after: 1, withinMs: 1 }), { message: /`policy.lockout.forMs` must be an integer > 0 \(ms\), got undefined/ })
  await t.rejects(bad({ after: 1, withinMs: 1, forMs: 4e10 }), { message: /`policy.lockout.forMs` must be at most 31536000000/ })
  await t.rejects(limiter.consume('c', [login, { ...login, bucket: 'b', lockout: undefined }]), { message: /`policy\[0\].lockout` must be unset in an array of policies/ })
  await t.rejects(buildApp(t, { plugin: { redis: undefined, capacity: 1, refillPerSecond: 1, lockout: { after: 1, withinMs: 1, forMs: 1 } }, routes (app) { app.get('/two', { config: { rateLimit: [{}, { bucket: 'b' }] } }, async () => 'ok') } }),
    { message: /rateLimit\[0\].lockout` must be unset in an array of policies/ })
})
