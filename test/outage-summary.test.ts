// A limiter that is not limiting keeps saying so, at a bounded rate
// (docs/guides/failure-modes.md, "Logs on state changes"): while the store fails, one summary line per
// `outageSummaryMs` at most, with the decisions each failure mode made
// since the last one; the start-up warning names where the client
// connects; `limiter.state` and the metrics say 'failing' from the start.
// And the core, which has no start-up, never stays silent either: it
// connects a `lazyConnect` client nobody connected, and without a logger
// its lines are process warnings.
//
// Lines are counted as pino writes them, to a stream the test reads. The
// summary's period and clock are injected in the first test (no sleeps);
// the others run against real ports: one nobody listens on, and the shared
// test Redis.

import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { MeterProvider, MetricReader } from '@opentelemetry/sdk-metrics'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import pino from 'pino'
import t from 'tap'
import tollgate, { createLimiter, type Policy } from '../lib/index.js'
import { rateLimit } from '../lib/express.js'
import { Guard } from '../lib/core/guard.js'
import { storeTarget, RedisStore } from '../lib/store/redis-store.js'
import type { RedisClient } from '../lib/store/client.js'
import { createClient, createCluster } from 'redis'
import { GlideClient } from '@valkey/valkey-glide'
import { realTime, type Time } from '../lib/core/clock.js'
import { captureLogs, sharedRedis, uniquePrefix } from './helpers/app.js'
import { NO_REDIS_PORT, redisUrl, startRedisServer } from './helpers/redis.js'

await redisUrl(t)

/**
 * The summary's timer driven by the test: `tick()` fires every live timer
 * of the summary's period (`periodMs`) once, each arming the next period's;
 * shorter ones (the calls' deadlines) run on the process's timers.
 */
function fakeTimers (periodMs: number): Pick<Time, 'set' | 'clear'> & { tick (): void, live: number } {
  const live = new Set<{ fn: () => void }>()
  return {
    set (fn, ms, keepAlive) {
      if (ms !== periodMs) return realTime.set(fn, ms, keepAlive)
      const timer = { fn }
      live.add(timer)
      return timer
    },
    clear (handle) {
      if (!live.delete(handle as { fn: () => void })) realTime.clear(handle)
    },
    tick () {
      const due = [...live]
      live.clear()
      for (const timer of due) timer.fn()
    },
    get live () { return live.size }
  }
}

/** A call that fails the way a dropped connection does. */
const lost = (): Promise<never> => Promise.reject(new Error('Connection is closed.'))

t.test('while the store fails: one summary per period with the decisions since the last, on the injected clock and timer', async (t) => {
  const redis = await sharedRedis(t)
  const logs = captureLogs()
  const logger = pino({ level: 'info' }, logs.stream)
  let now = 0
  const timers = fakeTimers(10_000)
  const guard = new Guard(new RedisStore(redis), { failures: 100, cooldownMs: 1000 }, logger, { ...realTime, ...timers, now: () => now }, undefined, { summaryMs: 10_000, target: '127.0.0.1:1' })
  const spec = [{ key: `${uniquePrefix()}:{c}:b`, capacity: 10, refillPerSecond: 1, cost: 1 }]

  guard.fellBack('fail-open')
  t.equal(timers.live, 0, 'healthy: no timer, and a fallback is not counted')
  await t.rejects(guard.run(lost, 1000, spec))
  t.equal(timers.live, 1, 'failing: the summary timer runs')
  for (let i = 0; i < 7; i++) guard.fellBack('fail-open')
  guard.fellBack('fail-closed')
  guard.fellBack('local')
  now = 10_000
  timers.tick()
  now = 20_000
  timers.tick()
  guard.fellBack('fail-closed')
  now = 30_000
  timers.tick()
  now = 30_500
  t.equal(await guard.run(() => redis.ping(), 1000, spec), 'PONG')
  t.equal(timers.live, 0, 'recovered: the timer is stopped')
  timers.tick()

  t.same(logs.lines.map((l) => [l.level, l.msg]), [
    [40, 'rate limit store failing; limits follow their failure modes'],
    [40, 'rate limit store still failing: 9 decision(s) made without it in the last 10 s; limits follow their failure modes'],
    [40, 'rate limit store still failing: 1 decision(s) made without it in the last 10 s; limits follow their failure modes'],
    [30, 'rate limit store recovered']
  ], 'a period without fallback decisions logs nothing')
  t.match(logs.lines[0], { redis: '127.0.0.1:1', err: { code: 'TOLLGATE_STORE_ERROR' } }, 'the failing line names the store')
  t.match(logs.lines[1], { redis: '127.0.0.1:1', downMs: 10_000, periodMs: 10_000, decisions: { local: 1, 'fail-open': 7, 'fail-closed': 1 }, err: { message: 'store call failed: Connection is closed.' } })
  t.match(logs.lines[2], { downMs: 30_000, periodMs: 10_000, decisions: { local: 0, 'fail-open': 0, 'fail-closed': 1 } })
  t.match(logs.lines[3], { downMs: 30_500, decisions: { local: 1, 'fail-open': 7, 'fail-closed': 2 } }, 'the recovery line counts the whole outage')

  // A second outage, which turns out to be a server that cannot run the
  // scripts: that is told once, at error level, and so are its summaries.
  const noScripts = (): Promise<never> => Promise.reject(new Error("ERR unknown command 'evalsha', with args beginning with: "))
  await t.rejects(guard.run(lost, 1000, spec))
  await t.rejects(guard.run(noScripts, 1000, spec))
  await t.rejects(guard.run(noScripts, 1000, spec))
  guard.fellBack('local')
  now += 10_000
  timers.tick()
  guard.close()
  t.equal(timers.live, 0, 'close() stops the timer')
  t.same(logs.lines.slice(4).map((l) => [l.level, l.msg]), [
    [40, 'rate limit store failing; limits follow their failure modes'],
    [50, "rate limit store cannot run tollgate's scripts (ERR unknown command 'evalsha', with args beginning with: ): scripting is renamed, refused to this user by an ACL, or the server has no Lua engine; limits follow their failure modes until it can"],
    [50, 'rate limit store still failing: 1 decision(s) made without it in the last 10 s; limits follow their failure modes']
  ], 'counted afresh')
})

t.test('`outageSummaryMs` is validated: a number of ms from 1000 to 3600000', async (t) => {
  for (const bad of [999, 3_600_001, '30000', Number.NaN, Infinity, 0]) {
    const expected = { code: 'TOLLGATE_INVALID_OPTION', message: /^tollgate: `outageSummaryMs` must be a number of ms from 1000 to 3600000 \(at most one summary line a second while the store fails\), got / }
    t.throws(() => createLimiter({ outageSummaryMs: bad as number }), expected, `createLimiter: ${String(bad)}`)
    await t.rejects(async () => await Fastify().register(tollgate, { failureMode: 'open', outageSummaryMs: bad as number }), expected, `plugin: ${String(bad)}`)
    t.throws(() => rateLimit({ failureMode: 'open', outageSummaryMs: bad as number }), expected, `express: ${String(bad)}`)
  }
  t.doesNotThrow(() => createLimiter({ outageSummaryMs: 1000 }))
  t.doesNotThrow(() => createLimiter({ outageSummaryMs: 3_600_000 }))
})

/** A Reader collected by the test (no exporter, no timer). */
class Reader extends MetricReader {
  protected override async onShutdown (): Promise<void> {}
  protected override async onForceFlush (): Promise<void> {}
}

async function storeStates (reader: Reader): Promise<Record<string, number>> {
  const out: Record<string, number> = {}
  for (const scope of (await reader.collect()).resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      if (metric.descriptor.name !== 'tollgate.store.state') continue
      for (const point of metric.dataPoints) out[String(point.attributes.state)] = point.value as number
    }
  }
  return out
}

t.test('a wrong REDIS_URL with failureMode open: the start-up warning names the address, then a summary per period, never a line per request', async (t) => {
  const port = NO_REDIS_PORT
  const redis = new Redis(`redis://:s3cret@127.0.0.1:${port}`, { retryStrategy: () => 200 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const logs = captureLogs()
  const reader = new Reader()
  const provider = new MeterProvider({ readers: [reader] })
  t.teardown(() => provider.shutdown())
  const app = Fastify({ logger: { level: 'info', stream: logs.stream } })
  t.teardown(() => app.close())
  await app.register(tollgate, {
    redis, capacity: 1, refillPerSecond: 0.001, failureMode: 'open', outageSummaryMs: 1000, metrics: { meter: provider.getMeter('t') }
  })
  app.get('/', async () => 'ok')
  await app.ready()
  const tollgateLines = (): Array<Record<string, unknown>> => logs.lines.filter((l) => /^tollgate:|^rate limit store/.test(String(l.msg)))

  t.equal(app.tollgate.limiter.state, 'failing', 'failing from the start, before any request')
  t.same(await storeStates(reader), { healthy: 0, failing: 1 }, 'and so say the metrics')
  const start = tollgateLines()
  t.equal(start.length, 1, 'one line at start-up')
  t.match(start[0], { level: 40, redis: `127.0.0.1:${port}`, msg: `tollgate: Redis at 127.0.0.1:${port} is not ready after 2000 ms; limits follow their failure modes until it connects (attach an 'error' listener to the client to see why)` })
  t.notMatch(JSON.stringify(start[0]), /s3cret/, 'never the password')

  // 2.5 s of requests, one every 50 ms: every one passes unlimited.
  const started = performance.now()
  let requests = 0
  let passed = 0
  while (performance.now() - started < 2500) {
    const res = await app.inject('/')
    requests++
    if (res.statusCode === 200 && res.headers['ratelimit-limit'] === undefined) passed++
    await sleep(50)
  }
  const elapsed = performance.now() - started
  t.equal(passed, requests, `all ${requests} requests passed unlimited (capacity 1)`)
  const summaries = tollgateLines().slice(1)
  // One a second, on a timer that may be late under load, never early.
  t.ok(summaries.length >= 1 && summaries.length <= Math.floor(elapsed / 1000), `${summaries.length} summaries in ${elapsed.toFixed(0)} ms (one per second at most)`)
  t.ok(summaries.every((l) => l.level === 40 && /^rate limit store still failing: \d+ decision\(s\) made without it in the last 1 s/.test(String(l.msg))), 'each a warning')
  t.ok(summaries.every((l) => l.redis === `127.0.0.1:${port}`), 'naming the store')
  const counted = summaries.reduce((sum, l) => sum + (l.decisions as { 'fail-open': number })['fail-open'], 0)
  t.ok(counted >= requests - 25 && counted <= requests, `the summaries count ${counted} of the ${requests} fail-open decisions (those of the last, unfinished second are in the next)`)
  t.equal(app.tollgate.limiter.state, 'failing')
})

t.test('a lazyConnect client given to createLimiter is connected; without a logger the outage is a process warning', async (t) => {
  const url = await redisUrl(t)
  const redis = new Redis(url, { lazyConnect: true })
  t.teardown(() => redis.quit())
  const warnings: Error[] = []
  const listener = (warning: Error): void => { if (warning.name === 'TollgateWarning') warnings.push(warning) }
  process.on('warning', listener)
  t.teardown(() => { process.off('warning', listener) })
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'b', capacity: 100, refillPerSecond: 1, failureMode: 'open' }

  t.equal((await limiter.consume('alice', policy)).source, 'fail-open', 'the first decision finds the client unconnected')
  await once(redis, 'ready')
  const sources: string[] = []
  for (let i = 0; i < 5; i++) sources.push((await limiter.consume('alice', policy)).source)
  t.same(sources, ['store', 'store', 'store', 'store', 'store'], 'then Redis decides')
  t.equal(limiter.state, 'healthy')
  await sleep(10) // process warnings are emitted on the next tick
  t.same(warnings.map((w) => w.message), [
    'tollgate: rate limit store failing; limits follow their failure modes',
    'tollgate: rate limit store recovered'
  ])
  t.match((warnings[0] as Error & { detail?: string }).detail, /was not connected \(a lazyConnect client, status wait\): tollgate asked it to connect/)
})

t.test('the address of a client, for the log lines: never a password', async (t) => {
  const opts = { lazyConnect: true }
  const cases: Array<[Redis | InstanceType<typeof Redis.Cluster>, string]> = [
    [new Redis('redis://user:pw@10.0.0.5:6380/2', opts), '10.0.0.5:6380'],
    [new Redis({ ...opts, host: '::1', port: 7000 }), '[::1]:7000'],
    [new Redis({ ...opts, path: '/run/redis.sock', password: 'pw' }), 'unix:/run/redis.sock'],
    [new Redis({ ...opts, sentinels: [{ host: '10.0.0.1', port: 26379 }, { host: '10.0.0.2' }], name: 'main', sentinelPassword: 'pw' }), 'sentinels 10.0.0.1:26379, 10.0.0.2:6379 (master "main")'],
    [new Redis.Cluster([7000, '10.0.0.2:7001', 'redis://:pw@[::1]:7002', 'rediss://h', { host: '10.0.0.3', port: 7003 }, {}, 'redis://[::1'], opts),
      'cluster seeds 127.0.0.1:7000, 10.0.0.2:7001, [::1]:7002, h:6379, 10.0.0.3:7003, 127.0.0.1:6379, an address ioredis could not parse either'],
    [Object.assign(new Redis.Cluster([], opts), { startupNodes: undefined }), 'cluster seeds '],
    [Object.assign(new Redis.Cluster([], opts), { startupNodes: [null] }), 'cluster seeds 127.0.0.1:6379']
  ]
  for (const [client, expected] of cases) {
    t.equal(storeTarget(client), expected)
    client.disconnect()
  }
})

t.test('the address of a node-redis or GLIDE client, for the log lines: never a password', async (t) => {
  const cases: Array<[RedisClient, string]> = [
    [createClient({ url: 'redis://user:pw@10.0.0.5:6380/2' }), '10.0.0.5:6380'],
    [createClient({ socket: { host: '::1', port: 7000 }, password: 'pw' }), '[::1]:7000'],
    [createClient({ socket: { path: '/run/redis.sock', tls: false }, password: 'pw' }), 'unix:/run/redis.sock'],
    [createClient(), '127.0.0.1:6379'],
    [createCluster({ rootNodes: [{ url: 'redis://:pw@10.0.0.1:7000' }, { socket: { host: '10.0.0.2', port: 7001 } }, { url: 'redis://[::1' }] }),
      'cluster seeds 10.0.0.1:7000, 10.0.0.2:7001, an address node-redis could not parse either']
  ]
  for (const [client, expected] of cases) t.equal(storeTarget(client), expected)
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const glide = await GlideClient.createClient({ addresses: [{ host: server.host, port: server.port }] })
  t.teardown(() => glide.close())
  t.equal(storeTarget(glide), `${server.host}:${server.port}`)
})

t.test('the Express adapter warns at start-up the same way', async (t) => {
  const port = NO_REDIS_PORT
  const redis = new Redis({ port, host: '127.0.0.1', retryStrategy: () => 1000 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const lines: Array<[string, string]> = []
  const keep = (level: string) => (_obj: object, msg: string): void => { lines.push([level, msg]) }
  const limit = rateLimit({ redis, capacity: 1, refillPerSecond: 1, failureMode: 'open', logger: { warn: keep('warn'), info: keep('info'), error: keep('error') } })
  t.teardown(() => limit.close())
  await limit.ready
  t.same(lines, [['warn', `tollgate: Redis at 127.0.0.1:${port} is not ready after 2000 ms; limits follow their failure modes until it connects (attach an 'error' listener to the client to see why)`]])
  t.equal(limit.limiter.state, 'failing')
})
