// A Lua script of lua/, as the store runs it (RemoteStore.run): declared
// once, by whichever file owns its limit kind, with `script(file)` at
// module load. A script kept loaded is sent by its SHA-1 (EVALSHA, with
// NOSCRIPT answered by one EVAL) and is loaded on every master by the
// store's start-up (RedisStore.warm): every script is declared when the
// modules load, so before any start-up runs. A script that runs once per
// start-up (`loaded: false`) is sent as EVAL: loading its text on every
// master would cost more than sending it once.

import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'

/** A Lua script and its SHA-1, as EVALSHA names it. */
export interface Script {
  /** Its file, for the errors of replies of another shape: `lua/<file>`. */
  readonly name: string
  readonly lua: string
  readonly sha: string
  /** Sent by its SHA-1 and loaded at start-up; false: sent as EVAL, never loaded. */
  readonly loaded: boolean
}

/** Every script kept loaded, in the order declared: what the store's start-up loads. */
const declared: Script[] = []

/** The script of lua/`file`; kept loaded unless `loaded` is false. */
export function script (file: string, options: { loaded?: boolean } = {}): Script {
  const lua = readFileSync(new URL(`../../lua/${file}`, import.meta.url), 'utf8')
  const made: Script = { name: `lua/${file}`, lua, sha: createHash('sha1').update(lua).digest('hex'), loaded: options.loaded ?? true }
  if (made.loaded) declared.push(made)
  return made
}

/** The scripts kept loaded, declared so far (every module's, once they are loaded). */
export function loadedScripts (): readonly Script[] {
  return declared
}
