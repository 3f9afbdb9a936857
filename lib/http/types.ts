// The public option types of every adapter, declared once and instantiated
// per framework: a policy's fields are generic over the request the app's
// functions receive (Fastify's `request`, Express's `req`, Hono's `c`) and
// over what `settle` is given after the response; an instance's options
// add the store's and the instance's settings. The adapters name the
// instances (ExpressPolicy, HonoOptions, Fastify's RoutePolicy...), which
// are the public API.
//
// The functions of a policy are declared as methods, so that their
// parameter is checked bivariantly: a function written for a route's own
// request type (`Request<Params>`, `Context<Env, Path>`,
// `FastifyRequest<RouteGeneric>`) fits.

import type { HeaderMode } from './headers.js'
import type { Tier } from './tiers.js'
import type { BreakerOptions, FailureMode, LimiterOptions, LocalPolicy, Logger, MetricsOptions, Policy, RedisClient } from '../core/types.js'

/**
 * The fields of a policy that the programmatic API takes as well as a
 * route: the core's (lib/core/types.ts), each optional over the instance's.
 * Every field of the core's Policy but those restated here (and the
 * bucket and cost, which a route names and prices its own way), so a new
 * field of the core's is an option of every adapter with no edit here.
 */
export interface CorePolicyFields extends Partial<Omit<Policy, 'bucket' | 'cost' | 'capacity' | 'refillPerSecond' | 'failureMode' | 'local'>> {
  /** The in-process limit of failureMode 'local': `{ capacity, refillPerSecond }`, or `{ max }` with `concurrency`. */
  local?: LocalPolicy | { max: number } | undefined
  /** Largest burst, in tokens. */
  capacity?: number | undefined
  /** Tokens added per second. */
  refillPerSecond?: number | undefined
  /** What the limit does when the store fails or misses its deadline. */
  failureMode?: FailureMode | undefined
}

/**
 * A `cost` function of a request. Taken from a method so that its
 * parameter is checked bivariantly, as `key` and `allow` are.
 */
export type RequestCost<Req> = {
  cost (request: Req): number | Promise<number>
}['cost']

/**
 * A limit as a route (or a middleware) takes it, over the instance's
 * options: `Req` is what the app's functions receive, `Settled` the
 * arguments of `settle` once the response is finished.
 */
export interface PolicyFields<Req, Settled extends readonly unknown[]> extends CorePolicyFields {
  /** Tokens this request costs (default 1); a function may read the request. */
  cost?: number | RequestCost<Req> | undefined
  /** Client identity (default: the client's address as the framework resolves it, IPv6 reduced to its subnet). */
  key?(request: Req): string | Promise<string>
  /** Bucket name; limits naming the same bucket share it (default: the method and route pattern, see the adapter's guide). */
  bucket?: string | undefined
  /** Which rate-limit headers to send (default 'draft-6'; 'draft-11': RateLimit with `t` the effective window). */
  headers?: HeaderMode | undefined
  /** Answers the 429 and the fail-closed 503 as `application/problem+json` (RFC 9457; default false). */
  problemDetails?: boolean | undefined
  /** With headers 'draft-11', each RateLimit item carries `pk`, the client's partition key: a keyed digest, the same on every server (default false). */
  partitionKey?: boolean | undefined
  /** Requests for which it returns true skip the limiter. */
  allow?(request: Req): boolean | Promise<boolean>
  /**
   * The client's plan, per request: `{ capacity, refillPerSecond }` over
   * this policy, or false for no limit. Each returned object is validated
   * once: return the same objects (`PLANS[user.plan]`).
   */
  limit?(request: Req): Tier | false | Promise<Tier | false>
  /**
   * Charging by outcome: the request reserves `cost`, and once the response
   * is finished this gives the actual cost (0: free); the difference is
   * refunded or charged. One per route.
   */
  settle?(...settled: Settled): number | Promise<number>
}

/** A middleware adapter's limit: a policy with its own answer to a denial. */
export interface HandledPolicy<Req, Settled extends readonly unknown[], Handler> extends PolicyFields<Req, Settled> {
  /** Answers this limit's denied requests (default: the options' `handler`, else tollgate sends the 429 or 503 JSON body). One per route. */
  handler?: Handler | undefined
}

/** A policy of the programmatic API (`consume`, `peek`): it names its bucket; its cost is a number. */
export interface ProgrammaticFields extends CorePolicyFields {
  bucket: string
  cost?: number | undefined
}

/**
 * The settings of an instance that no route has: its store (the limiter's
 * own options, lib/core/types.ts), and how it warns.
 */
export interface InstanceFields extends Pick<LimiterOptions, 'prefix' | 'keySecret' | 'denialCache' | 'batch' | 'outageSummaryMs'> {
  /** Shared store: an ioredis or iovalkey Redis or Cluster, a node-redis client or cluster, a GLIDE client; omitted, an in-process store. Never closed. */
  redis?: RedisClient | undefined
  /** Required: there is deliberately no default. */
  failureMode: FailureMode
  /** IPv6 clients are keyed by this prefix length (default 56). */
  ipv6Subnet?: number | undefined
  /** Circuit breaker (default { failures: 5, cooldownMs: 1000 }). */
  breaker?: Partial<BreakerOptions> | undefined
  /** OpenTelemetry metrics, off unless set: `{ meter }`, a Meter of @opentelemetry/api (docs/reference/metrics.md). */
  metrics?: MetricsOptions | undefined
  /** Most requests or calls waiting for reserved tokens at once in this process (default 1000); past it, they do not wait. */
  maxWaiters?: number | undefined
  /**
   * Configuration warnings (default on): `proxy`, a forwarding header on a
   * request while the framework (or `trustProxy`) trusts no proxy;
   * `trustProxy`, a proxy setting that trusts every address at every hop.
   * `false` silences both.
   */
  warnings?: { proxy?: boolean | undefined, trustProxy?: boolean | undefined } | false | undefined
}

/** The settings of a middleware adapter's instance (`rateLimit()`), which has no framework logger to use. */
export interface MiddlewareFields extends InstanceFields {
  /** Where warnings and store state changes go (default: the console). */
  logger?: Logger | undefined
}

/**
 * An instance's options: its policy `P` (the defaults its routes merge
 * over; `failureMode` required there) and its settings `Own`.
 */
export type InstanceOptions<P, Own extends InstanceFields> = Omit<P, 'failureMode'> & Own
