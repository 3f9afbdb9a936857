// tollgate/express bucket names (docs/guides/express.md, "How it maps onto
// the plugin"): from the
// declared mount path and route pattern, never from the URL's spelling of
// them, on Express 5 and Express 4 (installed as `express4`), on a real
// Redis. Attacked with case variants, percent-encoded variants, trailing
// and doubled slashes, parameterised mount paths, nested routers, sub-apps,
// path arrays, a router mounted twice and regexp paths: 1000+ distinct
// spellings make no 500 and no new bucket, and both majors name every
// route alike (lib/adapters/express/routes.ts).

import express5, { type ErrorRequestHandler, type RequestHandler } from 'express'
import express4 from 'express4'
import t, { type Test } from 'tap'
import { RoutePatterns } from '../lib/adapters/express/routes.js'
import { MAX_NAMES, rateLimit, type ExpressOptions, type RateLimit } from '../lib/express.js'
import { keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { listen, memoryLogger } from './helpers/express.js'

const ok: RequestHandler = (req, res) => { res.json({ bucket: req.rateLimit?.bucket ?? null }) }
const errors: ErrorRequestHandler = (err, _req, res, _next) => { res.status(err.status ?? 500).json({ code: err.code, message: err.message }) }

/** `word` with the letters whose bit is set in `mask` upper-cased. */
function spelled (word: string, mask: number): string {
  return [...word].map((c, i) => (mask >> i) & 1 ? c.toUpperCase() : c).join('')
}

/** How many of `paths` were answered with each status. */
async function statuses (get: (url: string) => Promise<{ status: number }>, paths: readonly string[]): Promise<Record<number, number>> {
  const count: Record<number, number> = {}
  for (const path of paths) {
    const { status } = await get(path)
    count[status] = (count[status] ?? 0) + 1
  }
  return count
}

for (const [major, express] of [['Express 5', express5], ['Express 4', express4]] as const) {
  t.test(major, async (t) => {
    const redis = await sharedRedis(t)

    function limiter (t: Test, options: Partial<ExpressOptions> = {}): { limit: RateLimit, prefix: string, logger: ReturnType<typeof memoryLogger> } {
      const prefix = uniquePrefix()
      const logger = memoryLogger()
      // These tests count buckets in Redis: a deadline of 1 s, so that no decision fails under load, and a slow refill, so
      // that a key lives (its TTL is the time its bucket takes to fill again) until it is counted.
      const limit = rateLimit({ redis, prefix, capacity: 10_000, refillPerSecond: 0.001, failureMode: 'closed', timeout: 1000, logger, ...options })
      t.teardown(() => limit.close())
      return { limit, prefix, logger }
    }
    const names = async (prefix: string): Promise<string[]> => (await keysUnder(redis, prefix)).map((k) => k.slice(k.indexOf('}:') + 2))

    t.test('case variants of a mount path are one bucket: 2 of 16 pass a capacity of 2', async (t) => {
      const { limit, prefix } = limiter(t, { capacity: 2, refillPerSecond: 0.01 })
      const app = express()
      const router = express.Router()
      router.get('/users/:id', limit(), ok)
      app.use('/api', router)
      const get = await listen(t, app)
      const paths: string[] = []
      for (let mask = 0; mask < 8; mask++) paths.push(`/${spelled('api', mask)}/users/1`, `/${spelled('api', mask)}/users/2`)
      t.same(await statuses(get, paths), { 200: 2, 429: 14 })
      t.same(await names(prefix), ['GET /api/users/:id'])
    })

    t.test('1000+ spellings of one route: no 500, no new bucket', async (t) => {
      const { limit, prefix, logger } = limiter(t)
      const app = express()
      const router = express.Router()
      router.get('/users/:id', limit(), ok)
      app.use('/api', router)
      app.use(errors)
      const get = await listen(t, app)
      const paths: string[] = []
      for (let i = 0; i < 1040; i++) {
        const mount = spelled('api', i % 8)
        const slash = ['', '/'][(i >> 3) % 2] as string
        const id = (i >> 4) % 2 === 0 ? String(i) : `%3${i % 10}x${i}`
        paths.push(`/${mount}/users/${id}${slash}`)
      }
      t.equal(new Set(paths).size, 1040, '1040 distinct URLs')
      t.same(await statuses(get, paths), { 200: 1040 })
      t.same(await statuses(get, ['/%61pi/users/1', '/api/%75sers/1', '/ap%69/users/1']), { 404: 3 }, 'a percent-encoded literal does not match the mount path: no limit runs')
      t.same(await names(prefix), ['GET /api/users/:id'])
      t.same(logger.lines, [])
    })

    t.test('a router mounted on a path with parameters: one bucket for every value', async (t) => {
      const { limit, prefix } = limiter(t)
      const app = express()
      const router = express.Router({ mergeParams: true })
      router.get('/repos/:repo', limit(), ok)
      app.use('/orgs/:org', router)
      app.use(errors)
      const get = await listen(t, app)
      const paths: string[] = []
      for (let i = 0; i < MAX_NAMES + 10; i++) paths.push(`/${i % 2 === 0 ? 'orgs' : 'ORGS'}/org-${i}/repos/r${i}`)
      t.same(await statuses(get, paths), { 200: MAX_NAMES + 10 }, `${MAX_NAMES + 10} org values, no 500`)
      t.same(await names(prefix), ['GET /orgs/:org/repos/:repo'])
      const a = await get('/orgs/acme/repos/x')
      t.same(JSON.parse(a.body), { bucket: 'GET /orgs/:org/repos/:repo' })
    })

    t.test('nested routers, a sub-app, a sub-app in a sub-app, a route on the root: declared paths', async (t) => {
      const { limit, prefix } = limiter(t)
      const app = express()
      const v1 = express.Router()
      const orgs = express.Router()
      orgs.get('/repos/:repo', limit(), ok)
      v1.use('/orgs/:org/', orgs)
      app.use('/v1', v1)
      const admin = express()
      admin.get('/users/:id', limit(), ok)
      const audit = express()
      const log = express.Router()
      log.get('/entries', limit(), ok)
      audit.use('/log', log)
      admin.use('/Audit', audit)
      app.use('/admin', admin)
      app.get('/', limit(), ok)
      app.use(errors)
      const get = await listen(t, app)
      const paths = ['/v1/orgs/a/repos/b', '/V1/ORGS/b/repos/c/', '/admin/users/1', '/ADMIN/users/2', '/admin/audit/log/entries', '/Admin/AUDIT/Log/entries/', '/']
      t.same(await statuses(get, paths), { 200: paths.length })
      t.same(await names(prefix), ['GET /', 'GET /admin/Audit/log/entries', 'GET /admin/users/:id', 'GET /v1/orgs/:org/repos/:repo'])
    })

    t.test('path arrays, a router mounted twice, regexp paths, a router as a route handler', async (t) => {
      const { limit, prefix } = limiter(t)
      const app = express()
      const listed = express.Router()
      listed.get(['/x', '/y'], limit(), ok)
      app.use(['/a', '/b'], listed)
      const twice = express.Router()
      twice.get('/z', limit(), ok)
      app.use('/one', twice)
      app.use('/two', twice)
      const versioned = express.Router()
      versioned.get('/items', limit(), ok)
      app.use(/^\/v\d+/, versioned)
      const handler = express.Router()
      handler.get('/inner', limit(), ok)
      app.get('/inner', handler)
      app.use(errors)
      const get = await listen(t, app)
      const paths = ['/a/x', '/b/y', '/A/Y', '/one/z', '/TWO/z', '/inner']
      for (let i = 0; i < 1000; i++) paths.push(`/v${i}/items`)
      t.same(await statuses(get, paths), { 200: paths.length })
      t.same(await names(prefix), ['GET /^\\/v\\d+//items', 'GET /a/x,/a/y,/b/x,/b/y', 'GET /inner', 'GET /one/z,/two/z'],
        'a route declared at several paths is one bucket named by all of them')
    })

    t.test('declared spelling: an upper-case mount path keeps its case; a trailing slash does not count', async (t) => {
      const { limit, prefix } = limiter(t)
      const app = express()
      const upper = express.Router()
      upper.get('/q', limit(), ok)
      app.use('/API/', upper)
      const dotted = express.Router()
      dotted.get('/q', limit(), ok)
      app.use('/v1.0/:file.:ext', dotted)
      const get = await listen(t, app)
      t.same(await statuses(get, ['/api/q', '/API/q', '/v1.0/a.b/q']), { 200: 3 })
      t.same(await names(prefix), ['GET /API/q', 'GET /v1.0/:file.:ext/q'])
    })

    t.test('a router the app does not hold (called from a function): named by its pattern, one warning', async (t) => {
      const { limit, prefix, logger } = limiter(t)
      const app = express()
      const hidden = express.Router()
      hidden.get('/h/:id', limit(), ok)
      app.use('/outer', (req, res, next) => { hidden(req, res, next) })
      const get = await listen(t, app)
      t.same(await statuses(get, ['/outer/h/1', '/OUTER/h/2', '/outer/h/3']), { 200: 3 })
      t.same(await names(prefix), ['GET /h/:id'])
      t.equal(logger.lines.length, 1)
      t.match(logger.lines[0], /no router of the app holds the route \/h\/:id .*give its limit a `bucket`/)
    })

    t.test('a middleware mounted in a router the app does not hold: named as the whole app, one warning', async (t) => {
      const { limit, prefix, logger } = limiter(t)
      const app = express()
      const hidden = express.Router()
      hidden.use(limit)
      hidden.get('/h', ok)
      app.use('/outer', (req, res, next) => { hidden(req, res, next) })
      const get = await listen(t, app)
      t.same(await statuses(get, ['/outer/h', '/outer/h']), { 200: 2 })
      t.same(await names(prefix), ['app'])
      t.equal(logger.lines.length, 1)
      t.match(logger.lines[0], /no router of the app holds the route \/\* .*give its limit a `bucket`/)
    })

    t.test(`the name cap is reached by declarations only: ${MAX_NAMES} routes, then a 500 asking for a bucket`, async (t) => {
      const { limit } = limiter(t)
      const app = express()
      const shared = limit()
      for (let i = 0; i <= MAX_NAMES; i++) app.get(`/r${i}`, shared, ok)
      app.use(errors)
      const get = await listen(t, app)
      const paths: string[] = []
      for (let i = 0; i < MAX_NAMES; i++) paths.push(`/r${i}`)
      t.same(await statuses(get, paths), { 200: MAX_NAMES })
      const a = await get(`/r${MAX_NAMES}`)
      t.equal(a.status, 500)
      t.match(JSON.parse(a.body), { code: 'TOLLGATE_BAD_INPUT', message: /serves 1000 routes and methods already: give it a `bucket`/ })
      t.equal((await get('/R0')).status, 200, 'names already made still work, whatever the spelling')
    })
  })
}

t.test('RoutePatterns, without requests: the paths Express 4 keeps only as regexps, and the corners of the walk', async (t) => {
  type AnyRouter = { stack: Array<{ route?: object }> }
  const routeIn = (router: unknown): object => (router as AnyRouter).stack.find((l) => l.route !== undefined)?.route as object
  const hidden: string[] = []
  const patterns = new RoutePatterns((pattern) => { hidden.push(pattern) })

  const app = express4()
  const cases: Array<[string, string]> = [['/opt/:v?', '/opt/:v?/x'], ['/files/*', '/files/*/x'], ['/f/:name.:ext?', '/f/:name.:ext?/x'], ['/a\\-b', '/a\\-b/x'], ['/:id(\\d+)', '/^(?:\\/(\\d+))\\/?(?=\\/|$)/i/x']]
  const routers = cases.map(([path]) => {
    const router = express4.Router()
    router.get('/x', ok)
    app.use(path, router)
    return router
  })
  for (const [i, [path, expected]] of cases.entries()) t.equal(patterns.of(app, routeIn(routers[i])), expected, `Express 4, mounted at ${path}`)
  const plain = express4.Router()
  plain.get('/plain', ok)
  app.use(plain)
  t.equal(patterns.of(app, routeIn(plain)), '/plain', 'Express 4, mounted without a path')

  const cyclic = express5.Router()
  cyclic.use('/again', cyclic)
  cyclic.get('/c', ok)
  const top = express5()
  top.use('/loop', cyclic)
  t.equal(patterns.of(top, routeIn(cyclic)), '/loop/c', 'a router mounted below itself is not followed again')

  const alone = express5.Router()
  alone.get('/alone', ok)
  t.equal(patterns.of(undefined, routeIn(alone)), '/alone', 'a router used without an app: its route pattern')
  t.equal(patterns.of(undefined, routeIn(alone)), '/alone', 'found once')
  t.same(hidden, ['/alone'], 'and told once')

  // A layer whose regexp reads as a path, but whose class cannot compile it back.
  const odd = express4.Router()
  odd.get('/y', ok)
  const layer = { regexp: /^\/odd\/?(?=\/|$)/i, keys: [], handle: odd, constructor: class { constructor () { throw new Error('no') } } }
  const fake = Object.assign(() => {}, { set: () => {}, _router: { stack: [layer] } })
  t.equal(patterns.of(fake, routeIn(odd)), '/^\\/odd\\/?(?=\\/|$)/i/y', 'a path that cannot be checked is named by its regexp')

  // A layer shaped like neither major's (no rawPath, no RegExp): named by what it holds.
  const strange = express5.Router()
  strange.get('/z', ok)
  const shapeless = Object.assign(() => {}, { set: () => {}, router: { stack: [{ regexp: '/strange', handle: strange }] } })
  t.equal(patterns.of(shapeless, routeIn(strange)), '/strange/z', 'a mount path held as a string where a RegExp was expected')
})
