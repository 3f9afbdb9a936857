// A reference token bucket, written from the definition in docs/design/algorithm.md and
// nothing else, plus direct runners for lua/token-bucket.lua and lua/lease.lua
// (no lib code in between), a seeded random generator, and small helpers
// shared by the tests of the scripts, the model, leases and the denial cache.

import { createHash, randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import type { Redis } from 'ioredis'

/**
 * The text of lua/token-bucket.lua, as the tests that run the script directly
 * load it. TOLLGATE_TEST_LUA=<file> swaps in another text (a deliberately
 * broken copy, or a candidate fix) to check what those tests catch.
 */
export const LUA = readFileSync(process.env.TOLLGATE_TEST_LUA ?? new URL('../../lua/token-bucket.lua', import.meta.url), 'utf8')

/** The text of lua/lease.lua; TOLLGATE_TEST_LEASE_LUA=<file> swaps in another, as above. */
export const LEASE_LUA = readFileSync(process.env.TOLLGATE_TEST_LEASE_LUA ?? new URL('../../lua/lease.lua', import.meta.url), 'utf8')

/** Size and rate of one bucket. */
export interface Shape {
  capacity: number
  refillPerSecond: number
}

/**
 * The plain token bucket: tokens are a real number, refilled continuously
 * with elapsed time at `refillPerSecond`, capped at `capacity`. A request of
 * `cost` is allowed when the bucket holds at least `cost` tokens, and then
 * (when consuming) takes them. A new bucket is full.
 */
export class ReferenceBucket {
  readonly capacity: number
  readonly refillPerSecond: number
  tokens: number
  /** Clock of the last look, microseconds; undefined before the first. */
  lastUs: number | undefined

  constructor (shape: Shape) {
    this.capacity = shape.capacity
    this.refillPerSecond = shape.refillPerSecond
    this.tokens = shape.capacity
    this.lastUs = undefined
  }

  /**
   * Refills for the time since the last look and returns the token count
   * before the cap is applied (how far past full the bucket would be).
   * Time never runs backwards here.
   */
  advance (nowUs: number): number {
    let uncapped = this.tokens
    if (this.lastUs !== undefined && nowUs > this.lastUs) {
      uncapped += (nowUs - this.lastUs) / 1e6 * this.refillPerSecond
    }
    if (this.lastUs === undefined || nowUs > this.lastUs) this.lastUs = nowUs
    this.tokens = Math.min(this.capacity, uncapped)
    return uncapped
  }

  affords (cost: number): boolean {
    return this.tokens >= cost
  }

  spend (cost: number): void {
    this.tokens -= cost
  }

  /** Puts tokens back, never past capacity. */
  giveBack (tokens: number): void {
    this.tokens = Math.min(this.capacity, this.tokens + tokens)
  }
}

/** One bucket in a direct script call. */
export interface ScriptSpec extends Shape {
  key: string
  cost: number
}

/**
 * Arguments of the script for these buckets: KEYS, then the mode, then per
 * bucket its window, the need of its cost and the move of its full-at time
 * in microseconds, the expressions the script's header gives.
 */
export function scriptArgs (specs: readonly ScriptSpec[], consume: boolean): Array<string | number> {
  const args: Array<string | number> = specs.map((s) => s.key)
  args.push(consume ? '1' : '0')
  for (const s of specs) {
    const step = 1e6 / s.refillPerSecond
    args.push(s.capacity * step, s.cost * step, s.cost * 1e6 / s.refillPerSecond)
  }
  return args
}

/**
 * Checks a reply of lua/token-bucket.lua for `count` buckets and returns
 * its integers: one integer for one bucket, an array of `count` integers
 * for several (a clocked copy's reply is always an array); throws on
 * anything else.
 */
export function parseValues (reply: unknown, count: number, array = count > 1): number[] {
  const values = array ? reply : [reply]
  if (!Array.isArray(values) || values.length !== count || !values.every((v) => Number.isSafeInteger(v))) {
    throw new Error(`unexpected script reply ${JSON.stringify(reply)} (expected ${count === 1 ? 'one integer' : `${count} integers`})`)
  }
  return values as number[]
}

/**
 * The token-bucket script with one change: Redis's clock at the decision
 * (`now`, microseconds) is appended to the reply, which is then always an
 * array: each `return x` becomes `return clocked(x)`, where `clocked`, a
 * local function defined right after `local now`, appends `now` to a
 * table or pairs a plain integer with it. The decisions are those of the
 * text given. Throws when the text no longer has the shape this expects,
 * so a rewrite of the script shows here instead of silently testing
 * something else.
 */
export function withClock (lua: string): string {
  const clock = /\nlocal now = [^\n]*\n/
  const returns = /^(\s*)return (.+)$/gm
  if (!clock.test(lua) || lua.match(returns) === null) {
    throw new Error('the token-bucket script no longer has a `local now` line and `return` lines; update withClock in test/helpers/model.ts')
  }
  const helper = "local function clocked (r)\n  if type(r) == 'table' then\n    r[#r + 1] = now\n    return r\n  end\n  return { r, now }\nend\n"
  return lua.replace(returns, '$1return clocked($2)').replace(clock, (line) => line + helper)
}

/** A reply of the clocked script: the per-bucket values, and Redis's clock at the decision. */
export interface ClockedReply {
  values: number[]
  nowUs: number
}

/** A reply bracketed by Redis TIME read just before and just after the script, in one MULTI. */
export interface TimedReply {
  values: number[]
  /** Redis's clock before the script ran, microseconds: the script's `now` is at or after it. */
  beforeUs: number
  /** Redis's clock after it ran: the script's `now` is at or before it. */
  afterUs: number
  /** With `read`: that key's value and PEXPIRETIME (ms), read in the same MULTI. */
  value?: unknown
  expireAtMs?: unknown
}

/** Microseconds from a TIME reply. */
export function timeMicros (time: unknown): number {
  if (!Array.isArray(time) || time.length !== 2) throw new Error(`unexpected TIME reply ${JSON.stringify(time)}`)
  return Number(time[0]) * 1e6 + Number(time[1])
}

/** Redis's clock now, microseconds (one round trip, so only a bound for anything around it). */
export async function redisMicros (redis: Redis): Promise<number> {
  return timeMicros(await redis.time())
}

/**
 * Runs a Lua text directly (EVALSHA, loading it on NOSCRIPT), so tests can
 * run the real scripts as well as modified copies of them.
 */
export class LuaRunner {
  readonly redis: Redis
  readonly lua: string
  readonly sha: string

  constructor (redis: Redis, lua: string) {
    this.redis = redis
    this.lua = lua
    this.sha = createHash('sha1').update(lua).digest('hex')
  }

  async eval (keys: readonly string[], args: ReadonlyArray<string | number>): Promise<unknown> {
    try {
      return await this.redis.evalsha(this.sha, keys.length, ...keys, ...args)
    } catch (err) {
      if (!(err instanceof Error) || !err.message.startsWith('NOSCRIPT')) throw err
      return await this.redis.eval(this.lua, keys.length, ...keys, ...args)
    }
  }

  /**
   * TIME, the script, TIME, in one MULTI: nothing else runs in between, so
   * the two clocks bracket the script's own reading of TIME to within a few
   * microseconds. Loads the script first (EVALSHA inside MULTI cannot fall
   * back to EVAL), and once more if another test flushed the script cache.
   */
  /**
   * The script between two TIMEs in one MULTI; with `read`, that key's
   * value and PEXPIRETIME too, in the same MULTI (so a key that expires
   * soon after is still read as the script left it, however busy the
   * machine).
   */
  async timed (keys: readonly string[], args: ReadonlyArray<string | number>, read?: string): Promise<{ reply: unknown, beforeUs: number, afterUs: number, value?: unknown, expireAtMs?: unknown }> {
    for (let attempt = 1; ; attempt++) {
      await this.redis.script('LOAD', this.lua)
      const multi = this.redis.multi().time().evalsha(this.sha, keys.length, ...keys, ...args).time()
      if (read !== undefined) multi.get(read).pexpiretime(read)
      const results = await multi.exec()
      if (results === null) throw new Error('MULTI was discarded')
      const [time1, reply, time2, value, expireAt] = results as Array<[Error | null, unknown]>
      const err = reply?.[0]
      if (err instanceof Error && err.message.startsWith('NOSCRIPT') && attempt < 3) continue
      for (const entry of results) if (entry[0] !== null) throw entry[0]
      return { reply: reply?.[1], beforeUs: timeMicros(time1?.[1]), afterUs: timeMicros(time2?.[1]), value: value?.[1], expireAtMs: expireAt?.[1] }
    }
  }
}

/** lua/token-bucket.lua (or the TOLLGATE_TEST_LUA text) run directly. */
export class ScriptRunner {
  readonly #runner: LuaRunner

  constructor (redis: Redis, lua: string = LUA) {
    this.#runner = new LuaRunner(redis, lua)
  }

  async raw (specs: readonly ScriptSpec[], consume: boolean): Promise<unknown> {
    const [keys, args] = split(specs, consume)
    return await this.#runner.eval(keys, args)
  }

  /** The reply: one integer per bucket. */
  async run (specs: readonly ScriptSpec[], consume: boolean): Promise<number[]> {
    return parseValues(await this.raw(specs, consume), specs.length)
  }

  /** The reply, with Redis's clock read just before and just after the script. */
  async timed (specs: readonly ScriptSpec[], consume: boolean, read?: string): Promise<TimedReply> {
    const [keys, args] = split(specs, consume)
    const { reply, beforeUs, afterUs, value, expireAtMs } = await this.#runner.timed(keys, args, read)
    return { values: parseValues(reply, specs.length), beforeUs, afterUs, value, expireAtMs }
  }
}

/** The clocked copy of the token-bucket script (see withClock) run directly. */
export class ClockedScriptRunner {
  readonly #runner: LuaRunner

  constructor (redis: Redis, lua: string = LUA) {
    this.#runner = new LuaRunner(redis, withClock(lua))
  }

  async run (specs: readonly ScriptSpec[], consume: boolean): Promise<ClockedReply> {
    const [keys, args] = split(specs, consume)
    const reply = parseValues(await this.#runner.eval(keys, args), specs.length + 1, true)
    return { values: reply.slice(0, specs.length), nowUs: reply[specs.length] as number }
  }
}

function split (specs: readonly ScriptSpec[], consume: boolean): [string[], Array<string | number>] {
  const args = scriptArgs(specs, consume)
  return [args.slice(0, specs.length) as string[], args.slice(specs.length)]
}

/** lua/lease.lua's reply, each element converted from what Redis returned. */
export interface LeaseScriptReply {
  taken: number
  nowUs: number
  remaining: number
  fullInUs: number
  waitUs: number
  /** Tokens the bucket accepted back. */
  given: number
}

/**
 * One lease call: bucket shape, least and most to take, tokens given back
 * first, and the full-at time the giver's own call left (0: none).
 */
export interface LeaseCall extends Shape {
  key: string
  least: number
  most: number
  back: number
  from?: number
  /** ARGV[7] '1': decide as the call would, writing nothing. */
  peek?: boolean
}

/** lua/lease.lua (or the TOLLGATE_TEST_LEASE_LUA text) run directly. */
export class LeaseRunner {
  readonly #runner: LuaRunner

  constructor (redis: Redis, lua: string = LEASE_LUA) {
    this.#runner = new LuaRunner(redis, lua)
  }

  async run (call: LeaseCall): Promise<LeaseScriptReply> {
    return parseLeaseReply(await this.#runner.eval([call.key], leaseArgs(call)))
  }

  /** The reply, with Redis's clock read just before and just after the script (see LuaRunner.timed). */
  async timed (call: LeaseCall): Promise<LeaseScriptReply & { beforeUs: number, afterUs: number }> {
    const { reply, beforeUs, afterUs } = await this.#runner.timed([call.key], leaseArgs(call))
    return { ...parseLeaseReply(reply), beforeUs, afterUs }
  }
}

function leaseArgs (call: LeaseCall): Array<string | number> {
  const args: Array<string | number> = [call.capacity, call.refillPerSecond, call.least, call.most, call.back, call.from ?? 0]
  if (call.peek === true) args.push('1')
  return args
}

/** Checks the shape and element types of a lease reply; throws on anything unexpected. */
function parseLeaseReply (reply: unknown): LeaseScriptReply {
  if (!Array.isArray(reply) || reply.length !== 6) throw new Error(`unexpected lease reply ${JSON.stringify(reply)}`)
  const [taken, nowUs, remaining, fullInUs, waitUs, given] = reply as unknown[]
  if (typeof taken !== 'string' || typeof remaining !== 'string' || typeof given !== 'string' || !Number.isSafeInteger(nowUs) ||
    !Number.isSafeInteger(fullInUs) || !Number.isSafeInteger(waitUs)) {
    throw new Error(`unexpected lease reply ${JSON.stringify(reply)}`)
  }
  return { taken: Number(taken), nowUs: nowUs as number, remaining: Number(remaining), fullInUs: fullInUs as number, waitUs: waitUs as number, given: Number(given) }
}

/**
 * Scripts Redis has run since it started or since CONFIG RESETSTAT (EVALSHA
 * and EVAL, from INFO commandstats): each store call of lib is one script,
 * two the first time (EVALSHA answered NOSCRIPT, then EVAL). Counts every
 * client's calls, so a test that compares two readings needs a Redis of its own.
 */
export async function scriptCalls (redis: Redis): Promise<number> {
  const info = await redis.info('commandstats')
  let calls = 0
  for (const command of ['evalsha', 'eval']) {
    const match = new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info)
    if (match !== null) calls += Number(match[1])
  }
  return calls
}

/**
 * xorshift32: small, and the same sequence for the same seed on every
 * machine, so a failing seed can be replayed.
 */
export function randomSource (seed: number): () => number {
  let state = (seed >>> 0) === 0 ? 0x9e3779b9 : seed >>> 0
  return () => {
    state ^= state << 13
    state >>>= 0
    state ^= state >>> 17
    state ^= state << 5
    state >>>= 0
    return state / 0x1_0000_0000
  }
}

/** A client hash tag no other test or run uses; keys built on it share one cluster slot. */
export function uniqueTag (label: string): string {
  return `{${label}-${process.pid}-${randomBytes(4).toString('hex')}}`
}

/** A bucket key no other test or run uses. */
export function uniqueKey (label: string): string {
  return `test:${uniqueTag(label)}:bucket`
}

/** The text of lua/token-bucket-ext.lua; TOLLGATE_TEST_EXT_LUA=<file> swaps in another, as above. */
export const EXT_LUA = readFileSync(process.env.TOLLGATE_TEST_EXT_LUA ?? new URL('../../lua/token-bucket-ext.lua', import.meta.url), 'utf8')

/** One call of lua/token-bucket-ext.lua. */
export interface ExtCall extends ScriptSpec {
  mode: '0' | '1' | '2'
  maxWaitUs: number
  lockout?: { after: number, withinMs: number, forMs: number }
}

/** The clocked copy of lua/token-bucket-ext.lua run directly: { value, extra } and Redis's clock. */
export class ClockedExtRunner {
  readonly #runner: LuaRunner

  constructor (redis: Redis, lua: string = EXT_LUA) {
    this.#runner = new LuaRunner(redis, withClock(lua))
  }

  async run (call: ExtCall): Promise<{ value: number, extra: number, nowUs: number }> {
    const step = 1e6 / call.refillPerSecond
    const window = call.capacity * step
    const reply = parseValues(await this.#runner.eval([call.key, `${call.key}!lockout`], [
      call.mode, window, call.cost * step, call.cost * 1e6 / call.refillPerSecond, window + call.maxWaitUs,
      call.lockout?.after ?? 0, call.lockout?.withinMs ?? 0, (call.lockout?.forMs ?? 0) * 1000
    ]), 3, true)
    return { value: reply[0] as number, extra: reply[1] as number, nowUs: reply[2] as number }
  }
}

/**
 * The plain token bucket with reservations and a lockout, from their
 * definitions: a consume that may wait takes its tokens into debt, at most
 * `maxWaitUs` of refill deep, and waits until the debt is refilled; after
 * `after` denied consumes within `withinMs` of the first of them the
 * client is blocked for `forMs`, and counting starts again after it (a
 * denial `withinMs` or more after the first starts a new count).
 */
export class ReferenceHold {
  readonly bucket: ReferenceBucket
  readonly maxWaitUs: number
  readonly lockout: { after: number, withinMs: number, forMs: number } | undefined
  count = 0
  /** The first denial of the count, microseconds. */
  firstUs = -Infinity
  /** Counts that ended with their period, before a block. */
  lapsed = 0
  blockedUntil = -Infinity

  constructor (shape: Shape, maxWaitUs: number, lockout?: { after: number, withinMs: number, forMs: number }) {
    this.bucket = new ReferenceBucket(shape)
    this.maxWaitUs = maxWaitUs
    this.lockout = lockout
  }

  /** Tokens the call may go below zero by. */
  slack (mode: string): number {
    return mode === '2' ? this.maxWaitUs * this.bucket.refillPerSecond / 1e6 : 0
  }

  decide (nowUs: number, cost: number, mode: '0' | '1' | '2', allowed: boolean): { locked: boolean, delayUs: number } {
    this.bucket.advance(nowUs)
    if (nowUs < this.blockedUntil) return { locked: true, delayUs: 0 }
    if (allowed) {
      const delayUs = Math.max(0, (cost - this.bucket.tokens) / this.bucket.refillPerSecond * 1e6)
      if (mode !== '0') this.bucket.spend(cost)
      return { locked: false, delayUs }
    }
    if (this.lockout === undefined || mode === '0') return { locked: false, delayUs: 0 }
    if (this.count === 0 || nowUs - this.firstUs >= this.lockout.withinMs * 1000) {
      if (this.count > 0) this.lapsed++
      this.count = 0
      this.firstUs = nowUs
    }
    this.count++
    if (this.count < this.lockout.after) return { locked: false, delayUs: 0 }
    this.count = 0
    this.blockedUntil = nowUs + this.lockout.forMs * 1000
    return { locked: true, delayUs: 0 }
  }
}
