// An adapter's start-up, whatever the framework: its store options and
// the core built from them, a bounded wait for the client and the scripts
// (so the first requests are decided by Redis, or the store is marked
// failing with one warning naming where it connects), and the probe of a
// framework's proxy trust behind the proxy warnings.
//
// The Fastify plugin awaits the start-up wait at registration; a
// middleware's `rateLimit()` cannot be awaited, so its wait starts there
// and requests that arrive before it ends wait for it (lib/http/instance.ts,
// `startGate`).

import { StoreError } from '../store/errors.js'
import type { RedisClient, StoreClient } from '../store/client.js'
import { storeClient } from '../store/clients/index.js'
import { createCore, type Core } from '../core/limiter.js'
import { DEFAULT_PREFIX, ipv6Subnet } from '../core/options.js'
import { LIMITER_CHECKS } from '../core/policy.js'
import type { LimiterOptions, Logger } from '../core/types.js'

/** How long the start-up waits for the client and the scripts, ms. */
const START_WAIT_MS = 2000

/**
 * Options of the store, set once per adapter instance: the limiter's own
 * (lib/core/policy.ts) but for `timeout`, which is a policy's, and
 * `logger`, which only a middleware adapter takes; and the client identity's.
 */
const { timeout: _policyOwn, logger: _middlewareOwn, ...limiterChecks } = LIMITER_CHECKS
export const STORE_CHECKS = { ...limiterChecks, ipv6Subnet }

/** The logger check of a middleware adapter's `logger` option. */
export const LOGGER_CHECK = LIMITER_CHECKS.logger

/** An adapter's core, from its store options (checked with STORE_CHECKS) and its logger. */
export function adapterCore (options: LimiterOptions, logger: Logger): Core {
  return createCore({
    redis: options.redis,
    prefix: options.prefix ?? DEFAULT_PREFIX,
    keySecret: options.keySecret,
    timeout: options.timeout,
    breaker: options.breaker,
    denialCache: options.denialCache,
    batch: options.batch,
    metrics: options.metrics,
    maxWaiters: options.maxWaiters,
    outageSummaryMs: options.outageSummaryMs,
    logger
  })
}

/** The start-up wait: bounded, warns when Redis is not ready by then, or that there is no `redis`; never rejects. */
export async function startUp (core: Core, client: RedisClient | undefined, log: Logger): Promise<void> {
  if (client === undefined) {
    log.warn({}, 'tollgate: no `redis` given, limits are kept in this process only; with several app servers each one counts on its own')
    return
  }
  const redis = storeClient(client)
  if (!await whenReady(core, redis, START_WAIT_MS)) notReady(core, redis, START_WAIT_MS)
}

/**
 * Waits, up to `ms`, for the client to be connected, then, within the same
 * budget, for the scripts to be loaded on every master, so that the first
 * requests are decided by Redis. A client created with `lazyConnect` is
 * asked to connect, since the limiter sends nothing to a client that is not
 * connected. True when the client is ready; never rejects.
 */
async function whenReady (core: Core, redis: StoreClient, ms: number): Promise<boolean> {
  const started = performance.now()
  await waitReady(redis, ms)
  if (redis.status !== 'ready') return false
  await within(core.warm(), ms - (performance.now() - started))
  return true
}

/**
 * After a start-up wait that did not see the client ready: the store is
 * failing from the start (`limiter.state`, the metrics, the summaries while
 * it stays so), with one warning naming where the client connects.
 */
function notReady (core: Core, redis: StoreClient, ms: number): void {
  const target = redis.target
  const err = new StoreError('TOLLGATE_STORE_DOWN', `Redis at ${target} is not ready after ${ms} ms (status ${redis.status})`)
  core.down(err, `tollgate: Redis at ${target} is not ready after ${ms} ms; limits follow their failure modes until it connects (attach an 'error' listener to the client to see why)`)
}

async function waitReady (redis: StoreClient, ms: number): Promise<void> {
  if (redis.status === 'ready') return
  if (redis.status === 'wait') redis.connect()
  await new Promise<void>((resolve) => {
    const done = (): void => {
      clearTimeout(timer)
      off()
      resolve()
    }
    const timer = setTimeout(done, ms)
    const off = redis.onReady(done)
  })
}

/** Waits for `promise` at most `ms` (never rejects). */
async function within (promise: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  await Promise.race([promise, new Promise<void>((resolve) => { timer = setTimeout(resolve, Math.max(0, ms)) })])
  clearTimeout(timer)
}
/**
 * A made-up address chain to ask a proxy trust setting about: the socket's
 * address, then each hop's as X-Forwarded-For lists them from the nearest
 * out. Documentation addresses (RFC 5737): no real proxy has one, so a
 * setting that trusts all of them trusts any address at every hop.
 */
export const PROBE_HOPS: readonly string[] = ['203.0.113.250', ...Array.from({ length: 8 }, (_, i) => `198.51.100.${i + 1}`)]

/** A request as a framework's proxy resolution reads it: the socket at PROBE_HOPS[0], the hops, then a client. */
export const PROBE_REQUEST = {
  socket: { remoteAddress: PROBE_HOPS[0] },
  headers: { 'x-forwarded-for': ['192.0.2.1', ...PROBE_HOPS.slice(1).reverse()].join(', ') }
}

/**
 * Whether a framework's proxy trust trusts every hop: `probe` asks it about
 * PROBE_REQUEST and answers true when every hop of PROBE_HOPS is trusted.
 * A probe that throws (a trust function of the app's that rejects made-up
 * input) counts as no.
 */
export function trustsEveryHop (probe: (request: typeof PROBE_REQUEST) => boolean): boolean {
  try {
    return probe(PROBE_REQUEST)
  } catch {
    return false
  }
}
