// What makes a policy valid: every field checked once, where the policy is
// declared (a route, a middleware, a programmatic call), with errors naming
// the field. The limiter's own options are checked here too.
import { optionError } from './errors.js'
import type { Adapter } from './migrating.js'
import {
  FAILURE_MODES, MAX_WINDOW_US, breaker, checkFields, deadlineMs, denialCache, lease, isBoolean, isRecord, keyPrefix, localPolicy, lockout,
  metricsOption, maxWaitMs, nonEmptyString, oneOf, outageSummaryMs, positiveInteger, positiveNumber, redisClient, storableBucket
} from './options.js'
import type { Policy } from './types.js'

/** Checks the limiter's own options (`createLimiter()`, the adapters' store options). */
export function checkLimiterOptions (options: Record<string, unknown>): void {
  checkFields(options, LIMITER_CHECKS, '', {}, 'core')
}

const LIMITER_CHECKS = {
  redis: redisClient,
  prefix: keyPrefix,
  timeout: deadlineMs,
  breaker,
  denialCache,
  metrics: metricsOption,
  maxWaiters: positiveInteger,
  outageSummaryMs,
  logger: (value: unknown, name: string) => {
    if (!isRecord(value) || typeof value.warn !== 'function' || typeof value.info !== 'function' || typeof value.error !== 'function') {
      throw optionError(name, value, 'a logger with warn, info and error methods')
    }
  }
}

/** Checks of a core policy's fields, one per field; the http wing adds the route's own (lib/http/route.ts). */
export const CORE_POLICY_CHECKS = {
  bucket: nonEmptyString,
  capacity: positiveNumber,
  refillPerSecond: positiveNumber,
  cost: positiveNumber,
  failureMode: oneOf(FAILURE_MODES),
  local: localPolicy,
  timeout: deadlineMs,
  lease,
  shadow: isBoolean,
  lockout,
  maxWaitMs
}

/** Checks a core policy; throws a TypeError naming the field (`adapter`: whose users wrote it, for the hints of other libraries' names). */
export function checkPolicy (policy: unknown, where = 'policy.', adapter: Adapter = 'core'): asserts policy is Policy {
  if (!isRecord(policy)) throw optionError(where.slice(0, -1), policy, 'a policy object')
  checkFields(policy, CORE_POLICY_CHECKS, where, {}, adapter)
  for (const name of ['bucket', 'capacity', 'refillPerSecond', 'failureMode'] as const) {
    if (policy[name] === undefined) throw optionError(where + name, undefined, name === 'failureMode' ? "one of 'open', 'closed', 'local'" : 'set')
  }
  const capacity = policy.capacity as number
  storableBucket(capacity, policy.refillPerSecond as number, where)
  const checked = policy as unknown as Policy
  if (checked.cost !== undefined && checked.cost > maxCost(checked)) throw optionError(where + 'cost', checked.cost, `at most ${costBound(checked)}`)
  if (policy.failureMode === 'local' && policy.local === undefined) {
    throw optionError(where + 'local', undefined, "an object { capacity, refillPerSecond } with failureMode 'local'")
  }
  const batch = (policy.lease as { tokens: number } | undefined)?.tokens
  if (batch !== undefined && batch > capacity) throw optionError(where + 'lease.tokens', batch, `at most capacity (${capacity})`)
  const wait = policy.maxWaitMs as number | undefined
  if (wait === undefined) return
  if (policy.shadow === true) throw optionError(where + 'maxWaitMs', wait, 'unset with `shadow: true` (a shadow policy never holds a request)')
  if (capacity * (1e6 / (policy.refillPerSecond as number)) + wait * 1000 > MAX_WINDOW_US) {
    throw optionError(where + 'maxWaitMs', wait, 'at most 2^52 µs less the time an empty bucket takes to fill')
  }
}

/**
 * The largest cost a policy takes: its capacity. A shadow policy never
 * refuses, so a cost above its capacity is a would-be denial there, not an
 * error: up to 2^52 us of refill, the longest wait the scripts reply
 * exactly (see MAX_WINDOW_US).
 */
export function maxCost (policy: Policy): number {
  return policy.shadow === true ? MAX_WINDOW_US / 1e6 * policy.refillPerSecond : policy.capacity
}

/** maxCost, named for an error message: "capacity (10)". */
export function costBound (policy: Policy): string {
  return policy.shadow === true ? `${maxCost(policy)} (2^52 µs of refill, on a shadow policy)` : `capacity (${policy.capacity})`
}

/**
 * A reservation (lua/settle.lua) decides plain buckets: it knows neither
 * lockouts, nor waits, nor shadow policies, so a policy that has one
 * cannot reserve (nor sit on a route that settles).
 */
export function unsettled (policy: Policy, where: string): void {
  for (const name of ['shadow', 'lockout', 'maxWaitMs'] as const) {
    const value = policy[name]
    if (value !== undefined && value !== false) throw optionError(where + name, value, 'unset to reserve and settle (a settlement charges a plain bucket)')
  }
}

/**
 * Checks what only a list of policies can get wrong: `lockout` and
 * `maxWaitMs` serve single-policy checks (one script call decides one
 * bucket with its lockout or reservation).
 */
export function checkPolicies (list: readonly Policy[], where = 'policy'): void {
  if (list.length < 2) return
  for (let i = 0; i < list.length; i++) {
    const policy = list[i] as Policy
    for (const name of ['lockout', 'maxWaitMs'] as const) {
      if (policy[name] !== undefined) throw optionError(`${where}[${i}].${name}`, policy[name], 'unset in an array of policies (it serves single-policy checks)')
    }
  }
}

