// A route that settles: its check reserves the request's cost (the same
// decision, headers and 429 as any route), keeps the reservation on the
// request as a hold (lib/http/holds.ts), and once the request has ended,
// the route's `settle` function gives the actual cost from the request and
// the reply, and the difference is refunded or charged (lib/core/settle.ts).
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
import { hold } from './holds.js'

/** The actual cost of a request, from the request and its response (0: free). */
export type SettleFunction<Q, P> = (request: Q, reply: P) => number | Promise<number>

/** An allowed reservation a request holds until its response is sent. */
interface Pending {
  reservation: Reservation
  settle: SettleFunction<never, never>
  name: string
}

/** Registration check: a leased policy cannot settle (a settlement cannot reach this server's batch). */
export function checkSettle (settle: unknown, policies: readonly Policy[], where: string): void {
  // A lease is refused first by the table's order (lib/core/policy-fields.ts),
  // and only a single-policy route holds one (a list refuses it before this).
  if (settle !== undefined) for (const policy of policies) unsettled(policy, where)
}

/**
 * Reserves instead of consuming, and attaches an allowed reservation to
 * the request as a hold (lib/http/holds.ts): settled when the request
 * ends, whether its response was sent or its client left (the response
 * `settle` reads is then what was made of it, and it settles at once:
 * it never finishes). `badInput` makes the error of a bad `settle`, which
 * the hold throws for the adapter's log.
 */
export async function reserveFor<Q extends object> (core: Core, request: Q, client: string, policies: readonly Policy[],
  costs: readonly number[] | undefined, settle: SettleFunction<Q, never>, name: string, badInput: (route: string, detail: string) => Error): Promise<Decision> {
  const reservation = await core.reserve(client, policies, costs)
  if (reservation.decision.allowed) {
    const pending: Pending = { reservation, settle, name }
    hold(request, async (end) => { await settleResponse(core.limiter, pending, request, end.response, badInput) })
  }
  return reservation.decision
}

/** At the request's end: settles a reservation with the route's `settle`; throws the error of a bad `settle`. */
async function settleResponse<Q> (limiter: Limiter, pending: Pending, request: Q, reply: unknown, badInput: (route: string, detail: string) => Error): Promise<void> {
  let actual: unknown
  try {
    // The one cast: the request is the one `settle` was declared for; its reply is the adapter's.
    actual = await (pending.settle as SettleFunction<Q, unknown>)(request, reply)
  } catch (cause) {
    // The cause previewed in the message, never attached: a log line would repeat it (lib/core/errors.ts).
    throw badInput(pending.name, `\`settle\` threw ${thrownPreview(cause)}`)
  }
  if (typeof actual !== 'number' || !Number.isFinite(actual) || actual < 0) {
    throw badInput(pending.name, `\`settle\` must return a finite number >= 0, got ${preview(actual)}`)
  }
  // A store failure is logged and counted by the limiter.
  await limiter.settle(pending.reservation, actual).catch(() => {})
}
