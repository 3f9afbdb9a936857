import { commandRefused, notConnectedYet, scriptsRefused, StoreError } from './errors.js'
import {
  bucketState, extReply, lockKey, refundKey, type BucketSpec, type BucketState, type ExtReply, type ExtSpec, type LeaseReply, type ReserveMark,
  type RemoteStore, type ReserveReply, type StoreReply
} from './store.js'
import type { RedisClient, StoreClient } from './client.js'
import { storeClient } from './clients/index.js'
import { isNumbers, lengthOf, numberAt, numberOf, unexpectedReply } from './reply.js'
import { loadedScripts, script, type Script } from './script.js'

// Each script is sent by its SHA-1 (EVALSHA), computed once; a NOSCRIPT
// answer (a script flush, a restart, a failover to a replica that never
// ran the script, a new Cluster node) is answered by one EVAL of the
// source, routed by its keys like the EVALSHA, which also loads the script
// on that node. Only NOSCRIPT is retried: any other error is the call's.
// What goes to Redis goes through the client's StoreClient
// (lib/store/client.ts), whichever client it is. The store's own scripts
// are declared here, in the order start-up loads them; a limit kind's
// script is declared by its own file (lib/store/script.ts) and run with
// `run`, through the same machinery.

/** lua/token-bucket.lua. */
export const TOKEN_BUCKET: Script = script('token-bucket.lua')
/** lua/token-bucket-batch.lua. */
export const TOKEN_BUCKET_BATCH: Script = script('token-bucket-batch.lua')
/** lua/lease.lua. */
export const LEASE: Script = script('lease.lua')
/** lua/settle.lua. */
export const SETTLE: Script = script('settle.lua')
/** lua/token-bucket-ext.lua. */
export const TOKEN_BUCKET_EXT: Script = script('token-bucket-ext.lua')
/** lua/probe.lua. */
export const PROBE: Script = script('probe.lua')

/** Most decisions of one batched script call, by default. */
export const DEFAULT_BATCH_MAX = 64

/**
 * Longest a decision waits queued behind a call in flight before its
 * queue is sent anyway, ms (see RedisStore). A reply on a healthy Redis
 * takes well under a millisecond: a call out for longer is slow, and the
 * decisions behind it should not pay for it.
 */
export const QUEUE_WAIT_MS = 2

/** How a RedisStore sends plain decisions: batched (at most `maxDecisions` a call), or one call each (`false`). */
export interface RedisStoreOptions {
  batch?: false | { maxDecisions?: number | undefined } | undefined
}

/** A plain decision waiting to be sent (see RedisStore). */
export interface Pending {
  readonly specs: readonly BucketSpec[]
  readonly consume: boolean
  readonly sent: (() => void) | undefined
  readonly resolve: (reply: StoreReply) => void
  readonly reject: (err: unknown) => void
}

/**
 * A batch refused by an error about its content, which Redis replied with
 * (a key of another type, a value that is not a number, a script error;
 * never a server that cannot serve, nor one that cannot run the scripts or
 * a command inside them): it wrote nothing, and each of its decisions is
 * sent alone, to fail or not as it would have without the others.
 */
const CONTENT_ERROR = /^(?:ERR|WRONGTYPE)\b/

function refusedContent (err: unknown): boolean {
  return err instanceof Error && CONTENT_ERROR.test(err.message) && !scriptsRefused(err) && !commandRefused(err)
}

/**
 * Appends one bucket's arguments of lua/token-bucket.lua: its window, the
 * need of its cost and how far spending moves its full-at time, in
 * microseconds, computed exactly as lib/store/memory-store.ts computes them.
 */
export function pushBucketArgs (args: Array<string | number>, spec: BucketSpec): void {
  const step = 1e6 / spec.refillPerSecond
  args.push(spec.capacity * step, spec.cost * step, spec.cost * 1e6 / spec.refillPerSecond)
}

// Script names, for the errors of replies of another shape.
const SINGLE = TOKEN_BUCKET.name
const BATCH = TOKEN_BUCKET_BATCH.name
const EXT = TOKEN_BUCKET_EXT.name
const LEASE_S = LEASE.name
const SETTLE_S = SETTLE.name

/**
 * One request's decision from an array reply of one integer per bucket,
 * from `at`: lua/token-bucket.lua's for several buckets, or its part of
 * lua/token-bucket-batch.lua's flat reply.
 */
function bucketsReply (reply: unknown, at: number, specs: readonly BucketSpec[], script: string): StoreReply {
  const buckets: BucketState[] = []
  let allowed = true
  let i = at
  for (const spec of specs) {
    const value = numberAt(reply, i++, script)
    if (value < 0) allowed = false
    buckets.push(bucketState(value, spec))
  }
  return { allowed, buckets }
}

/**
 * Answers each decision of a batch from lua/token-bucket-batch.lua's flat
 * reply, `buckets` numbers in all. Every decision's numbers are checked
 * before any is answered: a reply of another shape fails them all alike.
 */
export function answerBatch (part: readonly Pending[], buckets: number, reply: unknown): void {
  if (!isNumbers(reply, buckets)) {
    const err = unexpectedReply(BATCH, reply)
    for (const p of part) p.reject(err)
    return
  }
  let at = 0
  for (const p of part) {
    p.resolve(bucketsReply(reply, at, p.specs, BATCH))
    at += p.specs.length
  }
}

/** lua/token-bucket.lua's reply: one integer per bucket (a bare integer for one bucket). */
function storeReply (reply: unknown, specs: readonly BucketSpec[]): StoreReply {
  const [only] = specs
  if (specs.length === 1 && only !== undefined) {
    const value = numberOf(reply, SINGLE)
    return { allowed: value >= 0, buckets: [bucketState(value, only)] }
  }
  return bucketsReply(reply, 0, specs, SINGLE)
}

/**
 * The commands lua/probe.lua found refused inside a script, as a store
 * error whose cause is the first refusal; undefined when none was (an
 * error of another kind, say WRONGTYPE on its key, says the server runs
 * the scripts).
 */
function refusalOf (failed: readonly unknown[]): StoreError | undefined {
  const refused: string[] = []
  let cause: Error | undefined
  for (let i = 0; i + 1 < failed.length; i += 2) {
    const err = new Error(String(failed[i + 1]))
    if (!commandRefused(err)) continue
    refused.push(String(failed[i]))
    cause ??= err
  }
  return cause === undefined ? undefined : new StoreError('TOLLGATE_STORE_ERROR', `store call failed: ${cause.message}`, { cause, refused })
}

/**
 * Where a client connects, for log lines: `host:port`, `unix:<path>`, the
 * sentinels and the master's name, or a Cluster's seed nodes. Never a user
 * name or a password.
 */
export function storeTarget (client: RedisClient): string {
  return storeClient(client).target
}

/** lua/token-bucket.lua's arguments for one decision: its keys, then whether to spend, then each bucket's numbers. */
function singleArgs (specs: readonly BucketSpec[], consume: boolean): Array<string | number> {
  const args: Array<string | number> = []
  for (const spec of specs) args.push(spec.key)
  args.push(consume ? '1' : '0')
  for (const spec of specs) pushBucketArgs(args, spec)
  return args
}

/** Settles a decision sent alone with lua/token-bucket.lua's reply (a reply of another shape rejects it). */
export function answerAlone (p: Pending, reply: unknown): void {
  let answer: StoreReply
  try {
    answer = storeReply(reply, p.specs)
  } catch (err) {
    p.reject(err)
    return
  }
  p.resolve(answer)
}

/**
 * The decisions of a turn on a Cluster, grouped by the keys they name: a
 * call holds the decisions of one set of keys, as a call of one decision
 * does. Grouping by slot would batch more only when clients share a slot,
 * which is rare among 16 384 (bench/RESULTS-cluster.md: one call per
 * decision either way), and it breaks under resharding: while a slot
 * migrates, a call whose keys are split between the two masters is refused
 * with TRYAGAIN (ioredis retries it every 100 ms, far past any deadline),
 * where a call of one client's keys is sent on with ASK and decided, as it
 * would be without batching. The group's name joins the keys: should two
 * sets join alike, both begin with keys of one hash tag, so the call
 * still stays on one slot.
 */
function byKeys (pending: readonly Pending[]): IterableIterator<Pending[]> {
  const groups = new Map<string, Pending[]>()
  for (const p of pending) {
    // A decision has one bucket at least: one key is the common case, named without a copy.
    const [first] = p.specs
    const name = p.specs.length === 1 && first !== undefined ? first.key : p.specs.map((spec) => spec.key).join('\n')
    const group = groups.get(name)
    if (group === undefined) groups.set(name, [p])
    else group.push(p)
  }
  return groups.values()
}

/** lua/settle.lua's keys: each bucket key, then its refund key. */
function settleKeys (specs: readonly BucketSpec[]): Array<string | number> {
  const keys: Array<string | number> = []
  for (const spec of specs) keys.push(spec.key, refundKey(spec.key))
  return keys
}

/**
 * Buckets in Redis, decided by lua/token-bucket.lua (leases by
 * lua/lease.lua), each call one EVALSHA.
 *
 * Plain decisions are sent by one rule: at once when no decision call of
 * this store is in flight, batched behind the calls that are.
 *
 * - Nothing in flight: the decision goes in a microtask, at the end of the
 *   callback that asked it, so a lone request's call leaves in the turn it
 *   was asked, with no wait for the end of the turn; the decisions that
 *   callback asked with it (a route's several checks, a Promise.all) go in
 *   the same call.
 * - A call in flight: the decision queues. When a call returns, the queue
 *   goes at the end of that turn (a setImmediate, which runs after the poll
 *   phase has read every socket that was ready, so it gathers the requests
 *   that arrived with the reply): while Redis works, the decisions that
 *   arrive meanwhile gather into the next call, so the busier the server,
 *   the larger its batches, without a timer or a wait on an idle one.
 * - A decision never waits behind a slow call for longer than
 *   QUEUE_WAIT_MS: then the queue is sent anyway, pipelined behind the
 *   call, at the end of that turn. Its deadline (lib/core/guard.ts) counts
 *   from its own call being sent, as every decision's does: the wait in the
 *   queue, the app's time or a bound of a few milliseconds, is not counted
 *   as Redis's lateness, and a Redis that hangs fails each queued decision
 *   at its own deadline, QUEUE_WAIT_MS later at most than one sent at once.
 *
 * A flush sends one call of lua/token-bucket-batch.lua per `maxDecisions`
 * (on a Cluster, per set of keys: byKeys), or of lua/token-bucket.lua for a
 * decision alone, all pipelined on the one connection; a decision is `sent`
 * when its call is. Calls in flight on one connection are answered in the
 * order sent, so the decisions are decided in the order asked.
 *
 * A command is only sent while the client is connected: when it is not,
 * the call fails at once instead of waiting in the client's offline queue.
 * A client that nobody connected (ioredis's `lazyConnect`, status 'wait')
 * is asked to connect by the first call that finds it so: the limiter
 * would otherwise never reach Redis, and fail over for ever.
 */
export class RedisStore implements RemoteStore {
  readonly #redis: StoreClient
  /** The client's address, for log lines (storeTarget). */
  readonly target: string
  /** Most decisions of one batch; 0: no batching, one call per decision. */
  readonly #batchMax: number
  /** Decisions to be sent by `#flush`. */
  #pending: Pending[] = []
  /** `#flush` is scheduled: in a microtask or at the end of the turn. */
  #scheduled = false
  /** Decision calls sent and not answered yet. */
  #inFlight = 0
  /** Sends the queue once it has waited QUEUE_WAIT_MS behind a call in flight; undefined when not armed. */
  #waitTimer: ReturnType<typeof setTimeout> | undefined
  /** The client was seen ready once: its failures to connect from then on are Redis's (see #down). */
  #connected = false
  /** The last error of a client never connected yet, given again while its message holds (see #down). */
  #connecting: StoreError | undefined

  constructor (client: RedisClient, options: RedisStoreOptions = {}) {
    this.#redis = storeClient(client)
    this.target = this.#redis.target
    this.#batchMax = options.batch === false ? 0 : options.batch?.maxDecisions ?? DEFAULT_BATCH_MAX
  }

  /** What the store sends through, for the fleet's change channel (lib/core/invalidation.ts). */
  get client (): StoreClient {
    return this.#redis
  }

  /** EVALSHA `script`; on NOSCRIPT, one EVAL of its source. `args` holds the keys, then the arguments. */
  async #run (script: Script, numKeys: number, args: Array<string | number>): Promise<unknown> {
    try {
      return await this.#redis.evalsha(script.sha, numKeys, args)
    } catch (err) {
      if (!this.#redis.isNoScript(err)) throw err
      return await this.#redis.eval(script.lua, numKeys, args)
    }
  }

  /** Throws why a call cannot be sent now (asking a lazyConnect client to connect). */
  #ready (): void {
    if (this.#redis.status !== 'ready') throw this.#down()
    this.#connected = true
  }

  /**
   * `script` on `keys` (one slot on a Cluster: it is routed by them) with
   * `args`, for a script declared outside the store (lib/store/script.ts):
   * EVALSHA with NOSCRIPT answered by EVAL when it is kept loaded, else
   * one EVAL. The reply comes in RESP2's shapes, whatever the client; the
   * caller reads it.
   */
  async run (script: Script, keys: readonly string[], args: ReadonlyArray<string | number>): Promise<unknown> {
    this.#ready()
    const all: Array<string | number> = [...keys, ...args]
    if (!script.loaded) return await this.#redis.eval(script.lua, keys.length, all)
    return await this.#run(script, keys.length, all)
  }

  /**
   * The error of a call that finds the client not connected. Until the
   * client has been seen ready once, it is still making its first
   * connection (lib/store/errors.ts notConnectedYet: not counted by the
   * breaker).
   */
  #down (): StoreError {
    const redis = this.#redis
    const error = this.#connected ? (message: string) => new StoreError('TOLLGATE_STORE_DOWN', message) : this.#notConnectedYet
    if (redis.status !== 'wait') return error(`Redis at ${this.target} is not connected (status ${redis.status})`)
    redis.connect()
    return error(`Redis at ${this.target} was not connected (a lazyConnect client, status wait): tollgate asked it to connect`)
  }

  /**
   * One error for every call while a client that never connected stays in
   * one state: a Redis unreachable from the start, with the breaker not
   * counting these failures, would otherwise cost every request a new
   * error and its stack.
   */
  readonly #notConnectedYet = (message: string): StoreError => {
    if (this.#connecting?.message !== message) this.#connecting = notConnectedYet(message)
    return this.#connecting
  }

  /**
   * A plain decision, in one promise: see decideWith. `sent` is called when
   * the call carrying it is sent (not when it fails before that: the client
   * is not connected).
   */
  decide (specs: readonly BucketSpec[], consume: boolean, sent?: () => void): Promise<StoreReply> {
    return new Promise<StoreReply>((resolve, reject) => { this.decideWith(specs, consume, sent, resolve, reject) })
  }

  /**
   * A plain decision, answered through `resolve` or `reject` (exactly one,
   * once; at once when the client is not connected): sent at once or
   * batched (see the class), or in a call of its own when batching is off.
   * The guard's path: no promise of its own.
   */
  decideWith (specs: readonly BucketSpec[], consume: boolean, sent: (() => void) | undefined,
    resolve: (reply: StoreReply) => void, reject: (err: unknown) => void): void {
    if (this.#redis.status !== 'ready') return reject(this.#down())
    this.#connected = true
    const p: Pending = { specs, consume, sent, resolve, reject }
    if (this.#batchMax === 0) return this.#alone(p, true)
    this.#pending.push(p)
    if (this.#scheduled) return
    if (this.#inFlight === 0) {
      this.#scheduled = true
      queueMicrotask(this.#flush)
      return
    }
    this.#waitTimer ??= setTimeout(this.#waited, QUEUE_WAIT_MS).unref()
  }

  /** Sends the queue at the end of this turn (see the class). */
  #schedule (): void {
    this.#scheduled = true
    setImmediate(this.#flush)
  }

  /**
   * QUEUE_WAIT_MS after a decision queued behind a call: the queue, if it
   * is still waiting, goes anyway. A queue formed since the timer was armed
   * may go a little early: one smaller batch, which no decision waits for.
   */
  readonly #waited = (): void => {
    this.#waitTimer = undefined
    if (this.#pending.length > 0 && !this.#scheduled) this.#schedule()
  }

  /** A decision call returned: the queue behind it goes at the end of this turn. */
  #returned (): void {
    this.#inFlight--
    if (this.#pending.length > 0 && !this.#scheduled) this.#schedule()
  }

  /** Sends the queue: by keys on a Cluster (see byKeys), `#batchMax` at most a call. */
  readonly #flush = (): void => {
    const pending = this.#pending
    this.#pending = []
    this.#scheduled = false
    if (this.#redis.status !== 'ready') {
      const err = this.#down()
      for (const p of pending) p.reject(err)
      return
    }
    if (!this.#redis.cluster) {
      this.#send(pending)
      return
    }
    for (const group of byKeys(pending)) this.#send(group)
  }

  /** Decisions that may share a call, in calls of at most `#batchMax`. */
  #send (group: Pending[]): void {
    const max = this.#batchMax
    for (let from = 0; from < group.length; from += max) {
      // Most turns fit in one call: no copy of the group for them.
      const part = group.length <= max ? group : group.slice(from, from + max)
      const [only] = part
      if (part.length === 1 && only !== undefined) this.#alone(only, true)
      else this.#batch(part)
    }
  }

  /**
   * One decision in a call of its own (`notify`: tell it it is sent),
   * settled straight from the client's promise: a lone request is the
   * common case at low load, and a promise of its own in between would
   * cost it one more promise and turn.
   */
  #alone (p: Pending, notify: boolean): void {
    if (notify) p.sent?.()
    const { specs } = p
    this.#evaluate(TOKEN_BUCKET, specs.length, singleArgs(specs, p.consume), (reply) => { answerAlone(p, reply) }, p.reject)
  }

  /**
   * EVALSHA `script`, on NOSCRIPT one EVAL of its source; the reply goes to
   * `answer`, any other error to `refused`. The call counts as in flight
   * until it is answered (see the class).
   */
  #evaluate (script: Script, numKeys: number, args: Array<string | number>, answer: (reply: unknown) => void, refused: (err: unknown) => void): void {
    const redis = this.#redis
    this.#inFlight++
    const answered = (reply: unknown): void => {
      this.#returned()
      answer(reply)
    }
    const failed = (err: unknown): void => {
      this.#returned()
      refused(err)
    }
    redis.evalsha(script.sha, numKeys, args).then(answered, (err: unknown) => {
      if (!redis.isNoScript(err)) return failed(err)
      redis.eval(script.lua, numKeys, args).then(answered, failed)
    })
  }

  /** `part` in one call of lua/token-bucket-batch.lua. */
  #batch (part: readonly Pending[]): void {
    const keys: string[] = []
    const index = new Map<string, number>()
    const argv: Array<string | number> = []
    let buckets = 0
    for (const { specs, consume } of part) {
      buckets += specs.length
      argv.push(consume ? '1' : '0', specs.length)
      for (const spec of specs) {
        let k = index.get(spec.key)
        if (k === undefined) {
          k = keys.push(spec.key)
          index.set(spec.key, k)
        }
        const step = 1e6 / spec.refillPerSecond
        argv.push(k, spec.capacity * step, spec.cost * step, spec.cost * 1e6 / spec.refillPerSecond)
      }
    }
    const args: Array<string | number> = keys
    for (const arg of argv) args.push(arg)
    const numKeys = index.size
    for (const p of part) p.sent?.()
    const answer = (reply: unknown): void => { answerBatch(part, buckets, reply) }
    const refused = (err: unknown): void => {
      if (refusedContent(err)) {
        for (const p of part) this.#alone(p, false)
        return
      }
      for (const p of part) p.reject(err)
    }
    this.#evaluate(TOKEN_BUCKET_BATCH, numKeys, args, answer, refused)
  }

  /** One bucket with reservations and/or a lockout, by lua/token-bucket-ext.lua. */
  async decideExt (spec: ExtSpec, consume: boolean): Promise<ExtReply> {
    this.#ready()
    const step = 1e6 / spec.refillPerSecond
    const window = spec.capacity * step
    const lockout = spec.lockout
    const mode = !consume ? '0' : spec.mayWait ? '2' : '1'
    const reply = await this.#run(TOKEN_BUCKET_EXT, 2, [
      spec.key, lockKey(spec.key), mode, window, spec.cost * step, spec.cost * 1e6 / spec.refillPerSecond, window + spec.maxWaitUs,
      lockout?.after ?? 0, lockout?.withinMs ?? 0, (lockout?.forMs ?? 0) * 1000
    ])
    return extReply(numberAt(reply, 0, EXT), numberAt(reply, 1, EXT), spec)
  }

  async lease (spec: BucketSpec, most: number, giveBack: number, giveBackFrom: number, peek = false): Promise<LeaseReply> {
    this.#ready()
    const reply = await this.#run(LEASE, 1, [spec.key, spec.capacity, spec.refillPerSecond, spec.cost, most, giveBack, giveBackFrom, peek ? '1' : '0'])
    return {
      taken: numberAt(reply, 0, LEASE_S),
      nowUs: numberAt(reply, 1, LEASE_S),
      bucket: { remaining: numberAt(reply, 2, LEASE_S), fullInUs: numberAt(reply, 3, LEASE_S), waitUs: numberAt(reply, 4, LEASE_S) }
    }
  }

  /** The reserve of lua/settle.lua: a consume that reads a bucket in debt as such; when allowed, each bucket's mark. */
  async reserve (specs: readonly BucketSpec[]): Promise<ReserveReply> {
    this.#ready()
    const args: Array<string | number> = settleKeys(specs)
    args.push('1')
    for (const spec of specs) pushBucketArgs(args, spec)
    const reply = await this.#run(SETTLE, 2 * specs.length, args)
    const n = specs.length
    const buckets = specs.map((spec, i) => bucketState(numberAt(reply, i, SETTLE_S), spec))
    // The marks follow the buckets' values, three a bucket, only when allowed.
    const allowed = lengthOf(reply, SETTLE_S) > n
    const marks: ReserveMark[] = []
    if (allowed) {
      for (let i = 0; i < n; i++) {
        const at = n + 3 * i
        marks.push({ epoch: numberAt(reply, at, SETTLE_S), mark: numberAt(reply, at + 1, SETTLE_S), floor: numberAt(reply, at + 2, SETTLE_S) })
      }
    }
    return { allowed, buckets, marks }
  }

  /** The settle of lua/settle.lua: each bucket's change in microseconds, and its reserve's mark; replies each one's microseconds until full. */
  async settle (specs: readonly BucketSpec[], changes: readonly number[], marks: readonly ReserveMark[]): Promise<number[]> {
    this.#ready()
    const args: Array<string | number> = settleKeys(specs)
    args.push('2')
    // One change and one mark per bucket: lib/core/settle.ts passes them so.
    for (const [i, spec] of specs.entries()) {
      const mark = marks[i]
      const change = changes[i]
      if (mark !== undefined && change !== undefined) args.push(spec.capacity * (1e6 / spec.refillPerSecond), change, mark.epoch, mark.mark, mark.floor)
    }
    const reply = await this.#run(SETTLE, 2 * specs.length, args)
    return specs.map((_, i) => numberAt(reply, i, SETTLE_S))
  }

  /**
   * A Cluster client keeps sending a slot to a master that hangs (its socket
   * stays open) until its slot map is refreshed, even after a replica took
   * over: refresh it whenever the breaker opens.
   */
  recover (): void {
    this.#redis.refresh()
  }

  /**
   * Loads every script kept loaded (lib/store/script.ts: the store's and
   * those of limit kinds declared elsewhere) on every master, which also
   * opens the connections, so the first decisions after start-up need
   * neither; then peeks at `key`
   * (a peek writes nothing), as a decision would, to learn whether this
   * server runs the scripts at all: SCRIPT LOAD succeeding does not show
   * that EVALSHA is allowed, nor SCRIPT LOAD failing that it is not. Then
   * runs lua/probe.lua on `key`, to learn whether it refuses a command
   * inside them (an ACL without TIME, a read-only replica: a peek runs no
   * write). Resolves with an error when the scripts or a command in them
   * are refused (lib/store/errors.ts scriptsRefused, commandRefused),
   * naming the refused commands; else undefined: other failures are the
   * failure modes' to cover, for a store that is not there yet.
   */
  async warm (key: string): Promise<StoreError | undefined> {
    await this.#redis.loadScripts(loadedScripts().map((s) => s.lua))
    try {
      await this.decide([{ key, capacity: 1, refillPerSecond: 1, cost: 1 }], false)
    } catch (cause) {
      if (scriptsRefused(cause)) return new StoreError('TOLLGATE_STORE_ERROR', `store call failed: ${cause.message}`, { cause })
    }
    return await this.#probe(key)
  }

  /** lua/probe.lua on `key`: the commands refused inside a script, if any, as warm's error. */
  async #probe (key: string): Promise<StoreError | undefined> {
    let failed: unknown[]
    try {
      this.#ready()
      // A flat array of names and errors, empty when every command ran.
      failed = [await this.#run(PROBE, 1, [key])].flat()
    } catch (cause) {
      // A key outside the user's ACL: the EVALSHA itself is refused.
      if (commandRefused(cause)) return new StoreError('TOLLGATE_STORE_ERROR', `store call failed: ${cause.message}`, { cause })
      return undefined
    }
    return refusalOf(failed)
  }

  async reset (key: string): Promise<void> {
    this.#ready()
    await this.#redis.del([key, lockKey(key), refundKey(key)])
  }
}
