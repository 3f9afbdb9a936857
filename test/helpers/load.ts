// Load for the fault tests. `startLoad` is a small, bounded driver: it sends
// requests at a steady rate with at most `concurrency` in flight and hands
// every result, with its latency measured by process.hrtime, to a callback;
// it keeps no per-request records, so a long run holds constant memory.
// Below it: an app with one route per failure mode to drive, and the checks
// of what its clients must see while the store fails and after it recovers.

import { LogController, type FastifyInstance, type FastifyRequest } from 'fastify'
import { Redis, type RedisOptions } from 'ioredis'
import type { Test } from 'tap'
import type { Decision, TollgateOptions } from '../../lib/index.js'
import { buildApp, type LogCapture } from './app.js'
import { startRedisServer, type RedisServer, type TeardownTarget } from './redis.js'

/** A redis-server of the test's own, to freeze, kill or restart; stopped at the end of `t`. */
export async function ownServer (t: TeardownTarget): Promise<RedisServer> {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  return server
}

/**
 * A client for a Redis that is meant to fail: connection errors are
 * expected (not reported), and it is disconnected at the end of `t`. By
 * default it reconnects every 50 ms, which keeps the repair phases short;
 * every other option is ioredis's default, as an application would have it.
 */
export function faultClient (t: TeardownTarget, url: string, options: RedisOptions = { retryStrategy: () => 50 }): Redis {
  const redis = new Redis(url, options)
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  return redis
}

export interface LoadResult<T> {
  /** 0, 1, 2, ... in the order the requests were sent. */
  index: number
  /** performance.now() when the request was sent. */
  startedAt: number
  /** Time from send to settlement, ms (process.hrtime). */
  latencyMs: number
  /** The value `send` resolved with; undefined when it rejected. */
  value: T | undefined
  /** Why `send` rejected; undefined when it resolved. */
  error: unknown
}

export interface LoadOptions<T> {
  /** Requests started per second, on average. */
  ratePerSecond: number
  /** Most requests in flight at once; a request that would exceed it is skipped and counted. Default 16. */
  concurrency?: number
  /** Sends request number `index`. */
  send: (index: number) => Promise<T>
  /** Called once per settled request, in settlement order. */
  onResult?: (result: LoadResult<T>) => void
}

export interface Load {
  readonly sent: number
  readonly settled: number
  /** Requests not sent because `concurrency` were already in flight. */
  readonly skipped: number
  /** Requests whose `send` rejected. */
  readonly errors: number
  readonly maxLatencyMs: number
  /** Stops sending and resolves once every request in flight has settled. */
  stop(): Promise<void>
}

const TICK_MS = 5

/** Starts sending at once; call `stop()` to end the run. */
export function startLoad<T> (options: LoadOptions<T>): Load {
  const concurrency = options.concurrency ?? 16
  const started = performance.now()
  let due = 0
  let sent = 0
  let settled = 0
  let skipped = 0
  let errors = 0
  let inFlight = 0
  let maxLatencyMs = 0
  let stopped = false
  let timer: NodeJS.Timeout | undefined
  let drained: (() => void) | undefined
  let stopping: Promise<void> | undefined

  const finish = (index: number, startedAt: number, begin: bigint, value: T | undefined, error: unknown): void => {
    const latencyMs = Number(process.hrtime.bigint() - begin) / 1e6
    if (latencyMs > maxLatencyMs) maxLatencyMs = latencyMs
    inFlight--
    settled++
    if (error !== undefined) errors++
    options.onResult?.({ index, startedAt, latencyMs, value, error })
    if (stopped && inFlight === 0) drained?.()
  }

  const sendOne = (): void => {
    const index = sent++
    inFlight++
    const startedAt = performance.now()
    const begin = process.hrtime.bigint()
    let promise: Promise<T>
    try {
      promise = options.send(index)
    } catch (err) {
      promise = Promise.reject(err)
    }
    promise.then(
      (value) => finish(index, startedAt, begin, value, undefined),
      (err: unknown) => finish(index, startedAt, begin, undefined, err ?? new Error('rejected'))
    )
  }

  const tick = (): void => {
    timer = undefined
    if (stopped) return
    const target = Math.floor((performance.now() - started) * options.ratePerSecond / 1000)
    while (due < target) {
      due++
      if (inFlight < concurrency) sendOne()
      else skipped++
    }
    timer = setTimeout(tick, TICK_MS)
  }
  tick()

  return {
    get sent () { return sent },
    get settled () { return settled },
    get skipped () { return skipped },
    get errors () { return errors },
    get maxLatencyMs () { return maxLatencyMs },
    stop () {
      stopped = true
      clearTimeout(timer)
      stopping ??= inFlight === 0 ? Promise.resolve() : new Promise<void>((resolve) => { drained = resolve })
      return stopping
    }
  }
}

/**
 * Watches this process's event loop with a 1 ms interval: `stop()` ends it
 * and returns the longest gap seen between two ticks, in ms (the loop's own
 * lag, plus the 1 ms of the interval). A timer of this loop can be late by
 * as much.
 */
export function watchLoop (): { stop: () => number } {
  let lastTick = performance.now()
  let longestGapMs = 0
  const ticker = setInterval(() => {
    const now = performance.now()
    longestGapMs = Math.max(longestGapMs, now - lastTick)
    lastTick = now
  }, 1)
  return {
    stop: () => {
      clearInterval(ticker)
      return longestGapMs
    }
  }
}

// ------------------------------------------------- load against the failure modes

/** The in-process limit of the 'local' route: 3 tokens, one more every 1000 s (none during a test). */
export const LOCAL = { capacity: 3, refillPerSecond: 0.001 } as const
/** RateLimit-Policy of the local limit, draft-6: capacity;w=ceil(capacity / refill). */
export const LOCAL_POLICY = '3;w=3000'
/** The store's limit: far more than any test spends, so every store decision allows. */
export const STORE_CAPACITY = 1000

export type Mode = 'open' | 'closed' | 'local'
export const MODES: readonly Mode[] = ['open', 'closed', 'local']

/** What a client saw for one request. */
export interface Seen {
  mode: Mode
  client: string
  /** performance.now() at send and at reply. */
  startedAt: number
  settledAt: number
  latencyMs: number
  status: number
  /** The decision's source, from the `x-source` header the test app adds. */
  source: string
  code: string | undefined
  headers: Record<string, string>
}

export interface ModeAppOptions {
  redis: Redis
  /** The store deadline, ms. */
  timeout: number
  breaker?: { failures?: number, cooldownMs?: number }
  logs?: LogCapture
}

/**
 * An app with one route per failure mode (`/open`, `/closed`, `/local`), all
 * limited by STORE_CAPACITY tokens in Redis; the client id comes from the
 * `x-client` header, so each phase of a test can start with fresh buckets.
 * Every reply carries its decision's source in `x-source`, 429 and 503 too.
 */
export async function modeApp (t: TeardownTarget, options: ModeAppOptions): Promise<{ app: FastifyInstance, prefix: string }> {
  const plugin: Partial<TollgateOptions> = {
    redis: options.redis,
    capacity: STORE_CAPACITY,
    refillPerSecond: 0.001,
    failureMode: 'open',
    timeout: options.timeout,
    key: (request) => String(request.headers['x-client'] ?? 'anonymous')
  }
  if (options.breaker !== undefined) plugin.breaker = options.breaker
  const { app, prefix } = await buildApp(t, {
    plugin,
    // Fastify's own per-request lines are off: only the limiter's remain.
    fastify: options.logs === undefined
      ? {}
      : { logger: { level: 'info', stream: options.logs.stream }, logController: new LogController({ disableRequestLogging: true }) },
    routes: (app) => {
      app.addHook('onSend', async (request, reply, payload) => {
        reply.header('x-source', request.rateLimit?.source ?? 'none')
        return payload
      })
      const echo = async (request: FastifyRequest): Promise<Decision | undefined> => request.rateLimit
      app.get('/open', { config: { rateLimit: { failureMode: 'open' } } }, echo)
      app.get('/closed', { config: { rateLimit: { failureMode: 'closed' } } }, echo)
      app.get('/local', { config: { rateLimit: { failureMode: 'local', local: { ...LOCAL } } } }, echo)
    }
  })
  return { app, prefix }
}

/** One request to the route of `mode`, as client `clientId`. */
export async function ask (app: FastifyInstance, mode: Mode, clientId: string): Promise<Seen> {
  const startedAt = performance.now()
  const begin = process.hrtime.bigint()
  const res = await app.inject({ url: `/${mode}`, headers: { 'x-client': clientId } })
  const latencyMs = Number(process.hrtime.bigint() - begin) / 1e6
  const headers: Record<string, string> = {}
  for (const [name, value] of Object.entries(res.headers)) headers[name] = String(value)
  const code = res.statusCode >= 400 ? (res.json() as { code?: string }).code : undefined
  return { mode, client: clientId, startedAt, settledAt: startedAt + latencyMs, latencyMs, status: res.statusCode, source: headers['x-source'] ?? 'none', code, headers }
}

/** Round-robin traffic over the three routes until `load.stop()`; every reply lands in `seen`. */
export function modeTraffic (app: FastifyInstance, clientId: () => string, ratePerSecond = 150): { seen: Seen[], load: Load } {
  const seen: Seen[] = []
  const load = startLoad({
    ratePerSecond,
    concurrency: 32,
    send: (i) => ask(app, MODES[i % MODES.length] as Mode, clientId()),
    onResult: (r) => {
      if (r.value === undefined) throw r.error
      seen.push(r.value)
    }
  })
  return { seen, load }
}

/** Warm-up: the script is loaded and each route is decided by Redis. */
export async function warm (t: Test, app: FastifyInstance, clientId: string): Promise<void> {
  for (const mode of MODES) {
    let seen = await ask(app, mode, clientId)
    // The first call of a script is EVALSHA, NOSCRIPT, EVAL: a busy machine
    // may make it miss a tight deadline once.
    for (let i = 0; i < 5 && seen.source !== 'store'; i++) seen = await ask(app, mode, clientId)
    t.equal(seen.source, 'store', `warm-up: /${mode} is decided by Redis`)
  }
}

const RATE_LIMIT_HEADER = /^(x-)?ratelimit|^retry-after$/
const WHOLE_SECONDS = /^[1-9][0-9]*$/

export interface FallbackCheck {
  /** Replies given while the store was certainly failing. */
  during: readonly Seen[]
  /** Every reply of the run: the local buckets count across all of them. */
  all: readonly Seen[]
  /** The breaker's cool-down: Retry-After is at most this, rounded up to seconds. */
  cooldownMs: number
  /** Fewest replies in `during` for the check to mean something. */
  atLeast?: number
}

/**
 * What clients see while the store fails, per mode: 'open' is a 200 without
 * any rate-limit header, 'closed' a 503 TOLLGATE_UNAVAILABLE with
 * Retry-After, 'local' 200 or 429 with the local policy's headers, and over
 * the whole run exactly LOCAL.capacity local passes per client.
 */
export function checkFallbacks (t: Test, phase: string, check: FallbackCheck): void {
  const { during, all, cooldownMs } = check
  t.ok(during.length >= (check.atLeast ?? 30), `${phase}: ${during.length} requests while the store failed`)
  const byMode = (mode: Mode): Seen[] => during.filter((s) => s.mode === mode)
  const brief = (s: Seen): string => `${s.mode} ${s.status} ${s.source} ${JSON.stringify(s.headers)}`

  const open = byMode('open')
  t.ok(open.length > 0, `${phase}: 'open' requests`)
  t.same(open.filter((s) => s.status !== 200 || s.source !== 'fail-open').map(brief), [], `${phase}: 'open' passes every request (fail-open)`)
  t.same(open.flatMap((s) => Object.keys(s.headers).filter((h) => RATE_LIMIT_HEADER.test(h))), [],
    `${phase}: 'open' sends no rate-limit header: never a fake full quota`)

  const closed = byMode('closed')
  t.ok(closed.length > 0, `${phase}: 'closed' requests`)
  t.same(closed.filter((s) => s.status !== 503 || s.code !== 'TOLLGATE_UNAVAILABLE' || s.source !== 'fail-closed').map(brief), [],
    `${phase}: 'closed' refuses every request with 503 TOLLGATE_UNAVAILABLE`)
  // Retry-After is max(1 s, the breaker's remaining cool-down), in whole seconds.
  const maxRetry = Math.max(1, Math.ceil(cooldownMs / 1000))
  t.same(closed.filter((s) => !WHOLE_SECONDS.test(s.headers['retry-after'] ?? '') || Number(s.headers['retry-after']) > maxRetry).map(brief), [],
    `${phase}: every 503 has Retry-After, 1 to ${maxRetry} s`)
  t.same(closed.flatMap((s) => Object.keys(s.headers).filter((h) => /ratelimit/.test(h))), [], `${phase}: a 503 has no RateLimit headers`)

  const local = byMode('local')
  t.ok(local.length > 0, `${phase}: 'local' requests`)
  t.same(local.filter((s) => s.source !== 'local').map(brief), [], `${phase}: 'local' requests are decided in process`)
  const badLocal = all.filter((s) => s.source === 'local').filter((s) =>
    s.headers['ratelimit-limit'] !== String(LOCAL.capacity) ||
    s.headers['ratelimit-policy'] !== LOCAL_POLICY ||
    (s.status !== 200 && s.status !== 429) ||
    (s.status === 429 && (s.headers['ratelimit-remaining'] !== '0' || !WHOLE_SECONDS.test(s.headers['retry-after'] ?? ''))))
  t.same(badLocal.map(brief), [], `${phase}: local decisions are 200 or 429 with the local policy's headers`)
  for (const id of new Set(local.map((s) => s.client))) {
    const mine = all.filter((s) => s.client === id && s.source === 'local')
    const passed = mine.filter((s) => s.status === 200)
    t.equal(passed.length, Math.min(mine.length, LOCAL.capacity),
      `${phase}: of ${mine.length} local decisions for client ${id}, exactly the local capacity passed`)
    t.same(passed.map((s) => s.headers['ratelimit-remaining']).sort(), ['0', '1', '2'].slice(LOCAL.capacity - passed.length),
      `${phase}: the passes count the local bucket down`)
  }
}

/** Every request answered within the deadline plus scheduling noise. */
export function checkLatency (t: Test, phase: string, seen: readonly Seen[], timeoutMs: number, toleranceMs: number): void {
  let worst: Seen | undefined
  for (const s of seen) if (worst === undefined || s.latencyMs > worst.latencyMs) worst = s
  const worstMs = worst?.latencyMs ?? 0
  t.ok(seen.length > 0 && worstMs <= timeoutMs + toleranceMs,
    `${phase}: slowest of ${seen.length} replies took ${worstMs.toFixed(1)} ms (${worst?.source ?? '-'}; deadline ${timeoutMs} ms + ${toleranceMs} ms noise)`)
}

/**
 * After a repair at `repairedAt`: Redis decides again within `boundMs`, and
 * every request sent after that first decision is decided by Redis, with
 * the store policy's headers.
 */
export function checkRecovery (t: Test, phase: string, seen: readonly Seen[], repairedAt: number, boundMs: number): void {
  const after = seen.filter((s) => s.startedAt >= repairedAt).sort((a, b) => a.startedAt - b.startedAt)
  const first = after.find((s) => s.source === 'store')
  if (first === undefined) {
    t.fail(`${phase}: no decision by Redis after the repair (${after.length} requests)`)
    return
  }
  const tookMs = first.settledAt - repairedAt
  t.ok(tookMs <= boundMs, `${phase}: decided by Redis again ${tookMs.toFixed(0)} ms after the repair (bound ${boundMs} ms)`)
  const later = after.filter((s) => s.startedAt > first.settledAt)
  t.ok(later.length >= 20, `${phase}: ${later.length} requests after recovery`)
  t.same(later.filter((s) => s.source !== 'store' || s.status !== 200 || s.headers['ratelimit-limit'] !== String(STORE_CAPACITY))
    .map((s) => `${s.mode} ${s.status} ${s.source}`), [], `${phase}: every one decided by Redis, with the store policy's headers`)
}
