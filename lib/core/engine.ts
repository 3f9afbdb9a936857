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
// A list of policies is never empty (createLimiter and route compilation
// refuse an empty one), and a decision has one BucketSpec per policy, in
// order (specsOf): both are typed NonEmpty (lib/core/lists.ts), so a path
// that serves one policy (a lease, a lockout) reads the first without a cast.

import diagnostics from 'node:diagnostics_channel'
import type { Time } from './clock.js'
import { batchHoldMs, extOutcome, failOver, shadowed, special, summarize, timeoutOf, type ExtOutcome } from './decisions.js'
import type { Guard } from './guard.js'
import { LeaseFlights, type LeaseBook, type LeaseCalls } from './lease.js'
import type { KeyNames } from './key-secret.js'
import { isNonEmpty, mapNonEmpty, type NonEmpty } from './lists.js'
import { extScript } from './policy-fields.js'
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
  /** The limiter's clock and timers (lib/core/clock.ts). */
  readonly time: Time
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
/** One cost per policy (undefined: each policy's own). */
type Costs = ReadonlyArray<number | undefined> | undefined
/** A policy of a list, with its cost in this call. */
interface Entry { readonly policy: Policy, readonly cost: number | undefined }

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
  specsOf (clientKey: string, list: NonEmpty<Policy>, costs: Costs): NonEmpty<BucketSpec> {
    const id = this.#parts.names.clientPart(clientKey)
    return mapNonEmpty(list, (policy, i) => {
      const spend = costs?.[i] ?? policy.cost ?? 1
      return { key: this.keyOf(id, policy.bucket), capacity: policy.capacity, refillPerSecond: policy.refillPerSecond, cost: spend }
    })
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
  decide (clientKey: string, list: NonEmpty<Policy>, costs: Costs, consume: boolean): Promise<Decision> {
    const naming = this.#named(timeoutOf(list, this.#parts.defaultTimeout))
    if (naming !== undefined) return naming.then(() => this.#decide(clientKey, list, costs, consume))
    return this.#decide(clientKey, list, costs, consume)
  }

  #decide (clientKey: string, list: NonEmpty<Policy>, costs: Costs, consume: boolean): Promise<Decision> {
    if (special(list)) return this.#extras(clientKey, list, costs, consume).then((decision) => this.#published(clientKey, decision))
    return this.#plain(clientKey, list, costs, consume, (decision) => this.#published(clientKey, decision))
  }

  async reserve (clientKey: string, list: NonEmpty<Policy>, costs: Costs): Promise<Reservation> {
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
    remote.denials?.reset(key, this.#parts.time.now())
    await remote.guard.reset(key, defaultTimeout)
    // Again once Redis has applied it: a call in flight meanwhile may have
    // been decided before the reset, and its reply comes after.
    remote.denials?.reset(key, this.#parts.time.now())
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

  #plain (clientKey: string, list: NonEmpty<Policy>, costs: Costs, consume: boolean, out: (d: Decision) => Decision): Promise<Decision> {
    const specs = this.specsOf(clientKey, list, costs)
    const remote = this.#remote
    if (remote === undefined) return Promise.resolve(out(summarize(list, this.#parts.memory.decideSync(specs, consume), 'store')))
    const { guard, denials } = remote
    const id = specs.length === 1 ? specs[0].key : specs.map((s) => s.key).join('\n')
    const [only] = list
    const cached = consume && only.lease === undefined ? denials?.get(id, specs) : undefined
    if (cached !== undefined) return Promise.resolve(out(cached))
    if (only.lease !== undefined && list.length === 1) {
      if (consume) return this.#leased(remote, only, only.lease, specs).then(out)
      return this.#leasedPeek(remote, only, only.lease, specs[0]).then(out)
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
  async #extras (clientKey: string, list: NonEmpty<Policy>, costs: Costs, consume: boolean): Promise<Decision> {
    const entries = mapNonEmpty(list, (policy, i): Entry => ({ policy, cost: costs?.[i] }))
    const enforced = entries.filter((e) => e.policy.shadow !== true)
    const shadow = entries.filter((e) => e.policy.shadow === true)
    // All of one kind: the list is that kind's, in its order.
    if (!isNonEmpty(shadow)) return await this.#one(clientKey, list, costs, consume)
    if (!isNonEmpty(enforced)) return shadowed(await this.#one(clientKey, list, costs, consume))
    const decided = await this.#one(clientKey, mapNonEmpty(enforced, (e) => e.policy), enforced.map((e) => e.cost), consume)
    const shadows = shadowed(await this.#one(clientKey, mapNonEmpty(shadow, (e) => e.policy), shadow.map((e) => e.cost), consume && decided.allowed))
    // Each side's decisions come in the order of its policies in the list.
    const sides = { enforced: (decided.policies ?? [decided]).values(), shadow: (shadows.policies ?? [shadows]).values() }
    const byPolicy: Decision[] = []
    for (const policy of list) {
      const next = sides[policy.shadow === true ? 'shadow' : 'enforced'].next()
      if (next.done !== true) byPolicy.push(next.value)
    }
    const combined: Decision = { ...decided, policies: byPolicy }
    if (decided.allowed && shadows.shadow === true) combined.shadow = true
    return combined
  }

  /** One list of policies of one kind: a lockout or reservation, or a plain decision. */
  #one (clientKey: string, list: NonEmpty<Policy>, costs: Costs, consume: boolean): Promise<Decision> {
    const [only] = list
    if (list.length === 1 && extScript(only)) return this.#extended(clientKey, only, costs?.[0], consume)
    return this.#plain(clientKey, list, costs, consume, (decision) => decision)
  }

  /**
   * One policy with a lockout or reservations (lua/token-bucket-ext.lua).
   * A consume that may wait takes a waiter slot first (lib/core/waiters.ts); a
   * reply with a delay holds it that long. Only lockout denials are cached:
   * a plain denial must reach the store, which counts it.
   */
  async #extended (clientKey: string, policy: Policy, cost: number | undefined, consume: boolean): Promise<Decision> {
    const { waiters, time } = this.#parts
    const spec: ExtSpec = {
      ...this.specsOf(clientKey, [policy], [cost])[0],
      maxWaitUs: (policy.maxWaitMs ?? 0) * 1000,
      mayWait: consume && policy.maxWaitMs !== undefined && waiters.take(),
      lockout: policy.lockout
    }
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
    const started = time.now()
    const leftMs = await waiters.wait(delayUs / 1000)
    if (leftMs === 0) return { ...decision, waitedMs: time.now() - started }
    return { ...decision, allowed: false, retryAfterMs: leftMs }
  }

  async #extStore (remote: Remote, policy: Policy, spec: ExtSpec, consume: boolean): Promise<ExtOutcome> {
    const { guard, store, denials } = remote
    const sentAt = this.#parts.time.now()
    let reply: ExtReply
    try {
      reply = await guard.run(() => store.decideExt(spec, consume), policy.timeout ?? this.#parts.defaultTimeout, [spec])
    } catch {
      // 'local': the policy at its local sizes, on the same key, with its lockout and wait.
      return failOver(guard, [policy], [spec], ([local]) => {
        const sizes = { capacity: local.capacity, refillPerSecond: local.refillPerSecond }
        return extOutcome(local, this.#parts.local.decideExtSync({ ...spec, ...sizes }, consume), 'local')
      }, (decision) => ({ decision, delayUs: 0 }))
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
  async #leased (remote: Remote, policy: Policy, lease: Lease, specs: NonEmpty<BucketSpec>): Promise<Decision> {
    const { leases, defaultTimeout } = this.#parts
    const served = leases.spend(policy, specs[0], lease.maxAgeMs)
    if (served !== undefined) return served
    this.#flights ??= new LeaseFlights(leases, this.#leaseCalls(remote), this.#parts.time)
    const request = { policy, lease, specs, timeoutMs: policy.timeout ?? defaultTimeout }
    const decision = remote.denials?.get(specs[0].key, specs) ?? await this.#flights.decide(request)
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
        const [spec] = specs
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
      denied: (request) => denials?.get(request.specs[0].key, request.specs)
    }
  }

  /** The failure modes (lib/core/decisions.ts failOver) of a consume or peek the store did not answer. */
  #fallback (guard: Guard, list: readonly Policy[], specs: readonly BucketSpec[], consume: boolean): Decision {
    return failOver(guard, list, specs, (local, localSpecs) => summarize(local, this.#parts.local.decideSync(localSpecs, consume), 'local'), (decision) => decision)
  }
}
