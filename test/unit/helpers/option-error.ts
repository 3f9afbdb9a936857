// Checks of the coded option errors (lib/core/errors.ts optionError): a
// TypeError with code TOLLGATE_INVALID_OPTION whose message names the
// option, the value and what is expected.

import Fastify, { type FastifyInstance } from 'fastify'
import type t from 'tap'
import tollgate, { type TollgateOptions } from '../../../lib/index.js'

/** A tap test object, as passed to a t.test callback. */
export type Test = Parameters<Parameters<typeof t.test>[0]>[0]

export interface Expected {
  /** The option as the message names it (between backticks). */
  name: string
  /** How the value appears after "got". */
  got?: string
  /** What was expected, as the message says it. */
  expect?: string | RegExp
}

/** Asserts a coded TypeError whose message names the option, the value and the expectation. */
export function isOptionError (t: Test, err: unknown, want: Expected, label: string): void {
  if (!(err instanceof TypeError)) {
    t.fail(`${label}: expected a TypeError, got ${err instanceof Error ? err.stack ?? '' : String(err)}`)
    return
  }
  t.equal((err as TypeError & { code?: string }).code, 'TOLLGATE_INVALID_OPTION', `${label}: code`)
  t.match(err.message, `\`${want.name}\``, `${label}: names the option`)
  // The value ends the message, or comes before a hint (another library's meaning of it: lib/core/migrating.ts).
  if (want.got !== undefined) t.ok(err.message.endsWith(`got ${want.got}`) || err.message.includes(`got ${want.got}: `), `${label}: names the value (${err.message})`)
  if (want.expect !== undefined) t.match(err.message, want.expect, `${label}: says what is expected`)
}

/** What `fn` threw (undefined when it returned). */
export function thrown (fn: () => unknown): unknown {
  try {
    fn()
    return undefined
  } catch (err) {
    return err
  }
}

/** What `promise` rejected with (undefined when it resolved). */
export async function rejected (promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise
    return undefined
  } catch (err) {
    return err
  }
}

/** A logger that keeps its lines. */
export function memoryLog (): { logger: { warn: (o: object, m: string) => void, info: (o: object, m: string) => void, error: (o: object, m: string) => void }, lines: Array<{ level: string, obj: Record<string, unknown>, msg: string }> } {
  const lines: Array<{ level: string, obj: Record<string, unknown>, msg: string }> = []
  const at = (level: string) => (obj: object, msg: string): void => { lines.push({ level, obj: obj as Record<string, unknown>, msg }) }
  return { lines, logger: { warn: at('warn'), info: at('info'), error: at('error') } }
}

/** The error of registering the plugin with `options` (undefined when it registers). */
export async function registerError (options: unknown): Promise<unknown> {
  const app = Fastify()
  try {
    await app.register(tollgate, options as TollgateOptions)
    await app.ready()
    return undefined
  } catch (err) {
    return err
  } finally {
    await app.close().catch(() => {})
  }
}

/** The error of declaring routes on an app with the plugin (undefined when none). */
export async function routeError (plugin: Partial<TollgateOptions>, declare: (app: FastifyInstance) => void): Promise<unknown> {
  const app = Fastify()
  try {
    await app.register(tollgate, { failureMode: 'open', ...plugin })
    declare(app)
    await app.ready()
    return undefined
  } catch (err) {
    return err
  } finally {
    await app.close().catch(() => {})
  }
}
