// A route that settles: its check reserves the request's cost (the same
// decision, headers and 429 as any route), keeps the reservation on the
// request, and once the response has been sent, the route's `settle`
// function gives the actual cost from the request and the reply, and the
// difference is refunded or charged (lib/core/settle.ts).
//
// Why after the response: the outcome (the status, the size of the body,
// the tokens an LLM generated) is known only then, and the client is not
// kept waiting for the settlement. Nothing of it can become an error
// response: the response is already sent. A `settle` that throws or
// returns a bad value is logged as an error (code TOLLGATE_BAD_INPUT, a
// bug of the app) and the reservation stands; a store that fails is
// logged by the limiter and counted in `failedSettlements`.

import { preview, thrownPreview } from '../core/errors.js'
import type { Core } from '../core/limiter.js'
import { unsettled } from '../core/policy.js'
import type { Decision, Limiter, Policy } from '../core/types.js'
import type { Reservation } from '../core/settle.js'

const kReservation = Symbol('tollgate.reservation')

/** The actual cost of a request, from the request and its response (0: free). */
export type SettleFunction<Q, P> = (request: Q, reply: P) => number | Promise<number>

/** An allowed reservation a request holds until its response is sent. */
export interface Pending {
  reservation: Reservation
  settle: SettleFunction<never, never>
  name: string
}

/**
 * A request as it carries its reservation: any object, with the optional
 * slot of this module's symbol, which nothing else reads or writes (every
 * object is a Carrier, no cast needed). `settle` is kept with its types
 * erased and read back by the adapter that stored it, with the same Q and P.
 */
type Carrier = object & { [kReservation]?: Pending | undefined }

/** What a settlement needs of the adapter: its error for a bad `settle`, and where to log it. */
export interface SettleSide<Q> {
  badInput(route: string, detail: string): Error
  settleFailed(request: Q, err: Error): void
}

/** The request property that holds a reservation, for the framework to declare. */
export const RESERVATION = kReservation

/** Registration check: a leased policy cannot settle (a settlement cannot reach this server's batch). */
export function checkSettle (settle: unknown, policies: readonly Policy[], where: string): void {
  // A lease is refused first by the table's order (lib/core/policy-fields.ts),
  // and only a single-policy route holds one (a list refuses it before this).
  if (settle !== undefined) for (const policy of policies) unsettled(policy, where)
}

/** Reserves instead of consuming, and keeps an allowed reservation on the request for `takeReservation`. */
export async function reserveFor<Q extends object> (core: Core, request: Q, client: string, policies: readonly Policy[],
  costs: readonly number[] | undefined, settle: SettleFunction<Q, never>, name: string): Promise<Decision> {
  const reservation = await core.reserve(client, policies, costs)
  const carrier: Carrier = request
  if (reservation.decision.allowed) carrier[kReservation] = { reservation, settle, name }
  return reservation.decision
}

/** The reservation the request holds, taken off it (so it is settled once); most requests hold none. */
export function takeReservation (request: object): Pending | undefined {
  const carrier: Carrier = request
  const pending = carrier[kReservation]
  if (pending !== undefined) carrier[kReservation] = undefined
  return pending
}

/** After the response: settles a reservation with the route's `settle`; never throws. */
export async function settleResponse<Q, P> (limiter: Limiter, pending: Pending, request: Q, reply: P, side: SettleSide<Q>): Promise<void> {
  let actual: unknown
  try {
    // The one cast: the adapter that stored `settle` reads it back with its own Q and P.
    actual = await (pending.settle as SettleFunction<Q, P>)(request, reply)
  } catch (cause) {
    // The cause previewed in the message, never attached: a log line would repeat it (lib/core/errors.ts).
    side.settleFailed(request, side.badInput(pending.name, `\`settle\` threw ${thrownPreview(cause)}`))
    return
  }
  if (typeof actual !== 'number' || !Number.isFinite(actual) || actual < 0) {
    side.settleFailed(request, side.badInput(pending.name, `\`settle\` must return a finite number >= 0, got ${preview(actual)}`))
    return
  }
  // A store failure is logged and counted by the limiter.
  await limiter.settle(pending.reservation, actual).catch(() => {})
}
