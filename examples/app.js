// A small API limited by tollgate. Run it with `npm run example`, or with a
// shared Redis: REDIS_URL=redis://127.0.0.1:6379 npm run example
//
// The import below is the package's own entry ('tollgate' resolves through
// package.json "exports" to dist/), so the example always runs this checkout.
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import tollgate, { RateLimitedError, UnavailableError } from 'tollgate'

const port = Number(process.env.PORT ?? 3000)
const host = '127.0.0.1'

const app = Fastify({ logger: true })

const redis = process.env.REDIS_URL === undefined
  ? undefined
  : new Redis(process.env.REDIS_URL, {
    // Reconnect forever, backing off up to 2 s between attempts.
    retryStrategy: (attempt) => Math.min(attempt * 100, 2000),
    // Give up on a connection attempt after 2 s instead of hanging.
    connectTimeout: 2000,
    // The app's own commands fail fast instead of queueing while Redis is
    // away. (tollgate sends nothing to a client that is not connected; its
    // limits then follow their failure modes.)
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1
  })

if (redis === undefined) {
  app.log.warn('REDIS_URL is not set: limits are kept in this process only, so each copy of the app allows the full limit. Set REDIS_URL (e.g. redis://127.0.0.1:6379) to share them.')
} else {
  // Without a listener, ioredis prints every failed reconnect attempt.
  // Log the first error of an outage and the recovery.
  let down = false
  redis.on('error', (err) => {
    if (!down) app.log.warn({ err }, 'Redis connection error; reconnecting')
    down = true
  })
  redis.on('ready', () => {
    if (down) app.log.info('Redis connection ready')
    down = false
  })
}

// The global limit: every route not configured otherwise gets a bucket of
// 5 tokens refilled at 1 per second, per client IP and route. Small numbers,
// so a few curl requests show a 429.
//
// failureMode 'local': if Redis is down or slower than the 10 ms deadline,
// each app server falls back to its own, smaller in-process bucket. Size it
// as if the fleet were splitting the real limit (here: a fleet of about 2).
await app.register(tollgate, {
  redis,
  capacity: 5,
  refillPerSecond: 1,
  failureMode: 'local',
  local: { capacity: 2, refillPerSecond: 0.5 }
})

// Not limited: load balancers and orchestrators must always reach it.
app.get('/health', { config: { rateLimit: false } }, async () => ({ ok: true }))

// The global defaults. failureMode 'local': item pages are most of the
// traffic; when Redis fails they should neither go unlimited nor go down,
// so each app server keeps counting on its own, more strictly.
app.get('/items/:id', async (request) => ({ id: request.params.id, name: `item ${request.params.id}` }))

// A route limit of its own. failureMode 'open': search is a cheap read and
// the limit is about fairness, so a limiter outage must not become a search
// outage. While Redis fails, requests pass and carry no RateLimit headers.
app.get('/search', {
  config: { rateLimit: { capacity: 20, refillPerSecond: 2, failureMode: 'open' } }
}, async (request) => ({ query: request.query.q ?? '', results: [] }))

// The next version of search, with a tighter limit being tried out in shadow
// mode: nobody is refused and no rate-limit header is sent, but every
// would-be denial is flagged on request.rateLimit (and on the
// 'tollgate:decision' diagnostics channel), here counted in the log.
app.get('/v2/search', {
  config: { rateLimit: { capacity: 5, refillPerSecond: 0.5, failureMode: 'open', shadow: true } }
}, async (request) => {
  if (request.rateLimit?.shadow === true) request.log.info({ bucket: request.rateLimit.bucket }, 'shadow limit would have denied this request')
  return { query: request.query.q ?? '', results: [] }
})

// A small burst and a slow refill (one token every 20 s). failureMode
// 'closed': every payment is billed by a partner that charges for going over
// quota, so when the limiter cannot decide, the answer is 503 with
// Retry-After rather than a payment that might overspend.
app.post('/pay', {
  config: { rateLimit: { capacity: 3, refillPerSecond: 0.05, failureMode: 'closed' } }
}, async (_request, reply) => {
  reply.code(201)
  return { paid: true }
})

// Plans: the client's plan picks its limit per request. Here the plan comes
// from an `x-plan` header so that curl can show it; a real app reads it from
// its authentication (an API key, a session). The headers describe the
// client's own plan: RateLimit-Limit 10 for free, 100 for pro; an internal
// caller is not limited. The plan objects are made once, so each is
// validated once. A client whose plan changes keeps its bucket (see
// docs/guides/plans.md).
const PLANS = {
  free: { capacity: 10, refillPerSecond: 1 / 6 },
  pro: { capacity: 100, refillPerSecond: 10 }
}
app.get('/plans/report', {
  config: {
    rateLimit: {
      failureMode: 'open',
      limit: (request) => {
        const plan = request.headers['x-plan']
        if (plan === 'internal') return false
        return plan === 'pro' ? PLANS.pro : PLANS.free
      }
    }
  }
}, async (request) => ({ plan: request.headers['x-plan'] ?? 'free', limit: request.rateLimit?.limit ?? null }))

// Charged by outcome: an export costs 1 token per KiB it sends, from a
// bucket of 256 KiB refilled at 16 KiB/s. Each request reserves 8 KiB when it
// arrives (denied if the bucket cannot afford even that); once the response
// is sent, the difference to its real size is charged or refunded. A large
// export can leave the bucket in debt: the next ones wait (Retry-After says
// how long). failureMode 'open': an export is a read; when Redis fails it is
// not worth an outage.
app.get('/export', {
  config: {
    rateLimit: {
      capacity: 256,
      refillPerSecond: 16,
      cost: 8,
      failureMode: 'open',
      settle: (_request, reply) => Number(reply.getHeader('content-length') ?? 0) / 1024
    }
  }
}, async (request) => {
  const kib = Math.min(1024, Math.max(0, Number(request.query.kib ?? 1) || 0))
  return 'x'.repeat(kib * 1024)
})

// Login attempts per user name, on top of the route's per-IP limit (20, then
// 1 a second, failureMode 'local' from the plugin): an attacker spreading
// guesses over many IPs still gets 5 tries per account, then one a minute.
// failureMode 'closed': while the limiter cannot count, nobody may guess
// passwords. The lockout: three denials within ten minutes block the user
// name for ten minutes (Retry-After: 600), across every app server; a
// successful login resets it. The policy is one object, made once (the
// plugin validates it on first use and remembers it).
const loginLimit = {
  bucket: 'login',
  capacity: 5,
  refillPerSecond: 1 / 60,
  failureMode: 'closed',
  lockout: { after: 3, withinMs: 600_000, forMs: 600_000 }
}
const users = new Map([['alice', 'correct horse battery staple']])

app.post('/login', {
  config: { rateLimit: { capacity: 20, refillPerSecond: 1 } }
}, async (request, reply) => {
  const { username, password } = request.body ?? {}
  if (typeof username !== 'string' || typeof password !== 'string') {
    reply.code(400)
    return { error: 'username and password are required' }
  }
  const decision = await app.tollgate.consume(username, loginLimit)
  if (decision.source === 'fail-closed') {
    const seconds = Math.max(1, Math.ceil(decision.retryAfterMs / 1000))
    reply.header('retry-after', seconds)
    throw new UnavailableError(seconds)
  }
  if (!decision.allowed) {
    const seconds = Math.max(1, Math.ceil(decision.retryAfterMs / 1000))
    reply.header('retry-after', seconds)
    throw new RateLimitedError(seconds)
  }
  if (users.get(username) !== password) {
    reply.code(401)
    return { error: 'wrong user name or password', attemptsLeft: decision.remaining }
  }
  // A successful login forgives the failed attempts before it. If Redis is
  // away just now, the attempts simply refill on their own.
  await app.tollgate.reset(username, loginLimit.bucket)
    .catch((err) => request.log.warn({ err }, 'could not reset the login bucket'))
  return { welcome: username }
})

// Graceful shutdown: stop taking requests and finish the ones in flight,
// then close the Redis client (the plugin never closes a client it was given).
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, async () => {
    app.log.info({ signal }, 'shutting down')
    await app.close()
    if (redis === undefined) return
    if (redis.status === 'ready') await redis.quit().catch(() => redis.disconnect())
    else redis.disconnect()
  })
}

await app.listen({ port, host })
app.log.info(`try: curl -i http://${host}:${port}/items/1 (store: ${redis === undefined ? 'in-process' : 'Redis'})`)
