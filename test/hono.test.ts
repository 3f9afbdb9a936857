// tollgate/hono (docs/guides/hono.md), on a real Redis, with every
// app served by @hono/node-server over a real socket: route-pattern
// buckets (case and encoding variants of one route share one bucket), the
// limiter itself as app-wide middleware, one bucket with two policies,
// c.get('rateLimit'), the app answering itself, bad `key`/`cost`, the
// start-up wait, identity and proxy trust, the denial cache and leases,
// plans, settlement, shadow mode, lockouts, waiting, a Response built by
// the handler after shutdown, reserve and settle, and every option's
// check. First-call headers, exhaustion, several policies on a route and
// consume, peek and reset, as on every adapter, are in test/adapter-basics.test.ts; failures of the
// store in test/adapter-failures.test.ts; the byte-for-byte comparison
// with the other adapters in test/adapter-parity.test.ts; shutdown ending
// waits and disconnected clients in test/adapter-lifecycle.test.ts.

import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { Hono, type Context } from 'hono'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { APP_BUCKET, RateLimitError, rateLimit, type Decision, type HonoOptions, type RateLimit, type RateLimitEnv } from '../lib/hono.js'
import { keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { memoryLogger, type Answer } from './helpers/express.js'
import { listenHono } from './helpers/hono.js'
import { redisUrl } from './helpers/redis.js'

const ok = (c: Context<RateLimitEnv>): Response => {
  const decision: Decision | undefined = c.get('rateLimit') // typed through Hono's Variables
  return c.json({ source: decision?.source ?? null })
}
const byClient = { key: (c: Context) => c.req.header('x-client') ?? 'anonymous' }

/** The app's own error handler: the code and message of tollgate's 500s. */
function errors (app: Hono<RateLimitEnv>): void {
  app.onError((err, c) => c.json({ code: (err as { code?: string }).code ?? 'other', message: err.message }, 500))
}

const url = await redisUrl(t)
const redis = await sharedRedis(t)

function limiter (t: Test, options: Partial<HonoOptions> = {}): { limit: RateLimit, prefix: string } {
  const prefix = uniquePrefix()
  const limit = rateLimit({ redis, prefix, capacity: 100, refillPerSecond: 10, failureMode: 'open', logger: memoryLogger(), ...options })
  t.teardown(() => limit.close())
  return { limit, prefix }
}

t.test('buckets: method and route pattern as Hono matched it, never the raw URL', async (t) => {
  const { limit, prefix } = limiter(t, { refillPerSecond: 0.01 })
  const app = new Hono<RateLimitEnv>()
  const api = new Hono<RateLimitEnv>()
  api.get('/users/:id', limit(), ok)
  app.route('/api', api)
  app.get('/users/:id', limit(), ok)
  app.all('/any', limit(), ok)
  app.use('/v1/*', limit())
  app.get('/v1/things/:id', ok)
  app.get('/raw', limit(), () => new Response('built by the handler'))
  const based = new Hono<RateLimitEnv>().basePath('/base')
  based.get('/x', limit(), ok)
  app.route('/', based)
  const get = await listenHono(t, app)
  for (const path of ['/users/1', '/users/%32', '/api/users/3', '/api/users/%34', '/v1/things/1', '/v1/things/2', '/base/x', '/raw']) t.equal((await get(path)).status, 200, path)
  t.equal((await get('/users/5', {}, 'HEAD')).status, 200, 'HEAD')
  t.equal((await get('/any', {}, 'POST')).status, 200)
  t.equal((await get('/any', {}, 'DELETE')).status, 200)
  t.equal((await get('/v1/things/3', {}, 'POST')).status, 404, 'no POST route: limited, then 404')
  t.same(await keysUnder(redis, prefix), [
    `${prefix}:{127.0.0.1}:ALL /any`,
    `${prefix}:{127.0.0.1}:ALL /v1/*`,
    `${prefix}:{127.0.0.1}:GET /api/users/:id`,
    `${prefix}:{127.0.0.1}:GET /base/x`,
    `${prefix}:{127.0.0.1}:GET /raw`,
    `${prefix}:{127.0.0.1}:GET /users/:id`
  ], 'app.all and app.use: one bucket for every method')
  const a = await get('/users/%36')
  t.equal(a.headers['ratelimit-remaining'], '96', 'GET /users/1, /%32, /5 (HEAD), /%36: one bucket')
  const raw = await get('/raw')
  t.same([raw.body, raw.headers['ratelimit-remaining']], ['built by the handler', '98'], "a Response the handler built carries the headers")
})

t.test('an app that matches case-insensitively: every spelling of one route is one bucket', async (t) => {
  const { limit, prefix } = limiter(t, { capacity: 2, refillPerSecond: 0.01 })
  const app = new Hono<RateLimitEnv>({ getPath: (req) => new URL(req.url).pathname.toLowerCase() })
  app.get('/items/:id', limit(), ok)
  const get = await listenHono(t, app)
  const statuses = []
  for (const path of ['/items/a', '/ITEMS/b', '/Items/%43', '/iTeMs/d']) statuses.push((await get(path)).status)
  t.same(statuses, [200, 200, 429, 429], 'a capacity of 2 over four spellings')
  t.same(await keysUnder(redis, prefix), [`${prefix}:{127.0.0.1}:GET /items/:id`])

  const many = limiter(t, { capacity: 10_000, refillPerSecond: 1 })
  const wide = new Hono<RateLimitEnv>({ getPath: (req) => new URL(req.url).pathname.toLowerCase() })
  wide.get('/items/:id', many.limit(), ok)
  const getWide = await listenHono(t, wide)
  let failed = 0
  for (let i = 0; i < 1040; i++) if ((await getWide(`/${i % 2 === 0 ? 'ITEMS' : 'items'}/${i}`)).status !== 200) failed++
  t.equal(failed, 0, '1040 distinct URLs: no 500')
  t.same(await keysUnder(redis, many.prefix), [`${many.prefix}:{127.0.0.1}:GET /items/:id`], 'and no new bucket')
})

t.test('app.use(rateLimit(options)): the whole app, one bucket per client, 404s too', async (t) => {
  const logger = memoryLogger()
  const prefix = uniquePrefix()
  const limit = rateLimit({ redis, prefix, capacity: 3, refillPerSecond: 0.01, failureMode: 'open', logger })
  t.teardown(() => limit.close())
  const app = new Hono<RateLimitEnv>()
  app.use(limit)
  app.get('/a', ok)
  app.get('/b', ok)
  const get = await listenHono(t, app)
  const answers = [await get('/a'), await get('/b'), await get('/nowhere'), await get('/a')]
  t.same(answers.map((a) => a.status), [200, 200, 404, 429], 'one bucket for /a, /b and unknown URLs')
  t.equal(answers[0]?.headers['ratelimit-remaining'], '2')
  t.same(JSON.parse(answers[0]?.body ?? ''), { source: 'store' }, "c.get('rateLimit') is set")
  t.same(logger.lines, [])
  t.same(await keysUnder(redis, prefix), [`${prefix}:{127.0.0.1}:${APP_BUCKET}`], `the bucket is named '${APP_BUCKET}'`)
})

t.test('the limiter as app middleware and as the maker of route limits; the bucket option names it', async (t) => {
  const { limit, prefix } = limiter(t, { bucket: 'site', capacity: 5, refillPerSecond: 0.01 })
  const app = new Hono<RateLimitEnv>()
  app.use(limit)
  app.get('/search', limit({ bucket: 'search', capacity: 1 }), ok)
  app.get('/home', ok)
  const get = await listenHono(t, app)
  const statuses = [await get('/search'), await get('/search'), await get('/home')].map((a) => a.status)
  t.same(statuses, [200, 429, 200])
  t.equal((await get('/home')).headers['ratelimit-remaining'], '1', 'four of five spent from the app-wide bucket')
  t.same(await keysUnder(redis, prefix), [`${prefix}:{127.0.0.1}:search`, `${prefix}:{127.0.0.1}:site`])
})

t.test('app.use(limit) with options that are no complete policy: a 500 naming what is missing', async (t) => {
  const limit = rateLimit({ redis, prefix: uniquePrefix(), failureMode: 'open', logger: memoryLogger() })
  t.teardown(() => limit.close())
  const app = new Hono<RateLimitEnv>()
  errors(app)
  app.use(limit)
  app.get('/a', ok)
  const get = await listenHono(t, app)
  for (let i = 0; i < 2; i++) {
    const a = await get('/a')
    t.same([a.status, JSON.parse(a.body)], [500, { code: 'TOLLGATE_INVALID_OPTION', message: 'tollgate: `app.use(limit): capacity` must be a finite number > 0 (set it in rateLimit() or limit()), got undefined' }])
  }
})

t.test('one bucket, one policy: a second policy on a bucket is refused', async (t) => {
  const { limit } = limiter(t)
  limit({ bucket: 'shared', capacity: 5, refillPerSecond: 1 })
  t.throws(() => limit({ bucket: 'shared', capacity: 6, refillPerSecond: 1 }), {
    name: 'TypeError',
    code: 'TOLLGATE_INVALID_OPTION',
    message: /`limit\(\) of shared: bucket` must be a bucket name with one policy: shared gives it capacity 5 and refillPerSecond 1, this one 6 and 1/
  })
  const app = new Hono<RateLimitEnv>()
  errors(app)
  app.get('/x', limit({ capacity: 5 }), limit({ capacity: 6 }), ok)
  const a = await (await listenHono(t, app))('/x')
  t.match(JSON.parse(a.body), { code: 'TOLLGATE_INVALID_OPTION', message: /bucket name with one policy: GET \/x gives it capacity 5/ }, 'on the first request when the route names it')
})

t.test("c.get('rateLimit'), allow, legacy headers and headers: false", async (t) => {
  const { limit } = limiter(t)
  const app = new Hono<RateLimitEnv>()
  app.get('/legacy', limit({ headers: 'legacy' }), ok)
  app.get('/none', limit({ headers: false }), ok)
  app.get('/allowed', limit({ allow: async (c) => c.req.header('x-admin') === 'yes' }), ok)
  app.get('/seen', limit(byClient), (c) => c.json(c.get('rateLimit')))
  const get = await listenHono(t, app)
  const legacy = await get('/legacy')
  t.same([legacy.headers['x-ratelimit-limit'], legacy.headers['x-ratelimit-remaining'], legacy.headers['ratelimit-limit']], ['100', '99', undefined])
  t.same(Object.keys((await get('/none')).headers).filter((h) => h.includes('ratelimit')), [])
  const admin = await get('/allowed', { 'x-admin': 'yes' })
  t.same([admin.status, JSON.parse(admin.body), admin.headers['ratelimit-limit']], [200, { source: null }, undefined], 'allowed: no decision, no headers')
  t.equal((await get('/allowed')).headers['ratelimit-remaining'], '99')
  t.match(JSON.parse((await get('/seen', { 'x-client': 'bob' })).body), { allowed: true, limit: 100, remaining: 99, source: 'store', bucket: 'GET /seen' })
})

t.test('the app answers itself: a handler gets the RateLimitError after the headers are set', async (t) => {
  const seen: RateLimitError[] = []
  const { limit } = limiter(t, {
    capacity: 1,
    refillPerSecond: 0.01,
    handler: async (c, err) => {
      seen.push(err)
      if (c.req.path === '/throw') throw new Error('handler failed')
      return c.text(`slow down, ${err.retryAfter} s`, err.status)
    }
  })
  const app = new Hono<RateLimitEnv>()
  errors(app)
  app.get('/own', limit(), ok)
  app.get('/throw', limit(), ok)
  const get = await listenHono(t, app)
  for (const path of ['/own', '/throw']) await get(path)
  const own = await get('/own')
  t.same([own.status, own.body, own.headers['retry-after'], own.headers['ratelimit-remaining']], [429, 'slow down, 100 s', '100', '0'])
  const thrown = await get('/throw')
  t.same([thrown.status, JSON.parse(thrown.body)], [500, { code: 'other', message: 'handler failed' }], "a handler that throws: Hono's onError answers")
  const err = seen[0] as RateLimitError
  t.ok(err instanceof RateLimitError && err instanceof Error)
  t.match(err, { name: 'RateLimitError', status: 429, statusCode: 429, code: 'TOLLGATE_RATE_LIMITED', expose: true, headers: { 'Retry-After': '100' }, retryAfter: 100 })
  t.equal(err.body, '{"statusCode":429,"code":"TOLLGATE_RATE_LIMITED","error":"Too Many Requests","message":"Rate limit exceeded, retry in 100 second(s)"}')
  t.match(err.decision, { allowed: false, bucket: 'GET /own' })
})

t.test("key and cost: their failures are generic 500s, the log line naming the route, through Hono's onError; no store call", async (t) => {
  const logger = memoryLogger()
  const { limit, prefix } = limiter(t, { logger })
  const app = new Hono<RateLimitEnv>()
  errors(app)
  app.get('/key-throws', limit({ key: () => { throw new Error('no user') } }), ok)
  app.get('/key-empty', limit({ key: async () => '' }), ok)
  app.get('/cost-big', limit({ cost: () => 101 }), ok)
  app.get('/cost-rejects', limit({ cost: async () => { throw new Error('no body') } }), ok)
  app.get('/cost', limit({ cost: async (c) => Number(c.req.query('n')) }), ok)
  const get = await listenHono(t, app)
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
  const app = new Hono<RateLimitEnv>()
  app.get('/x', limit(), ok)
  const get = await listenHono(t, app)
  const a = await get('/x')
  t.same([a.status, JSON.parse(a.body)], [200, { source: 'store' }], 'decided by Redis, not by the failure mode')
  await limit.ready
  t.same(logger.lines, [])
})

t.test('identity: the socket peer from getConnInfo; without the Node server or on a Unix socket, one shared identity and one warning', async (t) => {
  const logger = memoryLogger()
  const { limit, prefix } = limiter(t, { logger })
  const app = new Hono<RateLimitEnv>()
  app.get('/x', limit(), ok)
  t.equal((await app.request('/x')).status, 200, 'app.request(): no Node server, no address')
  const dir = await mkdtemp(join(tmpdir(), 'tollgate-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const get = await listenHono(t, app, join(dir, 'app.sock'))
  t.equal((await get('/x')).headers['ratelimit-remaining'], '98', 'the socket: the same identity')
  t.same(await keysUnder(redis, prefix), [`${prefix}:{no-address}:GET /x`])
  t.equal(logger.lines.length, 1)
  t.match(logger.lines[0], /no client address.*"no-address".*`trustProxy`/)
})

t.test('trustProxy: none by default (one warning on a forwarding header); addresses, hop counts and functions as Express reads them', async (t) => {
  const logger = memoryLogger()
  const plain = limiter(t, { logger })
  const app = new Hono<RateLimitEnv>()
  app.get('/x', plain.limit(), ok)
  const get = await listenHono(t, app)
  await get('/x')
  await get('/x', { forwarded: 'for=192.0.2.9' })
  await get('/x', { 'x-forwarded-for': '192.0.2.7' })
  t.equal(logger.lines.length, 1)
  t.match(logger.lines[0], /carries Forwarded but `trustProxy` trusts no proxy/)
  t.same(await keysUnder(redis, plain.prefix), [`${plain.prefix}:{127.0.0.1}:GET /x`], 'X-Forwarded-For is not read')
  const other = memoryLogger()
  const second = new Hono<RateLimitEnv>()
  second.get('/x', limiter(t, { logger: other }).limit(), ok)
  await (await listenHono(t, second))('/x', { 'x-forwarded-for': '192.0.2.7' })
  t.match(other.lines, [/carries X-Forwarded-For but `trustProxy` trusts no proxy/], 'the header is named')

  const direct = limiter(t, { trustProxy: 'loopback' })
  const directApp = new Hono<RateLimitEnv>()
  directApp.get('/x', direct.limit(), ok)
  await (await listenHono(t, directApp))('/x')
  t.same(await keysUnder(redis, direct.prefix), [`${direct.prefix}:{127.0.0.1}:GET /x`], 'a trusted peer without X-Forwarded-For is the client')

  const cases: Array<[string, HonoOptions['trustProxy'], string, string]> = [
    ['loopback', 'loopback', '203.0.113.1, 192.0.2.7', '192.0.2.7'],
    ['an address list', ['10.0.0.1', '127.0.0.1'], '192.0.2.7, 10.0.0.1', '192.0.2.7'],
    ['a comma-separated string with a subnet', '127.0.0.0/8, 10.0.0.0/8', '192.0.2.8, 10.1.2.3', '192.0.2.8'],
    ['a hop count of 1', 1, '192.0.2.5, 192.0.2.6', '192.0.2.6'],
    ['a hop count of 2', 2, '192.0.2.5, 192.0.2.6', '192.0.2.5'],
    ['a function', (address, hop) => address === '127.0.0.1' && hop === 0, '192.0.2.5, 192.0.2.4', '192.0.2.4'],
    ['an IPv6 client behind loopback', 'loopback', '2001:db8:abcd:12ff::1', '2001:db8:abcd:1200:0:0:0:0']
  ]
  for (const [name, trustProxy, forwarded, client] of cases) {
    const quiet = memoryLogger()
    const { limit, prefix } = limiter(t, { logger: quiet, trustProxy })
    const trusting = new Hono<RateLimitEnv>()
    trusting.get('/x', limit(), ok)
    const ask = await listenHono(t, trusting)
    await ask('/x', { 'x-forwarded-for': forwarded })
    t.same(await keysUnder(redis, prefix), [`${prefix}:{${client}}:GET /x`], `${name}: ${forwarded} -> ${client}`)
    t.same(quiet.lines, [], `${name}: no warning`)
  }

  const everyHop = memoryLogger()
  const trustingAll = limiter(t, { logger: everyHop, trustProxy: true, capacity: 1, refillPerSecond: 0.01 })
  t.equal(everyHop.lines.length, 1, 'trustProxy: true warns once, at rateLimit()')
  t.match(everyHop.lines[0], /`trustProxy` trusts every address at every hop/)
  const rotating = new Hono<RateLimitEnv>()
  rotating.get('/x', trustingAll.limit(), ok)
  const ask = await listenHono(t, rotating)
  const statuses = []
  for (let i = 1; i <= 5; i++) statuses.push((await ask('/x', { 'x-forwarded-for': `192.0.2.${i}` })).status)
  t.same(statuses, [200, 200, 200, 200, 200], 'as documented: a client that rotates X-Forwarded-For gets a fresh bucket each time')
  const silenced = memoryLogger()
  limiter(t, { logger: silenced, trustProxy: true, warnings: { trustProxy: false } })
  const silent = memoryLogger()
  const quietPlain = limiter(t, { logger: silent, warnings: { proxy: false } })
  const quietApp = new Hono<RateLimitEnv>()
  quietApp.get('/x', quietPlain.limit(), ok)
  await (await listenHono(t, quietApp))('/x', { 'x-forwarded-for': '192.0.2.7' })
  t.same([silenced.lines, silent.lines], [[], []], 'each warning can be turned off')
})

t.test('the denial cache and leases: decided in this process, as by the plugin', async (t) => {
  const { limit } = limiter(t, { handler: (c, err) => c.json({ source: err.decision.source }, err.status) })
  const app = new Hono<RateLimitEnv>()
  app.get('/denied', limit({ capacity: 2, refillPerSecond: 0.01 }), ok)
  app.get('/leased', limit({ capacity: 100, refillPerSecond: 0.01, lease: { tokens: 10, maxAgeMs: 60_000 } }), ok)
  const get = await listenHono(t, app)
  const denied: string[] = []
  for (let i = 0; i < 5; i++) {
    const a = await get('/denied')
    denied.push(`${a.status} ${String((JSON.parse(a.body) as { source: string }).source)}`)
  }
  t.same(denied, ['200 store', '200 store', '429 store', '429 cache', '429 cache'], 'a denial is remembered: no script call while it holds')
  const sources: string[] = []
  for (let i = 0; i < 12; i++) sources.push(String((JSON.parse((await get('/leased')).body) as { source: string }).source))
  t.same(sources, ['store', ...Array(9).fill('cache'), 'store', 'cache'], 'one script call per batch of 10')
  t.equal((await get('/leased')).headers['ratelimit-remaining'], '87')
})

t.test("plans: a policy's limit picks the client's capacity and rate per request, false lets it through", async (t) => {
  const { limit } = limiter(t)
  const plans: Record<string, { capacity: number, refillPerSecond: number }> = { pro: { capacity: 50, refillPerSecond: 5 }, basic: { capacity: 2, refillPerSecond: 0.01 }, broken: { capacity: -1, refillPerSecond: 1 } }
  const app = new Hono<RateLimitEnv>()
  errors(app)
  app.get('/api', limit({ ...byClient, limit: (c) => plans[c.req.header('x-plan') ?? ''] ?? false }), ok)
  const get = await listenHono(t, app)
  const pro = await get('/api', { 'x-client': 'p', 'x-plan': 'pro' })
  t.same([pro.headers['ratelimit-limit'], pro.headers['ratelimit-policy']], ['50', '50;w=10'], "the headers of the client's own plan")
  const basic: number[] = []
  for (let i = 0; i < 3; i++) basic.push((await get('/api', { 'x-client': 'b', 'x-plan': 'basic' })).status)
  t.same(basic, [200, 200, 429])
  const free = await get('/api', { 'x-client': 'b', 'x-plan': 'internal' })
  t.same([free.status, JSON.parse(free.body), free.headers['ratelimit-limit']], [200, { source: null }, undefined], 'false: no limit')
  const bad = await get('/api', { 'x-client': 'b', 'x-plan': 'broken' })
  t.match([bad.status, JSON.parse(bad.body)], [500, { code: 'TOLLGATE_BAD_INPUT' }], 'a bad plan is a 500 TOLLGATE_BAD_INPUT')
})

t.test('charging by outcome: settled once the response is finished; successes refunded, failures count', async (t) => {
  const logger = memoryLogger()
  const { limit } = limiter(t, { logger })
  const policy = { bucket: 'login', capacity: 3, refillPerSecond: 0.01 }
  const app = new Hono<RateLimitEnv>()
  app.post('/login', limit({ ...policy, ...byClient, settle: (c) => c.req.header('x-actual') !== undefined ? Number(c.req.header('x-actual')) : c.res.status === 401 ? 1 : 0 }), (c) =>
    c.json({ source: c.get('rateLimit')?.source ?? null }, c.req.header('x-password') === 'right' ? 200 : 401))
  const post = await listenHono(t, app)
  async function left (remaining: number): Promise<void> {
    for (let i = 0; (await limit.peek('eve', policy)).remaining !== remaining; i++) {
      if (i > 500) throw new Error(`no settlement to ${remaining} tokens after 5 s`)
      await sleep(10)
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
    await sleep(10)
  }
  t.match(logger.lines[0], /settle failed; the reservation stands/)
  t.equal((await limit.peek('eve', policy)).remaining, 2, 'a bad settle leaves the reservation')
  // Off the Node server, the settlement follows the handler's response.
  await limit.reset('eve', 'login')
  t.equal((await app.request('/login', { method: 'POST', headers: { 'x-client': 'eve' } })).status, 401)
  await left(2)
  t.pass('app.request(): settled at the cost of a 401')
  // Off the Node server, a request aborted before its decision arrives is
  // dropped (499) and its reservation settled at once, as a gone client's.
  await limit.reset('eve', 'login')
  const aborted = new AbortController()
  aborted.abort()
  t.equal((await app.request('/login', { method: 'POST', headers: { 'x-client': 'eve', 'x-actual': '0' }, signal: aborted.signal })).status, 499)
  await left(3)
  t.pass('app.request() aborted: dropped, its reservation settled (refunded at 0)')
})

t.test('shadow mode: a policy decided and spent as usual that never refuses nor shows in the headers', async (t) => {
  const { limit } = limiter(t)
  const app = new Hono<RateLimitEnv>()
  const seen: Array<boolean | undefined> = []
  app.get('/trial', limit({ ...byClient, capacity: 2, refillPerSecond: 0.01, shadow: true }), (c) => {
    seen.push(c.get('rateLimit')?.shadow)
    return c.json({ allowed: c.get('rateLimit')?.allowed })
  })
  app.get('/mixed', limit([{ ...byClient, capacity: 100, refillPerSecond: 10 }, { ...byClient, bucket: 'tight', capacity: 1, refillPerSecond: 0.01, shadow: true }]), ok)
  const get = await listenHono(t, app)
  const trial: Answer[] = []
  for (let i = 0; i < 4; i++) trial.push(await get('/trial', { 'x-client': 's' }))
  t.same(trial.map((a) => a.status), [200, 200, 200, 200], 'never refuses')
  t.same(seen, [undefined, undefined, true, true], "would-be denials flagged on c.get('rateLimit')")
  t.equal(trial[0]?.headers['ratelimit-limit'], undefined, 'a shadow-only route sends no headers')
  const mixed: Answer[] = []
  for (let i = 0; i < 3; i++) mixed.push(await get('/mixed', { 'x-client': 's' }))
  t.same(mixed.map((a) => a.status), [200, 200, 200])
  t.same([mixed[2]?.headers['ratelimit-limit'], mixed[2]?.headers['ratelimit-policy']], ['100', '100;w=10'], 'only the enforced policy shows')
})

t.test('lockouts: repeated denials block the client for forMs; other clients pass', async (t) => {
  const { limit } = limiter(t, { handler: (c, err) => c.json({ locked: err.decision.locked ?? false, retryAfter: err.retryAfter }, err.status) })
  const app = new Hono<RateLimitEnv>()
  app.post('/login', limit({ ...byClient, bucket: 'login', capacity: 1, refillPerSecond: 0.01, lockout: { after: 2, withinMs: 60_000, forMs: 600_000 } }), ok)
  const get = await listenHono(t, app)
  const got: string[] = []
  for (let i = 0; i < 4; i++) {
    const a = await get('/login', { 'x-client': 'mallory' }, 'POST')
    got.push(a.status === 200 ? '200' : `${a.status} ${a.body}`)
  }
  t.same(got, ['200', '429 {"locked":false,"retryAfter":100}', '429 {"locked":true,"retryAfter":600}', '429 {"locked":true,"retryAfter":600}'], 'the second denial starts a block of 600 s')
  t.equal((await get('/login', { 'x-client': 'alice' }, 'POST')).status, 200, 'another client is not blocked')
})

t.test('waiting: a request waits for its reserved token instead of a 429', async (t) => {
  // 20 tokens a second: the second request waits about 50 ms; allowed to take 1 s on a loaded machine.
  const { limit } = limiter(t, { timeout: 1000 })
  const app = new Hono<RateLimitEnv>()
  app.get('/partner', limit({ key: () => 'fleet', capacity: 1, refillPerSecond: 20, maxWaitMs: 1000 }), (c) => c.json({ waitedMs: c.get('rateLimit')?.waitedMs ?? 0 }))
  const get = await listenHono(t, app)
  t.equal((await get('/partner')).status, 200)
  const started = performance.now()
  const next = await get('/partner')
  const ms = performance.now() - started
  t.equal(next.status, 200, 'allowed after the wait')
  t.ok((JSON.parse(next.body) as { waitedMs: number }).waitedMs > 0, 'and it says it waited')
  t.ok(ms >= 30 && ms < 1000, `held ${ms.toFixed(0)} ms for a token 50 ms away`)
})

t.test('after limit.close(), a Response the handler built says Connection: close too', async (t) => {
  const limit = rateLimit({ prefix: uniquePrefix(), capacity: 5, refillPerSecond: 1, failureMode: 'open', logger: memoryLogger() })
  const app = new Hono<RateLimitEnv>()
  app.get('/raw', limit(), () => new Response('built by the handler'))
  await limit.close()
  const res = await app.request('/raw')
  t.same([res.status, res.headers.get('connection'), res.headers.get('ratelimit-remaining')], [200, 'close', '4'])
})

t.test('the programmatic API: reserve and settle over the options', async (t) => {
  const { limit } = limiter(t, { capacity: 5, refillPerSecond: 0.01, timeout: 1000 })
  const reservation = await limit.reserve('dave', { bucket: 'exports' }, 4)
  t.match(reservation.decision, { allowed: true, remaining: 1, source: 'store' })
  await limit.settle(reservation, 1)
  t.match(await limit.peek('dave', { bucket: 'exports' }), { remaining: 4 }, 'charged 1 of the 4 reserved')
})

t.test("options are checked like the other adapters': coded TypeErrors naming the option", async (t) => {
  const base = { capacity: 5, refillPerSecond: 1, failureMode: 'open' as const, logger: memoryLogger() }
  const cases: Array<[string, () => unknown, RegExp]> = [
    ['not an object', () => rateLimit('x' as never), /`options` must be an object, got "x"/],
    ['no failureMode', () => rateLimit({ capacity: 5 } as never), /`failureMode` must be one of 'open', 'closed', 'local'/],
    ['an option of hono-rate-limiter', () => rateLimit({ ...base, windowMs: 60_000 } as never), /unknown option `windowMs`.*refillPerSecond/],
    ["hono-rate-limiter's keyGenerator", () => rateLimit({ ...base, keyGenerator: () => 'x' } as never), /unknown option `keyGenerator`.*`key`/],
    ["express-rate-limit's skipFailedRequests, answered for Hono", () => rateLimit({ ...base, skipFailedRequests: true } as never), /`settle`: \(c\) => c\.res\.status >= 400 \? 0 : 1/],
    ["express-rate-limit's message, answered for Hono", () => rateLimit({ ...base, message: 'slow down' } as never), /unknown option `message`.*`handler`, e\.g\. \(c\) => c\.json\(\{ message: '\.\.\.' \}, 429\)/],
    ["express-rate-limit's requestPropertyName, answered for Hono", () => rateLimit({ ...base, requestPropertyName: 'limit' } as never), /unknown option `requestPropertyName`.*c\.get\('rateLimit'\)/],
    ["Fastify's hook", () => rateLimit({ ...base, hook: 'preHandler' } as never), /unknown option `hook`/],
    ['a handler that is no function', () => rateLimit({ ...base, handler: 'x' } as never), /`handler` must be a function/],
    ['a logger without methods', () => rateLimit({ ...base, logger: {} } as never), /`logger` must be a logger with warn, info and error methods/],
    ['cost above capacity', () => rateLimit({ ...base, cost: 6 }), /`cost` must be at most capacity \(5\)/],
    ['a bad warnings', () => rateLimit({ ...base, warnings: true } as never), /`warnings` must be false or an object/],
    ['trustProxy: a bad address', () => rateLimit({ ...base, trustProxy: '10.0.0.300' }), /`trustProxy` must be false, true, a hop count .*invalid IP address: 10\.0\.0\.300/],
    ['trustProxy: a bad subnet', () => rateLimit({ ...base, trustProxy: ['10.0.0.0/99'] }), /`trustProxy` must be .*invalid range on address: 10\.0\.0\.0\/99/],
    ['trustProxy: a negative hop count', () => rateLimit({ ...base, trustProxy: -1 }), /`trustProxy` must be false, true, a hop count \(an integer >= 0\).*got -1$/],
    ['trustProxy: a fraction', () => rateLimit({ ...base, trustProxy: 1.5 }), /`trustProxy` must be .*got 1\.5$/],
    ['trustProxy: an empty string', () => rateLimit({ ...base, trustProxy: '' }), /`trustProxy` must be .*got ""$/],
    ['trustProxy: an empty array', () => rateLimit({ ...base, trustProxy: [] }), /`trustProxy` must be .*got an array$/],
    ['trustProxy: an object', () => rateLimit({ ...base, trustProxy: {} as never }), /`trustProxy` must be .*got \{\}$/]
  ]
  for (const [name, fn, message] of cases) t.throws(fn, { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message }, name)

  const limit = rateLimit(base)
  t.teardown(() => limit.close())
  const atLimit: Array<[string, () => unknown, RegExp]> = [
    ['a string', () => limit('x' as never), /`limit\(\)` must be a policy, a non-empty array of policies, or nothing \(to limit the whole app per client, pass the limiter itself: `app.use\(limit\)`\), got "x"/],
    ['null', () => limit(null as never), /`limit\(\)` must be a policy, .*got null$/],
    ['a context-like object', () => limit(new Hono() as never), /`limit\(\)` must be a policy/],
    ['an empty array', () => limit([]), /`limit\(\): rateLimit` must be a policy, a non-empty array/],
    ['a typo', () => limit({ capacty: 5 } as never), /unknown option `limit\(\): capacty`; did you mean `limit\(\): capacity`/],
    ['a bad value in an array', () => limit([{ capacity: 5 }, { refillPerSecond: -1 }]), /`limit\(\)\[1\]\.refillPerSecond` must be a finite number > 0, got -1/]
  ]
  for (const [name, fn, message] of atLimit) t.throws(fn, { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message }, name)
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
  t.match(warned, [[/no `redis` given, limits are kept in this process only/]])
  const app = new Hono<RateLimitEnv>()
  app.get('/x', limit(), ok)
  const get = await listenHono(t, app)
  t.same([(await get('/x')).status, (await get('/x')).status, (await get('/x')).status], [200, 200, 429])
})

t.test('past 1000 route names, one limit() asks for a bucket', async (t) => {
  const { limit } = limiter(t, { capacity: 10, refillPerSecond: 1 })
  const app = new Hono<RateLimitEnv>()
  errors(app)
  const shared = limit()
  for (let i = 0; i <= 1000; i++) app.get(`/r${i}`, shared, ok)
  const get = await listenHono(t, app)
  for (let i = 0; i < 1000; i++) await get(`/r${i}`)
  const a = await get('/r1000')
  t.match([a.status, JSON.parse(a.body)], [500, { code: 'TOLLGATE_BAD_INPUT', message: /serves 1000 routes and methods already: give it a `bucket`/ }])
})
