// Errors of the core, with no HTTP in them: an invalid option, and (from
// the store wing, lib/store/errors.ts) a store call that failed. The HTTP
// answers (429, 503, 500) belong to each adapter (lib/adapters/fastify/
// errors.ts for Fastify, lib/adapters/express/middleware.ts for Express).

export { StoreError } from '../store/errors.js'

/** An invalid option: a TypeError naming the option, the value (or `shown`, for a secret) and what is expected. */
export function optionError (name: string, value: unknown, expected: string, shown = describe(value)): TypeError {
  const err = new TypeError(`tollgate: \`${name}\` must be ${expected}, got ${shown}`)
  Object.defineProperty(err, 'code', { value: 'TOLLGATE_INVALID_OPTION', enumerable: true })
  return err
}

/** What a thrown value says: an error's message, else the value described. */
export function messageOf (cause: unknown): string {
  const message: unknown = typeof cause === 'object' && cause !== null ? Reflect.get(cause, 'message') : undefined
  return typeof message === 'string' ? message : describe(cause)
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
