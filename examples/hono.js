// The example API of examples/app.js, on Hono with tollgate/hono, served by
// @hono/node-server. Run it with `npm run example:hono`, or with a shared
// Redis: REDIS_URL=redis://127.0.0.1:6379 npm run example:hono
//
// The import below is the package's own entry ('tollgate/hono' resolves
// through package.json "exports" to dist/), so the example always runs this
// checkout.
import { serve } from '@hono/node-server'
import { Hono } from 'hono'
import { Redis } from 'ioredis'
import { rateLimit } from 'tollgate/hono'

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

// The defaults every limit() below merges over: a bucket of 5 tokens
// refilled at 1 per second, per client IP (the socket's peer: no proxy is
// trusted; behind one, set `trustProxy`). Small numbers, so a few curl
// requests show a 429. failureMode 'local': if Redis is down or slower than
// the 10 ms deadline, each app server falls back to its own, smaller
// in-process bucket, sized as if a fleet of about 2 split the real limit.
const limit = rateLimit({
  redis,
  capacity: 5,
  refillPerSecond: 1,
  failureMode: 'local',
  local: { capacity: 2, refillPerSecond: 0.5 }
})

const app = new Hono()

// Not limited: load balancers and orchestrators must always reach it.
app.get('/health', (c) => c.json({ ok: true }))

// The defaults, in a bucket named by the route pattern: 'GET /items/:id'.
app.get('/items/:id', limit(), (c) => {
  const id = c.req.param('id')
  return c.json({ id, name: `item ${id}` })
})

// A limit of its own. failureMode 'open': search is a cheap read and the
// limit is about fairness, so a limiter outage must not become a search
// outage. While Redis fails, requests pass and carry no RateLimit headers.
app.get('/search', limit({ capacity: 20, refillPerSecond: 2, failureMode: 'open' }), (c) => c.json({ query: c.req.query('q') ?? '', results: [] }))

// Two policies, checked together in one script call (all or nothing): a
// burst of 3, then one every 20 s, and at most 100 an hour. failureMode
// 'closed': every payment is billed by a partner that charges for going over
// quota, so when the limiter cannot decide, the answer is 503 with
// Retry-After rather than a payment that might overspend.
app.post('/pay', limit([
  { capacity: 3, refillPerSecond: 0.05, failureMode: 'closed' },
  { capacity: 100, refillPerSecond: 100 / 3600, failureMode: 'closed' }
]), (c) => c.json({ paid: true }, 201))

// Login attempts per user name, on top of the route's per-IP limit: an
// attacker spreading guesses over many IPs still gets 5 tries per account,
// then one a minute. failureMode 'closed': while the limiter cannot count,
// nobody may guess passwords. The key reads the parsed body (Hono keeps it,
// so the handler reads it again at no cost).
app.post('/login',
  limit({ capacity: 20, refillPerSecond: 1 }),
  limit({ bucket: 'login', capacity: 5, refillPerSecond: 1 / 60, failureMode: 'closed', key: async (c) => String((await body(c)).username ?? '') || 'anonymous' }),
  async (c) => {
    const { username, password } = await body(c)
    if (typeof username !== 'string' || typeof password !== 'string') return c.json({ error: 'username and password are required' }, 400)
    if (password !== 'correct horse battery staple' || username !== 'alice') {
      return c.json({ error: 'wrong user name or password', attemptsLeft: c.get('rateLimit')?.remaining }, 401)
    }
    // A successful login forgives the failed attempts before it.
    await limit.reset(username, 'login').catch(() => {})
    return c.json({ welcome: username })
  })

/** The JSON body, or {} when there is none or it is not JSON. */
async function body (c) {
  const parsed = await c.req.json().catch(() => ({}))
  return typeof parsed === 'object' && parsed !== null ? parsed : {}
}

const server = serve({ fetch: app.fetch, port, hostname }, () => {
  console.log(`try: curl -i http://${hostname}:${port}/items/1 (store: ${redis === undefined ? 'in-process' : 'Redis'})`)
})

// Graceful shutdown: close the limiter (its waiting requests are answered
// at once), finish the requests in flight, then close the Redis client
// (tollgate never closes a client it was given).
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, () => {
    server.close(async () => {
      if (redis !== undefined) await redis.quit().catch(() => redis.disconnect())
    })
    void limit.close()
  })
}
