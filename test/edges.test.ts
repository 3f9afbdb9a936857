// Edge cases that the feature files do not reach: unusual route shapes,
// programmatic policies over plugin-level cost functions, the local
// fallback under draft-10 headers, a lease call that fails, a reset that
// Redis refuses, error messages for values that cannot be printed, and the
// bookkeeping of the shared deadline timer.

import t from 'tap'
import { Redis } from 'ioredis'
import { createLimiter, type Policy } from '../lib/index.js'
import { Deadlines } from '../lib/deadline.js'
import { describe, StoreError } from '../lib/errors.js'
import { buildApp } from './helpers/app.js'
import { freePort, redisUrl, startRedisServer, type TeardownTarget } from './helpers/redis.js'

await redisUrl(t)

const IP = '127.0.0.1'

/** A client to a port where nothing listens: never ready, fails fast. */
async function deadClient (t: TeardownTarget): Promise<Redis> {
  const redis = new Redis({ port: await freePort(), lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null })
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
  await t.rejects(app.tollgate.consume('someone', null as unknown as { bucket: string }), {
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
  await t.rejects(createLimiter().consume('c', { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open', lease: { tokens: 1 } } as unknown as Policy), {
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
  t.throws(() => createLimiter({ timeout: circular as unknown as number }), {
    name: 'TypeError', message: '`timeout` must be a finite number > 0, got an object'
  })
})

t.test('the deadline queue compacts itself while calls keep settling', async (t) => {
  const deadlines = new Deadlines()
  // 1100 calls that settle at once, then one that never does: when the
  // timer fires for the first deadline, it skips the 1100 settled ones and
  // finds the last still pending but not yet due.
  const settled = Array.from({ length: 1100 }, (_, i) => deadlines.wrap(Promise.resolve(i), 30))
  t.equal((await Promise.all(settled)).length, 1100)
  await new Promise((resolve) => setTimeout(resolve, 10))
  const started = performance.now()
  await t.rejects(deadlines.wrap(new Promise<never>(() => {}), 30), { code: 'TOLLGATE_STORE_TIMEOUT' })
  const waited = performance.now() - started
  // At least its own 30 ms (less 1 ms of timer rounding), not the 20 ms
  // left of the first deadline; no upper bound beyond the file's timeout.
  t.ok(waited >= 29, `rejected after ${waited.toFixed(1)} ms, at its own deadline`)
})
