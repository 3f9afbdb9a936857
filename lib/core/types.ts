// The core's public types: decisions, policies, the limiter and its
// options. The Redis client's type is the store wing's (lib/store/client.ts).

import type { IoredisClient, NodeRedisClient, RedisClient, ValkeyGlideClient } from '../store/client.js'
import type { StoreError } from './errors.js'

/** A reserved cost, to be settled once with the actual cost. */
export interface Reservation {
  /** The decision of the reserve, as `consume` would give it. */
  readonly decision: Decision
}

/** What a limit does when its store fails or misses its deadline. */
export type FailureMode = 'open' | 'closed' | 'local'

/** Where a decision came from. */
export type DecisionSource = 'store' | 'local' | 'fail-open' | 'fail-closed' | 'cache'

/** The outcome of one rate-limit check. Being limited is a result, never an error. */
export interface Decision {
  allowed: boolean
  /** Capacity of the bucket. */
  limit: number
  /** Whole tokens left after this decision (floor). */
  remaining: number
  /** Milliseconds until the bucket is full again. */
  resetMs: number
  /** 0 when allowed, else milliseconds until `cost` tokens are available. */
  retryAfterMs: number
  source: DecisionSource
  /** Name of the bucket this decision describes. */
  bucket: string
  /** With several policies: one decision per policy, in the order given. */
  policies?: readonly Decision[]
  /**
   * A would-be denial: a policy in shadow mode could not afford this
   * request, which was let through (`allowed` is true). `retryAfterMs`,
   * `remaining` and `resetMs` are what the limit would have said.
   */
  shadow?: true
  /** Denied by a lockout: the client is blocked; `retryAfterMs` is the rest of the block. */
  locked?: true
  /** Milliseconds this call waited for reserved tokens, or for a slot (policies with `maxWaitMs`). */
  waitedMs?: number
}

/** Block a client after repeated denials: `after` denials within `withinMs` of the first block it for `forMs`. */
export interface Lockout {
  /** Denials that start a block (an integer > 0). */
  after: number
  /** The counting period from the first denial, whole ms. */
  withinMs: number
  /** How long a block lasts, whole ms. */
  forMs: number
}

/** Size and rate of an in-process bucket. */
export interface LocalPolicy {
  capacity: number
  refillPerSecond: number
  /** A concurrency policy's in-process semaphore: its size (capacity and rate then equal it). */
  max?: number | undefined
}

/** At most `max` requests of one client in flight at once (SPEC 13). */
export interface ConcurrencyLimit {
  /** Slots per client and bucket, an integer from 1 to 100 000. */
  max: number
  /** How long a slot whose server died still counts, whole ms from 1000 (default 60 000); renewed while held. */
  leaseMs?: number | undefined
}

/** A limit, as the core takes it. */
export interface Policy {
  /** Bucket name; every policy with the same name and client shares one bucket. */
  bucket: string
  capacity: number
  refillPerSecond: number
  /** Tokens one call costs, default 1. */
  cost?: number | undefined
  failureMode: FailureMode
  /** Required with failureMode 'local'. */
  local?: LocalPolicy | undefined
  /** Deadline for one store decision, ms (default: the limiter's). */
  timeout?: number | undefined
  /**
   * Opt-in token leases: take `tokens` at a time from the shared bucket and
   * spend them in this process; a batch is given back once older than
   * `maxAgeMs`. Single-policy checks only.
   */
  lease?: { tokens: number, maxAgeMs: number } | undefined
  /**
   * Shadow mode: decided and spent as usual, but never refuses: a
   * request it cannot afford passes with `shadow: true` on its decision.
   */
  shadow?: boolean | undefined
  /** Block the client after repeated denials. Single-policy checks only. */
  lockout?: Lockout | undefined
  /**
   * A consume may wait up to this many ms for its tokens, reserved at
   * once in the store, instead of being denied; with `concurrency`, an
   * acquisition may wait as long for a slot. Single-policy checks only.
   */
  maxWaitMs?: number | undefined
  /**
   * A concurrency limit instead of a rate (taken with `acquire`): no
   * capacity, rate or cost; list it beside a rate policy to limit both.
   */
  concurrency?: ConcurrencyLimit | undefined
}

/** A concurrency policy as an app writes it: no bucket sizes of its own. */
export type ConcurrencyPolicy = Omit<Policy, 'capacity' | 'refillPerSecond' | 'cost' | 'concurrency' | 'local'> & {
  concurrency: ConcurrencyLimit
  /** Required with failureMode 'local': an in-process semaphore of `max` slots (per app server). */
  local?: { max: number } | undefined
  capacity?: undefined
  refillPerSecond?: undefined
  cost?: undefined
}

/** A decision that may hold concurrency slots, given back by `release`. */
export interface Acquired {
  /** The decision, as `consume` gives one; a concurrency policy's `limit` is its `max`, `remaining` the free slots. */
  readonly decision: Decision
  /** Gives the slots back (at once in this process, then in the store); a second call does nothing. */
  release(): Promise<void>
}

/** Circuit breaker settings. */
export interface BreakerOptions {
  /** Consecutive store failures that open the breaker. */
  failures: number
  /** How long an open breaker skips the store before letting one probe through, ms. */
  cooldownMs: number
}

export type { IoredisClient, NodeRedisClient, RedisClient, ValkeyGlideClient }

/** Minimal logger: pino's and Fastify's loggers fit. */
export interface Logger {
  warn(obj: object, msg: string): void
  info(obj: object, msg: string): void
  error(obj: object, msg: string): void
}

/** Attributes of one measurement. */
export type MetricAttributes = Record<string, string | boolean>

/** Options of an instrument, as @opentelemetry/api's `MetricOptions`. */
export interface InstrumentOptions {
  description?: string
  unit?: string
  advice?: { explicitBucketBoundaries?: number[] }
}

/**
 * What tollgate uses of an OpenTelemetry `Meter` (@opentelemetry/api 1.x,
 * an optional peer): `metrics.getMeter('tollgate')` or a MeterProvider's
 * `getMeter()` fits. Declared here rather than imported, for the reason
 * RedisClient is (see the top of this file).
 */
export interface MetricsMeter {
  createCounter (name: string, options?: InstrumentOptions): { add (value: number, attributes?: MetricAttributes): void }
  createUpDownCounter (name: string, options?: InstrumentOptions): { add (value: number, attributes?: MetricAttributes): void }
  createHistogram (name: string, options?: InstrumentOptions): { record (value: number, attributes?: MetricAttributes): void }
}

/** OpenTelemetry metrics of one limiter (docs/reference/metrics.md lists the instruments). */
export interface MetricsOptions {
  meter: MetricsMeter
}

export interface LimiterOptions {
  /** Shared store; omitted, an in-process store (one process only). */
  redis?: RedisClient | undefined
  /** Redis key prefix, default 'tollgate'. */
  prefix?: string | undefined
  /**
   * The secret of the keys' hash tags, the same on every server of the fleet
   * (at least 16 characters); default: a random one kept in Redis
   * (docs/reference/keys.md).
   */
  keySecret?: string | undefined
  /** Default deadline for one store decision, ms (default 10). */
  timeout?: number | undefined
  breaker?: Partial<BreakerOptions> | undefined
  /**
   * Denies locally, without a store call, while a bucket that the store
   * denied cannot afford the cost yet (default on, 10 000 entries), and for
   * at most `maxAgeMs` after the call (default 1000): the longest a reset
   * or refund made on another app server can go unseen here.
   */
  denialCache?: { maxKeys?: number | undefined, maxAgeMs?: number | undefined } | false | undefined
  /**
   * Plain decisions asked in one turn of the event loop go to Redis as one
   * script call (on a Cluster, per set of keys), of at most `maxDecisions` (default 64,
   * from 2 to 1024); `false` sends each decision in a call of its own.
   */
  batch?: { maxDecisions?: number | undefined } | false | undefined
  /** Where the store's state changes go; default: process warnings (process.emitWarning). */
  logger?: Logger | undefined
  /** OpenTelemetry metrics, off unless set. */
  metrics?: MetricsOptions | undefined
  /** Most consumes holding a reservation at once in this process (default 1000); past it, calls do not wait. */
  maxWaiters?: number | undefined
  /** While the store fails, one summary line per this many ms at most (default 30000, from 1000 to 3600000). */
  outageSummaryMs?: number | undefined
}

export interface Limiter {
  consume(clientKey: string, policy: Policy | readonly Policy[], cost?: number): Promise<Decision>
  peek(clientKey: string, policy: Policy | readonly Policy[]): Promise<Decision>
  /**
   * Reserves `cost` (as `consume`), to be settled once with the actual
   * cost when it is known: see `settle`.
   */
  reserve(clientKey: string, policy: Policy | readonly Policy[], cost?: number): Promise<Reservation>
  /**
   * Settles a reservation with the actual cost (>= 0): the difference is
   * refunded (never past capacity) or charged (the bucket may go into debt,
   * up to `capacity` tokens) in one atomic call; nothing when the reserve
   * spent nothing. Rejects with a StoreError when the store fails (the
   * reservation then stands, and `failedSettlements` counts it).
   */
  settle(reservation: Reservation, actual: number): Promise<void>
  /** Settlements the store failed since the limiter started. */
  readonly failedSettlements: number
  reset(clientKey: string, bucket: string): Promise<void>
  /**
   * Takes a slot of each concurrency policy and spends each rate policy's
   * cost, all or nothing, in one store call; the slots are held (renewed
   * before their lease ends) until `release()` or `close()`.
   */
  acquire(clientKey: string, policy: ConcurrencyPolicy | Policy | ReadonlyArray<ConcurrencyPolicy | Policy>): Promise<Acquired>
  /**
   * Stops timers and drops local state; consumes waiting for reserved
   * tokens resolve at once as denied; held concurrency slots are released. Never closes the Redis client.
   */
  close(): Promise<void>
  /**
   * 'healthy' while the store answers; 'failing' after a failure (or, with
   * an adapter, from a start-up that found Redis not ready or unable to run
   * the scripts) until a success.
   */
  readonly state: 'healthy' | 'failing'
  /**
   * Loads the scripts into Redis (every master of a Cluster) and makes one
   * peek, as the adapters do before they serve: resolves once done, never
   * rejects (a Redis that cannot run the scripts turns the limiter
   * 'failing'). Started by the first read of `ready`, once; decisions do
   * not wait for it. Without `redis`, resolved at once.
   */
  readonly ready: Promise<void>
}

/** A message of the `tollgate:decision` channel: one per decision. */
export interface DecisionMessage {
  /** The client identity before hashing: the IP, its IPv6 subnet, or what `key` returned. */
  key: string
  decision: Decision
  /** Set on a would-be denial of a shadow policy (as on `decision`). */
  shadow?: true
}

/** Fallback decisions made while the store was failing, by source. */
export interface FallbackCounts {
  local: number
  'fail-open': number
  'fail-closed': number
}

/** A message of the `tollgate:store` channel: the store turned failing, or healthy again. */
export type StoreStateMessage =
  | { state: 'failing', error: StoreError }
  | { state: 'healthy', downMs: number, decisions: FallbackCounts }

/** A message of the `tollgate:breaker` channel. */
export type BreakerMessage =
  | { state: 'open', cooldownMs: number }
  | { state: 'half-open' }
  | { state: 'closed' }
