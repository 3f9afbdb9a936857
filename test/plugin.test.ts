// The Fastify plugin end to end: which routes are limited, how route config
// merges over the plugin's, multi-policy routes, hooks, the decorators, the
// 429/503 through Fastify's error pipeline, the user's Redis client, a
// client that goes away before its answer, and the failure modes with an
// unreachable or frozen Redis.

import { once } from 'node:events'
import { request as httpRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import Fastify, { type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import tollgate, { type Decision } from '../lib/index.js'
import { buildApp, captureLogs, sharedRedis, uniquePrefix } from './helpers/app.js'
import { NO_REDIS_PORT, redisUrl, startRedisServer } from './helpers/redis.js'
import { fleetKey, fleetSecret, keyUnder } from './helpers/keys.js'

// Hold the shared Redis for the whole file, so subtests reuse one server.
await redisUrl(t)

const IP = '127.0.0.1'

/** A bucket's stored value as Redis holds it (null when absent); compared, never interpreted. */
async function stored (redis: Redis, key: string): Promise<string | null> {
  return await redis.get(key)
}

t.test('global: every route is limited, each with its own bucket', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 2, refillPerSecond: 0.01 },
    routes: (app) => {
      app.get('/a', async () => 'a')
      app.get('/b', async () => 'b')
    }
  })
  t.equal((await app.inject('/a')).statusCode, 200)
  t.equal((await app.inject('/a')).statusCode, 200)
  const denied = await app.inject('/a')
  t.equal(denied.statusCode, 429, 'third request on /a is over capacity 2')
  const b = await app.inject('/b')
  t.equal(b.statusCode, 200, '/b has a bucket of its own')
  t.equal(b.headers['ratelimit-remaining'], '1')
  t.same(await keys(), [`${prefix}:{${IP}}:GET /a`, `${prefix}:{${IP}}:GET /b`])
})

t.test('global: false limits only routes with config.rateLimit', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 1, refillPerSecond: 0.01, global: false },
    routes: (app) => {
      app.get('/free', async (request) => ({ limited: request.rateLimit !== undefined }))
      app.get('/limited', { config: { rateLimit: {} } }, async () => 'x')
    }
  })
  for (let i = 0; i < 3; i++) {
    const free = await app.inject('/free')
    t.equal(free.statusCode, 200)
    t.same(free.json(), { limited: false })
    t.notOk('ratelimit-limit' in free.headers)
  }
  t.equal((await app.inject('/limited')).statusCode, 200)
  t.equal((await app.inject('/limited')).statusCode, 429, 'an empty config object takes the plugin defaults')
  t.same(await keys(), [`${prefix}:{${IP}}:GET /limited`])
})

t.test('route config is merged over the plugin defaults', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 10, refillPerSecond: 1, headers: 'legacy' },
    routes: (app) => {
      app.get('/small', { config: { rateLimit: { capacity: 2 } } }, async () => 'x')
      app.get('/draft', { config: { rateLimit: { headers: 'draft-6' } } }, async () => 'x')
    }
  })
  const small = await app.inject('/small')
  t.equal(small.headers['x-ratelimit-limit'], '2', 'capacity from the route')
  t.equal(small.headers['x-ratelimit-remaining'], '1')
  t.equal(small.headers['x-ratelimit-reset'], '1', 'one token at the plugin refill of 1/s comes back in 1 s')
  t.notOk('ratelimit-limit' in small.headers, 'headers mode from the plugin')
  const draft = await app.inject('/draft')
  t.equal(draft.headers['ratelimit-limit'], '10', 'capacity from the plugin')
  t.equal(draft.headers['ratelimit-policy'], '10;w=10', 'refill from the plugin')
  t.notOk('x-ratelimit-limit' in draft.headers, 'headers mode from the route')
})

t.test('config.rateLimit false opts a route out', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 1, refillPerSecond: 0.01 },
    routes: (app) => {
      app.get('/health', { config: { rateLimit: false } }, async (request) => ({ limited: request.rateLimit !== undefined }))
      app.get('/other', async () => 'x')
    }
  })
  for (let i = 0; i < 5; i++) {
    const res = await app.inject('/health')
    t.equal(res.statusCode, 200)
    t.same(res.json(), { limited: false })
    t.same(Object.keys(res.headers).filter((h) => /ratelimit|retry-after/.test(h)), [])
  }
  t.equal((await app.inject({ method: 'HEAD', url: '/health' })).statusCode, 200, 'its HEAD route is opted out too')
  t.same(await keys(), [], 'no key written for an opted-out route')
  await app.inject('/other')
  t.same(await keys(), [`${prefix}:{${IP}}:GET /other`], 'while a limited route writes one')
})

t.test('an array of policies: all must pass, a denied request spends from none', async (t) => {
  const { app, inspect, prefix } = await buildApp(t, {
    plugin: { refillPerSecond: 0.001 },
    routes: (app) => {
      app.get('/first-denies', {
        config: { rateLimit: [{ bucket: 'burst', capacity: 2 }, { bucket: 'daily', capacity: 10 }] }
      }, async (request) => request.rateLimit)
      app.get('/second-denies', {
        config: { rateLimit: [{ bucket: 'wide', capacity: 10 }, { bucket: 'narrow', capacity: 1 }] }
      }, async () => 'x')
    }
  })
  const secret = await fleetSecret(inspect, prefix)
  const key = (bucket: string): string => keyUnder(secret, prefix, IP, bucket)

  const first = await app.inject('/first-denies')
  t.equal(first.statusCode, 200)
  const decision = first.json<Decision>()
  t.equal(decision.policies?.length, 2, 'request.rateLimit lists one decision per policy')
  t.same(decision.policies?.map((d) => [d.bucket, d.remaining]), [['burst', 1], ['daily', 9]], 'both buckets spent')
  t.equal((await app.inject('/first-denies')).statusCode, 200)
  const daily = await stored(inspect, key('daily'))
  t.ok(daily !== null)
  const denied = await app.inject('/first-denies')
  t.equal(denied.statusCode, 429, 'burst (the first policy) denies')
  t.equal(await stored(inspect, key('daily')), daily, 'the allowing policy was not spent')

  t.equal((await app.inject('/second-denies')).statusCode, 200)
  const wide = await stored(inspect, key('wide'))
  t.ok(wide !== null)
  t.equal((await app.inject('/second-denies')).statusCode, 429, 'narrow (the second policy) denies')
  t.equal(await stored(inspect, key('wide')), wide, 'the first policy was not spent either')
})

t.test('routes naming the same bucket share it', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 3, refillPerSecond: 0.01 },
    routes: (app) => {
      app.get('/a', { config: { rateLimit: { bucket: 'search' } } }, async () => 'a')
      app.post('/b', { config: { rateLimit: { bucket: 'search' } } }, async () => 'b')
    }
  })
  t.equal((await app.inject('/a')).headers['ratelimit-remaining'], '2')
  t.equal((await app.inject({ method: 'POST', url: '/b' })).headers['ratelimit-remaining'], '1')
  t.equal((await app.inject('/a')).headers['ratelimit-remaining'], '0')
  t.equal((await app.inject({ method: 'POST', url: '/b' })).statusCode, 429)
  t.same(await keys(), [`${prefix}:{${IP}}:search`])
})

t.test("hook 'preHandler' lets key and cost read the parsed body", async (t) => {
  interface Body { user: string, weight: number }
  const fromBody = {
    key: (request: FastifyRequest) => (request.body as Body).user,
    cost: (request: FastifyRequest) => (request.body as Body).weight
  }
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 0.01 },
    routes: (app) => {
      app.post('/late', { config: { rateLimit: { ...fromBody, hook: 'preHandler' } } }, async () => 'ok')
      app.post('/early', { config: { rateLimit: { ...fromBody } } }, async () => 'ok')
    }
  })
  const post = (url: string, body: Body) => app.inject({ method: 'POST', url, payload: body })
  const a = await post('/late', { user: 'alice', weight: 3 })
  t.equal(a.statusCode, 200)
  t.equal(a.headers['ratelimit-remaining'], '2', 'cost 3 read from the body')
  t.equal((await post('/late', { user: 'bob', weight: 1 })).headers['ratelimit-remaining'], '4', 'bob has his own bucket')
  t.equal((await post('/late', { user: 'alice', weight: 3 })).statusCode, 429, 'alice cannot afford 3 more')
  t.same(await keys(), [`${prefix}:{alice}:POST /late`, `${prefix}:{bob}:POST /late`])

  // The same functions in onRequest run before the body is parsed: the key
  // function throws on the missing body, which is a 500 (the log names the route).
  const early = await post('/early', { user: 'alice', weight: 1 })
  t.equal(early.statusCode, 500)
  t.match(early.json(), { code: 'TOLLGATE_BAD_INPUT', message: 'Rate limit check failed; the server log says why' })
})

t.test('allow skips the limiter', async (t) => {
  const { app, keys } = await buildApp(t, {
    plugin: { capacity: 1, refillPerSecond: 0.01, allow: async (request) => request.headers['x-internal'] === 'yes' },
    routes: (app) => {
      app.get('/x', async (request) => ({ limited: request.rateLimit !== undefined }))
    }
  })
  for (let i = 0; i < 3; i++) {
    const res = await app.inject({ url: '/x', headers: { 'x-internal': 'yes' } })
    t.equal(res.statusCode, 200)
    t.same(res.json(), { limited: false })
    t.notOk('ratelimit-limit' in res.headers)
  }
  t.same(await keys(), [], 'allowed requests write no key')
  t.equal((await app.inject('/x')).statusCode, 200)
  t.equal((await app.inject('/x')).statusCode, 429, 'other requests are limited')
})

t.test('cost as a number and as a function', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 0.01 },
    routes: (app) => {
      app.get('/two', { config: { rateLimit: { cost: 2 } } }, async () => 'x')
      app.get('/n', { config: { rateLimit: { cost: async (request) => Number((request.query as { n: string }).n) } } }, async () => 'x')
    }
  })
  t.equal((await app.inject('/two')).headers['ratelimit-remaining'], '3')
  t.equal((await app.inject('/two')).headers['ratelimit-remaining'], '1')
  t.equal((await app.inject('/two')).statusCode, 429, 'cost 2 with one token left')

  t.equal((await app.inject('/n?n=4')).headers['ratelimit-remaining'], '1')
  const denied = await app.inject('/n?n=2')
  t.equal(denied.statusCode, 429)
  t.equal(denied.headers['ratelimit-remaining'], '1', 'a denied request spends nothing')
  t.equal((await app.inject('/n?n=1')).headers['ratelimit-remaining'], '0', 'a cheaper request still fits')
})

t.test('request.rateLimit holds the decision', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 4, refillPerSecond: 2 },
    routes: (app) => { app.get('/users/:id', async (request) => request.rateLimit) }
  })
  const decision = (await app.inject('/users/7')).json<Decision>()
  t.match(decision, { allowed: true, limit: 4, remaining: 3, retryAfterMs: 0, source: 'store', bucket: 'GET /users/:id' })
  // One token at 2/s comes back in 500 ms; the store rounds up to a whole microsecond.
  t.ok(decision.resetMs > 499 && decision.resetMs <= 500.001, `resetMs ${decision.resetMs}`)
})

t.test('app.tollgate: consume, peek and reset inside a handler', async (t) => {
  const login = { bucket: 'login', capacity: 3 }
  const { app, inspect, prefix } = await buildApp(t, {
    plugin: { capacity: 100, refillPerSecond: 0.01, global: false },
    routes: (app) => {
      app.post('/login', async (request, reply) => {
        const { user } = request.body as { user: string }
        const decision = await app.tollgate.consume(`user:${user}`, login)
        if (!decision.allowed) return await reply.code(429).send({ left: decision.remaining })
        return { left: decision.remaining }
      })
    }
  })
  const attempt = (user: string) => app.inject({ method: 'POST', url: '/login', payload: { user } })
  t.same((await attempt('alice')).json(), { left: 2 }, 'capacity from the policy, refill and failureMode from the plugin')
  t.same((await attempt('alice')).json(), { left: 1 })
  t.same((await attempt('bob')).json(), { left: 2 }, 'one bucket per user name')
  t.same((await attempt('alice')).json(), { left: 0 })
  const denied = await attempt('alice')
  t.equal(denied.statusCode, 429)

  const key = await fleetKey(inspect, prefix, 'user:alice', 'login')
  const before = await stored(inspect, key)
  const peeked = await app.tollgate.peek('user:alice', login)
  t.match(peeked, { allowed: false, remaining: 0, source: 'store', bucket: 'login' })
  t.equal(await stored(inspect, key), before, 'peek writes nothing')

  const costly = await app.tollgate.consume('user:carol', login, 2)
  t.equal(costly.remaining, 1, 'the cost argument spends 2')

  await app.tollgate.reset('user:alice', 'login')
  t.equal(await stored(inspect, key), null, 'reset deletes the key')
  t.same((await attempt('alice')).json(), { left: 2 }, 'and the bucket is full again')
  t.equal(app.tollgate.limiter.state, 'healthy')
})

t.test('the 429 goes through Fastify\'s error pipeline', async (t) => {
  t.test('default error handler: coded body and message', async (t) => {
    const { app } = await buildApp(t, {
      plugin: { capacity: 1, refillPerSecond: 0.25 },
      routes: (app) => { app.get('/x', async () => 'x') }
    })
    await app.inject('/x')
    const res = await app.inject('/x')
    t.equal(res.statusCode, 429)
    t.equal(res.headers['retry-after'], '4', 'one token at 0.25/s')
    t.same(res.json(), {
      statusCode: 429,
      code: 'TOLLGATE_RATE_LIMITED',
      error: 'Too Many Requests',
      message: 'Rate limit exceeded, retry in 4 second(s)'
    })
  })

  t.test('a custom error handler reshapes it and keeps the headers', async (t) => {
    const { app } = await buildApp(t, {
      plugin: { capacity: 1, refillPerSecond: 0.25 },
      routes: (app) => {
        app.setErrorHandler(async (err: Error & { code?: string, statusCode?: number }, _request, reply) => {
          return await reply.code(err.statusCode ?? 500).send({ problem: err.code, detail: err.message })
        })
        app.get('/x', async () => 'x')
      }
    })
    await app.inject('/x')
    const res = await app.inject('/x')
    t.equal(res.statusCode, 429)
    t.same(res.json(), { problem: 'TOLLGATE_RATE_LIMITED', detail: 'Rate limit exceeded, retry in 4 second(s)' })
    t.equal(res.headers['retry-after'], '4')
    t.equal(res.headers['ratelimit-remaining'], '0')
  })
})

t.test('the plugin never closes the user\'s client', async (t) => {
  const redis = await sharedRedis(t)
  const app = Fastify()
  await app.register(tollgate, { redis, prefix: uniquePrefix(), capacity: 5, refillPerSecond: 1, failureMode: 'closed', timeout: 1000 })
  app.get('/x', async () => 'x')
  t.equal((await app.inject('/x')).statusCode, 200)
  await app.close()
  t.equal(redis.status, 'ready')
  t.equal(await redis.ping(), 'PONG')
})

t.test('without redis: an in-process store and one warning at start-up', async (t) => {
  const logs = captureLogs()
  const { app, keys } = await buildApp(t, {
    plugin: { redis: undefined, capacity: 2, refillPerSecond: 0.01 },
    fastify: { logger: { level: 'info', stream: logs.stream } },
    routes: (app) => { app.get('/x', async (request) => request.rateLimit) }
  })
  const first = await app.inject('/x')
  t.match(first.json(), { allowed: true, remaining: 1, source: 'store' })
  t.equal((await app.inject('/x')).statusCode, 200)
  t.equal((await app.inject('/x')).statusCode, 429, 'the in-process store limits')
  t.same(await keys(), [], 'nothing written to Redis')
  const warnings = logs.lines.filter((l) => l.level === 40)
  t.equal(warnings.length, 1, 'exactly one warning, however many requests')
  t.match(warnings[0]?.msg, /no `redis`.*this process only/)
})

t.test('a HEAD request spends from the GET bucket', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 3, refillPerSecond: 0.01 },
    routes: (app) => { app.get('/page', async () => 'page') }
  })
  t.equal((await app.inject('/page')).headers['ratelimit-remaining'], '2')
  const head = await app.inject({ method: 'HEAD', url: '/page' })
  t.equal(head.statusCode, 200)
  t.equal(head.headers['ratelimit-remaining'], '1', 'HEAD spends one token, from the same bucket')
  t.equal((await app.inject('/page')).headers['ratelimit-remaining'], '0')
  t.equal((await app.inject({ method: 'HEAD', url: '/page' })).statusCode, 429)
  t.same(await keys(), [`${prefix}:{${IP}}:GET /page`])
})

t.test('one check per request', async (t) => {
  t.test('hook arrays shared by GET and its HEAD route are not mutated', async (t) => {
    const seen: string[] = []
    const userHooks = [async (request: FastifyRequest) => { seen.push(request.method) }]
    const { app } = await buildApp(t, {
      plugin: { capacity: 10, refillPerSecond: 0.01 },
      routes: (app) => { app.get('/x', { onRequest: userHooks }, async () => 'x') }
    })
    t.equal(userHooks.length, 1, 'the plugin built new arrays instead of pushing into the user\'s')
    t.equal((await app.inject('/x')).headers['ratelimit-remaining'], '9')
    t.equal((await app.inject({ method: 'HEAD', url: '/x' })).headers['ratelimit-remaining'], '8')
    t.same(seen, ['GET', 'HEAD'], 'the user\'s hook still runs on both')
  })

  t.test('the check listed twice on a route still runs once', async (t) => {
    // Another plugin copying a route's onRequest hooks into preHandler puts
    // the tollgate check on the route twice; it must spend once.
    const { app } = await buildApp(t, {
      plugin: { capacity: 10, refillPerSecond: 0.01 },
      routes: (app) => {
        app.addHook('onRoute', (route) => {
          const hooks = route.onRequest
          if (Array.isArray(hooks)) route.preHandler = [...hooks]
        })
        app.get('/x', async () => 'x')
      }
    })
    t.equal((await app.inject('/x')).headers['ratelimit-remaining'], '9')
    t.equal((await app.inject('/x')).headers['ratelimit-remaining'], '8')
  })

  t.test('a second registration fails at start-up instead of adding a second check', async (t) => {
    const options = { failureMode: 'open', capacity: 10, refillPerSecond: 1 } as const
    const same = Fastify()
    t.teardown(() => same.close())
    await same.register(tollgate, options)
    await t.rejects(async () => { await same.register(tollgate, options) }, { code: 'TOLLGATE_ALREADY_REGISTERED' }, 'same scope')
    const nested = Fastify()
    t.teardown(() => nested.close())
    await nested.register(tollgate, options)
    await t.rejects(async () => { await nested.register(async (child) => { await child.register(tollgate, options) }) }, { code: 'TOLLGATE_ALREADY_REGISTERED' }, 'child scope')
  })
})

t.test('Redis unreachable from the start: the app starts, failure modes apply', async (t) => {
  const port = NO_REDIS_PORT
  const redis = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => 200 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const started = Date.now()
  const { app } = await buildApp(t, {
    plugin: { redis, capacity: 5, refillPerSecond: 1, failureMode: 'open' },
    routes: (app) => {
      app.get('/open', async (request) => request.rateLimit)
      app.get('/closed', { config: { rateLimit: { failureMode: 'closed' } } }, async () => 'x')
    }
  })
  // The start-up wait is bounded (2 s in lib/adapters/fastify/plugin.ts); without a bound
  // ready() would never resolve. 10 s leaves room for a loaded machine.
  t.ok(Date.now() - started < 10_000, 'ready() resolved although Redis never answered')
  const open = await app.inject('/open')
  t.equal(open.statusCode, 200)
  t.match(open.json(), { source: 'fail-open', allowed: true })
  t.same(Object.keys(open.headers).filter((h) => /ratelimit|retry-after/.test(h)), [], 'no RateLimit headers: never a fake full quota')
  const closed = await app.inject('/closed')
  t.equal(closed.statusCode, 503)
  t.equal(closed.json().code, 'TOLLGATE_UNAVAILABLE')
  t.equal(closed.headers['retry-after'], '1')
})

t.test('Redis stopped after start-up: open passes, closed is a 503', async (t) => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url, { maxRetriesPerRequest: 0, retryStrategy: () => 200 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const { app } = await buildApp(t, {
    plugin: { redis, capacity: 5, refillPerSecond: 1, failureMode: 'open' },
    routes: (app) => {
      app.get('/open', async (request) => request.rateLimit)
      app.get('/closed', { config: { rateLimit: { failureMode: 'closed' } } }, async () => 'x')
    }
  })
  t.equal((await app.inject('/open')).headers['ratelimit-remaining'], '4', 'decided by Redis while it runs')
  const closing = once(redis, 'close')
  await server.kill()
  await closing
  const open = await app.inject('/open')
  t.equal(open.statusCode, 200)
  t.match(open.json(), { source: 'fail-open' })
  t.notOk('ratelimit-remaining' in open.headers)
  const closed = await app.inject('/closed')
  t.equal(closed.statusCode, 503)
  t.match(closed.json(), { code: 'TOLLGATE_UNAVAILABLE', message: 'Rate limiter unavailable, retry in 1 second(s)' })
  t.equal(closed.headers['retry-after'], '1')
  t.notOk('ratelimit-remaining' in closed.headers)
})

/** Sends `GET path` and disconnects after `ms`, before any answer. */
async function goneAfter (port: number, path: string, ms: number): Promise<void> {
  const req = httpRequest({ host: IP, port, path, agent: false })
  req.on('error', () => {})
  req.end()
  await sleep(ms)
  req.destroy()
}

t.test('a client gone before its answer: dropped, no handler, nothing logged', async (t) => {
  const logs = captureLogs()
  const handled: string[] = []
  const settled: string[] = []
  const { app } = await buildApp(t, {
    fastify: { logger: { level: 'info', stream: logs.stream } },
    plugin: { capacity: 1, refillPerSecond: 2, key: () => 'one', failureMode: 'open' },
    routes: (app) => {
      const handler = async (request: FastifyRequest): Promise<string> => { handled.push(request.url); return 'served' }
      // The token of the first request, then a wait of about 500 ms for the next (2/s).
      app.get('/wait/:who', { config: { rateLimit: { bucket: 'wait', maxWaitMs: 2000 } } }, handler)
      // A slow `key`: the client is gone by the time the reservation is made.
      const slowKey = async (): Promise<string> => { await sleep(150); return 'one' }
      app.get('/settled', { config: { rateLimit: { bucket: 'settled', key: slowKey, settle: (request) => { settled.push(request.url); return 1 } } } }, handler)
      // The route's own hook holds the request until its client has gone, so tollgate's check comes after.
      app.get('/held', { onRequest: (_request, reply, done) => { reply.raw.once('close', () => { done() }) }, config: { rateLimit: { bucket: 'held', refillPerSecond: 0.001 } } }, handler)
    }
  })
  await app.listen({ host: IP, port: 0 })
  const { port } = app.server.address() as AddressInfo
  t.equal((await app.inject('/wait/first')).statusCode, 200, 'the bucket is empty now')
  await goneAfter(port, '/wait/gone', 50)
  await goneAfter(port, '/settled', 50)
  for (let i = 0; i < 300 && settled.length < 1; i++) await sleep(10)
  t.same(settled, ['/settled'], 'the reservation of a request gone before its decision arrived settled')
  await goneAfter(port, '/held', 50)
  // Past the end of the gone request's wait.
  await sleep(600)
  t.same(handled, ['/wait/first'], 'no handler ran for a gone client')
  t.equal((await app.tollgate.peek('one', { bucket: 'held', refillPerSecond: 0.001 })).remaining, 1, 'a request gone before its check spent nothing')
  t.same(logs.lines.filter((l) => Number(l.level) >= 40), [], 'and nothing was logged as a warning or an error')
})

t.test('a frozen Redis does not hold a request past the deadline', async (t) => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url, { maxRetriesPerRequest: 0 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const timeout = 150
  const { app } = await buildApp(t, {
    plugin: { redis, capacity: 5, refillPerSecond: 1, failureMode: 'open', timeout },
    routes: (app) => {
      app.get('/open', async (request) => request.rateLimit)
      app.get('/closed', { config: { rateLimit: { failureMode: 'closed' } } }, async () => 'x')
    }
  })
  t.equal((await app.inject('/open')).statusCode, 200, 'warm-up: the script is loaded')
  server.pause()
  t.teardown(() => { if (server.paused) server.resume() })
  t.equal(redis.status, 'ready', 'the connection looks healthy: only the deadline can help')
  // A paused Redis never answers, so without the deadline these requests
  // would hang until tap's timeout. The upper bound adds 1.5 s for
  // scheduling on a loaded 2-core machine; the lower bound (timeout minus
  // timer granularity) shows the request did wait for the store.
  for (const [url, status] of [['/open', 200], ['/closed', 503]] as const) {
    const started = performance.now()
    const res = await app.inject(url)
    const took = performance.now() - started
    t.equal(res.statusCode, status, url)
    t.ok(took >= timeout - 5 && took < timeout + 1500, `${url} answered in ${took.toFixed(0)} ms (deadline ${timeout} ms)`)
  }
})

t.test('start-up waits for a lazyConnect client to connect', async (t) => {
  const url = await redisUrl(t)
  const redis = new Redis(url, { lazyConnect: true })
  t.teardown(() => redis.quit())
  t.equal(redis.status, 'wait')
  const { app } = await buildApp(t, {
    plugin: { redis, capacity: 5, refillPerSecond: 1, failureMode: 'closed' },
    routes: (app) => { app.get('/x', async (request) => request.rateLimit) }
  })
  t.equal(redis.status, 'ready', 'connected by the time the app is ready')
  const first = await app.inject('/x')
  t.equal(first.statusCode, 200)
  t.match(first.json(), { source: 'store', remaining: 4 }, 'the first request is decided by Redis')
  await app.close()
  t.equal(redis.status, 'ready', 'and the plugin leaves it open')
})
