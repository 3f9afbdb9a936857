import plugin from './plugin.js'

export default plugin
export { plugin as tollgate }
export { createLimiter, decisionChannel } from './limiter.js'
export { stateChannel, breakerChannel } from './guard.js'
export { RateLimitedError, UnavailableError, BadRequestInputError, StoreError } from './errors.js'
export type { RoutePolicy, TollgateOptions, TollgateDecorator } from './plugin-types.js'
export type {
  BreakerOptions, Decision, DecisionSource, FailureMode, Limiter, LimiterOptions, LocalPolicy, Logger, Policy, RedisClient
} from './types.js'
