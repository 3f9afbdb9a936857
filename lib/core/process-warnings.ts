// The core's logger when it is given none (`createLimiter()` without
// `logger`). The adapters always pass one (Fastify's `app.log`, the Express
// adapter's console logger); the core alone had none, so a limiter whose
// store never answered failed open for ever and said nothing. Its lines
// (the store failing, the summaries while it fails, its recovery, a call
// Redis refused) become process warnings: Node prints them on stderr by
// default, `process.on('warning')` sees them, and `--no-warnings` or a
// logger of the app's own silences them.

import type { Logger } from './types.js'

/** The type of every warning this logger emits. */
export const WARNING_TYPE = 'TollgateWarning'

function emit (obj: object, msg: string): void {
  // Any object's `err`, if it has one, is of a type unknown here.
  const { err }: { err?: unknown } = obj
  const detail = err instanceof Error ? err.message : undefined
  process.emitWarning(`tollgate: ${msg}`, detail === undefined ? { type: WARNING_TYPE } : { type: WARNING_TYPE, detail })
}

/** A Logger writing through process.emitWarning. */
export const processWarnings: Logger = { warn: emit, info: emit, error: emit }
