// Waiting for a concurrency slot: a concurrency policy's `maxWaitMs`
// (SPEC 13: "with maxWaitMs it may wait for a slot instead").
//
// Why wake, and why poll. A slot frees when a request ends, which no one
// can foretell and Redis does not announce, so a denied acquisition is
// tried again when a slot is likely free. When this process gives back a
// slot of the key, the oldest waiter for that key is woken and tries at
// once: one waiter per slot given back, since waking them all would send
// every waiter to Redis for one slot. A slot given back by another server,
// or freed by a lease that ended, is found by polling: a waiter tries again
// every POLL_MS, so it takes such a slot at most that late, and costs at
// most four script calls a second while it waits.
//
// The waits are the limiter's bucket waits (lib/core/waiters.ts): the same
// bounded pool (`maxWaiters`: a call that finds it full is answered with
// its denial, without waiting), the same monotonic clock, and close() ends
// them all (each caller gets its last denial). A waiter holds a place in
// the pool while it sleeps, not during the acquisition it then tries.

import type { Time } from './clock.js'
import type { Acquired, Decision } from './types.js'
import type { Waiters } from './waiters.js'

/** How often a waiter tries again when no slot of its key is given back in this process, ms. */
export const POLL_MS = 250

/** Whether a denial may be waited out: the limit's own (a failure mode's 503 is not). */
function waitable (decision: Decision): boolean {
  return !decision.allowed && (decision.source === 'store' || decision.source === 'local')
}

export class SlotWaits {
  readonly #waiters: Waiters
  readonly #time: Pick<Time, 'now'>
  /** Per key, the wake-up of each waiter asleep on it, oldest first (bounded by the pool). */
  readonly #wakers = new Map<string, Set<() => void>>()

  constructor (waiters: Waiters, time: Pick<Time, 'now'>) {
    this.#waiters = waiters
    this.#time = time
  }

  /**
   * Tries `attempt` again, after `first` was denied, until it is allowed,
   * denied otherwise than by the limit, `maxWaitMs` has passed (a last try
   * at the end), or the limiter closes. An acquisition after a wait says
   * how long it waited (`waitedMs`).
   */
  async until (key: string, maxWaitMs: number, first: Acquired, attempt: () => Promise<Acquired>): Promise<Acquired> {
    if (!waitable(first.decision)) return first
    const started = this.#time.now()
    let last = first
    for (let left = maxWaitMs; left > 0 && this.#waiters.take(); left = started + maxWaitMs - this.#time.now()) {
      await this.#sleep(key, Math.min(POLL_MS, left))
      if (this.#waiters.closed) break
      last = await attempt()
      if (last.decision.allowed) return { ...last, decision: { ...last.decision, waitedMs: this.#time.now() - started } }
      if (!waitable(last.decision)) break
    }
    return last
  }

  /** A slot of `key` was given back in this process: its oldest waiter tries now. */
  freed (key: string): void {
    const wakers = this.#wakers.get(key)
    const [oldest] = wakers ?? []
    if (oldest === undefined) return
    // Taken off first: a second slot given back before it runs wakes the next.
    this.#forget(key, oldest)
    oldest()
  }

  async #sleep (key: string, ms: number): Promise<void> {
    let wakers = this.#wakers.get(key)
    if (wakers === undefined) {
      wakers = new Set()
      this.#wakers.set(key, wakers)
    }
    const own = wakers
    // Called at once: the wait starts after take() found the pool open.
    const mine: Array<() => void> = []
    await this.#waiters.wait(ms, (wake) => {
      mine.push(wake)
      own.add(wake)
    })
    for (const wake of mine) this.#forget(key, wake)
  }

  #forget (key: string, wake: () => void): void {
    const wakers = this.#wakers.get(key)
    wakers?.delete(wake)
    if (wakers?.size === 0) this.#wakers.delete(key)
  }
}
