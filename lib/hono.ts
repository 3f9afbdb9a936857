// The Hono entry (`tollgate/hono`): the middleware and its public types.
// Hono's hooks are lib/adapters/hono/middleware.ts, over the middleware
// adapters' request path (lib/http/middleware.ts).
export * from './adapters/hono/middleware.js'
export { StoreError } from './core/errors.js'
export type { Tier } from './http/tiers.js'
export type {
  BreakerOptions, Decision, DecisionSource, FailureMode, Limiter, LimiterOptions, LocalPolicy, Lockout, Logger, MetricsMeter, MetricsOptions,
  Policy, RedisClient, Reservation
} from './core/types.js'
