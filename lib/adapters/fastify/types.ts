// Fastify infers a route's `config` type from the literal it is given, so
// the `rateLimit` declared on FastifyContextConfig below catches a mistyped
// field (`capacity: '5'`) but not an unknown one (`max: 5`), nor a value of
// the wrong kind (`'yes'`, `true`): TypeScript cannot do better there. A
// policy written through `routePolicy()` (or with `satisfies RoutePolicy`)
// is checked in full, and the registration rejects at run time whatever the
// types let through. The function options are declared as methods so that a
// policy typed for a route's generics (`request.params`) still fits the
// untyped route config.

import type { FastifyReply, FastifyRequest, RouteGenericInterface } from 'fastify'
import type { Reservation } from '../../core/settle.js'
import type { Tier } from '../../http/tiers.js'
import type { BreakerOptions, Decision, FailureMode, Limiter, LocalPolicy, Lockout, MetricsOptions, RedisClient } from '../../core/types.js'

/** A limit as the plugin and routes take it; route values merge over the plugin's. */
export interface RoutePolicy<RouteGeneric extends RouteGenericInterface = RouteGenericInterface> {
  /** Largest burst, in tokens. */
  capacity?: number | undefined
  /** Tokens added per second. */
  refillPerSecond?: number | undefined
  /** Tokens this request costs (default 1); a function may read the request. */
  cost?: number | CostFunction<RouteGeneric> | undefined
  /** What the limit does when the store fails or misses its deadline. */
  failureMode?: FailureMode | undefined
  /** The in-process limit used by failureMode 'local'. */
  local?: LocalPolicy | undefined
  /** Client identity (default: the client's IP, IPv6 reduced to its subnet). */
  key?(request: FastifyRequest<RouteGeneric>): string | Promise<string>
  /** Bucket name; routes naming the same bucket share it (default: method and route pattern). */
  bucket?: string | undefined
  /** Deadline for one store decision, ms (default 10). */
  timeout?: number | undefined
  /** Which rate-limit headers to send (default 'draft-6'). */
  headers?: 'draft-6' | 'draft-10' | 'legacy' | false | undefined
  /** Where the check runs (default 'onRequest'); 'preHandler' lets key and cost read the body. */
  hook?: 'onRequest' | 'preHandler' | undefined
  /** Requests for which it returns true skip the limiter. */
  allow?(request: FastifyRequest<RouteGeneric>): boolean | Promise<boolean>
  /** Opt-in token leases: take `tokens` at a time, give unspent ones back after `maxAgeMs`. */
  lease?: { tokens: number, maxAgeMs: number } | undefined
  /**
   * The client's plan, per request: `{ capacity, refillPerSecond }` over
   * this policy, or false for no limit. Each returned object is validated
   * once: return the same objects (`PLANS[user.plan]`).
   */
  limit?(request: FastifyRequest<RouteGeneric>): Tier | false | Promise<Tier | false>
  /**
   * Charging by outcome: the request reserves `cost`, and after the
   * response this gives the actual cost (0: free); the difference is
   * refunded or charged. One per route.
   */
  settle?(request: FastifyRequest<RouteGeneric>, reply: FastifyReply): number | Promise<number>
  /** Shadow mode: decided and counted as usual, never refuses (docs/guides/shadow-lockouts-waiting.md). */
  shadow?: boolean | undefined
  /** Block the client for `forMs` after `after` denials within `withinMs` of the first. Single-policy limits only. */
  lockout?: Lockout | undefined
  /** Wait up to this many ms for the tokens (reserved at once) instead of a 429. Single-policy limits only. */
  maxWaitMs?: number | undefined
}

/**
 * A `cost` function: the tokens a request costs. Taken from a method so that
 * its parameter is checked bivariantly, as `key` and `allow` are.
 */
export type CostFunction<RouteGeneric extends RouteGenericInterface = RouteGenericInterface> = {
  cost (request: FastifyRequest<RouteGeneric>): number | Promise<number>
}['cost']

/** What `config.rateLimit` of a route takes: one policy, several checked together, or false. */
export type RouteRateLimit<RouteGeneric extends RouteGenericInterface = RouteGenericInterface> =
  | RoutePolicy<RouteGeneric>
  | ReadonlyArray<RoutePolicy<RouteGeneric>>
  | false

/** The plugin's options. */
export interface TollgateOptions extends RoutePolicy {
  /** Shared store: an ioredis or iovalkey Redis or Cluster, a node-redis client or cluster, a GLIDE client; omitted, an in-process store. Never closed by the plugin. */
  redis?: RedisClient | undefined
  /** Required: there is deliberately no default. */
  failureMode: FailureMode
  /** Limit every route (default true); false: only routes with config.rateLimit. */
  global?: boolean | undefined
  /** Redis key prefix (default 'tollgate'). */
  prefix?: string | undefined
  /**
   * The secret of the keys' hash tags, the same on every server of the fleet
   * (at least 16 characters); default: a random one kept in Redis
   * (docs/reference/keys.md).
   */
  keySecret?: string | undefined
  /** IPv6 clients are keyed by this prefix length (default 56). */
  ipv6Subnet?: number | undefined
  /** Circuit breaker (default { failures: 5, cooldownMs: 1000 }). */
  breaker?: Partial<BreakerOptions> | undefined
  /**
   * Deny locally while a denied bucket cannot afford the cost yet, for at most
   * `maxAgeMs` after the call (default on, { maxKeys: 10000, maxAgeMs: 1000 }).
   */
  denialCache?: { maxKeys?: number | undefined, maxAgeMs?: number | undefined } | false | undefined
  /**
   * Plain decisions asked in one turn of the event loop go to Redis as one
   * script call (on a Cluster, per set of keys), of at most `maxDecisions` (default 64,
   * from 2 to 1024); `false` sends each decision in a call of its own.
   */
  batch?: { maxDecisions?: number | undefined } | false | undefined
  /** OpenTelemetry metrics, off unless set: `{ meter }`, a Meter of @opentelemetry/api. */
  metrics?: MetricsOptions | undefined
  /**
   * 404s: true limits them with the plugin's options, a policy (or several)
   * over the plugin's options, false leaves them unlimited. One bucket per
   * client, named '404' unless the policy names one. Default: `global`.
   */
  notFound?: boolean | RoutePolicy | readonly RoutePolicy[] | undefined
  /**
   * Configuration warnings (default all on): `proxy`, requests that came
   * through a proxy Fastify does not trust; `trustProxy`, a `trustProxy`
   * that trusts every address at every hop. `false` silences both.
   */
  warnings?: { proxy?: boolean | undefined, trustProxy?: boolean | undefined } | false | undefined
  /** Most consumes waiting for reserved tokens at once in this process (default 1000); past it, calls do not wait. */
  maxWaiters?: number | undefined
  /** While the store fails, one summary line per this many ms at most (default 30000, from 1000 to 3600000). */
  outageSummaryMs?: number | undefined
  /**
   * How a 503 of a limit with failureMode 'closed' is answered during an
   * outage: 'send' (default), sent as a reply, so Fastify logs no error per
   * request; 'throw', thrown as an UnavailableError through Fastify's error
   * pipeline (the app's error handler answers it; Fastify's default one
   * logs each at error level).
   */
  unavailable?: 'send' | 'throw' | undefined
}

/**
 * A policy of `app.tollgate.consume` / `peek`: it names its bucket, is merged
 * over the plugin's options, and takes a numeric cost only (pass a computed
 * cost as the third argument). Route-only settings (`key`, `hook`,
 * `headers`, `allow`) have no meaning here.
 */
export interface ProgrammaticPolicy {
  bucket: string
  capacity?: number | undefined
  refillPerSecond?: number | undefined
  cost?: number | undefined
  failureMode?: FailureMode | undefined
  local?: LocalPolicy | undefined
  timeout?: number | undefined
  lease?: { tokens: number, maxAgeMs: number } | undefined
  /** Shadow mode: decided and counted as usual, never refuses (docs/guides/shadow-lockouts-waiting.md). */
  shadow?: boolean | undefined
  /** Block the client for `forMs` after `after` denials within `withinMs` of the first. Single-policy limits only. */
  lockout?: Lockout | undefined
  /** Wait up to this many ms for the tokens (reserved at once) instead of a 429. Single-policy limits only. */
  maxWaitMs?: number | undefined
}

/** `app.tollgate`: programmatic checks with the plugin's store and defaults. */
export interface TollgateDecorator {
  consume (clientKey: string, policy: ProgrammaticPolicy, cost?: number): Promise<Decision>
  peek (clientKey: string, policy: ProgrammaticPolicy): Promise<Decision>
  /** Reserves `cost` (as `consume`); settle the handle once with the actual cost. */
  reserve (clientKey: string, policy: ProgrammaticPolicy, cost?: number): Promise<Reservation>
  /** Refunds or charges the difference between the actual cost and the reservation. */
  settle (reservation: Reservation, actual: number): Promise<void>
  reset (clientKey: string, bucket: string): Promise<void>
  /** The core limiter behind the plugin. */
  readonly limiter: Limiter
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** A policy over the plugin's defaults, several checked together, or false to opt out. */
    rateLimit?: RouteRateLimit | undefined
  }
  interface FastifyRequest {
    /** The decision for this request; undefined when no limit applied. */
    rateLimit?: Decision | undefined
  }
  interface FastifyInstance {
    tollgate: TollgateDecorator
  }
}
