// Why a bounded pool, and why a monotonic clock.
//
// A consume that may wait (a policy's `maxWaitMs`) has already spent its
// tokens in the store when it learns its delay (lua/token-bucket-ext.lua
// reserves them): the process then holds the caller for that long. Each
// held caller is a timer and a promise, so their number is capped per
// process: a call that finds the pool full is decided without waiting
// (allowed only when the tokens are there now). A slot is taken before
// the store call, so a reservation is only ever made by a caller that can
// wait for it; a call that turns out to need no wait gives it back at once.
//
// The delay is the store's, measured on Redis's clock when the script ran;
// holding the caller for that long from the moment the reply arrives
// releases it no earlier than the tokens are there (the reply's trip only
// adds to the wait). It is measured on a monotonic clock, never on
// Date.now(), which an NTP step could move; and a timer that fires before
// the clock says the time has passed (timers are not promised to be
// exact) is armed again for the rest.
//
// Waiters are released in the order of their due times, whatever order
// their timers fire in: a timer armed while the loop's cached time was
// stale fires early and is armed again, and on a busy loop a later
// waiter's timer can fire first. So the waiter whose timer finds it due
// releases every waiter due no later than itself, earliest first.
//
// close() ends every wait at once: the caller is told it was denied (its
// reserved tokens stay spent: the store cannot take a reservation back
// without letting others overtake), and no new wait starts.
//
// A wait for a concurrency slot (lib/core/concurrency.ts) is not for a known
// delay but until a slot is likely free: it may be woken before it is due,
// when this process gives back a slot of the key it waits for.

import type { Time, TimerHandle } from './clock.js'

interface Waiter {
  until: number
  handle: TimerHandle
  resolve: (leftMs: number) => void
}

export class Waiters {
  readonly #max: number
  readonly #time: Pick<Time, 'now' | 'set' | 'clear'>
  readonly #waiting = new Set<Waiter>()
  #taken = 0
  #closed = false

  /** `time`: the limiter's (lib/core/clock.ts), or a test's. */
  constructor (max: number, time: Pick<Time, 'now' | 'set' | 'clear'>) {
    this.#max = max
    this.#time = time
  }

  /** Slots taken: calls that may wait, in the store or waiting. */
  get size (): number {
    return this.#taken
  }

  /** Takes a slot for a call that may wait; false when the pool is full or closed. */
  take (): boolean {
    if (this.#closed || this.#taken >= this.#max) return false
    this.#taken++
    return true
  }

  /** Gives back a slot whose call needs no wait. */
  release (): void {
    this.#taken--
  }

  /** Whether close() was called: a wait that resolves early was ended by it, unless woken. */
  get closed (): boolean {
    return this.#closed
  }

  /**
   * Holds the caller of a taken slot for `delayMs` on the monotonic clock,
   * then frees the slot. Resolves with 0, or with the ms that were left
   * when close() ended the wait, or when it was woken: `woken`, if given, is
   * handed (at once) the function that ends this wait now.
   */
  wait (delayMs: number, woken?: (wake: () => void) => void): Promise<number> {
    if (this.#closed) {
      this.#taken--
      return Promise.resolve(delayMs)
    }
    return new Promise((resolve) => {
      const waiter: Waiter = { until: this.#time.now() + delayMs, handle: undefined, resolve }
      this.#waiting.add(waiter)
      this.#arm(waiter)
      woken?.(() => { this.#end(waiter) })
    })
  }

  /** Ends every wait (each resolves with the ms it had left) and refuses new ones. */
  close (): void {
    this.#closed = true
    for (const waiter of this.#waiting) this.#end(waiter)
  }

  /** Ends a wait before it is due (a wait that ended already stays ended). */
  #end (waiter: Waiter): void {
    if (!this.#waiting.has(waiter)) return
    this.#time.clear(waiter.handle)
    this.#done(waiter, Math.max(0, waiter.until - this.#time.now()))
  }

  #arm (waiter: Waiter): void {
    const left = waiter.until - this.#time.now()
    if (left > 0) {
      waiter.handle = this.#time.set(() => { this.#arm(waiter) }, Math.ceil(left))
      return
    }
    const due: Waiter[] = []
    for (const other of this.#waiting) if (other.until <= waiter.until) due.push(other)
    due.sort((a, b) => a.until - b.until)
    for (const each of due) {
      if (each !== waiter) this.#time.clear(each.handle)
      this.#done(each, 0)
    }
  }

  #done (waiter: Waiter, leftMs: number): void {
    this.#waiting.delete(waiter)
    this.#taken--
    waiter.resolve(leftMs)
  }
}
