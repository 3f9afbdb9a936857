import { LruMap } from 'toad-cache'
import { bucketState, type BucketSpec, type BucketState, type StoreReply } from './store.js'

/** Microseconds on a monotonic clock anchored at the epoch. */
export function monotonicMicros (): number {
  return Math.floor((performance.timeOrigin + performance.now()) * 1000)
}

export interface MemoryStoreOptions {
  /** Most buckets kept; the least recently used are dropped past it. */
  maxKeys?: number
  /** Clock in microseconds, for tests. */
  now?: () => number
}

/**
 * The token bucket in process memory, with the same encoding, arithmetic
 * and rounding as lua/token-bucket.lua: one number per bucket, the
 * microsecond at which it is full again. Correct for one process only.
 *
 * Size-capped: past `maxKeys` the least recently used bucket (read or
 * written) is dropped, which makes it full again (the cap trades a little
 * over-admission for bounded memory; the default is far above what one
 * process sees at once). A client that keeps knocking on its empty bucket
 * keeps it in memory. The map is an LRU with O(1) eviction (toad-cache's
 * LruMap, a Map plus a linked list): finding the oldest entry of a plain
 * Map through `keys().next()` walks the holes that its deletions leave, so
 * at the cap a new client would cost many times what it costs below it.
 */
export class MemoryStore {
  readonly #fullAt: LruMap<number>
  readonly #now: () => number

  constructor (options: MemoryStoreOptions = {}) {
    this.#fullAt = new LruMap<number>(options.maxKeys ?? 100_000)
    this.#now = options.now ?? monotonicMicros
  }

  decideSync (specs: readonly BucketSpec[], consume: boolean): StoreReply {
    const now = this.#now()
    const values: number[] = []
    let allowed = true
    for (const spec of specs) {
      const step = 1e6 / spec.refillPerSecond
      const window = spec.capacity * step
      // As in the script: a full-at time more than one window ahead (a clock
      // that stepped back) reads as an empty bucket, never as a longer wait.
      const busy = Math.min(window, Math.max(0, (this.#fullAt.get(spec.key) ?? now) - now))
      const over = busy + spec.cost * step - window
      if (over > 0) {
        allowed = false
        values.push(-Math.ceil(over))
      } else {
        values.push(busy)
      }
    }
    if (allowed && consume) {
      for (let i = 0; i < specs.length; i++) {
        const spec = specs[i] as BucketSpec
        const busy = Math.ceil((values[i] as number) + spec.cost * 1e6 / spec.refillPerSecond)
        values[i] = busy
        this.#fullAt.set(spec.key, now + busy)
      }
    }
    const buckets: BucketState[] = []
    for (let i = 0; i < specs.length; i++) buckets.push(bucketState(values[i] as number, specs[i] as BucketSpec))
    return { allowed, buckets }
  }

  /**
   * The reserve of lua/settle.lua: the consume of decideSync, but a bucket
   * may be in debt, up to two windows ahead (see the script's header).
   */
  reserveSync (specs: readonly BucketSpec[]): StoreReply {
    const now = this.#now()
    const values: number[] = []
    let allowed = true
    for (const spec of specs) {
      const window = spec.capacity * (1e6 / spec.refillPerSecond)
      const busy = this.#busy(spec.key, now, 2 * window)
      const over = busy + spec.cost * (1e6 / spec.refillPerSecond) - window
      if (over > 0) allowed = false
      values.push(over > 0 ? -Math.ceil(over) : busy)
    }
    if (allowed) {
      for (let i = 0; i < specs.length; i++) {
        const spec = specs[i] as BucketSpec
        values[i] = this.#write(spec.key, now, (values[i] as number) + spec.cost * 1e6 / spec.refillPerSecond)
      }
    }
    return { allowed, buckets: specs.map((spec, i) => bucketState(values[i] as number, spec)) }
  }

  /**
   * The settle of lua/settle.lua: moves each bucket's full-at time by its
   * change (`changes[i]`, microseconds: < 0 a refund, > 0 a charge), never
   * past full nor more than two windows ahead. Returns each bucket's
   * microseconds until full.
   */
  settleSync (specs: readonly BucketSpec[], changes: readonly number[]): number[] {
    const now = this.#now()
    return specs.map((spec, i) => {
      const limit = 2 * (spec.capacity * (1e6 / spec.refillPerSecond))
      return this.#write(spec.key, now, Math.min(limit, this.#busy(spec.key, now, limit) + (changes[i] as number)))
    })
  }

  /** Microseconds until full, read as at most `limit` (a clock step back). */
  #busy (key: string, now: number, limit: number): number {
    return Math.min(limit, Math.max(0, (this.#fullAt.get(key) ?? now) - now))
  }

  /** Stores `now + busy`, busy rounded up to a whole microsecond; a full bucket is dropped. */
  #write (key: string, now: number, busy: number): number {
    const whole = Math.ceil(busy)
    if (whole <= 0) {
      this.#fullAt.delete(key)
      return 0
    }
    this.#fullAt.set(key, now + whole)
    return whole
  }

  async reset (key: string): Promise<void> {
    this.#fullAt.delete(key)
  }

  clear (): void {
    this.#fullAt.clear()
  }
}
