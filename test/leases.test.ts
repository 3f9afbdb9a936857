// Token leases at the limiter and plugin level (lib/core/lease.ts, the policy
// option `lease: { tokens, maxAgeMs }`): a batch taken in one call is spent
// in process, given back once too old or too small, and on close(); four
// limiters leasing from one bucket never admit more than the bucket allows.
// Redis calls are counted with INFO commandstats, so the file runs its own
// redis-server: no other test's calls land in the counts.

import { setImmediate as yieldToLoop, setTimeout as sleep } from 'node:timers/promises'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import tollgate, { createLimiter, type Decision, type Limiter, type Policy } from '../lib/index.js'
import { LeaseBook } from '../lib/core/lease.js'
import { LEASE, RedisStore, SETTLE, TOKEN_BUCKET, TOKEN_BUCKET_EXT } from '../lib/store/redis-store.js'
import type { LeaseReply } from '../lib/store/store.js'
import { randomSource, redisMicros, scriptCalls, timeMicros } from './helpers/model.js'
import { startProxy } from './helpers/proxy.js'
import { NO_REDIS_PORT, startRedisServer } from './helpers/redis.js'
import { fleetKey, fleetKeyOf } from './helpers/keys.js'

const server = await startRedisServer()
t.teardown(() => server.stop())

/** A connected client on this file's Redis, closed at the end of `tt`. */
async function connect (tt: { teardown: (fn: () => unknown) => void }): Promise<Redis> {
  const redis = new Redis(server.url, { lazyConnect: true })
  await redis.connect()
  tt.teardown(() => { redis.disconnect() })
  return redis
}

const admin = await connect(t)

/** A refill so slow that it adds less than 1e-5 tokens in 10 s. */
const NO_REFILL = 1e-6

let prefixes = 0
/** A limiter on its own client and key prefix; closed (before its client) at the end of `tt`. */
async function newLimiter (tt: { teardown: (fn: () => unknown) => void }, options: { denialCache?: false } = {}): Promise<{ limiter: Limiter, redis: Redis, prefix: string }> {
  const redis = await connect(tt)
  const prefix = `lease${++prefixes}`
  // A generous deadline: these tests are about leases, not about a slow store.
  const limiter = createLimiter({ redis, prefix, timeout: 2000, ...options })
  tt.teardown(() => limiter.close())
  // Ready: the key secret is read, so the script calls a test counts are its decisions'.
  await limiter.ready
  return { limiter, redis, prefix }
}

function leased (bucket: string, capacity: number, refillPerSecond: number, tokens: number, maxAgeMs: number): Policy {
  return { bucket, capacity, refillPerSecond, failureMode: 'closed', lease: { tokens, maxAgeMs } }
}

/** Tokens in a bucket as Redis holds it now (the key's full-at time against Redis TIME). */
/** Tokens in the bucket `<prefix>:{<client>}:<bucket>` (its key under the fleet's secret), by Redis's clock. */
async function bucketTokens (readableKey: string, capacity: number, refillPerSecond: number): Promise<number> {
  const key = await fleetKeyOf(admin, readableKey)
  const replies = await admin.multi().get(key).time().exec()
  const [value, time] = (replies ?? []).map(([err, v]) => { if (err !== null) throw err; return v })
  if (value === null) return capacity
  const busy = Math.max(0, Number(value) - timeMicros(time))
  return capacity - busy * refillPerSecond / 1e6
}

/** |actual - expected| <= tolerance, with both numbers in the message. */
function near (tt: { ok: (value: boolean, message: string) => boolean }, actual: number, expected: number, tolerance: number, what: string): void {
  tt.ok(Math.abs(actual - expected) <= tolerance, `${what}: ${actual} within ${tolerance} of ${expected}`)
}

// Load both scripts into this Redis once, so every count below is one script per store call.
{
  const { limiter } = await newLimiter(t)
  await limiter.consume('warm-up', leased('warm-up', 10, 1, 2, 1000))
  await limiter.consume('warm-up', { bucket: 'warm-up-exact', capacity: 10, refillPerSecond: 1, failureMode: 'closed' })
}

// ------------------------------------------------- the decay, on a fake clock

/** A lease reply as lua/lease.lua returns it, for the book's arithmetic. */
function reply (taken: number, remaining: number, fullInUs: number, nowUs = 1_000_000_000): LeaseReply {
  return { taken, nowUs, bucket: { remaining, fullInUs, waitUs: 0 } }
}

t.test('LeaseBook: usable = min(left, capacity - min(capacity, bucketLeft + refill x age))', async (t) => {
  let now = 1000
  const book = new LeaseBook(10, () => now)
  const policy = leased('api', 10, 10, 10, 5000)
  const spec = { key: 'k', capacity: 10, refillPerSecond: 10, cost: 1 }
  // A full bucket of 10: the call took 10, 1 for its request, 9 kept; the
  // bucket was empty right after, full again after 1 s.
  book.add(spec, reply(10, 0, 1_000_000), now, 1)
  t.match(book.spend(policy, spec, 5000), { allowed: true, source: 'cache', remaining: 8, resetMs: 1000 }, 'at once: 9 usable, 1 spent')
  now += 300
  // 300 ms later the bucket may hold 3: usable min(8, 10 - 3) = 7.
  t.match(book.spend(policy, spec, 5000), { remaining: 9, resetMs: 700 }, 'after 300 ms: 7 usable, 1 spent; 3 in Redis + 6 here')
  now += 400
  // Now the bucket may hold 7: usable min(6, 3) = 3.
  t.match(book.spend(policy, spec, 5000), { remaining: 9 }, 'after 700 ms: 3 usable, not 6; 1 spent: 7 + 2')
  t.match(book.spend(policy, spec, 5000), { remaining: 8 }, '7 + 1')
  t.match(book.spend(policy, spec, 5000), { remaining: 7 }, '7 + 0')
  t.equal(book.spend(policy, spec, 5000), undefined, 'and none: the lease cannot pay')
  now += 300
  t.equal(book.release('k')?.tokens, 0, 'after 1 s the bucket may be full: nothing to give back')
  t.equal(book.release('k'), undefined, 'released once')

  // Give-backs: only the usable part, named by the full-at time.
  book.add(spec, reply(10, 0, 1_000_000), now, 1)
  now += 500
  t.same(book.release('k'), { spec, tokens: 5, fullAtUs: 1_001_000_000 }, 'half a window: 9 unspent, 5 usable go back')
  book.add(spec, reply(10, 0, 1_000_000), now, 0)
  now += 250
  t.same(book.unclaimed(spec, reply(10, 0, 1_000_000), now - 250), { spec, tokens: 7.5, fullAtUs: 1_001_000_000 }, 'a batch nobody waited for: 10 taken, 7.5 usable')
  t.same(book.drain().map((back) => back.tokens), [7.5], 'drain: the usable part')
  book.add(spec, reply(10, 0, 1_000_000), now, 1)
  now += 2000
  t.same(book.drain(), [], 'a fully decayed lease has nothing to give back')
})

t.test('LeaseBook: after a reset, a batch whose call was sent before it is not kept', async (t) => {
  // A lease call sent before a reset, here or on another server, took its
  // batch from the bucket as it was; landing after the reset was learnt,
  // it would add tokens to a full bucket.
  let now = 1000
  const book = new LeaseBook(10, () => now)
  const policy = leased('api', 10, 0.001, 5, 60_000)
  const spec = { key: 'k', capacity: 10, refillPerSecond: 0.001, cost: 1 }
  book.add(spec, reply(5, 5, 5e9), now, 1)
  t.ok(book.spend(policy, spec, 60_000), 'a lease of 4')
  const sent = now
  now += 10
  book.forget('k')
  t.equal(book.spend(policy, spec, 60_000), undefined, 'the reset drops it')
  book.add(spec, reply(5, 5, 5e9), sent, 1)
  t.equal(book.spend(policy, spec, 60_000), undefined, 'a batch from a call sent before the reset is not kept')
  now += 1
  book.add(spec, reply(5, 5, 5e9), now, 1)
  t.ok(book.spend(policy, spec, 60_000), 'one sent after it is')
})

t.test('LeaseBook: a lease older than maxAgeMs is not spent; the decay is slower when the bucket was emptier', async (t) => {
  let now = 0
  const book = new LeaseBook(10, () => now)
  const policy = leased('api', 100, 10, 50, 1000)
  const spec = { key: 'k', capacity: 100, refillPerSecond: 10, cost: 1 }
  // The bucket held 50, the call took all of them: 49 kept, and the bucket
  // needs 10 s to be full, so the lease decays only after 5 s.
  book.add(spec, reply(50, 0, 10_000_000), now, 1)
  now = 999
  t.match(book.spend(policy, spec, 1000), { remaining: 57 }, 'just under maxAgeMs: 49 usable (the bucket may hold 9.99)')
  now = 1000
  t.equal(book.spend(policy, spec, 1000), undefined, 'at maxAgeMs: not spent')
  t.equal(book.release('k')?.tokens, 48, 'and given back whole: none of it decayed')
})

t.test('a lease is spent in process: one Redis call per batch', async (t) => {
  const { limiter } = await newLimiter(t)
  // No refill: a leased token decays as the bucket refills under it, so at
  // 1000/s a batch of 10 lasts 10 ms, and a stalled machine made an extra
  // call. 600 requests in all fit the capacity.
  const policy = leased('api', 1000, NO_REFILL, 10, 60_000)
  const before = await scriptCalls(admin)
  const sources: Record<string, number> = {}
  let allowed = 0
  for (let i = 0; i < 200; i++) {
    const decision = await limiter.consume('one-by-one', policy)
    sources[decision.source] = (sources[decision.source] ?? 0) + 1
    if (decision.allowed) allowed++
  }
  const calls = await scriptCalls(admin) - before
  t.equal(allowed, 200, 'all allowed')
  t.same(sources, { store: 20, cache: 180 }, 'one request in 10 takes a batch from Redis, the other 9 spend it here')
  t.equal(calls, 20, '200 requests one after another: 20 Redis calls, 1 per 10 requests')

  // Concurrent requests: each that finds no lease left takes a batch of its
  // own, and the batches are pooled. A call is only sent when the pool is
  // empty, and at most WORKERS are in flight, so at most WORKERS batches
  // (less each one's own request) can be left at the end.
  const WORKERS = 8
  const PER_WORKER = 50
  const start = await scriptCalls(admin)
  let admitted = 0
  await Promise.all(Array.from({ length: WORKERS }, async () => {
    for (let i = 0; i < PER_WORKER; i++) {
      if ((await limiter.consume('concurrent', policy)).allowed) admitted++
    }
  }))
  const concurrent = await scriptCalls(admin) - start
  const requests = WORKERS * PER_WORKER
  t.equal(admitted, requests, 'all allowed')
  t.ok(concurrent >= requests / 10 && concurrent <= (requests + WORKERS * 9) / 10,
    `${requests} requests from ${WORKERS} concurrent workers: ${concurrent} Redis calls, about 1 per 10 (${requests / 10} to ${(requests + WORKERS * 9) / 10})`)
})

t.test('decisions from a lease: remaining counts the bucket and the lease; source cache', async (t) => {
  const { limiter, prefix } = await newLimiter(t)
  const policy = leased('api', 100, NO_REFILL, 10, 60_000)
  const key = `${prefix}:{c}:api`
  const first = await limiter.consume('c', policy)
  t.match(first, { allowed: true, source: 'store', limit: 100, remaining: 99, retryAfterMs: 0, bucket: 'api' }, 'a batch of 10 taken, 1 spent: 99 left in all')
  near(t, await bucketTokens(key, 100, NO_REFILL), 90, 1e-5, 'Redis holds 90: the batch of 10 is out of the bucket')
  const second = await limiter.consume('c', policy)
  t.match(second, { allowed: true, source: 'cache', remaining: 98, retryAfterMs: 0 }, 'the next one spends from the lease')
  t.ok(second.resetMs <= first.resetMs && second.resetMs > 0, `resetMs counts down from the lease's reply (${first.resetMs} then ${second.resetMs})`)
  near(t, await bucketTokens(key, 100, NO_REFILL), 90, 1e-5, 'and Redis is not touched')
})

t.test('a lease call after SCRIPT FLUSH loads the script again: no request sees NOSCRIPT', async (t) => {
  const { limiter } = await newLimiter(t)
  const policy = leased('flushed', 100, NO_REFILL, 10, 60_000)
  t.match(await limiter.consume('c', policy), { allowed: true, source: 'store' }, 'the lease script is loaded')
  t.equal(await admin.script('FLUSH'), 'OK')
  t.match(await limiter.consume('d', policy), { allowed: true, source: 'store', remaining: 99 }, 'after the flush, the next lease call still comes from Redis')
  t.equal(Number(await admin.script('EXISTS', LEASE.sha).then((r) => (r as number[])[0])), 1, 'and the script is cached again')
  // Later tests count script calls: leave every script loaded, as before the flush.
  for (const each of [TOKEN_BUCKET, TOKEN_BUCKET_EXT, SETTLE]) await admin.script('LOAD', each.lua)
})

t.test('a lease call Redis refuses for another reason than NOSCRIPT fails that call once, and is not sent again as EVAL', async (t) => {
  const { limiter, prefix } = await newLimiter(t)
  const key = await fleetKey(admin, prefix, 'c', 'wrongtype')
  await admin.hset(key, 'not', 'a bucket')
  const before = await scriptCalls(admin)
  const decision = await limiter.consume('c', leased('wrongtype', 100, NO_REFILL, 10, 60_000))
  t.match(decision, { allowed: false, source: 'fail-closed' }, 'the limit fails closed, as it declares')
  t.equal(await scriptCalls(admin) - before, 1, 'one script call: a WRONGTYPE reply is not retried as EVAL')
  t.equal(limiter.state, 'healthy', 'and Redis answered, so the breaker is not touched')
  t.equal(await admin.type(key), 'hash', 'the key is left as it was')
})

t.test('a lease older than maxAgeMs is given back with the next call', async (t) => {
  const { limiter, prefix } = await newLimiter(t)
  // 150 ms: far more than two calls in a row take, even on a busy machine.
  const policy = leased('api', 100, NO_REFILL, 10, 150)
  const key = `${prefix}:{c}:api`
  t.equal((await limiter.consume('c', policy)).source, 'store', 'batch of 10 taken, 1 spent')
  t.equal((await limiter.consume('c', policy)).source, 'cache', 'a second spent from it; 8 unspent')
  near(t, await bucketTokens(key, 100, NO_REFILL), 90, 1e-5, 'Redis: 90')
  // Past maxAgeMs (timers never fire early by more than a ms's rounding).
  await sleep(160)
  const third = await limiter.consume('c', policy)
  t.equal(third.source, 'store', 'the old lease is not spent from: the request goes to Redis')
  // 90, plus the 8 given back, less a new batch of 10.
  near(t, await bucketTokens(key, 100, NO_REFILL), 88, 1e-5, 'Redis: the 8 unspent tokens came back before the new batch was taken')
  t.equal(third.remaining, 97, '3 spent in all: 88 in Redis and 9 in the new lease')

  // A lease too small for a request's cost goes back the same way.
  const cost = await limiter.consume('c', policy, 10)
  t.equal(cost.source, 'store', 'cost 10 with 9 in the lease: a call')
  t.ok(cost.allowed, 'and allowed')
  near(t, await bucketTokens(key, 100, NO_REFILL), 87, 1e-5, 'Redis: 88, plus the 9 given back, less 10')
})

t.test('close() gives the unspent tokens back', async (t) => {
  const redis = await connect(t)
  const limiter = createLimiter({ redis, prefix: 'lease-close', timeout: 2000 })
  const a = leased('a', 100, NO_REFILL, 10, 60_000)
  const b = leased('b', 50, NO_REFILL, 20, 60_000)
  for (let i = 0; i < 3; i++) await limiter.consume('c', a)
  await limiter.consume('c', b, 5)
  near(t, await bucketTokens('lease-close:{c}:a', 100, NO_REFILL), 90, 1e-5, 'a: 10 out of Redis, 3 spent')
  near(t, await bucketTokens('lease-close:{c}:b', 50, NO_REFILL), 30, 1e-5, 'b: 20 out, 5 spent')
  await limiter.close()
  near(t, await bucketTokens('lease-close:{c}:a', 100, NO_REFILL), 97, 1e-5, 'a: the 7 unspent are back')
  near(t, await bucketTokens('lease-close:{c}:b', 50, NO_REFILL), 45, 1e-5, 'b: the 15 unspent are back')
  t.equal(redis.status, 'ready', 'close() leaves the client open')
})

t.test('leases and the denial cache', async (t) => {
  const { limiter } = await newLimiter(t)
  // 4 tokens, one back every 100 ms: none comes back while the batch is spent.
  const policy = leased('api', 4, 10, 4, 60_000)
  const sources: string[] = []
  for (let i = 0; i < 4; i++) {
    const decision = await limiter.consume('c', policy)
    t.ok(decision.allowed, `request ${i + 1} allowed`)
    sources.push(decision.source)
  }
  t.same(sources, ['store', 'cache', 'cache', 'cache'], 'one batch of 4, spent here')
  const denied = await limiter.consume('c', policy)
  const receivedAt = performance.now()
  t.match(denied, { allowed: false, source: 'store' }, 'the lease is used up and the bucket too: Redis denies')
  // The wait for one token (100 ms); a limiter may also hold a leasing
  // client back until a whole batch is back (400 ms), as long as it says so.
  t.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 400, `retry after ${denied.retryAfterMs} ms (at most a batch's 400 ms)`)

  const before = await scriptCalls(admin)
  for (let i = 0; i < 10; i++) {
    const cached = await limiter.consume('c', policy)
    t.match(cached, { allowed: false, source: 'cache' }, `repeat ${i + 1}: denied from the cache`)
    t.ok(cached.retryAfterMs > 0, `with a wait still ahead (${cached.retryAfterMs} ms)`)
  }
  t.equal(await scriptCalls(admin) - before, 0, 'without a Redis call')

  // The script ran before the reply came back, so by receivedAt + retryAfterMs
  // Redis has the token; 2 ms for the timer's rounding. A client that waits
  // as long as it was told must get through.
  await sleep(Math.max(0, receivedAt + denied.retryAfterMs + 2 - performance.now()))
  const again = await limiter.consume('c', policy)
  t.match(again, { allowed: true, source: 'store' }, 'once the wait it was told is over, Redis is asked again and allows')
})

t.test('a cached denial does not hide the tokens of a lease', async (t) => {
  const { limiter } = await newLimiter(t)
  const policy = leased('api', 5, NO_REFILL, 5, 60_000)
  // Two requests at once on a bucket of 5: the first call takes all 5 (1
  // spent, 4 in the lease); the second waits for that call instead of
  // sending its own, and is paid from the lease.
  const [first, second] = await Promise.all([limiter.consume('c', policy), limiter.consume('c', policy)])
  t.match(first, { allowed: true, source: 'store', remaining: 4 }, 'one takes the batch')
  t.match(second, { allowed: true, source: 'cache', remaining: 3 }, 'the other is paid from it')
  // A cost the lease cannot pay gives the 3 back and is denied by Redis
  // (which then holds 3); that denial is cached for cost 4 and more only.
  t.match(await limiter.consume('c', policy, 4), { allowed: false, source: 'store' }, 'cost 4: denied by Redis')
  const next = await limiter.consume('c', policy)
  t.match(next, { allowed: true, source: 'store', remaining: 2 }, 'cost 1 is not held back by the denial of cost 4')
  t.match(await limiter.consume('c', policy), { allowed: true, source: 'cache', remaining: 1 }, 'and the next one is paid from its lease')
})

t.test('a lease given back by a denied call serves a cheaper request', async (t) => {
  const { limiter, prefix } = await newLimiter(t)
  const policy = leased('api', 5, NO_REFILL, 5, 60_000)
  const key = `${prefix}:{c}:api`
  t.equal((await limiter.consume('c', policy)).source, 'store', 'batch of 5, 1 spent')
  t.equal((await limiter.consume('c', policy)).source, 'cache', '3 left in the lease')
  const big = await limiter.consume('c', policy, 4)
  t.match(big, { allowed: false, source: 'store' }, 'cost 4 with 3 in the lease and none in Redis: the 3 go back, still short')
  near(t, await bucketTokens(key, 5, NO_REFILL), 3, 1e-5, 'the denied call put the 3 tokens back in Redis')
  const before = await scriptCalls(admin)
  t.match(await limiter.consume('c', policy, 4), { allowed: false, source: 'cache' }, 'cost 4 again: the cached denial')
  t.equal(await scriptCalls(admin) - before, 0, 'no call')
  const small = await limiter.consume('c', policy, 2)
  t.match(small, { allowed: true, source: 'store' }, 'cost 2 is not held back by the denial of cost 4: Redis allows it')
  t.match(await limiter.consume('c', policy), { allowed: true, source: 'cache' }, 'and the 1 token taken with it is spent here')
  near(t, await bucketTokens(key, 5, NO_REFILL), 0, 1e-5, 'all 5 tokens spent, none lost: 1 + 1 + 2 + 1')
  t.match(await limiter.consume('c', policy), { allowed: false }, 'nothing left')
})

t.test('reset() drops the lease with the bucket', async (t) => {
  const { limiter, prefix } = await newLimiter(t)
  const policy = leased('api', 100, NO_REFILL, 10, 60_000)
  const key = `${prefix}:{c}:api`
  await limiter.consume('c', policy)
  t.equal((await limiter.consume('c', policy)).remaining, 98, '2 spent')
  await limiter.reset('c', 'api')
  t.equal(await admin.exists(await fleetKeyOf(admin, key)), 0, 'the key is gone')
  const after = await limiter.consume('c', policy)
  t.match(after, { source: 'store', remaining: 99 }, 'the old lease is not spent from: a fresh batch from a full bucket')
  near(t, await bucketTokens(key, 100, NO_REFILL), 90, 1e-5, 'Redis: one batch of 10 out')
})

t.test('the lease book is size-capped: past maxKeys the oldest lease is dropped', async (t) => {
  // The limiter keeps up to 10 000 leases; the book itself, with a small
  // cap, fed with real lease replies from Redis.
  const store = new RedisStore(await connect(t))
  const book = new LeaseBook(3)
  const specs = Array.from({ length: 5 }, (_, i) => ({ key: `lease-book:{c}:b${i}`, capacity: 10, refillPerSecond: NO_REFILL, cost: 1 }))
  for (const spec of specs) book.add(spec, await store.lease(spec, 4, 0, 0), performance.now(), spec.cost)
  t.same(book.drain().map(({ spec, tokens }) => [spec.key, Math.round(tokens * 1e6) / 1e6]), [['lease-book:{c}:b2', 3], ['lease-book:{c}:b3', 3], ['lease-book:{c}:b4', 3]],
    'the 3 most recent leases are kept, 3 unspent tokens each')
  t.same(book.drain(), [], 'and drain() empties the book')
})

t.test('leases serve single-policy checks only: a list with a lease is refused at the call', async (t) => {
  const { limiter } = await newLimiter(t)
  const a = leased('a', 100, 100, 10, 60_000)
  const b: Policy = { bucket: 'b', capacity: 100, refillPerSecond: 100, failureMode: 'closed' }
  const before = await scriptCalls(admin)
  // Before, the list was accepted and the lease silently ignored: every call went to Redis.
  for (const call of [() => limiter.consume('c', [a, b]), () => limiter.peek('c', [b, a])]) {
    await t.rejects(call(), { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message: /^tollgate: `policy\[\d\]\.lease` must be unset in an array of policies \(leases serve single-policy routes\), got / })
  }
  t.equal(await scriptCalls(admin) - before, 0, 'no call made')
  t.match(await limiter.consume('c', a), { allowed: true, source: 'store' }, 'the leased policy alone is fine')
})

t.test('plugin: a route with a lease', async (t) => {
  const redis = await connect(t)
  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, {
    redis,
    prefix: 'lease-plugin',
    capacity: 10,
    refillPerSecond: NO_REFILL,
    failureMode: 'closed',
    timeout: 2000,
    global: false
  })
  app.get('/leased', { config: { rateLimit: { lease: { tokens: 5, maxAgeMs: 60_000 } } } }, async (request) => request.rateLimit)
  await app.ready()
  const before = await scriptCalls(admin)
  const statuses: number[] = []
  const remaining: string[] = []
  for (let i = 0; i < 12; i++) {
    const res = await app.inject('/leased')
    statuses.push(res.statusCode)
    remaining.push(String(res.headers['ratelimit-remaining']))
  }
  t.same(statuses, [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429], 'the capacity of 10, no more')
  t.same(remaining, ['9', '8', '7', '6', '5', '4', '3', '2', '1', '0', '0', '0'], 'RateLimit-Remaining counts down through the leases')
  // Two batches of 5, one denial from Redis, then the denial cache.
  t.equal(await scriptCalls(admin) - before, 3, '12 requests, 3 Redis calls')
  near(t, await bucketTokens('lease-plugin:{127.0.0.1}:GET /leased', 10, NO_REFILL), 0, 1e-5, 'the bucket is empty in Redis')
})

t.test('plugin: closing the app gives unspent lease tokens back', async (t) => {
  const redis = await connect(t)
  const app = Fastify()
  await app.register(tollgate, {
    redis, prefix: 'lease-plugin-close', capacity: 10, refillPerSecond: NO_REFILL, failureMode: 'closed', timeout: 2000,
    lease: { tokens: 5, maxAgeMs: 60_000 }
  })
  app.get('/', async () => 'ok')
  t.equal((await app.inject('/')).statusCode, 200)
  near(t, await bucketTokens('lease-plugin-close:{127.0.0.1}:GET /', 10, NO_REFILL), 5, 1e-5, 'a plugin-level lease: a batch of 5 out')
  await app.close()
  near(t, await bucketTokens('lease-plugin-close:{127.0.0.1}:GET /', 10, NO_REFILL), 9, 1e-5, 'after close: the 4 unspent are back')
  t.equal(redis.status, 'ready', 'and the client is still open')
})

interface Tally {
  allowed: number
  denied: number
  /** Tokens of the allowed requests. */
  tokens: number
  sources: Record<string, number>
}

t.test('four limiters leasing from one bucket never admit more than capacity + refill x elapsed', async (t) => {
  const CAPACITY = 30
  const RATE = 100
  const TOKENS = 5
  const WORKERS = 6
  const RUN_MS = 1500
  // Mixed costs: a lease holding less than the next request's cost is
  // given back with that request's call, so give-backs happen all along.
  const COSTS = [1, 1, 2, 3]
  // Four app servers: a limiter each, on a client of its own. Each runs the
  // leased policy and the exact one (same size, its own bucket) at once, so
  // both see the same load and the same machine.
  const servers = await Promise.all(Array.from({ length: 4 }, async () => {
    const redis = await connect(t)
    return createLimiter({ redis, prefix: 'fleet', timeout: 2000 })
  }))
  const policies: Record<'leased' | 'exact', Policy> = {
    leased: leased('leased', CAPACITY, RATE, TOKENS, 100),
    exact: { bucket: 'exact', capacity: CAPACITY, refillPerSecond: RATE, failureMode: 'closed' }
  }
  const tallies: Record<'leased' | 'exact', Tally> = {
    leased: { allowed: 0, denied: 0, tokens: 0, sources: {} },
    exact: { allowed: 0, denied: 0, tokens: 0, sources: {} }
  }
  const callsBefore = await scriptCalls(admin)
  const startUs = await redisMicros(admin)
  const deadline = performance.now() + RUN_MS
  await Promise.all(servers.flatMap((limiter) => (['leased', 'exact'] as const).flatMap((mode) =>
    Array.from({ length: WORKERS }, async (_, worker) => {
      const tally = tallies[mode]
      for (let i = worker; performance.now() < deadline; i++) {
        const cost = COSTS[i % COSTS.length] as number
        const decision: Decision = await limiter.consume('fleet-client', policies[mode], cost)
        if (decision.allowed) {
          tally.allowed++
          tally.tokens += cost
        } else {
          tally.denied++
        }
        tally.sources[decision.source] = (tally.sources[decision.source] ?? 0) + 1
        // Leased and cached decisions settle without I/O: let the other
        // workers and the sockets have the event loop.
        await yieldToLoop()
      }
    }))))
  const endUs = await redisMicros(admin)
  const calls = await scriptCalls(admin) - callsBefore
  // Every admission, whether from Redis or from a lease, happened between
  // the two readings of Redis's clock, on a bucket that was full before.
  const bound = CAPACITY + RATE * (endUs - startUs) / 1e6
  for (const mode of ['leased', 'exact'] as const) {
    const tally = tallies[mode]
    t.comment(`${mode}: ${tally.allowed} allowed (${tally.tokens} tokens), ${tally.denied} denied, sources ${JSON.stringify(tally.sources)}`)
    t.ok(tally.tokens <= bound, `${mode}: ${tally.tokens} tokens admitted <= capacity + refill x elapsed = ${bound.toFixed(2)}`)
    t.notOk(tally.sources['fail-closed'], `${mode}: no store failure`)
  }
  t.comment(`${calls} Redis calls in ${((endUs - startUs) / 1000).toFixed(0)} ms`)
  // A lease is one call of its own; the exact decisions a server asks in
  // one turn of its event loop share one call (lib/store/redis-store.ts).
  const leasedCalls = tallies.leased.sources.store ?? 0
  const exactDecisions = tallies.exact.sources.store ?? 0
  t.ok(calls >= leasedCalls + Math.min(1, exactDecisions) && calls <= leasedCalls + exactDecisions,
    `one Redis call per leased store decision, at most one per exact one, none for the others: ${calls} calls for ${leasedCalls} + ${exactDecisions}`)
  // Both saturate the bucket: under this load it is the bucket, not the
  // machine, that limits what passes. Leases can only under-admit: at the
  // end each server may hold up to a batch it has not spent (given back on
  // close), and a cost the lease cannot pay sends its tokens back through
  // Redis, where another server may take them a little later.
  t.ok(tallies.exact.tokens >= bound * 0.8, `exact mode uses the bucket: ${tallies.exact.tokens} of ${bound.toFixed(2)} tokens (at least 80%)`)
  t.ok(tallies.leased.tokens >= bound * 0.7, `leases use it too: ${tallies.leased.tokens} of ${bound.toFixed(2)} tokens (at least 70%)`)
  await Promise.all(servers.map((limiter) => limiter.close()))
  const left = await bucketTokens('fleet:{fleet-client}:leased', CAPACITY, RATE)
  t.ok(left >= 0 && left <= CAPACITY, `after close, the bucket holds ${left.toFixed(3)} tokens`)
})

// ------------------------------------------------------------ the edges
//
// docs/design/algorithm.md, "Fewer round trips": across the fleet, in ANY window of length w, a bucket
// admits at most capacity + refill x w. The checks below record when each
// admission was seen (performance.now() as the decision resolved) and check
// every window between two admissions, not only the total since the start.
// Tolerance: a decision made by Redis happened somewhere in the round trip
// before it was seen, so a window of seen times may hold admissions of a
// window up to one round trip longer: refill x the longest round trip of
// the run (each run measures it: the longest consume() that Redis decided).

interface Admission {
  at: number
  cost: number
}

interface Window {
  /** Cost admitted in the worst window, and that window's bound. */
  admitted: number
  bound: number
  ms: number
  /** admitted - bound: <= 0 when every window keeps the invariant. */
  excess: number
}

/** The window between two admissions whose admitted cost most exceeds capacity + refill x w. */
function worstWindow (admissions: readonly Admission[], capacity: number, refillPerSecond: number): Window {
  const sorted = [...admissions].sort((a, b) => a.at - b.at)
  let worst: Window = { admitted: 0, bound: capacity, ms: 0, excess: -capacity }
  for (let i = 0; i < sorted.length; i++) {
    let admitted = 0
    const from = (sorted[i] as Admission).at
    for (let j = i; j < sorted.length; j++) {
      const { at, cost } = sorted[j] as Admission
      admitted += cost
      const bound = capacity + refillPerSecond * (at - from) / 1000
      if (admitted - bound > worst.excess) worst = { admitted, bound, ms: at - from, excess: admitted - bound }
    }
  }
  return worst
}

/** Records the admissions of a limiter and the longest round trip Redis decided. */
class Recorder {
  readonly admissions: Admission[] = []
  readonly sources: Record<string, number> = {}
  denied = 0
  longestStoreMs = 0

  async consume (limiter: Limiter, client: string, policy: Policy, cost = 1): Promise<Decision> {
    const start = performance.now()
    const decision = await limiter.consume(client, policy, cost)
    const at = performance.now()
    this.sources[decision.source] = (this.sources[decision.source] ?? 0) + 1
    if (decision.source === 'store') this.longestStoreMs = Math.max(this.longestStoreMs, at - start)
    if (decision.allowed) this.admissions.push({ at, cost })
    else this.denied++
    return decision
  }

  check (t: Test, capacity: number, refillPerSecond: number, what: string): Window {
    const worst = worstWindow(this.admissions, capacity, refillPerSecond)
    const tolerance = refillPerSecond * this.longestStoreMs / 1000
    t.comment(`${what}: ${this.admissions.length} admitted, ${this.denied} denied, sources ${JSON.stringify(this.sources)}; ` +
      `worst window ${worst.ms.toFixed(1)} ms: ${worst.admitted} admitted, bound ${worst.bound.toFixed(2)}, tolerance ${tolerance.toFixed(3)}`)
    t.ok(worst.excess <= tolerance, `${what}: every window admits at most capacity + refill x w (+ ${tolerance.toFixed(3)}): ` +
      `worst ${worst.admitted} in ${worst.ms.toFixed(1)} ms against ${worst.bound.toFixed(2)}`)
    return worst
  }
}

/** One app server of a fleet: its own client, the fleet's key prefix. */
async function fleetLimiter (tt: Test, prefix: string): Promise<Limiter> {
  const limiter = createLimiter({ redis: await connect(tt), prefix, timeout: 2000 })
  tt.teardown(() => limiter.close())
  return limiter
}

t.test('windows: a lease kept through a refill does not let one server burst past capacity', async (t) => {
  for (const [capacity, rate, tokens, burst] of [[10, 10, 10, 40], [100, 100, 100, 300]] as const) {
    const { limiter } = await newLimiter(t)
    const policy = leased('api', capacity, rate, tokens, 5000)
    const recorder = new Recorder()
    await recorder.consume(limiter, 'c', policy)
    // Past one window (capacity / refill = 1 s): the bucket is full again in
    // Redis, and the lease still holds tokens - 1 unspent ones.
    await sleep(1200)
    for (let i = 0; i < burst; i++) await recorder.consume(limiter, 'c', policy)
    recorder.check(t, capacity, rate, `capacity ${capacity}, ${rate}/s, a lease of ${tokens}, 1 request, 1.2 s, ${burst} in a row`)
  }
})

t.test('windows: an older lease given back after another server took cannot refill the bucket twice', async (t) => {
  // Capacity 10 at 10/s. A takes a batch of 10 (9 unspent). Half a window
  // later B takes the 5 that came back (4 unspent). A gives its 5 usable
  // tokens back: accepted, they would sit in the bucket while B's lease
  // still counts on the bucket being 5 emptier, and half a window later B's
  // 4 and a full bucket would be spent at once: 14 in a moment.
  const [a, b, c] = [await fleetLimiter(t, 'older-lease'), await fleetLimiter(t, 'older-lease'), await fleetLimiter(t, 'older-lease')]
  const policy = leased('api', 10, 10, 10, 60_000)
  const recorder = new Recorder()
  t.match(await recorder.consume(a, 'c', policy), { allowed: true, remaining: 9 }, 'A takes the batch')
  await sleep(500)
  t.match(await recorder.consume(b, 'c', policy), { allowed: true, source: 'store' }, 'B takes what came back')
  await a.close()
  await sleep(500)
  for (let i = 0; i < 4; i++) await recorder.consume(b, 'c', policy)
  for (let i = 0; i < 10; i++) await recorder.consume(c, 'c', policy)
  recorder.check(t, 10, 10, 'A, B and C on one bucket')
})

t.test('windows: four limiters leasing from one bucket under random traffic', async (t) => {
  const CAPACITY = 30
  const RATE = 100
  const random = randomSource(20_240_601)
  const servers = await Promise.all(Array.from({ length: 4 }, () => fleetLimiter(t, 'random-fleet')))
  const policy = leased('shared', CAPACITY, RATE, 8, 2000)
  // The same requests on a bucket without leases, for the under-admission.
  const exact: Policy = { bucket: 'exact', capacity: CAPACITY, refillPerSecond: RATE, failureMode: 'closed' }
  const recorder = new Recorder()
  const control = new Recorder()
  // Bursts from random servers, with pauses of 0 to 1.3 windows between
  // them: leases are taken in a burst and kept through the pause.
  for (let burst = 0; burst < 12; burst++) {
    await sleep(random() * 400)
    const size = 5 + Math.floor(random() * 40)
    await Promise.all(Array.from({ length: size }, async () => {
      await yieldToLoop()
      const server = servers[Math.floor(random() * servers.length)] as Limiter
      const cost = random() < 0.8 ? 1 : 2
      await Promise.all([recorder.consume(server, 'fleet', policy, cost), control.consume(server, 'fleet', exact, cost)])
    }))
  }
  t.notOk(recorder.sources['fail-closed'], 'no store failure')
  recorder.check(t, CAPACITY, RATE, '4 limiters, capacity 30, 100/s, leases of 8')
  control.check(t, CAPACITY, RATE, 'the same requests without leases')
  const tokens = (r: Recorder): number => r.admissions.reduce((sum, a) => sum + a.cost, 0)
  const share = tokens(recorder) / tokens(control)
  t.comment(`under-admission: leases admit ${tokens(recorder)} tokens, the exact bucket ${tokens(control)} (${(share * 100).toFixed(0)}%)`)
  t.ok(share >= 0.6, `leases admit at least 60% of what the exact bucket admits (${(share * 100).toFixed(0)}%)`)
})

t.test('concurrent misses share one lease call: 100 at once on a bucket of 100', async (t) => {
  const { limiter } = await newLimiter(t)
  const policy = leased('api', 100, NO_REFILL, 10, 60_000)
  const before = await scriptCalls(admin)
  const decisions = await Promise.all(Array.from({ length: 100 }, () => limiter.consume('c', policy)))
  const calls = await scriptCalls(admin) - before
  const allowed = decisions.filter((d) => d.allowed).length
  const retry = Math.max(...decisions.map((d) => d.retryAfterMs))
  t.comment(`${allowed} allowed, ${100 - allowed} denied (longest Retry-After ${retry} ms), ${calls} Redis calls`)
  t.equal(allowed, 100, 'all 100 allowed: the bucket holds 100')
  t.ok(calls <= 3, `${calls} Redis calls: one, then one sized to the requests that waited for it`)
})

t.test('a request waiting for a lease call keeps its own deadline (frozen Redis)', async (t) => {
  const TIMEOUT_MS = 50
  // Scheduling noise on a loaded 2-core machine, as in failure-modes.test.ts.
  const TOLERANCE_MS = 300
  const frozen = await startRedisServer()
  t.teardown(() => frozen.stop())
  const redis = new Redis(frozen.url, { lazyConnect: true })
  redis.on('error', () => {})
  await redis.connect()
  t.teardown(() => { redis.disconnect() })
  // A high breaker threshold: every request here meets the deadline, not the breaker.
  const limiter = createLimiter({ redis, prefix: 'frozen', timeout: TIMEOUT_MS, breaker: { failures: 1000, cooldownMs: 1000 } })
  const policy: Policy = { ...leased('api', 100, NO_REFILL, 10, 60_000), failureMode: 'open' }
  t.equal((await limiter.consume('c', { ...policy, timeout: 2000 })).source, 'store', 'warm: the script is loaded')
  t.equal((await limiter.consume('d', { ...policy, timeout: 2000 })).source, 'store')
  frozen.pause()
  t.teardown(() => frozen.resume())
  // One request every 10 ms for 300 ms: most arrive while a call is in
  // flight, and each must follow its failure mode within its own deadline.
  const waits: number[] = []
  const sources: Record<string, number> = {}
  await Promise.all(Array.from({ length: 30 }, async (_, i) => {
    await sleep(i * 10)
    const arrived = performance.now()
    const decision = await limiter.consume(i % 2 === 0 ? 'c' : 'd', { ...policy, cost: 20 })
    waits.push(performance.now() - arrived)
    sources[decision.source] = (sources[decision.source] ?? 0) + 1
  }))
  frozen.resume()
  const longest = Math.max(...waits)
  t.comment(`30 requests on a frozen Redis, deadline ${TIMEOUT_MS} ms: sources ${JSON.stringify(sources)}, longest wait ${longest.toFixed(1)} ms`)
  t.same(sources, { 'fail-open': 30 }, 'every request follows its failure mode')
  t.ok(longest <= TIMEOUT_MS + TOLERANCE_MS, `no request waits much longer than its deadline: ${longest.toFixed(1)} ms <= ${TIMEOUT_MS} + ${TOLERANCE_MS}`)
  await limiter.close()
})

t.test('close() gives back the tokens of a lease call still in flight', async (t) => {
  const proxy = await startProxy(server.url)
  t.teardown(() => proxy.close())
  const redis = new Redis(proxy.url, { lazyConnect: true })
  await redis.connect()
  t.teardown(() => { redis.disconnect() })
  const limiter = createLimiter({ redis, prefix: 'close-flight', timeout: 2000 })
  const policy = leased('api', 100, NO_REFILL, 50, 60_000)
  t.equal((await limiter.consume('warm', policy)).source, 'store', 'warm: the script is loaded')
  proxy.delayMs = 200
  const pending = limiter.consume('c', policy)
  // Waits for that call; the 49 it brings cannot pay 60.
  const big = limiter.consume('c', policy, 60)
  await sleep(50)
  await limiter.close()
  const decision = await pending
  proxy.delayMs = 0
  t.match(decision, { allowed: true, source: 'store' }, 'the request in flight is decided by Redis')
  t.match(await big, { allowed: false, source: 'fail-closed' }, 'a request still waiting when the call lands during close() gets no new call: its failure mode')
  const left = await bucketTokens('close-flight:{c}:api', 100, NO_REFILL)
  near(t, left, 99, 1e-5, 'after close(): only the request\'s own token is out of the bucket')
})

t.test('a batch that lands after its request left is kept for the next requests', async (t) => {
  const proxy = await startProxy(server.url)
  t.teardown(() => proxy.close())
  const redis = new Redis(proxy.url, { lazyConnect: true })
  await redis.connect()
  t.teardown(() => { redis.disconnect() })
  const limiter = createLimiter({ redis, prefix: 'left', timeout: 2000 })
  t.teardown(() => limiter.close())
  const policy: Policy = { ...leased('api', 100, NO_REFILL, 10, 60_000), failureMode: 'open', timeout: 1000 }
  t.equal((await limiter.consume('warm', policy)).source, 'store', 'warm: the script is loaded')
  // Replies take 600 ms. A takes a batch of 10; B (cost 20, deadline
  // 1000 ms) waits for that call, then sends the next one at about 600 ms,
  // which lands at about 1200 ms: after B's own deadline, within the
  // call's (1000 ms from when it was sent).
  proxy.delayMs = 600
  const a = limiter.consume('c', policy)
  const b = limiter.consume('c', policy, 20)
  t.match(await a, { allowed: true, source: 'store' })
  t.match(await b, { allowed: true, source: 'fail-open' }, 'B followed its failure mode at its own deadline')
  await sleep(600)
  proxy.delayMs = 0
  near(t, await bucketTokens('left:{c}:api', 100, NO_REFILL), 79, 1e-5, 'B\'s call gave the 9 of A\'s batch back and took 20')
  t.match(await limiter.consume('c', policy, 20), { allowed: true, source: 'cache' }, 'the 20 nobody spent pay the next request')
})

t.test('a lease reply after its deadline is given back', async (t) => {
  const proxy = await startProxy(server.url)
  t.teardown(() => proxy.close())
  const redis = new Redis(proxy.url, { lazyConnect: true })
  await redis.connect()
  t.teardown(() => { redis.disconnect() })
  const limiter = createLimiter({ redis, prefix: 'late', timeout: 2000 })
  t.teardown(() => limiter.close())
  const policy = leased('api', 100, NO_REFILL, 50, 60_000)
  t.equal((await limiter.consume('warm', policy)).source, 'store', 'warm: the script is loaded')
  proxy.delayMs = 300
  const decision = await limiter.consume('c', { ...policy, timeout: 50, failureMode: 'open' })
  t.equal(decision.source, 'fail-open', 'the reply is late: the request followed its failure mode')
  // The script ran at once; its reply comes 300 ms later, then the give-back
  // (another 300 ms for its own reply, which changes nothing in Redis).
  let left = await bucketTokens('late:{c}:api', 100, NO_REFILL)
  near(t, left, 50, 1e-5, 'Redis took the batch of 50')
  const until = performance.now() + 3000
  while (left < 100 - 1e-5 && performance.now() < until) {
    await sleep(50)
    left = await bucketTokens('late:{c}:api', 100, NO_REFILL)
  }
  proxy.delayMs = 0
  near(t, left, 100, 1e-5, 'all 50 come back: no request spent any of them')
})

t.test('peek on a leased policy says what consume would do on this server', async (t) => {
  const { limiter, prefix } = await newLimiter(t)
  const policy = leased('api', 10, NO_REFILL, 10, 60_000)
  t.match(await limiter.consume('c', policy), { allowed: true, source: 'store', remaining: 9 }, 'a batch of all 10 taken, 1 spent: Redis holds none')
  const before = await scriptCalls(admin)
  // Before, the peek asked Redis alone: denied, 0 left, while the next consume was allowed from the lease.
  t.match(await limiter.peek('c', policy), { allowed: true, source: 'cache', remaining: 9, retryAfterMs: 0 }, 'the lease can pay: allowed, from the lease')
  t.equal(await scriptCalls(admin) - before, 0, 'without a call')
  t.match(await limiter.consume('c', policy), { allowed: true, source: 'cache', remaining: 8 }, 'the peek spent nothing')

  // A cost the lease cannot pay: the consume gives the lease's rest back
  // first, and Redis decides the rest of the cost; so does the peek.
  const half = leased('half', 10, NO_REFILL, 8, 60_000)
  for (let i = 0; i < 7; i++) await limiter.consume('d', half)
  near(t, await bucketTokens(`${prefix}:{d}:half`, 10, NO_REFILL), 2, 1e-5, 'Redis holds 2, the lease 1')
  const costly = { ...half, cost: 3 }
  t.match(await limiter.peek('d', costly), { allowed: true, source: 'store', remaining: 3 }, 'cost 3: the lease\'s 1 given back and Redis\'s 2; 3 in all')
  t.match(await limiter.consume('d', costly), { allowed: true, source: 'store' }, 'and the consume is allowed')
  t.match(await limiter.peek('d', { ...half, cost: 10 }), { allowed: false, source: 'store' }, 'cost 10: more than Redis and the lease hold, denied')
  t.match(await limiter.consume('d', { ...half, cost: 10 }), { allowed: false }, 'as the consume is')
  t.match(await limiter.peek('d', { ...half, cost: 10 }), { allowed: false, source: 'cache' }, 'and once the consume\'s denial is cached, the peek answers from it')
})

t.test('peek on a leased policy counts its lease only while Redis would take it back', async (t) => {
  // Two servers lease batches of 4 from one bucket of 10 at cost 3: each
  // keeps 1 token, Redis holds 2. Server one's next consume gives its 1
  // back first, but Redis refuses it (server two took since, lua/lease.lua),
  // so 2 tokens cannot pay 3. Before, its peek counted the 1 anyway: allowed.
  const prefix = `lease${++prefixes}`
  const [one, two] = [createLimiter({ redis: await connect(t), prefix, timeout: 2000 }), createLimiter({ redis: await connect(t), prefix, timeout: 2000 })]
  t.teardown(() => Promise.all([one.close(), two.close()]))
  const policy: Policy = { ...leased('api', 10, NO_REFILL, 4, 60_000), cost: 3 }
  t.match(await one.consume('c', policy), { allowed: true, source: 'store' }, 'one: a batch of 4, 3 spent, 1 kept')
  t.match(await two.consume('c', policy), { allowed: true, source: 'store' }, 'two: a batch of 4, 3 spent, 1 kept')
  near(t, await bucketTokens(`${prefix}:{c}:api`, 10, NO_REFILL), 2, 1e-5, 'Redis holds 2')
  const peeked = await one.peek('c', policy)
  const consumed = await one.consume('c', policy)
  t.match(consumed, { allowed: false, source: 'store' }, "one's consume: its 1 refused back, Redis's 2 cannot pay 3")
  t.match(peeked, { allowed: false, source: 'store', remaining: 2 }, 'and its peek said so: 2 tokens, not 3')
  near(t, await bucketTokens(`${prefix}:{c}:api`, 10, NO_REFILL), 2, 1e-5, 'the peek wrote nothing')
})

t.test('peek on a leased policy follows its failure mode when Redis is down', async (t) => {
  const redis = new Redis({ host: '127.0.0.1', port: NO_REDIS_PORT, lazyConnect: true })
  redis.on('error', () => {})
  t.teardown(() => { redis.disconnect() })
  const limiter = createLimiter({ redis, prefix: `lease${++prefixes}` })
  t.teardown(() => limiter.close())
  t.match(await limiter.peek('c', { ...leased('api', 10, 1, 5, 1000), failureMode: 'open' }), { allowed: true, source: 'fail-open' })
})

t.test('a lease taken under one plan is neither spent nor given back under another', async (t) => {
  // A plan of 100 leases 50 tokens; the client is downgraded to a plan of
  // 10 on the same bucket. Before, the 49 tokens of the old lease kept being
  // spent here, 49 requests under a plan whose bucket holds 10. Now the
  // lease is dropped: the bucket, 50 tokens short, reads as empty under the
  // new plan, and Redis denies.
  const { limiter, prefix } = await newLimiter(t)
  const pro = leased('api', 100, NO_REFILL, 50, 60_000)
  const free = leased('api', 10, NO_REFILL, 5, 60_000)
  t.match(await limiter.consume('c', pro), { allowed: true, source: 'store', remaining: 99 }, 'pro: a lease of 50, 1 spent')
  t.match(await limiter.peek('c', free), { allowed: false, source: 'store' }, 'free: a peek does not count the pro lease')
  const got: Decision[] = []
  for (let i = 0; i < 3; i++) got.push(await limiter.consume('c', free))
  t.same(got.map((d) => [d.allowed, d.source]), [[false, 'store'], [false, 'cache'], [false, 'cache']], 'free: denied by Redis, then by the cached denial')
  near(t, await bucketTokens(`${prefix}:{c}:api`, 100, NO_REFILL), 50, 1e-5, 'the pro lease was not given back under the free plan')
  t.match(await limiter.consume('c', pro), { allowed: true, source: 'store' }, 'pro again: a new lease call (the old lease was dropped)')
})
