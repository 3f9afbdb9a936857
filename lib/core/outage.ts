// What an operator hears while the store fails (docs/guides/failure-modes.md).
//
// A limiter whose store fails is not limiting, or limits only by its
// failure modes: it must keep saying so, but never with a line per
// request. So an outage is told in three kinds of line:
//
//   failing    once, when the store turns from healthy to failing, with the
//              error and the store's address; at error level when the store
//              cannot run the scripts at all (scripting renamed, refused by
//              ACL, or a server without its Lua engine) or refuses a
//              command inside them (an ACL without TIME, a read-only
//              replica), which no reconnect repairs: that line names the
//              refused commands and the fix;
//   summary    while it keeps failing, at most one line per `summaryMs`:
//              the decisions made without the store since the last line,
//              by failure mode, and the latest error; a period without
//              such decisions logs nothing (nothing went unlimited);
//   recovered  once, when it answers again, with the outage's length and
//              the decisions each failure mode made during it.
//
// The period's timer and the clock are the limiter's Time (lib/core/clock.ts;
// tests drive a fake one by hand); the timer is not kept alive, so an outage
// never keeps a process alive. Each period arms the next one when it ends.

import { commandRefused, refusalFix, scriptsRefused, type StoreError } from '../store/errors.js'
import { messageOf } from './errors.js'
import type { Time, TimerHandle } from './clock.js'
import type { FallbackCounts, Logger } from './types.js'

type Source = keyof FallbackCounts

/** The default period of the summary line, ms. */
export const DEFAULT_SUMMARY_MS = 30_000

function zero (): FallbackCounts {
  return { local: 0, 'fail-open': 0, 'fail-closed': 0 }
}

function total (counts: FallbackCounts): number {
  return counts.local + counts['fail-open'] + counts['fail-closed']
}

export interface OutageOptions {
  logger: Logger | undefined
  /** The clock of the outage's lengths and the summary's timer (the guard's). */
  time: Time
  /** Period of the summary line, ms (default DEFAULT_SUMMARY_MS). */
  summaryMs?: number | undefined
  /** The store's address, for the failing and summary lines (never a password). */
  target?: string | undefined
}

/** The log of the store's outages: see the top of this file. */
export class OutageLog {
  readonly #logger: Logger | undefined
  readonly #time: Time
  readonly #summaryMs: number
  readonly #target: Record<string, string>
  /** Clock time at which the store started failing; undefined while healthy. */
  #since: number | undefined
  #outage = zero()
  #period = zero()
  #periodFrom = 0
  #lastError: StoreError | undefined
  /** Whether this outage has told that the scripts cannot run. */
  #noScripts = false
  #timer: TimerHandle | undefined

  constructor (options: OutageOptions) {
    this.#logger = options.logger
    this.#time = options.time
    this.#summaryMs = options.summaryMs ?? DEFAULT_SUMMARY_MS
    this.#target = options.target === undefined ? {} : { redis: options.target }
  }

  get failing (): boolean {
    return this.#since !== undefined
  }

  /**
   * A store failure. Returns true when it turned the store from healthy
   * to failing. `message` replaces the failing line's own text.
   */
  failed (err: StoreError, message?: string): boolean {
    this.#lastError = err
    const noScripts = scriptsRefused(err.cause) || commandRefused(err.cause)
    if (this.#since !== undefined) {
      // Failing already (say, not connected yet), and now it is clear the
      // scripts cannot run: that is worth its own line, once.
      if (noScripts && !this.#noScripts) this.#tellNoScripts(err)
      return false
    }
    this.#since = this.#time.now()
    this.#periodFrom = this.#since
    if (noScripts) this.#tellNoScripts(err)
    else this.#logger?.warn({ err, ...this.#target }, message ?? 'rate limit store failing; limits follow their failure modes')
    this.#every(this.#since)
    return true
  }

  /** Counts a decision made without the store while it fails. */
  fellBack (source: Source): void {
    if (this.#since === undefined) return
    this.#outage[source]++
    this.#period[source]++
  }

  /** The store answered: logs the recovery; returns the outage, or undefined when there was none. */
  recovered (): { downMs: number, decisions: FallbackCounts } | undefined {
    if (this.#since === undefined) return undefined
    const downMs = this.#time.now() - this.#since
    const decisions = this.#outage
    this.#stop()
    this.#logger?.info({ downMs, decisions }, 'rate limit store recovered')
    return { downMs, decisions }
  }

  /** Stops the summary timer (the limiter is closed). */
  close (): void {
    this.#time.clear(this.#timer)
    this.#timer = undefined
  }

  /** Arms the summary of the period that starts now, and of each next one, while the outage that began at `since` lasts. */
  #every (since: number): void {
    this.#timer = this.#time.set(() => {
      this.#summarize(since)
      this.#every(since)
    }, this.#summaryMs, false)
  }

  #stop (): void {
    this.close()
    this.#since = undefined
    this.#outage = zero()
    this.#period = zero()
    this.#lastError = undefined
    this.#noScripts = false
  }

  /** `err` is one whose cause scriptsRefused or commandRefused: Redis's reply, an Error. */
  #tellNoScripts (err: StoreError): void {
    this.#noScripts = true
    const said = messageOf(err.cause)
    if (scriptsRefused(err.cause)) {
      this.#logger?.error({ err, ...this.#target },
        `rate limit store cannot run tollgate's scripts (${said}): scripting is renamed, refused to this user by an ACL, or the server has no Lua engine; limits follow their failure modes until it can`)
      return
    }
    const refused = err.refused ?? []
    const which = refused.length === 0 ? '' : `${refused.join(', ')} refused; `
    this.#logger?.error({ err, ...this.#target, refused },
      `rate limit store refuses commands inside tollgate's scripts (${which}${said}): ${refusalFix(said, refused)}; limits follow their failure modes until it can`)
  }

  /** `since`: when the store started failing (the timer runs only until it recovers). */
  #summarize (since: number): void {
    const now = this.#time.now()
    const decisions = this.#period
    const periodMs = now - this.#periodFrom
    this.#period = zero()
    this.#periodFrom = now
    const count = total(decisions)
    if (count === 0) return
    const line = { err: this.#lastError, ...this.#target, downMs: now - since, periodMs, decisions }
    const message = `rate limit store still failing: ${count} decision(s) made without it in the last ${Math.round(periodMs / 1000)} s; limits follow their failure modes`
    if (this.#noScripts) this.#logger?.error(line, message)
    else this.#logger?.warn(line, message)
  }
}
