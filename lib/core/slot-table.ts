// In-process concurrency slots: what lua/concurrency.lua keeps in Redis,
// for a limiter without `redis` and for the `local` failure mode (an
// in-process semaphore per client and bucket). Leases end on the limiter's
// monotonic clock (lib/core/clock.ts), so a step of the wall clock changes
// none; a held slot is renewed by its holder as in Redis.
//
// Size: a key holds at most its policy's `max` slots, each of a request in
// flight (or of one whose holder never released it, until its lease ends).
// Past `maxKeys` keys, a new key is first made room for by dropping the
// ended leases of every key (once per call at the cap, bounded by the
// table's size); a table full of live slots still takes the key: each is a
// request in flight in this process, which the app's own concurrency bounds.

import type { Clock } from './clock.js'

export class SlotTable {
  readonly #keys = new Map<string, Map<string, number>>()
  readonly #maxKeys: number
  readonly #now: Clock

  constructor (maxKeys: number, now: Clock) {
    this.#maxKeys = maxKeys
    this.#now = now
  }

  /** The live slots of `key` (ended leases dropped). */
  taken (key: string): number {
    const slots = this.#keys.get(key)
    if (slots === undefined) return 0
    const now = this.#now()
    for (const [id, ends] of slots) if (ends <= now) slots.delete(id)
    if (slots.size === 0) this.#keys.delete(key)
    return slots.size
  }

  add (key: string, id: string, leaseMs: number): void {
    let slots = this.#keys.get(key)
    if (slots === undefined) {
      if (this.#keys.size >= this.#maxKeys) this.#sweep()
      slots = new Map()
      this.#keys.set(key, slots)
    }
    slots.set(id, this.#now() + leaseMs)
  }

  /** Scores live slots again at now + lease; an ended or released one stays gone. */
  renew (key: string, ids: Iterable<string>, leaseMs: number): void {
    const slots = this.#keys.get(key)
    if (slots === undefined) return
    const now = this.#now()
    for (const id of ids) {
      const ends = slots.get(id)
      if (ends !== undefined && ends > now) slots.set(id, now + leaseMs)
    }
  }

  remove (key: string, ids: Iterable<string>): void {
    const slots = this.#keys.get(key)
    if (slots === undefined) return
    for (const id of ids) slots.delete(id)
    if (slots.size === 0) this.#keys.delete(key)
  }

  get size (): number {
    return this.#keys.size
  }

  clear (): void {
    this.#keys.clear()
  }

  #sweep (): void {
    for (const key of [...this.#keys.keys()]) this.taken(key)
  }
}
