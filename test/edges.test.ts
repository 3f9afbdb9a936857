// Edge cases that the feature files do not reach: unusual route shapes,
// programmatic policies over plugin-level cost functions, the local
// fallback under draft-10 headers, a lease call that fails, a reset that
// Redis refuses, error messages for values that cannot be printed, and the
// bookkeeping of the shared deadline timer.

import t from 'tap'
import { Redis } from 'ioredis'
import { createLimiter, type Policy } from '../lib/index.js'
import { Deadlines } from '../lib/core/deadline.js'
import { describe, StoreError } from '../lib/core/errors.js'
import { MemoryStore } from '../lib/store/memory-store.js'
import { buildApp } from './helpers/app.js'
import { NO_REDIS_PORT, redisUrl, startRedisServer, type TeardownTarget } from './helpers/redis.js'

await redisUrl(t)

const IP = '127.0.0.1'

/** A client to a port where nothing listens: never ready, fails fast. */
async function deadClient (t: TeardownTarget): Promise<Redis> {
  const redis = new Redis({ port: NO_REDIS_PORT, lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  return redis
}

t.test('an explicit HEAD route without a GET route has its own bucket', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 2, refillPerSecond: 0.01 },
    routes: (app) => { app.head('/only-head', async (_req, reply) => { reply.send() }) }
  })
  t.equal((await app.inject({ method: 'HEAD', url: '/only-head' })).statusCode, 200)
  t.same(await keys(), [`${prefix}:{${IP}}:GET /only-head`], 'named like a GET route')
})

t.test('a route hook given as a single function is kept and runs before the check', async (t) => {
  const order: string[] = []
  const { app } = await buildApp(t, {
    plugin: { capacity: 1, refillPerSecond: 0.01 },
    routes: (app) => {
      app.get('/hooked', { onRequest: async () => { order.push('route hook') } }, async () => {
        order.push('handler')
        return 'ok'
      })
    }
  })
  const first = await app.inject('/hooked')
  const second = await app.inject('/hooked')
  t.equal(first.statusCode, 200)
  t.equal(second.statusCode, 429, 'the limit still applies')
  t.same(order, ['route hook', 'handler', 'route hook'], 'the route\'s own hook runs first, every time')
})

t.test('further policies of an array without a bucket are named #1, #2', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 1 },
    routes: (app) => {
      app.get('/tiers', { config: { rateLimit: [{ capacity: 3 }, { capacity: 4 }, { capacity: 5 }] } }, async () => 'ok')
    }
  })
  t.equal((await app.inject('/tiers')).statusCode, 200)
  t.same(await keys(), [
    `${prefix}:{${IP}}:GET /tiers`,
    `${prefix}:{${IP}}:GET /tiers#1`,
    `${prefix}:{${IP}}:GET /tiers#2`
  ].sort())
})

t.test('app.tollgate over a plugin-level cost function', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 10, refillPerSecond: 0.01, cost: () => 4 }
  })
  const policy = { bucket: 'manual' }
  const d = await app.tollgate.consume('someone', policy)
  t.equal(d.remaining, 9, 'the function needs a request, so a programmatic call costs 1')
  t.equal((await app.tollgate.consume('someone', policy, 4)).remaining, 5, 'or the cost passed in')
  await t.rejects(app.tollgate.consume('someone', null as never), {
    name: 'TypeError', message: /`policy` must be a policy object, got null/
  })
})

t.test('the local fallback under draft-10 headers describes the local policy', async (t) => {
  const { app } = await buildApp(t, {
    plugin: {
      redis: await deadClient(t),
      capacity: 100,
      refillPerSecond: 10,
      failureMode: 'local',
      local: { capacity: 2, refillPerSecond: 1 },
      headers: 'draft-10'
    },
    routes: (app) => { app.get('/local', async () => 'ok') }
  })
  const res = await app.inject('/local')
  t.equal(res.statusCode, 200)
  t.equal(res.headers['ratelimit-policy'], '"GET /local";q=2;w=2', 'the local policy, not the shared one')
  t.equal(res.headers.ratelimit, '"GET /local";r=1;t=1')
})

t.test('a lease call that fails follows the failure mode', async (t) => {
  const limiter = createLimiter({ redis: await deadClient(t), timeout: 50 })
  t.teardown(() => limiter.close())
  const open: Policy = { bucket: 'l', capacity: 10, refillPerSecond: 1, failureMode: 'open', lease: { tokens: 5, maxAgeMs: 1000 } }
  t.match(await limiter.consume('c', open), { allowed: true, source: 'fail-open' })
  const closed: Policy = { ...open, failureMode: 'closed' }
  t.match(await limiter.consume('c', closed), { allowed: false, source: 'fail-closed' })
})

t.test('lease without maxAgeMs is refused', async (t) => {
  await t.rejects(createLimiter().consume('c', { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open', lease: { tokens: 1 } } as never), {
    name: 'TypeError', message: /`policy\.lease\.maxAgeMs` must be a finite number > 0, got undefined/
  })
})

t.test('a reset that Redis refuses rejects with a StoreError', async (t) => {
  // DEL renamed away: Redis answers, with an error of its own.
  const server = await startRedisServer({ args: ['--rename-command', 'DEL', ''] })
  t.teardown(() => server.stop())
  const redis = new Redis(server.url)
  t.teardown(() => redis.quit())
  if (redis.status !== 'ready') await new Promise((resolve) => redis.once('ready', resolve))
  const limiter = createLimiter({ redis, timeout: 1000 })
  const err: unknown = await limiter.reset('c', 'b').then(() => undefined, (e: unknown) => e)
  t.type(err, StoreError)
  t.match(err, { code: 'TOLLGATE_STORE_ERROR', message: /unknown command/i })
})

t.test('option errors print values that JSON cannot', async (t) => {
  const circular: Record<string, unknown> = {}
  circular.self = circular
  t.equal(describe(circular), 'an object')
  t.equal(describe(10n), '10n')
  t.throws(() => createLimiter({ timeout: circular as never }), {
    name: 'TypeError', message: '`timeout` must be a finite number > 0, got an object'
  })
})

t.test('the deadline queue compacts itself while calls keep settling', async (t) => {
  const deadlines = new Deadlines()
  // 1100 calls that settle at once, then, 100 ms later, one that never
  // does: when the timer fires for the first deadline, it skips the 1100
  // settled ones and finds the last still pending and 100 ms from due (a
  // margin for a timer that fires late on a loaded machine).
  const settled = Array.from({ length: 1100 }, (_, i) => deadlines.wrap(Promise.resolve(i), 200))
  t.equal((await Promise.all(settled)).length, 1100)
  await new Promise((resolve) => setTimeout(resolve, 100))
  const started = performance.now()
  await t.rejects(deadlines.wrap(new Promise<never>(() => {}), 200), { code: 'TOLLGATE_STORE_TIMEOUT' })
  const waited = performance.now() - started
  // Its own 200 ms (less 1 ms of timer rounding), not the 100 ms left of
  // the first deadline; no upper bound beyond the file's timeout.
  t.ok(waited >= 199, `rejected after ${waited.toFixed(1)} ms, at its own deadline`)
})

t.test('a shorter deadline armed after a longer one fires on time', async (t) => {
  const deadlines = new Deadlines()
  // The deadline timer is unref'd and these calls hold no socket: keep the
  // process alive until the long one expires.
  const alive = setInterval(() => {}, 1000)
  t.teardown(() => clearInterval(alive))
  const long = deadlines.wrap(new Promise<never>(() => {}), 2000)
  long.catch(() => {})
  const started = performance.now()
  await t.rejects(deadlines.wrap(new Promise<never>(() => {}), 20), { code: 'TOLLGATE_STORE_TIMEOUT' })
  const waited = performance.now() - started
  // Not held for the 2 s of the first one; 1 s covers any scheduling noise.
  t.ok(waited >= 19 && waited < 1000, `rejected after ${waited.toFixed(1)} ms`)
  await t.rejects(long, { code: 'TOLLGATE_STORE_TIMEOUT' }, 'the longer one still expires')
})

t.test('an in-process limiter is always healthy', async (t) => {
  t.equal(createLimiter().state, 'healthy')
})

t.test('several policies on a failing store: the closed one decides, all are listed', async (t) => {
  const limiter = createLimiter({ redis: await deadClient(t), timeout: 50 })
  const a: Policy = { bucket: 'a', capacity: 5, refillPerSecond: 1, failureMode: 'open' }
  const b: Policy = { bucket: 'b', capacity: 9, refillPerSecond: 1, failureMode: 'closed' }
  const closed = await limiter.consume('c', [a, b])
  t.match(closed, { allowed: false, source: 'fail-closed', bucket: 'b', limit: 9 })
  t.same(closed.policies?.map((d) => d.bucket), ['a', 'b'])
  const open = await limiter.consume('c', [a, { ...b, failureMode: 'open' }])
  t.match(open, { allowed: true, source: 'fail-open', bucket: 'a' })
  t.equal(open.policies?.length, 2)
})

t.test('the in-process store drops the least recently written bucket past its cap', async (t) => {
  let now = 1_000_000
  const store = new MemoryStore({ maxKeys: 2, now: () => now })
  const spec = (key: string) => ({ key, capacity: 1, refillPerSecond: 0.001, cost: 1 })
  for (const key of ['a', 'b', 'c']) t.ok(store.decideSync([spec(key)], true).allowed, `${key} spends its token`)
  now += 1
  t.notOk(store.decideSync([spec('c')], true).allowed, 'c is still empty')
  t.notOk(store.decideSync([spec('b')], true).allowed, 'b is still empty')
  t.ok(store.decideSync([spec('a')], true).allowed, 'a was dropped: full again')
})

t.test('app.tollgate takes a plugin-level numeric cost', async (t) => {
  const { app } = await buildApp(t, { plugin: { capacity: 10, refillPerSecond: 0.01, cost: 3 } })
  t.equal((await app.tollgate.consume('someone', { bucket: 'numeric' })).remaining, 7)
})

t.test('the in-process store reads a full-at time past one window as an empty bucket', async (t) => {
  let clock = 3_600_000_000
  const store = new MemoryStore({ now: () => clock })
  const spec = { key: 'k', capacity: 10, refillPerSecond: 1, cost: 1 }
  store.decideSync([spec], true)
  clock -= 3_600_000_000 // the clock steps back an hour
  const reply = store.decideSync([spec], false)
  t.equal(reply.allowed, false)
  const bucket = reply.buckets[0]!
  t.ok(bucket.waitUs <= 1_000_000, `waits at most one token's time, got ${bucket.waitUs} µs`)
  t.ok(bucket.fullInUs <= 10_000_000, `full within one window, got ${bucket.fullInUs} µs`)
})
