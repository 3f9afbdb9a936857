// The Express entry (`tollgate/express`): the middleware and its public types.
// Express's hooks are lib/adapters/express/middleware.ts, over the middleware
// adapters' request path (lib/http/middleware.ts).
export * from './adapters/express/middleware.js'
export { StoreError } from './core/errors.js'
export type { Tier } from './http/tiers.js'
export type {
  BreakerOptions, Decision, DecisionSource, FailureMode, Limiter, LimiterOptions, LocalPolicy, Lockout, Logger, MetricsMeter, MetricsOptions,
  Policy, IoredisClient, NodeRedisClient, RedisClient, ValkeyGlideClient, Reservation
} from './core/types.js'
