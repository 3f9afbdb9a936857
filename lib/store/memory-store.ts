import { LruMap } from 'toad-cache'
import { bucketState, extReply, type BucketSpec, type BucketState, type ExtReply, type ExtSpec, type ReserveMark, type ReserveReply, type StoreReply } from './store.js'

/** lua/settle.lua's EPOCH_LIMIT: an epoch of refunds ends before its clock passes 2^51 microseconds. */
const EPOCH_LIMIT = 2 ** 51

/**
 * A lockout entry, as lua/token-bucket-ext.lua keeps it: `count` denials in
 * the period that started at `since`, or blocked `until`; both expire at
 * `expiry` (microseconds of the store's clock). Decisions read `since` and
 * `until`, as the script does; the expiry only frees the entry.
 */
type Lock = { count: number, since: number, expiry: number } | { until: number, expiry: number }

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
  /** Epochs of refunds, as lua/settle.lua keeps them: [start, refunds counted, last write], us. */
  readonly #epochs: LruMap<[number, number, number]>
  /** Lockouts, as lua/token-bucket-ext.lua keeps them. */
  readonly #locks: LruMap<Lock>
  readonly #now: () => number

  constructor (options: MemoryStoreOptions = {}) {
    this.#fullAt = new LruMap<number>(options.maxKeys ?? 100_000)
    this.#epochs = new LruMap<[number, number, number]>(options.maxKeys ?? 100_000)
    this.#locks = new LruMap<Lock>(options.maxKeys ?? 100_000)
    this.#now = options.now ?? monotonicMicros
  }

  decideSync (specs: readonly BucketSpec[], consume: boolean): StoreReply {
    const now = this.#now()
    // Each spec with its value: its busy time, or minus its shortfall.
    const values: Array<[BucketSpec, number]> = []
    let allowed = true
    for (const spec of specs) {
      const step = 1e6 / spec.refillPerSecond
      const window = spec.capacity * step
      // As in the script: a full-at time more than one window ahead (a clock
      // that stepped back, a plan downgraded to a smaller window) reads as an
      // empty bucket, never as a longer wait, and a consume writes it back so,
      // whatever it decides: the bucket refills from there.
      let busy = Math.max(0, (this.#fullAt.get(spec.key) ?? now) - now)
      if (busy > window) {
        busy = window
        if (consume) this.#fullAt.set(spec.key, now + Math.ceil(window))
      }
      const over = busy + spec.cost * step - window
      if (over > 0) {
        allowed = false
        values.push([spec, -Math.ceil(over)])
      } else {
        values.push([spec, busy])
      }
    }
    const spend = allowed && consume
    const buckets: BucketState[] = []
    for (const [spec, value] of values) {
      let busy = value
      if (spend) {
        busy = Math.ceil(busy + spec.cost * 1e6 / spec.refillPerSecond)
        this.#fullAt.set(spec.key, now + busy)
      }
      buckets.push(bucketState(busy, spec))
    }
    return { allowed, buckets }
  }

  /**
   * The reserve of lua/settle.lua: the consume of decideSync, but a bucket
   * may be in debt, up to two windows ahead (see the script's header); when
   * allowed, each bucket's mark for its settlement.
   */
  reserveSync (specs: readonly BucketSpec[]): ReserveReply {
    const now = this.#now()
    // Each spec with its value, as in decideSync.
    const values: Array<[BucketSpec, number]> = []
    let allowed = true
    for (const spec of specs) {
      const window = spec.capacity * (1e6 / spec.refillPerSecond)
      const busy = this.#busy(spec.key, now, 2 * window)
      const over = busy + spec.cost * (1e6 / spec.refillPerSecond) - window
      if (over > 0) allowed = false
      values.push([spec, over > 0 ? -Math.ceil(over) : busy])
    }
    const marks: ReserveMark[] = []
    const buckets: BucketState[] = []
    for (const [spec, value] of values) {
      let busy = value
      if (allowed) {
        const window = spec.capacity * (1e6 / spec.refillPerSecond)
        busy = this.#write(spec.key, now, busy + spec.cost * 1e6 / spec.refillPerSecond)
        const [epoch, counted] = this.#epoch(spec.key, now, window) ?? [now, 0]
        this.#epochs.set(spec.key, [epoch, counted, now])
        marks.push({ epoch, mark: now - epoch + counted + busy, floor: Math.trunc(now + spec.cost * (1e6 / spec.refillPerSecond)) })
      }
      buckets.push(bucketState(busy, spec))
    }
    return { allowed, buckets, marks }
  }

  /**
   * The settle of lua/settle.lua: moves each bucket's full-at time by its
   * change (`changes[i]`, microseconds: < 0 a refund, > 0 a charge), never
   * past full nor more than two windows ahead; a refund is cut to what the
   * reservation's part of the bucket still holds (`marks[i]`, from its
   * reserve). Returns each bucket's microseconds until full.
   */
  settleSync (specs: readonly BucketSpec[], changes: readonly number[], marks: readonly ReserveMark[]): number[] {
    const now = this.#now()
    const out: number[] = []
    for (let i = 0; i < specs.length; i++) {
      const spec = specs[i]
      const change = changes[i]
      const reserved = marks[i]
      // A settlement has one change and one mark per spec: all are always there.
      if (spec !== undefined && change !== undefined && reserved !== undefined) out.push(this.#settle(spec, change, reserved, now))
    }
    return out
  }

  /** settleSync for one bucket. */
  #settle (spec: BucketSpec, change: number, reserved: ReserveMark, now: number): number {
    const window = spec.capacity * (1e6 / spec.refillPerSecond)
    const limit = 2 * window
    const busy = this.#busy(spec.key, now, limit)
    if (change >= 0) return this.#write(spec.key, now, Math.min(limit, busy + change))
    const epoch = this.#epoch(spec.key, now, window)
    if (epoch === undefined || epoch[0] !== reserved.epoch) return this.#write(spec.key, now, busy)
    const [start, counted] = epoch
    const back = Math.min(-change, busy, Math.max(reserved.mark - (now - start + counted), reserved.floor - now))
    if (!(back > 0)) return this.#write(spec.key, now, busy)
    const left = this.#write(spec.key, now, busy - back)
    this.#epochs.set(spec.key, [start, counted + Math.ceil(busy - left), now])
    return left
  }

  /** A bucket's epoch of refunds in force: [start, refunds counted]; undefined when it has ended (see lua/settle.lua). */
  #epoch (key: string, now: number, window: number): [number, number] | undefined {
    const entry = this.#epochs.get(key)
    if (entry === undefined) return undefined
    const [start, counted, last] = entry
    if (now >= last && now < last + window && now - start + counted <= EPOCH_LIMIT) return [start, counted]
    this.#epochs.delete(key)
    return undefined
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

  /**
   * One bucket with reservations and a lockout: lua/token-bucket-ext.lua's
   * decision, step for step (read its header).
   */
  decideExtSync (spec: ExtSpec, consume: boolean): ExtReply {
    const now = this.#now()
    const lockout = spec.lockout
    let count = 0
    let since = now
    if (lockout !== undefined) {
      const within = lockout.withinMs * 1000
      const lock = this.#lock(spec.key, now)
      if (lock !== undefined && 'until' in lock) {
        const blocked = this.#blocked(spec, lockout, lock.until, now, consume)
        if (blocked !== undefined) return blocked
      } else if (lock !== undefined) {
        count = lock.count
        since = lock.since
      }
      if (since > now) {
        // A period that starts after now: the clock stepped back.
        since = now
        if (consume) this.#locks.set(spec.key, { count, since, expiry: now + (lockout.withinMs + 1) * 1000 })
      } else if (now - since >= within) {
        count = 0
        since = now
      }
    }
    const step = 1e6 / spec.refillPerSecond
    const window = spec.capacity * step
    const reach = window + spec.maxWaitUs
    const stored = this.#fullAt.get(spec.key) ?? now
    let busy = Math.max(0, stored - now)
    if (busy > reach) {
      busy = reach
      if (consume) this.#fullAt.set(spec.key, now + Math.ceil(busy))
    }
    const over = busy + spec.cost * step - window
    if (over > (consume && spec.mayWait ? spec.maxWaitUs : 0)) {
      if (lockout !== undefined && consume) return this.#denied(spec, lockout, count + 1, since, now, over)
      return extReply(-Math.ceil(over), 0, spec)
    }
    if (consume) {
      busy = Math.ceil(busy + spec.cost * 1e6 / spec.refillPerSecond)
      this.#fullAt.set(spec.key, now + busy)
    }
    return extReply(busy, over > 0 ? Math.ceil(over) : 0, spec)
  }

  /** A lockout entry of a bucket, or undefined once expired. */
  #lock (key: string, now: number): Lock | undefined {
    const entry = this.#locks.get(key)
    if (entry === undefined || entry.expiry > now) return entry
    this.#locks.delete(key)
    return undefined
  }

  /** The denial of a block still in force (read as at most forMs away: a step back); undefined once it has ended. */
  #blocked (spec: ExtSpec, lockout: NonNullable<ExtSpec['lockout']>, until: number, now: number, consume: boolean): ExtReply | undefined {
    let left = until - now
    if (left <= 0) return undefined
    const most = lockout.forMs * 1000
    if (left > most) {
      left = most
      if (consume) this.#locks.set(spec.key, { until: now + most, expiry: now + (Math.ceil(most / 1000) + 1) * 1000 })
    }
    return extReply(-Math.ceil(left), 1, spec)
  }

  /** A denial counted against a lockout, in the period that started at `since`: the block starts at the `after`-th. */
  #denied (spec: ExtSpec, lockout: NonNullable<ExtSpec['lockout']>, count: number, since: number, now: number, over: number): ExtReply {
    if (count >= lockout.after) {
      const most = lockout.forMs * 1000
      this.#locks.set(spec.key, { until: now + most, expiry: now + (Math.ceil(most / 1000) + 1) * 1000 })
      return extReply(-most, 1, spec)
    }
    this.#locks.set(spec.key, { count, since, expiry: now + (Math.ceil((since + lockout.withinMs * 1000 - now) / 1000) + 1) * 1000 })
    return extReply(-Math.ceil(over), 0, spec)
  }

  async reset (key: string): Promise<void> {
    this.#fullAt.delete(key)
    this.#epochs.delete(key)
    this.#locks.delete(key)
  }

  clear (): void {
    this.#fullAt.clear()
    this.#epochs.clear()
    this.#locks.clear()
  }
}
