import { Lru } from './lru.js'

/**
 * When each key last changed in a way a process-local cache cannot see
 * coming (a reset, a refund), on the monotonic clock: a reply to a call
 * sent before that moment may describe the key as it was, and is not
 * cached (lib/core/denial-cache.ts, lib/core/lease.ts).
 *
 * Why this is needed on top of dropping the cached entries: a reply can
 * land after the change was learnt. A call sent at t0 runs in Redis before
 * a reset made elsewhere at t1; the reset's message reaches this process
 * at t2, on another connection than the call's reply, which may come at
 * t3 > t2. Dropping at t2 finds nothing; the reply, cached at t3, would
 * then hold the state from before the reset. A call sent after t2 ran
 * after the change (Redis delivered the message once the change was
 * applied), so only calls sent before a mark are suspect.
 *
 * Size-capped: past `max` keys the oldest mark is dropped and becomes the
 * floor, below which every call is suspect; so forgetting a mark can only
 * make the cache skip an entry, never keep a stale one. The oldest is found
 * in O(1) (lib/core/lru.ts): a plain Map's `keys().next()` walks the holes
 * its deletions leave, which made a mark at the cap cost 40 times one below
 * it, and every reset heard from the fleet marks a key.
 */
export class Marks {
  readonly #at: Lru<number>
  #floor = -Infinity

  constructor (max: number) {
    this.#at = new Lru<number>(max, (_key, when) => {
      if (when > this.#floor) this.#floor = when
    })
  }

  get size (): number {
    return this.#at.size
  }

  /** `key` changed at `at`: replies to calls on it sent until then are suspect. */
  mark (key: string, at: number): void {
    this.#at.set(key, at)
  }

  /** Every key may have changed until `at` (changes this process did not hear of). */
  markAll (at: number): void {
    if (at > this.#floor) this.#floor = at
  }

  /** Whether a reply to a call on `key` sent at `sentAt` may predate a change. */
  stale (key: string, sentAt: number): boolean {
    if (sentAt <= this.#floor) return true
    const at = this.#at.peek(key)
    return at !== undefined && sentAt <= at
  }
}
