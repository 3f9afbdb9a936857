// A `key` or `cost` of the app that fails, on all three adapters through
// their real frameworks: the client gets the one generic 500
// (docs/reference/errors.md), never the value the function returned nor
// what it threw; the log line says what it was, previewed and bounded, the
// cause once, and, when the function threw or returned nothing, where the
// check runs and what to change (the usual cause: the check runs before the
// body parser or the authentication that sets what it reads).
//
// No store call is made for these requests: the in-process store serves.

import express, { type ErrorRequestHandler, type Request } from 'express'
import Fastify, { type FastifyRequest } from 'fastify'
import { Hono, type Context } from 'hono'
import t, { type Test } from 'tap'
import tollgate from '../lib/index.js'
import { rateLimit } from '../lib/express.js'
import { rateLimit as honoRateLimit, type RateLimitEnv } from '../lib/hono.js'
import { captureLogs } from './helpers/app.js'
import { listen, type Answer } from './helpers/express.js'
import { listenHono } from './helpers/hono.js'
import type { Logger } from '../lib/core/types.js'

const SECRET = 'hash-0f3a9c-secret'
const GENERIC = { statusCode: 500, code: 'TOLLGATE_BAD_INPUT', error: 'Internal Server Error', message: 'Rate limit check failed; the server log says why' }
/** The user record a `key` returns by mistake: an id, and what must never leave the server. */
const USER = { id: 'u1', passwordHash: SECRET, apiToken: SECRET }
/** The same, 4 MB long. */
const HUGE = { ...USER, blob: 'x'.repeat(4 * 1024 * 1024) }
const BASE = { capacity: 10, refillPerSecond: 1, failureMode: 'open' as const, warnings: false as const }

/** An app's answers and every line it logged (JSON). */
interface Served {
  get: (path: string) => Promise<Answer>
  logs: () => string[]
}

/**
 * One adapter: its app with the routes below, and what its log line says
 * of where the check runs. Each route's function is written for the
 * adapter's own request.
 *   /user    `key` returns the user record
 *   /huge    `key` returns a 4 MB object
 *   /early   `key` reads what is not there yet where the check runs (the
 *            body before the parser, a user before authentication)
 *   /cost    `cost` returns nothing
 */
interface Adapter {
  name: string
  serve: (t: Test) => Promise<Served>
  placement: RegExp
}

/** A logger that keeps each line as JSON, as pino would write it. */
function jsonLogger (lines: string[]): Logger {
  const keep = (obj: object, msg: string): void => { lines.push(JSON.stringify({ ...obj, msg })) }
  return { warn: keep, info: keep, error: keep }
}

const ADAPTERS: Adapter[] = [
  {
    name: 'Fastify',
    placement: /the check runs in Fastify's onRequest hook, before the body is parsed .* needs `hook: 'preHandler'`/,
    async serve (t) {
      const logs = captureLogs()
      const app = Fastify({ logger: { level: 'info', stream: logs.stream } })
      t.teardown(() => app.close())
      await app.register(tollgate, BASE)
      const user = (request: FastifyRequest): string => (request.body as { user: string }).user
      app.get('/user', { config: { rateLimit: { key: () => USER as never } } }, async () => 'handler ran')
      app.get('/huge', { config: { rateLimit: { key: () => HUGE as never } } }, async () => 'handler ran')
      app.post('/early', { config: { rateLimit: { key: user } } }, async () => 'handler ran')
      app.get('/cost', { config: { rateLimit: { cost: () => undefined as never } } }, async () => 'handler ran')
      await app.ready()
      return {
        get: async (path) => {
          const res = await app.inject({ method: path === '/early' ? 'POST' : 'GET', url: path, payload: path === '/early' ? { user: 'ann' } : undefined })
          return { status: res.statusCode, headers: res.headers as Answer['headers'], body: res.body }
        },
        logs: () => logs.lines.map((l) => JSON.stringify(l))
      }
    }
  },
  {
    name: 'Express',
    placement: /the check runs where the limiter is placed .* after express\.json\(\)/,
    async serve (t) {
      const lines: string[] = []
      const limit = rateLimit({ ...BASE, logger: jsonLogger(lines) })
      t.teardown(() => limit.close())
      const app = express()
      const ok = (_req: Request, res: express.Response): void => { res.send('handler ran') }
      app.get('/user', limit({ key: () => USER as never }), ok)
      app.get('/huge', limit({ key: () => HUGE as never }), ok)
      // The limiter placed before the body parser: req.body is not there yet.
      app.get('/early', limit({ key: (req) => (req.body as { user: string }).user }), express.json(), ok)
      app.get('/cost', limit({ cost: () => undefined as never }), ok)
      app.use(((err: { statusCode: number, code: string, message: string }, _req, res, _next) => {
        res.status(err.statusCode).json({ statusCode: err.statusCode, code: err.code, error: 'Internal Server Error', message: err.message })
      }) as ErrorRequestHandler)
      return { get: await listen(t, app), logs: () => lines }
    }
  },
  {
    name: 'Hono',
    placement: /the check runs where the limiter is placed .* needs the limiter placed after that middleware/,
    async serve (t) {
      const lines: string[] = []
      const limit = honoRateLimit({ ...BASE, logger: jsonLogger(lines) })
      t.teardown(() => limit.close())
      const app = new Hono<RateLimitEnv & { Variables: { user: { id: string } } }>()
      const ok = (c: Context): Response => c.text('handler ran')
      app.get('/user', limit({ key: () => USER as never }), ok)
      app.get('/huge', limit({ key: () => HUGE as never }), ok)
      // The limiter placed before the middleware that sets the user.
      app.get('/early', limit({ key: (c) => (c.get('user') as { id: string }).id }), async (c, next) => { c.set('user', { id: 'ann' }); await next() }, ok)
      app.get('/cost', limit({ cost: () => undefined as never }), ok)
      app.onError((err, c) => {
        const { statusCode, code } = err as Error & { statusCode: 500, code: string }
        return c.json({ statusCode, code, error: 'Internal Server Error', message: err.message }, statusCode)
      })
      return { get: await listenHono(t, app), logs: () => lines }
    }
  }
]

/** The error lines of tollgate about a route. */
function linesOf (served: Served, route: string): string[] {
  return served.logs().filter((l) => l.includes(`rate limit of ${route}`))
}

function count (text: string, part: string): number {
  return text.split(part).length - 1
}

for (const adapter of ADAPTERS) {
  t.test(`${adapter.name}: a key returning the user record`, async (t) => {
    const served = await adapter.serve(t)
    const a = await served.get('/user')
    t.equal(a.status, 500)
    t.same(JSON.parse(a.body), GENERIC, 'the generic 500, the same on every adapter')
    t.notMatch(a.body, SECRET, 'nothing of the returned value reaches the client')
    const lines = linesOf(served, 'GET /user')
    t.equal(lines.length, 1, 'one line says why')
    t.match(lines[0], /`key` must return a non-empty string, got an object \(keys: id, passwordHash, apiToken\)/, 'the value by its type and keys')
    t.notMatch(served.logs().join('\n'), SECRET, 'nor are its values logged')
    t.notMatch(lines[0], adapter.placement, 'a value of the wrong type: no hint about where the check runs')
  })

  t.test(`${adapter.name}: a key returning a 4 MB object`, async (t) => {
    const served = await adapter.serve(t)
    const a = await served.get('/huge')
    t.equal(a.status, 500)
    t.ok(a.body.length < 200, `the body is bounded: ${a.body.length} bytes`)
    t.same(JSON.parse(a.body), GENERIC)
    const lines = linesOf(served, 'GET /huge')
    t.equal(lines.length, 1)
    t.ok((lines[0] ?? '').length < 400, `the log line is bounded: ${(lines[0] ?? '').length} characters`)
    t.match(lines[0], /got an object \(keys: id, passwordHash, apiToken, blob\)/)
    t.ok(served.logs().every((l) => l.length < 4000), 'no log line carries the object')
  })

  t.test(`${adapter.name}: a key that reads what is not there yet where the check runs`, async (t) => {
    const served = await adapter.serve(t)
    const a = await served.get('/early')
    t.equal(a.status, 500)
    t.same(JSON.parse(a.body), GENERIC)
    t.notMatch(a.body, 'Cannot read properties', 'what the function threw stays on the server')
    const lines = linesOf(served, 'POST /early').concat(linesOf(served, 'GET /early'))
    t.equal(lines.length, 1)
    t.match(lines[0], /`key` threw TypeError: Cannot read properties of undefined/)
    t.match(lines[0], adapter.placement, 'where the check runs, and what to change')
    t.equal(count(served.logs().join('\n'), 'Cannot read properties'), 1, 'the cause once in the whole log')
  })

  t.test(`${adapter.name}: a cost returning nothing`, async (t) => {
    const served = await adapter.serve(t)
    const a = await served.get('/cost')
    t.same([a.status, JSON.parse(a.body)], [500, GENERIC])
    const lines = linesOf(served, 'GET /cost')
    t.match(lines[0], /`cost` must return a finite number > 0 and <= capacity \(10\), got undefined/)
    t.match(lines[0], adapter.placement, 'nothing returned: where the check runs')
  })
}

t.test("the frameworks' own error handlers: nothing of the value either", async (t) => {
  const limit = rateLimit({ ...BASE, logger: jsonLogger([]) })
  t.teardown(() => limit.close())
  const app = express()
  app.get('/user', limit({ key: () => USER as never }), (_req, res) => { res.send('handler ran') })
  const viaExpress = await (await listen(t, app))('/user')
  t.equal(viaExpress.status, 500)
  t.notMatch(viaExpress.body, SECRET, "Express's finalhandler")
  const honoLimit = honoRateLimit({ ...BASE, logger: jsonLogger([]) })
  t.teardown(() => honoLimit.close())
  const hono = new Hono<RateLimitEnv>()
  hono.get('/user', honoLimit({ key: () => USER as never }), (c) => c.text('handler ran'))
  const viaHono = await (await listenHono(t, hono))('/user')
  t.same([viaHono.status, viaHono.body], [500, 'Internal Server Error'], "Hono's default onError")
})
