// OpenTelemetry metrics, read back through the real SDK (@opentelemetry/
// sdk-metrics, a MetricReader collected on demand) from limiters on a real
// Redis: decisions by bucket, outcome and source; fallbacks; store call
// durations by outcome; the breaker's state and transitions through a
// frozen redis-server (SIGSTOP). Every exported value is checked exactly,
// except durations, which are bounded below by the deadline they waited.
//
// Deadline: TIMEOUT_MS = 250, one a live Redis meets even on this busy
// 2-core machine (as in test/breaker.test.ts), so that the only timeouts
// are the ones the freeze causes and the counts stay exact.

import { readdir, readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Meter } from '@opentelemetry/api'
import { MeterProvider, MetricReader, type CollectionResult } from '@opentelemetry/sdk-metrics'
import Fastify from 'fastify'
import t from 'tap'
import tollgate, { createLimiter, type Decision, type MetricsMeter, type Policy } from '../lib/index.js'
import { DURATION_BOUNDARIES_MS, Metrics } from '../lib/core/metrics.js'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { faultClient, ownServer } from './helpers/load.js'
import { ROOT } from './helpers/readme.js'
import type { TeardownTarget } from './helpers/redis.js'
import { keyUnder } from './helpers/keys.js'

/** Keys named with no read from Redis: every store call these tests count is a decision's. */
const KEY_SECRET = 'metrics tests key secret'

const TIMEOUT_MS = 250
const COOLDOWN_MS = 500

/** A reader collected by the test itself (no exporter, no timer). */
class Reader extends MetricReader {
  protected override async onShutdown (): Promise<void> {}
  protected override async onForceFlush (): Promise<void> {}
}

interface HistogramPoint { count: number, sum: number, min: number, boundaries: number[] }
type Point = number | HistogramPoint
/** Instrument name -> attributes ("k=v,k=v", sorted) -> value. */
type Snapshot = Record<string, Record<string, Point>>

function flatten (result: CollectionResult): Snapshot {
  const out: Snapshot = {}
  for (const scope of result.resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      const points: Record<string, Point> = {}
      for (const point of metric.dataPoints) {
        const key = Object.entries(point.attributes).map(([k, v]) => `${k}=${String(v)}`).sort().join(',')
        const value = point.value
        points[key] = typeof value === 'number'
          ? value
          : { count: value.count, sum: value.sum ?? NaN, min: value.min ?? NaN, boundaries: 'buckets' in value ? value.buckets.boundaries : [] }
      }
      out[metric.descriptor.name] = points
    }
  }
  return out
}

/** A Meter of a fresh MeterProvider, and what it has recorded so far (cumulative). */
function sdkMeter (t: TeardownTarget): { meter: MetricsMeter, read: () => Promise<Snapshot> } {
  const reader = new Reader()
  const provider = new MeterProvider({ readers: [reader] })
  t.teardown(() => provider.shutdown())
  return {
    meter: provider.getMeter('tollgate-test'),
    read: async () => {
      const result = await reader.collect()
      if (result.errors.length > 0) throw new AggregateError(result.errors)
      return flatten(result)
    }
  }
}

const histogram = (points: Record<string, Point> | undefined, key: string): HistogramPoint => points?.[key] as HistogramPoint

const CLOSED_ONLY = { 'state=closed': 1, 'state=half-open': 0, 'state=open': 0 }

t.test('a bad `metrics` option is a coded TypeError, on the limiter and the plugin', async (t) => {
  const { meter } = sdkMeter(t)
  const cases: Array<[unknown, RegExp]> = [
    [true, /^tollgate: `metrics` must be an object \{ meter \}, got true$/],
    [{}, /^tollgate: `metrics\.meter` must be an OpenTelemetry Meter, got undefined$/],
    [{ meter: {} }, /^tollgate: `metrics\.meter` must be an OpenTelemetry Meter \(with createCounter, createUpDownCounter, createHistogram\), got \{\}$/],
    [{ meter: { createCounter () {}, createHistogram () {} } }, /`metrics\.meter` must be an OpenTelemetry Meter/],
    [{ meter, prefix: 'x' }, /^tollgate: unknown option `metrics\.prefix`/]
  ]
  for (const [metrics, message] of cases) {
    t.throws(() => createLimiter({ metrics } as never), { code: 'TOLLGATE_INVALID_OPTION', name: 'TypeError', message }, `limiter: ${String(message)}`)
    const app = Fastify()
    await t.rejects(async () => { await app.register(tollgate, { failureMode: 'open', metrics } as never) }, { code: 'TOLLGATE_INVALID_OPTION', message }, `plugin: ${String(message)}`)
    await app.close()
  }
})

t.test('store decisions: allowed, denied by Redis, denied from the cache; one duration per store call', async (t) => {
  const redis = await sharedRedis(t)
  const { meter, read } = sdkMeter(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: TIMEOUT_MS, metrics: { meter }, keySecret: KEY_SECRET })
  t.teardown(() => limiter.close())
  const login: Policy = { bucket: 'login', capacity: 2, refillPerSecond: 0.001, failureMode: 'open' }
  const search: Policy = { bucket: 'search', capacity: 5, refillPerSecond: 0.001, failureMode: 'open' }

  const sources: string[] = []
  for (let i = 0; i < 4; i++) {
    // Two clients, so the count also shows client keys are not attributes.
    const decision = await limiter.consume(i % 2 === 0 ? 'alice' : 'bob', login)
    sources.push(`${decision.allowed ? 'allowed' : 'denied'} ${decision.source}`)
  }
  const third = await limiter.consume('alice', login)
  sources.push(`${third.allowed ? 'allowed' : 'denied'} ${third.source}`)
  await limiter.consume('alice', [search, login]) // denied by login, the binding bucket
  await limiter.peek('carol', search)
  t.same(sources, ['allowed store', 'allowed store', 'allowed store', 'allowed store', 'denied store'])

  const snapshot = await read()
  t.same(snapshot['tollgate.decisions'], {
    'bucket=login,outcome=allowed,source=store': 4,
    'bucket=login,outcome=denied,source=store': 2,
    'bucket=search,outcome=allowed,source=store': 1
  }, 'by bucket, outcome and source; a multi-policy decision under its binding bucket')
  t.equal(snapshot['tollgate.fallbacks'], undefined, 'no fallback')
  const ok = histogram(snapshot['tollgate.store.duration'], 'outcome=ok')
  t.equal(ok.count, 7, 'one duration per store call')
  t.same(Object.keys(snapshot['tollgate.store.duration'] ?? {}), ['outcome=ok'])
  t.ok(ok.min > 0 && ok.min < TIMEOUT_MS, `durations within the deadline (min ${ok.min.toFixed(3)} ms)`)
  t.same(ok.boundaries, DURATION_BOUNDARIES_MS, "the histogram's buckets, as advised")
  t.same(snapshot['tollgate.breaker.state'], CLOSED_ONLY, 'one breaker, closed')
  t.equal(snapshot['tollgate.breaker.transitions'], undefined, 'no transition')

  // The denial cache: Redis said alice's login waits; the next call is not sent.
  const cached = await limiter.consume('alice', login)
  t.equal(cached.source, 'cache')
  const after = await read()
  t.equal(after['tollgate.decisions']?.['bucket=login,outcome=denied,source=cache'], 1)
  t.equal(histogram(after['tollgate.store.duration'], 'outcome=ok').count, 7, 'no store call for it')

  await limiter.close()
  t.same((await read())['tollgate.breaker.state'], { 'state=closed': 0, 'state=half-open': 0, 'state=open': 0 }, 'a closed limiter leaves the breaker count')
})

t.test('a frozen Redis: timeouts, fail-open, fail-closed and local decisions, the breaker opening, probing and closing', async (t) => {
  const server = await ownServer(t)
  const redis = faultClient(t, server.url)
  await redis.ping() // connected: a call before that fails at once
  const { meter, read } = sdkMeter(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: TIMEOUT_MS, breaker: { failures: 2, cooldownMs: COOLDOWN_MS }, metrics: { meter }, keySecret: KEY_SECRET })
  t.teardown(() => limiter.close())
  const open: Policy = { bucket: 'open', capacity: 100, refillPerSecond: 1, failureMode: 'open' }
  const closed: Policy = { bucket: 'closed', capacity: 100, refillPerSecond: 1, failureMode: 'closed' }
  const local: Policy = { bucket: 'local', capacity: 100, refillPerSecond: 1, failureMode: 'local', local: { capacity: 1, refillPerSecond: 0.001 } }
  const sources = async (...policies: Policy[]): Promise<string[]> => {
    const out: string[] = []
    for (const policy of policies) {
      const decision: Decision = await limiter.consume('alice', policy)
      out.push(decision.source)
    }
    return out
  }

  t.same(await sources(open, closed, local), ['store', 'store', 'store'], 'healthy')
  server.pause()
  t.teardown(() => server.resume())
  t.same(await sources(open, closed), ['fail-open', 'fail-closed'], 'two deadlines missed: the breaker opens')
  t.same(await sources(local, local), ['local', 'local'], 'skipped by the open breaker: local, then denied locally')
  const opened = await read()
  t.same(opened['tollgate.breaker.state'], { 'state=closed': 0, 'state=half-open': 0, 'state=open': 1 }, 'open')
  t.same(opened['tollgate.breaker.transitions'], { 'state=open': 1 })
  t.same(opened['tollgate.store.state'], { 'state=healthy': 0, 'state=failing': 1 }, 'the store is failing, as limiter.state says')

  await sleep(COOLDOWN_MS + 50)
  const probe = limiter.consume('alice', open)
  const probing = await read()
  t.same(probing['tollgate.breaker.state'], { 'state=closed': 0, 'state=half-open': 1, 'state=open': 0 }, 'half-open while its probe waits')
  t.equal((await probe).source, 'fail-open', 'the probe misses its deadline: open again')

  server.resume()
  await sleep(COOLDOWN_MS + 50)
  t.same(await sources(open), ['store'], 'the next probe closes the breaker')

  const snapshot = await read()
  t.same(snapshot['tollgate.decisions'], {
    'bucket=open,outcome=allowed,source=store': 2,
    'bucket=closed,outcome=allowed,source=store': 1,
    'bucket=local,outcome=allowed,source=store': 1,
    'bucket=open,outcome=allowed,source=fail-open': 2,
    'bucket=closed,outcome=denied,source=fail-closed': 1,
    'bucket=local,outcome=allowed,source=local': 1,
    'bucket=local,outcome=denied,source=local': 1
  })
  t.same(snapshot['tollgate.fallbacks'], {
    'bucket=open,source=fail-open': 2,
    'bucket=closed,source=fail-closed': 1,
    'bucket=local,source=local': 2
  })
  const durations = snapshot['tollgate.store.duration']
  t.same(Object.keys(durations ?? {}).sort(), ['outcome=ok', 'outcome=timeout'])
  t.equal(histogram(durations, 'outcome=ok').count, 4, 'three healthy calls and the closing probe')
  const timeout = histogram(durations, 'outcome=timeout')
  t.equal(timeout.count, 3, 'two calls and one probe timed out; the skipped calls have no duration')
  t.ok(timeout.min >= TIMEOUT_MS, `each timeout waited its deadline (min ${timeout.min.toFixed(1)} ms >= ${TIMEOUT_MS})`)
  t.same(snapshot['tollgate.breaker.state'], CLOSED_ONLY, 'closed again')
  t.same(snapshot['tollgate.breaker.transitions'], { 'state=open': 2, 'state=half-open': 2, 'state=closed': 1 })
  t.same(snapshot['tollgate.store.state'], { 'state=healthy': 1, 'state=failing': 0 }, 'healthy again')
})

t.test('a store error has its own outcome', async (t) => {
  const redis = await sharedRedis(t)
  const { meter, read } = sdkMeter(t)
  const prefix = uniquePrefix()
  const limiter = createLimiter({ redis, prefix, timeout: TIMEOUT_MS, metrics: { meter }, keySecret: KEY_SECRET })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'open' }
  // A key of the wrong type (buckets are strings): Redis answers WRONGTYPE, the call fails open.
  await redis.hset(keyUnder(KEY_SECRET, prefix, 'alice', 'b'), 'tokens', '5')
  t.equal((await limiter.consume('alice', policy)).source, 'fail-open')
  const snapshot = await read()
  t.same(Object.keys(snapshot['tollgate.store.duration'] ?? {}), ['outcome=error'])
  t.equal(histogram(snapshot['tollgate.store.duration'], 'outcome=error').count, 1)
  t.same(snapshot['tollgate.fallbacks'], { 'bucket=b,source=fail-open': 1 })
  t.same(snapshot['tollgate.breaker.state'], CLOSED_ONLY, 'a reply error proves Redis alive: the breaker stays closed')
})

t.test('the plugin: route decisions under their bucket names', async (t) => {
  const redis = await sharedRedis(t)
  const { meter, read } = sdkMeter(t)
  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, { redis, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: TIMEOUT_MS, metrics: { meter } })
  app.get('/items/:id', async () => 'ok')
  t.same([(await app.inject('/items/1')).statusCode, (await app.inject('/items/2')).statusCode], [200, 429])
  t.same((await read())['tollgate.decisions'], {
    'bucket=GET /items/:id,outcome=allowed,source=store': 1,
    'bucket=GET /items/:id,outcome=denied,source=store': 1
  }, 'the route pattern, not the URL')
  await app.close()
  t.same((await read())['tollgate.breaker.state'], { 'state=closed': 0, 'state=half-open': 0, 'state=open': 0 }, 'closing the app closes the limiter')
})

t.test('the in-process store: decisions, no breaker, no store calls', async (t) => {
  const { meter, read } = sdkMeter(t)
  const limiter = createLimiter({ metrics: { meter } })
  const policy: Policy = { bucket: 'b', capacity: 1, refillPerSecond: 0.001, failureMode: 'open' }
  await limiter.consume('k', policy)
  await limiter.consume('k', policy)
  await limiter.close()
  const snapshot = await read()
  t.same(snapshot['tollgate.decisions'], { 'bucket=b,outcome=allowed,source=store': 1, 'bucket=b,outcome=denied,source=store': 1 })
  t.equal(snapshot['tollgate.breaker.state'], undefined)
  t.equal(snapshot['tollgate.store.duration'], undefined)
})

t.test('shadow decisions carry `shadow: true`; a closed recorder ignores the breaker', async (t) => {
  const { meter, read } = sdkMeter(t)
  const metrics = new Metrics(meter, true)
  const denied: Decision = { allowed: false, limit: 1, remaining: 0, resetMs: 1000, retryAfterMs: 1000, source: 'store', bucket: 'b' }
  metrics.decided(denied, true)
  metrics.decided({ ...denied, allowed: true, retryAfterMs: 0 }, true)
  metrics.decided(denied)
  metrics.close()
  metrics.breaker('open')
  metrics.store('failing')
  metrics.close()
  const snapshot = await read()
  t.same(snapshot['tollgate.decisions'], {
    'bucket=b,outcome=denied,shadow=true,source=store': 1,
    'bucket=b,outcome=allowed,shadow=true,source=store': 1,
    'bucket=b,outcome=denied,source=store': 1
  }, 'a would-be denial is { outcome: denied, shadow: true }')
  t.same(snapshot['tollgate.breaker.state'], { 'state=closed': 0, 'state=half-open': 0, 'state=open': 0 })
  t.same(snapshot['tollgate.store.state'], { 'state=healthy': 0, 'state=failing': 0 })
  t.equal(snapshot['tollgate.breaker.transitions'], undefined)
})

t.test('a shadow policy on Redis: its would-be denial is counted as { outcome: denied, shadow: true }', async (t) => {
  const { meter, read } = sdkMeter(t)
  const redis = await sharedRedis(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000, metrics: { meter } })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'tight', capacity: 1, refillPerSecond: 0.001, failureMode: 'open', shadow: true }
  const first = await limiter.consume('client', policy)
  const second = await limiter.consume('client', policy)
  t.same([first.allowed, first.shadow, second.allowed, second.shadow], [true, undefined, true, true], 'the second is a would-be denial that passes')
  t.same((await read())['tollgate.decisions'], {
    'bucket=tight,outcome=allowed,source=store': 1,
    'bucket=tight,outcome=denied,shadow=true,source=store': 1
  })
})

/** Checked by `npm run lint` (never run): @opentelemetry/api's Meter fits the option; a provider does not. */
export function compiles (meter: Meter): void {
  createLimiter({ metrics: { meter } })
  // @ts-expect-error a Meter, not a MeterProvider
  createLimiter({ metrics: { meter: new MeterProvider() } })
  // @ts-expect-error the Meter itself is not the option
  createLimiter({ metrics: meter })
}

t.test('lib/ never imports @opentelemetry: nothing is loaded unless the user passes a Meter', async (t) => {
  const dir = join(ROOT, 'lib')
  const files = (await readdir(dir, { recursive: true })).filter((file) => file.endsWith('.ts'))
  t.ok(files.length > 20, `${files.length} files under lib/`)
  for (const file of files) {
    t.notMatch(await readFile(join(dir, file), 'utf8'), /from '@opentelemetry|import\('@opentelemetry|require\('@opentelemetry/, file)
  }
})
