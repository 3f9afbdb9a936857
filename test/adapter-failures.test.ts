// Every adapter when the store fails (docs/guides/failure-modes.md), over
// the table of test/helpers/adapters.ts: frozen (SIGSTOP), then killed and
// restarted, with one route per failure mode, a limit failing closed whose
// 503 the app answers itself, and Redis unreachable at start-up. One
// redis-server for the file: the rows run one after another on it, each
// with prefixes of its own, and each test leaves it running as it found it.
// Express 5 stands for Express 4 here: the failure path is the core's, and
// the Express adapter's code is the same on both majors.
//
// Tolerance: TIMEOUT_MS = 50 is the deadline under test; a request may take
// DEADLINE_TOLERANCE_MS = 300 more, for scheduling noise on a loaded
// 2-core machine (the bound test/failure-modes.test.ts uses, with its
// measurements). A frozen Redis without a deadline would hold a request for
// the whole freeze, FREEZE_MS = 2000, well above the bound. After a repair
// Redis must decide again within one breaker cool-down plus
// RECOVERY_TOLERANCE_MS (a probe may fail just as Redis comes back).

import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { uniquePrefix } from './helpers/app.js'
import { ADAPTERS, type AdapterRow, type RouteSpec, type RunningApp, type SharedOptions } from './helpers/adapters.js'
import { faultClient, ownServer } from './helpers/load.js'
import type { Answer } from './helpers/express.js'
import { keyUnder } from './helpers/keys.js'
import type { RedisServer } from './helpers/redis.js'

const TIMEOUT_MS = 50
const DEADLINE_TOLERANCE_MS = 300
const FREEZE_MS = 2000
const COOLDOWN_MS = 1000
const RECOVERY_TOLERANCE_MS = 1500
const LOCAL = { capacity: 3, refillPerSecond: 0.001 }
const MODES = ['open', 'closed', 'local'] as const
const MODE_ROUTES: RouteSpec[] = MODES.map((mode) => ({ path: `/${mode}`, policy: { failureMode: mode, ...(mode === 'local' ? { local: LOCAL } : {}) } }))

interface Seen extends Answer { mode: string, ms: number, source: string | null }
type Ask = (mode: string) => Promise<Seen>

function asker (app: RunningApp): Ask {
  return async (mode) => {
    const started = performance.now()
    const a = await app.get(`/${mode}`)
    const ms = performance.now() - started
    return { ...a, mode, ms, source: a.status === 200 ? (JSON.parse(a.body) as { source: string | null }).source : null }
  }
}

/** Asks every mode until `ms` have passed. */
async function during (ask: Ask, ms: number): Promise<Seen[]> {
  const seen: Seen[] = []
  const end = performance.now() + ms
  while (performance.now() < end) {
    for (const mode of MODES) seen.push(await ask(mode))
  }
  return seen
}

/** Asks until every mode is decided by Redis again; the time it took. */
async function recovery (ask: Ask, boundMs: number): Promise<number> {
  const started = performance.now()
  while (performance.now() - started < boundMs) {
    const seen = await Promise.all(MODES.map(ask))
    if (seen.every((s) => s.source === 'store')) return performance.now() - started
    await sleep(50)
  }
  return Infinity
}

function checkFallbacks (t: Test, phase: string, seen: readonly Seen[]): void {
  const worst = Math.max(...seen.map((s) => s.ms))
  t.ok(worst <= TIMEOUT_MS + DEADLINE_TOLERANCE_MS, `${phase}: slowest of ${seen.length} requests took ${worst.toFixed(1)} ms (deadline ${TIMEOUT_MS} ms + ${DEADLINE_TOLERANCE_MS} ms noise)`)
  const open = seen.filter((s) => s.mode === 'open')
  t.same(open.filter((s) => s.status !== 200 || s.source !== 'fail-open' || Object.keys(s.headers).some((h) => h.includes('ratelimit'))).length, 0,
    `${phase}: 'open' passes all ${open.length}, with no rate-limit header`)
  const closed = seen.filter((s) => s.mode === 'closed')
  t.same(closed.filter((s) => s.status !== 503 || s.headers['retry-after'] === undefined ||
    !/^\{"statusCode":503,"code":"TOLLGATE_UNAVAILABLE","error":"Service Unavailable","message":"Rate limiter unavailable, retry in \d+ second\(s\)"\}$/.test(s.body)).length, 0,
  `${phase}: 'closed' answers all ${closed.length} with the 503 body and Retry-After`)
  const local = seen.filter((s) => s.mode === 'local')
  t.same(local.map((s) => s.status).slice(0, 4), [200, 200, 200, 429], `${phase}: 'local' follows its in-process bucket of 3`)
  t.equal(local[0]?.headers['ratelimit-policy'], '3;w=3000', `${phase}: with the local policy's headers`)
}

function options (redis: SharedOptions['redis'], more: SharedOptions): SharedOptions {
  return { redis, prefix: uniquePrefix(), capacity: 1000, refillPerSecond: 100, failureMode: 'open', timeout: TIMEOUT_MS, ...more }
}

async function frozen (t: Test, row: AdapterRow, server: RedisServer): Promise<void> {
  const app = await row.start(t, { options: options(faultClient(t, server.url), {}), routes: MODE_ROUTES })
  const ask = asker(app)
  t.same((await Promise.all(MODES.map(ask))).map((s) => s.source), ['store', 'store', 'store'])
  server.pause()
  t.teardown(() => server.resume())
  const seen = await during(ask, FREEZE_MS)
  server.resume()
  checkFallbacks(t, 'frozen', seen)
  const ms = await recovery(ask, COOLDOWN_MS + RECOVERY_TOLERANCE_MS)
  t.ok(ms <= COOLDOWN_MS + RECOVERY_TOLERANCE_MS, `Redis decides again ${ms.toFixed(0)} ms after the freeze`)
  const lines = app.logs().map((l) => l.msg)
  t.ok(lines.some((l) => /store failing/.test(l)) && lines.some((l) => /store recovered/.test(l)), 'state changes logged, once each way')
}

async function killed (t: Test, row: AdapterRow, server: RedisServer): Promise<void> {
  const redis = faultClient(t, server.url)
  // keySecret: the restarted Redis has lost a random secret, and the key is named below.
  const keySecret = 'a key secret for this test'
  const given = options(redis, { keySecret })
  const app = await row.start(t, { options: given, routes: MODE_ROUTES, log: 'default' })
  const ask = asker(app)
  t.same((await Promise.all(MODES.map(ask))).map((s) => s.source), ['store', 'store', 'store'])
  await server.kill()
  t.teardown(() => server.running ? undefined : server.restart())
  const seen = await during(ask, 1000)
  checkFallbacks(t, 'killed', seen)
  await server.restart()
  const ms = await recovery(ask, COOLDOWN_MS + RECOVERY_TOLERANCE_MS + 1000)
  t.ok(ms < Infinity, `Redis decides again ${ms.toFixed(0)} ms after the restart`)
  // A key of the wrong type: that request fails open, logged as an error.
  const key = keyUnder(keySecret, given.prefix as string, '127.0.0.1', 'GET /open')
  await redis.del(key)
  await redis.sadd(key, 'not a bucket')
  t.equal((await ask('open')).source, 'fail-open')
  t.match(app.logs().map(({ level, msg }) => `${level} ${msg}`), [
    /^warn rate limit store failing/,
    /^info rate limit store recovered/,
    /^error rate limit key holds a value of the wrong type/
  ], `${row.defaultLog}, the default destination`)
}

async function closedOutage (t: Test, row: AdapterRow, server: RedisServer): Promise<void> {
  const app = await row.start(t, {
    options: options(faultClient(t, server.url), { capacity: 5, refillPerSecond: 1, failureMode: 'closed' }),
    routes: [{ path: '/x', policy: {} }],
    ownAnswers: true
  })
  t.equal((await app.get('/x')).status, 200, 'ready: decided by Redis')
  await server.kill()
  t.teardown(() => server.running ? undefined : server.restart())
  const a = await app.get('/x')
  t.same([a.status, JSON.parse(a.body)], [503, { code: 'TOLLGATE_UNAVAILABLE', retryAfter: 1 }])
  t.equal(a.headers['retry-after'], '1')
  await server.restart()
}

async function unreachable (t: Test, row: AdapterRow, server: RedisServer): Promise<void> {
  await server.kill()
  t.teardown(() => server.running ? undefined : server.restart())
  const started = performance.now()
  const app = await row.start(t, { options: options(faultClient(t, server.url), { capacity: 5, refillPerSecond: 1 }), routes: [{ path: '/x', policy: {} }] })
  const a = await app.get('/x')
  const ms = performance.now() - started
  t.same(JSON.parse(a.body), { source: 'fail-open' })
  t.ok(ms >= 1900 && ms < 2000 + DEADLINE_TOLERANCE_MS + 500, `the start-up bound of 2000 ms was waited for (at ${row.startupWait}): ${ms.toFixed(0)} ms to the first answer`)
  t.match(app.logs().map((l) => l.msg), [/^tollgate: Redis at 127\.0\.0\.1:\d+ is not ready after 2000 ms/])
  await server.restart()
}

const server = await ownServer(t)

for (const row of ADAPTERS) {
  t.test(row.name, async (t) => {
    t.test('a frozen Redis: each mode within the deadline, then Redis decides again', (t) => frozen(t, row, server))
    t.test(`a killed, then restarted Redis; ${row.defaultLog} is the default logger`, (t) => killed(t, row, server))
    t.test('closed during an outage: the app answers the 503 itself', (t) => closedOutage(t, row, server))
    t.test('Redis unreachable at start-up: the wait is bounded, then the failure modes apply', (t) => unreachable(t, row, server))
  })
}
