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
// Waiting. A concurrency policy with `maxWaitMs` that is denied tries again
// until a slot is free or its wait is over (lib/core/slot-wait.ts): woken
// when this process gives back a slot of its key, else polling.
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
import { SlotWaits } from './slot-wait.js'
import { script } from '../store/script.js'
import { bucketState, type BucketSpec, type StoreReply } from '../store/store.js'
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

/** One policy's outcome: its bucket's reply, or the slots taken (`ok`: this request's fits). */
type Outcome = { readonly rate: StoreReply } | { readonly taken: number, readonly ok: boolean }

/** A policy of the list with its key (a slot set's for slots). */
interface Entry { readonly policy: Policy, readonly spec: BucketSpec }

/** An entry with its outcome. */
interface Decided extends Entry { outcome: Outcome }

/** Where held slots live: Redis, the in-process store (no `redis`), or the local fallback. */
type Place = 'remote' | 'memory' | 'local'

/** The slots this server holds on one key. */
interface HeldKey { readonly place: Place, readonly leaseMs: number, readonly ids: Set<string> }

/** How the engine names a list's buckets (lib/core/engine.ts specsOf). */
export type SpecsOf = (clientKey: string, list: NonEmpty<Policy>, costs: ReadonlyArray<number | undefined> | undefined) => NonEmpty<BucketSpec>

/** The release of an acquisition that took nothing. */
const NOTHING: Acquired['release'] = async () => {}

/** Each policy with its spec (one spec per policy, in order: each is found). */
function entriesOf (list: readonly Policy[], specs: readonly BucketSpec[]): Entry[] {
  const entries: Entry[] = []
  list.forEach((policy, i) => {
    const spec = specs[i]
    if (spec !== undefined) entries.push({ policy, spec })
  })
  return entries
}

export class Slots {
  readonly #parts: EngineParts
  readonly #specsOf: SpecsOf
  readonly #tables: Readonly<Record<Exclude<Place, 'remote'>, SlotTable>>
  readonly #held = new Map<string, HeldKey>()
  readonly #waits: SlotWaits
  #timer: TimerHandle | undefined
  #tickAt = Infinity

  constructor (parts: EngineParts, specsOf: SpecsOf) {
    this.#parts = parts
    this.#specsOf = specsOf
    const clock = (): number => parts.time.now()
    this.#tables = { memory: new SlotTable(10_000, clock), local: new SlotTable(10_000, clock) }
    this.#waits = new SlotWaits(parts.waiters, parts.time)
  }

  /** Takes the list's slots and tokens, all or nothing, waiting for a slot with `maxWaitMs`; the caller releases. */
  async acquire (clientKey: string, list: NonEmpty<Policy>, costs: ReadonlyArray<number | undefined> | undefined): Promise<Acquired> {
    const { names, defaultTimeout } = this.#parts
    const timeoutMs = timeoutOf(list, defaultTimeout)
    if (!names.known) await names.load(timeoutMs)
    const specs = mapNonEmpty(this.#specsOf(clientKey, list, costs), (spec, i) => list[i]?.concurrency === undefined ? spec : { ...spec, key: slotsKey(spec.key) })
    const attempt = (): Promise<Acquired> => this.#attempt(list, specs, timeoutMs)
    let acquired = await attempt()
    // A wait is a single policy's (a list refuses `maxWaitMs`: lib/core/policy-fields.ts).
    const [only] = list
    if (only.maxWaitMs !== undefined && hasSlots(only)) acquired = await this.#waits.until(specs[0].key, only.maxWaitMs, acquired, attempt)
    this.#published(clientKey, acquired.decision)
    return acquired
  }

  /** One try at the list's slots and tokens, under a fresh id. */
  async #attempt (list: NonEmpty<Policy>, specs: NonEmpty<BucketSpec>, timeoutMs: number): Promise<Acquired> {
    const remote = this.#parts.remote
    const entries = entriesOf(list, specs)
    const id = randomUUID()
    if (remote === undefined) return this.#here(entries, id, 'memory', 'store')
    try {
      const reply = await remote.guard.run(() => remote.store.run(ACQUIRE, specs.map((s) => s.key), argsOf(entries, id)), timeoutMs, specs)
      return this.#taken(readReply(entries, reply), id, 'remote', 'store')
    } catch {
      this.#giveBack(entries, id)
      return failOver(remote.guard, list, specs, (local, localSpecs) => this.#here(entriesOf(local, localSpecs), id, 'local', 'local'), (decision) => ({ decision, release: NOTHING }))
    }
  }

  /** Gives back every held slot (the limiter closes) and stops renewing. */
  async close (): Promise<void> {
    // First: a wait that woke now would take a slot after the last was given back.
    this.#parts.waiters.close()
    this.#parts.time.clear(this.#timer)
    this.#timer = undefined
    this.#tickAt = Infinity
    const held = [...this.#held]
    this.#held.clear()
    await Promise.all(held.map(([key, { place, ids }]) => this.#drop(key, place, [...ids])))
    this.#tables.memory.clear()
    this.#tables.local.clear()
  }

  /** Decided in this process, synchronously (so atomically): the in-process store, or the local fallback. */
  #here (entries: readonly Entry[], id: string, place: Exclude<Place, 'remote'>, source: DecisionSource): Acquired {
    const table = this.#tables[place]
    const buckets = place === 'memory' ? this.#parts.memory : this.#parts.local
    const decided = entries.map(({ policy, spec }): Decided => {
      if (!hasSlots(policy)) return { policy, spec, outcome: { rate: buckets.decideSync([spec], false) } }
      const taken = table.taken(spec.key)
      return { policy, spec, outcome: { taken, ok: taken < policy.capacity } }
    })
    // Every policy of the side fits (checked first), and nothing runs between
    // these synchronous calls: taken one by one, they are taken all at once.
    const take = (shadow: boolean): void => {
      for (const entry of decided) {
        const { policy, spec } = entry
        if ((policy.shadow === true) !== shadow) continue
        if (hasSlots(policy)) table.add(spec.key, id, leaseOf(policy))
        entry.outcome = hasSlots(policy) ? { taken: table.taken(spec.key), ok: true } : { rate: buckets.decideSync([spec], true) }
      }
    }
    if (sideFits(decided, false)) {
      take(false)
      if (sideFits(decided, true)) take(true)
    }
    return this.#taken(decided, id, place, source)
  }

  /** The decision of the entries' outcomes, and the slots it took (held, and renewed, until released). */
  #taken (entries: readonly Decided[], id: string, place: Place, source: DecisionSource): Acquired {
    const decision = decisionOf(entries, source)
    if (!decision.allowed) return { decision, release: NOTHING }
    const shadowTaken = sideFits(entries, true)
    const keys: string[] = []
    for (const { policy, spec } of entries) {
      if (!hasSlots(policy) || (policy.shadow === true && !shadowTaken)) continue
      this.#hold(spec.key, place, leaseOf(policy), id)
      keys.push(spec.key)
    }
    if (keys.length === 0) return { decision, release: NOTHING }
    let released: Promise<void> | undefined
    return { decision, release: () => (released ??= this.#release(keys, place, id)) }
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

  async #release (keys: readonly string[], place: Place, id: string): Promise<void> {
    await Promise.all(keys.map((key) => {
      const held = this.#held.get(key)
      held?.ids.delete(id)
      if (held?.ids.size === 0) this.#held.delete(key)
      return this.#drop(key, place, [id]).then(() => { this.#waits.freed(key) })
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
  #giveBack (entries: readonly Entry[], id: string): void {
    for (const { policy, spec } of entries) {
      if (hasSlots(policy)) void this.#drop(spec.key, 'remote', [id])
    }
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
      remote?.guard.run(() => remote.store.run(RENEW, [key], [leaseMs, ...ids]), this.#parts.defaultTimeout, []).catch(() => {})
    }
    if (shortest !== Infinity) this.#arm(shortest / 3)
  }

  #published (clientKey: string, decision: Decision): void {
    if (decisionChannel.hasSubscribers) decisionChannel.publish(decision.shadow === true ? { key: clientKey, decision, shadow: true } : { key: clientKey, decision })
    this.#parts.metrics?.decided(decision.shadow === true ? { ...decision, allowed: false } : decision, decision.shadow === true)
  }
}

/** lua/concurrency.lua's arguments (read its header). */
function argsOf (entries: readonly Entry[], id: string): Array<string | number> {
  const args: Array<string | number> = [id]
  for (const { policy, spec } of entries) {
    const shadow = policy.shadow === true
    if (hasSlots(policy)) {
      args.push(shadow ? 'C' : 'c', policy.capacity, leaseOf(policy), 0)
    } else {
      const step = 1e6 / spec.refillPerSecond
      args.push(shadow ? 'R' : 'r', spec.capacity * step, spec.cost * step, spec.cost * 1e6 / spec.refillPerSecond)
    }
  }
  return args
}

/** The outcomes of lua/concurrency.lua's reply, one integer per policy (read its header). */
function readReply (entries: readonly Entry[], reply: unknown): Decided[] {
  const values = [reply].flat()
  return entries.map(({ policy, spec }, i): Decided => {
    const value = Number(values[i])
    return { policy, spec, outcome: hasSlots(policy) ? { taken: Math.abs(value), ok: value >= 0 } : { rate: { allowed: value >= 0, buckets: [bucketState(value, spec)] } } }
  })
}

function fits ({ outcome }: Decided): boolean {
  return 'ok' in outcome ? outcome.ok : outcome.rate.allowed
}

/** Whether every policy of one side (shadow or enforced) fits. */
function sideFits (entries: readonly Decided[], shadow: boolean): boolean {
  return entries.every((entry) => (entry.policy.shadow === true) !== shadow || fits(entry))
}

/** One policy's decision: a rate's as `consume` gives it; slots: `limit` the max, `remaining` the free slots. */
function entryDecision (entry: Decided, source: DecisionSource): Decision {
  const { policy, outcome } = entry
  const ok = fits(entry)
  const own = 'ok' in outcome
    // A denial's retry is a second: a slot frees when a request ends, which no one can foretell.
    // The earliest lease end is no bound: a live request renews its slot before it (docs/guides/concurrency.md).
    ? { allowed: ok, limit: policy.capacity, remaining: Math.max(0, policy.capacity - outcome.taken), resetMs: 0, retryAfterMs: ok ? 0 : 1000, source, bucket: policy.bucket }
    : summarize([policy], outcome.rate, source)
  return policy.shadow === true ? shadowed(own) : own
}

/**
 * The decision of a list: each policy's own, and for several the binding
 * one, as lib/core/decisions.ts summarize chooses. The top level describes
 * an enforced rate policy when there is one (the draft-6 and legacy headers
 * describe the rate: SPEC 13), else an enforced one; a denial waits for the
 * longest of the policies that denied. A shadow policy's denial is a
 * would-be denial.
 */
function decisionOf (entries: readonly Decided[], source: DecisionSource): Decision {
  const allowed = sideFits(entries, false)
  const rows = entries.map((entry) => ({ policy: entry.policy, decision: entryDecision(entry, source) }))
  const decisions = rows.map((row) => row.decision)
  const [first] = decisions
  if (decisions.length === 1 && first !== undefined) return first
  const enforced = rows.filter((row) => row.policy.shadow !== true)
  const rate = enforced.filter((row) => !hasSlots(row.policy))
  const pool = rate.length > 0 ? rate : enforced.length > 0 ? enforced : rows
  const chosen = pool.map((row) => row.decision).reduce((best, next) => (allowed ? next.remaining < best.remaining : next.retryAfterMs > best.retryAfterMs) ? next : best)
  const combined: Decision = { ...chosen, allowed, policies: decisions }
  if (!allowed) combined.retryAfterMs = Math.max(...decisions.filter((d) => !d.allowed).map((d) => d.retryAfterMs))
  if (allowed && decisions.some((d) => d.shadow === true)) combined.shadow = true
  return combined
}
