import diagnostics from 'node:diagnostics_channel'
import { realTime, type Time } from './clock.js'
import { Deadlines, type Deadline } from './deadline.js'
import { StoreError, messageOf } from './errors.js'
import { OutageLog } from './outage.js'
import { commandRefused, reshardRefused, scriptsRefused, stillConnecting } from '../store/errors.js'
import type { BucketSpec, Store, StoreReply } from '../store/store.js'
import type { BreakerOptions, DecisionSource, Logger } from './types.js'

/** Published on every change between healthy and failing. */
export const stateChannel = diagnostics.channel('tollgate:store')
/** Published when the breaker opens, lets a probe through, or closes. */
export const breakerChannel = diagnostics.channel('tollgate:breaker')

type FallbackSource = Extract<DecisionSource, 'local' | 'fail-open' | 'fail-closed'>

/** A breaker state, as 'tollgate:breaker' and the metrics name it. */
export type BreakerState = 'closed' | 'open' | 'half-open'

/** Sends one call: `sent` when it leaves, then exactly one of `done` and `failed`, once. */
type Send<T> = (sent: () => void, done: (value: T) => void, failed: (cause: unknown) => void) => void

/** How a store call settled: a reply, the deadline, or a rejection. */
export type CallOutcome = 'ok' | 'timeout' | 'error'

/**
 * Optional hooks for a Guard's owner (lib/core/metrics.ts). Absent, the guard
 * computes nothing for them: each call site is an optional call, whose
 * arguments are not evaluated when there is no observer.
 */
export interface GuardObserver {
  /** A store call settled, `ms` after it was sent (on the guard's monotonic clock). */
  call (ms: number, outcome: CallOutcome): void
  /** The breaker turned to `state`. */
  breaker (state: BreakerState): void
  /** The store turned failing, or healthy again. */
  store (state: 'healthy' | 'failing'): void
}

/** How a guard reports outages (lib/core/outage.ts). */
export interface GuardReport {
  /** Period of the summary line while the store fails, ms. */
  summaryMs?: number | undefined
  /** The store's address, for the log lines. */
  target?: string | undefined
}

/**
 * Reply errors that say the server cannot serve us now (loading its data,
 * stuck in a script, without a master, read-only, out of memory or disk,
 * a cluster without its slots, refusing our user): the store is failing.
 * Any other reply error (WRONGTYPE from a foreign key, a script error from
 * an argument it rejects) comes from a Redis that works.
 */
const UNUSABLE = /^(?:LOADING|BUSY|MASTERDOWN|CLUSTERDOWN|READONLY|MISCONF|OOM|TRYAGAIN|NOREPLICAS|NOAUTH|NOPERM)\b/

/**
 * True for an error Redis itself replied with, from a server that can serve
 * us: proof the store is alive. A server that cannot run the scripts, or
 * refuses a command inside them (lib/store/errors.ts scriptsRefused,
 * commandRefused), answers, but can decide nothing: it is not.
 */
export function provesAlive (cause: unknown): boolean {
  return cause instanceof Error && cause.name === 'ReplyError' && !UNUSABLE.test(cause.message) && !scriptsRefused(cause) && !commandRefused(cause)
}

/**
 * Puts a deadline and a circuit breaker around a store.
 *
 * - Every call gets `timeoutMs` (lib/core/deadline.ts: a deadline counts Redis's
 *   lateness, not the app's own event-loop lag); a reply after that is
 *   ignored.
 * - After `failures` consecutive failures the breaker opens: for
 *   `cooldownMs` no call reaches the store and callers fall back at once.
 *   Then one probe goes through; its success closes the breaker, its
 *   failure opens it for another cool-down.
 * - Logs once when the store turns from healthy to failing, a summary at
 *   most once per period while it keeps failing, and once on recovery with
 *   the number of fallback decisions made meanwhile (lib/core/outage.ts).
 * - Durations and deadlines come from `time` (lib/core/clock.ts), monotonic:
 *   a step of the wall clock neither prolongs nor cuts a cool-down.
 * - An optional `observer` hears how long each store call took, from send
 *   to settle, and every breaker change (the limiter's metrics).
 *
 * A reply error from a Redis that can serve us (WRONGTYPE from a foreign
 * key under our prefix, a script error; see UNUSABLE for the exceptions)
 * fails that one call, logged with its keys, but shows the store alive: it
 * counts as a success for the breaker.
 */
export class Guard {
  readonly #store: Store
  readonly #breaker: BreakerOptions
  readonly #logger: Logger | undefined
  readonly #outage: OutageLog
  readonly #time: Time
  readonly #deadlines: Deadlines
  readonly #observer: GuardObserver | undefined
  #failures = 0
  /** Clock time at which the open breaker lets a probe through; undefined while closed. */
  #openUntil: number | undefined
  #probing = false
  /** While set, no call reaches the store: each fails with it at once (see hold). */
  #held: StoreError | undefined

  constructor (store: Store, breaker: BreakerOptions, logger: Logger | undefined, time: Time = realTime, observer?: GuardObserver, report: GuardReport = {}) {
    this.#store = store
    this.#breaker = breaker
    this.#logger = logger
    this.#time = time
    this.#observer = observer
    this.#deadlines = new Deadlines(time)
    this.#outage = new OutageLog({ logger, time, ...report })
  }

  get state (): 'healthy' | 'failing' {
    return this.#outage.failing ? 'failing' : 'healthy'
  }

  /** Milliseconds until the breaker lets a probe through; 0 when closed. */
  get cooldownLeftMs (): number {
    return this.#openUntil === undefined ? 0 : Math.max(0, this.#openUntil - this.#time.now())
  }

  /**
   * One bucket decision through the guard, in one promise: it resolves
   * with `ok(reply, sentAt)` when the store answers in time (`sentAt`: the
   * clock when the call was sent), else with `fail()`: the store failed,
   * missed the deadline, or was skipped by the open breaker. Never rejects.
   */
  decide<R> (specs: readonly BucketSpec[], consume: boolean, timeoutMs: number, ok: (reply: StoreReply, sentAt: number) => R, fail: () => R): Promise<R> {
    if (this.#held !== undefined) return Promise.resolve(fail())
    const probe = this.#admit()
    if (probe === undefined) return Promise.resolve(fail())
    return new Promise<R>((resolve) => {
      this.#watch(sender(this.#store, specs, consume), timeoutMs, specs, probe,
        (reply, sentAt) => { resolve(ok(reply, sentAt)) },
        () => { resolve(fail()) })
    })
  }

  /**
   * Any store call through the deadline and the breaker; rejects with a
   * StoreError. `secretRead`: the key secret's read (lib/core/key-secret.ts),
   * sent while held too (see hold); its success shows Redis answers, not that
   * it runs the decisions' scripts, so it neither closes the breaker nor ends
   * an outage (its failure counts as any call's).
   */
  run<T> (call: () => Promise<T>, timeoutMs: number, specs: readonly BucketSpec[], secretRead = false): Promise<T> {
    if (this.#held !== undefined && !secretRead) return Promise.reject(this.#held)
    const probe = this.#admit()
    if (probe === undefined) return Promise.reject(new StoreError('TOLLGATE_BREAKER_OPEN', 'store skipped while the circuit breaker is open'))
    return new Promise<T>((resolve, reject) => {
      this.#watch((sent, done, failed) => {
        sent()
        call().then(done, failed)
      }, timeoutMs, specs, probe, resolve, reject, !secretRead)
    })
  }

  /** Deletes a key in the store, under the same deadline; failures reject. */
  async reset (key: string, timeoutMs: number): Promise<void> {
    if (this.#held !== undefined) throw this.#held
    try {
      await this.#deadlines.wrap(this.#store.reset(key), timeoutMs)
    } catch (cause) {
      throw asStoreError(cause)
    }
  }

  /** Counts a decision made without the store during an outage, for the summary and recovery lines. */
  fellBack (source: FallbackSource): void {
    this.#outage.fellBack(source)
  }

  /**
   * The store is known to be failing without a call having failed (at
   * start-up: not connected after the wait, or unable to run the scripts).
   * Turns failing, logging `message` instead of the usual line; counts
   * nothing towards the breaker.
   */
  down (err: StoreError, message?: string): void {
    this.#turnFailing(err, message)
  }

  /**
   * Holds every call (`err`), or lets them through again (undefined): while
   * the keys cannot be named as the fleet names them (lib/core/key-secret.ts),
   * a call would spend from a bucket no other server sees. Held calls fail
   * at once, as the open breaker's do, counting nothing towards it; a call
   * of `run` with `evenHeld` (the read that ends the hold) is sent.
   */
  hold (err: StoreError | undefined): void {
    this.#held = err
  }

  /** Stops the outage summary's timer. */
  close (): void {
    this.#outage.close()
  }

  /** Whether a call may reach the store: undefined while the breaker skips it, else whether it is the probe. */
  #admit (): boolean | undefined {
    if (this.#openUntil === undefined) return false
    if (this.#probing || this.#time.now() < this.#openUntil) return undefined
    this.#probing = true
    if (breakerChannel.hasSubscribers) breakerChannel.publish({ state: 'half-open' })
    this.#observer?.breaker('half-open')
    return true
  }

  /**
   * Sends a call under a deadline; exactly one of `done` and `failed` runs,
   * once. The deadline starts when the call is sent: when `send` calls
   * `sent` (a store that batches sends a decision queued behind a call in
   * flight later: that wait is the app's time, not Redis's). A call that
   * settles before it was sent (it failed without sending) settles at once;
   * so does one that throws.
   */
  #watch<T> (send: Send<T>, timeoutMs: number, specs: readonly BucketSpec[], probe: boolean,
    done: (value: T, sentAt: number) => void, failed: (err: StoreError) => void, proves = true): void {
    let deadline: Deadline | undefined
    const start = (): Deadline => {
      if (deadline !== undefined) return deadline
      const started = this.#deadlines.start(timeoutMs, (err) => {
        this.#observer?.call(this.#time.now() - started.startedAt, 'timeout')
        this.#failed(err, probe)
        failed(err)
      })
      deadline = started
      return started
    }
    const settled = (value: T): void => {
      const started = start()
      if (!this.#deadlines.settle(started)) return
      this.#observer?.call(this.#time.now() - started.startedAt, 'ok')
      if (proves) this.#succeeded()
      else if (probe) this.#probing = false
      done(value, started.startedAt)
    }
    const refused = (cause: unknown): void => {
      const started = start()
      if (!this.#deadlines.settle(started)) return
      this.#observer?.call(this.#time.now() - started.startedAt, 'error')
      failed(this.#refused(cause, probe, specs))
    }
    try {
      send(start, settled, refused)
    } catch (cause) {
      refused(cause)
    }
  }

  /**
   * A rejected call: fails only itself when Redis answered it (see provesAlive;
   * a resharding's refusal, see reshardRefused, without a log line: it is
   * routine), else counts as a store failure, unless the client is still
   * making its first connection (see stillConnecting; a probe's failure
   * opens the breaker again all the same).
   */
  #refused (cause: unknown, probe: boolean, specs: readonly BucketSpec[]): StoreError {
    const err = asStoreError(cause)
    if (reshardRefused(cause)) {
      this.#succeeded()
    } else if (provesAlive(cause)) {
      this.#succeeded()
      const message = /^WRONGTYPE/.test(messageOf(cause)) ? 'rate limit key holds a value of the wrong type' : 'rate limit store refused the call'
      this.#logger?.error({ err, keys: specs.map((s) => s.key) }, message)
    } else if (stillConnecting(cause) && !probe) {
      this.#turnFailing(err, undefined)
    } else {
      this.#failed(err, probe)
    }
    return err
  }

  #failed (err: StoreError, probe: boolean): void {
    this.#failures++
    if (probe) this.#probing = false
    this.#turnFailing(err, undefined)
    // Opens on the threshold, or again when its probe fails; calls that were
    // already in flight and fail while it is open change nothing.
    if (probe || (this.#openUntil === undefined && this.#failures >= this.#breaker.failures)) {
      this.#openUntil = this.#time.now() + this.#breaker.cooldownMs
      if (breakerChannel.hasSubscribers) breakerChannel.publish({ state: 'open', cooldownMs: this.#breaker.cooldownMs })
      this.#observer?.breaker('open')
      this.#store.recover?.()
    }
  }

  #succeeded (): void {
    this.#failures = 0
    if (this.#openUntil !== undefined) {
      this.#openUntil = undefined
      this.#probing = false
      if (breakerChannel.hasSubscribers) breakerChannel.publish({ state: 'closed' })
      this.#observer?.breaker('closed')
    }
    const outage = this.#outage.recovered()
    if (outage !== undefined) {
      this.#observer?.store('healthy')
      if (stateChannel.hasSubscribers) stateChannel.publish({ state: 'healthy', ...outage })
    }
  }

  #turnFailing (err: StoreError, message: string | undefined): void {
    if (!this.#outage.failed(err, message)) return
    this.#observer?.store('failing')
    if (stateChannel.hasSubscribers) stateChannel.publish({ state: 'failing', error: err })
  }
}

/** A decision's call to `store`: through its callbacks when it has them (decideWith), with no promise in between. */
function sender (store: Store, specs: readonly BucketSpec[], consume: boolean): Send<StoreReply> {
  const { decideWith } = store
  if (decideWith === undefined) return (sent, done, failed) => { store.decide(specs, consume, sent).then(done, failed) }
  return (sent, done, failed) => { decideWith.call(store, specs, consume, sent, done, failed) }
}

function asStoreError (cause: unknown): StoreError {
  return cause instanceof StoreError
    ? cause
    : new StoreError('TOLLGATE_STORE_ERROR', `store call failed: ${messageOf(cause)}`, { cause })
}
