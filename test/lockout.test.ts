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
import { MemoryStore } from '../lib/store/memory-store.js'
import { lockKey, type ExtSpec } from '../lib/store/store.js'
import { buildApp } from './helpers/app.js'
import { redisMicros, scriptCalls } from './helpers/model.js'
import { NO_REDIS_PORT, startRedisServer } from './helpers/redis.js'
import { fleetKey } from './helpers/keys.js'

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
  t.equal(await admin.exists(lockKey(await fleetKey(admin, `lock${prefixes}`, 'alice', 'login'))), 0, 'the lockout key is gone')
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
  await limiter.ready
  const key = lockKey(await fleetKey(admin, prefix, 'alice', 'login'))
  await admin.set(key, String(-(await redisMicros(admin) + 3600e6)))
  const peek = await limiter.peek('alice', login)
  t.ok(peek.retryAfterMs <= 300, `a peek reads it as at most forMs (${peek.retryAfterMs})`)
  t.ok(Number(await admin.get(key)) < -(await redisMicros(admin) + 1000e6), 'and writes nothing')
  const decision = await limiter.consume('alice', login)
  t.ok(decision.locked === true && decision.retryAfterMs <= 300, `a consume too (${decision.retryAfterMs})`)
  t.ok(-Number(await admin.get(key)) <= await redisMicros(admin) + 300e3, 'and writes the clamped block back')
})

t.test('failureMode local: the local store locks out as well', async (t) => {
  const redis = new Redis({ host: '127.0.0.1', port: NO_REDIS_PORT, lazyConnect: true })
  redis.on('error', () => {})
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

t.test('a step back of Redis\'s clock costs at most one counting period: denials spaced past withinMs do not lock out after it', async (t) => {
  // The state a step back of an hour leaves: the count of one denial whose
  // period (withinMs 200) now ends an hour later, in either encoding: the
  // earlier version's (a bare count, its period the key's expiry) and this
  // one's (the first denial's time, an hour ahead). Before, the count ran
  // on for the hour: three denials 300 ms apart started a block of 60 s.
  const HOUR_US = 3600e6
  const policy: Policy = { ...login, lockout: { after: 3, withinMs: 200, forMs: 60_000 } }
  for (const [name, write] of [
    ['a count of the earlier encoding', async (key: string) => { await admin.set(key, '1', 'PX', 3600e3 + 200) }],
    ['a count of this encoding', async (key: string) => { await admin.set(key, `-${await redisMicros(admin) + HOUR_US}.1`, 'PX', 3600e3 + 200) }]
  ] as const) {
    const prefix = `lock${++prefixes}`
    const limiter = createLimiter({ redis: await connect(t), prefix, timeout: 1000 })
    t.teardown(() => limiter.close())
    t.equal((await limiter.consume('alice', policy)).allowed, true, `${name}: the bucket's one token`)
    await write(lockKey(await fleetKey(admin, prefix, 'alice', 'login')))
    const got: Decision[] = []
    for (let i = 0; i < 3; i++) {
      if (i > 0) await sleep(300)
      got.push(await limiter.consume('alice', policy))
    }
    t.same(shape(got), [[false, false], [false, false], [false, false]], `${name}: three denials 300 ms apart, none locked out (the first counts with the one before the step)`)
  }
})

t.test('a count stored by the earlier encoding is read, its period from the key\'s expiry, and rewritten in the new one', async (t) => {
  const prefix = `lock${++prefixes}`
  const limiter = createLimiter({ redis: await connect(t), prefix, timeout: 1000 })
  t.teardown(() => limiter.close())
  const policy: Policy = { ...login, lockout: { after: 3, withinMs: 60_000, forMs: 60_000 } }
  await limiter.consume('alice', policy)
  const key = lockKey(await fleetKey(admin, prefix, 'alice', 'login'))
  await admin.set(key, '1', 'PX', 50_000) // one denial, 10 s ago
  const before = await redisMicros(admin)
  t.same(shape([await limiter.consume('alice', policy)]), [[false, false]], 'the second denial')
  const stored = String(await admin.get(key))
  const [, first, count] = /^-(\d+)\.(\d+)$/.exec(stored) ?? []
  t.equal(count, '2', `now two denials, in the new form (${stored})`)
  const age = before - Number(first)
  t.ok(age >= 10e6 - 5e3 && age <= 10e6 + 50e3, `the first 10 s before (${age} us), read from the expiry`)
  t.same(shape([await limiter.consume('alice', policy)]), [[false, true]], 'the third starts the block')
  // What an earlier version's script does with the new form: `lock + 0` is a
  // number <= 0 that is no block in force, so it counts no denial and fails nothing.
  const read = await admin.eval("local lock = ARGV[1] + 0; return { lock <= 0 and 1 or 0, -lock - tonumber(ARGV[2]) <= 0 and 1 or 0 }", 0, `-${before - 1}.2`, String(before)) as number[]
  t.same(read, [1, 1], 'an earlier version reads the new form as a block that has ended')
})

t.test('the in-process store: a count whose period starts after now (a step back) restarts its period now, and is written back', async (t) => {
  let clock = 1e15
  const memory = new MemoryStore({ now: () => clock })
  const spec: ExtSpec = { key: 'k', capacity: 1, refillPerSecond: 1e-6, cost: 1, maxWaitUs: 0, mayWait: false, lockout: { after: 3, withinMs: 200, forMs: 60_000 } }
  const locked = (): boolean => memory.decideExtSync(spec, true).locked
  t.same([memory.decideExtSync(spec, true).allowed, locked()], [true, false], 'the token, then a first denial')
  clock -= 3600e6
  t.equal(memory.decideExtSync(spec, false).locked, false, 'a peek after the step writes nothing')
  t.equal(locked(), false, 'the second denial, in a period that starts now')
  clock += 300e3
  t.same([locked(), locked()], [false, false], '300 ms later: a new count (1, then 2)')
  t.equal(locked(), true, 'and its third denial within 200 ms starts the block')
})
