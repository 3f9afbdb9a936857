// What makes a policy valid: every field checked once, where the policy is
// declared (a route, a middleware, a programmatic call), with errors naming
// the field. The limiter's own options are checked here too.
import { optionError } from './errors.js'
import type { Adapter } from './migrating.js'
import {
  FAILURE_MODES, MAX_WINDOW_US, batch, breaker, parseFields, deadlineMs, denialCache, lease, isBoolean, isRecord, keyPrefix, keySecret, localPolicy, lockout,
  metricsOption, maxWaitMs, nonEmptyString, oneOf, outageSummaryMs, positiveInteger, positiveNumber, redisClient, storableBucket
} from './options.js'
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
  parsePolicy(policy, where, adapter)
}

/**
 * A core policy from `input`, parsed: a new object holding its fields, typed
 * and checked alone and together; throws a TypeError naming the field. A
 * missing capacity or rate is `expected` (where to set it, for an adapter).
 */
export function parsePolicy (input: unknown, where = 'policy.', adapter: Adapter = 'core', expected = 'set'): Policy {
  if (!isRecord(input)) throw optionError(where.slice(0, -1), input, 'a policy object')
  const { bucket, capacity, refillPerSecond, failureMode, cost, local, timeout, lease, shadow, lockout, maxWaitMs } = parseFields(input, CORE_POLICY_CHECKS, where, {}, adapter)
  if (bucket === undefined) throw optionError(where + 'bucket', undefined, 'set')
  if (capacity === undefined) throw optionError(where + 'capacity', undefined, expected)
  if (refillPerSecond === undefined) throw optionError(where + 'refillPerSecond', undefined, expected)
  if (failureMode === undefined) throw optionError(where + 'failureMode', undefined, "one of 'open', 'closed', 'local'")
  const policy: Policy = { bucket, capacity, refillPerSecond, failureMode }
  // Only the fields that are set, as the app wrote them (no key holds undefined).
  if (cost !== undefined) policy.cost = cost
  if (local !== undefined) policy.local = local
  if (timeout !== undefined) policy.timeout = timeout
  if (lease !== undefined) policy.lease = lease
  if (shadow !== undefined) policy.shadow = shadow
  if (lockout !== undefined) policy.lockout = lockout
  if (maxWaitMs !== undefined) policy.maxWaitMs = maxWaitMs
  storableBucket(capacity, refillPerSecond, where)
  if (policy.cost !== undefined && policy.cost > maxCost(policy)) throw optionError(where + 'cost', policy.cost, `at most ${costBound(policy)}`)
  if (failureMode === 'local' && policy.local === undefined) {
    throw optionError(where + 'local', undefined, "an object { capacity, refillPerSecond } with failureMode 'local'")
  }
  const batch = policy.lease?.tokens
  if (batch !== undefined && batch > capacity) throw optionError(where + 'lease.tokens', batch, `at most capacity (${capacity})`)
  const wait = maxWaitMs
  if (wait === undefined) return policy
  if (shadow === true) throw optionError(where + 'maxWaitMs', wait, 'unset with `shadow: true` (a shadow policy never holds a request)')
  if (capacity * (1e6 / refillPerSecond) + wait * 1000 > MAX_WINDOW_US) {
    throw optionError(where + 'maxWaitMs', wait, 'at most 2^52 µs less the time an empty bucket takes to fill')
  }
  return policy
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

/** Why a list of policies refuses a `lease`, in the routes' words and the core's. */
export const LEASE_IN_LIST = 'unset in an array of policies (leases serve single-policy routes)'

/**
 * Checks what only a list of policies can get wrong: `lockout` and
 * `maxWaitMs` serve single-policy checks (one script call decides one
 * bucket with its lockout or reservation), and so does `lease` (a batch is
 * taken from one bucket; a list is decided by Redis on every call).
 */
export function checkPolicies (list: readonly Policy[], where = 'policy'): void {
  if (list.length < 2) return
  for (const [i, policy] of list.entries()) {
    if (policy.lease !== undefined) throw optionError(`${where}[${i}].lease`, policy.lease, LEASE_IN_LIST)
    for (const name of ['lockout', 'maxWaitMs'] as const) {
      if (policy[name] !== undefined) throw optionError(`${where}[${i}].${name}`, policy[name], 'unset in an array of policies (it serves single-policy checks)')
    }
  }
}

