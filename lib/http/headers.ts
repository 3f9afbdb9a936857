// The rate-limit headers (docs/reference/headers.md), for any framework: they are written
// through a sink, `set(target, name, value)`, which each adapter gives (a
// Fastify reply's `header`, a Node response's `setHeader`). A sink that
// takes its target, rather than a closure over it, costs no allocation per
// request; `headerPairs` collects the same pairs into a list.

import { describe } from '../core/errors.js'
import { headersValueHint } from '../core/migrating.js'
import { hinted } from '../core/options.js'
import type { Decision } from '../core/types.js'

/** The header modes a route may set (`headers`); `false` sends none. */
export const HEADER_MODES = ['draft-6', 'draft-10', 'draft-11', 'legacy', false] as const

export type HeaderMode = (typeof HEADER_MODES)[number]

/** `headers`: one of the modes; express-rate-limit's values are told their equivalent. */
export function headerMode (value: unknown, name: string): HeaderMode {
  for (const mode of HEADER_MODES) if (mode === value) return mode
  throw hinted(name, value, `one of ${HEADER_MODES.map((v) => describe(v)).join(', ')}`, headersValueHint(value))
}

/** A header value as the adapters pass it on: numbers are whole, written in decimal. */
export type HeaderValue = string | number

/** Writes one header on `target`. Names are lower case. */
export type HeaderSink<T> = (target: T, name: string, value: HeaderValue) => void

/** What the headers need of one policy, fixed per route. */
export interface HeaderPolicy {
  capacity: number
  refillPerSecond: number
  bucket: string
  /** Set on a concurrency policy (its `max` is its capacity), as `max` is on its local semaphore. */
  concurrency?: object | undefined
  max?: number | undefined
}

/**
 * The largest header integer: RFC 9651 sf-integers have at most 15 digits.
 * Every number tollgate puts in a header is a whole number in 0..this, so
 * each value parses as an integer in every mode (a plain `String(n)` of a
 * capacity of 2.5, 1e-9 or 1e21 gives a decimal or an exponent). Capped
 * values describe a bucket or a wait of over 31 million years, so the cap
 * shows no client a quota it does not have.
 */
export const MAX_HEADER_INTEGER = 999_999_999_999_999

/** A whole, non-negative number within MAX_HEADER_INTEGER. */
function headerInteger (n: number): number {
  return Math.min(MAX_HEADER_INTEGER, Math.max(0, n))
}

/**
 * A capacity as a header shows it: whole tokens, rounded down, as
 * `remaining` is. A capacity below 1 shows 0: such a bucket never holds a
 * whole token (requests of a smaller cost still pass).
 */
function limitShown (capacity: number): number {
  return headerInteger(Math.floor(capacity))
}

/** Seconds until a retry may pass: at least 1. */
export function retrySeconds (retryAfterMs: number): number {
  return headerInteger(Math.max(1, Math.ceil(retryAfterMs / 1000)))
}

/** Seconds until the bucket is full again. */
function resetSeconds (resetMs: number): number {
  return headerInteger(Math.ceil(resetMs / 1000))
}

/** Whole tokens left, never more than the limit shown. */
function remainingShown (decision: Decision): number {
  return Math.min(headerInteger(decision.remaining), limitShown(decision.limit))
}

/** Window of a policy in seconds: the time an empty bucket takes to fill (at least 1). */
export function windowSeconds (policy: HeaderPolicy): number {
  return headerInteger(Math.max(1, Math.ceil(policy.capacity / policy.refillPerSecond)))
}

/** A string as an RFC 9651 sf-string: printable ASCII, with `"` and `\` escaped. */
export function sfString (text: string): string {
  return '"' + text.replace(/[^\x20-\x7e]/g, '?').replace(/["\\]/g, '\\$&') + '"'
}

/**
 * The RateLimit-Policy values of one route, computed once at start-up:
 * per bucket for draft-6 (which describes one policy), as one list for
 * draft-10; each for the store's policies and for the local fallback's.
 */
export class PolicyHeaders {
  readonly #single = new Map<string, string>()
  readonly #rates = new Map<string, number>()
  /** The draft-10 list, then draft-11's (which names a concurrency policy's unit). */
  readonly #list: readonly [string, string]
  readonly #localList: readonly [string, string]

  constructor (policies: readonly HeaderPolicy[], local: readonly HeaderPolicy[]) {
    for (const p of policies) this.#single.set(p.bucket, draft6Policy(p))
    for (const p of local) this.#single.set('\0' + p.bucket, draft6Policy(p))
    for (const p of policies) this.#rates.set(p.bucket, p.refillPerSecond)
    for (const p of local) this.#rates.set('\0' + p.bucket, p.refillPerSecond)
    this.#list = [draftList(policies, false), draftList(policies, true)]
    this.#localList = [draftList(local, false), draftList(local, true)]
  }

  single (decision: Decision): string | undefined {
    return this.#single.get(decision.source === 'local' ? '\0' + decision.bucket : decision.bucket)
  }

  /** Tokens per second of the decision's bucket (always found, as `single`'s policy is). */
  rate (decision: Decision): number {
    return this.#rates.get(decision.source === 'local' ? '\0' + decision.bucket : decision.bucket) ?? 0
  }

  list (decision: Decision, units = false): string {
    return (decision.source === 'local' ? this.#localList : this.#list)[units ? 1 : 0]
  }
}

function draft6Policy (p: HeaderPolicy): string {
  return `${limitShown(p.capacity)};w=${windowSeconds(p)}`
}

/**
 * A RateLimit-Policy list. A concurrency policy (SPEC 13) states its `max`
 * as its quota, with no window (it caps requests at once, not over time),
 * and in draft-11 the unit `concurrent-requests`.
 */
function draftList (policies: readonly HeaderPolicy[], units: boolean): string {
  return policies.map((p) => {
    const head = `${sfString(p.bucket)};q=${limitShown(p.capacity)}`
    if (p.concurrency === undefined && p.max === undefined) return `${head};w=${windowSeconds(p)}`
    return units ? `${head};qu="concurrent-requests"` : head
  }).join(', ')
}

/**
 * Sets the rate-limit headers of one decision on a reply. With several
 * policies, draft-6 and legacy describe the binding one (`decision` itself),
 * draft-10 lists every policy. Retry-After goes on every denial, whatever
 * the mode.
 */
export function setHeaders<T> (target: T, set: HeaderSink<T>, mode: HeaderMode, decision: Decision, policies: PolicyHeaders, partition?: Buffer): void {
  if (mode === 'draft-6') {
    set(target, 'ratelimit-limit', limitShown(decision.limit))
    set(target, 'ratelimit-remaining', remainingShown(decision))
    set(target, 'ratelimit-reset', resetSeconds(decision.resetMs))
    // A decision's bucket is one of the policies the headers were built from: always found.
    const policy = policies.single(decision)
    if (policy !== undefined) set(target, 'ratelimit-policy', policy)
  } else if (mode === 'draft-10') {
    set(target, 'ratelimit-policy', policies.list(decision))
    const all = decision.policies ?? [decision]
    let value = ''
    for (const d of all) {
      const t = d.retryAfterMs > 0 ? retrySeconds(d.retryAfterMs) : resetSeconds(d.resetMs)
      value += `${value === '' ? '' : ', '}${sfString(d.bucket)};r=${remainingShown(d)};t=${t}`
    }
    set(target, 'ratelimit', value)
  } else if (mode === 'draft-11') {
    set(target, 'ratelimit-policy', policies.list(decision, true))
    set(target, 'ratelimit', draft11Value(decision, policies, partition === undefined ? '' : `;pk=:${partition.toString('base64')}:`))
  } else if (mode === 'legacy') {
    set(target, 'x-ratelimit-limit', limitShown(decision.limit))
    set(target, 'x-ratelimit-remaining', remainingShown(decision))
    set(target, 'x-ratelimit-reset', resetSeconds(decision.resetMs))
  }
  if (!decision.allowed) set(target, 'retry-after', retrySeconds(decision.retryAfterMs))
}

/**
 * draft-11's RateLimit list: per policy, `r` the whole tokens available now
 * and `t` the effective window, the seconds the bucket takes to refill what
 * the client may spend at once: ceil(max(r, 1) / refill), at least 1. A full
 * bucket so states q within w, as the policy does; spending r at any pace
 * within t never meets a denial, since those tokens are in the bucket now.
 * On a denial t is the wait until the request's cost is available, the same
 * number as Retry-After, which so never points before the stated window ends.
 * `pk`, the parameter that ends each item: the client's partition key as an
 * sf-binary, or ''.
 */
function draft11Value (decision: Decision, policies: PolicyHeaders, pk: string): string {
  let value = ''
  for (const d of decision.policies ?? [decision]) {
    const r = remainingShown(d)
    const t = d.retryAfterMs > 0 ? retrySeconds(d.retryAfterMs) : effectiveWindow(r, policies.rate(d))
    value += `${value === '' ? '' : ', '}${sfString(d.bucket)};r=${r};t=${t}${pk}`
  }
  return value
}

/** Seconds a bucket refilling `rate` tokens a second takes to gain max(r, 1) tokens: at least 1. */
function effectiveWindow (r: number, rate: number): number {
  return headerInteger(Math.max(1, Math.ceil(Math.max(r, 1) / rate)))
}

/**
 * Per mode, the last header setHeaders writes for an allowed decision: a
 * response that carries it got them all (`false` writes none).
 */
const LAST_HEADER: Readonly<Record<string, string>> = { 'draft-6': 'ratelimit-policy', 'draft-10': 'ratelimit', 'draft-11': 'ratelimit', legacy: 'x-ratelimit-reset' }

/** The last header setHeaders writes in `mode` for an allowed decision; undefined when it writes none. */
export function lastHeader (mode: HeaderMode): string | undefined {
  return LAST_HEADER[String(mode)]
}

function collect (list: Array<[string, HeaderValue]>, name: string, value: HeaderValue): void {
  list.push([name, value])
}

/** The headers `setHeaders` writes, as [name, value] pairs in order. */
export function headerPairs (mode: HeaderMode, decision: Decision, policies: PolicyHeaders, partition?: Buffer): Array<[string, HeaderValue]> {
  const list: Array<[string, HeaderValue]> = []
  setHeaders(list, collect, mode, decision, policies, partition)
  return list
}
