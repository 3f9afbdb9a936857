// The denial cache (lib/core/denial-cache.ts): after Redis denies a request, the
// same request is denied in process, without a call, until Redis could
// allow it; never longer, never for a cheaper request, keyed by the set of
// buckets; capped in size; off with `denialCache: false`; cleared by
// reset(). Redis calls are counted with INFO commandstats, so the file runs
// its own redis-server: no other test's calls land in the counts.
//
// Replay the random part: TOLLGATE_SEED=<seed printed below>.

import { randomInt } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { DenialCache } from '../lib/core/denial-cache.js'
import { SUBSCRIBER_NAME } from '../lib/core/invalidation.js'
import { Marks } from '../lib/core/marks.js'
import { createLimiter, type Decision, type Limiter, type LimiterOptions, type Policy } from '../lib/index.js'
import type { BucketSpec } from '../lib/store/store.js'
import { buildApp } from './helpers/app.js'
import { randomSource, scriptCalls } from './helpers/model.js'
import { startRedisServer } from './helpers/redis.js'

const seed = process.env.TOLLGATE_SEED === undefined ? randomInt(2 ** 31) : Number(process.env.TOLLGATE_SEED)
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)

const server = await startRedisServer()
t.teardown(() => server.stop())

async function connect (tt: { teardown: (fn: () => unknown) => void }): Promise<Redis> {
  return await connectTo(tt, server.url)
}

async function connectTo (tt: { teardown: (fn: () => unknown) => void }, url: string): Promise<Redis> {
  const redis = new Redis(url, { lazyConnect: true })
  await redis.connect()
  tt.teardown(() => { redis.disconnect() })
  return redis
}

const admin = await connect(t)

let prefixes = 0
/** A limiter on its own client and key prefix, closed at the end of `tt`. */
async function newLimiter (tt: { teardown: (fn: () => unknown) => void }, options: Partial<LimiterOptions> = {}): Promise<Limiter> {
  const redis = await connect(tt)
  // A generous deadline: these tests are about the cache, not about a slow store.
  const limiter = createLimiter({ redis, prefix: `deny${++prefixes}`, timeout: 2000, ...options })
  tt.teardown(() => limiter.close())
  return limiter
}

function policy (bucket: string, capacity: number, refillPerSecond: number, cost?: number): Policy {
  const p: Policy = { bucket, capacity, refillPerSecond, failureMode: 'closed' }
  if (cost !== undefined) p.cost = cost
  return p
}

// Load the script into this Redis once, so each store call below is one script.
await (await newLimiter(t)).consume('warm-up', policy('warm-up', 1, 1))

t.test('after a denial, the same request is denied from the cache without a Redis call', async (t) => {
  const limiter = await newLimiter(t)
  // 2 tokens, one back every 2 s: the cached denial lasts far longer than the test.
  const p = policy('api', 2, 0.5)
  t.ok((await limiter.consume('c', p)).allowed)
  t.ok((await limiter.consume('c', p)).allowed)
  const denied = await limiter.consume('c', p)
  t.match(denied, { allowed: false, source: 'store', remaining: 0, limit: 2, bucket: 'api' }, 'Redis denies the third')
  t.ok(denied.retryAfterMs > 1900 && denied.retryAfterMs <= 2000, `retry after ${denied.retryAfterMs} ms (one token, 2 s)`)

  const before = await scriptCalls(admin)
  let previous = denied
  for (let i = 0; i < 20; i++) {
    const cached = await limiter.consume('c', p)
    t.match(cached, { allowed: false, source: 'cache', remaining: 0, limit: 2, bucket: 'api' }, `repeat ${i + 1}: denied from the cache`)
    // Shifted to now: the wait and the time until full only count down.
    t.ok(cached.retryAfterMs > 0 && cached.retryAfterMs <= previous.retryAfterMs, `retryAfterMs counts down (${cached.retryAfterMs})`)
    t.ok(cached.resetMs <= previous.resetMs, 'and so does resetMs')
    previous = cached
  }
  t.equal(await scriptCalls(admin) - before, 0, '20 denials, no Redis call')
  t.equal((await limiter.peek('c', p)).source, 'store', 'a peek is not cached: it asks Redis')
})

t.test('never longer than Redis would deny: once retryAfterMs has passed, Redis is asked and allows', async (t) => {
  const limiter = await newLimiter(t)
  // 1 token, back after 100 ms: longer than two calls in a row take, even on a busy machine.
  const p = policy('api', 1, 10)
  t.ok((await limiter.consume('c', p)).allowed)
  for (let round = 1; round <= 3; round++) {
    const denied = await limiter.consume('c', p)
    const receivedAt = performance.now()
    t.match(denied, { allowed: false, source: 'store' }, `round ${round}: Redis denies`)
    t.match(await limiter.consume('c', p), { allowed: false, source: 'cache' }, 'then the cache')
    // The script ran before its reply came back, so Redis has the token by
    // receivedAt + retryAfterMs; 2 ms for the timer's rounding. The cache,
    // which counts from when the call was sent, has let go by then.
    await sleep(Math.max(0, receivedAt + denied.retryAfterMs + 2 - performance.now()))
    t.match(await limiter.consume('c', p), { allowed: true, source: 'store' }, 'after the wait: Redis is asked, and allows')
  }
})

t.test('random costs and gaps: a cached denial is one Redis would give as well', async (t) => {
  // What the cache promises: while it denies a request, Redis would deny it
  // too. Checked after every cached denial with a peek (which Redis
  // decides, and which writes nothing), whenever the peek's reply is back
  // before the cached denial's own end: Redis ran the peek before that
  // moment, and must have denied it.
  //
  // That end is counted from `before`, read before the consume: the cache
  // read its clock after that, so its end is no earlier than before +
  // retryAfterMs. (Counted from a reading taken once the consume had
  // returned, the end claimed is later than the cache's by however long
  // this process stalled in between, a GC pause or the scheduler: Redis
  // then rightly allows the peek. That failed a full run once, by 1.6 ms.)
  //
  // The cache counts on the monotonic clock, Redis on its wall clock
  // (TIME): a step forward of Redis's clock between the denial and the peek
  // makes Redis allow that much sooner, and the cache denies up to that
  // much longer than Redis would (docs/design/algorithm.md, "When Redis's clock steps"). So the test
  // measures the two clocks against each other (TIME on its own connection,
  // between two performance.now() readings) before every consume and after
  // a peek Redis allowed, and excuses a check only by a step it measured:
  // the least the offset between the clocks can have grown from the
  // reading before the store's denial to the one after the peek. On a
  // steady clock that is never above 0, and nothing is excused.
  const random = randomSource(seed)
  const limiter = await newLimiter(t)
  const costs = [1, 2, 3]
  const byCost = new Map(costs.map((cost) => [cost, policy('api', 5, 100, cost)]))
  /** Redis's clock minus performance.now(), ms: at least `lo`, at most `hi`. */
  const offset = async (): Promise<{ lo: number, hi: number }> => {
    const sent = performance.now()
    const [seconds, micros] = await admin.time()
    const back = performance.now()
    const redisMs = Number(seconds) * 1000 + Number(micros) / 1000
    return { lo: redisMs - back, hi: redisMs - sent }
  }
  let cached = 0
  let checked = 0
  let lowest = Infinity
  let highest = -Infinity
  let denialClock = await offset()
  const excused: string[] = []
  const problems: string[] = []
  for (let step = 0; step < 400; step++) {
    if (random() < 0.5) await sleep(random() * 15)
    const cost = costs[Math.floor(random() * costs.length)] as number
    const p = byCost.get(cost) as Policy
    const clock = await offset()
    lowest = Math.min(lowest, clock.hi)
    highest = Math.max(highest, clock.lo)
    const before = performance.now()
    const decision = await limiter.consume('c', p)
    if (decision.source === 'store' && !decision.allowed) denialClock = clock
    if (decision.source !== 'cache') continue
    cached++
    if (decision.allowed || !(decision.retryAfterMs > 0)) problems.push(`step ${step}: a cached decision ${JSON.stringify(decision)}`)
    const peek = await limiter.peek('c', p)
    const back = performance.now()
    const end = before + decision.retryAfterMs
    if (back >= end) continue
    checked++
    if (!peek.allowed) continue
    const after = await offset()
    const stepMs = after.lo - denialClock.hi
    const early = `step ${step}: cost ${cost} denied from the cache until ${(end - back).toFixed(3)} ms after Redis's reply, but Redis allows it`
    if (stepMs >= end - back) excused.push(`${early}; Redis's clock stepped ahead of performance.now() by at least ${stepMs.toFixed(3)} ms`)
    else problems.push(`${early} (Redis's clock moved by ${stepMs.toFixed(3)} ms against performance.now())`)
  }
  t.comment(`${cached} cached denials, ${checked} checked against Redis; Redis's clock minus performance.now() spread over ${(highest - lowest).toFixed(3)} ms in the run (0 or less: no step measured); ${excused.length} excused by a measured step`)
  for (const line of excused.slice(0, 5)) t.comment(line)
  t.same(problems.slice(0, 5), [], `no cached denial Redis would not give (${problems.length} found)`)
  t.ok(checked >= 20, `enough cached denials checked (${checked})`)
})

t.test('a cheaper request is not held back by the cached denial of a dearer one', async (t) => {
  const limiter = await newLimiter(t)
  // 10 tokens, one back every 10 s: no refill to speak of during the test.
  const p = policy('api', 10, 0.1)
  t.ok((await limiter.consume('c', p, 8)).allowed, '8 of 10 spent')
  t.match(await limiter.consume('c', p, 5), { allowed: false, source: 'store' }, 'cost 5 with 2 left: Redis denies')
  t.match(await limiter.consume('c', p, 5), { allowed: false, source: 'cache' }, 'cost 5 again: the cache')
  t.match(await limiter.consume('c', p, 6), { allowed: false, source: 'cache' }, 'cost 6: dearer still, the cache')
  const before = await scriptCalls(admin)
  t.match(await limiter.consume('c', p, 2), { allowed: true, source: 'store', remaining: 0 }, 'cost 2: Redis is asked and allows')
  t.equal(await scriptCalls(admin) - before, 1, 'one call')
  t.match(await limiter.consume('c', p, 1), { allowed: false, source: 'store' }, 'cost 1 with nothing left: Redis denies')
  t.match(await limiter.consume('c', p, 1), { allowed: false, source: 'cache' }, 'and now cost 1 is cached')
})

t.test('routes sharing a bucket under other policies: a denial under one never answers the other', async (t) => {
  // Three routes name one bucket. Refill 0.01/s: a token every 100 s, so
  // nothing refills during the test. /slow has /small's capacity but a
  // tenth of its refill, so the same stored state holds more tokens under it.
  const { app } = await buildApp(t, {
    plugin: { redis: await connect(t), capacity: 100, refillPerSecond: 0.01, timeout: 2000 },
    routes: (app) => {
      app.get('/small', { config: { rateLimit: { bucket: 'shared', capacity: 2 } } }, async () => 'small')
      app.get('/large', { config: { rateLimit: { bucket: 'shared' } } }, async () => 'large')
      app.get('/slow', { config: { rateLimit: { bucket: 'shared', capacity: 2, refillPerSecond: 0.001 } } }, async () => 'slow')
    }
  })
  const get = async (url: string): Promise<[number, string | undefined, string | undefined, number]> => {
    const before = await scriptCalls(admin)
    const res = await app.inject(url)
    const limit = res.headers['ratelimit-limit'] as string | undefined
    const remaining = res.headers['ratelimit-remaining'] as string | undefined
    return [res.statusCode, limit, remaining, await scriptCalls(admin) - before]
  }
  t.same(await get('/small'), [200, '2', '1', 1])
  t.same(await get('/small'), [200, '2', '0', 1])
  t.same(await get('/small'), [429, '2', '0', 1], '/small: Redis denies the third')
  t.same(await get('/small'), [429, '2', '0', 0], '/small again: denied from the cache, no Redis call')
  // 2 tokens spent of 100: Redis allows /large, and so must tollgate.
  t.same(await get('/large'), [200, '100', '97', 1], '/large (capacity 100): asked of Redis, which allows it')
  // 3 tokens spent is 300 s of refill at 0.01/s; at 0.001/s that is 0.3
  // token: under /slow's policy the bucket holds 1.7.
  t.same(await get('/slow'), [200, '2', '0', 1], '/slow (same capacity, slower refill): asked of Redis, which allows it')
  t.same(await get('/small'), [429, '2', '0', 0], '/small: its own cached denial still answers it')
})

t.test('a cached denial answers only the same buckets under the same policies', async (t) => {
  const cache = new DenialCache(10)
  const denied = await (async () => {
    const limiter = await newLimiter(t)
    const p = policy('api', 1, 0.1)
    await limiter.consume('c', p)
    return await limiter.consume('c', p)
  })()
  const spec = (key: string, capacity = 1, refillPerSecond = 0.1, cost = 1): BucketSpec => ({ key, capacity, refillPerSecond, cost })
  cache.set('k', [spec('k')], denied, performance.now())
  t.ok(cache.get('k', [spec('k')]), 'the same request: answered')
  t.ok(cache.get('k', [spec('k', 1, 0.1, 2)]), 'a dearer one: answered')
  t.notOk(cache.get('k', [spec('k', 1, 0.1, 0.5)]), 'a cheaper one: not answered')
  t.notOk(cache.get('k', [spec('k', 2)]), 'another capacity: not answered')
  t.notOk(cache.get('k', [spec('k', 0.5, 0.1, 0.5)]), 'a smaller capacity, even with its whole capacity as cost: not answered')
  t.notOk(cache.get('k', [spec('k', 1, 0.2)]), 'another refill: not answered')
  // Bucket names may hold '\n', so two key lists can join to one id.
  cache.set('a\nb\nc', [spec('a\nb'), spec('c')], denied, performance.now())
  t.ok(cache.get('a\nb\nc', [spec('a\nb'), spec('c')]), 'the same keys: answered')
  t.notOk(cache.get('a\nb\nc', [spec('a'), spec('b\nc')]), 'other keys with the same id: not answered')
  t.notOk(cache.get('a\nb\nc', [spec('a'), spec('b'), spec('c')]), 'more keys with the same id: not answered')
})

t.test('several policies: denials are cached by the set of buckets', async (t) => {
  const limiter = await newLimiter(t)
  const a = policy('a', 1, 0.1)
  const b = policy('b', 10, 0.1)
  t.ok((await limiter.consume('c', a)).allowed, 'a: its only token spent')
  const denied = await limiter.consume('c', [a, b])
  t.match(denied, { allowed: false, source: 'store', bucket: 'a' }, '[a, b]: Redis denies, because of a')
  t.equal(denied.policies?.length, 2)
  const cached = await limiter.consume('c', [a, b])
  t.match(cached, { allowed: false, source: 'cache', bucket: 'a' }, '[a, b] again: the cache')
  t.same(cached.policies?.map((d) => [d.bucket, d.allowed, d.source]), [['a', false, 'cache'], ['b', true, 'cache']],
    'with each policy\'s decision, shifted and marked as cached')

  const before = await scriptCalls(admin)
  t.match(await limiter.consume('c', b), { allowed: true, source: 'store' }, 'b alone is another key set: Redis allows it')
  t.match(await limiter.consume('c', a), { allowed: false, source: 'store' }, 'a alone is another key set: Redis is asked')
  t.match(await limiter.consume('c', [b, a]), { allowed: false, source: 'store' }, '[b, a] is another key set too')
  t.equal(await scriptCalls(admin) - before, 3, 'three calls')
  t.match(await limiter.consume('c', a), { allowed: false, source: 'cache' }, 'a alone now has its own cached denial')
  t.match(await limiter.consume('c', [a, b]), { allowed: false, source: 'cache' }, 'and [a, b] still has its own')
})

t.test('maxKeys caps the entries; the oldest denial goes first', async (t) => {
  const limiter = await newLimiter(t, { denialCache: { maxKeys: 3 } })
  const p = policy('api', 1, 0.1)
  const clients = ['c1', 'c2', 'c3', 'c4', 'c5']
  for (const client of clients) {
    t.ok((await limiter.consume(client, p)).allowed)
    t.equal((await limiter.consume(client, p)).source, 'store', `${client}: denied by Redis, cached`)
  }
  const sourceOf = async (client: string): Promise<string> => (await limiter.consume(client, p)).source
  t.same([await sourceOf('c3'), await sourceOf('c4'), await sourceOf('c5')], ['cache', 'cache', 'cache'], 'the last 3 denials are cached')
  const before = await scriptCalls(admin)
  t.equal(await sourceOf('c1'), 'store', 'c1 was dropped: Redis is asked (and its denial is cached again, dropping c3)')
  t.equal(await sourceOf('c2'), 'store', 'c2 as well (dropping c4)')
  t.equal(await scriptCalls(admin) - before, 2)
  t.same([await sourceOf('c5'), await sourceOf('c1'), await sourceOf('c2')], ['cache', 'cache', 'cache'], 'c5, c1, c2 are the 3 kept')
  t.equal(await sourceOf('c3'), 'store', 'c3 was dropped')

  // The cache itself, fed with the limiter's real denials: never above its cap.
  const cache = new DenialCache(4)
  const sizes: number[] = []
  for (let i = 0; i < 12; i++) {
    const key = `k${i}`
    const spec = { key, capacity: 1, refillPerSecond: 0.1, cost: 1 }
    cache.set(key, [spec], await limiter.consume(clients[i % clients.length] as string, p), performance.now())
    sizes.push(cache.size)
  }
  t.same(sizes, [1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4], 'size: at most maxKeys')
  const spec = (key: string): Array<{ key: string, capacity: number, refillPerSecond: number, cost: number }> => [{ key, capacity: 1, refillPerSecond: 0.1, cost: 1 }]
  t.same(['k7', 'k8', 'k9', 'k10', 'k11'].map((key) => cache.get(key, spec(key)) !== undefined), [false, true, true, true, true],
    'the 4 most recent are the ones kept')
})

t.test('denialCache: false sends every request to Redis', async (t) => {
  const limiter = await newLimiter(t, { denialCache: false })
  const p = policy('api', 1, 0.1)
  t.ok((await limiter.consume('c', p)).allowed)
  const before = await scriptCalls(admin)
  const sources: string[] = []
  for (let i = 0; i < 10; i++) {
    const decision: Decision = await limiter.consume('c', p)
    t.notOk(decision.allowed)
    sources.push(decision.source)
  }
  t.same(sources, Array(10).fill('store'), 'every denial comes from Redis')
  t.equal(await scriptCalls(admin) - before, 10, 'ten calls')
})

t.test('reset() clears the denials of the bucket', async (t) => {
  const limiter = await newLimiter(t)
  const a = policy('a', 1, 0.1)
  const b = policy('b', 1, 0.1)
  t.ok((await limiter.consume('c', a)).allowed)
  t.equal((await limiter.consume('c', a)).source, 'store')
  t.equal((await limiter.consume('c', a)).source, 'cache', 'a: denial cached')
  t.ok((await limiter.consume('c', b)).allowed)
  t.equal((await limiter.consume('c', [a, b])).source, 'store')
  t.equal((await limiter.consume('c', [a, b])).source, 'cache', '[a, b]: denial cached')

  await limiter.reset('c', 'a')
  t.match(await limiter.consume('c', a), { allowed: true, source: 'store' }, 'a after reset: Redis is asked, and allows')
  t.match(await limiter.consume('c', [a, b]), { allowed: false, source: 'store' }, '[a, b] after reset of a: its cached denial is gone too')

  // Another client's denials stay.
  t.ok((await limiter.consume('other', a)).allowed)
  t.equal((await limiter.consume('other', a)).source, 'store')
  await limiter.reset('c', 'b')
  t.equal((await limiter.consume('other', a)).source, 'cache', 'a reset of one client leaves another\'s denial cached')
})

t.test('reset() clears multi-bucket denials whatever the bucket names', async (t) => {
  const limiter = await newLimiter(t)
  // A bucket name is any non-empty string; this one holds a newline.
  const a = policy('line\nbreak', 1, 0.1)
  const b = policy('b', 10, 0.1)
  t.ok((await limiter.consume('c', a)).allowed)
  t.equal((await limiter.consume('c', [a, b])).source, 'store')
  t.equal((await limiter.consume('c', [a, b])).source, 'cache', '[a, b]: denial cached')
  await limiter.reset('c', 'line\nbreak')
  t.match(await limiter.consume('c', [a, b]), { allowed: true, source: 'store' }, 'after reset of a, [a, b] is asked of Redis and allowed')
})

// Changes made elsewhere (lib/core/invalidation.ts): a reset or refund made by
// another limiter of the same prefix, on its own client, reaches this
// limiter's cache by a message; when a message cannot arrive, no denial is
// trusted longer than `maxAgeMs` after its call.

/** A denial that would hold for an hour: one token an hour, spent. */
const hourly = policy('hourly', 1, 1 / 3600)

interface Logged { level: string, msg: string }
function logger (): { lines: Logged[], warn: (o: object, msg: string) => void, info: (o: object, msg: string) => void, error: (o: object, msg: string) => void } {
  const lines: Logged[] = []
  return {
    lines,
    warn: (_o, msg) => { lines.push({ level: 'warn', msg }) },
    info: (_o, msg) => { lines.push({ level: 'info', msg }) },
    error: (_o, msg) => { lines.push({ level: 'error', msg }) }
  }
}

/** Subscriptions to the changes of `prefix` (PUBSUB NUMSUB). */
async function subscribed (prefix: string): Promise<number> {
  return (await admin.pubsub('NUMSUB', `${prefix}:changes`) as [string, number])[1]
}

/** Our subscriber connections on the test's Redis, or on `on` (CLIENT LIST, by name). */
async function subscribers (on: Redis = admin): Promise<number> {
  const list = await on.client('LIST') as string
  return list.split('\n').filter((line) => line.includes(`name=${SUBSCRIBER_NAME} `)).length
}

async function until (what: () => Promise<boolean>, ms: number): Promise<boolean> {
  const end = performance.now() + ms
  while (performance.now() < end) {
    if (await what()) return true
    await sleep(5)
  }
  return false
}

/** Until `limiter` has a cached denial of `p` for client c (spends its token first). */
async function deniedInCache (t: { match: (a: unknown, b: unknown, m: string) => void }, limiter: Limiter, p: Policy, label: string): Promise<void> {
  await limiter.consume('c', p)
  t.match(await limiter.consume('c', p), { allowed: false, source: 'store' }, `${label}: Redis denies`)
  t.match(await limiter.consume('c', p), { allowed: false, source: 'cache' }, `${label}: and the denial is cached`)
}

t.test('maxAgeMs caps how long a denial is trusted, whatever wait Redis named', async (t) => {
  const limiter = await newLimiter(t, { denialCache: { maxAgeMs: 300 } })
  t.ok((await limiter.consume('c', hourly)).allowed)
  const sent = performance.now()
  const denied = await limiter.consume('c', hourly)
  const received = performance.now()
  t.ok(denied.retryAfterMs > 3_500_000, `Redis says an hour (${Math.round(denied.retryAfterMs / 1000)} s)`)
  const before = await scriptCalls(admin)
  const early = await limiter.consume('c', hourly)
  t.match(early, { allowed: false, source: 'cache' }, 'right after: the cache')
  t.ok(early.retryAfterMs > 3_500_000, 'with the wait Redis named, counted down (Retry-After stays honest)')
  t.ok(performance.now() - sent < 300, 'that was within maxAgeMs of the call')
  // The cache trusts the denial until its call was sent + 300 ms; sent <= received.
  await sleep(Math.max(0, received + 300 + 2 - performance.now()))
  t.match(await limiter.consume('c', hourly), { allowed: false, source: 'store' }, 'after maxAgeMs: Redis is asked again')
  t.equal(await scriptCalls(admin) - before, 1, 'one call')
  t.match(await limiter.consume('c', hourly), { allowed: false, source: 'cache' }, 'and that denial is cached in turn')
})

t.test('by default a denial is trusted for at most 1000 ms', async (t) => {
  const limiter = await newLimiter(t)
  t.ok((await limiter.consume('c', hourly)).allowed)
  await limiter.consume('c', hourly)
  const received = performance.now()
  t.equal((await limiter.consume('c', hourly)).source, 'cache')
  await sleep(Math.max(0, received + 1000 + 2 - performance.now()))
  t.equal((await limiter.consume('c', hourly)).source, 'store', 'after 1000 ms Redis is asked again')
})

t.test('a reset made by another limiter reaches this one\'s cache by a message, not by maxAgeMs', async (t) => {
  const prefix = `deny${++prefixes}`
  const a = await newLimiter(t, { prefix })
  const b = await newLimiter(t, { prefix, denialCache: { maxAgeMs: 60_000 } })
  t.ok(await until(async () => await subscribed(prefix) === 2, 2000), 'both limiters subscribed')
  await deniedInCache(t, b, hourly, 'b')
  await a.reset('c', 'hourly')
  const at = performance.now()
  t.ok(await until(async () => (await b.consume('c', hourly)).allowed, 500), 'b asks Redis, which allows')
  t.comment(`b allowed ${(performance.now() - at).toFixed(1)} ms after a's reset resolved`)
})

t.test('a refund made by another limiter reaches this one\'s cache', async (t) => {
  const prefix = `deny${++prefixes}`
  const a = await newLimiter(t, { prefix })
  const b = await newLimiter(t, { prefix, denialCache: { maxAgeMs: 60_000 } })
  t.ok(await until(async () => await subscribed(prefix) === 2, 2000), 'both limiters subscribed')
  const reservation = await a.reserve('c', hourly)
  t.ok(reservation.decision.allowed, 'a reserves the only token')
  t.match(await b.consume('c', hourly), { allowed: false, source: 'store' }, 'b: denied by Redis')
  t.match(await b.consume('c', hourly), { allowed: false, source: 'cache' }, 'b: cached')
  await a.settle(reservation, 0)
  t.ok(await until(async () => (await b.consume('c', hourly)).allowed, 500), 'after a refunds it, b asks Redis, which allows')
})

t.test('a lost subscription: the reset it missed is made good when it is back, every cached denial dropped', async (t) => {
  const prefix = `deny${++prefixes}`
  const a = await newLimiter(t, { prefix })
  const b = await newLimiter(t, { prefix, denialCache: { maxAgeMs: 60_000 } })
  t.ok(await until(async () => await subscribed(prefix) === 2, 2000), 'both limiters subscribed')
  await deniedInCache(t, b, hourly, 'b')
  const other = policy('other', 1, 1 / 3600)
  await deniedInCache(t, b, other, 'b, another bucket')
  // Ends every subscriber connection; a new one is made 50 ms later at the soonest.
  t.ok(Number(await admin.client('KILL', 'TYPE', 'pubsub')) >= 2, 'both subscriptions killed')
  await a.reset('c', 'hourly')
  t.match(await b.consume('c', hourly), { allowed: false, source: 'cache' }, 'b missed the message: its cached denial still answers')
  t.ok(await until(async () => (await b.consume('c', hourly)).allowed, 2000), 'once b is subscribed again, it asks Redis, which allows')
  t.match(await b.consume('c', other), { allowed: false, source: 'store' }, 'its other cached denials were dropped too')
})

t.test('Redis refusing pub/sub (an ACL without channels): logged once, and maxAgeMs bounds what is missed', async (t) => {
  await admin.acl('SETUSER', 'nochannels', 'on', 'nopass', '~*', 'resetchannels', '+@all')
  t.teardown(() => admin.acl('DELUSER', 'nochannels'))
  const prefix = `deny${++prefixes}`
  const a = await newLimiter(t, { prefix })
  const log = logger()
  const limited = new Redis(server.url, { username: 'nochannels', password: 'x' })
  t.teardown(() => { limited.disconnect() })
  const b = createLimiter({ redis: limited, prefix, timeout: 2000, logger: log, denialCache: { maxAgeMs: 300 } })
  t.teardown(() => b.close())
  t.ok(await until(async () => log.lines.length > 0, 2000), 'b logs')
  t.match(log.lines, [{ level: 'warn', msg: /could not subscribe to the resets and refunds of other app servers/ }])
  await deniedInCache(t, b, hourly, 'b')
  const received = performance.now()
  await a.reset('c', 'hourly')
  t.match(await b.consume('c', hourly), { allowed: false, source: 'cache' }, 'b hears nothing of the reset')
  await sleep(Math.max(0, received + 300 + 2 - performance.now()))
  t.match(await b.consume('c', hourly), { allowed: true, source: 'store' }, 'after maxAgeMs b asks Redis, which allows')
  await b.reset('c', 'hourly')
  await b.reset('c', 'hourly')
  await sleep(200) // b keeps trying to subscribe, 50 ms then 100 ms apart
  t.same(log.lines.map((l) => l.msg.replace(/;.*/, '')), [
    'tollgate: could not subscribe to the resets and refunds of other app servers',
    'tollgate: the other app servers may not have been told of a reset or refund (PUBLISH failed or missed its deadline)'
  ], 'one line for the refused subscription, one for the refused publishes, however often they are tried')
})

t.test('the subscriber is tollgate\'s own connection: closed by close(), or when the app\'s client ends; the app\'s client is never touched', async (t) => {
  // A Redis of its own, which no other limiter of this file reaches: the
  // counts below are this test's connections only.
  const own = await startRedisServer()
  t.teardown(() => own.stop())
  const watcher = await connectTo(t, own.url)
  const count = async (): Promise<number> => await subscribers(watcher)
  const before = 0
  t.equal(await count(), before, 'none yet')
  const redis = new Redis(own.url)
  const listeners = (): number => redis.listenerCount('end')
  const ends = listeners()
  const limiter = createLimiter({ redis, prefix: `deny${++prefixes}` })
  t.ok(await until(async () => await count() === before + 1, 2000), 'one subscriber connection, named in CLIENT LIST')
  t.equal(redis.mode, 'normal', 'the app\'s client is not in subscriber mode')
  await limiter.close()
  t.ok(await until(async () => await count() === before, 2000), 'close() closes it')
  t.equal(redis.status, 'ready', 'and leaves the app\'s client connected')
  t.equal(listeners(), ends, 'with no listener left on it')
  t.equal(await redis.ping(), 'PONG')

  const kept = createLimiter({ redis, prefix: `deny${++prefixes}` })
  t.teardown(() => kept.close())
  t.ok(await until(async () => await count() === before + 1, 2000), 'another limiter, another subscriber')
  redis.disconnect()
  t.ok(await until(async () => await count() === before, 2000), 'the app lets its client go: the subscriber goes too')
  const ended = createLimiter({ redis, prefix: `deny${++prefixes}` })
  await sleep(100)
  t.equal(await count(), before, 'a limiter made on an ended client opens none')
  await ended.close()
})

t.test('without Redis: no cache, no connection of its own; reset() resets the in-process bucket', async (t) => {
  const before = await subscribers()
  const limiter = createLimiter()
  t.teardown(() => limiter.close())
  t.ok((await limiter.consume('c', hourly)).allowed)
  t.match(await limiter.consume('c', hourly), { allowed: false, source: 'store' })
  t.match(await limiter.consume('c', hourly), { allowed: false, source: 'store' }, 'every decision by the in-process store')
  await limiter.reset('c', 'hourly')
  t.ok((await limiter.consume('c', hourly)).allowed, 'reset')
  t.equal(await subscribers(), before, 'no subscriber')
})

t.test('messages on the channel that are not tollgate\'s are ignored', async (t) => {
  const prefix = `deny${++prefixes}`
  const limiter = await newLimiter(t, { prefix, denialCache: { maxAgeMs: 60_000 } })
  t.ok(await until(async () => await subscribed(prefix) === 1, 2000))
  await deniedInCache(t, limiter, hourly, 'cached')
  for (const message of ['not json', 'null', '7', '{"reset":"c"}', '{"reset":[]}', '{"refund":[1]}', '{"other":["x"]}']) {
    await admin.publish(`${prefix}:changes`, message)
  }
  await sleep(20)
  t.match(await limiter.consume('c', hourly), { allowed: false, source: 'cache' }, 'the cached denial stands')
})

t.test('closed while its subscription is on its way: nothing is logged, nothing is reconnected', async (t) => {
  // The subscriber is caught as it is made (the client's own duplicate(),
  // wrapped), and the limiter closed once it is ready, with its SUBSCRIBE
  // sent and unanswered.
  const redis = await connect(t)
  const made: Redis[] = []
  const duplicate = redis.duplicate.bind(redis)
  redis.duplicate = (override) => {
    const sub = duplicate(override)
    made.push(sub)
    return sub
  }
  const log = logger()
  const limiter = createLimiter({ redis, prefix: `deny${++prefixes}`, logger: log })
  const sub = made[0] as Redis
  await new Promise<void>((resolve) => { sub.once('ready', () => { void limiter.close().then(resolve) }) })
  await sleep(200)
  t.equal(made.length, 1, 'no other connection made')
  t.equal(sub.status, 'end', 'the subscriber is closed')
  t.same(log.lines, [], 'and nothing logged')
})

t.test('a reply to a call sent before a reset or refund was learnt is not cached', async (t) => {
  const cache = new DenialCache(10, 60_000)
  const limiter = await newLimiter(t)
  await limiter.consume('c', hourly)
  const denied = await limiter.consume('c', hourly)
  const spec = (key: string): BucketSpec[] => [{ key, capacity: 1, refillPerSecond: 1 / 3600, cost: 1 }]
  const sent = performance.now()
  cache.reset('k', sent + 1)
  cache.set('k', spec('k'), denied, sent)
  t.notOk(cache.get('k', spec('k')), 'sent before the reset was learnt: not cached')
  cache.set('k', spec('k'), denied, sent + 2)
  t.ok(cache.get('k', spec('k')), 'sent after: cached')
  cache.refunded(['a', 'b'], sent + 3)
  cache.set('a\nb', [...spec('a'), ...spec('b')], denied, sent + 2)
  t.notOk(cache.get('a\nb', [...spec('a'), ...spec('b')]), 'a set of buckets, one of them refunded after the call was sent: not cached')
  cache.distrust(sent + 10)
  t.notOk(cache.get('k', spec('k')), 'distrust() drops every denial')
  cache.set('z', spec('z'), denied, sent + 9)
  t.notOk(cache.get('z', spec('z')), 'and keeps out the replies to calls sent before it')
})

t.test('Marks: size-capped; a mark dropped by the cap becomes the floor, so nothing stale gets in', async (t) => {
  const marks = new Marks(2)
  marks.mark('a', 10)
  marks.mark('b', 20)
  marks.mark('a', 30)
  t.equal(marks.size, 2)
  t.same([marks.stale('a', 25), marks.stale('a', 31), marks.stale('b', 20), marks.stale('x', 5)], [true, false, true, false])
  marks.mark('c', 40)
  t.equal(marks.size, 2, 'at the cap, the oldest mark (b at 20) goes')
  t.same([marks.stale('b', 20), marks.stale('x', 20), marks.stale('x', 21), marks.stale('c', 40)], [true, true, false, true], 'and becomes the floor')
  marks.markAll(15)
  t.ok(marks.stale('x', 20), 'a lower floor changes nothing')
  marks.markAll(50)
  t.same([marks.stale('x', 50), marks.stale('x', 51)], [true, false], 'markAll raises it')
  marks.mark('d', 60)
  t.same([marks.stale('x', 51), marks.stale('a', 51), marks.stale('d', 55)], [false, false, true], 'a mark below the floor (a at 30) goes without lowering it')
})

t.test('every limiter closed above left no subscriber behind: only the warm-up limiter\'s is connected', async (t) => {
  t.ok(await until(async () => await subscribers() === 1, 2000), `${await subscribers()} subscriber connection(s) on this file's Redis`)
})
