import diagnostics from 'node:diagnostics_channel'
import { Deadlines } from './deadline.js'
import { StoreError } from './errors.js'
import type { BucketSpec, Store, StoreReply } from './store.js'
import type { BreakerOptions, DecisionSource, Logger } from './types.js'

/** Published on every change between healthy and failing. */
export const stateChannel = diagnostics.channel('tollgate:store')
/** Published when the breaker opens, lets a probe through, or closes. */
export const breakerChannel = diagnostics.channel('tollgate:breaker')

type FallbackSource = Extract<DecisionSource, 'local' | 'fail-open' | 'fail-closed'>

/**
 * Puts a deadline and a circuit breaker around a store.
 *
 * - Every call gets `timeoutMs`; a reply after that is ignored (its promise
 *   settles into nothing).
 * - After `failures` consecutive failures the breaker opens: for
 *   `cooldownMs` no call reaches the store and callers fall back at once.
 *   Then one probe goes through; its success closes the breaker, its
 *   failure opens it for another cool-down.
 * - Logs once when the store turns from healthy to failing, and once on
 *   recovery with the number of fallback decisions made meanwhile.
 *
 * A WRONGTYPE reply (a foreign key under our prefix) fails that one call,
 * logged with its keys, but shows the store alive: it counts as a success
 * for the breaker.
 */
export class Guard {
  readonly #store: Store
  readonly #breaker: BreakerOptions
  readonly #logger: Logger | undefined
  readonly #deadlines = new Deadlines()
  #failures = 0
  #openUntil = 0
  #probing = false
  #failingSince = 0
  #fallbacks: Record<FallbackSource, number> = { local: 0, 'fail-open': 0, 'fail-closed': 0 }

  constructor (store: Store, breaker: BreakerOptions, logger: Logger | undefined) {
    this.#store = store
    this.#breaker = breaker
    this.#logger = logger
  }

  get state (): 'healthy' | 'failing' {
    return this.#failingSince === 0 ? 'healthy' : 'failing'
  }

  /** Milliseconds until the breaker lets a probe through; 0 when closed. */
  get cooldownLeftMs (): number {
    return Math.max(0, this.#openUntil - Date.now())
  }

  /** One bucket decision through the guard. */
  call (specs: readonly BucketSpec[], consume: boolean, timeoutMs: number): Promise<StoreReply> {
    return this.run(() => this.#store.decide(specs, consume), timeoutMs, specs)
  }

  /** Any store call through the deadline and the breaker; rejects with a StoreError. */
  async run<T> (call: () => Promise<T>, timeoutMs: number, specs: readonly BucketSpec[]): Promise<T> {
    let probe = false
    if (this.#openUntil !== 0) {
      if (Date.now() < this.#openUntil || this.#probing) {
        throw new StoreError('TOLLGATE_BREAKER_OPEN', 'store skipped while the circuit breaker is open')
      }
      this.#probing = probe = true
      if (breakerChannel.hasSubscribers) breakerChannel.publish({ state: 'half-open' })
    }
    let reply: T
    try {
      reply = await this.#deadlines.wrap(call(), timeoutMs)
    } catch (cause) {
      const err = asStoreError(cause)
      if (/WRONGTYPE/.test(err.message)) {
        this.#succeeded()
        this.#logger?.error({ err, keys: specs.map((s) => s.key) }, 'rate limit key holds a value of the wrong type')
      } else {
        this.#failed(err, probe)
      }
      throw err
    }
    this.#succeeded()
    return reply
  }

  /** Deletes a key in the store, under the same deadline; failures reject. */
  async reset (key: string, timeoutMs: number): Promise<void> {
    try {
      await this.#deadlines.wrap(this.#store.reset(key), timeoutMs)
    } catch (cause) {
      throw asStoreError(cause)
    }
  }

  /** Counts a decision made without the store during an outage, for the recovery log line. */
  fellBack (source: FallbackSource): void {
    if (this.#failingSince !== 0) this.#fallbacks[source]++
  }

  #failed (err: StoreError, probe: boolean): void {
    this.#failures++
    if (probe) this.#probing = false
    if (this.#failingSince === 0) {
      this.#failingSince = Date.now()
      this.#logger?.warn({ err }, 'rate limit store failing; limits follow their failure modes')
      if (stateChannel.hasSubscribers) stateChannel.publish({ state: 'failing', error: err })
    }
    // Opens on the threshold, or again when its probe fails; calls that were
    // already in flight and fail while it is open change nothing.
    if (probe || (this.#openUntil === 0 && this.#failures >= this.#breaker.failures)) {
      this.#openUntil = Date.now() + this.#breaker.cooldownMs
      if (breakerChannel.hasSubscribers) breakerChannel.publish({ state: 'open', cooldownMs: this.#breaker.cooldownMs })
      this.#store.recover?.()
    }
  }

  #succeeded (): void {
    this.#failures = 0
    if (this.#openUntil !== 0) {
      this.#openUntil = 0
      this.#probing = false
      if (breakerChannel.hasSubscribers) breakerChannel.publish({ state: 'closed' })
    }
    if (this.#failingSince !== 0) {
      const downMs = Date.now() - this.#failingSince
      const decisions = this.#fallbacks
      this.#failingSince = 0
      this.#fallbacks = { local: 0, 'fail-open': 0, 'fail-closed': 0 }
      this.#logger?.info({ downMs, decisions }, 'rate limit store recovered')
      if (stateChannel.hasSubscribers) stateChannel.publish({ state: 'healthy', downMs, decisions })
    }
  }
}

function asStoreError (cause: unknown): StoreError {
  return cause instanceof StoreError
    ? cause
    : new StoreError('TOLLGATE_STORE_ERROR', `store call failed: ${(cause as Error).message}`, { cause })
}
