// Errors of the store wing: what a store call ends in when it does not
// answer, and how to tell a server that cannot run the scripts at all.

/** A store call that failed, timed out or was skipped by the breaker. */
export class StoreError extends Error {
  readonly code: string
  /** The commands the start-up probe found refused inside the scripts (lua/probe.lua), when it ran. */
  readonly refused?: readonly string[]
  constructor (code: 'TOLLGATE_STORE_TIMEOUT' | 'TOLLGATE_STORE_DOWN' | 'TOLLGATE_STORE_ERROR' | 'TOLLGATE_BREAKER_OPEN', message: string, options?: { cause?: unknown, refused?: readonly string[] }) {
    super(message, options)
    this.name = 'StoreError'
    this.code = code
    if (options?.refused !== undefined) this.refused = options.refused
  }
}

/**
 * Reply errors that say the server cannot run the scripts at all: EVALSHA,
 * EVAL or SCRIPT renamed away (`rename-command`), refused to this user
 * (an ACL without `@scripting`), or a server without a Lua engine (Valkey
 * with its Lua module not loaded).
 */
const NO_SCRIPTS = /^(?:ERR unknown command [`'"]?(?:evalsha|eval|script)\b|NOPERM\b.*\b(?:evalsha|eval|script)\b|ERR Could not find scripting engine)/i

/** True for an error that says the store cannot run the scripts. */
export function scriptsRefused (cause: unknown): cause is Error {
  return cause instanceof Error && NO_SCRIPTS.test(cause.message)
}

/**
 * Reply errors that say a command inside a script was refused, while the
 * scripts themselves run: an ACL that does not grant the user one of the
 * commands they run (TIME is only in @fast, so +@read +@write +@scripting
 * lacks it): "NOPERM ... has no permissions to run the 'time' command"
 * since Redis 7.2, "can't run this command or subcommand" before; a key
 * the ACL does not cover (NOPERM, or "can't access" before 7.2); a
 * read-only replica (READONLY); a script run read-only (EVAL_RO). No
 * decision can be made there until the user or the server changes: the
 * store is down for the limiter.
 */
const REFUSED_IN_SCRIPT = /^(?:NOPERM|READONLY)\b|has no permissions to|can't run this command|can't access|Write commands are not allowed from read-only scripts/

/** True for an error that says the store refused a command inside tollgate's scripts. */
export function commandRefused (cause: unknown): cause is Error {
  return cause instanceof Error && REFUSED_IN_SCRIPT.test(cause.message)
}

/** Every command lua/*.lua runs (lua/probe.lua tries each), for the fix of a refusal that does not name one. */
export const SCRIPT_COMMANDS: readonly string[] = [
  'TIME', 'GET', 'TYPE', 'PTTL', 'PSETEX', 'SET', 'DEL', 'ZADD', 'ZCARD', 'ZSCORE', 'ZRANGEBYSCORE', 'ZREMRANGEBYSCORE', 'ZREM', 'PEXPIRE'
]

/**
 * What the operator does about a refusal (`message`: Redis's), given the
 * commands found refused at start-up (lua/probe.lua), if known.
 */
export function refusalFix (message: string, commands: readonly string[]): string {
  if (/^READONLY\b|read-only scripts/.test(message)) return 'the scripts write their buckets, so point the client at a writable primary'
  if (/\baccess\b.*\bkeys?\b/.test(message)) return "grant this Redis user the keys under tollgate's prefix (~<prefix>:*)"
  const named = /run the '([^']+)' command/.exec(message)?.[1]
  const grant = commands.length > 0 ? commands : named === undefined ? SCRIPT_COMMANDS : [named]
  const rules = grant.map((c) => `+${c.toLowerCase()}`).join(' ')
  return `grant ${rules} to tollgate's Redis user (ACL SETUSER <user> ${rules})`
}

/**
 * Reply errors about where keys are while a Cluster reshards, not about
 * Redis failing: TRYAGAIN (a call whose keys the migration of their slot has
 * split between two masters; Redis ran nothing) and ASK or MOVED (keys on
 * another master; every supported Cluster client follows them, so one shows
 * here only from a client that gave up). The call failed alone: its
 * decision follows its failure mode, and the breaker does not count it.
 */
const RESHARDING = /^(?:TRYAGAIN|ASK|MOVED)\b/

/** True for a refusal that a Cluster's resharding causes (see RESHARDING). */
export function reshardRefused (cause: unknown): boolean {
  return cause instanceof Error && RESHARDING.test(cause.message)
}

/** The errors of notConnectedYet, told apart by stillConnecting. */
const FIRST_CONNECTION = new WeakSet<Error>()

/**
 * A call refused because the client has never been connected yet (making
 * its first connection, or waiting to be asked to): nothing was sent.
 */
export function notConnectedYet (message: string): StoreError {
  const err = new StoreError('TOLLGATE_STORE_DOWN', message)
  FIRST_CONNECTION.add(err)
  return err
}

/**
 * True for a failure of a client still making its first connection. The
 * breaker does not count it: it spares a failing Redis calls, and this one
 * was never sent; counted, a burst of requests while the client connects
 * (a few milliseconds) would keep the store from deciding for a whole
 * cool-down after it is ready.
 */
export function stillConnecting (cause: unknown): boolean {
  return cause instanceof Error && FIRST_CONNECTION.has(cause)
}

/**
 * A reply error of Redis's in the form ioredis and iovalkey give one (name
 * 'ReplyError'), made from another client's (`cause`): the guard tells
 * Redis's answers (a key of another type: Redis is up) from the client's own
 * failures by that name (lib/core/guard.ts provesAlive), whatever the client.
 */
export function replyError (message: string, cause: unknown): Error {
  const err = new Error(message, { cause })
  err.name = 'ReplyError'
  return err
}
