import type { StoreClient } from './client.js'
import type { StoreError } from './errors.js'
import type { Script } from './script.js'
/** One bucket of one decision. */
export interface BucketSpec {
  key: string
  capacity: number
  refillPerSecond: number
  cost: number
}

/** A bucket after a decision. */
export interface BucketState {
  /** Tokens left, fractions kept. */
  remaining: number
  /** Microseconds until the bucket is full again. */
  fullInUs: number
  /** 0 when this bucket could afford its cost, else microseconds until it can. */
  waitUs: number
}

export interface StoreReply {
  /** True when every bucket could afford its cost (and, when consuming, all were spent). */
  allowed: boolean
  buckets: BucketState[]
}

/**
 * What a reserve left in one bucket, to be sent back with its settlement:
 * lua/settle.lua cuts the refund to what the reservation's part of the
 * bucket still holds (read its header).
 */
export interface ReserveMark {
  /** The epoch of refunds the reserve ran in: its start, microseconds of the store's clock. */
  epoch: number
  /** The bucket's full-at time after the reserve, on the epoch's clock, microseconds. */
  mark: number
  /** The time the reservation's own cost would have refilled by, microseconds of the store's clock (whole). */
  floor: number
}

/** A reserve's reply: the decision, and when it was allowed, one mark per bucket. */
export interface ReserveReply extends StoreReply {
  marks: ReserveMark[]
}

/**
 * A bucket's state from the script's reply value (see lua/token-bucket.lua):
 * >= 0, the microseconds until full of a bucket that could afford its cost;
 * < 0, minus the microseconds until it can.
 */
export function bucketState (value: number, spec: BucketSpec): BucketState {
  const step = 1e6 / spec.refillPerSecond
  if (value >= 0) return { remaining: spec.capacity - value / step, fullInUs: value, waitUs: 0 }
  const fullInUs = (spec.capacity - spec.cost) * step - value
  return { remaining: spec.capacity - fullInUs / step, fullInUs, waitUs: -value }
}

/**
 * Decides one or several buckets of one client at once, all or nothing:
 * either every bucket can afford its cost and (when `consume`) all are spent,
 * or none is touched. A store that sends the call later (RedisStore's
 * batches, queued behind a call in flight) calls `sent` when it does,
 * and one that sends it at once, at once; neither calls it for a call that
 * fails before it is sent.
 */
export interface Store {
  decide (specs: readonly BucketSpec[], consume: boolean, sent?: () => void): Promise<StoreReply>
  /**
   * `decide` answered through callbacks, for a store that has them
   * (RedisStore): exactly one of `resolve` and `reject` runs, once, and may
   * run before it returns. It spares the decision path a promise, and the
   * promise's own `then`, per decision.
   */
  decideWith? (specs: readonly BucketSpec[], consume: boolean, sent: (() => void) | undefined,
    resolve: (reply: StoreReply) => void, reject: (err: unknown) => void): void
  reset (key: string): Promise<void>
  /** Called when the breaker opens: a chance to repair routing (Redis Cluster). */
  recover? (): void
}

/** Denials that block a client for a while (a policy's `lockout`). */
export interface LockoutSpec {
  /** Denials that start a block. */
  after: number
  /** The counting period, from the first denial, whole ms. */
  withinMs: number
  /** The block, whole ms. */
  forMs: number
}

/**
 * One bucket decided by lua/token-bucket-ext.lua: with reservations
 * (`maxWaitUs` > 0) and/or a lockout.
 */
export interface ExtSpec extends BucketSpec {
  /** The policy's `maxWaitMs` in microseconds (0: none); fixes the clamp's horizon. */
  maxWaitUs: number
  /** Whether this consume may wait for its tokens (false: decided as without waiting). */
  mayWait: boolean
  lockout: LockoutSpec | undefined
}

/** A decision of lua/token-bucket-ext.lua. */
export interface ExtReply {
  allowed: boolean
  bucket: BucketState
  /** Microseconds to wait before using reserved tokens (0: now). */
  delayUs: number
  /** Denied by a lockout: blocked, or this denial started the block. */
  locked: boolean
}

/** The refund key of a bucket key, kept by lua/settle.lua (same hash tag, so the same Cluster slot). */
export function refundKey (key: string): string {
  return `${key}!settle`
}

/** The lockout key of a bucket key (same hash tag, so the same Cluster slot). */
export function lockKey (key: string): string {
  return `${key}!lockout`
}

/** The reply of lua/token-bucket-ext.lua, `{ value, extra }`, read for `spec`. */
export function extReply (value: number, extra: number, spec: BucketSpec): ExtReply {
  const allowed = value >= 0
  return { allowed, bucket: bucketState(value, spec), delayUs: allowed ? extra : 0, locked: !allowed && extra === 1 }
}

/** A batch of tokens taken from one bucket. */
export interface LeaseReply {
  /** Tokens taken: 0 when the bucket could not afford the least amount. */
  taken: number
  /** Redis's clock at the call, microseconds. */
  nowUs: number
  bucket: BucketState
}

/** A store that can lend tokens in batches (see lua/lease.lua). */
export interface LeaseStore {
  /**
   * `giveBackFrom`: the full-at time the call that took the given-back
   * tokens left (lua/lease.lua, ARGV[6]). `peek`: decide as the call would,
   * writing nothing; the reply's bucket is then as the call would find it.
   */
  lease (spec: BucketSpec, most: number, giveBack: number, giveBackFrom: number, peek?: boolean): Promise<LeaseReply>
}

/**
 * Whole tokens for display: the floor, after adding a thousandth of a token
 * that absorbs the microsecond rounding of the stored full-at time (each
 * write rounds it up by less than a microsecond, so 2 tokens may come back
 * as 1.999994).
 */
export function wholeTokens (tokens: number): number {
  return Math.max(0, Math.floor(tokens + 1e-3))
}

/**
 * What the core calls on a remote store (lib/core/remote.ts): decisions,
 * lockouts and waits, reservations and their settlement, leases, the
 * scripts of other limit kinds (`run`), the start-up check, and the connection the fleet's
 * changes travel on. RedisStore is the one a limiter with `redis` builds;
 * createCore takes another through its runtime (lib/core/limiter.ts).
 */
export interface RemoteStore extends Store, LeaseStore {
  decideExt (spec: ExtSpec, consume: boolean): Promise<ExtReply>
  reserve (specs: readonly BucketSpec[]): Promise<ReserveReply>
  /** Applies each bucket's change (µs of refill), cut by its reserve's mark; replies what each applied. */
  settle (specs: readonly BucketSpec[], changes: readonly number[], marks: readonly ReserveMark[]): Promise<number[]>
  /**
   * Runs a script declared outside the store (lib/store/script.ts) on
   * `keys` (one hash tag: a Cluster routes the call by them) with `args`,
   * as the store runs its own; the reply, in RESP2's shapes, is the
   * caller's to read.
   */
  run (script: Script, keys: readonly string[], args: ReadonlyArray<string | number>): Promise<unknown>
  /** Loads the scripts and checks they run at `key`: the error when they cannot, else undefined. */
  warm (key: string): Promise<StoreError | undefined>
  /** The store's address, for log lines (never a password). */
  readonly target: string
  /**
   * The connection the fleet's resets and refunds travel on
   * (lib/core/invalidation.ts); undefined for a store that no other
   * process shares, which has no fleet to tell.
   */
  readonly client: StoreClient | undefined
}
