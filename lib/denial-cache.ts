import { LruMap } from 'toad-cache'
import type { BucketSpec } from './store.js'
import type { Decision } from './types.js'

interface Denial {
  /** performance.now() at which the store may allow again. */
  until: number
  /** performance.now() when the denied call was sent. */
  sentAt: number
  costs: readonly number[]
  decision: Decision
}

/**
 * Remembers store denials so that a flooding client costs no round trip.
 *
 * When the store denies a request, it says how long its buckets need
 * before they can afford the cost (`retryAfterMs`, on the store's clock,
 * measured when the script ran). The script ran after the call was sent,
 * so `sentAt + retryAfterMs` is no later than the moment the store would
 * allow again: until then, a request for the same buckets with a cost at
 * least as high is denied here without a call. This never denies what the
 * store would allow; it may send a call up to one round trip earlier than
 * needed, which the store then decides.
 *
 * Keyed by the request's bucket keys (one entry per key set, the keys
 * joined by '\n'); size-capped, least recently used entry dropped first,
 * in O(1) (toad-cache's LruMap: see lib/memory-store.ts for why not a
 * plain Map).
 */
export class DenialCache {
  readonly #entries: LruMap<Denial>

  constructor (maxKeys: number) {
    this.#entries = new LruMap<Denial>(maxKeys)
  }

  get size (): number {
    return this.#entries.size
  }

  /** A denial still in force for these keys and costs, shifted to now; else undefined. */
  get (id: string, specs: readonly BucketSpec[]): Decision | undefined {
    const entry = this.#entries.get(id)
    if (entry === undefined) return undefined
    const now = performance.now()
    if (now >= entry.until) {
      this.#entries.delete(id)
      return undefined
    }
    for (let i = 0; i < specs.length; i++) {
      if ((specs[i] as BucketSpec).cost < (entry.costs[i] as number)) return undefined
    }
    return shift(entry.decision, now - entry.sentAt)
  }

  set (id: string, specs: readonly BucketSpec[], decision: Decision, sentAt: number): void {
    this.#entries.set(id, { until: sentAt + decision.retryAfterMs, sentAt, costs: specs.map((s) => s.cost), decision })
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
    for (const id of this.#entries.keys() as IterableIterator<string>) {
      if (id === key || id.startsWith(key + '\n') || id.endsWith('\n' + key) || id.includes('\n' + key + '\n')) gone.push(id)
    }
    this.#entries.deleteMany(gone)
  }

  clear (): void {
    this.#entries.clear()
  }
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
