import { realTime, type Clock } from './clock.js'
import { Lru } from './lru.js'
import { Marks } from './marks.js'
import type { BucketSpec } from '../store/store.js'
import type { Decision } from './types.js'

/** How long a cached denial is trusted at most, ms, unless `denialCache.maxAgeMs` says otherwise. */
export const DEFAULT_MAX_AGE_MS = 1000

interface Denial {
  /** performance.now() at which the store may allow again. */
  until: number
  /** performance.now() when the denied call was sent. */
  sentAt: number
  /** The denied request's buckets: key, capacity, refill and cost of each. */
  specs: readonly BucketSpec[]
  decision: Decision
}

/**
 * Remembers store denials so that a flooding client costs no round trip.
 *
 * When the store denies a request, it says how long its buckets need
 * before they can afford the cost (`retryAfterMs`, on the store's clock,
 * measured when the script ran). The script ran after the call was sent,
 * so `sentAt + retryAfterMs` is no later than the moment the store would
 * allow again: until then, a request for the same buckets, under the same
 * capacity and refill, with a cost at least as high, is denied here without
 * a call. This never denies what the store would allow; it may send a call
 * up to one round trip earlier than needed, which the store then decides.
 *
 * Why the same capacity and refill: routes that name one bucket may give it
 * different policies, and a bucket's stored state means a different token
 * count under each. A denial under capacity 2 says nothing about capacity
 * 100; under the same policy, spending by anyone only delays the moment the
 * bucket can afford the cost, so the denial stays true until `until`.
 *
 * What breaks that reasoning is a change the cache cannot see coming: a
 * reset or a refund, here or on another app server. Those made here drop
 * the entries they make wrong; those made elsewhere arrive as messages
 * (lib/core/invalidation.ts) and do the same; a reply to a call sent before
 * either is not cached (lib/core/marks.ts). A message can be missed (the
 * subscription was down, Redis refused it), so no denial is trusted longer
 * than `maxAgeMs` after its call was sent, whatever wait it named: that is
 * the bound on how long any change made elsewhere can go unseen here.
 *
 * Keyed by the request's bucket keys (one entry per key set, the keys
 * joined by '\n'); size-capped, least recently used entry dropped first,
 * in O(1) (lib/core/lru.ts). Indexed by bucket key as well, so that a
 * reset or a refund finds the entries of its bucket without a scan: with
 * the login pattern (a reset on each successful login) every login sends
 * every server a message, and a scan of 10 000 cached denials cost each of
 * them 1.2 to 2.1 ms of CPU per message. The index holds exactly the ids of
 * the cached entries: it is updated wherever an entry is set, dropped or
 * evicted, so it is capped with them.
 */
export class DenialCache {
  readonly #entries: Lru<Denial>
  /** Bucket key to the ids of the cached entries that involve it. */
  readonly #byKey = new Map<string, Set<string>>()
  readonly #maxAgeMs: number
  readonly #marks: Marks
  readonly #clock: Clock

  constructor (maxKeys: number, maxAgeMs = DEFAULT_MAX_AGE_MS, clock: Clock = realTime.now) {
    this.#clock = clock
    this.#entries = new Lru<Denial>(maxKeys, (id, entry) => { this.#unindex(id, entry) })
    this.#maxAgeMs = maxAgeMs
    this.#marks = new Marks(maxKeys)
  }

  get size (): number {
    return this.#entries.size
  }

  /** A denial still in force for these buckets, policies and costs, shifted to now; else undefined. */
  get (id: string, specs: readonly BucketSpec[]): Decision | undefined {
    const entry = this.#entries.get(id)
    if (entry === undefined) return undefined
    const now = this.#clock()
    if (now >= entry.until) {
      this.#drop(id)
      return undefined
    }
    if (!covers(entry.specs, specs)) return undefined
    return shift(entry.decision, now - entry.sentAt)
  }

  /** Caches a store denial of a call sent at `sentAt`, unless a reset or refund of its buckets may postdate it. */
  set (id: string, specs: readonly BucketSpec[], decision: Decision, sentAt: number): void {
    for (const spec of specs) if (this.#marks.stale(spec.key, sentAt)) return
    // An entry of this id may have other keys (bucket names may hold '\n'): out of the index first.
    this.#drop(id)
    const entry = { until: sentAt + Math.min(decision.retryAfterMs, this.#maxAgeMs), sentAt, specs, decision }
    this.#entries.set(id, entry)
    for (const spec of specs) {
      const ids = this.#byKey.get(spec.key)
      if (ids === undefined) this.#byKey.set(spec.key, new Set([id]))
      else ids.add(id)
    }
  }

  /**
   * A reset of `key` was applied in the store (learnt at `at`): drops every
   * denial that involves it and keeps replies to calls sent before `at` out.
   * Its cost grows with the denials of that bucket, not with the cache.
   */
  reset (key: string, at: number): void {
    this.#marks.mark(key, at)
    const ids = this.#byKey.get(key)
    if (ids === undefined) return
    // #drop takes each id out of this set as well: walk a copy.
    for (const id of Array.from(ids)) this.#drop(id)
  }

  /**
   * A refund of the buckets `keys` was applied in the store (learnt at
   * `at`): a refund can make wrong every denial that involves one of them,
   * as a reset of each does (that of these buckets together, that of each
   * alone, that of another route whose policies include one of them).
   */
  refunded (keys: readonly string[], at: number): void {
    for (const key of keys) this.reset(key, at)
  }

  /**
   * Changes until `at` may have gone unheard (the subscription to other
   * servers' changes was down): drops every denial, and keeps replies to
   * calls sent before `at` out.
   */
  distrust (at: number): void {
    this.#marks.markAll(at)
    this.clear()
  }

  clear (): void {
    this.#entries.clear()
    this.#byKey.clear()
  }

  #drop (id: string): void {
    const entry = this.#entries.peek(id)
    if (entry === undefined) return
    this.#entries.delete(id)
    this.#unindex(id, entry)
  }

  #unindex (id: string, entry: Denial): void {
    for (const { key } of entry.specs) {
      const ids = this.#byKey.get(key)
      // undefined when the entry's keys repeat one (two policies on one bucket): gone with the first.
      if (ids === undefined) continue
      ids.delete(id)
      if (ids.size === 0) this.#byKey.delete(key)
    }
  }
}

/**
 * True when a request for `asked` is denied wherever `denied` was: the same
 * buckets under the same capacity and refill, each cost at least as high.
 */
function covers (denied: readonly BucketSpec[], asked: readonly BucketSpec[]): boolean {
  if (denied.length !== asked.length) return false
  for (let i = 0; i < asked.length; i++) {
    const d = denied[i]
    const a = asked[i]
    // Both lists are as long: `a` and `d` are always there.
    if (a === undefined || d === undefined || a.key !== d.key || a.capacity !== d.capacity || a.refillPerSecond !== d.refillPerSecond || a.cost < d.cost) return false
  }
  return true
}

function shift (decision: Decision, elapsed: number): Decision {
  const moved: Decision = {
    ...decision,
    resetMs: Math.max(0, decision.resetMs - elapsed),
    retryAfterMs: decision.retryAfterMs === 0 ? 0 : Math.max(0, decision.retryAfterMs - elapsed),
    source: 'cache'
  }
  if (decision.policies !== undefined) moved.policies = decision.policies.map((d) => shift(d, elapsed))
  return moved
}
