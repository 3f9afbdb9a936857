import type { Cluster, Redis } from 'ioredis'

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
}

/** Size and rate of an in-process bucket. */
export interface LocalPolicy {
  capacity: number
  refillPerSecond: number
}

/** A limit, as the core takes it. */
export interface Policy {
  /** Bucket name; every policy with the same name and client shares one bucket. */
  bucket: string
  capacity: number
  refillPerSecond: number
  /** Tokens one call costs, default 1. */
  cost?: number
  failureMode: FailureMode
  /** Required with failureMode 'local'. */
  local?: LocalPolicy
  /** Deadline for one store decision, ms (default: the limiter's). */
  timeout?: number
  /**
   * Opt-in token leases: take `tokens` at a time from the shared bucket and
   * spend them in this process; a batch is given back once older than
   * `maxAgeMs`. Single-policy checks only.
   */
  lease?: { tokens: number, maxAgeMs: number }
}

/** Circuit breaker settings. */
export interface BreakerOptions {
  /** Consecutive store failures that open the breaker. */
  failures: number
  /** How long an open breaker skips the store before letting one probe through, ms. */
  cooldownMs: number
}

export type RedisClient = Redis | Cluster

/** Minimal logger: pino's and Fastify's loggers fit. */
export interface Logger {
  warn(obj: object, msg: string): void
  info(obj: object, msg: string): void
  error(obj: object, msg: string): void
}

export interface LimiterOptions {
  /** Shared store; omitted, an in-process store (one process only). */
  redis?: RedisClient
  /** Redis key prefix, default 'tollgate'. */
  prefix?: string
  /** Default deadline for one store decision, ms (default 10). */
  timeout?: number
  breaker?: Partial<BreakerOptions>
  /**
   * Denies locally, without a store call, while a bucket that the store
   * denied cannot afford the cost yet (default on, 10 000 entries).
   */
  denialCache?: { maxKeys?: number } | false
  logger?: Logger
}

export interface Limiter {
  consume(clientKey: string, policy: Policy | readonly Policy[], cost?: number): Promise<Decision>
  peek(clientKey: string, policy: Policy | readonly Policy[]): Promise<Decision>
  reset(clientKey: string, bucket: string): Promise<void>
  /** Stops timers and drops local state; never closes the Redis client. */
  close(): Promise<void>
  /** 'healthy' while the store answers, 'failing' after a failure until a success. */
  readonly state: 'healthy' | 'failing'
}
