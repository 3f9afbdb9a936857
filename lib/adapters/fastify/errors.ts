import createError from '@fastify/error'
import { BAD_INPUT, RATE_LIMITED, UNAVAILABLE } from '../../http/request.js'

// The 429 and the 503 are answers, not bugs: they skip the second stack
// capture of @fastify/error, which a flood of denied requests would pay for
// on every one.

/** 429: the request's bucket cannot afford its cost. */
export const RateLimitedError = createError(
  RATE_LIMITED.code,
  RATE_LIMITED.message,
  RATE_LIMITED.statusCode,
  Error,
  false
)

/** 503: the store failed and the limit fails closed. */
export const UnavailableError = createError(
  UNAVAILABLE.code,
  UNAVAILABLE.message,
  UNAVAILABLE.statusCode,
  Error,
  false
)

/**
 * 500: the route's `key`, `cost`, `allow` or `limit` function failed; no
 * store call was made. Its message says nothing of the failure (the log
 * line does: lib/http/request.ts).
 */
export const BadRequestInputError = createError(
  BAD_INPUT.code,
  BAD_INPUT.message,
  BAD_INPUT.statusCode
)
