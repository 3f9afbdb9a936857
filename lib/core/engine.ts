// The decision paths of one limiter, one method each: plain decisions,
// shadow mode, lockouts and waiting, leases, reservations, resets. The
// limiter (lib/core/limiter.ts) wires an Engine from its options and shows
// the public facade over it.
//
// Two stores can sit behind it. Without `redis`, the in-process store
// decides synchronously, with nothing to fail. With `redis`, a Remote
// (lib/core/remote.ts) holds what only a remote store needs, so each path
// branches once on whether there is one, never on casts.
//
// The `as` left here read a list at an index that holds something by
// construction, which TypeScript's noUncheckedIndexedAccess cannot see: a
// list of policies is never empty (createLimiter and route compilation
// refuse an empty one), a decision has one BucketSpec per policy, in order
// (specsOf), and a lease or a lockout serves a list of one.

import diagnostics from 'node:diagnostics_channel'
import type { Clock } from './deadline.js'
import {
  batchHoldMs, closedRetryMs, extOutcome, failed, fallbackOf, shadowed, special, summarize, timeoutOf, type ExtOutcome
} from './decisions.js'
import type { Guard } from './guard.js'
import { LeaseFlights, type LeaseBook, type LeaseCalls } from './lease.js'
import type { KeyNames } from './key-secret.js'
import type { Metrics } from './metrics.js'
import type { Remote } from './remote.js'
import type { Settlements } from './settle.js'
import type { MemoryStore } from '../store/memory-store.js'
import type { BucketSpec, ExtReply, ExtSpec } from '../store/store.js'
import type { Decision, Policy, Reservation } from './types.js'
import type { Waiters } from './waiters.js'

/** Published for every decision: `{ key, decision }`. */
export const decisionChannel = diagnostics.channel('tollgate:decision')

/** The parts an Engine works with, built once by the limiter. */
export interface EngineParts {
  readonly prefix: string
  readonly defaultTimeout: number
  readonly clock: Clock
  /** The store without Redis. */
  readonly memory: MemoryStore
  /** The in-process fallback of failureMode 'local'. */
  readonly local: MemoryStore
  readonly waiters: Waiters
  readonly leases: LeaseBook
  readonly metrics: Metrics | undefined
  readonly remote: Remote | undefined
  /** Reservations and their settlement (lib/core/settle.ts), over the same stores. */
  readonly book: Settlements
  /** How keys are named (lib/core/key-secret.ts). */
  readonly names: KeyNames
}

type Lease = NonNullable<Policy['lease']>
type Costs = readonly number[] | undefined

export class Engine {
  readonly #parts: EngineParts
  readonly #remote: Remote | undefined
  readonly #book: Settlements
  #flights: LeaseFlights | undefined

  constructor (parts: EngineParts) {
    this.#parts = parts
    this.#remote = parts.remote
    this.#book = parts.book
  }

  /** The key of each policy's bucket for this client, with the cost to spend. */
  specsOf (clientKey: string, list: readonly Policy[], costs: Costs): BucketSpec[] {
    const id = this.#parts.names.clientPart(clientKey)
    const specs: BucketSpec[] = []
    for (let i = 0; i < list.length; i++) {
      const policy = list[i] as Policy
      const spend = costs?.[i] ?? policy.cost ?? 1
      specs.push({ key: this.keyOf(id, policy.bucket), capacity: policy.capacity, refillPerSecond: policy.refillPerSecond, cost: spend })
    }
    return specs
  }

  /** The key of `bucket` for a client part (KeyNames.clientPart). */
  keyOf (id: string, bucket: string): string {
    return this.#parts.names.keyOf(id, bucket)
  }

  /**
   * Until the fleet's key secret is known (lib/core/key-secret.ts), each
   * call first waits for one read of it, within its deadline; if that
   * fails, the store is held, so the call follows its failure mode.
   */
  #named (timeoutMs: number): Promise<void> | undefined {
    const names = this.#parts.names
    return names.known ? undefined : names.load(timeoutMs)
  }

  /**
   * One decision, in one promise: a store call's promise is settled by the
   * reply or by the deadline, never wrapped again. Shadow mode, lockouts and
   * reservations take a path of their own (the extras, below).
   */
  decide (clientKey: string, list: readonly Policy[], costs: Costs, consume: boolean): Promise<Decision> {
    const naming = this.#named(timeoutOf(list, this.#parts.defaultTimeout))
    if (naming !== undefined) return naming.then(() => this.#decide(clientKey, list, costs, consume))
    return this.#decide(clientKey, list, costs, consume)
  }

  #decide (clientKey: string, list: readonly Policy[], costs: Costs, consume: boolean): Promise<Decision> {
    if (special(list)) return this.#extras(clientKey, list, costs, consume).then((decision) => this.#published(clientKey, decision))
    return this.#plain(clientKey, list, costs, consume, (decision) => this.#published(clientKey, decision))
  }

  async reserve (clientKey: string, list: readonly Policy[], costs: Costs): Promise<Reservation> {
    await this.#named(timeoutOf(list, this.#parts.defaultTimeout))
    const reservation = await this.#book.reserve(list, this.specsOf(clientKey, list, costs))
    this.#published(clientKey, reservation.decision)
    return reservation
  }

  /** Forgets a client's bucket everywhere: in Redis, in this process, and on every server of the fleet. */
  async reset (clientKey: string, bucket: string): Promise<void> {
    const { local, memory, leases, defaultTimeout } = this.#parts
    await this.#named(defaultTimeout)
    const key = this.keyOf(this.#parts.names.clientPart(clientKey), bucket)
    await local.reset(key)
    await memory.reset(key)
    leases.forget(key)
    const remote = this.#remote
    if (remote === undefined) return
    remote.denials?.reset(key, this.#parts.clock())
    await remote.guard.reset(key, defaultTimeout)
    // Again once Redis has applied it: a call in flight meanwhile may have
    // been decided before the reset, and its reply comes after.
    remote.denials?.reset(key, this.#parts.clock())
    leases.forget(key)
    await remote.changes?.reset(key, defaultTimeout)
  }

  async close (): Promise<void> {
    const { waiters, memory, local, metrics, defaultTimeout } = this.#parts
    waiters.close()
    this.#remote?.changes?.close()
    await this.#flights?.close(defaultTimeout)
    this.#remote?.denials?.clear()
    memory.clear()
    local.clear()
    this.#remote?.guard.close()
    metrics?.close()
  }

  #plain (clientKey: string, list: readonly Policy[], costs: Costs, consume: boolean, out: (d: Decision) => Decision): Promise<Decision> {
    const specs = this.specsOf(clientKey, list, costs)
    const remote = this.#remote
    if (remote === undefined) return Promise.resolve(out(summarize(list, this.#parts.memory.decideSync(specs, consume), 'store')))
    const { guard, denials } = remote
    const id = specs.length === 1 ? (specs[0] as BucketSpec).key : specs.map((s) => s.key).join('\n')
    const only = list[0] as Policy
    const cached = consume && only.lease === undefined ? denials?.get(id, specs) : undefined
    if (cached !== undefined) return Promise.resolve(out(cached))
    if (only.lease !== undefined && list.length === 1) {
      if (consume) return this.#leased(remote, only, only.lease, specs).then(out)
      return this.#leasedPeek(remote, only, only.lease, specs[0] as BucketSpec).then(out)
    }
    return guard.decide(specs, consume, timeoutOf(list, this.#parts.defaultTimeout), (reply, sentAt) => {
      const decision = summarize(list, reply, 'store')
      if (!decision.allowed && consume) denials?.set(id, specs, decision, sentAt)
      return out(decision)
    }, () => out(this.#fallback(guard, list, specs, consume)))
  }

  /**
   * Shadow mode: the enforced policies decide the request; the shadow ones
   * are decided after them, in a call of their own, spending only when the
   * request was allowed (as they would if enforced), and never refuse.
   */
  async #extras (clientKey: string, list: readonly Policy[], costs: Costs, consume: boolean): Promise<Decision> {
    const enforced: number[] = []
    const shadow: number[] = []
    list.forEach((policy, i) => (policy.shadow === true ? shadow : enforced).push(i))
    const part = (at: number[]): [Policy[], number[] | undefined] => [at.map((i) => list[i] as Policy), costs === undefined ? undefined : at.map((i) => costs[i] as number)]
    if (shadow.length === 0) return await this.#one(clientKey, ...part(enforced), consume)
    if (enforced.length === 0) return shadowed(await this.#one(clientKey, ...part(shadow), consume))
    const decided = await this.#one(clientKey, ...part(enforced), consume)
    const shadows = shadowed(await this.#one(clientKey, ...part(shadow), consume && decided.allowed))
    const byPolicy: Decision[] = []
    const from = [decided.policies ?? [decided], shadows.policies ?? [shadows]]
    const next = [0, 0]
    for (const policy of list) {
      const side = policy.shadow === true ? 1 : 0
      byPolicy.push((from[side] as readonly Decision[])[(next[side] as number)++] as Decision)
    }
    const combined: Decision = { ...decided, policies: byPolicy }
    if (decided.allowed && shadows.shadow === true) combined.shadow = true
    return combined
  }

  /** One list of policies of one kind: a lockout or reservation, or a plain decision. */
  #one (clientKey: string, list: Policy[], costs: number[] | undefined, consume: boolean): Promise<Decision> {
    const only = list[0] as Policy
    if (list.length === 1 && (only.lockout !== undefined || only.maxWaitMs !== undefined)) return this.#extended(clientKey, only, costs?.[0], consume)
    return this.#plain(clientKey, list, costs, consume, (decision) => decision)
  }

  /**
   * One policy with a lockout or reservations (lua/token-bucket-ext.lua).
   * A consume that may wait takes a waiter slot first (lib/core/waiters.ts); a
   * reply with a delay holds it that long. Only lockout denials are cached:
   * a plain denial must reach the store, which counts it.
   */
  async #extended (clientKey: string, policy: Policy, cost: number | undefined, consume: boolean): Promise<Decision> {
    const { waiters, clock } = this.#parts
    const spec = this.specsOf(clientKey, [policy], cost === undefined ? undefined : [cost])[0] as ExtSpec
    spec.maxWaitUs = (policy.maxWaitMs ?? 0) * 1000
    spec.mayWait = consume && policy.maxWaitMs !== undefined && waiters.take()
    spec.lockout = policy.lockout
    const remote = this.#remote
    let outcome: ExtOutcome
    if (remote === undefined) {
      outcome = extOutcome(policy, this.#parts.memory.decideExtSync(spec, consume), 'store')
    } else {
      const cached = consume ? remote.denials?.get(spec.key, [spec]) : undefined
      outcome = cached === undefined ? await this.#extStore(remote, policy, spec, consume) : { decision: cached, delayUs: 0 }
    }
    const { decision, delayUs } = outcome
    if (delayUs === 0) {
      if (spec.mayWait) waiters.release()
      return decision
    }
    const started = clock()
    const leftMs = await waiters.wait(delayUs / 1000)
    if (leftMs === 0) return { ...decision, waitedMs: clock() - started }
    return { ...decision, allowed: false, retryAfterMs: leftMs }
  }

  async #extStore (remote: Remote, policy: Policy, spec: ExtSpec, consume: boolean): Promise<ExtOutcome> {
    const { guard, store, denials } = remote
    const sentAt = this.#parts.clock()
    let reply: ExtReply
    try {
      reply = await guard.run(() => store.decideExt(spec, consume), policy.timeout ?? this.#parts.defaultTimeout, [spec])
    } catch {
      const local = policy.local
      if (policy.failureMode !== 'local' || local === undefined) return { decision: this.#fallback(guard, [policy], [spec], consume), delayUs: 0 }
      guard.fellBack('local')
      return extOutcome({ ...policy, ...local }, this.#parts.local.decideExtSync({ ...spec, ...local }, consume), 'local')
    }
    const outcome = extOutcome(policy, reply, 'store')
    if (reply.locked && consume) denials?.set(spec.key, [spec], outcome.decision, sentAt)
    return outcome
  }

  #published (clientKey: string, decision: Decision): Decision {
    if (decisionChannel.hasSubscribers) decisionChannel.publish(decision.shadow === true ? { key: clientKey, decision, shadow: true } : { key: clientKey, decision })
    // A shadow policy's would-be denial passes (allowed: true): counted as the denial it reports.
    const metrics = this.#parts.metrics
    if (metrics !== undefined) metrics.decided(decision.shadow === true ? { ...decision, allowed: false } : decision, decision.shadow === true)
    return decision
  }

  /**
   * A single-policy consume with leases: spend from this server's batch;
   * else, unless a cached denial still holds, wait in the bucket's queue
   * for a lease call (lib/core/lease.ts: one in flight per bucket, the rest of
   * the old batch given back with it).
   */
  async #leased (remote: Remote, policy: Policy, lease: Lease, specs: BucketSpec[]): Promise<Decision> {
    const { leases, defaultTimeout } = this.#parts
    const served = leases.spend(policy, specs[0] as BucketSpec, lease.maxAgeMs)
    if (served !== undefined) return served
    this.#flights ??= new LeaseFlights(leases, this.#leaseCalls(remote))
    const request = { policy, lease, specs, timeoutMs: policy.timeout ?? defaultTimeout }
    const decision = remote.denials?.get((specs[0] as BucketSpec).key, specs) ?? await this.#flights.decide(request)
    return decision ?? this.#fallback(remote.guard, [policy], specs, true)
  }

  /**
   * A peek of a leased policy says what a consume would do on this server:
   * a lease that can pay the cost allows it (spending nothing); a cached
   * denial denies it; else the store decides, with the very lease call the
   * consume would send (the lease's usable rest given back first, accepted
   * only while no other server took from the bucket since: lua/lease.lua)
   * as a peek, which writes nothing.
   */
  async #leasedPeek (remote: Remote, policy: Policy, lease: Lease, spec: BucketSpec): Promise<Decision> {
    const { leases, defaultTimeout } = this.#parts
    const served = leases.peek(policy, spec, lease.maxAgeMs) ?? remote.denials?.get(spec.key, [spec])
    if (served !== undefined) return served
    const back = leases.held(spec)
    try {
      const reply = await remote.guard.run(() => remote.store.lease(spec, spec.cost, back?.tokens ?? 0, back?.fullAtUs ?? 0, true), policy.timeout ?? defaultTimeout, [spec])
      return summarize([policy], { allowed: reply.taken > 0, buckets: [reply.bucket] }, 'store')
    } catch {
      return this.#fallback(remote.guard, [policy], [spec], false)
    }
  }

  /** The store side of lease calls: through the guard, each reply turned into a decision. */
  #leaseCalls ({ guard, store, denials }: Remote): LeaseCalls {
    return {
      take: (spec, most, back, timeoutMs, sent) => guard.run(() => {
        const reply = store.lease(spec, most, back?.tokens ?? 0, back?.fullAtUs ?? 0)
        sent(reply)
        return reply
      }, timeoutMs, [spec]),
      decide (request, reply, sentAt) {
        const { policy, lease, specs } = request
        const spec = specs[0] as BucketSpec
        const bucket = { ...reply.bucket, remaining: reply.bucket.remaining + Math.max(0, reply.taken - spec.cost) }
        const decision = summarize([policy], { allowed: reply.taken > 0, buckets: [bucket] }, 'store')
        if (!decision.allowed && denials !== undefined) {
          // A denied client waits until a whole batch is back, not just its
          // cost: otherwise a flood takes the bucket one token per call.
          decision.retryAfterMs += batchHoldMs(policy, lease, spec.cost)
          denials.set(spec.key, specs, decision, sentAt)
        }
        return decision
      },
      denied: (request) => denials?.get((request.specs[0] as BucketSpec).key, request.specs)
    }
  }

  /** The failure modes (lib/core/decisions.ts) of a consume or peek the store did not answer. */
  #fallback (guard: Guard, list: readonly Policy[], specs: readonly BucketSpec[], consume: boolean): Decision {
    const plan = fallbackOf(list, specs)
    guard.fellBack(plan.mode)
    if (plan.mode === 'fail-closed') return failed(list, 'fail-closed', closedRetryMs(guard.cooldownLeftMs))
    if (plan.mode === 'fail-open') return failed(list, 'fail-open', 0)
    return summarize(plan.list, this.#parts.local.decideSync(plan.specs, consume), 'local')
  }
}
