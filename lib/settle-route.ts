// A route that settles: its check reserves the request's cost (the same
// decision, headers and 429 as any route), keeps the reservation on the
// request, and once the response has been sent, the route's `settle`
// function gives the actual cost from the request and the reply, and the
// difference is refunded or charged (lib/settle.ts).
//
// Why after the response: the outcome (the status, the size of the body,
// the tokens an LLM generated) is known only then, and the client is not
// kept waiting for the settlement. Nothing of it can become an error
// response: the response is already sent. A `settle` that throws or
// returns a bad value is logged as an error (code TOLLGATE_BAD_INPUT, a
// bug of the app) and the reservation stands; a store that fails is
// logged by the limiter and counted in `failedSettlements`.

import { BadRequestInputError, describe, optionError } from './errors.js'
import { kReserve, type CoreLimiter } from './limiter.js'
import type { Decision, Policy } from './types.js'
import type { Reservation } from './settle.js'

const kReservation = Symbol('tollgate.reservation')

/** The actual cost of a request, from the request and its reply (0: free). */
export type SettleFunction<Q, P> = (request: Q, reply: P) => number | Promise<number>

interface Pending {
  reservation: Reservation
  settle: SettleFunction<never, never>
  name: string
}

type Carrier = object & { [kReservation]?: Pending | undefined }

interface ErrorLog {
  error(obj: object, msg: string): void
}

/** The request property that holds a reservation, for the framework to declare. */
export const RESERVATION = kReservation

/** Registration check: a leased policy cannot settle (a settlement cannot reach this server's batch). */
export function checkSettle (settle: unknown, policies: readonly Policy[], where: string): void {
  if (settle === undefined) return
  const leased = policies.find((p) => p.lease !== undefined)
  if (leased !== undefined) {
    throw optionError(`${where}lease`, leased.lease, 'unset on a route that settles: leased tokens are spent from this server\'s batch, and a settlement could neither refund into it nor charge past it')
  }
}

/** Reserves instead of consuming, and keeps an allowed reservation on the request for `settleResponse`. */
export async function reserveFor<Q extends object> (limiter: CoreLimiter, request: Q, client: string, policies: readonly Policy[],
  costs: readonly number[] | undefined, settle: SettleFunction<Q, never>, name: string): Promise<Decision> {
  const reservation = await limiter[kReserve](client, policies, costs)
  if (reservation.decision.allowed) (request as Carrier)[kReservation] = { reservation, settle: settle as SettleFunction<never, never>, name }
  return reservation.decision
}

/**
 * The `onResponse` hook: settles the request's reservation, if it holds
 * one. Requests without one (most) cost a property read, no promise.
 */
export function settleHook<Q extends object & { log: ErrorLog }, P> (limiter: CoreLimiter) {
  return function tollgateSettle (request: Q, reply: P, done: () => void): void {
    if ((request as Carrier)[kReservation] === undefined) return done()
    settleResponse(limiter, request, reply, request.log).then(done, done)
  }
}

/** After the response: settles the request's reservation, if it holds one; never throws. */
export async function settleResponse<Q extends object, P> (limiter: CoreLimiter, request: Q, reply: P, log: ErrorLog): Promise<void> {
  const pending = (request as Carrier)[kReservation]
  if (pending === undefined) return
  ;(request as Carrier)[kReservation] = undefined
  let actual: unknown
  try {
    actual = await (pending.settle as SettleFunction<Q, P>)(request, reply)
  } catch (cause) {
    const err = new BadRequestInputError(pending.name, `\`settle\` threw: ${(cause as Error)?.message ?? describe(cause)}`)
    err.cause = cause
    log.error({ err }, 'tollgate: settle failed; the reservation stands')
    return
  }
  if (typeof actual !== 'number' || !Number.isFinite(actual) || actual < 0) {
    const err = new BadRequestInputError(pending.name, `\`settle\` must return a finite number >= 0, got ${describe(actual)}`)
    log.error({ err }, 'tollgate: settle failed; the reservation stands')
    return
  }
  // A store failure is logged and counted by the limiter.
  await limiter.settle(pending.reservation, actual).catch(() => {})
}
