// tollgate/express when the store fails (docs/guides/failure-modes.md), on a redis-server
// of the test's own: frozen (SIGSTOP), then killed and restarted, with one
// route per failure mode, on Express 5 (the failure path is the core's,
// shared with Express 4, whose adapter code is the same and is covered by
// test/express.test.ts).
//
// Tolerance: TIMEOUT_MS = 50 is the deadline under test; a request may take
// DEADLINE_TOLERANCE_MS = 300 more, for scheduling noise on a loaded
// 2-core machine (the bound test/failure-modes.test.ts uses, with its
// measurements). A frozen Redis without a deadline would hold a request for
// the whole freeze, FREEZE_MS = 2000, well above the bound. After a repair
// Redis must decide again within one breaker cool-down plus
// RECOVERY_TOLERANCE_MS (a probe may fail just as Redis comes back).

import { setTimeout as sleep } from 'node:timers/promises'
import express from 'express'
import t, { type Test } from 'tap'
import { rateLimit, type RateLimit } from '../lib/express.js'
import { uniquePrefix } from './helpers/app.js'
import { faultClient, ownServer } from './helpers/load.js'
import { listen, memoryLogger, type Answer } from './helpers/express.js'
import { keyUnder } from './helpers/keys.js'

const TIMEOUT_MS = 50
const DEADLINE_TOLERANCE_MS = 300
const FREEZE_MS = 2000
const COOLDOWN_MS = 1000
const RECOVERY_TOLERANCE_MS = 1500
const LOCAL = { capacity: 3, refillPerSecond: 0.001 }

interface Seen extends Answer { mode: string, ms: number, source: string | null }

async function modeApp (t: Test, limit: RateLimit): Promise<(mode: string) => Promise<Seen>> {
  const app = express()
  for (const mode of ['open', 'closed', 'local'] as const) {
    app.get(`/${mode}`, limit({ failureMode: mode, ...(mode === 'local' ? { local: LOCAL } : {}) }), (req, res) => {
      res.json({ source: req.rateLimit?.source ?? null })
    })
  }
  const get = await listen(t, app)
  return async (mode) => {
    const started = performance.now()
    const a = await get(`/${mode}`)
    const ms = performance.now() - started
    return { ...a, mode, ms, source: a.status === 200 ? (JSON.parse(a.body) as { source: string | null }).source : null }
  }
}

/** Asks every mode until `ms` have passed. */
async function during (ask: (mode: string) => Promise<Seen>, ms: number): Promise<Seen[]> {
  const seen: Seen[] = []
  const end = performance.now() + ms
  while (performance.now() < end) {
    for (const mode of ['open', 'closed', 'local']) seen.push(await ask(mode))
  }
  return seen
}

/** Asks until every mode is decided by Redis again; the time it took. */
async function recovery (ask: (mode: string) => Promise<Seen>, boundMs: number): Promise<number> {
  const started = performance.now()
  while (performance.now() - started < boundMs) {
    const seen = await Promise.all(['open', 'closed', 'local'].map(ask))
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

t.test('a frozen Redis: each mode within the deadline, then Redis decides again', async (t) => {
  const server = await ownServer(t)
  const logger = memoryLogger()
  const limit = rateLimit({ redis: faultClient(t, server.url), prefix: uniquePrefix(), capacity: 1000, refillPerSecond: 100, failureMode: 'open', timeout: TIMEOUT_MS, logger })
  t.teardown(() => limit.close())
  const ask = await modeApp(t, limit)
  t.same((await Promise.all(['open', 'closed', 'local'].map(ask))).map((s) => s.source), ['store', 'store', 'store'])
  server.pause()
  t.teardown(() => server.resume())
  const seen = await during(ask, FREEZE_MS)
  server.resume()
  checkFallbacks(t, 'frozen', seen)
  const ms = await recovery(ask, COOLDOWN_MS + RECOVERY_TOLERANCE_MS)
  t.ok(ms <= COOLDOWN_MS + RECOVERY_TOLERANCE_MS, `Redis decides again ${ms.toFixed(0)} ms after the freeze`)
  t.ok(logger.lines.some((l) => /store failing/.test(l)) && logger.lines.some((l) => /store recovered/.test(l)), 'state changes logged, once each way')
})

t.test('a killed, then restarted Redis; the console is the default logger', async (t) => {
  const server = await ownServer(t)
  const lines: Array<[string, unknown[]]> = []
  const saved = { warn: console.warn, info: console.info, error: console.error }
  for (const level of ['warn', 'info', 'error'] as const) console[level] = (...args: unknown[]) => { lines.push([level, args]) }
  t.teardown(() => Object.assign(console, saved))
  const redis = faultClient(t, server.url)
  const prefix = uniquePrefix()
  // keySecret: the restarted Redis has lost a random secret, and the key is named below.
  const keySecret = 'a key secret for this test'
  const limit = rateLimit({ redis, prefix, capacity: 1000, refillPerSecond: 100, failureMode: 'open', timeout: TIMEOUT_MS, keySecret })
  t.teardown(() => limit.close())
  const ask = await modeApp(t, limit)
  t.same((await Promise.all(['open', 'closed', 'local'].map(ask))).map((s) => s.source), ['store', 'store', 'store'])
  await server.kill()
  const seen = await during(ask, 1000)
  checkFallbacks(t, 'killed', seen)
  await server.restart()
  const ms = await recovery(ask, COOLDOWN_MS + RECOVERY_TOLERANCE_MS + 1000)
  t.ok(ms < Infinity, `Redis decides again ${ms.toFixed(0)} ms after the restart`)
  // A key of the wrong type: that request fails open, logged as an error.
  const key = keyUnder(keySecret, prefix, '127.0.0.1', 'GET /open')
  await redis.del(key)
  await redis.sadd(key, 'not a bucket')
  t.equal((await ask('open')).source, 'fail-open')
  Object.assign(console, saved)
  t.match(lines.map(([level, args]) => `${level} ${String(args[0])}`), [
    /^warn rate limit store failing/,
    /^info rate limit store recovered/,
    /^error rate limit key holds a value of the wrong type/
  ])
})

t.test('closed during an outage: the handler gets the 503 as an error', async (t) => {
  const server = await ownServer(t)
  const limit = rateLimit({
    redis: faultClient(t, server.url),
    prefix: uniquePrefix(),
    capacity: 5,
    refillPerSecond: 1,
    failureMode: 'closed',
    timeout: TIMEOUT_MS,
    logger: memoryLogger(),
    handler: (_req, res, _next, err) => { res.status(err.status).set(err.headers).json({ code: err.code, retryAfter: err.retryAfter }) }
  })
  t.teardown(() => limit.close())
  await limit.ready
  await server.kill()
  const app = express()
  app.get('/x', limit(), (_req, res) => { res.send('ok') })
  const a = await (await listen(t, app))('/x')
  t.same([a.status, JSON.parse(a.body)], [503, { code: 'TOLLGATE_UNAVAILABLE', retryAfter: 1 }])
  t.equal(a.headers['retry-after'], '1')
})

t.test('Redis unreachable at start-up: the wait is bounded, then the failure modes apply', async (t) => {
  const server = await ownServer(t)
  await server.kill()
  const logger = memoryLogger()
  const limit = rateLimit({ redis: faultClient(t, server.url), prefix: uniquePrefix(), capacity: 5, refillPerSecond: 1, failureMode: 'open', timeout: TIMEOUT_MS, logger })
  t.teardown(() => limit.close())
  const started = performance.now()
  const app = express()
  app.get('/x', limit(), (req, res) => { res.json({ source: req.rateLimit?.source }) })
  const a = await (await listen(t, app))('/x')
  const ms = performance.now() - started
  t.same(JSON.parse(a.body), { source: 'fail-open' })
  t.ok(ms >= 1900 && ms < 2000 + DEADLINE_TOLERANCE_MS + 500, `the first request waited for the start-up bound of 2000 ms: ${ms.toFixed(0)} ms`)
  t.match(logger.lines, [/^tollgate: Redis at 127\.0\.0\.1:\d+ is not ready after 2000 ms/])
})
