// A policy, declared once. Each field of the core's Policy has one row
// here: its parser (lib/core/options.ts), whether it must be set, whether
// the store needs it with each bucket, and where it cannot be used. From
// the rows come the parsers of a policy's fields (CORE_POLICY_CHECKS, which
// the http wing extends for a route), the fields a route's settings hand to
// the core (policyFields), which features take the extended decision path
// (EXTENDED), and the combination rules (checkCombination), so a new field
// is one row, not an edit in each place that lists fields.
//
// Why the refusals. A list of policies is decided by one script call per
// request: a lease is a batch of one bucket, a lockout and a wait are
// decided by lua/token-bucket-ext.lua on one bucket, so each serves a
// single-policy check. A reservation (lua/settle.lua) charges a plain
// bucket: it knows neither lockouts, nor waits, nor shadow policies, and a
// leased bucket is spent from this server's batch, which a settlement
// cannot reach. A shadow policy never holds a request, so it cannot wait.
// A concurrency policy (lib/core/concurrency.ts) holds slots, not tokens:
// it has no sizes, cost, lease or lockout of its own (`concurrency` refuses
// them; its `maxWaitMs` is a wait for a slot), a reservation cannot settle
// a slot, and a consume or peek has no release to give one back (`acquire`
// takes slots).

import { optionError } from './errors.js'
import { concurrencyLimit, localLimit } from './concurrency-policy.js'
import {
  FAILURE_MODES, MAX_WINDOW_US, deadlineMs, isBoolean, lease, lockout, maxWaitMs, nonEmptyString, oneOf, positiveNumber, type Parse
} from './options.js'
import type { Policy } from './types.js'

/** Where a policy is used, besides alone on a route or in a call. */
export type Use = 'list' | 'reserve' | 'settle' | 'shadow' | 'concurrency' | 'decide'

/** Marks a required field whose missing value the caller words (an adapter: where to set it). */
const EXPECTED = Symbol('expected')

/** One field of a policy. */
interface Field<T> {
  readonly parse: Parse<T>
  /** What a missing value should have been; undefined: optional. */
  readonly required?: string | typeof EXPECTED
  /** Sent to the store with each bucket (lib/store/store.ts BucketSpec). */
  readonly store?: true
  /**
   * Takes the extended decision path (lib/core/engine.ts `#extras`): in a
   * call of its own after the enforced policies (`shadow`), or decided by
   * lua/token-bucket-ext.lua on its one bucket (`ext`: a lockout, a wait).
   */
  readonly path?: 'shadow' | 'ext'
  /** Why each use refuses the field when it is set (true for a boolean); absent: allowed. */
  readonly refused?: Readonly<Partial<Record<Use, string>>>
}

function field<T> (parse: Parse<T>, rest: Omit<Field<T>, 'parse'> = {}): Field<T> {
  return { parse, ...rest }
}

/** Why a list of policies refuses a `lease`, in the routes' words and the core's. */
export const LEASE_IN_LIST = 'unset in an array of policies (leases serve single-policy routes)'
const SINGLE_POLICY = 'unset in an array of policies (it serves single-policy checks)'
const UNSETTLED = 'unset to reserve and settle (a settlement charges a plain bucket)'
export const SLOTS_ONLY = 'unset with `concurrency` (a concurrency policy limits concurrency only: list a rate policy beside it)'

/** The policy's fields, in the order their errors are reported. */
export const POLICY_FIELDS = {
  bucket: field(nonEmptyString, { required: 'set', store: true }),
  capacity: field(positiveNumber, { required: EXPECTED, store: true, refused: { concurrency: SLOTS_ONLY } }),
  refillPerSecond: field(positiveNumber, { required: EXPECTED, store: true, refused: { concurrency: SLOTS_ONLY } }),
  cost: field(positiveNumber, { store: true, refused: { concurrency: SLOTS_ONLY } }),
  failureMode: field(oneOf(FAILURE_MODES), { required: "one of 'open', 'closed', 'local'" }),
  local: field(localLimit),
  timeout: field(deadlineMs),
  lease: field(lease, {
    refused: {
      list: LEASE_IN_LIST,
      concurrency: SLOTS_ONLY,
      reserve: 'unset to reserve: a leased bucket is spent from this server\'s batch, which a settlement cannot reach',
      settle: 'unset on a route that settles: leased tokens are spent from this server\'s batch, and a settlement could neither refund into it nor charge past it'
    }
  }),
  shadow: field(isBoolean, { path: 'shadow', refused: { reserve: UNSETTLED, settle: UNSETTLED } }),
  lockout: field(lockout, { path: 'ext', refused: { list: SINGLE_POLICY, reserve: UNSETTLED, settle: UNSETTLED, concurrency: SLOTS_ONLY } }),
  maxWaitMs: field(maxWaitMs, {
    path: 'ext',
    // With `concurrency`, a wait for a slot (lib/core/slot-wait.ts).
    refused: { list: SINGLE_POLICY, reserve: UNSETTLED, settle: UNSETTLED, shadow: 'unset with `shadow: true` (a shadow policy never holds a request)' }
  }),
  concurrency: field(concurrencyLimit, {
    refused: {
      reserve: 'unset to reserve and settle (a settlement charges tokens, not slots)',
      settle: 'unset on a route that settles (a settlement charges tokens, not slots)',
      decide: 'unset to consume or peek (slots are taken with acquire, and given back by its release)'
    }
  })
} satisfies { readonly [K in keyof Policy]-?: Field<NonNullable<Policy[K]>> }

type Name = keyof typeof POLICY_FIELDS
const NAMES = Object.keys(POLICY_FIELDS) as Name[] // the table's own keys, in its order

/** The parser of each field, one per field; the http wing adds the route's own (lib/http/route.ts). */
export const CORE_POLICY_CHECKS = Object.fromEntries(NAMES.map((name) => [name, POLICY_FIELDS[name].parse])) as { [K in Name]: (typeof POLICY_FIELDS)[K]['parse'] }

/** The fields the store needs with each bucket. */
export const STORE_FIELDS: readonly Name[] = NAMES.filter((name) => POLICY_FIELDS[name].store === true)

/** The fields that take the extended decision path when set. */
export const EXTENDED: readonly Name[] = NAMES.filter((name) => POLICY_FIELDS[name].path !== undefined)
/** The fields lua/token-bucket-ext.lua decides. */
const EXT_SCRIPT: readonly Name[] = NAMES.filter((name) => POLICY_FIELDS[name].path === 'ext')

/** A field counts as used when set, and a boolean when true. */
function isSet (value: unknown): boolean {
  return value !== undefined && value !== false
}

/** Whether a policy uses any field that takes the extended decision path. */
export function extended (policy: Policy): boolean {
  return EXTENDED.some((name) => isSet(policy[name]))
}

/** Whether a policy is decided by lua/token-bucket-ext.lua (a lockout, a wait): alone, as a list refuses those fields. */
export function extScript (policy: Policy): boolean {
  return EXT_SCRIPT.some((name) => isSet(policy[name]))
}

/** A policy's own fields out of a record that holds others too (a route's merged settings), for parsePolicy. */
export function policyFields (input: object): Record<string, unknown> {
  return Object.fromEntries(NAMES.filter((name) => Object.hasOwn(input, name)).map((name) => [name, Reflect.get(input, name)]))
}

/**
 * The fields a policy needs (in the table's order), each named in its own
 * error when missing; `expected` words a missing capacity or rate. A
 * concurrency policy needs no sizes (and refuses them): it is given its
 * `max` as capacity and rate (a one-second window), so that every path that
 * reads a policy's sizes reads numbers, and headers show `max` as its quota.
 */
export function checkRequired<F extends Partial<Policy>> (fields: F, where: string, expected: string): asserts fields is F & Policy {
  const slots = fields.concurrency
  if (slots !== undefined) {
    checkCombination(fields, ['concurrency'], where)
    fields.capacity = slots.max
    fields.refillPerSecond = slots.max
  }
  checkLocal(fields, slots !== undefined, where)
  for (const name of NAMES) {
    const required = POLICY_FIELDS[name].required
    if (required !== undefined && fields[name] === undefined) throw optionError(where + name, undefined, required === EXPECTED ? expected : required)
  }
}

/** `local` as its policy's kind needs it: `{ max }` for a concurrency policy, `{ capacity, refillPerSecond }` for a rate. */
function checkLocal (fields: Partial<Policy>, slots: boolean, where: string): void {
  const local = fields.local
  if (local === undefined || (local.max !== undefined) === slots) return
  throw optionError(where + 'local', local, slots ? 'an object { max } with `concurrency`' : 'an object { capacity, refillPerSecond }')
}

/**
 * `failureMode: 'local'` needs its `local`, as the policy's kind needs it:
 * `{ max }` (an in-process semaphore) with `concurrency`, else a bucket.
 */
export function checkLocalSet (fields: Readonly<Pick<Partial<Policy>, 'failureMode' | 'local' | 'concurrency'>>, where: string): void {
  if (fields.failureMode !== 'local' || fields.local !== undefined) return
  const wanted = fields.concurrency === undefined ? 'an object { capacity, refillPerSecond }' : 'an object { max } (an in-process semaphore of that size)'
  throw optionError(where + 'local', undefined, `${wanted} with failureMode 'local'`)
}

/**
 * The combination rules, in one place: throws, naming the first field (in
 * the table's order) that one of `uses` refuses, with the table's reason.
 * `at` prefixes the field's name (`policy.`, `config.rateLimit[1].`).
 */
export function checkCombination (policy: Readonly<Partial<Policy>>, uses: readonly Use[], at: string): void {
  for (const name of NAMES) {
    const value = policy[name]
    if (!isSet(value)) continue
    const refused: Readonly<Partial<Record<Use, string>>> = POLICY_FIELDS[name].refused ?? {}
    for (const use of uses) {
      const why = refused[use]
      if (why !== undefined) throw optionError(at + name, value, why)
    }
  }
}

/** What bounds a cost: a policy, or an adapter's default size (never a shadow one there). */
export type CostBounded = Pick<Policy, 'capacity' | 'refillPerSecond' | 'shadow'> | { readonly capacity: number, readonly shadow?: false }

/**
 * The largest cost a policy takes: its capacity. A shadow policy never
 * refuses, so a cost above its capacity is a would-be denial there, not an
 * error: up to 2^52 us of refill, the longest wait the scripts reply
 * exactly (see MAX_WINDOW_US).
 */
export function maxCost (policy: CostBounded): number {
  return policy.shadow === true ? MAX_WINDOW_US / 1e6 * policy.refillPerSecond : policy.capacity
}

/** maxCost, named for an error message: "capacity (10)". */
export function costBound (policy: CostBounded): string {
  return policy.shadow === true ? `${maxCost(policy)} (2^52 µs of refill, on a shadow policy)` : `capacity (${policy.capacity})`
}

/** The cost check of every caller: throws `refuse(bound)` (worded by the caller) when `cost` is above maxCost. */
export function checkCost (cost: number, policy: CostBounded, refuse: (bound: string) => Error): void {
  if (cost > maxCost(policy)) throw refuse(costBound(policy))
}
