import type { BucketSpec, BucketState, Store, StoreReply } from './store.js'

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
 * The token bucket in process memory, with the same encoding and the same
 * decisions as lua/token-bucket.lua: one number per bucket, the microsecond
 * at which it is full again. Correct for one process only.
 *
 * Size-capped: past `maxKeys` the least recently written bucket is dropped,
 * which makes it full again (the cap trades a little over-admission for
 * bounded memory; the default is far above what one process sees at once).
 * Buckets are kept in write order, so the oldest entry is the one to drop.
 */
export class MemoryStore implements Store {
  readonly #fullAt = new Map<string, number>()
  readonly #maxKeys: number
  readonly #now: () => number

  constructor (options: MemoryStoreOptions = {}) {
    this.#maxKeys = options.maxKeys ?? 100_000
    this.#now = options.now ?? monotonicMicros
  }

  get size (): number {
    return this.#fullAt.size
  }

  decideSync (specs: readonly BucketSpec[], consume: boolean): StoreReply {
    const now = this.#now()
    const buckets: BucketState[] = []
    const after: number[] = []
    let allowed = true
    for (const spec of specs) {
      const step = 1e6 / spec.refillPerSecond
      let full = this.#fullAt.get(spec.key) ?? now
      if (full < now) full = now
      const spent = full + spec.cost * step
      const over = spent - now - spec.capacity * step
      const waitUs = over > 0 ? Math.ceil(over) : 0
      if (waitUs > 0) allowed = false
      after.push(Math.ceil(spent))
      buckets.push({ remaining: 0, fullInUs: full - now, waitUs })
    }
    for (let i = 0; i < specs.length; i++) {
      const spec = specs[i] as BucketSpec
      const state = buckets[i] as BucketState
      if (allowed && consume) {
        const full = after[i] as number
        state.fullInUs = full - now
        this.#write(spec.key, full)
      }
      state.remaining = spec.capacity - state.fullInUs / (1e6 / spec.refillPerSecond)
    }
    return { allowed, nowUs: now, buckets }
  }

  async decide (specs: readonly BucketSpec[], consume: boolean): Promise<StoreReply> {
    return this.decideSync(specs, consume)
  }

  async reset (key: string): Promise<void> {
    this.#fullAt.delete(key)
  }

  clear (): void {
    this.#fullAt.clear()
  }

  #write (key: string, full: number): void {
    const map = this.#fullAt
    map.delete(key)
    map.set(key, full)
    if (map.size > this.#maxKeys) map.delete(map.keys().next().value as string)
  }
}
