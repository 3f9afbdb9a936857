// Charging by outcome: a request reserves its cost when it arrives and,
// once its outcome is known, settles the actual cost: the difference is
// refunded or charged in one atomic call (lua/settle.lua), so there is no
// window in which a count can be undone by a concurrent request.
//
// Why a handle: the reservation remembers where it was spent. A reserve
// decided by Redis settles in Redis; one decided by the in-process fallback
// (failureMode 'local', while Redis failed) settles in that same local
// bucket, under the local sizes; one that spent nothing (denied, failed
// open or closed, answered by the denial cache) settles nothing. A handle
// settles once. It also keeps what the reserve replied for each bucket (a
// ReserveMark): the store cuts a refund to what the reservation's part of
// the bucket still holds, so a reservation that outlived a refill does not
// give the refilled tokens back a second time (lua/settle.lua's header).
//
// Why a refund forgets cached denials: a denial is cached while spending
// by anyone can only delay the moment the bucket affords the cost; a
// refund breaks that, so once the store has applied it, the cached denials
// it can make wrong are dropped: every one that involves one of the
// reservation's buckets (DenialCache.refunded), and a denial whose
// call was sent before is not cached when its reply comes later. The
// other app servers are told too (`refunded`, lib/core/invalidation.ts), once
// the store has applied it. A charge keeps them: it only delays.
//
// Settlement calls go through the guard (deadline, breaker, no pile-up
// behind a dead store). One that fails is logged, counted, and rejected
// with the StoreError: the reservation then stands as it was charged.

import type { Clock } from './clock.js'
import { failOver, summarize, timeoutOf } from './decisions.js'
import type { DenialCache } from './denial-cache.js'
import { optionError } from './errors.js'
import type { Guard } from './guard.js'
import type { Remote } from './remote.js'
import type { MemoryStore } from '../store/memory-store.js'
import type { BucketSpec, ReserveMark } from '../store/store.js'
import type { Decision, Logger, Policy, Reservation } from './types.js'

export type { Reservation } from './types.js'

/** Where a reservation was spent: the shared store, the local fallback, or nowhere. */
type Spent = 'store' | 'local' | undefined

class Held implements Reservation {
  readonly decision: Decision
  readonly specs: readonly BucketSpec[]
  readonly spent: Spent
  readonly timeoutMs: number
  /** One per bucket where it was spent; empty when nothing was. */
  readonly marks: readonly ReserveMark[]
  settled = false

  constructor (decision: Decision, specs: readonly BucketSpec[], spent: Spent, timeoutMs: number, marks: readonly ReserveMark[]) {
    this.decision = decision
    this.specs = specs
    this.spent = spent
    this.timeoutMs = timeoutMs
    this.marks = marks
  }
}

export interface SettleDeps {
  /** The Redis store and what goes with it; undefined without `redis`. */
  remote: Remote | undefined
  /** The store without Redis. */
  memory: MemoryStore
  /** The in-process fallback of failureMode 'local'. */
  local: MemoryStore
  defaultTimeout: number
  logger: Logger | undefined
  /** A refund was applied in the store: tells the caches of every app server. */
  refunded?: (specs: readonly BucketSpec[]) => Promise<void>
  /** Monotonic ms, the limiter's. */
  clock: Clock
}

export interface Settlements {
  reserve (list: readonly Policy[], specs: readonly BucketSpec[]): Promise<Reservation>
  settle (reservation: Reservation, actual: number): Promise<void>
  /** Settlements the store failed (deadline, breaker, error) since start. */
  readonly failures: number
}

export function settlements (deps: SettleDeps): Settlements {
  const { remote, memory, local, defaultTimeout } = deps
  let failures = 0

  function reserve (list: readonly Policy[], specs: readonly BucketSpec[]): Promise<Reservation> {
    const timeoutMs = timeoutOf(list, defaultTimeout)
    if (remote === undefined) {
      const reply = memory.reserveSync(specs)
      return Promise.resolve(held(summarize(list, reply, 'store'), specs, 'store', timeoutMs, reply.marks))
    }
    const { guard, store, denials } = remote
    const id = specs.map((s) => s.key).join('\n')
    const cached = denials?.get(id, specs)
    if (cached !== undefined) return Promise.resolve(held(cached, specs, undefined, timeoutMs))
    const sentAt = deps.clock()
    return guard.run(() => store.reserve(specs), timeoutMs, specs).then((reply) => {
      const decision = summarize(list, reply, 'store')
      if (!decision.allowed) denials?.set(id, specs, decision, sentAt)
      return held(decision, specs, 'store', timeoutMs, reply.marks)
    }, () => fallback(guard, list, specs, timeoutMs))
  }

  /** The failure modes, as the limiter's consume applies them; 'local' reserves in the local store. */
  function fallback (guard: Guard, list: readonly Policy[], specs: readonly BucketSpec[], timeoutMs: number): Reservation {
    return failOver(guard, list, specs, (localList, localSpecs) => {
      const reply = local.reserveSync(localSpecs)
      return held(summarize(localList, reply, 'local'), localSpecs, 'local', timeoutMs, reply.marks)
    }, (decision) => held(decision, specs, undefined, timeoutMs))
  }

  function held (decision: Decision, specs: readonly BucketSpec[], spent: Spent, timeoutMs: number, marks: readonly ReserveMark[] = []): Held {
    return new Held(decision, specs, decision.allowed ? spent : undefined, timeoutMs, marks)
  }

  async function settle (reservation: Reservation, actual: number): Promise<void> {
    if (!(reservation instanceof Held)) throw optionError('reservation', reservation, 'a reservation returned by reserve()')
    if (reservation.settled) throw optionError('reservation', reservation.decision, 'a reservation not settled yet (each settles once)')
    if (typeof actual !== 'number' || !Number.isFinite(actual) || actual < 0) throw optionError('actual', actual, 'a finite number >= 0 (the actual cost)')
    reservation.settled = true
    const { specs, spent } = reservation
    if (spent === undefined) return
    const changes = specs.map((s) => (actual - s.cost) * 1e6 / s.refillPerSecond)
    if (changes.every((c) => c === 0)) return
    const { marks } = reservation
    if (spent === 'local') local.settleSync(specs, changes, marks)
    else if (remote === undefined) memory.settleSync(specs, changes, marks)
    else await settleInStore(remote, reservation, changes)
    const denials = remote?.denials
    if (denials !== undefined && changes.some((c) => c < 0)) await forgetDenials(denials, specs, spent)
  }

  /** Drops the cached denials a refund can make wrong (DenialCache.refunded); of a refund in the store, every server's. */
  async function forgetDenials (cache: DenialCache, specs: readonly BucketSpec[], spent: Spent): Promise<void> {
    cache.refunded(specs.map((s) => s.key), deps.clock())
    if (spent === 'store') await deps.refunded?.(specs)
  }

  async function settleInStore ({ guard, store }: Remote, reservation: Held, changes: readonly number[]): Promise<void> {
    const { specs, marks } = reservation
    try {
      await guard.run(() => store.settle(specs, changes, marks), reservation.timeoutMs, specs)
    } catch (err) {
      failures++
      deps.logger?.warn({ err, keys: specs.map((s) => s.key) }, 'rate limit settlement failed; the reservation stands as charged')
      throw err
    }
  }

  return {
    reserve,
    settle,
    get failures () {
      return failures
    }
  }
}
