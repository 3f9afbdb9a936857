// A route's own answer to its denials on tollgate/express and tollgate/hono:
// `limit({ handler })` over the options' `handler`, one per route, through
// the real frameworks. (The Fastify plugin reshapes a route's 429 in
// Fastify's error handler.) In-process store: the answers are the point.

import express, { type RequestHandler } from 'express'
import { Hono } from 'hono'
import t, { type Test } from 'tap'
import { rateLimit, type DeniedHandler, type ExpressPolicy } from '../lib/express.js'
import { rateLimit as honoRateLimit, type HonoDeniedHandler, type HonoPolicy } from '../lib/hono.js'
import { listen, memoryLogger, type Answer } from './helpers/express.js'
import { listenHono } from './helpers/hono.js'

const BASE = { capacity: 1, refillPerSecond: 0.01, failureMode: 'open' as const, warnings: false as const }

/** An adapter: a limiter whose denials its options answer with `app says`, and routes given a policy each. */
interface Adapter {
  name: string
  /** Serves each path with a limit of the policy; the options answer with { by: 'app' }. */
  serve: (t: Test, routes: Record<string, Record<string, unknown>>) => Promise<(path: string) => Promise<Answer>>
  /** A handler answering { by } with status 429 and the error's retryAfter. */
  answer: (by: string) => unknown
  /** `limit(policy)` alone, for the checks made when it is called. */
  limit: (t: Test, policy: unknown) => unknown
}

const ADAPTERS: Adapter[] = [
  {
    name: 'Express',
    answer: (by): DeniedHandler => (_req, res, _next, err) => { res.status(429).json({ by, retryAfter: err.retryAfter }) },
    async serve (t, routes) {
      const limit = rateLimit({ ...BASE, logger: memoryLogger(), handler: this.answer('app') as DeniedHandler })
      t.teardown(() => limit.close())
      const app = express()
      const ok: RequestHandler = (_req, res) => { res.send('ok') }
      for (const [path, policy] of Object.entries(routes)) app.get(path, limit(policy as ExpressPolicy), ok)
      return await listen(t, app)
    },
    limit (t, policy) {
      const limit = rateLimit({ ...BASE, logger: memoryLogger() })
      t.teardown(() => limit.close())
      return limit(policy as ExpressPolicy)
    }
  },
  {
    name: 'Hono',
    answer: (by): HonoDeniedHandler => (c, err) => c.json({ by, retryAfter: err.retryAfter }, 429),
    async serve (t, routes) {
      const limit = honoRateLimit({ ...BASE, logger: memoryLogger(), handler: this.answer('app') as HonoDeniedHandler })
      t.teardown(() => limit.close())
      const app = new Hono()
      for (const [path, policy] of Object.entries(routes)) app.get(path, limit(policy as HonoPolicy), (c) => c.text('ok'))
      return await listenHono(t, app)
    },
    limit (t, policy) {
      const limit = honoRateLimit({ ...BASE, logger: memoryLogger() })
      t.teardown(() => limit.close())
      return limit(policy as HonoPolicy)
    }
  }
]

for (const adapter of ADAPTERS) {
  t.test(`${adapter.name}: limit({ handler }) answers that route's denials; the others keep the options' handler`, async (t) => {
    const both = adapter.answer('both')
    const get = await adapter.serve(t, {
      '/own': { handler: adapter.answer('route') },
      '/plain': {},
      '/both': [{ handler: both }, { bucket: 'second', capacity: 5, handler: both }] as never
    })
    for (const path of ['/own', '/plain', '/both']) t.equal((await get(path)).status, 200, `${path}: the first request passes`)
    const own = await get('/own')
    t.same([own.status, JSON.parse(own.body)], [429, { by: 'route', retryAfter: 100 }], "the route's handler")
    t.equal(own.headers['retry-after'], '100', 'after the headers are set')
    t.match(JSON.parse((await get('/plain')).body), { by: 'app' }, "a route without one: the options' handler")
    t.match(JSON.parse((await get('/both')).body), { by: 'both' }, 'several policies naming the same handler')
  })

  t.test(`${adapter.name}: a route's handler is checked when limit() is called`, async (t) => {
    t.throws(() => adapter.limit(t, { handler: 'send 429' }), { code: 'TOLLGATE_INVALID_OPTION', message: /^tollgate: `limit\(\): handler` must be a function/ })
    t.throws(() => adapter.limit(t, [{ handler: adapter.answer('a') }, { bucket: 'b', handler: adapter.answer('b') }]), {
      code: 'TOLLGATE_INVALID_OPTION',
      message: /`limit\(\): handler` must be the same in every policy of the route \(it is one per route\)/
    })
  })
}
