// Where a middleware adapter's bucket comes from when no policy names one
// (docs/guides/express.md and docs/guides/hono.md, "How it maps onto the
// plugin"; lib/http/registry.ts, lib/http/sharing.ts), one table over
// Express 5, Express 4 and Hono on @hono/node-server, on a real Redis:
//
//   - express-rate-limit's two-limiter pattern (docs/guides/migrating.md):
//     an instance on `/api` and another on one route spend from buckets of
//     their own;
//   - a limit mounted twice on one request's way, or two identical
//     instances, spend once; two instances with different policies on one
//     bucket are reported;
//   - a limit mounted on a path without a `bucket` is named by its mount
//     path, and `limit` is `limit()`;
//   - a route declared for every method is one bucket (as on Fastify);
//   - a client that disconnects while it waits under `maxWaitMs`: its
//     handler does not run, and the token it reserved stays spent.
//
// Tolerances: the disconnect test's wait is about 1 s (refill 1/s); the
// client goes away 50 ms into it, and the check comes 1300 ms in, when the
// bucket holds 0.3 of a token if the reserved one stayed spent (1 if it had
// been given back), so a loaded machine has 700 ms of slack.

import { once } from 'node:events'
import { request } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import express5 from 'express'
import express4 from 'express4'
import { Hono, type MiddlewareHandler } from 'hono'
import t, { type Test } from 'tap'
import type { Redis } from 'ioredis'
import { rateLimit as expressLimit, type ExpressOptions } from '../lib/express.js'
import { rateLimit as honoLimit } from '../lib/hono.js'
import { buildApp, keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { memoryLogger, type Answer } from './helpers/express.js'
import { serveHono } from './helpers/hono.js'

type Method = 'get' | 'post' | 'all'
type Get = (url: string, headers?: Record<string, string>, method?: string) => Promise<Answer>

/** One adapter as the tests declare apps on it; middleware are the adapter's own, typed unknown here. */
interface Limiter {
  (policy?: object): unknown
  close: () => Promise<void>
  peek: (client: string, policy: { bucket: string }) => Promise<{ remaining: number }>
}
interface Builder {
  /** `app.use(mw)`, or at `path` (Hono: `path/*`). */
  mount: (path: string | undefined, mw: unknown) => void
  /** A route whose handler records `name` in `handled` and answers 200. */
  route: (method: Method, path: string, ...mws: unknown[]) => void
}
interface Side {
  name: string
  limiter: (options: Partial<ExpressOptions>) => Limiter
  serve: (t: Test, build: (b: Builder) => void, handled?: string[]) => Promise<{ get: Get, port: number }>
}

function expressSide (name: string, express: typeof express5): Side {
  return {
    name,
    limiter: (options) => expressLimit({ failureMode: 'closed', ...options }),
    async serve (t, build, handled = []) {
      const app = express()
      build({
        mount: (path, mw) => { if (path === undefined) app.use(mw as express5.RequestHandler); else app.use(path, mw as express5.RequestHandler) },
        route: (method, path, ...mws) => {
          app[method](path, ...(mws as express5.RequestHandler[]), (req, res) => { handled.push(req.path); res.json({ ok: true }) })
        }
      })
      app.use(((err, _req, res, _next) => { res.status(500).json({ code: err.code, message: err.message }) }) as express5.ErrorRequestHandler)
      const server = app.listen(0, '127.0.0.1')
      await once(server, 'listening')
      t.teardown(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()) }))
      const port = (server.address() as AddressInfo).port
      return { get: client(port), port }
    }
  }
}

const honoSide: Side = {
  name: 'Hono',
  limiter: (options) => honoLimit({ failureMode: 'closed', ...options } as Parameters<typeof honoLimit>[0]),
  async serve (t, build, handled = []) {
    const app = new Hono()
    build({
      mount: (path, mw) => { if (path === undefined) app.use(mw as MiddlewareHandler); else app.use(`${path}/*`, mw as MiddlewareHandler) },
      route: (method, path, ...mws) => {
        const handler: MiddlewareHandler = async (c) => { handled.push(c.req.path); return c.json({ ok: true }) }
        const handlers = [...(mws as MiddlewareHandler[]), handler] as [MiddlewareHandler]
        if (method === 'all') app.all(path, ...handlers)
        else app.on(method.toUpperCase(), path, ...handlers)
      }
    })
    app.onError((err, c) => c.json({ code: (err as { code?: string }).code, message: err.message }, 500))
    return await serveHono(t, app)
  }
}

const SIDES: Side[] = [expressSide('Express 5', express5), expressSide('Express 4', express4), honoSide]

/** A plain HTTP client of 127.0.0.1:`port`. */
function client (port: number): Get {
  return async (url, headers = {}, method = 'GET') => await new Promise<Answer>((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: url, headers, method }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }))
    })
    req.on('error', reject)
    req.end()
  })
}

/** How many of `n` requests (`method`, `url`) were answered 200, and every status seen. */
async function passes (get: Get, url: string, n: number, method = 'GET'): Promise<{ ok: number, statuses: number[] }> {
  const statuses: number[] = []
  for (let i = 0; i < n; i++) statuses.push((await get(url, {}, method)).status)
  return { ok: statuses.filter((s) => s === 200).length, statuses: [...new Set(statuses)].sort() }
}

async function bucketsOf (redis: Redis, prefix: string): Promise<string[]> {
  return (await keysUnder(redis, prefix)).map((k) => k.slice(k.indexOf('}:') + 2)).sort()
}

for (const side of SIDES) {
  t.test(side.name, async (t) => {
    const redis = await sharedRedis(t)
    const make = (t: Test, options: Partial<ExpressOptions>): Limiter => {
      const limit = side.limiter({ redis, timeout: 1000, logger: memoryLogger(), ...options })
      t.teardown(() => limit.close())
      return limit
    }

    t.test("express-rate-limit's two-limiter pattern: 2 account creations leave the /api limiter's 100 requests", async (t) => {
      const prefix = uniquePrefix()
      const apiLimiter = make(t, { prefix, capacity: 100, refillPerSecond: 100 / 900 })
      const createAccountLimiter = make(t, { prefix, capacity: 5, refillPerSecond: 5 / 3600 })
      const { get } = await side.serve(t, (app) => {
        app.mount('/api', apiLimiter)
        app.route('get', '/api/items')
        app.route('post', '/create-account', createAccountLimiter)
      })
      t.same(await passes(get, '/create-account', 2, 'POST'), { ok: 2, statuses: [200] }, 'two accounts created')
      t.same(await passes(get, '/api/items', 100), { ok: 100, statuses: [200] }, '100 of 100 API calls pass')
      t.same(await bucketsOf(redis, prefix), ['ALL /api/*', 'POST /create-account'], 'a bucket per declaration')
    })

    t.test('one limit mounted twice on the way of a request spends once: 4 of 6 pass a capacity of 4', async (t) => {
      const limit = make(t, { prefix: uniquePrefix(), capacity: 4, refillPerSecond: 0.001 })
      const { get } = await side.serve(t, (app) => {
        app.mount(undefined, limit)
        app.mount('/api', limit)
        app.route('get', '/api/items')
      })
      t.same(await passes(get, '/api/items', 6), { ok: 4, statuses: [200, 429] })
    })

    t.test('two instances with the same options on one bucket spend once: 4 of 6 pass a capacity of 4', async (t) => {
      const prefix = uniquePrefix()
      const a = make(t, { prefix, capacity: 4, refillPerSecond: 0.001 })
      const b = make(t, { prefix, capacity: 4, refillPerSecond: 0.001 })
      const { get } = await side.serve(t, (app) => {
        app.mount(undefined, a)
        app.mount(undefined, b)
        app.route('get', '/items')
      })
      t.same(await passes(get, '/items', 6), { ok: 4, statuses: [200, 429] })
    })

    t.test('two instances with different policies on one bucket: one warning naming both', async (t) => {
      const prefix = uniquePrefix()
      const logger = memoryLogger()
      const a = make(t, { prefix, capacity: 4, refillPerSecond: 1 })
      const b = make(t, { prefix, capacity: 2, refillPerSecond: 1, logger })
      const { get } = await side.serve(t, (app) => {
        app.mount(undefined, a)
        app.mount(undefined, b)
        app.route('get', '/items')
      })
      await passes(get, '/items', 3)
      t.same(logger.lines, ['tollgate: two rateLimit() instances put different policies on the bucket "app": app gives it capacity 4 and refillPerSecond 1, app 2 and 1, and both spend from it; give one of them another `bucket`'])
    })

    t.test('a limit mounted on a path without a bucket: named by the mount path, `limit` as `limit()`', async (t) => {
      const prefix = uniquePrefix()
      const limit = make(t, { prefix, capacity: 3, refillPerSecond: 0.001 })
      const { get } = await side.serve(t, (app) => {
        app.mount('/api', limit())
        app.mount('/admin', limit)
        app.route('get', '/api/items')
        app.route('get', '/admin/items')
      })
      t.same(await passes(get, '/api/items', 4), { ok: 3, statuses: [200, 429] }, 'limit() on /api: 3 of 4 pass a capacity of 3')
      t.same(await passes(get, '/admin/items', 4), { ok: 3, statuses: [200, 429] }, 'limit on /admin: a bucket of its own')
      t.same(await bucketsOf(redis, prefix), ['ALL /admin/*', 'ALL /api/*'])
    })

    t.test('a route declared for every method is one bucket: 2 of 8 pass a capacity of 2 over 4 methods', async (t) => {
      const prefix = uniquePrefix()
      const limit = make(t, { prefix, capacity: 2, refillPerSecond: 0.001 })
      const { get } = await side.serve(t, (app) => { app.route('all', '/any', limit()) })
      let ok = 0
      for (const method of ['GET', 'POST', 'PUT', 'DELETE']) ok += (await passes(get, '/any', 2, method)).ok
      t.equal(ok, 2)
      t.same(await bucketsOf(redis, prefix), ['ALL /any'])
    })

    t.test('a client that disconnects while it waits: its handler does not run, its reserved token stays spent', async (t) => {
      const limit = make(t, { prefix: uniquePrefix(), capacity: 1, refillPerSecond: 1 })
      const policy = { bucket: 'shared', key: () => 'one', maxWaitMs: 3000 }
      const handled: string[] = []
      const { get, port } = await side.serve(t, (app) => { app.route('get', '/wait/:who', limit(policy)) }, handled)
      t.equal((await get('/wait/first')).status, 200, 'the bucket is empty now')
      const at = { host: '127.0.0.1', port }
      const started = performance.now()
      const gone = request({ ...at, path: '/wait/gone' })
      gone.on('error', () => {})
      gone.end()
      await sleep(50)
      gone.destroy()
      await sleep(1300 - (performance.now() - started))
      t.same(handled, ['/wait/first'], "the gone request's handler did not run")
      const { remaining } = await limit.peek('one', { bucket: 'shared' })
      t.equal(remaining, 0, `the token it reserved stays spent: no whole token ${(performance.now() - started).toFixed(0)} ms in (1 had it been given back)`)
    })
  })
}

t.test('Fastify agrees: a route declared for every method is one bucket, 2 of 8 pass', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 2, refillPerSecond: 0.001 },
    routes: (app) => { app.all('/any', async () => ({ ok: true })) }
  })
  let ok = 0
  for (const method of ['GET', 'POST', 'PUT', 'DELETE'] as const) {
    for (let i = 0; i < 2; i++) if ((await app.inject({ method, url: '/any' })).statusCode === 200) ok++
  }
  t.equal(ok, 2)
})
