// What only tollgate/nest has, on both of Nest's platforms (Express and
// Fastify), against a real Redis; what it shares with the other adapters
// runs in test/adapter-*.test.ts over the rows nest-express and
// nest-fastify. Here: the decorators' precedence (a handler's @RateLimit
// replaces its controller's; @SkipRateLimit on a controller, then a
// handler's own), `global` true and false, forRootAsync with an imported
// provider, bucket names under a global prefix and URI versioning and of
// an @All() handler, an exception filter that reshapes the 429,
// TollgateService injected into a controller, the guard in a context that
// is no HTTP request, the proxy warning, a `key` that throws, and options
// that fail the start-up. Bucket names are read from the draft-10 headers,
// which quote them.

import t, { type Test } from 'tap'
import { All, Catch, Controller, Get, HttpException, Inject, Module, Post, VersioningType, type ArgumentsHost, type DynamicModule, type ExceptionFilter, type INestApplication } from '@nestjs/common'
import { ExecutionContextHost } from '@nestjs/core/internal'
import { RateLimit, RateLimitException, SkipRateLimit, TOLLGATE_OPTIONS, TollgateModule, TollgateService, type NestOptions } from '../lib/nest.js'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { httpGet, memoryLogger, type Answer } from './helpers/express.js'
import { PLATFORMS, controller, nestApp, onMethod, type NestRoute, type Platform } from './helpers/nest.js'

type Get = (url: string, headers?: Record<string, string>, method?: string) => Promise<Answer>

const source: NestRoute['answer'] = (req) => JSON.stringify({ bucket: req.rateLimit === undefined ? null : req.rateLimit.limit })

async function options (t: Test, more: Partial<NestOptions> = {}): Promise<NestOptions> {
  return { redis: await sharedRedis(t), prefix: uniquePrefix(), capacity: 100, refillPerSecond: 1, failureMode: 'open', timeout: 1000, headers: 'draft-10', logger: memoryLogger(), ...more }
}

/** Listens; closed at the end of `t`. `setup` runs before the app listens. */
async function serve (t: Test, app: INestApplication, setup?: (app: INestApplication) => void): Promise<Get> {
  setup?.(app)
  t.teardown(() => app.close())
  await app.listen(0, '127.0.0.1')
  const { port } = app.getHttpServer().address() as { port: number }
  return httpGet({ host: '127.0.0.1', port })
}

/** The bucket names a draft-10 RateLimit-Policy header lists. */
function buckets (a: Answer): string[] {
  return [...String(a.headers['ratelimit-policy'] ?? '').matchAll(/"([^"]+)"/g)].map((m) => m[1] as string)
}

async function precedence (t: Test, platform: Platform): Promise<void> {
  const items = controller('items', [
    // Before ':id', which Express would match first.
    { path: 'health', policy: false, answer: source },
    { path: ':id', answer: source },
    { path: '', method: 'post', policy: { capacity: 5, refillPerSecond: 0.1 }, answer: source }
  ], { capacity: 20, refillPerSecond: 2, headers: 'legacy' })
  const get = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t)), [items]))
  const find = await get('/items/7')
  t.equal(find.headers['x-ratelimit-limit'], '20', "a handler without its own: the controller's limit, merged over the module's")
  t.same(JSON.parse(find.body), { bucket: 20 }, 'the decision is on the request @Req() gives')
  const create = await get('/items', {}, 'POST')
  t.same(buckets(create), ['POST /items'], "`@Controller('items') @Post()` is POST /items")
  t.equal(create.headers['x-ratelimit-limit'], undefined, "the handler's own replaces the controller's, not merged with it (no 'legacy' headers)")
  t.match(create.headers.ratelimit, /r=4/)
  const health = await get('/items/health')
  t.same([health.status, JSON.parse(health.body), health.headers['x-ratelimit-limit']], [200, { bucket: null }, undefined], '@SkipRateLimit() on a handler opts it out')
}

async function skipped (t: Test, platform: Platform): Promise<void> {
  const open = controller('open', [
    { path: 'free', answer: source },
    { path: 'paid', policy: { capacity: 3, refillPerSecond: 0.01 }, answer: source }
  ], false)
  const get = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t)), [open]))
  const free = await get('/open/free')
  t.same([JSON.parse(free.body), free.headers.ratelimit], [{ bucket: null }, undefined], 'a skipped controller\'s handler is not limited')
  const paid = await get('/open/paid')
  t.same([JSON.parse(paid.body), buckets(paid)], [{ bucket: 3 }, ['GET /open/paid']], 'its handler with its own @RateLimit is')
}

async function globalOption (t: Test, platform: Platform): Promise<void> {
  const routes: NestRoute[] = [{ path: 'plain', answer: source }, { path: 'limited', policy: { capacity: 4 }, answer: source }]
  const onlyDecorated = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t, { global: false })), [controller('', routes)]))
  t.same(JSON.parse((await onlyDecorated('/plain')).body), { bucket: null }, 'global: false: an undecorated route is not limited')
  t.same(JSON.parse((await onlyDecorated('/limited')).body), { bucket: 4 }, 'a decorated one is')
  const every = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t)), [controller('', routes)]))
  const plain = await every('/plain')
  t.same([JSON.parse(plain.body), buckets(plain)], [{ bucket: 100 }, ['GET /plain']], "global: true (the default): every route, with the module's policy, a bucket per route")
}

async function everyMethod (t: Test, platform: Platform): Promise<void> {
  class Any { any (): string { return '{}' } }
  onMethod(Any.prototype, 'any', All('any'), RateLimit({ capacity: 2, refillPerSecond: 0.01 }))
  Controller()(Any)
  const get = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t)), [Any]))
  const answers = [await get('/any', {}, 'PUT'), await get('/any', {}, 'DELETE'), await get('/any', {}, 'POST')]
  t.same(answers.map((a) => [a.status, buckets(a)]), [[200, ['ALL /any']], [200, ['ALL /any']], [429, ['ALL /any']]], '@All(): one bucket, ALL /any, whatever the method')
}

async function prefixAndVersion (t: Test, platform: Platform): Promise<void> {
  const items = controller('items', [{ path: ':id', answer: source }, { path: '', method: 'post', answer: source }])
  Controller({ path: 'items', version: '2' })(items)
  const get = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t)), [items]), (app) => {
    app.setGlobalPrefix('api')
    app.enableVersioning({ type: VersioningType.URI })
  })
  t.same(buckets(await get('/api/v2/items/1')), ['GET /api/v2/items/:id'], 'prefix, version, controller and handler paths, as Nest joined them')
  t.same(buckets(await get('/api/v2/items/2?x=1')), ['GET /api/v2/items/:id'], 'never the URL')
  t.same(buckets(await get('/api/v2/items', {}, 'POST')), ['POST /api/v2/items'])
}

/** A filter of every HttpException: the 429 reshaped, its headers kept. */
class Reshape implements ExceptionFilter {
  catch (exception: HttpException, host: ArgumentsHost): void {
    const res = host.switchToHttp().getResponse<{ status (code: number): { send (body: string): void } }>()
    const retry = exception instanceof RateLimitException ? exception.retryAfter : null
    res.status(exception.getStatus()).send(JSON.stringify({ reshaped: true, retry, code: exception instanceof RateLimitException ? exception.code : null }))
  }
}
Catch(HttpException)(Reshape)

async function filter (t: Test, platform: Platform): Promise<void> {
  const routes = controller('', [{ path: 'pay', policy: { capacity: 1, refillPerSecond: 0.01 }, answer: source }])
  const get = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t)), [routes], [new Reshape()]))
  t.equal((await get('/pay')).status, 200)
  const denied = await get('/pay')
  t.same([denied.status, JSON.parse(denied.body)], [429, { reshaped: true, retry: 100, code: 'TOLLGATE_RATE_LIMITED' }], "the app's filter answers the 429")
  t.same([denied.headers['retry-after'], buckets(denied)], ['100', ['GET /pay']], 'with Retry-After and the rate-limit headers already set')
}

async function asyncAndService (t: Test, platform: Platform): Promise<void> {
  const given = await options(t, { capacity: 2, refillPerSecond: 0.01 })
  class Config {}
  Module({ providers: [{ provide: 'CONFIG', useValue: given }], exports: ['CONFIG'] })(Config)
  class Login {
    readonly tollgate: TollgateService
    constructor (tollgate: TollgateService) { this.tollgate = tollgate }
    async login (): Promise<string> {
      const d = await this.tollgate.consume('alice', { bucket: 'login' })
      return this.answer(d.allowed, d.remaining)
    }

    /** No route: the start-up compiles route handlers only. */
    answer (allowed: boolean, remaining: number): string {
      return JSON.stringify({ allowed, remaining })
    }
  }
  onMethod(Login.prototype, 'login', Post('login'), SkipRateLimit())
  Inject(TollgateService)(Login, undefined, 0)
  Controller()(Login)
  const tollgate: DynamicModule = TollgateModule.forRootAsync({ imports: [Config], inject: ['CONFIG'], useFactory: (config: NestOptions) => config })
  const app = await nestApp(platform, tollgate, [Login])
  const get = await serve(t, app)
  t.same(JSON.parse((await get('/login', {}, 'POST')).body), { allowed: true, remaining: 1 }, 'forRootAsync: the options from an imported provider; the service in a controller')
  t.same(JSON.parse((await get('/login', {}, 'POST')).body), { allowed: true, remaining: 0 })
  t.equal(app.get(TOLLGATE_OPTIONS), given, 'the options are a provider too')
  // Nest's own context of a microservice message, as its RPC router makes one.
  const message = new ExecutionContextHost([{ pattern: 'sum' }, {}], Login, Login.prototype.login)
  message.setType('rpc')
  t.equal(await app.get(TollgateService).canActivate(message), true, 'the guard passes what is no HTTP request')
}

async function proxyWarning (t: Test, platform: Platform): Promise<void> {
  const logger = memoryLogger()
  const get = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t, { logger })), [controller('', [{ path: 'x', answer: source }])]))
  await get('/x')
  await get('/x', { 'x-forwarded-for': '203.0.113.9' })
  await get('/x', { 'x-forwarded-for': '203.0.113.9' })
  t.match(logger.lines, [/^tollgate: a request carries X-Forwarded-For but the platform trusts no proxy/], 'told once')
}

async function badKey (t: Test, platform: Platform): Promise<void> {
  const logger = memoryLogger()
  const routes = controller('', [{ path: 'x', policy: { key: () => { throw new Error('no user') } }, answer: source }])
  const get = await serve(t, await nestApp(platform, TollgateModule.forRoot(await options(t, { logger })), [routes]))
  const a = await get('/x')
  t.same([a.status, JSON.parse(a.body).statusCode], [500, 500], "a key that throws: a 500 through Nest's exception handling")
  t.equal((await get('/x')).status, 500)
  t.match(logger.lines, [/GET \/x/], 'logged once, naming the route')
}

async function badStart (t: Test, platform: Platform): Promise<void> {
  const routes = (policy?: NestRoute['policy']): Array<new () => object> => [controller('', [{ path: 'x', policy, answer: source }, { path: 'y', answer: source }])]
  await t.rejects(nestApp(platform, TollgateModule.forRoot({ ...await options(t), capacity: '10' as never }), routes()), { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message: /capacity/ }, 'a bad option: the app is not created')
  await t.rejects(nestApp(platform, TollgateModule.forRoot({ ...await options(t), global: 'yes' as never }), routes()), { code: 'TOLLGATE_INVALID_OPTION', message: /global/ })
  await t.rejects(nestApp(platform, TollgateModule.forRoot({ ...await options(t), ttl: 60000 } as never), routes()), { message: /@nestjs\/throttler.*capacity.*refillPerSecond/ }, "@nestjs/throttler's ttl: what replaces it")
  const bad = await nestApp(platform, TollgateModule.forRoot(await options(t)), routes({ capacity: -1 }))
  t.teardown(() => bad.close())
  await t.rejects(bad.init(), { code: 'TOLLGATE_INVALID_OPTION', message: /`@RateLimit\(\): capacity`/ }, "a handler's bad policy fails the start-up, named as the app wrote it")
  const twice = await nestApp(platform, TollgateModule.forRoot(await options(t)), [controller('', [
    { path: 'a', policy: { bucket: 'shared', capacity: 5 }, answer: source },
    { path: 'b', policy: { bucket: 'shared', capacity: 6 }, answer: source }
  ])])
  t.teardown(() => twice.close())
  await t.rejects(twice.init(), { code: 'TOLLGATE_INVALID_OPTION', message: /`@RateLimit\(\) of .*: bucket`.*shared.*capacity 5.*6/ }, 'one bucket, two policies: the start-up fails')
  const { capacity: _c, refillPerSecond: _r, ...noPolicy } = await options(t)
  const incomplete = await nestApp(platform, TollgateModule.forRoot(noPolicy), routes({ capacity: 5, refillPerSecond: 1 }))
  t.teardown(() => incomplete.close())
  await t.rejects(incomplete.init(), { code: 'TOLLGATE_INVALID_OPTION', message: /capacity/ }, 'global: true, options without a policy, an undecorated route: the start-up fails')
}

t.test('@RateLimit and @SkipRateLimit take a policy, an array or false, and nothing else', async (t) => {
  for (const value of ['x', [], null, 10]) t.throws(() => RateLimit(value as never), { code: 'TOLLGATE_INVALID_OPTION', message: /@RateLimit\(\)/ }, `refused: ${JSON.stringify(value)}`)
  for (const value of [{}, [{ capacity: 1 }], false]) t.doesNotThrow(() => RateLimit(value as never))
  t.equal(Reflect.getMetadata('tollgate:rateLimit', (() => { class C {}; SkipRateLimit()(C); return C })()), false, '@SkipRateLimit() is @RateLimit(false)')
})

for (const platform of PLATFORMS) {
  t.test(`nest-${platform}`, async (t) => {
    t.test("a handler's @RateLimit replaces its controller's; @SkipRateLimit on a handler", (t) => precedence(t, platform))
    t.test('@SkipRateLimit on a controller, then a handler\'s own @RateLimit', (t) => skipped(t, platform))
    t.test('global: true limits every route, global: false only decorated ones', (t) => globalOption(t, platform))
    t.test('buckets under a global prefix and URI versioning', (t) => prefixAndVersion(t, platform))
    t.test('@All(): one bucket for every method', (t) => everyMethod(t, platform))
    t.test("an exception filter reshapes the 429; tollgate's headers stay", (t) => filter(t, platform))
    t.test('forRootAsync, TollgateService injected, and the guard outside HTTP', (t) => asyncAndService(t, platform))
    t.test('a forwarding header while the platform trusts no proxy: one warning', (t) => proxyWarning(t, platform))
    t.test('a key function that throws: a 500, logged once', (t) => badKey(t, platform))
    t.test('bad options fail the start-up', (t) => badStart(t, platform))
  })
}
