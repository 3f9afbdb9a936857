// What an adapter's instance has whatever the framework: the middleware
// adapters' default logger, their gate on the start-up wait, the error a
// denied request carries to the app's `handler`, and the programmatic API
// over the instance's options (`limit.consume`, Fastify's `app.tollgate`).
// Its `acquire` takes policies merged over the instance's options, already
// parsed there, so it goes to the core's acquisition, as a route does
// (lib/http/request.ts), not through `limiter.acquire`, which parses what
// the app wrote.
//
// Start-up. `rateLimit()` cannot be awaited, so the wait the Fastify
// plugin does at registration (for the client to be ready and the scripts
// loaded, bounded: lib/http/setup.ts) starts there, and requests that
// arrive before it ends wait for it (`startGate`).

import type { Core } from '../core/limiter.js'
import type { Adapter } from '../core/migrating.js'
import { programmaticPolicies, type Defaults, type NamedPolicy } from './route.js'
import { denialBody, denialType, type Denial } from './request.js'
import { optionError } from '../core/errors.js'
import { checkPolicies } from '../core/policy.js'
import type { Acquired, Decision, Limiter, Logger, Reservation } from '../core/types.js'

/**
 * The default logger: one line per call, as a pino logger writes one JSON
 * line. Printed whole, an outage's error is a screen of object and stack
 * (the StoreError, its cause and both stacks) per state change.
 */
export const CONSOLE: Logger = {
  warn: (obj, msg) => { console.warn(logLine(obj, msg)) },
  info: (obj, msg) => { console.info(logLine(obj, msg)) },
  error: (obj, msg) => { console.error(logLine(obj, msg)) }
}

/** The message, then each field as `name=value`; an error as its message and code, never its stack. */
export function logLine (obj: object, msg: string): string {
  const fields = Object.entries(obj).map(([name, value]) => value instanceof Error ? errorFields(name, value) : `${name}=${fieldText(value)}`)
  return [msg, ...fields].join(' ')
}

function errorFields (name: string, err: Error): string {
  const code: unknown = Reflect.get(err, 'code')
  const text = `${name}=${JSON.stringify(err.message)}`
  return typeof code === 'string' ? `${text} code=${code}` : text
}

/** JSON, which has no text for `undefined` nor a function. */
function fieldText (value: unknown): string {
  return JSON.stringify(value) ?? String(value)
}

/** A promise to wait for while the start-up wait lasts; undefined once it is over (the common path costs no promise). */
export function startGate (ready: Promise<void>): () => Promise<void> | undefined {
  let waiting: Promise<void> | undefined = ready.then(() => { waiting = undefined })
  return () => waiting
}

/** The error a denied request carries to the app's `handler`. */
export class RateLimitError extends Error {
  /** 429, or 503 when a limit with failureMode 'closed' cannot reach the store. */
  readonly status: 429 | 503
  readonly statusCode: 429 | 503
  readonly code: Denial['code']
  /** Safe to show the client (an error handler then sends `message`). */
  readonly expose = true
  /** Headers for the framework's error handler: `Retry-After` (already set on the response too). */
  readonly headers: { 'Retry-After': string }
  /** Seconds until a retry may pass. */
  readonly retryAfter: number
  /** The decision, also on the request. */
  readonly decision: Decision
  /** The body tollgate sends when there is no handler: JSON, or problem details with `problemDetails`. */
  readonly body: string
  /** The content type of `body`. */
  readonly contentType: string

  constructor (denial: Denial, decision: Decision) {
    super(denial.message)
    this.name = 'RateLimitError'
    this.status = denial.statusCode
    this.statusCode = denial.statusCode
    this.code = denial.code
    this.headers = { 'Retry-After': String(denial.retryAfter) }
    this.retryAfter = denial.retryAfter
    this.decision = decision
    this.body = denialBody(denial)
    this.contentType = denialType(denial)
  }
}

/** The programmatic API of an instance, over its options (Fastify's `app.tollgate`). */
export interface ProgrammaticApi<P extends NamedPolicy> {
  consume (clientKey: string, policy: P, cost?: number): Promise<Decision>
  peek (clientKey: string, policy: P): Promise<Decision>
  /** Reserves `cost` (as `consume`); settle the handle once with the actual cost. */
  reserve (clientKey: string, policy: P, cost?: number): Promise<Reservation>
  /** Settles a reservation once: refunds or charges the difference to the reserved cost. */
  settle (reservation: Reservation, actual: number): Promise<void>
  reset (clientKey: string, bucket: string): Promise<void>
  /**
   * Takes a concurrency slot (SPEC 13), with a list's tokens, all or
   * nothing, over the instance's options; `release()` gives it back and is
   * safe to call twice. The instance's shutdown gives back what is held.
   */
  acquire (clientKey: string, policy: P | readonly P[]): Promise<Acquired>
  /** The core limiter behind the instance. */
  readonly limiter: Limiter
}

/** A middleware instance's programmatic API: with its own shutdown and start-up wait. */
export interface Programmatic<P extends NamedPolicy> extends ProgrammaticApi<P> {
  /** Drops local state and timers, and ends every wait; never closes the Redis client. */
  close (): Promise<void>
  /** Settles when the start-up wait is over (never rejects). */
  readonly ready: Promise<void>
}

/** The programmatic API over `defaults` (other libraries' names read as `adapter`'s users mean them). */
export function programmatic<P extends NamedPolicy> (core: Core, defaults: Defaults, adapter: Adapter): ProgrammaticApi<P> {
  const policyOf = programmaticPolicies(defaults, adapter)
  const { limiter } = core
  return {
    consume: async (clientKey, policy, spend) => await limiter.consume(clientKey, policyOf(policy), spend),
    peek: async (clientKey, policy) => await limiter.peek(clientKey, policyOf(policy)),
    reserve: async (clientKey, policy, spend) => await limiter.reserve(clientKey, policyOf(policy), spend),
    settle: async (reservation, actual) => { await limiter.settle(reservation, actual) },
    reset: async (clientKey, bucket) => { await limiter.reset(clientKey, bucket) },
    async acquire (clientKey, policy) {
      const list = listOf(policy).map(policyOf)
      checkPolicies(list)
      if (typeof clientKey !== 'string') throw optionError('clientKey', clientKey, 'a string')
      return await core.acquire(clientKey, list, undefined)
    },
    limiter
  }
}

function listOf<P> (policy: P | readonly P[]): readonly P[] {
  return isList(policy) ? policy : [policy]
}

/** Array.isArray, which does not narrow a union with a readonly array. */
function isList<P> (policy: P | readonly P[]): policy is readonly P[] {
  return Array.isArray(policy)
}
