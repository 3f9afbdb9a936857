import { describe, optionError } from './errors.js'
import { limitValueHint, migrationHint, type Adapter } from './migrating.js'
import { ACCEPTED_CLIENTS, clientFamily, describeClient } from '../store/clients/index.js'
import type { BreakerOptions, FailureMode, LocalPolicy, Lockout, MetricsMeter, MetricsOptions, RedisClient } from './types.js'

export const FAILURE_MODES: readonly FailureMode[] = ['open', 'closed', 'local']
export const HOOKS = ['onRequest', 'preHandler'] as const

export const DEFAULT_TIMEOUT = 10
/**
 * Longest store deadline, ms. A rate-limit decision that may take longer
 * than a minute holds its request for as long; and Node's timers cannot
 * wait more than 2^31 - 1 ms at all.
 */
export const MAX_TIMEOUT = 60_000
export const DEFAULT_PREFIX = 'tollgate'
export const DEFAULT_BREAKER: BreakerOptions = { failures: 5, cooldownMs: 1000 }

// Options are parsed, not only validated: each parser takes what the app
// passed (`unknown`) and returns it typed, or throws an option error naming
// the field; parseFields applies a table of them to an object and returns
// the typed fields. So callers read typed values and need no casts.

/** Parses one option value; `name` is its path in error messages. */
export type Parse<T> = (value: unknown, name: string) => T
/** A table of parsers, one per field. */
export type Parsers = Record<string, Parse<unknown>>
/** What parseFields returns for a table: each field, typed, when it was set. */
export type Parsed<P extends Parsers> = { [K in keyof P]?: ReturnType<P[K]> }

export function isRecord (value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

export function positiveNumber (value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw optionError(name, value, 'a finite number > 0')
  }
  return value
}

/** A store deadline: a finite number of ms > 0, at most MAX_TIMEOUT. */
export function deadlineMs (value: unknown, name: string): number {
  const ms = positiveNumber(value, name)
  if (ms > MAX_TIMEOUT) throw optionError(name, value, `at most ${MAX_TIMEOUT} (ms)`)
  return ms
}

export function positiveInteger (value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw optionError(name, value, 'an integer > 0')
  }
  return value
}

/**
 * Bounds of a bucket that lua/token-bucket.lua (and lua/lease.lua) can keep
 * in Redis. The scripts work in microseconds: T = 1e6 / refillPerSecond
 * per token, and the full-at time, Redis's clock (about 1.8e15 us today)
 * plus up to capacity * T, is stored and passed to PSETEX as an integer,
 * which must stay exact in a double (below 2^53) and be printed whole.
 * With capacity * T at most 2^52 us, that holds until Redis's clock passes
 * 2^52 us, in 2112. The spend, cost * 1e6 / refillPerSecond, needs
 * capacity * 1e6 to be finite (cost <= capacity), and T must be finite.
 */
export const MAX_WINDOW_US = 2 ** 52
/** The largest capacity whose capacity * 1e6 is a finite double. */
export const MAX_CAPACITY = 1.7976931348623154e302
/** The smallest refill whose 1e6 / refillPerSecond is a finite double. */
export const MIN_REFILL = 5.562684646268004e-303

/** Checks that a policy's bucket fits the Redis encoding (see MAX_WINDOW_US); capacity and refill are already positive numbers. */
export function storableBucket (capacity: number, refillPerSecond: number, where: string): void {
  if (capacity > MAX_CAPACITY) {
    throw optionError(where + 'capacity', capacity, `at most ${MAX_CAPACITY} (capacity × 1e6 µs must be a finite number)`)
  }
  if (refillPerSecond < MIN_REFILL) {
    throw optionError(where + 'refillPerSecond', refillPerSecond, `at least ${MIN_REFILL} (1e6 / refillPerSecond µs per token must be a finite number)`)
  }
  if (capacity * (1e6 / refillPerSecond) > MAX_WINDOW_US) {
    throw optionError(where + 'refillPerSecond', refillPerSecond,
      `at least capacity / ${MAX_WINDOW_US / 1e6} (${capacity / (MAX_WINDOW_US / 1e6)}): an empty bucket may take at most ` +
      `2^52 µs (${MAX_WINDOW_US / 1e6} s, about 142 years) to fill, the most Redis can store exactly`)
  }
}

/** One of `allowed` (compared with ===), typed as their union. */
export function oneOf<const T> (allowed: readonly T[]): Parse<T> {
  const text = allowed.map((v) => describe(v)).join(', ')
  return (value, name) => {
    for (const candidate of allowed) if (candidate === value) return candidate
    throw optionError(name, value, `one of ${text}`)
  }
}

/** A function the app wrote; what it returns is checked where it is called. */
export type AppFunction = (...args: never[]) => unknown

export function isFunction (value: unknown, name: string): AppFunction {
  if (typeof value !== 'function') throw optionError(name, value, 'a function')
  return value as AppFunction // a function is callable with no arguments of a known type; its results are checked
}

/** A coded option error with a hint after the value. */
export function hinted (name: string, value: unknown, expected: string, hint: string | undefined): TypeError {
  const err = optionError(name, value, expected)
  return hint === undefined ? err : codedTypeError(`${err.message}: ${hint}`)
}

/** `limit`: the plan function; a number is express-rate-limit's `limit`, and is told so. */
export function planFunction (value: unknown, name: string): AppFunction {
  if (typeof value !== 'function') throw hinted(name, value, 'a function (request) => { capacity, refillPerSecond } or false, the plan of each request', limitValueHint(value))
  return isFunction(value, name)
}

export function isBoolean (value: unknown, name: string): boolean {
  if (typeof value !== 'boolean') throw optionError(name, value, 'true or false')
  return value
}

export function nonEmptyString (value: unknown, name: string): string {
  if (typeof value !== 'string' || value.length === 0) throw optionError(name, value, 'a non-empty string')
  return value
}

export function keyPrefix (value: unknown, name: string): string {
  if (typeof value !== 'string' || !/^[A-Za-z0-9._:-]{1,64}$/.test(value)) {
    throw optionError(name, value, 'a string of 1 to 64 characters from [A-Za-z0-9._:-]')
  }
  return value
}

/** Fewest characters of `keySecret`: 16 random characters carry at least 64 bits (docs/reference/keys.md). */
export const MIN_KEY_SECRET = 16

/** `keySecret`: a string of at least MIN_KEY_SECRET characters, the same on every server of a fleet. */
export function keySecret (value: unknown, name: string): string {
  if (typeof value !== 'string' || value.length < MIN_KEY_SECRET) {
    // A secret is never written to a log: a string is shown by its length.
    const shown = typeof value === 'string' ? `a string of ${value.length} characters` : describe(value)
    throw optionError(name, value, `a string of at least ${MIN_KEY_SECRET} characters, the same on every server of the fleet`, shown)
  }
  return value
}

export function ipv6Subnet (value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > 128) {
    throw optionError(name, value, 'an integer from 1 to 128')
  }
  return value
}

function isRedisClient (value: unknown): value is RedisClient {
  return clientFamily(value) !== undefined
}

export function redisClient (value: unknown, name: string): RedisClient {
  if (isRedisClient(value)) return value
  const err = optionError(name, value, ACCEPTED_CLIENTS)
  err.message = `tollgate: \`${name}\` must be ${ACCEPTED_CLIENTS}, got ${describeClient(value, describe)}`
  throw err
}

/** A cost: a number of tokens, or (on a route) a function of the request. */
export function cost (value: unknown, name: string): number | AppFunction {
  return typeof value === 'function' ? isFunction(value, name) : positiveNumber(value, name)
}

function unknownOption (name: string, input: Record<string, unknown>, known: readonly string[], where: string, adapter: Adapter | undefined): TypeError {
  const value = input[name]
  const migration = adapter === undefined ? undefined : migrationHint(name, value, adapter, known, input)
  const hint = migration === undefined ? closest(name, known) : undefined
  const advice = migration !== undefined ? `: ${migration}` : hint === undefined ? '' : `; did you mean \`${where}${hint}\`?`
  return codedTypeError(`tollgate: unknown option \`${where}${name}\`${advice}`)
}

function codedTypeError (message: string): TypeError {
  const err = new TypeError(message)
  Object.defineProperty(err, 'code', { value: 'TOLLGATE_INVALID_OPTION', enumerable: true })
  return err
}

/** The option errors a check threw, flattened; anything else is rethrown. */
function optionErrors (err: unknown): TypeError[] {
  if (!(err instanceof TypeError) || Reflect.get(err, 'code') !== 'TOLLGATE_INVALID_OPTION') throw err
  const errors: unknown = Reflect.get(err, 'errors')
  return Array.isArray(errors) ? errors.filter((e) => e instanceof TypeError) : [err]
}

/**
 * Parses an object's known fields with their parsers, and checks that the `required`
 * ones are set (each with what is expected). Every problem is reported at
 * once: one error as it is, several as one TypeError listing them all (its
 * `errors` holds each). Unknown names are errors with a hint: with
 * `adapter` (an adapter's or a policy's own names, not nested ones), the
 * replacement of another rate limiter's option (lib/core/migrating.ts), else the
 * closest valid name.
 */
export function parseFields<P extends Parsers, R extends keyof P & string = never> (
  input: Record<string, unknown>, parsers: P, where: string, required?: Readonly<Record<R, string>>, adapter?: Adapter
): Parsed<P> & { [K in R]: ReturnType<P[K]> } {
  const errors: TypeError[] = []
  const out: Record<string, unknown> = {}
  for (const name of Object.keys(input)) {
    const parse = Object.hasOwn(parsers, name) ? parsers[name] : undefined
    try {
      if (parse === undefined) throw unknownOption(name, input, Object.keys(parsers), where, adapter)
      const value = input[name]
      if (value !== undefined) out[name] = parse(value, where + name)
    } catch (err) {
      errors.push(...optionErrors(err))
    }
  }
  for (const [name, expected] of Object.entries<string>(required ?? {})) {
    if (input[name] === undefined) errors.push(optionError(where + name, undefined, expected))
  }
  if (errors.length === 1) throw errors[0]
  if (errors.length > 1) {
    const err = codedTypeError(`tollgate: ${errors.length} invalid options:\n${errors.map((e) => `  - ${e.message.replace(/^tollgate: /, '')}`).join('\n')}`)
    Object.defineProperty(err, 'errors', { value: errors, enumerable: false })
    throw err
  }
  // Each field of `out` is what its parser returned, and the required ones
  // are set: the mapped type says so, which TypeScript cannot follow
  // through the loop over the input's names.
  return out as Parsed<P> & { [K in R]: ReturnType<P[K]> }
}

export function localPolicy (value: unknown, name: string): LocalPolicy {
  if (!isRecord(value)) throw optionError(name, value, 'an object { capacity, refillPerSecond }')
  const number = 'a finite number > 0'
  return parseFields(value, { capacity: positiveNumber, refillPerSecond: positiveNumber }, name + '.', { capacity: number, refillPerSecond: number })
}

export function breaker (value: unknown, name: string): Partial<BreakerOptions> {
  if (!isRecord(value)) throw optionError(name, value, 'an object { failures, cooldownMs }')
  return parseFields(value, { failures: positiveInteger, cooldownMs: positiveNumber }, name + '.')
}

export function lease (value: unknown, name: string): { tokens: number, maxAgeMs: number } {
  if (!isRecord(value)) throw optionError(name, value, 'an object { tokens, maxAgeMs }')
  const number = 'a finite number > 0'
  return parseFields(value, { tokens: positiveNumber, maxAgeMs: positiveNumber }, name + '.', { tokens: number, maxAgeMs: number })
}

/** Longest `maxWaitMs`: an hour (a caller held longer is better told to come back). */
export const MAX_WAIT_MS = 3_600_000
/** Longest lockout period or block, ms: a year. */
export const MAX_LOCKOUT_MS = 31_536_000_000

/** `maxWaitMs`: a finite number of ms > 0, at most MAX_WAIT_MS. */
export function maxWaitMs (value: unknown, name: string): number {
  const ms = positiveNumber(value, name)
  if (ms > MAX_WAIT_MS) throw optionError(name, value, `at most ${MAX_WAIT_MS} (ms, an hour)`)
  return ms
}

function lockoutMs (value: unknown, name: string): number {
  const ms = positiveInteger(value, name)
  if (ms > MAX_LOCKOUT_MS) throw optionError(name, value, `at most ${MAX_LOCKOUT_MS} (ms, a year)`)
  return ms
}

export function lockout (value: unknown, name: string): Lockout {
  if (!isRecord(value)) throw optionError(name, value, 'an object { after, withinMs, forMs }')
  const ms = 'an integer > 0 (ms)'
  return parseFields(value, { after: positiveInteger, withinMs: lockoutMs, forMs: lockoutMs }, name + '.', { after: 'an integer > 0', withinMs: ms, forMs: ms })
}

export function warnings (value: unknown, name: string): false | { proxy?: boolean, trustProxy?: boolean } {
  if (value === false) return false
  if (!isRecord(value)) throw optionError(name, value, 'false or an object { proxy, trustProxy }')
  return parseFields(value, { proxy: isBoolean, trustProxy: isBoolean }, name + '.')
}

/** Whether a warning of the `warnings` option is on (all are, unless turned off). */
export function warningOn (option: { proxy?: boolean | undefined, trustProxy?: boolean | undefined } | false | undefined, name: 'proxy' | 'trustProxy'): boolean {
  return option !== false && option?.[name] !== false
}

/** Shortest and longest period of the outage summary line, ms: at most one line a second, at least one an hour. */
export const MIN_SUMMARY_MS = 1000
export const MAX_SUMMARY_MS = 3_600_000

/** `outageSummaryMs`: a number of ms from MIN_SUMMARY_MS to MAX_SUMMARY_MS. */
export function outageSummaryMs (value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < MIN_SUMMARY_MS || value > MAX_SUMMARY_MS) {
    throw optionError(name, value, `a number of ms from ${MIN_SUMMARY_MS} to ${MAX_SUMMARY_MS} (at most one summary line a second while the store fails)`)
  }
  return value
}

export function denialCache (value: unknown, name: string): false | { maxKeys?: number, maxAgeMs?: number } {
  if (value === false) return false
  if (!isRecord(value)) throw optionError(name, value, 'false or an object { maxKeys, maxAgeMs }')
  return parseFields(value, { maxKeys: positiveInteger, maxAgeMs: positiveNumber }, name + '.')
}

/** Most decisions of one batched script call, as `batch.maxDecisions` accepts them. */
export const MIN_BATCH = 2
export const MAX_BATCH = 1024

function maxDecisions (value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < MIN_BATCH || value > MAX_BATCH) {
    throw optionError(name, value, `an integer from ${MIN_BATCH} to ${MAX_BATCH}`)
  }
  return value
}

/** `batch`: false (one script call per decision) or `{ maxDecisions }`. */
export function batch (value: unknown, name: string): false | { maxDecisions?: number } {
  if (value === false) return false
  if (!isRecord(value)) throw optionError(name, value, 'false or an object { maxDecisions }')
  return parseFields(value, { maxDecisions }, name + '.')
}

const METER_METHODS = ['createCounter', 'createUpDownCounter', 'createHistogram'] as const

export function metricsOption (value: unknown, name: string): MetricsOptions {
  if (!isRecord(value)) throw optionError(name, value, 'an object { meter }')
  return parseFields(value, { meter }, name + '.', { meter: 'an OpenTelemetry Meter' })
}

function isMeter (value: unknown): value is MetricsMeter {
  return isRecord(value) && METER_METHODS.every((method) => typeof value[method] === 'function')
}

function meter (value: unknown, name: string): MetricsMeter {
  if (!isMeter(value)) throw optionError(name, value, `an OpenTelemetry Meter (with ${METER_METHODS.join(', ')})`)
  return value
}

/** Closest known name by edit distance, when it is close enough to be a likely typo. */
export function closest (name: string, known: readonly string[]): string | undefined {
  let best: string | undefined
  let bestDistance = Infinity
  for (const candidate of known) {
    const d = distance(name.toLowerCase(), candidate.toLowerCase())
    if (d < bestDistance) {
      bestDistance = d
      best = candidate
    }
  }
  return bestDistance <= Math.max(2, Math.floor(name.length / 3)) ? best : undefined
}

/**
 * Levenshtein's distance, one row of the table at a time: for each cell,
 * `diagonal` and `up` come from the previous row, `left` from this one.
 */
function distance (a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, i) => i)
  let last = b.length
  for (let i = 0; i < a.length; i++) {
    const char = a[i]
    let diagonal = i
    let left = i + 1
    const row = [left]
    for (const [j, up] of previous.slice(1).entries()) {
      left = Math.min(up + 1, left + 1, diagonal + (char === b[j] ? 0 : 1))
      diagonal = up
      row.push(left)
    }
    previous = row
    last = left
  }
  return last
}
