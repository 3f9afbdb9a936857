import type { RouteGenericInterface } from 'fastify'
import plugin from './adapters/fastify/plugin.js'
import { createLimiter as createCoreLimiter } from './core/limiter.js'
import type { RouteRateLimit } from './adapters/fastify/types.js'
import type { Limiter, LimiterOptions } from './core/types.js'

export default plugin
export { plugin as tollgate }
export { decisionChannel } from './core/limiter.js'
export { stateChannel, breakerChannel } from './core/guard.js'
export { RateLimitedError, UnavailableError, BadRequestInputError } from './adapters/fastify/errors.js'
export { StoreError } from './core/errors.js'
export type { Reservation } from './core/settle.js'
export type { Tier } from './http/tiers.js'
export type {
  CostFunction, ProgrammaticPolicy, RoutePolicy, RouteRateLimit, TollgateOptions, TollgateDecorator
} from './adapters/fastify/types.js'
export type {
  BreakerMessage, BreakerOptions, Decision, DecisionMessage, DecisionSource, FailureMode, FallbackCounts, InstrumentOptions, Limiter,
  LimiterOptions, LocalPolicy, Lockout, Logger, Acquired, ConcurrencyLimit, ConcurrencyPolicy, MetricAttributes, MetricsMeter, MetricsOptions, Policy, IoredisClient, NodeRedisClient, RedisClient, ValkeyGlideClient, StoreStateMessage
} from './core/types.js'

/**
 * The framework-free limiter: token buckets in Redis (or, without `redis`,
 * in this process), with each policy's failure mode applied when the store
 * fails or misses its deadline.
 */
export function createLimiter (options?: LimiterOptions): Limiter {
  return createCoreLimiter(options)
}

/**
 * Returns its argument unchanged, typed as a route's `config.rateLimit`:
 * unknown or mistyped fields are compile errors, which Fastify's route
 * shorthands cannot report on a bare literal. The type parameter gives
 * `key`, `cost` and `allow` the route's request type:
 * `routePolicy<{ Params: { id: string } }>({ key: (request) => request.params.id })`.
 */
export function routePolicy<RouteGeneric extends RouteGenericInterface = RouteGenericInterface> (
  policy: RouteRateLimit<RouteGeneric>
): RouteRateLimit {
  return policy
}
