// A Time (lib/core/clock.ts) that moves only when a test moves it: timers
// fire in the order of their due times, each at its own time, during
// advance(). Nothing here reads the process's clock.

import type { Time, TimerHandle } from '../../../lib/core/clock.js'

interface Timer {
  at: number
  seq: number
  fn: () => void
}

/** The monotonic origin's epoch, as performance.timeOrigin would give it (ms). */
const EPOCH_MS = Date.UTC(2026, 0, 1)

export class FakeTime implements Time {
  #now = 0
  #seq = 0
  readonly #timers = new Set<Timer>()

  now (): number {
    return this.#now
  }

  micros (): number {
    return Math.floor((EPOCH_MS + this.#now) * 1000)
  }

  set (fn: () => void, ms: number): TimerHandle {
    const timer = { at: this.#now + Math.max(0, ms), seq: this.#seq++, fn }
    this.#timers.add(timer)
    return timer
  }

  clear (handle: TimerHandle): void {
    this.#timers.delete(handle as Timer)
  }

  /** Timers not fired yet. */
  get pending (): number {
    return this.#timers.size
  }

  /**
   * Moves time forward by `ms`, firing each timer due on the way at its own
   * time, and lets the promises it settles run before the next one fires.
   */
  async advance (ms: number): Promise<void> {
    const end = this.#now + ms
    for (;;) {
      let next: Timer | undefined
      for (const timer of this.#timers) {
        if (timer.at <= end && (next === undefined || timer.at < next.at || (timer.at === next.at && timer.seq < next.seq))) next = timer
      }
      if (next === undefined) break
      this.#timers.delete(next)
      this.#now = Math.max(this.#now, next.at)
      next.fn()
      await settled()
    }
    this.#now = end
    await settled()
  }
}

/** Lets every promise callback queued so far (and those they queue) run. */
export async function settled (): Promise<void> {
  for (let i = 0; i < 10; i++) await new Promise<void>((resolve) => { setImmediate(resolve) })
}
