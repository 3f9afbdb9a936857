// Per-client limits: a policy's `limit` function picks, per request, the
// capacity and refill of the client's plan (or false: no limit), before
// the store is asked.
//
// Why the bucket stays the route's: a client whose plan changes keeps its
// bucket, and the stored full-at time F gives a well-defined answer under
// the new plan. The bucket holds capacity - (F - now) * refill tokens: the
// time until it is full is kept, not the token count. An upgrade (more
// capacity, faster refill) gives the client at once the new capacity minus
// the refill of that time at the new rate; a downgrade reads the time
// against the smaller plan, and a time longer than the new plan's window
// reads as an empty bucket (the scripts' clamp), so a downgrade never locks
// a client out for longer than one window of its new plan (two on a route
// that settles, where the rest is debt: lua/settle.lua). A lease of this
// server taken under the old plan is not spent under the new one: its
// tokens count in the old plan's units (lib/core/lease.ts, samePlan).
//
// Why a cache per returned object: plans are usually a few objects made
// once (`PLANS[user.plan]`), or objects an app caches after looking them up
// by API key. Each returned object is validated once and its merged policy
// (and its headers) kept in a WeakMap, so a looked-up policy costs one map
// read per request; an app returning a fresh object per request pays the
// validation each time. A bad value is a 500 TOLLGATE_BAD_INPUT before any
// store call, as for `key` and `cost` (logged, and the adapter's error,
// through `bad`).

import { PREVIEW_CHARS, clip, messageOf, preview, thrownPreview } from '../core/errors.js'
import { PolicyHeaders, type HeaderMode } from './headers.js'
import { parsePolicy } from '../core/policy.js'
import { limitResultHint } from '../core/migrating.js'
import { isRecord, parseFields, positiveNumber } from '../core/options.js'
import type { Policy } from '../core/types.js'

/** The size and rate of a client's plan, as a `limit` function returns it. */
export interface Tier {
  capacity: number
  refillPerSecond: number
}

/** Returns the client's plan, or false for no limit on this policy. */
export type LimitFunction<R> = (request: R) => Tier | false | Promise<Tier | false>

/** What a route's limit must have for its tiers to be resolved. */
export interface Limited {
  name: string
  policies: Policy[]
  headers: HeaderMode
  policyHeaders: PolicyHeaders
}

/**
 * Logs a route's bad plan (`detail`; `hinted` when `limit` threw or returned
 * nothing: the line then says where the check runs) and returns the
 * adapter's 500 TOLLGATE_BAD_INPUT.
 */
export type BadInput = (detail: string, hinted: boolean) => Error

/** Marks a policy without a `limit` function. */
const OWN = Symbol('tollgate.own')
const TIER_CHECKS = { capacity: positiveNumber, refillPerSecond: positiveNumber }
const NUMBER = 'a finite number > 0'

/**
 * The tiers of one route: `fns[i]` is policy i's `limit` (undefined: the
 * route's own policy). Undefined when no policy of the route has one.
 */
export function compileTiers<R, L extends Limited> (fns: ReadonlyArray<LimitFunction<R> | undefined>): Tiers<R, L> | undefined {
  return fns.some((fn) => fn !== undefined) ? new Tiers<R, L>(fns) : undefined
}

export class Tiers<R, L extends Limited> {
  readonly #fns: ReadonlyArray<LimitFunction<R> | undefined>
  /** Per policy: each returned object's merged policy, or the message of why it is bad. */
  readonly #policies: Array<WeakMap<object, Policy | string>>
  /** Single-policy routes: the whole resolved limit per returned object. */
  readonly #limits = new WeakMap<object, L>()

  constructor (fns: ReadonlyArray<LimitFunction<R> | undefined>) {
    this.#fns = fns
    this.#policies = fns.map(() => new WeakMap())
  }

  /** The route's limit for this request's plans; null when every policy returned false. */
  async resolve (limit: L, request: R, bad: BadInput): Promise<L | null> {
    const tiers: unknown[] = []
    for (const fn of this.#fns) tiers.push(fn === undefined ? OWN : await call(fn, request, bad))
    const only = tiers[0]
    if (tiers.length === 1 && isRecord(only)) {
      const known = this.#limits.get(only)
      if (known !== undefined) return known
    }
    const policies: Policy[] = []
    for (let i = 0; i < tiers.length; i++) {
      const tier = tiers[i]
      const base = limit.policies[i]
      // One tier per policy: `base` is always there.
      if (tier === false || base === undefined) continue
      policies.push(tier === OWN ? base : this.#policy(i, base, tier, bad))
    }
    if (policies.length === 0) return null
    const shown = policies.filter((p) => p.shadow !== true)
    const local = shown.flatMap((p) => p.local === undefined ? [] : [{ ...p.local, bucket: p.bucket }])
    // Shadow policies never show; with only those left, no headers at all.
    const resolved: L = { ...limit, policies, headers: shown.length === 0 ? false : limit.headers, policyHeaders: new PolicyHeaders(shown, local) }
    // A single tier that got here is a record: anything else was refused above.
    if (tiers.length === 1 && isRecord(only)) this.#limits.set(only, resolved)
    return resolved
  }

  /** Policy i under `tier`, validated once per returned object. */
  #policy (i: number, base: Policy, tier: unknown, bad: BadInput): Policy {
    // One cache per policy, made with #fns: `cache` is always there.
    const cache = this.#policies[i]
    let known = isRecord(tier) ? cache?.get(tier) : undefined
    if (known === undefined) {
      known = merge(base, tier)
      if (isRecord(tier)) cache?.set(tier, known)
    }
    if (typeof known === 'string') throw bad(known, tier === undefined)
    return known
  }
}

async function call<R> (fn: LimitFunction<R>, request: R, bad: BadInput): Promise<unknown> {
  try {
    return await fn(request)
  } catch (cause) {
    throw bad(`\`limit\` threw ${thrownPreview(cause)}`, true)
  }
}

/** The policy under a plan, or why the plan is bad. */
function merge (base: Policy, tier: unknown): Policy | string {
  const bad = `\`limit\` must return { capacity, refillPerSecond } or false, got ${preview(tier)}`
  if (!isRecord(tier)) {
    const hint = limitResultHint(tier)
    return hint === undefined ? bad : `${bad}: ${hint}`
  }
  try {
    const { capacity, refillPerSecond } = parseFields(tier, TIER_CHECKS, 'limit().', { capacity: NUMBER, refillPerSecond: NUMBER })
    const policy = parsePolicy({ ...base, capacity, refillPerSecond }, 'limit().')
    if (policy.capacity < 1 && policy.cost === undefined && policy.shadow !== true) return `${bad}: a capacity of at least the route's cost (1)`
    return policy
  } catch (err) {
    // The option error may list every unknown name of the object: cut short.
    return `${bad}: ${clip(messageOf(err).replace(/^tollgate: /, ''), PREVIEW_CHARS * 2)}`
  }
}
