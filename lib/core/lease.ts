import { realTime, type Clock, type Time } from './clock.js'
import { Deadlines } from './deadline.js'
import type { NonEmpty } from './lists.js'
import { Marks } from './marks.js'
import { wholeTokens, type BucketSpec, type LeaseReply } from '../store/store.js'
import type { Decision, Policy } from './types.js'

/** Lease settings of a policy: batch size and the longest a batch is kept. */
export interface LeaseOptions {
  tokens: number
  maxAgeMs: number
}


interface Lease {
  spec: BucketSpec
  /** Unspent tokens, before the decay below; lowered to what is usable at each spend. */
  left: number
  /** Clock when the call that took the batch was sent. */
  sentAt: number
  /** The bucket's tokens, outside any lease, right after the batch was taken. */
  bucketLeft: number
  /** Microseconds until the bucket was full, right after. */
  fullInUs: number
  /** The full-at time the call left in the key: names this lease in a give-back. */
  fullAtUs: number
}

/** Unspent, usable tokens of a lease going back to the bucket they came from. */
export interface GiveBack {
  spec: BucketSpec
  tokens: number
  /** See lua/lease.lua, ARGV[6]. */
  fullAtUs: number
}

/**
 * Token leases held by this app server: batches taken from Redis buckets
 * in one atomic call (lua/lease.lua) and spent here without a call.
 *
 * Why a lease decays. Its tokens left the bucket when it was taken, but
 * the bucket refills underneath: spent after a pause, they would come on
 * top of a full bucket, and the fleet would admit more than the bucket in
 * some window (capacity 10, 10/s, a lease of 10: one request, 1.2 s, then
 * 19 admitted within 4 ms). So the unspent tokens count as still in the
 * bucket. Right after the call the bucket held `bucketLeft`; `age` later,
 * measured from when the call was sent (so never less than the time since
 * the script ran), it holds at most bucketLeft + refill x age, and the
 * lease may spend only
 *     usable = min(left, capacity - min(capacity, bucketLeft + refill x age))
 * A give-back (renewal, close, a reply nobody waits for) returns only that
 * usable part: the decayed rest has come back by refill already.
 *
 * Proof that the fleet admits at most capacity + refill x w in any window
 * of length w (docs/design/algorithm.md, "Leases"). Let B be the bucket's tokens in Redis and
 * U_i the usable tokens of lease i, held anywhere in the fleet, taken by a
 * script that ran at r_i; V = B + sum of U_i.
 * (a) V grows only by refill. A refill raises B by at most refill per
 *     second. A decision by the token bucket admits c and lowers B by c. A
 *     lease call lowers B by what it took, admits the request's cost and
 *     keeps at most the rest. A spend first lowers `left` to usable, then
 *     admits c and lowers U by c. Decay, eviction and expiry lower U. A
 *     give-back moves tokens from U into B, capped at capacity. So the cost
 *     admitted in [t, t + w] is at most V(t) - V(t + w) + refill x w, which
 *     is at most capacity + refill x w once (b) holds.
 * (b) V <= capacity. For a held lease i let S_i(t) = min(capacity,
 *     bucketLeft_i + refill x (t - r_i)); the rule above gives
 *     U_i <= capacity - S_i. Let Y_i = B + the U_j of held leases taken
 *     after i. Claim: Y_i <= S_i. Then for the youngest lease Y = B <=
 *     capacity, and going to older ones Y_(i-1) = Y_i + U_i <= S_i +
 *     capacity - S_i = capacity, so V <= capacity.
 *     Y_i <= capacity by the same induction over the younger leases. At
 *     r_i, Y_i = B = bucketLeft_i. After r_i, Y_i grows only by refill:
 *     any take lowers it (a later lease of another server lowers B by more
 *     than it keeps, which only tightens the bounds of older leases),
 *     spends and decay lower it, and a give-back by a younger lease moves
 *     tokens within Y_i. A give-back by i or an older lease would raise
 *     it; lua/lease.lua refuses those: a give-back is accepted only while
 *     the key holds the very full-at time the giver's own call left. A
 *     take moves that time later, and an accepted give-back leaves it later
 *     than before the giver's take (the cost stays spent), so after another
 *     call has taken, the key holds the giver's value again only by an
 *     exact microsecond coincidence of sums of refill steps.
 * Timing: an admission by Redis happens when its script runs, somewhere
 * in the round trip; seen from the app, a window may hold one round trip
 * of refill more. A refused give-back and the decay cost under-admission
 * only, measured in docs/design/algorithm.md ("Leases").
 *
 * With the denial cache on, a client that a lease call denies is denied in
 * this process until a whole batch (`tokens`) could be taken, not just its
 * cost: a flood then costs one call per batch instead of one per token, at
 * the price of turning the client away for up to (tokens - cost) / refill
 * seconds longer than Redis would.
 *
 * A reset of the bucket, here or on another app server (lib/core/invalidation.ts),
 * drops its lease: the reset bucket is full, and tokens taken from it
 * before would come on top. A batch whose call was sent before the reset
 * was learnt, landing after it, is not kept either (lib/core/marks.ts). A refund
 * leaves leases alone: it gives tokens to the bucket, and a lease spends
 * only what it took.
 *
 * Size-capped: past `maxKeys` the oldest lease is dropped and its unspent
 * tokens are lost to the bucket until they refill.
 */
export class LeaseBook {
  readonly #leases = new Map<string, Lease>()
  readonly #maxKeys: number
  readonly #resets: Marks
  readonly clock: Clock

  constructor (maxKeys: number, clock: Clock = realTime.now) {
    this.#maxKeys = maxKeys
    this.#resets = new Marks(maxKeys)
    this.clock = clock
  }

  /** Spends `cost` from a fresh enough lease of this bucket; undefined when there is none or it holds too little. */
  spend (policy: Policy, spec: BucketSpec, maxAgeMs: number): Decision | undefined {
    return this.#pay(policy, spec, maxAgeMs, true)
  }

  /** What `spend` would answer, spending nothing (a peek). */
  peek (policy: Policy, spec: BucketSpec, maxAgeMs: number): Decision | undefined {
    return this.#pay(policy, spec, maxAgeMs, false)
  }

  /** What the next lease call of this bucket gives back first (LeaseFlights), keeping the lease; undefined without one (or one of another plan). */
  held (spec: BucketSpec): GiveBack | undefined {
    const lease = this.#leases.get(spec.key)
    return lease === undefined || !samePlan(lease.spec, spec) ? undefined : this.#giveBack(lease)
  }

  #pay (policy: Policy, spec: BucketSpec, maxAgeMs: number, spend: boolean): Decision | undefined {
    const lease = this.#leases.get(spec.key)
    if (lease === undefined || !samePlan(lease.spec, spec)) return undefined
    const age = this.clock() - lease.sentAt
    if (age >= maxAgeMs) return undefined
    const usable = usableOf(lease, age)
    if (usable < spec.cost) return undefined
    const left = spend ? usable - spec.cost : usable
    if (spend) lease.left = left
    return {
      allowed: true,
      limit: policy.capacity,
      remaining: wholeTokens(Math.min(policy.capacity, bucketAtMost(lease, age) + left)),
      resetMs: Math.max(0, lease.fullInUs / 1000 - age),
      retryAfterMs: 0,
      source: 'cache',
      bucket: policy.bucket
    }
  }

  /** Takes the lease of a bucket out, with its usable tokens to give back; undefined when there is none. */
  release (key: string): GiveBack | undefined {
    const lease = this.#leases.get(key)
    if (lease === undefined) return undefined
    this.#leases.delete(key)
    return this.#giveBack(lease)
  }

  /**
   * Records the batch a lease call took, sent at `sentAt`: `spent` of it
   * paid the request that made the call (0 when that request no longer
   * waits), the rest is this server's to spend.
   */
  add (spec: BucketSpec, reply: LeaseReply, sentAt: number, spent: number): void {
    if (this.#resets.stale(spec.key, sentAt)) return
    const lease = leaseOf(spec, reply, sentAt, reply.taken - spent)
    this.#leases.delete(spec.key)
    this.#leases.set(spec.key, lease)
    if (this.#leases.size > this.#maxKeys) {
      const oldest = this.#leases.keys().next()
      if (oldest.done !== true) this.#leases.delete(oldest.value)
    }
  }

  /** What to give back of a batch that arrived after every request waiting for it had left. */
  unclaimed (spec: BucketSpec, reply: LeaseReply, sentAt: number): GiveBack {
    return this.#giveBack(leaseOf(spec, reply, sentAt, reply.taken))
  }

  /** The bucket was reset: drops its lease, and keeps out a batch whose call was sent before now. */
  forget (key: string): void {
    this.#leases.delete(key)
    this.#resets.mark(key, this.clock())
  }

  /** Takes every lease out, with the usable tokens to give back. */
  drain (): GiveBack[] {
    const out: GiveBack[] = []
    for (const lease of this.#leases.values()) {
      const back = this.#giveBack(lease)
      if (back.tokens > 0) out.push(back)
    }
    this.#leases.clear()
    return out
  }

  #giveBack (lease: Lease): GiveBack {
    return { spec: lease.spec, tokens: usableOf(lease, this.clock() - lease.sentAt), fullAtUs: lease.fullAtUs }
  }
}

/**
 * Whether a lease, taken for `held`, may serve a request of `spec`: the
 * same capacity and refill. A client's plan (lib/http/tiers.ts) may change
 * between the two; a lease's tokens and decay are counted in the plan it
 * was taken under, so a lease of another plan is neither spent nor given
 * back (its usable part comes back by refill).
 */
export function samePlan (held: BucketSpec, spec: BucketSpec): boolean {
  return held.capacity === spec.capacity && held.refillPerSecond === spec.refillPerSecond
}

function leaseOf (spec: BucketSpec, reply: LeaseReply, sentAt: number, left: number): Lease {
  return { spec, left, sentAt, bucketLeft: reply.bucket.remaining, fullInUs: reply.bucket.fullInUs, fullAtUs: reply.nowUs + reply.bucket.fullInUs }
}

/** The most the Redis bucket can hold `ageMs` after the lease call was sent. */
function bucketAtMost (lease: Lease, ageMs: number): number {
  return Math.min(lease.spec.capacity, lease.bucketLeft + lease.spec.refillPerSecond * ageMs / 1000)
}

function usableOf (lease: Lease, ageMs: number): number {
  return Math.max(0, Math.min(lease.left, lease.spec.capacity - bucketAtMost(lease, ageMs)))
}

/** One request that its server's lease could not pay. */
export interface LeaseRequest {
  policy: Policy
  lease: LeaseOptions
  /** Its one bucket, in an array as the store and the denial cache take it. */
  specs: NonEmpty<BucketSpec>
  timeoutMs: number
}

/** The store calls and decisions LeaseFlights needs from the limiter. */
export interface LeaseCalls {
  /**
   * A lease call through the deadline and the breaker; `sent` receives the
   * store's own promise, which may settle after the deadline.
   */
  take (spec: BucketSpec, most: number, back: GiveBack | undefined, timeoutMs: number, sent: (reply: Promise<LeaseReply>) => void): Promise<LeaseReply>
  /** The decision of the request that made a call, from its reply (caching a denial). */
  decide (request: LeaseRequest, reply: LeaseReply, sentAt: number): Decision
  /** A cached denial that still covers this request. */
  denied (request: LeaseRequest): Decision | undefined
}

interface Waiter {
  request: LeaseRequest
  /** The request's one bucket. */
  spec: BucketSpec
  resolve: (decision: Decision | undefined) => void
  /** Answered, or its deadline passed (it follows its failure mode): takes nothing more. */
  done: boolean
}

interface Queue {
  waiting: Waiter[]
  flying: boolean
}

/**
 * Lease calls, one at a time per bucket (single flight). Why: concurrent
 * requests that each took a batch of their own would hoard the bucket in
 * one server (100 requests at once on a bucket of 100, batches of 10: 10
 * allowed, 90 denied while this server held 90 tokens).
 *
 * A request that the lease cannot pay queues for its bucket. While a call
 * is in flight, requests wait for it; when it lands, the one that made it
 * is paid by Redis, the others in turn from the new batch, and if some
 * are left, the next call is sized to what they need (at least a batch,
 * at most capacity): a request waits for at most the call in flight when
 * it came and one more. Before a call is sent, every waiter that the lease
 * or a cached denial can answer is answered, so no request is denied while
 * this server holds usable tokens of the bucket.
 *
 * Each waiter has its own deadline, `timeoutMs` from its arrival, and then
 * follows its failure mode (docs/guides/failure-modes.md). A batch that lands after the
 * request that asked for it left, with nobody else waiting, is kept for the
 * next requests; one whose call missed its deadline is given back as soon
 * as it lands. close() waits for the calls in flight and gives everything
 * back.
 *
 * The queues live only while a bucket has waiters or a call in flight, so
 * their number is bounded by the requests in flight.
 */
export class LeaseFlights {
  readonly #queues = new Map<string, Queue>()
  readonly #book: LeaseBook
  readonly #calls: LeaseCalls
  readonly #deadlines: Deadlines
  readonly #pending = new Set<Promise<unknown>>()
  #closing = false

  constructor (book: LeaseBook, calls: LeaseCalls, time: Time = realTime) {
    this.#book = book
    this.#calls = calls
    this.#deadlines = new Deadlines(time)
  }

  /** Decides a request through its bucket's queue; undefined when the store failed or its deadline passed. */
  async decide (request: LeaseRequest): Promise<Decision | undefined> {
    // The limiter leases for single-policy requests only: `specs` holds one bucket.
    const [spec] = request.specs
    let queue = this.#queues.get(spec.key)
    if (queue === undefined) this.#queues.set(spec.key, queue = { waiting: [], flying: false })
    // `resolve` is replaced at once: a promise's executor runs synchronously.
    const waiter: Waiter = { request, spec, resolve: ignore, done: false }
    const answer = new Promise<Decision | undefined>((resolve) => { waiter.resolve = resolve })
    queue.waiting.push(waiter)
    this.#pump(spec.key, queue)
    try {
      return await this.#deadlines.wrap(answer, request.timeoutMs)
    } catch {
      waiter.done = true
      return undefined
    }
  }

  /** Waits for the calls in flight, then gives every lease back, each call with `timeoutMs`. */
  async close (timeoutMs: number): Promise<void> {
    this.#closing = true
    while (this.#pending.size > 0) await Promise.allSettled([...this.#pending])
    for (const back of this.#book.drain()) this.#giveBack(back, timeoutMs)
    await Promise.allSettled([...this.#pending])
    this.#closing = false
  }

  /** `queue` is the bucket's, in #queues: it stays there while a call is in flight. */
  #pump (key: string, queue: Queue): void {
    if (queue.flying) return
    queue.waiting = queue.waiting.filter((waiter) => !waiter.done && !this.#answer(waiter))
    const head = queue.waiting[0]
    if (head === undefined) {
      this.#queues.delete(key)
    } else if (this.#closing) {
      for (const waiter of queue.waiting) waiter.resolve(undefined)
      this.#queues.delete(key)
    } else {
      this.#send(key, queue, head)
    }
  }

  #answer (waiter: Waiter): boolean {
    const { policy, lease } = waiter.request
    const decision = this.#book.spend(policy, waiter.spec, lease.maxAgeMs) ?? this.#calls.denied(waiter.request)
    if (decision !== undefined) waiter.resolve(decision)
    return decision !== undefined
  }

  #send (key: string, queue: Queue, head: Waiter): void {
    const spec = head.spec
    let demand = 0
    for (const waiter of queue.waiting) demand += waiter.spec.cost
    // Never below the cost (lua/lease.lua's most >= least): a shadow policy's
    // cost may exceed its capacity, and then no batch pays it.
    const most = Math.max(spec.cost, Math.min(spec.capacity, Math.max(head.request.lease.tokens, demand)))
    const held = this.#book.release(key)
    const back = held !== undefined && samePlan(held.spec, spec) ? held : undefined
    queue.flying = true
    const sentAt = this.#book.clock()
    let raw: Promise<LeaseReply> | undefined
    const flight = this.#calls.take(spec, most, back, head.request.timeoutMs, (reply) => { raw = reply }).then(
      (reply) => { this.#landed(key, queue, head, reply, sentAt) },
      () => { this.#failed(key, queue, head, raw, sentAt) }
    )
    this.#track(flight)
  }

  #landed (key: string, queue: Queue, head: Waiter, reply: LeaseReply, sentAt: number): void {
    queue.flying = false
    const spec = head.spec
    if (reply.taken > 0) this.#book.add(spec, reply, sentAt, head.done ? 0 : spec.cost)
    const decision = this.#calls.decide(head.request, reply, sentAt)
    head.resolve(decision)
    head.done = true
    this.#pump(key, queue)
    if (this.#closing) this.#giveBack(this.#book.release(key), head.request.timeoutMs)
  }

  #failed (key: string, queue: Queue, head: Waiter, raw: Promise<LeaseReply> | undefined, sentAt: number): void {
    queue.flying = false
    head.resolve(undefined)
    head.done = true
    // The call may still run in Redis and its reply come late: nobody
    // waits for that batch any more.
    const spec = head.spec
    raw?.then((reply) => {
      if (reply.taken > 0) this.#giveBack(this.#book.unclaimed(spec, reply, sentAt), head.request.timeoutMs)
    }, ignore)
    this.#pump(key, queue)
  }

  #giveBack (back: GiveBack | undefined, timeoutMs: number): void {
    if (back === undefined || back.tokens <= 0) return
    this.#track(this.#calls.take({ ...back.spec, cost: 0 }, 0, back, timeoutMs, ignore).catch(ignore))
  }

  #track (promise: Promise<unknown>): void {
    this.#pending.add(promise)
    void promise.finally(() => this.#pending.delete(promise))
  }
}

/** Does nothing: a callback whose call has nothing to do. */
function ignore (): void {}
