// Charging by outcome through the plugin and the core: failed logins only,
// charging by response size (debt, honest Retry-After), several policies,
// the denial cache after a refund, the local fallback, a settlement that
// fails on a frozen Redis (logged and counted, never a 500), bad values,
// leases refused, and the handles of the programmatic API.

import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import t from 'tap'
import tollgate, { createLimiter, type Policy } from '../lib/index.js'
import { buildApp, captureLogs, sharedRedis, uniquePrefix } from './helpers/app.js'
import { NO_REDIS_PORT, redisUrl, startRedisServer } from './helpers/redis.js'
import { fleetKey } from './helpers/keys.js'

await redisUrl(t)

/**
 * Counts responses whose settlement is done: the settling route's onResponse
 * hook, which the plugin adds in its onRoute, is followed by this one, added
 * by an onRoute hook that runs after the plugin's.
 */
function settlements (app: FastifyInstance): (count: number) => Promise<void> {
  let done = 0
  const count = async (): Promise<void> => { done++ }
  app.addHook('onRoute', (route) => {
    const hooks = route.onResponse
    route.onResponse = hooks === undefined ? [count] : [...(Array.isArray(hooks) ? hooks : [hooks]), count]
  })
  return async (count) => {
    for (let i = 0; done < count; i++) {
      if (i > 500) throw new Error(`${done} of ${count} settlements after 5 s`)
      await sleep(10)
    }
  }
}

t.test('failed logins only: a successful login is refunded, failures count', async (t) => {
  let settled = (_: number): Promise<void> => Promise.resolve()
  const { app } = await buildApp(t, {
    plugin: { capacity: 100, refillPerSecond: 1 },
    routes: (app) => {
      settled = settlements(app)
      app.post('/login', {
        config: {
          rateLimit: {
            bucket: 'login',
            capacity: 3,
            refillPerSecond: 1 / 60,
            key: (request) => (request.body as { user: string }).user,
            hook: 'preHandler',
            settle: (_request, reply) => reply.statusCode === 401 ? 1 : 0
          }
        }
      }, async (request, reply) => {
        const { password } = request.body as { password: string }
        if (password !== 'right') reply.code(401)
        return { remaining: request.rateLimit?.remaining }
      })
    }
  })
  const login = (password: string) => app.inject({ method: 'POST', url: '/login', payload: { user: 'ann', password } })
  for (let i = 1; i <= 10; i++) {
    const res = await login('right')
    t.equal(res.statusCode, 200)
    await settled(i)
  }
  t.pass('10 successful logins, none counted')
  for (let i = 1; i <= 3; i++) {
    t.equal((await login('wrong')).statusCode, 401, `failure ${i}`)
    await settled(10 + i)
  }
  const locked = await login('right')
  t.equal(locked.statusCode, 429, 'three failures spend the bucket: even the right password waits')
  t.equal(locked.headers['retry-after'], '60')
})

t.test('charged by response size: extra charges, a debt, and an honest Retry-After', async (t) => {
  let settled = (_: number): Promise<void> => Promise.resolve()
  const { app } = await buildApp(t, {
    plugin: { capacity: 100, refillPerSecond: 1 },
    routes: (app) => {
      settled = settlements(app)
      // 1 token per KiB, 10 KiB of burst, 1 KiB/s; each request reserves 1.
      app.get('/download', {
        config: { rateLimit: { capacity: 10, refillPerSecond: 1, settle: (_request, reply) => Number(reply.getHeader('content-length')) / 1024 } }
      }, async (request) => 'x'.repeat(Number((request.query as { kib: string }).kib) * 1024))
    }
  })
  const get = (kib: number) => app.inject(`/download?kib=${kib}`)
  t.equal((await get(6)).headers['ratelimit-remaining'], '9', 'reserved 1 of 10')
  await settled(1)
  t.equal((await get(0)).headers['ratelimit-remaining'], '3', 'charged 6: 10 - 6 - 1 reserved')
  await settled(2)
  const big = await get(30)
  t.equal(big.statusCode, 200, 'allowed: the bucket could afford its reservation')
  await settled(3)
  // 4 tokens (plus the refill of the elapsed time) - 30 = about -26: a
  // debt, cut at -capacity (-10). The next request waits for 10 + 1 tokens.
  const denied = await get(0)
  t.equal(denied.statusCode, 429)
  const wait = Number(denied.headers['retry-after'])
  t.ok(wait >= 10 && wait <= 11, `Retry-After ${wait} s: the debt (10) and the cost (1), at 1/s`)
  t.equal(denied.headers['ratelimit-remaining'], '0')
})

t.test('several policies settle together; a refund clears the cached denial it makes wrong', async (t) => {
  let settled = (_: number): Promise<void> => Promise.resolve()
  let release = (): void => {}
  const gate = new Promise<void>((resolve) => { release = resolve })
  const { app, inspect, prefix } = await buildApp(t, {
    plugin: { capacity: 100, refillPerSecond: 1 },
    routes: (app) => {
      settled = settlements(app)
      app.get('/job', {
        config: {
          rateLimit: [
            { bucket: 'burst', capacity: 1, refillPerSecond: 0.001, settle: (request) => (request.query as { fail?: string }).fail === '1' ? 0 : 1 },
            { bucket: 'day', capacity: 50, refillPerSecond: 0.001 }
          ]
        }
      }, async (request) => {
        if ((request.query as { wait?: string }).wait === '1') await gate
        return request.rateLimit?.source
      })
    }
  })
  const first = app.inject('/job?wait=1&fail=1')
  await sleep(50)
  const denied = await app.inject('/job')
  t.equal(denied.statusCode, 429, 'the burst bucket is spent by the request in flight')
  const cached = await app.inject('/job')
  t.equal(cached.statusCode, 429)
  t.equal(cached.headers['ratelimit-remaining'], '0')
  release()
  t.equal((await first).statusCode, 200)
  await settled(3)
  const after = await app.inject('/job')
  t.equal(after.statusCode, 200, 'the refund is seen at once, not after the cached denial (1000 s)')
  t.equal(after.body, 'store')
  await settled(4)
  const keys = await Promise.all(['burst', 'day'].map((bucket) => fleetKey(inspect, prefix, '127.0.0.1', bucket)))
  const [burst, day] = await Promise.all(keys.map(async (k) => await inspect.pttl(k)))
  t.ok((burst as number) > 900_000 && (day as number) > 900_000, 'both buckets hold the one settled request (1 token at 0.001/s: 1000 s)')
})

t.test('a refund on a route of several policies clears the cached denial of a route on one of its buckets', async (t) => {
  let settled = (_: number): Promise<void> => Promise.resolve()
  let release = (): void => {}
  const gate = new Promise<void>((resolve) => { release = resolve })
  const burst = { bucket: 'burst', capacity: 1, refillPerSecond: 0.001 }
  const { app } = await buildApp(t, {
    plugin: { capacity: 100, refillPerSecond: 1 },
    routes: (app) => {
      settled = settlements(app)
      app.get('/job', { config: { rateLimit: [{ ...burst, settle: () => 0 }, { bucket: 'day', capacity: 50, refillPerSecond: 0.001 }] } }, async () => { await gate; return 'job' })
      app.get('/burst', { config: { rateLimit: burst } }, async () => 'burst')
    }
  })
  const job = app.inject('/job')
  await sleep(50)
  t.equal((await app.inject('/burst')).statusCode, 429, 'the burst bucket is held by the job')
  t.equal((await app.inject('/burst')).headers['ratelimit-remaining'], '0', 'denied again, from the cache')
  release()
  t.equal((await job).statusCode, 200)
  await settled(3)
  const after = await app.inject('/burst')
  t.equal(after.statusCode, 200, 'the job\'s refund clears the single bucket\'s cached denial too')
})

t.test('the local fallback reserves and settles in its own bucket', async (t) => {
  const port = NO_REDIS_PORT
  const redis = new Redis(port, { lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const limiter = createLimiter({ redis })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'b', capacity: 100, refillPerSecond: 1, failureMode: 'local', local: { capacity: 2, refillPerSecond: 0.001 } }
  for (let i = 0; i < 5; i++) {
    const r = await limiter.reserve('ann', policy)
    t.match(r.decision, { allowed: true, source: 'local', limit: 2 }, `reserve ${i}: local`)
    await limiter.settle(r, 0)
  }
  const spent = [await limiter.reserve('ann', policy), await limiter.reserve('ann', policy)]
  t.match((await limiter.reserve('ann', policy)).decision, { allowed: false, source: 'local' }, 'two kept, the third denied')
  await limiter.settle(spent[0] as Awaited<ReturnType<typeof limiter.reserve>>, 0.5)
  t.match((await limiter.reserve('ann', policy, 0.5)).decision, { allowed: true, remaining: 0 }, 'half a token refunded locally')
  const open = await limiter.reserve('ann', { ...policy, failureMode: 'open', local: undefined })
  t.match(open.decision, { allowed: true, source: 'fail-open' })
  await limiter.settle(open, 5)
  const closed = await limiter.reserve('ann', { ...policy, failureMode: 'closed' })
  t.match(closed.decision, { allowed: false, source: 'fail-closed' })
  await limiter.settle(closed, 0)
  t.equal(limiter.failedSettlements, 0, 'nothing to settle in the store')
})

t.test('a settlement that fails on a frozen Redis is logged and counted, never a 500', async (t) => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url, { maxRetriesPerRequest: 0 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const logs = captureLogs()
  const app = Fastify({ logger: { level: 'warn', stream: logs.stream } })
  t.teardown(() => app.close())
  await app.register(tollgate, { redis, capacity: 5, refillPerSecond: 1, failureMode: 'open', timeout: 100 })
  const settled = settlements(app)
  app.get('/x', { config: { rateLimit: { settle: async () => { server.pause(); return 3 } } } }, async () => 'ok')
  t.teardown(() => { if (server.paused) server.resume() })
  const res = await app.inject('/x')
  t.equal(res.statusCode, 200)
  await settled(1)
  t.equal(app.tollgate.limiter.failedSettlements, 1, 'counted')
  t.match(logs.find('settlement failed'), [{ level: 40, err: { code: 'TOLLGATE_STORE_TIMEOUT' } }], 'logged')
})

t.test('bad values from settle are logged, the reservation stands; leases cannot settle', async (t) => {
  const logs = captureLogs()
  let settled = (_: number): Promise<void> => Promise.resolve()
  const { app } = await buildApp(t, {
    fastify: { logger: { level: 'error', stream: logs.stream } },
    plugin: { capacity: 5, refillPerSecond: 0.001 },
    routes: (app) => {
      settled = settlements(app)
      app.get('/nan', { config: { rateLimit: { settle: () => NaN } } }, async () => 'x')
      app.get('/throws', { config: { rateLimit: { settle: () => { throw new Error('no size') } } } }, async () => 'x')
      app.get('/string', { config: { rateLimit: { settle: async () => { throw 'no' } } } }, async () => 'x') // eslint-disable-line no-throw-literal
    }
  })
  let n = 0
  for (const url of ['/nan', '/throws', '/string']) {
    t.equal((await app.inject(url)).statusCode, 200, url)
    await settled(++n)
    t.equal((await app.inject(url)).headers['ratelimit-remaining'], '3', `${url}: the reservation of the first request stands`)
    await settled(++n)
  }
  const lines = logs.find('settle failed')
  t.equal(lines.length, 6)
  t.match(lines[0], { err: { code: 'TOLLGATE_BAD_INPUT', message: /`settle` must return a finite number >= 0, got NaN/ } })
  t.match(lines[2], { err: { message: /`settle` threw Error: no size \(at / } })
  t.notOk((lines[2]?.err as { cause?: unknown }).cause, 'the cause once, in the message')
  t.match(lines[4], { err: { message: /`settle` threw "no"$/ } })

  const leased = Fastify()
  t.teardown(() => leased.close())
  await leased.register(tollgate, { capacity: 5, refillPerSecond: 1, failureMode: 'open' })
  await t.rejects(async () => {
    leased.get('/l', { config: { rateLimit: { lease: { tokens: 2, maxAgeMs: 100 }, settle: () => 0 } } }, async () => 'x')
    await leased.ready()
  }, { code: 'TOLLGATE_INVALID_OPTION', message: /`config.rateLimit of GET \/l: lease` must be unset on a route that settles/ })
})

t.test('reserve and settle by handle: app.tollgate and the core without Redis', async (t) => {
  const { app } = await buildApp(t, { plugin: { capacity: 4, refillPerSecond: 0.001 } })
  const r = await app.tollgate.reserve('ann', { bucket: 'gen' }, 2)
  t.match(r.decision, { allowed: true, remaining: 2 })
  await app.tollgate.settle(r, 4)
  t.match(await app.tollgate.peek('ann', { bucket: 'gen' }), { remaining: 0 }, 'charged 2 more')
  await t.rejects(app.tollgate.settle(r, 0), { code: 'TOLLGATE_INVALID_OPTION', message: /a reservation not settled yet/ })
  await t.rejects(app.tollgate.settle({ decision: r.decision }, 0), { message: /a reservation returned by reserve\(\)/ })
  const denied = await app.tollgate.reserve('ann', { bucket: 'gen' })
  t.equal(denied.decision.allowed, false)
  await app.tollgate.settle(denied, 0)
  t.match(await app.tollgate.peek('ann', { bucket: 'gen' }), { remaining: 0 }, 'a denied reservation settles nothing')

  const limiter = createLimiter()
  t.teardown(() => limiter.close())
  const policies: Policy[] = [
    { bucket: 'a', capacity: 2, refillPerSecond: 0.001, failureMode: 'open' },
    { bucket: 'b', capacity: 10, refillPerSecond: 0.001, failureMode: 'open' }
  ]
  const both = await limiter.reserve('bob', policies)
  await t.rejects(limiter.settle(both, -1), { message: /`actual` must be a finite number >= 0/ })
  await limiter.settle(both, 1)
  t.match(await limiter.peek('bob', policies), { remaining: 1, policies: [{ remaining: 1 }, { remaining: 9 }] }, 'settled at its reservation: no change')
  await limiter.settle(await limiter.reserve('bob', policies), 0)
  t.match(await limiter.peek('bob', policies), { policies: [{ remaining: 1 }, { remaining: 9 }] }, 'refunded in both')
  await t.rejects(limiter.reserve('bob', { ...policies[0] as Policy, lease: { tokens: 1, maxAgeMs: 10 } }), { message: /`policy.lease` must be unset to reserve/ })
})

t.test('routes the plugin did not see settle too: a route declared before it, and 404s', async (t) => {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = Fastify()
  t.teardown(() => app.close())
  // Declared before the plugin: its limit is compiled on its first request.
  app.get('/early', { config: { rateLimit: { capacity: 3, refillPerSecond: 1 / 3600, settle: (_request, reply) => reply.statusCode === 200 ? 0 : 1 } } },
    async (request, reply) => (request.query as { fail?: string }).fail === undefined ? 'ok' : reply.code(400).send('bad'))
  await app.register(tollgate, {
    redis, prefix, capacity: 3, refillPerSecond: 1 / 3600, failureMode: 'closed', timeout: 1000, notFound: { bucket: '404', settle: () => 0 }
  })
  await app.ready()
  /** The tokens left in a bucket once the settlements in flight have landed. */
  async function left (bucket: string, expected: number): Promise<number> {
    let remaining = -1
    for (let i = 0; i < 200; i++) {
      remaining = (await app.tollgate.peek('127.0.0.1', { bucket, capacity: 3, refillPerSecond: 1 / 3600, failureMode: 'closed' })).remaining
      if (remaining === expected) break
      await sleep(10)
    }
    return remaining
  }
  for (let i = 0; i < 5; i++) t.equal((await app.inject('/early')).statusCode, 200, `success ${i + 1}: refunded`)
  t.equal(await left('GET /early', 3), 3, 'five successes cost nothing')
  t.equal((await app.inject('/early?fail=1')).statusCode, 400)
  t.equal(await left('GET /early', 2), 2, 'a failure costs its token')
  for (let i = 0; i < 2; i++) t.equal((await app.inject('/early?fail=1')).statusCode, 400)
  t.equal(await left('GET /early', 0), 0, 'three failures spend the bucket')
  t.equal((await app.inject('/early')).statusCode, 429, 'a denied request holds no reservation to settle')
  t.equal(await left('GET /early', 0), 0)
  for (let i = 0; i < 5; i++) t.equal((await app.inject(`/missing/${i}`)).statusCode, 404)
  t.equal(await left('404', 3), 3, '404s settle with the notFound policy\'s settle')
})

t.test('a refund after the bucket refilled gives nothing back twice: Redis, the in-process store, the local fallback', async (t) => {
  // A bucket of 10 at 100/s refills in 100 ms. A reservation of 10, held
  // 150 ms, is refunded after the refilled bucket was spent again: the
  // bucket would hold nothing more had the reservation been charged 0 from
  // the start, so the refund gives nothing (before: all 10, on top of the
  // 10 just spent). Tolerance: what the bucket refills between the second
  // reserve and the peek, 1 token per 10 ms of a busy machine.
  const port = NO_REDIS_PORT
  const dead = new Redis(port, { lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null })
  dead.on('error', () => {})
  t.teardown(() => dead.disconnect())
  const fast = { capacity: 10, refillPerSecond: 100 }
  const stores = [
    { name: 'Redis', redis: await sharedRedis(t), policy: { bucket: 'refill', ...fast, failureMode: 'closed' } satisfies Policy },
    { name: 'the in-process store', redis: undefined, policy: { bucket: 'refill', ...fast, failureMode: 'closed' } satisfies Policy },
    { name: 'the local fallback', redis: dead, policy: { bucket: 'refill', capacity: 100, refillPerSecond: 1, failureMode: 'local', local: fast } satisfies Policy }
  ]
  for (const { name, redis, policy } of stores) {
    const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
    t.teardown(() => limiter.close())
    const held = await limiter.reserve('ann', policy, 10)
    t.equal(held.decision.allowed, true, `${name}: the bucket reserved whole`)
    await sleep(150)
    const spent = await limiter.reserve('ann', policy, 10)
    t.equal(spent.decision.allowed, true, `${name}: refilled, and reserved whole again`)
    await limiter.settle(spent, 10)
    await limiter.settle(held, 0)
    const after = await limiter.peek('ann', policy)
    t.ok(after.remaining <= 3, `${name}: the late refund gave nothing back (${after.remaining} tokens left, refill of the last ms)`)
    const quick = await limiter.reserve('ann', { ...policy, bucket: 'quick' }, 10)
    await limiter.settle(quick, 0)
    t.ok((await limiter.peek('ann', { ...policy, bucket: 'quick' })).remaining >= 9, `${name}: a refund within the window gives its reservation back`)
  }
})

t.test('a peek reads a bucket in debt as a route without settle does: empty, waiting for the cost only', async (t) => {
  const limiter = createLimiter()
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'owed', capacity: 10, refillPerSecond: 1, failureMode: 'open' }
  // The in-process store runs on the real clock: the bucket refills by the
  // time between the settlement and each read, measured, which a loaded
  // machine stretches (16 ms once).
  const settledAt = performance.now()
  await limiter.settle(await limiter.reserve('ann', policy, 1), 20)
  const peek = await limiter.peek('ann', policy)
  t.match(peek, { allowed: false, remaining: 0 }, 'the peek: empty')
  t.ok(peek.retryAfterMs >= 1000 - (performance.now() - settledAt) && peek.retryAfterMs <= 1000, `retry after the cost's refill (${peek.retryAfterMs} ms), as a consume would be told`)
  const reserve = await limiter.reserve('ann', policy, 1)
  t.equal(reserve.decision.allowed, false)
  t.ok(reserve.decision.retryAfterMs >= 11_000 - (performance.now() - settledAt) && reserve.decision.retryAfterMs <= 11_000, `a reserve waits out the debt of 10 too (${reserve.decision.retryAfterMs} ms)`)
})
