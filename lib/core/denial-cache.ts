import { LruMap } from 'toad-cache'
import { monotonic, type Clock } from './deadline.js'
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
 * in O(1) (toad-cache's LruMap: see lib/store/memory-store.ts for why not a
 * plain Map).
 */
export class DenialCache {
  readonly #entries: LruMap<Denial>
  readonly #maxAgeMs: number
  readonly #marks: Marks
  readonly #clock: Clock

  constructor (maxKeys: number, maxAgeMs = DEFAULT_MAX_AGE_MS, clock: Clock = monotonic) {
    this.#clock = clock
    this.#entries = new LruMap<Denial>(maxKeys)
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
      this.#entries.delete(id)
      return undefined
    }
    if (!covers(entry.specs, specs)) return undefined
    return shift(entry.decision, now - entry.sentAt)
  }

  /** Caches a store denial of a call sent at `sentAt`, unless a reset or refund of its buckets may postdate it. */
  set (id: string, specs: readonly BucketSpec[], decision: Decision, sentAt: number): void {
    for (const spec of specs) if (this.#marks.stale(spec.key, sentAt)) return
    this.#entries.set(id, { until: sentAt + Math.min(decision.retryAfterMs, this.#maxAgeMs), sentAt, specs, decision })
  }

  /**
   * A reset of `key` was applied in the store (learnt at `at`): drops every
   * denial that involves it (see forget) and keeps replies to calls sent
   * before `at` out.
   */
  reset (key: string, at: number): void {
    this.#marks.mark(key, at)
    this.forget(key)
  }

  /**
   * A refund of the buckets `keys` was applied in the store (learnt at
   * `at`): drops, in O(1) each, the denials it can make wrong that can be
   * found without a scan: that of these buckets together and that of each
   * of them alone (another single-policy route naming one of them). Other
   * sets that include one of them hold until their wait or `maxAgeMs` is
   * over: a denial too many, never an admission. (forget() would find
   * them, but it scans the cache: about 1.8 ms per call with 10 000
   * cached denials, on every refund.)
   */
  refunded (keys: readonly string[], at: number): void {
    for (const key of keys) this.#marks.mark(key, at)
    this.#entries.delete(keys.join('\n'))
    if (keys.length > 1) for (const key of keys) this.#entries.delete(key)
  }

  /**
   * Changes until `at` may have gone unheard (the subscription to other
   * servers' changes was down): drops every denial, and keeps replies to
   * calls sent before `at` out.
   */
  distrust (at: number): void {
    this.#marks.markAll(at)
    this.#entries.clear()
  }

  /**
   * Drops every denial that involves `key`. Bucket names may hold '\n', so
   * an id cannot be split back into its keys: this drops every id that
   * has `key` as a whole '\n'-separated part, which may also drop a denial
   * that does not involve it. That costs one store call, never a wrong
   * answer.
   */
  forget (key: string): void {
    const gone: string[] = []
    // toad-cache types its keys `any`: they are the ids set here, strings.
    const ids: Iterable<string> = this.#entries.keys()
    for (const id of ids) {
      if (id === key || id.startsWith(key + '\n') || id.endsWith('\n' + key) || id.includes('\n' + key + '\n')) gone.push(id)
    }
    this.#entries.deleteMany(gone)
  }

  clear (): void {
    this.#entries.clear()
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
