// Concurrency limits (SPEC 13): at most `max` requests of one client and
// bucket in flight across the fleet. A request takes one slot of each
// concurrency policy of its list and spends each rate policy's cost, all or
// nothing, in one call of lua/concurrency.lua on Redis's clock, so two
// servers can never both take the last slot. It holds them until its
// `release()` (the adapters: when the request ends, lib/http/request.ts).
//
// Renewal. A slot has a lease (`leaseMs`): a server that dies holding it
// frees it when the lease ends. A live server renews what it holds before
// that, with ONE timer per limiter over every held slot (not one per slot:
// a timer per request would cost a timer and a callback per request, and
// they would fire unaligned); a tick sends one call per held key, with
// every id this server holds there (lua/concurrency-renew.lua), and comes
// back a third of the shortest held lease later, so a renewal may be late
// by two thirds of a lease (a loaded loop, a slow Redis) and still land.
//
// A call whose reply missed its deadline may still run in Redis and take a
// slot for a request that was answered by its failure mode: its slots are
// given back at once (a release of its id, safe to send for slots that were
// never taken), and else end with their lease.

import { randomUUID } from 'node:crypto'
import { DEFAULT_LEASE_MS } from './concurrency-policy.js'
import { failOver, shadowed, summarize, timeoutOf } from './decisions.js'
import { decisionChannel, type EngineParts } from './engine.js'
import { mapNonEmpty, type NonEmpty } from './lists.js'
import { SlotTable } from './slot-table.js'
import { script } from '../store/script.js'
import { bucketState, type BucketSpec, type BucketState } from '../store/store.js'
import type { TimerHandle } from './clock.js'
import type { Acquired, Decision, DecisionSource, Policy } from './types.js'

const ACQUIRE = script('concurrency.lua')
const RENEW = script('concurrency-renew.lua')
const RELEASE = script('concurrency-release.lua')

/** The slot set of a bucket key (same hash tag, so the same Cluster slot). */
export function slotsKey (key: string): string {
  return `${key}!slots`
}

/** Whether a policy limits concurrency. */
export function hasSlots (policy: Policy): boolean {
  return policy.concurrency !== undefined
}

/** A policy's lease, ms. */
function leaseOf (policy: Policy): number {
  return policy.concurrency?.leaseMs ?? DEFAULT_LEASE_MS
}

/** One policy's outcome: a bucket's state, or the slots taken (`ok`: this request's fits). */
type Outcome = { readonly state: BucketState } | { readonly taken: number, readonly ok: boolean }

/** Where held slots live: Redis, the in-process store (no `redis`), or the local fallback. */
type Place = 'remote' | 'memory' | 'local'

/** The slots this server holds on one key. */
interface HeldKey { readonly place: Place, readonly leaseMs: number, readonly ids: Set<string> }

/** The slots of one acquisition: per key, where. */
type Taken = ReadonlyArray<{ readonly key: string, readonly place: Place }>

/** How the engine names a list's buckets (lib/core/engine.ts specsOf). */
export type SpecsOf = (clientKey: string, list: NonEmpty<Policy>, costs: ReadonlyArray<number | undefined> | undefined) => NonEmpty<BucketSpec>

/** The release of an acquisition that took nothing. */
const NOTHING: Acquired['release'] = async () => {}

export class Slots {
  readonly #parts: EngineParts
  readonly #specsOf: SpecsOf
  readonly #tables: Readonly<Record<Exclude<Place, 'remote'>, SlotTable>>
  readonly #held = new Map<string, HeldKey>()
  #timer: TimerHandle | undefined
  #tickAt = Infinity
  /** Renewal calls sent to Redis since start (the measure of docs/guides/concurrency.md). */
  renewals = 0

  constructor (parts: EngineParts, specsOf: SpecsOf) {
    this.#parts = parts
    this.#specsOf = specsOf
    const clock = (): number => parts.time.now()
    this.#tables = { memory: new SlotTable(10_000, clock), local: new SlotTable(10_000, clock) }
  }

  /** Takes the list's slots and tokens, all or nothing; the caller releases. */
  async acquire (clientKey: string, list: NonEmpty<Policy>, costs: ReadonlyArray<number | undefined> | undefined): Promise<Acquired> {
    const { names, remote, defaultTimeout } = this.#parts
    const timeoutMs = timeoutOf(list, defaultTimeout)
    if (!names.known) await names.load(timeoutMs)
    const specs = mapNonEmpty(this.#specsOf(clientKey, list, costs), (spec, i) => hasSlots(list[i] ?? list[0]) ? { ...spec, key: slotsKey(spec.key) } : spec)
    const id = randomUUID()
    let acquired: Acquired
    if (remote === undefined) {
      acquired = this.#here(list, specs, id, 'memory', 'store')
    } else {
      try {
        const reply = await remote.guard.run(() => remote.store.run(ACQUIRE, specs.map((s) => s.key), argsOf(list, specs, id)), timeoutMs, specs)
        acquired = this.#taken(list, specs, id, outcomesOf(list, specs, reply), 'remote', 'store')
      } catch {
        this.#giveBack(list, specs, id)
        acquired = failOver(remote.guard, list, specs, (local, localSpecs) => this.#here(local, localSpecs, id, 'local', 'local'), (decision) => ({ decision, release: NOTHING }))
      }
    }
    this.#published(clientKey, acquired.decision)
    return acquired
  }

  /** Gives back every held slot (the limiter closes) and stops renewing. */
  async close (): Promise<void> {
    this.#parts.time.clear(this.#timer)
    this.#timer = undefined
    this.#tickAt = Infinity
    const held = [...this.#held]
    this.#held.clear()
    await Promise.all(held.map(([key, { place, ids }]) => this.#drop(key, place, [...ids])))
    this.#tables.memory.clear()
    this.#tables.local.clear()
  }

  /** The slots held in this process (for tests and the docs' measures). */
  get held (): number {
    let n = 0
    for (const { ids } of this.#held.values()) n += ids.size
    return n
  }

  /** Decided in this process, synchronously (so atomically): the in-process store, or the local fallback. */
  #here (list: NonEmpty<Policy>, specs: NonEmpty<BucketSpec>, id: string, place: Exclude<Place, 'remote'>, source: DecisionSource): Acquired {
    const table = this.#tables[place]
    const buckets = place === 'memory' ? this.#parts.memory : this.#parts.local
    const outcomes: Outcome[] = list.map((policy, i) => {
      const spec = specs[i] ?? specs[0]
      if (!hasSlots(policy)) return { state: buckets.decideSync([spec], false).buckets[0] ?? FULL }
      const taken = table.taken(spec.key)
      return { taken, ok: taken < policy.capacity }
    })
    const take = (shadow: boolean): void => {
      const rates = specs.filter((_, i) => !hasSlots(list[i] ?? list[0]) && (list[i]?.shadow === true) === shadow)
      const states = (rates.length === 0 ? [] : buckets.decideSync(rates, true).buckets).values()
      list.forEach((policy, i) => {
        const spec = specs[i] ?? specs[0]
        if ((policy.shadow === true) !== shadow) return
        if (hasSlots(policy)) {
          table.add(spec.key, id, leaseOf(policy))
          outcomes[i] = { taken: (table.taken(spec.key)), ok: true }
        } else {
          outcomes[i] = { state: states.next().value ?? FULL }
        }
      })
    }
    if (sideFits(list, outcomes, false)) {
      take(false)
      if (sideFits(list, outcomes, true)) take(true)
    }
    return this.#taken(list, specs, id, outcomes, place, source)
  }

  /** The decision of the outcomes, and the slots it holds (registered for renewal). */
  #taken (list: NonEmpty<Policy>, specs: NonEmpty<BucketSpec>, id: string, outcomes: readonly Outcome[], place: Place, source: DecisionSource): Acquired {
    const decision = decisionOf(list, outcomes, source)
    if (!decision.allowed) return { decision, release: NOTHING }
    const taken: Array<{ key: string, place: Place }> = []
    list.forEach((policy, i) => {
      const outcome = outcomes[i]
      const spec = specs[i]
      if (!hasSlots(policy) || spec === undefined || outcome === undefined || !('taken' in outcome) || !outcome.ok) return
      if (policy.shadow === true && !sideFits(list, outcomes, true)) return
      this.#hold(spec.key, place, leaseOf(policy), id)
      taken.push({ key: spec.key, place })
    })
    if (taken.length === 0) return { decision, release: NOTHING }
    let released: Promise<void> | undefined
    return { decision, release: () => (released ??= this.#release(taken, id)) }
  }

  #hold (key: string, place: Place, leaseMs: number, id: string): void {
    let held = this.#held.get(key)
    if (held === undefined) {
      held = { place, leaseMs, ids: new Set() }
      this.#held.set(key, held)
    }
    held.ids.add(id)
    this.#arm(leaseMs / 3)
  }

  async #release (taken: Taken, id: string): Promise<void> {
    await Promise.all(taken.map(({ key, place }) => {
      const held = this.#held.get(key)
      held?.ids.delete(id)
      if (held?.ids.size === 0) this.#held.delete(key)
      return this.#drop(key, place, [id])
    }))
  }

  /** Removes slots from where they are; a store that fails leaves them to end with their lease. */
  async #drop (key: string, place: Place, ids: readonly string[]): Promise<void> {
    if (place !== 'remote') return this.#tables[place].remove(key, ids)
    const remote = this.#parts.remote
    try {
      await remote?.guard.run(() => remote.store.run(RELEASE, [key], ids), this.#parts.defaultTimeout, [])
    } catch {
      // Counted by the guard; the slots end with their lease.
    }
  }

  /** A call that failed may have run late: its id's slots, if any, are given back. */
  #giveBack (list: NonEmpty<Policy>, specs: NonEmpty<BucketSpec>, id: string): void {
    specs.forEach((spec, i) => {
      if (hasSlots(list[i] ?? list[0])) this.#drop(spec.key, 'remote', [id]).catch(() => {})
    })
  }

  /** Arms the one renewal timer `inMs` from now, unless it fires sooner already. */
  #arm (inMs: number): void {
    const { time } = this.#parts
    const at = time.now() + inMs
    if (at >= this.#tickAt) return
    time.clear(this.#timer)
    this.#tickAt = at
    this.#timer = time.set(() => { this.#tick() }, inMs, false)
  }

  #tick (): void {
    this.#timer = undefined
    this.#tickAt = Infinity
    let shortest = Infinity
    for (const [key, { place, leaseMs, ids }] of this.#held) {
      shortest = Math.min(shortest, leaseMs)
      if (place !== 'remote') {
        this.#tables[place].renew(key, ids, leaseMs)
        continue
      }
      const remote = this.#parts.remote
      this.renewals++
      remote?.guard.run(() => remote.store.run(RENEW, [key], [leaseMs, ...ids]), this.#parts.defaultTimeout, []).catch(() => {})
    }
    if (shortest !== Infinity) this.#arm(shortest / 3)
  }

  #published (clientKey: string, decision: Decision): void {
    if (decisionChannel.hasSubscribers) decisionChannel.publish(decision.shadow === true ? { key: clientKey, decision, shadow: true } : { key: clientKey, decision })
    this.#parts.metrics?.decided(decision.shadow === true ? { ...decision, allowed: false } : decision, decision.shadow === true)
  }
}

/** A full bucket (never used: decideSync answers one state per spec). */
const FULL: BucketState = { remaining: 0, fullInUs: 0, waitUs: 0 }

/** lua/concurrency.lua's arguments (read its header). */
function argsOf (list: NonEmpty<Policy>, specs: NonEmpty<BucketSpec>, id: string): Array<string | number> {
  const args: Array<string | number> = [id]
  list.forEach((policy, i) => {
    const spec = specs[i] ?? specs[0]
    const shadow = policy.shadow === true
    if (hasSlots(policy)) {
      args.push(shadow ? 'C' : 'c', policy.capacity, leaseOf(policy), 0)
    } else {
      const step = 1e6 / spec.refillPerSecond
      args.push(shadow ? 'R' : 'r', spec.capacity * step, spec.cost * step, spec.cost * 1e6 / spec.refillPerSecond)
    }
  })
  return args
}

/** The outcomes of lua/concurrency.lua's reply: one integer per policy. */
function outcomesOf (list: NonEmpty<Policy>, specs: NonEmpty<BucketSpec>, reply: unknown): Outcome[] {
  const values = [reply].flat()
  return list.map((policy, i) => {
    const value = Number(values[i])
    if (!Number.isFinite(value)) throw new TypeError(`lua/concurrency.lua replied ${String(reply)}, not one integer per policy`)
    return hasSlots(policy) ? { taken: Math.abs(value), ok: value >= 0 } : { state: bucketState(value, specs[i] ?? specs[0]) }
  })
}

function fits (outcome: Outcome | undefined): boolean {
  return outcome === undefined || ('ok' in outcome ? outcome.ok : outcome.state.waitUs === 0)
}

/** Whether every policy of one side (shadow or enforced) fits. */
function sideFits (list: readonly Policy[], outcomes: readonly Outcome[], shadow: boolean): boolean {
  return list.every((policy, i) => (policy.shadow === true) !== shadow || fits(outcomes[i]))
}

/**
 * The decision of a list: each policy's own (a rate's as `consume` gives
 * it; slots: `limit` the max, `remaining` the free slots, a denial's retry
 * one second: a slot frees when a request ends, which no one can foretell),
 * and for several the binding one, as lib/core/decisions.ts summarize
 * chooses. A shadow policy's denial is a would-be denial.
 */
function decisionOf (list: NonEmpty<Policy>, outcomes: readonly Outcome[], source: DecisionSource): Decision {
  const allowed = sideFits(list, outcomes, false)
  const decisions = list.map((policy, i): Decision => {
    const outcome = outcomes[i] ?? { taken: 0, ok: true }
    const own = 'ok' in outcome
      ? { allowed: outcome.ok, limit: policy.capacity, remaining: Math.max(0, policy.capacity - outcome.taken), resetMs: 0, retryAfterMs: outcome.ok ? 0 : 1000, source, bucket: policy.bucket }
      : summarize([policy], { allowed: outcome.state.waitUs === 0, buckets: [outcome.state] }, source)
    return policy.shadow === true ? shadowed(own) : own
  })
  const [first] = decisions
  if (decisions.length === 1 && first !== undefined) return first
  // The top level describes an enforced rate policy when there is one (the
  // draft-6 and legacy headers describe the rate: SPEC 13), else an enforced
  // one; a denial waits for the longest of the policies that denied.
  const enforced = (i: number): boolean => list[i]?.shadow !== true
  const rate = decisions.filter((_, i) => enforced(i) && !hasSlots(list[i] ?? list[0]))
  const pool = [rate, decisions.filter((_, i) => enforced(i)), decisions].find((some) => some.length > 0) ?? decisions
  const chosen = pool.reduce((best, next) => (allowed ? next.remaining < best.remaining : next.retryAfterMs > best.retryAfterMs) ? next : best)
  const combined: Decision = { ...chosen, allowed, policies: decisions }
  if (!allowed) combined.retryAfterMs = Math.max(...decisions.filter((d) => !d.allowed).map((d) => d.retryAfterMs))
  if (allowed && decisions.some((d) => d.shadow === true)) combined.shadow = true
  return combined
}
