// The example API of examples/app.js, on NestJS (the Express platform) with
// tollgate/nest. Run it with `npm run example:nest`, or with a shared Redis:
// REDIS_URL=redis://127.0.0.1:6379 npm run example:nest
//
// Plain JavaScript: the decorators are applied as functions, as a
// TypeScript build with decorators would apply them (`@Get(':id')` is
// `Get(':id')(proto, 'find', descriptor)`), and the service is injected
// with an explicit `Inject`. The import below is the package's own entry
// ('tollgate/nest' resolves through package.json "exports" to dist/), so
// the example always runs this checkout.
import 'reflect-metadata'
import { Body, Controller, Get, HttpCode, HttpException, Inject, Module, Param, Post, Query, Req } from '@nestjs/common'
import { NestFactory } from '@nestjs/core'
import { Redis } from 'ioredis'
import { RateLimit, SkipRateLimit, TollgateModule, TollgateService } from 'tollgate/nest'

const port = Number(process.env.PORT ?? 3000)
const hostname = '127.0.0.1'

const redis = process.env.REDIS_URL === undefined
  ? undefined
  : new Redis(process.env.REDIS_URL, {
    // Reconnect forever, backing off up to 2 s; fail the app's own commands
    // fast instead of queueing them while Redis is away (tollgate sends
    // nothing to a client that is not connected: its limits then follow
    // their failure modes).
    retryStrategy: (attempt) => Math.min(attempt * 100, 2000),
    connectTimeout: 2000,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1
  })
// Without a listener, ioredis prints every failed reconnect attempt.
redis?.on('error', () => {})

/** Applies method decorators to `Class.prototype[name]`, and parameter decorators by position. */
function route (Class, name, decorators, params = []) {
  const descriptor = Object.getOwnPropertyDescriptor(Class.prototype, name)
  for (const decorate of decorators) decorate(Class.prototype, name, descriptor)
  params.forEach((decorate, i) => decorate(Class.prototype, name, i))
}

class ItemsController {
  health () { return { ok: true } }
  find (id) { return { id, name: `item ${id}` } }
  search (q) { return { query: q ?? '', results: [] } }
  pay () { return { paid: true } }
}
// Not limited: load balancers and orchestrators must always reach it.
route(ItemsController, 'health', [Get('health'), SkipRateLimit()])
// The module's defaults, in a bucket named by the route: 'GET /items/:id'.
route(ItemsController, 'find', [Get('items/:id')], [Param('id')])
// A limit of its own. failureMode 'open': search is a cheap read and the
// limit is about fairness, so a limiter outage must not become a search
// outage. While Redis fails, requests pass and carry no RateLimit headers.
route(ItemsController, 'search', [Get('search'), RateLimit({ capacity: 20, refillPerSecond: 2, failureMode: 'open' })], [Query('q')])
// Two policies, checked together in one script call (all or nothing): a
// burst of 3, then one every 20 s, and at most 100 an hour. failureMode
// 'closed': when the limiter cannot decide, the answer is 503 with
// Retry-After rather than a payment that might overspend.
route(ItemsController, 'pay', [Post('pay'), RateLimit([
  { capacity: 3, refillPerSecond: 0.05, failureMode: 'closed' },
  { capacity: 100, refillPerSecond: 100 / 3600, failureMode: 'closed' }
])])
Controller()(ItemsController)

// Login attempts per user name, on top of the route's per-IP limit: an
// attacker spreading guesses over many IPs still gets 5 tries per account,
// then one a minute. failureMode 'closed': while the limiter cannot count,
// nobody may guess passwords. The body is parsed before guards run.
class LoginController {
  constructor (tollgate) { this.tollgate = tollgate }
  async login (req, body) {
    const { username, password } = body ?? {}
    if (typeof username !== 'string' || typeof password !== 'string') throw new HttpException({ error: 'username and password are required' }, 400)
    const attempt = await this.tollgate.consume(username, { bucket: 'login', capacity: 5, refillPerSecond: 1 / 60, failureMode: 'closed' })
    if (!attempt.allowed) throw new HttpException({ error: 'too many attempts', retryAfterMs: attempt.retryAfterMs }, 429)
    if (password !== 'correct horse battery staple' || username !== 'alice') {
      throw new HttpException({ error: 'wrong user name or password', attemptsLeft: attempt.remaining }, 401)
    }
    // A successful login forgives the failed attempts before it.
    await this.tollgate.reset(username, 'login').catch(() => {})
    return { welcome: username, remaining: req.rateLimit?.remaining }
  }
}
route(LoginController, 'login', [Post('login'), HttpCode(200), RateLimit({ capacity: 20, refillPerSecond: 1 })], [Req(), Body()])
Inject(TollgateService)(LoginController, undefined, 0)
Controller()(LoginController)

// The defaults every route merges over: a bucket of 5 tokens refilled at 1
// per second, per client IP (no proxy is trusted; behind one, set Express's
// 'trust proxy' on the app). Small numbers, so a few curl requests show a
// 429. failureMode 'local': if Redis is down or slower than the 10 ms
// deadline, each app server falls back to its own, smaller in-process
// bucket, sized as if a fleet of about 2 split the real limit. `global`
// (the default): every route without its own @RateLimit gets these.
class AppModule {}
Module({
  imports: [TollgateModule.forRoot({ redis, capacity: 5, refillPerSecond: 1, failureMode: 'local', local: { capacity: 2, refillPerSecond: 0.5 } })],
  controllers: [ItemsController, LoginController]
})(AppModule)

const app = await NestFactory.create(AppModule, { logger: ['error', 'warn'] })
// Graceful shutdown: app.close() ends the limiter's waits (answered at
// once), finishes the requests in flight and closes the server; then the
// Redis client is closed (tollgate never closes a client it was given).
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, () => {
    void app.close().then(async () => {
      if (redis !== undefined) await redis.quit().catch(() => redis.disconnect())
    })
  })
}
await app.listen(port, hostname)
console.log(`try: curl -i http://${hostname}:${port}/items/1 (store: ${redis === undefined ? 'in-process' : 'Redis'})`)
