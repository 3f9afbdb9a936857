import createError from '@fastify/error'

// The 429 and the 503 are answers, not bugs: they skip the second stack
// capture of @fastify/error, which a flood of denied requests would pay for
// on every one.

/** 429: the request's bucket cannot afford its cost. */
export const RateLimitedError = createError(
  'TOLLGATE_RATE_LIMITED',
  'Rate limit exceeded, retry in %s second(s)',
  429,
  Error,
  false
)

/** 503: the store failed and the limit fails closed. */
export const UnavailableError = createError(
  'TOLLGATE_UNAVAILABLE',
  'Rate limiter unavailable, retry in %s second(s)',
  503,
  Error,
  false
)

/** 500: the route's `key` or `cost` function failed; no store call was made. */
export const BadRequestInputError = createError(
  'TOLLGATE_BAD_INPUT',
  'Rate limit of %s: %s',
  500
)

/** A store call that failed, timed out or was skipped by the breaker. */
export class StoreError extends Error {
  readonly code: string
  constructor (code: 'TOLLGATE_STORE_TIMEOUT' | 'TOLLGATE_STORE_DOWN' | 'TOLLGATE_STORE_ERROR' | 'TOLLGATE_BREAKER_OPEN', message: string, options?: { cause?: unknown }) {
    super(message, options)
    this.name = 'StoreError'
    this.code = code
  }
}

/** An invalid option: a TypeError naming the option, the value and what is expected. */
export function optionError (name: string, value: unknown, expected: string): TypeError {
  const err = new TypeError(`tollgate: \`${name}\` must be ${expected}, got ${describe(value)}`)
  Object.defineProperty(err, 'code', { value: 'TOLLGATE_INVALID_OPTION', enumerable: true })
  return err
}

export function describe (value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value)
  if (typeof value === 'function') return 'a function'
  if (typeof value === 'bigint') return `${value}n`
  if (value === null || typeof value !== 'object') return String(value)
  if (Array.isArray(value)) return 'an array'
  try {
    return JSON.stringify(value)
  } catch {
    return 'an object'
  }
}
