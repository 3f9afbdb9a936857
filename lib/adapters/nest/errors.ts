// The denial as Nest's idiom has it: an HttpException thrown from the
// guard, so that the app's exception filters may reshape it. Nest's own
// filter sends its response object as JSON: the same bytes as the other
// adapters' 429 and 503 (the body of docs/reference/errors.md), and the
// rate-limit headers and Retry-After already on the response.
//
// The content type. Both platforms set JSON's unless the response has one,
// and a filter of the app's keeps one set before, so the guard cannot set
// application/problem+json (`problemDetails`) before it throws. The
// response object sets it when it is serialised (its `toJSON`): Express's
// res.json() serialises before it picks a content type, Fastify writes its
// headers after; a filter that sends its own body never serialises it.

import { HttpException } from '@nestjs/common'
import type { RateLimitError } from '../../http/instance.js'
import type { Decision } from '../../core/types.js'

/** A denied request: 429, or 503 when a limit failing closed cannot reach its store. */
export class RateLimitException extends HttpException {
  /** TOLLGATE_RATE_LIMITED or TOLLGATE_UNAVAILABLE. */
  readonly code: RateLimitError['code']
  /** Seconds until a retry may pass (Retry-After, already set on the response). */
  readonly retryAfter: number
  /** The decision, also on the request. */
  readonly decision: Decision
  /** The content type of the body (`getResponse()` as JSON). */
  readonly contentType: string

  /** `setType`: sets the response's content type, when the body is serialised (see the top of this file). */
  constructor (error: RateLimitError, setType: (type: string) => void) {
    // The body tollgate sends, as the object Nest's filter serialises back to the same bytes.
    const body = JSON.parse(error.body) as Record<string, unknown>
    super(Object.defineProperty({ ...body }, 'toJSON', { value: () => { setType(error.contentType); return body } }), error.status, { cause: error })
    this.name = 'RateLimitException'
    this.message = error.message
    this.code = error.code
    this.retryAfter = error.retryAfter
    this.decision = error.decision
    this.contentType = error.contentType
  }
}
