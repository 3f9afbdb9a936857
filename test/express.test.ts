// tollgate/express (docs/guides/express.md), on a real Redis, run once against
// Express 5 and once against Express 4 (installed under the alias
// `express4`): route-pattern buckets, the limiter itself as app-wide
// middleware (`app.use(rateLimit(...))`), the app-level bucket, one bucket
// with two policies, req.rateLimit, the app answering itself, bad
// `key`/`cost`, the start-up wait and reserve and settle. First-call
// headers, exhaustion, several policies on a route and consume, peek and
// reset, as on every adapter, are in test/adapter-basics.test.ts; failures of the store in
// test/adapter-failures.test.ts; the byte-for-byte comparison with the
// Fastify plugin in test/adapter-parity.test.ts; bucket names against
// spellings of the URL in test/express-routes.test.ts; late decisions,
// disconnects and shutdown in test/adapter-lifecycle.test.ts.

import { mkdtemp, rm } from 'node:fs/promises'
import { IncomingMessage } from 'node:http'
import { Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import express5, { type ErrorRequestHandler, type RequestHandler } from 'express'
import express4 from 'express4'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { APP_BUCKET, RateLimitError, rateLimit, type ExpressOptions, type RateLimit } from '../lib/express.js'
import { keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { listen, memoryLogger, type Answer } from './helpers/express.js'
import { redisUrl } from './helpers/redis.js'

const ok: RequestHandler = (req, res) => { res.json({ source: req.rateLimit?.source ?? null }) }
const byClient = { key: (req: { get: (name: string) => string | undefined }) => req.get('x-client') ?? 'anonymous' }

const url = await redisUrl(t)

/** The lines `fn` printed through console.error and console.warn (Express's default error handler prints with console.error). */
async function consoleLines (fn: () => Promise<void>): Promise<string[]> {
  const lines: string[] = []
  const { error, warn } = console
  console.error = (...args: unknown[]) => { lines.push(...args.map(String).join(' ').split('\n')) }
  console.warn = console.error
  try {
    await fn()
  } finally {
    console.error = error
    console.warn = warn
  }
  return lines
}

for (const [major, express] of [['Express 5', express5], ['Express 4', express4]] as const) {
  t.test(major, async (t) => {
    const redis = await sharedRedis(t)

    // Decided by Redis with a deadline a loaded machine does not miss: this file is not about deadlines.
    function limiter (t: Test, options: Partial<ExpressOptions> = {}): { limit: RateLimit, prefix: string } {
      const prefix = uniquePrefix()
      const limit = rateLimit({ redis, prefix, capacity: 100, refillPerSecond: 10, failureMode: 'open', timeout: 1000, logger: memoryLogger(), ...options })
      t.teardown(() => limit.close())
      return { limit, prefix }
    }

    t.test('buckets: method and mount path + route pattern, never the raw URL', async (t) => {
      // A token refills in 100 s, not 0.1 s: the count below must not depend
      // on how long a loaded machine takes over these ten requests.
      const { limit, prefix } = limiter(t, { refillPerSecond: 0.01 })
      const app = express()
      const router = express.Router()
      router.get('/users/:id', limit(), ok)
      app.use('/api', router)
      app.get('/users/:id', limit(), ok)
      app.all('/any', limit(), ok)
      app.get(['/one', '/two'], limit(), ok)
      const get = await listen(t, app)
      for (const path of ['/users/1', '/users/2', '/api/users/3', '/api/users/4', '/one', '/two']) t.equal((await get(path)).status, 200, path)
      t.equal((await get('/users/5', {}, 'HEAD')).status, 200, 'HEAD')
      t.equal((await get('/any', {}, 'POST')).status, 200)
      t.equal((await get('/any', {}, 'DELETE')).status, 200)
      const keys = await keysUnder(redis, prefix)
      t.same(keys, [
        `${prefix}:{127.0.0.1}:ALL /any`,
        `${prefix}:{127.0.0.1}:GET /api/users/:id`,
        `${prefix}:{127.0.0.1}:GET /one,/two`,
        `${prefix}:{127.0.0.1}:GET /users/:id`
      ], 'app.all: one bucket for every method')
      const a = await get('/users/6')
      t.equal(a.headers['ratelimit-remaining'], '96', 'GET /users/1, /2, /5 (HEAD), /6: one bucket')
    })

    t.test("app.use(rateLimit(options)), express-rate-limit's habit: the whole app, one bucket per client, no log line", async (t) => {
      const logger = memoryLogger()
      const prefix = uniquePrefix()
      const app = express()
      app.use(rateLimit({ redis, prefix, capacity: 3, refillPerSecond: 0.01, failureMode: 'open', logger }))
      app.get('/a', ok)
      app.get('/b', ok)
      const get = await listen(t, app)
      const printed = await consoleLines(async () => {
        const answers = [await get('/a'), await get('/b'), await get('/nowhere'), await get('/a')]
        t.same(answers.map((a) => a.status), [200, 200, 404, 429], 'one bucket for /a, /b and unknown URLs')
        t.equal(answers[0]?.headers['ratelimit-remaining'], '2', 'decided by Redis, with the headers')
        t.same(JSON.parse(answers[0]?.body ?? ''), { source: 'store' }, 'req.rateLimit is set')
      })
      t.same([printed, logger.lines], [[], []], 'no line on the console or the logger for these 4 requests')
      t.same(await keysUnder(redis, prefix), [`${prefix}:{127.0.0.1}:${APP_BUCKET}`], `the bucket is named '${APP_BUCKET}'`)
    })

    t.test('the limiter as app middleware and as the maker of route limits, in one app; the bucket option names it', async (t) => {
      const { limit, prefix } = limiter(t, { bucket: 'site', capacity: 5, refillPerSecond: 0.01 })
      const app = express()
      app.use(limit)
      app.get('/search', limit({ bucket: 'search', capacity: 1 }), ok)
      app.get('/home', ok)
      const get = await listen(t, app)
      const statuses = [await get('/search'), await get('/search'), await get('/home')].map((a) => a.status)
      t.same(statuses, [200, 429, 200], 'the route limit applies after the app-wide one')
      t.equal((await get('/home')).headers['ratelimit-remaining'], '1', 'four of five spent from the app-wide bucket')
      t.same(await keysUnder(redis, prefix), [`${prefix}:{127.0.0.1}:search`, `${prefix}:{127.0.0.1}:site`])
    })

    t.test('app.use(limit) with options that are no complete policy: a 500 naming what is missing', async (t) => {
      const limit = rateLimit({ redis, prefix: uniquePrefix(), failureMode: 'open', logger: memoryLogger() })
      t.teardown(() => limit.close())
      const app = express()
      app.use(limit)
      app.get('/a', ok)
      app.use(((err, _req, res, _next) => { res.status(500).json({ code: err.code, message: err.message }) }) as ErrorRequestHandler)
      const get = await listen(t, app)
      for (let i = 0; i < 2; i++) {
        const a = await get('/a')
        t.same([a.status, JSON.parse(a.body)], [500, { code: 'TOLLGATE_INVALID_OPTION', message: 'tollgate: `app.use(limit): capacity` must be a finite number > 0 (set it in rateLimit() or limit()), got undefined' }])
      }
    })

    t.test('app-level middleware: the named bucket, shared by every route; without a name, the whole app\'s', async (t) => {
      const { limit, prefix } = limiter(t)
      const app = express()
      app.use(limit({ bucket: 'site', capacity: 3, refillPerSecond: 0.01 }))
      app.get('/a', ok)
      app.get('/b', ok)
      const get = await listen(t, app)
      const statuses = [await get('/a'), await get('/b'), await get('/nowhere'), await get('/a')].map((a) => a.status)
      t.same(statuses, [200, 200, 404, 429], 'one bucket for /a, /b and unknown URLs')
      t.same(await keysUnder(redis, prefix), [`${prefix}:{127.0.0.1}:site`])

      const other = limiter(t)
      const unnamed = express()
      unnamed.use(other.limit())
      unnamed.get('/a', ok)
      const a = await (await listen(t, unnamed))('/a')
      t.equal(a.status, 200)
      t.same(await keysUnder(redis, other.prefix), [`${other.prefix}:{127.0.0.1}:${APP_BUCKET}`], 'limit() on the whole app: as app.use(limit)')
    })

    t.test('one bucket, one policy: a second policy on a bucket is refused', async (t) => {
      const { limit } = limiter(t)
      limit({ bucket: 'shared', capacity: 5, refillPerSecond: 1 })
      limit({ bucket: 'shared', capacity: 5, refillPerSecond: 1, cost: 2 })
      t.throws(() => limit({ bucket: 'shared', capacity: 6, refillPerSecond: 1 }), {
        name: 'TypeError',
        code: 'TOLLGATE_INVALID_OPTION',
        message: /`limit\(\) of shared: bucket` must be a bucket name with one policy: shared gives it capacity 5 and refillPerSecond 1, this one 6 and 1/
      }, 'at limit() time when the bucket is named')

      const app = express()
      app.get('/x', limit({ capacity: 5 }), limit({ capacity: 6 }), ok)
      app.use(((err, _req, res, _next) => { res.status(500).json({ code: err.code, message: err.message }) }) as ErrorRequestHandler)
      const a = await (await listen(t, app))('/x')
      t.match(JSON.parse(a.body), { code: 'TOLLGATE_INVALID_OPTION', message: /bucket name with one policy: GET \/x gives it capacity 5/ }, 'on the first request when the route names it')
    })

    t.test('req.rateLimit, allow, legacy headers and headers: false', async (t) => {
      const { limit } = limiter(t)
      const app = express()
      app.get('/legacy', limit({ headers: 'legacy' }), ok)
      app.get('/none', limit({ headers: false }), ok)
      app.get('/allowed', limit({ allow: async (req) => req.get('x-admin') === 'yes' }), ok)
      app.get('/seen', limit(byClient), (req, res) => { res.json(req.rateLimit) })
      const get = await listen(t, app)
      const legacy = await get('/legacy')
      t.same([legacy.headers['x-ratelimit-limit'], legacy.headers['x-ratelimit-remaining'], legacy.headers['ratelimit-limit']], ['100', '99', undefined])
      const none = await get('/none')
      t.same(Object.keys(none.headers).filter((h) => h.includes('ratelimit')), [])
      const admin = await get('/allowed', { 'x-admin': 'yes' })
      t.same([admin.status, JSON.parse(admin.body), admin.headers['ratelimit-limit']], [200, { source: null }, undefined], 'allowed: no decision, no headers')
      t.equal((await get('/allowed')).headers['ratelimit-remaining'], '99')
      t.match(JSON.parse((await get('/seen', { 'x-client': 'bob' })).body), { allowed: true, limit: 100, remaining: 99, source: 'store', bucket: 'GET /seen' })
    })

    t.test('the app answers itself: a handler, or the error passed to next()', async (t) => {
      const seen: RateLimitError[] = []
      const { limit } = limiter(t, {
        capacity: 1,
        refillPerSecond: 0.01,
        handler: (req, res, next, err) => {
          seen.push(err)
          if (req.path === '/own') res.status(err.status).send(`slow down, ${err.retryAfter} s`)
          else if (req.path === '/throw') throw new Error('handler failed')
          else next(err)
        }
      })
      const app = express()
      app.get('/own', limit(), ok)
      app.get('/next', limit(), ok)
      app.get('/throw', limit(), ok)
      app.use(((err, _req, res, _next) => {
        res.status(err.status ?? 500).set(err.headers ?? {}).json({ code: err.code ?? 'other', message: err.message })
      }) as ErrorRequestHandler)
      const get = await listen(t, app)
      for (const path of ['/own', '/next', '/throw']) await get(path)
      const own = await get('/own')
      t.same([own.status, own.body, own.headers['retry-after']], [429, 'slow down, 100 s', '100'])
      const next = await get('/next')
      t.same([next.status, JSON.parse(next.body)], [429, { code: 'TOLLGATE_RATE_LIMITED', message: 'Rate limit exceeded, retry in 100 second(s)' }])
      t.equal(next.headers['ratelimit-remaining'], '0', 'the rate-limit headers are set before the handler runs')
      const thrown = await get('/throw')
      t.same([thrown.status, JSON.parse(thrown.body)], [500, { code: 'other', message: 'handler failed' }], 'a handler that throws: its error goes to next()')
      const err = seen[0] as RateLimitError
      t.ok(err instanceof RateLimitError && err instanceof Error)
      t.match(err, { name: 'RateLimitError', status: 429, statusCode: 429, code: 'TOLLGATE_RATE_LIMITED', expose: true, headers: { 'Retry-After': '100' }, retryAfter: 100 })
      t.equal(err.body, '{"statusCode":429,"code":"TOLLGATE_RATE_LIMITED","error":"Too Many Requests","message":"Rate limit exceeded, retry in 100 second(s)"}')
      t.match(err.decision, { allowed: false, bucket: 'GET /own' })
    })

    t.test('key and cost: their failures are generic 500s, the log line naming the route; no store call', async (t) => {
      const logger = memoryLogger()
      const { limit, prefix } = limiter(t, { logger })
      const app = express()
      app.get('/key-throws', limit({ key: () => { throw new Error('no user') } }), ok)
      app.get('/key-empty', limit({ key: async () => '' }), ok)
      app.get('/cost-big', limit({ cost: () => 101 }), ok)
      app.get('/cost-rejects', limit({ cost: async () => { throw new Error('no body') } }), ok)
      app.get('/cost', limit({ cost: async (req) => Number(req.query.n) }), ok)
      app.use(((err, _req, res, _next) => { res.status(err.status).json({ code: err.code, message: err.message }) }) as ErrorRequestHandler)
      const get = await listen(t, app)
      const expected: Array<[string, RegExp]> = [
        ['/key-throws', /^tollgate: rate limit of GET \/key-throws: `key` threw Error: no user \(at .*\); the check runs where the limiter is placed/],
        ['/key-empty', /`key` must return a non-empty string, got ""/],
        ['/cost-big', /`cost` must return a finite number > 0 and <= capacity \(100\), got 101/],
        ['/cost-rejects', /`cost` threw Error: no body/]
      ]
      for (const [path, message] of expected) {
        const a = await get(path)
        t.equal(a.status, 500, path)
        t.match(JSON.parse(a.body), { code: 'TOLLGATE_BAD_INPUT', message: 'Rate limit check failed; the server log says why' }, path)
        t.match(logger.lines.filter((l) => l.includes(`GET ${path}:`)), [message], `${path}: one line says why`)
      }
      t.same(await keysUnder(redis, prefix), [], 'no store call was made')
      t.equal((await get('/cost?n=40')).headers['ratelimit-remaining'], '60')
    })

    t.test('the first requests wait for a client that is still connecting', async (t) => {
      const lazy = new Redis(url, { lazyConnect: true })
      t.teardown(() => lazy.disconnect())
      const logger = memoryLogger()
      const limit = rateLimit({ redis: lazy, prefix: uniquePrefix(), capacity: 5, refillPerSecond: 1, failureMode: 'closed', logger })
      t.teardown(() => limit.close())
      const app = express()
      app.get('/x', limit(), ok)
      const get = await listen(t, app)
      const a = await get('/x')
      t.same([a.status, JSON.parse(a.body)], [200, { source: 'store' }], 'decided by Redis, not by the failure mode')
      await limit.ready
      t.same(logger.lines, [])
    })

    t.test('a request without an address (a Unix socket): one shared identity, one warning', async (t) => {
      const logger = memoryLogger()
      const { limit, prefix } = limiter(t, { logger })
      const app = express()
      app.get('/x', limit(), ok)
      const dir = await mkdtemp(join(tmpdir(), 'tollgate-'))
      t.teardown(() => rm(dir, { recursive: true, force: true }))
      const get = await listen(t, app, join(dir, 'app.sock'))
      t.equal((await get('/x')).status, 200)
      t.equal((await get('/x')).headers['ratelimit-remaining'], '98')
      t.same(await keysUnder(redis, prefix), [`${prefix}:{no-address}:GET /x`])
      t.equal(logger.lines.length, 1)
      t.match(logger.lines[0], /no client address.*"no-address".*'trust proxy'/)
    })

    t.test("a forwarding header while Express trusts no proxy: one warning; 'trust proxy' keys by the client", async (t) => {
      const logger = memoryLogger()
      const { limit, prefix } = limiter(t, { logger })
      const app = express()
      app.get('/x', limit(), ok)
      const trusting = express()
      trusting.set('trust proxy', 'loopback')
      trusting.get('/x', limit(), ok)
      const get = await listen(t, app)
      const viaProxy = await listen(t, trusting)
      await get('/x')
      await viaProxy('/x', { 'x-forwarded-for': '192.0.2.7' })
      await get('/x', { forwarded: 'for=192.0.2.9' })
      await get('/x', { 'x-forwarded-for': '192.0.2.7' })
      await get('/x', { 'x-forwarded-for': '192.0.2.8' })
      t.equal(logger.lines.length, 1)
      t.match(logger.lines[0], /carries Forwarded but Express does not trust proxies/)
      t.same(await keysUnder(redis, prefix), [`${prefix}:{127.0.0.1}:GET /x`, `${prefix}:{192.0.2.7}:GET /x`])

      const quiet = memoryLogger()
      const silent = limiter(t, { logger: quiet, warnings: { proxy: false } }).limit
      const app2 = express()
      app2.get('/x', silent(), ok)
      await (await listen(t, app2))('/x', { 'x-forwarded-for': '192.0.2.7' })
      t.same(quiet.lines, [])
    })

    t.test('the denial cache and leases: decided in this process, as by the plugin', async (t) => {
      const { limit } = limiter(t, { handler: (_req, res, _next, err) => { res.status(err.status).json({ source: err.decision.source }) } })
      const app = express()
      app.get('/denied', limit({ capacity: 2, refillPerSecond: 0.01 }), ok)
      app.get('/leased', limit({ capacity: 100, refillPerSecond: 0.01, lease: { tokens: 10, maxAgeMs: 60_000 } }), ok)
      app.use(((err, _req, res, _next) => { res.status(500).json({ message: err.message }) }) as ErrorRequestHandler)
      const get = await listen(t, app)
      const denied: string[] = []
      for (let i = 0; i < 5; i++) {
        const a = await get('/denied')
        denied.push(`${a.status} ${String((JSON.parse(a.body) as { source: string }).source)}`)
      }
      t.same(denied, ['200 store', '200 store', '429 store', '429 cache', '429 cache'], 'a denial is remembered: no script call while it holds')
      const sources: string[] = []
      for (let i = 0; i < 12; i++) sources.push(String((JSON.parse((await get('/leased')).body) as { source: string }).source))
      t.same(sources, ['store', ...Array(9).fill('cache'), 'store', 'cache'], 'one script call per batch of 10')
      const a = await get('/leased')
      t.equal(a.headers['ratelimit-remaining'], '87', '13 spent, the batch\'s unspent tokens counted as left')
    })

    t.test("plans: a policy's limit picks the client's capacity and rate per request, false lets it through", async (t) => {
      const { limit } = limiter(t)
      const plans: Record<string, { capacity: number, refillPerSecond: number }> = { pro: { capacity: 50, refillPerSecond: 5 }, basic: { capacity: 2, refillPerSecond: 0.01 }, broken: { capacity: -1, refillPerSecond: 1 } }
      const app = express()
      app.get('/api', limit({ ...byClient, limit: (req) => plans[req.get('x-plan') ?? ''] ?? false }), ok)
      const get = await listen(t, app)
      const pro = await get('/api', { 'x-client': 'p', 'x-plan': 'pro' })
      t.equal(pro.headers['ratelimit-limit'], '50', "the headers of the client's own plan")
      t.equal(pro.headers['ratelimit-policy'], '50;w=10')
      const basic: number[] = []
      for (let i = 0; i < 3; i++) basic.push((await get('/api', { 'x-client': 'b', 'x-plan': 'basic' })).status)
      t.same(basic, [200, 200, 429])
      const free = await get('/api', { 'x-client': 'b', 'x-plan': 'internal' })
      t.equal(free.status, 200, 'false: no limit')
      t.same(JSON.parse(free.body), { source: null })
      t.equal(free.headers['ratelimit-limit'], undefined)
      const bad = await get('/api', { 'x-client': 'b', 'x-plan': 'broken' })
      t.equal(bad.status, 500, 'a bad plan is a 500 TOLLGATE_BAD_INPUT')
    })

    t.test('charging by outcome: settled once the response is finished; successes refunded, failures count', async (t) => {
      const logger = memoryLogger()
      const { limit } = limiter(t, { logger })
      const policy = { bucket: 'login', capacity: 3, refillPerSecond: 0.01 }
      const app = express()
      app.post('/login', limit({ ...policy, ...byClient, settle: (req, res) => req.get('x-actual') !== undefined ? Number(req.get('x-actual')) : res.statusCode === 401 ? 1 : 0 }), (req, res) => {
        res.status(req.get('x-password') === 'right' ? 200 : 401).json({ source: req.rateLimit?.source ?? null })
      })
      const post = await listen(t, app)
      async function left (remaining: number): Promise<void> {
        for (let i = 0; (await limit.peek('eve', policy)).remaining !== remaining; i++) {
          if (i > 500) throw new Error(`no settlement to ${remaining} tokens after 5 s`)
          await new Promise((resolve) => setTimeout(resolve, 10))
        }
      }
      for (let i = 0; i < 5; i++) {
        t.equal((await post('/login', { 'x-client': 'eve', 'x-password': 'right' }, 'POST')).status, 200)
        await left(3)
      }
      t.pass('five successful logins, each refunded')
      const statuses: number[] = []
      for (let i = 0; i < 4; i++) statuses.push((await post('/login', { 'x-client': 'eve' }, 'POST')).status)
      t.same(statuses, [401, 401, 401, 429], 'three failures spend the bucket')
      await limit.reset('eve', 'login')
      t.equal((await post('/login', { 'x-client': 'eve', 'x-password': 'right', 'x-actual': 'NaN' }, 'POST')).status, 200)
      for (let i = 0; logger.lines.length === 0; i++) {
        if (i > 500) throw new Error('no log line after 5 s')
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      t.match(logger.lines[0], /settle failed; the reservation stands/)
      t.equal((await limit.peek('eve', policy)).remaining, 2, 'a bad settle leaves the reservation')
    })

    t.test('shadow mode: a policy decided and spent as usual that never refuses nor shows in the headers', async (t) => {
      const { limit } = limiter(t, { handler: (_req, res, _next, err) => { res.status(err.status).json({ source: err.decision.source }) } })
      const app = express()
      const seen: Array<boolean | undefined> = []
      app.get('/trial', limit({ ...byClient, capacity: 2, refillPerSecond: 0.01, shadow: true }), (req, res) => {
        seen.push(req.rateLimit?.shadow)
        res.json({ allowed: req.rateLimit?.allowed })
      })
      app.get('/mixed', limit([{ ...byClient, capacity: 100, refillPerSecond: 10 }, { ...byClient, bucket: 'tight', capacity: 1, refillPerSecond: 0.01, shadow: true }]), ok)
      const get = await listen(t, app)
      const trial: Answer[] = []
      for (let i = 0; i < 4; i++) trial.push(await get('/trial', { 'x-client': 's' }))
      t.same(trial.map((a) => a.status), [200, 200, 200, 200], 'never refuses')
      t.same(seen, [undefined, undefined, true, true], 'would-be denials flagged on req.rateLimit')
      t.equal(trial[0]?.headers['ratelimit-limit'], undefined, 'a shadow-only route sends no headers')
      const mixed: Answer[] = []
      for (let i = 0; i < 3; i++) mixed.push(await get('/mixed', { 'x-client': 's' }))
      t.same(mixed.map((a) => a.status), [200, 200, 200])
      t.equal(mixed[2]?.headers['ratelimit-limit'], '100', 'only the enforced policy shows')
      t.equal(mixed[2]?.headers['ratelimit-remaining'], '97')
      t.equal(mixed[2]?.headers['ratelimit-policy'], '100;w=10')
    })

    t.test('lockouts: repeated denials block the client for forMs; other clients pass', async (t) => {
      const { limit } = limiter(t, { maxWaiters: 5, handler: (_req, res, _next, err) => { res.status(err.status).json({ locked: err.decision.locked ?? false, retryAfter: err.retryAfter }) } })
      const app = express()
      app.post('/login', limit({ ...byClient, bucket: 'login', capacity: 1, refillPerSecond: 0.01, lockout: { after: 2, withinMs: 60_000, forMs: 600_000 } }), ok)
      const post = await listen(t, app)
      const got: string[] = []
      for (let i = 0; i < 4; i++) {
        const a = await post('/login', { 'x-client': 'mallory' }, 'POST')
        got.push(a.status === 200 ? '200' : `${a.status} ${a.body}`)
      }
      t.same(got, ['200', '429 {"locked":false,"retryAfter":100}', '429 {"locked":true,"retryAfter":600}', '429 {"locked":true,"retryAfter":600}'], 'the second denial starts a block of 600 s')
      t.equal((await post('/login', { 'x-client': 'alice' }, 'POST')).status, 200, 'another client is not blocked')
      t.throws(() => limit({ bucket: 'x', lockout: { after: 2, withinMs: 1000, forMs: 1000 }, settle: () => 0 }), { code: 'TOLLGATE_INVALID_OPTION', message: /`limit\(\): lockout` must be unset to reserve and settle/ })
      await t.rejects(limit.limiter.reserve('c', { bucket: 'x', capacity: 1, refillPerSecond: 1, failureMode: 'open', shadow: true }), { code: 'TOLLGATE_INVALID_OPTION', message: /`policy.shadow` must be unset/ })
    })

    t.test('the programmatic API: reserve and settle by handle, in Redis', async (t) => {
      // A deadline no loaded machine misses: a settlement past it is rejected (and stands as charged).
      const { limit } = limiter(t, { capacity: 10, refillPerSecond: 0.01, timeout: 1000 })
      const exports = { bucket: 'exports' }
      const reservation = await limit.reserve('dave', exports, 6)
      t.match(reservation.decision, { allowed: true, remaining: 4, source: 'store' })
      await limit.settle(reservation, 2)
      t.match(await limit.peek('dave', exports), { remaining: 8 }, 'charged 2 of the 6 reserved')
      await t.rejects(limit.settle(reservation, 0), { code: 'TOLLGATE_INVALID_OPTION', message: /each settles once/ })
      const charged = await limit.reserve('dave', exports, 1)
      await limit.settle(charged, 5)
      t.match(await limit.peek('dave', exports), { remaining: 3 }, 'an actual cost above the reserved one is charged: 8 - 5')
      await t.rejects(limit.reserve('dave', { bucket: 'x', settle: () => 0 } as never), { code: 'TOLLGATE_INVALID_OPTION' })
    })
  })
}

t.test('options are checked like the plugin\'s: coded TypeErrors naming the option', async (t) => {
  const base = { capacity: 5, refillPerSecond: 1, failureMode: 'open' as const, logger: memoryLogger() }
  const cases: Array<[string, () => unknown, RegExp]> = [
    ['not an object', () => rateLimit('x' as never), /`options` must be an object, got "x"/],
    ['no failureMode', () => rateLimit({ capacity: 5 } as never), /`failureMode` must be one of 'open', 'closed', 'local'/],
    ['an option of express-rate-limit', () => rateLimit({ ...base, max: 5 } as never), /unknown option `max`/],
    ["Fastify's hook", () => rateLimit({ ...base, hook: 'preHandler' } as never), /unknown option `hook`/],
    ['a handler that is no function', () => rateLimit({ ...base, handler: 'x' } as never), /`handler` must be a function/],
    ['a logger without methods', () => rateLimit({ ...base, logger: {} } as never), /`logger` must be a logger with warn, info and error methods/],
    ['cost above capacity', () => rateLimit({ ...base, cost: 6 }), /`cost` must be at most capacity \(5\)/],
    ['a bad warnings', () => rateLimit({ ...base, warnings: true } as never), /`warnings` must be false or an object/]
  ]
  for (const [name, fn, message] of cases) t.throws(fn, { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message }, name)

  const limit = rateLimit(base)
  t.teardown(() => limit.close())
  const atLimit: Array<[string, () => unknown, RegExp]> = [
    ['a string', () => limit('x' as never), /`limit\(\)` must be a policy, a non-empty array of policies, or nothing \(to limit the whole app per client, pass the limiter itself: `app.use\(limit\)`\), got "x"/],
    ['a number', () => limit(5 as never), /`limit\(\)` must be a policy, .*got 5$/],
    ['null', () => limit(null as never), /`limit\(\)` must be a policy, .*got null$/],
    ['a request object', () => limit(new IncomingMessage(new Socket()) as never), /`limit\(\)` must be a policy, .*pass the limiter itself: `app.use\(limit\)`/],
    ['a function', () => limit((() => {}) as never), /`limit\(\)` must be a policy, .*got a function$/],
    ['an empty array', () => limit([]), /`limit\(\): rateLimit` must be a policy, a non-empty array/],
    ['a typo', () => limit({ capacty: 5 } as never), /unknown option `limit\(\): capacty`; did you mean `limit\(\): capacity`/],
    ['a bad value in an array', () => limit([{ capacity: 5 }, { refillPerSecond: -1 }]), /`limit\(\)\[1\]\.refillPerSecond` must be a finite number > 0, got -1/],
    ['a named bucket, a bad value', () => limit({ bucket: 'b', capacity: 0 }), /`limit\(\): capacity` must be a finite number > 0, got 0/]
  ]
  for (const [name, fn, message] of atLimit) t.throws(fn, { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message }, name)
  const partial = rateLimit({ failureMode: 'open', logger: memoryLogger() })
  t.teardown(() => partial.close())
  t.throws(() => partial(), { message: /`limit\(\): capacity` must be a finite number > 0 \(set it in rateLimit\(\) or limit\(\)\)/ }, 'a missing capacity, at limit() time')
})

t.test('without redis: in this process, with a warning, to the console by default', async (t) => {
  const warned: unknown[][] = []
  const original = console.warn
  console.warn = (...args: unknown[]) => { warned.push(args) }
  t.teardown(() => { console.warn = original })
  const limit = rateLimit({ capacity: 2, refillPerSecond: 1, failureMode: 'open' })
  t.teardown(() => limit.close())
  await limit.ready
  console.warn = original
  t.same(warned.map((args) => args.length), [1], 'the message alone: it is about nothing more')
  t.match(warned, [[/no `redis` given, limits are kept in this process only/]])
  const app = express5()
  app.get('/x', limit(), ok)
  const get = await listen(t, app)
  t.same([(await get('/x')).status, (await get('/x')).status, (await get('/x')).status], [200, 200, 429])
})
