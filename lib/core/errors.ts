// Errors of the core, with no HTTP in them: a store call that failed, an
// invalid option. The HTTP answers (429, 503, 500) belong to each adapter
// (lib/adapters/fastify/errors.ts for Fastify, lib/adapters/express/middleware.ts for Express).

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
