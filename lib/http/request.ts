// One request's check, whatever the framework.
//
// An adapter (lib/adapters/*) keeps only what its framework needs: where
// the check runs, how a route is named, how headers are written and how a
// 429 is sent. The rest is here, so every adapter decides alike and answers
// byte for byte alike (the instance around it, its identity and start-up,
// is lib/http/kit.ts; the middleware adapters' request path,
// lib/http/middleware.ts):
//
//   compile  compileRoute (lib/http/route.ts), once per route;
//   decide   RequestLayer.decide: allow -> client key -> the client's plan
//            (`limit`, lib/http/tiers.ts) -> costs -> one store decision, a
//            reserve on a route that settles, an acquisition of slots on a
//            route with concurrency policies (undefined when `allow` or
//            the plan let the request through);
//   end      RequestLayer.ended, once per request from the adapter's end
//            signal: releases what the request holds (lib/http/holds.ts;
//            a reservation to settle, lib/http/settle-route.ts), which the
//            adapter listens for only when `holding` says the request does;
//   answer   answer(): the headers, written through the adapter's sink, and
//            the denial (429, or 503 when a closed limit cannot reach Redis)
//            as data; denialBody() is its body (JSON, or RFC 9457 problem
//            details with `problemDetails`) and denialType() its type;
//   close    RequestLayer.close, at the instance's shutdown: from then on
//            every answer says `Connection: close` (closeConnection), since
//            Node's server.close() waits for the keep-alive connections
//            that were busy when it was called until they go idle for the
//            server's keepAliveTimeout or their client drops them.
//
// The functions of the app (`key`, `cost`, `allow`) get the framework's own
// request object; a synchronous result is used as it is, so the common
// synchronous `key` costs no promise.

import { preview, thrownPreview } from '../core/errors.js'
import { lastHeader, retrySeconds, setHeaders, type HeaderSink } from './headers.js'
import { ipIdentity } from '../core/keys.js'
import type { Core } from '../core/limiter.js'
import { checkCost, costBound } from '../core/policy.js'
import { shownDecision } from './answer.js'
import type { RequestFn, RouteLimit } from './route.js'
import { ended, hold, holding, type End } from './holds.js'
import { reserveFor } from './settle-route.js'
import type { Decision } from '../core/types.js'

/** The client identity of requests without an address (as on a Unix socket). */
export const NO_ADDRESS = 'no-address'

/** What an adapter tells the request layer about its framework. */
export interface RequestSide<Req> {
  /** The client's address as the framework resolves it (its proxy trust applied); undefined or '' without one. */
  ip(request: Req): string | undefined
  /** Called before a request is keyed by its address (the adapter's proxy warning). */
  onAddress?: ((request: Req) => void) | undefined
  /** Called once, for the first request without an address: it is keyed as NO_ADDRESS. */
  noAddress(): void
  /** The error of a route's `settle` that threw or returned a bad value, for its log line (the request has ended). */
  badInput(route: string, detail: string): Error
  /**
   * Logs why a `key`, `cost`, `allow` or `limit` function failed (`message`,
   * bounded), once, at error level, and returns the error the request fails
   * with: the 500 of BAD_INPUT, which says nothing of it.
   */
  refuse(request: Req, message: string): Error
  /** Logs a hold that failed at the request's end, as a route's bad `settle` (no answer can carry it). */
  settleFailed(request: Req, err: unknown): void
}

/** The bodies' fields of a denial; `message` has `%s` for the seconds. */
export const RATE_LIMITED = { statusCode: 429, code: 'TOLLGATE_RATE_LIMITED', error: 'Too Many Requests', message: 'Rate limit exceeded, retry in %s second(s)' } as const
/**
 * The 500 of a `key`, `cost`, `allow` or `limit` function that threw or
 * returned a bad value. It names nothing of the failure: the value came
 * from the request or the app (`key: (req) => req.user` returns the user
 * record), so only the log line says what it was (previewed, bounded).
 */
export const BAD_INPUT = { statusCode: 500, code: 'TOLLGATE_BAD_INPUT', error: 'Internal Server Error', message: 'Rate limit check failed; the server log says why' } as const
export const UNAVAILABLE = { statusCode: 503, code: 'TOLLGATE_UNAVAILABLE', error: 'Service Unavailable', message: 'Rate limiter unavailable, retry in %s second(s)' } as const

/** A request the limiter refuses: the answer, as data. */
export interface Denial {
  statusCode: 429 | 503
  code: 'TOLLGATE_RATE_LIMITED' | 'TOLLGATE_UNAVAILABLE'
  /** The status text. */
  error: string
  message: string
  /** Seconds, as sent in Retry-After. */
  retryAfter: number
  /**
   * Only with the route's `problemDetails`, which answers with RFC 9457
   * problem details: the buckets that denied (shadow ones never), the
   * problem's `violated-policies`. Absent otherwise, so the denial is the
   * same data as without the option.
   */
  violated?: readonly string[]
}

/** The problem types of the rate-limit headers draft, per status (`problemDetails`). */
const PROBLEM_TYPES = {
  429: { type: 'https://iana.org/assignments/http-problem-types#quota-exceeded', title: 'Rate limit exceeded' },
  503: { type: 'https://iana.org/assignments/http-problem-types#temporary-reduced-capacity', title: 'Rate limiter unavailable' }
} as const
const JSON_TYPE = 'application/json; charset=utf-8'
const PROBLEM_TYPE = 'application/problem+json; charset=utf-8'

/** A request's decision, and the limit it was made under (the client's plan, on a route with `limit`). */
export interface Decided<Req> {
  limit: RouteLimit<Req>
  decision: Decision
  /** The client's partition key, on a route with `partitionKey` (draft-11's `pk`). */
  partition?: Buffer | undefined
}

/** Decides requests: identity, plan, costs, one store decision. */
export class RequestLayer<Req extends object> {
  readonly #core: Core
  readonly #subnet: number
  readonly #side: RequestSide<Req>
  #warned = false
  #closing = false

  constructor (core: Core, subnet: number, side: RequestSide<Req>) {
    this.#core = core
    this.#subnet = subnet
    this.#side = side
  }

  /** The decision for one request of the route; undefined when `allow` or the client's plan let it through. */
  async decide (limit: RouteLimit<Req>, request: Req): Promise<Decided<Req> | undefined> {
    if (limit.allow !== undefined) {
      let skip = run(limit, 'allow', limit.allow, request, this.#side)
      if (skip instanceof Promise) skip = await skip
      if (skip === true) return undefined
    }
    let client: string
    if (limit.key === undefined) {
      client = this.#address(request)
    } else {
      let value = run(limit, 'key', limit.key, request, this.#side)
      if (value instanceof Promise) value = await value
      if (typeof value !== 'string' || value.length === 0) {
        throw refuse(limit, request, this.#side, `\`key\` must return a non-empty string, got ${preview(value)}`, value === undefined)
      }
      client = value
    }
    if (limit.tiers !== undefined) {
      const chosen = await limit.tiers.resolve(limit, request, (detail, hinted) => refuse(limit, request, this.#side, detail, hinted))
      if (chosen === null) return undefined
      limit = chosen
    }
    let costs: number[] | undefined
    for (let i = 0; i < limit.costFns.length; i++) {
      const fn = limit.costFns[i]
      const policy = limit.policies[i]
      // One policy per cost function: `policy` is always there.
      if (fn === undefined || policy === undefined) continue
      let value: unknown = run(limit, 'cost', fn, request, this.#side)
      if (value instanceof Promise) value = await value
      const got = value
      const refused = (bound: string): Error => refuse(limit, request, this.#side, `\`cost\` must return a finite number > 0 and <= ${bound}, got ${preview(got)}`, got === undefined)
      if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) throw refused(costBound(policy))
      checkCost(value, policy, refused)
      costs ??= limit.policies.map((p) => p.cost ?? 1)
      costs[i] = value
    }
    let decision: Decision
    if (limit.slots) {
      // Concurrency slots (SPEC 13), held until the request ends however it ends (lib/http/holds.ts).
      const acquired = await this.#core.acquire(client, limit.policies, costs)
      decision = acquired.decision
      if (decision.allowed) hold(request, acquired.release)
    } else {
      decision = limit.settle === undefined
        ? await this.#core.decide(client, limit.policies, costs, true)
        : await reserveFor(this.#core, request, client, limit.policies, costs, limit.settle, limit.name, this.#side.badInput)
    }
    return limit.partitionKey ? { limit, decision, partition: this.#core.partition(client) } : { limit, decision }
  }

  /** Whether the instance shuts down (close): its answers say `Connection: close`. */
  get closing (): boolean {
    return this.#closing
  }

  /** The instance shuts down: every answer from now on says `Connection: close` (see the top of this file). */
  close (): void {
    this.#closing = true
  }

  /** Writes `Connection: close` on an answer through `set` once the instance shuts down. */
  closeConnection<T> (target: T, set: HeaderSink<T>): void {
    if (this.#closing) set(target, 'connection', 'close')
  }

  /** Whether the request holds anything to release at its end: only then does the adapter listen for it. */
  holding (request: Req): boolean {
    return holding(request)
  }

  /** The request has ended (the adapter's one call for it): releases what it holds, once; never rejects. */
  async ended (request: Req, end: End): Promise<void> {
    await ended(request, end, (err) => { this.#side.settleFailed(request, err) })
  }

  #address (request: Req): string {
    this.#side.onAddress?.(request)
    const ip = this.#side.ip(request)
    if (ip !== undefined && ip !== '') return ipIdentity(ip, this.#subnet)
    if (!this.#warned) {
      this.#warned = true
      this.#side.noAddress()
    }
    return NO_ADDRESS
  }
}

/**
 * Runs a function of the app; its failure is logged and becomes the
 * adapter's 500 (refuse). A synchronous result is returned as it is.
 */
function run<Req, T> (limit: RouteLimit<Req>, what: string, fn: RequestFn<Req, T>, request: Req, side: RequestSide<Req>): T | Promise<T> {
  let out: T | Promise<T>
  try {
    out = fn(request)
  } catch (cause) {
    throw threw(limit, request, side, what, cause)
  }
  if (out instanceof Promise) return out.catch((cause: unknown) => { throw threw(limit, request, side, what, cause) })
  return out
}

function threw<Req> (limit: RouteLimit<Req>, request: Req, side: RequestSide<Req>, what: string, cause: unknown): Error {
  return refuse(limit, request, side, `\`${what}\` threw ${thrownPreview(cause)}`, true)
}

/**
 * The log line of a function of the app that failed, and the request's 500.
 * `hinted`: it threw or returned nothing, the usual sign of a check that
 * runs before what it reads is there (the body, an authenticated user), so
 * the line says where the check runs and what to change (the route's
 * `placement`). The cause is in the line once, previewed: no error object
 * (whose message and stack would repeat it) is logged with it.
 */
function refuse<Req> (limit: RouteLimit<Req>, request: Req, side: RequestSide<Req>, detail: string, hinted: boolean): Error {
  return side.refuse(request, `tollgate: rate limit of ${limit.name}: ${detail}${hinted ? `; ${limit.placement}` : ''}`)
}

/**
 * Writes a decision's headers on `target` through `set`, and returns the
 * denial, or undefined when the request passes. A limit that failed open
 * sends no headers (never a made-up quota); one that failed closed sends
 * only Retry-After with its 503.
 */
export function answer<Req, T> ({ limit, decision, partition }: Decided<Req>, target: T, set: HeaderSink<T>): Denial | undefined {
  if (decision.source === 'fail-open') return undefined
  if (decision.source === 'fail-closed') {
    const seconds = retrySeconds(decision.retryAfterMs)
    set(target, 'retry-after', seconds)
    return denial(UNAVAILABLE, seconds, limit, decision)
  }
  setHeaders(target, set, limit.headers, shownDecision(decision, limit.policies), limit.policyHeaders, partition)
  return decision.allowed ? undefined : denial(RATE_LIMITED, retrySeconds(decision.retryAfterMs), limit, decision)
}

/**
 * The enforced buckets a denial names: with several policies, those whose
 * own decision denied (a fail-closed outage denies them all); a shadow
 * policy never, as the headers never show one.
 */
function violated<Req> (decision: Decision, limit: RouteLimit<Req>): string[] {
  const each = decision.policies
  return limit.policies.filter((p, i) => p.shadow !== true && (decision.source === 'fail-closed' || each === undefined || each[i]?.allowed === false)).map((p) => p.bucket)
}

/** The last header answer() wrote for a decision that passed: a response that carries it got them all; undefined when none was written. */
export function lastShown<Req> ({ limit, decision }: Decided<Req>): string | undefined {
  return decision.source === 'fail-open' ? undefined : lastHeader(limit.headers)
}

function denial<Req> (kind: typeof RATE_LIMITED | typeof UNAVAILABLE, seconds: number, limit: RouteLimit<Req>, decision: Decision): Denial {
  const d: Denial = { statusCode: kind.statusCode, code: kind.code, error: kind.error, message: kind.message.replace('%s', String(seconds)), retryAfter: seconds }
  if (limit.problemDetails) d.violated = violated(decision, limit)
  return d
}

/**
 * The body of a denial: the JSON Fastify's default error handler writes,
 * or with `problemDetails` the RFC 9457 problem of the draft's type.
 */
export function denialBody (d: Denial): string {
  if (d.violated === undefined) return JSON.stringify({ statusCode: d.statusCode, code: d.code, error: d.error, message: d.message })
  const { type, title } = PROBLEM_TYPES[d.statusCode]
  return JSON.stringify({ type, title, status: d.statusCode, detail: d.message, 'violated-policies': d.violated })
}

/** The content type of denialBody's body. */
export function denialType (d: Denial): string {
  return d.violated === undefined ? JSON_TYPE : PROBLEM_TYPE
}
