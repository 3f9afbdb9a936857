import type { FastifyRequest } from 'fastify'
import type { CoreLimiter } from './limiter.js'
import type { BreakerOptions, Decision, FailureMode, LocalPolicy, RedisClient } from './types.js'

/** A limit as the plugin and routes take it; route values merge over the plugin's. */
export interface RoutePolicy {
  /** Largest burst, in tokens. */
  capacity?: number
  /** Tokens added per second. */
  refillPerSecond?: number
  /** Tokens this request costs (default 1); a function may read the request. */
  cost?: number | ((request: FastifyRequest) => number | Promise<number>)
  /** What the limit does when the store fails or misses its deadline. */
  failureMode?: FailureMode
  /** The in-process limit used by failureMode 'local'. */
  local?: LocalPolicy
  /** Client identity (default: the client's IP, IPv6 reduced to its subnet). */
  key?: (request: FastifyRequest) => string | Promise<string>
  /** Bucket name; routes naming the same bucket share it (default: method and route pattern). */
  bucket?: string
  /** Deadline for one store decision, ms (default 10). */
  timeout?: number
  /** Which rate-limit headers to send (default 'draft-6'). */
  headers?: 'draft-6' | 'draft-10' | 'legacy' | false
  /** Where the check runs (default 'onRequest'); 'preHandler' lets key and cost read the body. */
  hook?: 'onRequest' | 'preHandler'
  /** Requests for which it returns true skip the limiter. */
  allow?: (request: FastifyRequest) => boolean | Promise<boolean>
  /** Opt-in token leases: take `tokens` at a time, give unspent ones back after `maxAgeMs`. */
  lease?: { tokens: number, maxAgeMs: number }
}

export interface TollgateOptions extends RoutePolicy {
  /** Shared store, an ioredis Redis or Cluster; omitted, an in-process store. Never closed by the plugin. */
  redis?: RedisClient
  /** Required: there is deliberately no default. */
  failureMode: FailureMode
  /** Limit every route (default true); false: only routes with config.rateLimit. */
  global?: boolean
  /** Redis key prefix (default 'tollgate'). */
  prefix?: string
  /** IPv6 clients are keyed by this prefix length (default 56). */
  ipv6Subnet?: number
  /** Circuit breaker (default { failures: 5, cooldownMs: 1000 }). */
  breaker?: Partial<BreakerOptions>
  /** Deny locally while a denied bucket cannot afford the cost yet (default on, { maxKeys: 10000 }). */
  denialCache?: { maxKeys?: number } | false
  /**
   * 404s: true limits them with the plugin's options, a policy (or several)
   * over the plugin's options, false leaves them unlimited. One bucket per
   * client, named '404' unless the policy names one. Default: `global`.
   */
  notFound?: boolean | RoutePolicy | readonly RoutePolicy[]
}

/** `app.tollgate`: programmatic checks with the plugin's store and defaults. */
export interface TollgateDecorator {
  consume (clientKey: string, policy: RoutePolicy & { bucket: string }, cost?: number): Promise<Decision>
  peek (clientKey: string, policy: RoutePolicy & { bucket: string }): Promise<Decision>
  reset (clientKey: string, bucket: string): Promise<void>
  /** The core limiter behind the plugin. */
  readonly limiter: CoreLimiter
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** A policy over the plugin's defaults, several checked together, or false to opt out. */
    rateLimit?: RoutePolicy | readonly RoutePolicy[] | false
  }
  interface FastifyRequest {
    /** The decision for this request; undefined when no limit applied. */
    rateLimit?: Decision
  }
  interface FastifyInstance {
    tollgate: TollgateDecorator
  }
}
