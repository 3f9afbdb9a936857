// Time enters the core through one value. Durations (deadlines, breaker
// periods, waits, cache ages) are read from a monotonic clock, so a step of
// the app server's wall clock changes none of them; the in-process store's
// bucket times are microseconds on that same monotonic clock, anchored at
// the epoch. Tests pass a fake Time and move it by hand.

/** A pending timer, as `Time.set` returned it. */
export type TimerHandle = unknown

export interface Time {
  /** Monotonic milliseconds (fractional), as performance.now(). */
  now(): number
  /** Microseconds on the monotonic clock anchored at the epoch (whole). */
  micros(): number
  /**
   * Calls `fn` once after `ms`, keeping the process alive meanwhile: the
   * core's timers are waits a caller awaits (a script awaiting a consume
   * that waits must not end with an empty event loop).
   */
  set(fn: () => void, ms: number): TimerHandle
  /** Cancels a timer `set` returned; a fired or cleared one is ignored. */
  clear(handle: TimerHandle): void
}

/** The process's own clock and timers. */
export const realTime: Time = {
  now: () => performance.now(),
  micros: () => Math.floor((performance.timeOrigin + performance.now()) * 1000),
  set: (fn, ms) => setTimeout(fn, ms),
  // `handle` is what `set` above returned, a Node timer: Time types it
  // unknown so that a test's Time may use handles of its own.
  clear: (handle) => { clearTimeout(handle as ReturnType<typeof setTimeout>) }
}
