// Decisions from replies, and the failure modes, written once. No store,
// no clock, no I/O; the limiter (lib/core/limiter.ts) and the settlements
// (lib/core/settle.ts) both build their decisions here, and both apply a
// failure mode through failOver, the one place that does.

import type { BucketSpec, BucketState, ExtReply, StoreReply } from '../store/store.js'
import { wholeTokens } from '../store/store.js'
import { isNonEmpty, type NonEmpty } from './lists.js'
import { extended } from './policy-fields.js'
import type { Decision, DecisionSource, Policy } from './types.js'

/**
 * One decision per policy from a store's reply; for several, the binding
 * one (the fewest left when allowed, the longest wait when denied), with
 * every policy's under `policies`.
 */
export function summarize (list: readonly Policy[], reply: StoreReply, source: DecisionSource): Decision {
  const [only] = list
  const [bucket] = reply.buckets
  // One policy, the usual route: its decision, without a list to reduce.
  if (list.length === 1 && only !== undefined && bucket !== undefined) return bucketDecision(only, bucket, source)
  const decisions: Decision[] = []
  for (let i = 0; i < list.length; i++) {
    const policy = list[i]
    const state = reply.buckets[i]
    // A reply has one bucket per policy, in order: both are always there.
    if (policy !== undefined && state !== undefined) decisions.push(bucketDecision(policy, state, source))
  }
  // Several policies here (one returned above), so reduce has a first
  // decision to start from.
  const chosen = decisions.reduce(reply.allowed ? fewestLeft : longestWait)
  return { ...chosen, allowed: reply.allowed, policies: decisions }
}

/** One policy's decision from its bucket's state. */
function bucketDecision (policy: Policy, bucket: BucketState, source: DecisionSource): Decision {
  return {
    allowed: bucket.waitUs === 0,
    limit: policy.capacity,
    remaining: wholeTokens(bucket.remaining),
    resetMs: bucket.fullInUs / 1000,
    retryAfterMs: bucket.waitUs / 1000,
    source,
    bucket: policy.bucket
  }
}

/** The binding of two allowed decisions: the fewer left; on a tie, the earlier. */
function fewestLeft (best: Decision, next: Decision): Decision {
  return next.remaining < best.remaining ? next : best
}

/** The binding of two denials: the longer wait; on a tie, the earlier. */
function longestWait (best: Decision, next: Decision): Decision {
  return next.retryAfterMs > best.retryAfterMs ? next : best
}

/** The decision of a store that did not answer, failing open or closed. */
export function failed (list: readonly Policy[], source: 'fail-open' | 'fail-closed', retryAfterMs: number): Decision {
  const decisions = list.map((policy): Decision => ({
    allowed: source === 'fail-open',
    limit: policy.capacity,
    remaining: 0,
    resetMs: 0,
    retryAfterMs,
    source,
    bucket: policy.bucket
  }))
  // The first that fails this way binds: any for fail-open, a 'closed' one
  // for fail-closed. Found in both: a list is never empty, and fallbackOf
  // closes one only if it holds a 'closed' policy.
  const chosen = decisions.find((_, i) => source === 'fail-open' || list[i]?.failureMode === 'closed') as Decision
  return decisions.length === 1 ? chosen : { ...chosen, policies: decisions }
}

/**
 * What a list of policies does when the store failed or missed its
 * deadline: any enforced 'closed' policy closes the request; else the
 * 'local' policies decide it on the in-process store, at their local
 * sizes (same keys); with none, it fails open.
 */
export type Fallback =
  | { readonly mode: 'fail-closed' }
  | { readonly mode: 'fail-open' }
  | { readonly mode: 'local', readonly list: NonEmpty<Policy>, readonly specs: NonEmpty<BucketSpec> }

export function fallbackOf (list: readonly Policy[], specs: readonly BucketSpec[]): Fallback {
  if (list.some((p) => p.failureMode === 'closed' && p.shadow !== true)) return { mode: 'fail-closed' }
  const localList: Policy[] = []
  const localSpecs: BucketSpec[] = []
  for (let i = 0; i < list.length; i++) {
    const policy = list[i]
    const spec = specs[i]
    // One spec per policy, in order: `spec` is always there.
    if (policy?.failureMode === 'local' && policy.local !== undefined && spec !== undefined) {
      const { capacity, refillPerSecond } = policy.local
      localList.push({ ...policy, capacity, refillPerSecond })
      localSpecs.push({ key: spec.key, capacity, refillPerSecond, cost: spec.cost })
    }
  }
  return isNonEmpty(localList) && isNonEmpty(localSpecs) ? { mode: 'local', list: localList, specs: localSpecs } : { mode: 'fail-open' }
}

/** What failOver needs of the guard: the outage's counts, and the breaker's rest. */
export interface FailureSink {
  fellBack (source: Fallback['mode']): void
  readonly cooldownLeftMs: number
}

/**
 * Applies the failure modes of a list whose store call failed (deadline,
 * breaker, error), counting the fallback decision in the outage's lines:
 * failing closed or open spends nothing (`unspent` gets the decision);
 * 'local' runs `local` on the in-process fallback's policies and buckets
 * (a decision, a reservation or a lockout's decision, as the caller does).
 */
export function failOver<R> (guard: FailureSink, list: readonly Policy[], specs: readonly BucketSpec[],
  local: (list: NonEmpty<Policy>, specs: NonEmpty<BucketSpec>) => R, unspent: (decision: Decision) => R): R {
  const plan = fallbackOf(list, specs)
  guard.fellBack(plan.mode)
  if (plan.mode === 'fail-closed') return unspent(failed(list, 'fail-closed', closedRetryMs(guard.cooldownLeftMs)))
  if (plan.mode === 'fail-open') return unspent(failed(list, 'fail-open', 0))
  return local(plan.list, plan.specs)
}

/** How long a request closed by an outage is told to wait: the breaker's rest, at least a second. */
export function closedRetryMs (cooldownLeftMs: number): number {
  return Math.max(1000, cooldownLeftMs)
}

/**
 * A shadow policy's decision: a denial becomes a would-be denial, allowed,
 * flagged `shadow`, with what the limit would have said.
 */
export function shadowed (decision: Decision): Decision {
  if (decision.allowed) return decision
  const out: Decision = { ...decision, allowed: true, shadow: true }
  if (decision.policies !== undefined) out.policies = decision.policies.map((d) => d.allowed ? d : { ...d, allowed: true, shadow: true })
  return out
}

/** Whether a list takes the path of the extras: shadow mode, a lockout or a reservation (lib/core/policy-fields.ts EXTENDED). */
export function special (list: readonly Policy[]): boolean {
  return list.some(extended)
}

/** A decision of lua/token-bucket-ext.lua (or the MemoryStore's), and how long to wait before using its tokens. */
export interface ExtOutcome {
  decision: Decision
  delayUs: number
}

export function extOutcome (policy: Policy, reply: ExtReply, source: DecisionSource): ExtOutcome {
  const decision = summarize([policy], { allowed: reply.allowed, buckets: [reply.bucket] }, source)
  if (reply.locked) decision.locked = true
  return { decision, delayUs: reply.delayUs }
}

/** How much longer than `cost` tokens a whole lease batch takes to refill, ms. */
export function batchHoldMs (policy: Policy, lease: NonNullable<Policy['lease']>, cost: number): number {
  return Math.max(0, Math.min(lease.tokens, policy.capacity) - cost) / policy.refillPerSecond * 1000
}

/** The smallest deadline of a list's policies, ms. */
export function timeoutOf (list: readonly Policy[], defaultTimeout: number): number {
  let timeout = Infinity
  for (const policy of list) timeout = Math.min(timeout, policy.timeout ?? defaultTimeout)
  return timeout
}
