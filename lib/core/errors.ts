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

// What a log line may say of a value the app's function computed from a
// request (a `key` that returned `request.user`, a thrown error whose
// message quotes the body): its type and a short, truncated preview, never
// the value itself. Such values may hold anything the request carried, or
// the app's own secrets (a password hash on the user object), and may be
// megabytes long; a log line that quoted them would leak and grow with them.

/** The longest preview of a value, in characters. */
export const PREVIEW_CHARS = 100
/** The longest part of a string or a thrown message shown. */
const QUOTE_CHARS = 40

/** `text`, cut to `max` characters, `...` marking the cut. */
export function clip (text: string, max = PREVIEW_CHARS): string {
  return text.length <= max ? text : `${text.slice(0, max - 3)}...`
}

/** A value of a request, described for a log line in at most PREVIEW_CHARS characters. */
export function preview (value: unknown): string {
  if (typeof value === 'string') {
    return value.length <= QUOTE_CHARS ? JSON.stringify(value) : `a string of ${value.length} characters (${clip(JSON.stringify(value.slice(0, QUOTE_CHARS)), QUOTE_CHARS + 2)})`
  }
  if (Array.isArray(value)) return `an array of ${value.length} items`
  if (typeof value === 'object' && value !== null) return clip(`an object (keys: ${keysOf(value)})`)
  return clip(describe(value))
}

/** The first names of an object's enumerable keys, never all of them (a huge object is read no further). */
function keysOf (value: object): string {
  const names: string[] = []
  let length = 0
  try {
    for (const name in value) {
      if (length >= PREVIEW_CHARS / 2) {
        names.push('...')
        break
      }
      names.push(clip(name, 20))
      length += name.length + 2
    }
  } catch {
    // A Proxy's trap may throw: the names are a courtesy.
    names.push('...')
  }
  return names.length === 0 ? 'none' : names.join(', ')
}

/**
 * What a thrown value says, for a log line: an error's name and message,
 * cut short, and the first frame of its stack (where the app's function
 * failed); any other value previewed.
 */
export function thrownPreview (cause: unknown): string {
  if (typeof cause !== 'object' || cause === null) return preview(cause)
  const message: unknown = Reflect.get(cause, 'message')
  if (typeof message !== 'string') return preview(cause)
  const name: unknown = Reflect.get(cause, 'name')
  const stack: unknown = Reflect.get(cause, 'stack')
  const frame = typeof stack === 'string' ? /\n\s+(at .*)/.exec(stack)?.[1] : undefined
  const text = `${typeof name === 'string' ? `${clip(name, 20)}: ` : ''}${clip(message, QUOTE_CHARS * 3)}`
  // A long frame keeps its end: the file, line and column.
  return frame === undefined ? text : `${text} (${frame.length <= PREVIEW_CHARS ? frame : `...${frame.slice(3 - PREVIEW_CHARS)}`})`
}
