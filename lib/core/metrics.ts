// OpenTelemetry metrics of one limiter, recorded where its decisions and
// store calls happen rather than by subscribing to the diagnostics channels:
// a process may run several limiters (one per Fastify app), each with its
// own breaker, and a channel message does not say which limiter sent it.
//
// tollgate never imports @opentelemetry/api. The user's Meter comes in
// through the `metrics` option, typed by the members used (MetricsMeter),
// so nothing is loaded or recorded unless that option is set; without it
// the limiter holds no Metrics and the hot path pays one `undefined` check
// per decision and per store call (measured in docs/reference/metrics.md).
//
// Attributes are bounded: bucket names come from routes and policies, never
// from client keys. A decision of several policies is counted once, under
// the bucket that decided it (Decision.bucket).
//
// The breaker's state is an up-down counter of breakers per state, not a
// gauge: each limiter adds its 1 to its current state, so several limiters
// on one Meter add up instead of overwriting each other's observation. The
// store's state (healthy or failing, as `limiter.state` says) is counted
// the same way.

import type { BreakerState, CallOutcome, GuardObserver } from './guard.js'
import type { Decision, MetricsMeter } from './types.js'

type Counter = ReturnType<MetricsMeter['createCounter']>
type Histogram = ReturnType<MetricsMeter['createHistogram']>

const BREAKER_STATES: readonly BreakerState[] = ['closed', 'open', 'half-open']
type StoreState = 'healthy' | 'failing'
const STORE_STATES: readonly StoreState[] = ['healthy', 'failing']

/**
 * Bucket boundaries of the store call histogram, ms: fine around the
 * default 10 ms deadline, up to the longest deadline allowed (60 s).
 */
export const DURATION_BOUNDARIES_MS = [0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10_000, 60_000]

export class Metrics implements GuardObserver {
  readonly #decisions: Counter
  readonly #fallbacks: Counter
  readonly #duration: Histogram
  readonly #breakers: Counter
  readonly #transitions: Counter
  readonly #stores: Counter
  /** This limiter's breaker state; undefined without a breaker (no Redis) or once closed. */
  #state: BreakerState | undefined
  /** This limiter's store state; undefined as #state is. */
  #storeState: StoreState | undefined

  /** `breaker`: whether the limiter has a circuit breaker (it has one with `redis`). */
  constructor (meter: MetricsMeter, breaker: boolean) {
    this.#decisions = meter.createCounter('tollgate.decisions',
      about('Rate-limit decisions, by bucket, outcome (allowed, denied) and source', '{decision}'))
    this.#fallbacks = meter.createCounter('tollgate.fallbacks',
      about('Decisions made without the store while it failed, by bucket and source (local, fail-open, fail-closed)', '{decision}'))
    this.#duration = meter.createHistogram('tollgate.store.duration', {
      ...about('Store calls, from send to reply, deadline or error, by outcome (ok, timeout, error)', 'ms'),
      advice: { explicitBucketBoundaries: DURATION_BOUNDARIES_MS }
    })
    this.#breakers = meter.createUpDownCounter('tollgate.breaker.state',
      about('Circuit breakers in each state (closed, open, half-open), one per limiter with a store', '{breaker}'))
    this.#transitions = meter.createCounter('tollgate.breaker.transitions', about('Circuit breaker changes, by the state entered', '{transition}'))
    this.#stores = meter.createUpDownCounter('tollgate.store.state',
      about('Limiters whose store is in each state (healthy, failing), one per limiter with a store', '{limiter}'))
    if (breaker) {
      this.#state = enter(this.#breakers, BREAKER_STATES, 'closed')
      this.#storeState = enter(this.#stores, STORE_STATES, 'healthy')
    }
  }

  /**
   * Counts one decision. `shadow`: the decision of a limit in shadow mode,
   * whose denials are reported but not enforced; it is counted with the
   * attribute `shadow: true`, so that a would-be denial is
   * `{ outcome: 'denied', shadow: true }`.
   */
  decided (decision: Decision, shadow = false): void {
    const { bucket, source } = decision
    const attributes: Record<string, string | boolean> = { bucket, outcome: decision.allowed ? 'allowed' : 'denied', source }
    if (shadow) attributes.shadow = true
    this.#decisions.add(1, attributes)
    if (source === 'local' || source === 'fail-open' || source === 'fail-closed') this.#fallbacks.add(1, { bucket, source })
  }

  call (ms: number, outcome: CallOutcome): void {
    this.#duration.record(ms, { outcome })
  }

  breaker (state: BreakerState): void {
    if (this.#state === undefined) return
    move(this.#breakers, this.#state, state)
    this.#state = state
    this.#transitions.add(1, { state })
  }

  store (state: StoreState): void {
    if (this.#storeState === undefined) return
    move(this.#stores, this.#storeState, state)
    this.#storeState = state
  }

  /** The limiter is closed: its breaker and its store leave the counts. */
  close (): void {
    // Both are set together, and cleared together here.
    if (this.#state === undefined || this.#storeState === undefined) return
    this.#breakers.add(-1, { state: this.#state })
    this.#state = undefined
    this.#stores.add(-1, { state: this.#storeState })
    this.#storeState = undefined
  }
}

/** An instrument's description and unit, as every instrument here states them. */
function about (description: string, unit: string): { description: string, unit: string } {
  return { description, unit }
}

/**
 * This limiter enters an up-down counter of states in `current`: 1 there,
 * and 0 added to every other state so that each is reported from the start.
 */
function enter<S extends string> (counter: Counter, states: readonly S[], current: S): S {
  for (const state of states) counter.add(state === current ? 1 : 0, { state })
  return current
}

/** This limiter's 1 moves from state `from` to state `to` of an up-down counter of states. */
function move (counter: Counter, from: string, to: string): void {
  counter.add(-1, { state: from })
  counter.add(1, { state: to })
}
