// The NestJS entry (`tollgate/nest`): the module, its service and guard,
// the decorators and the denial's exception. Nest's hooks are
// lib/adapters/nest/hooks.ts, over the middleware adapters' request path
// (lib/http/middleware.ts).
export { TOLLGATE_OPTIONS, TollgateModule, TollgateService, type NestAsyncOptions } from './adapters/nest/module.js'
export { RATE_LIMIT, RateLimit, SkipRateLimit } from './adapters/nest/decorators.js'
export { RateLimitException } from './adapters/nest/errors.js'
export { RateLimitError } from './http/instance.js'
export type * from './adapters/nest/types.js'
export { StoreError } from './core/errors.js'
export type { Tier } from './http/tiers.js'
export type {
  BreakerOptions, Decision, DecisionSource, FailureMode, Limiter, LimiterOptions, LocalPolicy, Lockout, Logger, MetricsMeter, MetricsOptions,
  Policy, IoredisClient, NodeRedisClient, RedisClient, ValkeyGlideClient, Reservation
} from './core/types.js'
