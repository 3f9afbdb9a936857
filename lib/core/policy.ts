// What makes a policy valid: every field checked once, where the policy is
// declared (a route, a middleware, a programmatic call), with errors naming
// the field. The limiter's own options are checked here too.
import { optionError } from './errors.js'
import type { Adapter } from './migrating.js'
import {
  MAX_WINDOW_US, batch, breaker, parseFields, deadlineMs, denialCache, isRecord, keyPrefix, keySecret, metricsOption, outageSummaryMs, positiveInteger,
  redisClient, storableBucket
} from './options.js'
import { CORE_POLICY_CHECKS, checkCombination, checkCost, checkLocalSet, checkRequired } from './policy-fields.js'
import type { Logger, Policy } from './types.js'

/** Checks the limiter's own options (`createLimiter()`, the adapters' store options). */
export function checkLimiterOptions (options: Record<string, unknown>): void {
  parseFields(options, LIMITER_CHECKS, '', {}, 'core')
}

export const LIMITER_CHECKS = {
  redis: redisClient,
  prefix: keyPrefix,
  keySecret,
  timeout: deadlineMs,
  breaker,
  denialCache,
  batch,
  metrics: metricsOption,
  maxWaiters: positiveInteger,
  outageSummaryMs,
  logger: (value: unknown, name: string): Logger => {
    if (!isLogger(value)) throw optionError(name, value, 'a logger with warn, info and error methods')
    return value
  }
}

function isLogger (value: unknown): value is Logger {
  return isRecord(value) && typeof value.warn === 'function' && typeof value.info === 'function' && typeof value.error === 'function'
}

/** Checks a core policy; throws a TypeError naming the field (`adapter`: whose users wrote it, for the hints of other libraries' names). */
export function checkPolicy (policy: unknown, where = 'policy.', adapter: Adapter = 'core'): asserts policy is Policy {
  parsePolicy(policy, where, adapter)
}

/**
 * A core policy from `input`, parsed: a new object holding its fields, typed
 * and checked alone and together (lib/core/policy-fields.ts); throws a
 * TypeError naming the field. A missing capacity or rate is `expected`
 * (where to set it, for an adapter).
 */
export function parsePolicy (input: unknown, where = 'policy.', adapter: Adapter = 'core', expected = 'set'): Policy {
  if (!isRecord(input)) throw optionError(where.slice(0, -1), input, 'a policy object')
  // Only the fields that are set, as the app wrote them (no key holds undefined).
  const policy = parseFields(input, CORE_POLICY_CHECKS, where, {}, adapter)
  checkRequired(policy, where, expected)
  const { capacity, refillPerSecond, cost, shadow } = policy
  storableBucket(capacity, refillPerSecond, where)
  if (cost !== undefined) checkCost(cost, policy, (bound) => optionError(where + 'cost', cost, `at most ${bound}`))
  checkLocalSet(policy, where)
  const batch = policy.lease?.tokens
  if (batch !== undefined && batch > capacity) throw optionError(where + 'lease.tokens', batch, `at most capacity (${capacity})`)
  const wait = policy.maxWaitMs
  if (wait === undefined) return policy
  checkCombination(policy, shadow === true ? ['shadow'] : [], where)
  if (capacity * (1e6 / refillPerSecond) + wait * 1000 > MAX_WINDOW_US) {
    throw optionError(where + 'maxWaitMs', wait, 'at most 2^52 µs less the time an empty bucket takes to fill')
  }
  return policy
}

/**
 * Checks what only a list of policies can get wrong: the fields that serve
 * single-policy checks (lib/core/policy-fields.ts, `list`).
 */
export function checkPolicies (list: readonly Policy[], where = 'policy'): void {
  if (list.length < 2) return
  for (const [i, policy] of list.entries()) checkCombination(policy, ['list'], `${where}[${i}].`)
}

/** Checks a policy of a route that settles (lib/http/settle-route.ts): what a reservation refuses. */
export function unsettled (policy: Policy, where: string): void {
  checkCombination(policy, ['settle'], where)
}

export { CORE_POLICY_CHECKS, LEASE_IN_LIST, checkCost, costBound, maxCost } from './policy-fields.js'
