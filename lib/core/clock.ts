// Time enters the core through one value, a Time: every clock reading and
// every timer of a limiter goes through the one its createCore was given.
// Durations (deadlines, breaker periods, waits, cache ages, the outage
// summary's period) are read from its monotonic clock, so a step of the app
// server's wall clock changes none of them; the in-process store's bucket
// times are microseconds on that same monotonic clock, anchored at the
// epoch. Tests pass a fake Time (test/unit/helpers/fake-time.ts) and move
// it by hand: a deadline, a wait or a summary then fires when the test
// says, not after a real sleep.

/** A pending timer, as `Time.set` returned it. */
export type TimerHandle = unknown

export interface Time {
  /** Monotonic milliseconds (fractional), as performance.now(). */
  now(): number
  /** Microseconds on the monotonic clock anchored at the epoch (whole). */
  micros(): number
  /**
   * Calls `fn` once after `ms`. `keepAlive` (default true): the timer keeps
   * the process alive meanwhile, as a wait a caller awaits must (a script
   * awaiting a consume that waits must not end with an empty event loop);
   * false for the limiter's own housekeeping (deadlines, the outage
   * summary), which never holds a process open.
   */
  set(fn: () => void, ms: number, keepAlive?: boolean): TimerHandle
  /** Cancels a timer `set` returned; a fired or cleared one (or undefined) is ignored. */
  clear(handle: TimerHandle): void
}

/** A reading of a Time's monotonic clock, for what only measures durations. */
export type Clock = Time['now']

/** The process's own clock and timers. */
export const realTime: Time = {
  now: () => performance.now(),
  micros: () => Math.floor((performance.timeOrigin + performance.now()) * 1000),
  set: (fn, ms, keepAlive = true) => {
    const timer = setTimeout(fn, ms)
    if (!keepAlive) timer.unref()
    return timer
  },
  // `handle` is what `set` above returned, a Node timer: Time types it
  // unknown so that a test's Time may use handles of its own.
  clear: (handle) => { clearTimeout(handle as ReturnType<typeof setTimeout>) }
}
