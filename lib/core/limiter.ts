import diagnostics from 'node:diagnostics_channel'
import { DEFAULT_MAX_AGE_MS, DenialCache } from './denial-cache.js'
import { optionError, type StoreError } from './errors.js'
import { realTime, type Time } from './clock.js'
import { batchHoldMs, closedRetryMs, extOutcome, failed, fallbackOf, shadowed, special, summarize, timeoutOf, type ExtOutcome } from './decisions.js'
import { Guard } from './guard.js'
import { Invalidations } from './invalidation.js'
import { LeaseBook, LeaseFlights, type LeaseCalls } from './lease.js'
import { clientId } from './keys.js'
import { MemoryStore } from '../store/memory-store.js'
import { Metrics } from './metrics.js'
import { DEFAULT_BREAKER, DEFAULT_PREFIX, DEFAULT_TIMEOUT, isRecord, nonEmptyString, positiveNumber } from './options.js'
import { checkLimiterOptions, checkPolicies, checkPolicy, costBound, maxCost, unsettled } from './policy.js'
import { processWarnings } from './process-warnings.js'
import { RedisStore } from '../store/redis-store.js'
import { settlements, type Reservation } from './settle.js'
import { wholeTokens, type BucketSpec, type ExtReply, type ExtSpec, type StoreReply } from '../store/store.js'
import type { Decision, Limiter, LimiterOptions, Logger, Policy, RedisClient } from './types.js'
import { Waiters } from './waiters.js'

/**
 * What the request layer (lib/http/request.ts) uses of the core: the public
 * limiter, and the entries that only the framework adapters need.
 */
export interface Core {
  /** The public limiter (`createLimiter()`, `app.tollgate.limiter`). */
  readonly limiter: Limiter
  /**
   * One decision with one cost per policy (undefined: each policy's own).
   * Nothing is validated on this path: the policies were compiled and
   * checked once per route, the costs checked per request.
   */
  decide(clientKey: string, policies: readonly Policy[], costs: readonly number[] | undefined, consume: boolean): Promise<Decision>
  /** A reserve, one cost per policy, already checked (as `decide`); settled through `limiter.settle`. */
  reserve(clientKey: string, policies: readonly Policy[], costs: readonly number[] | undefined): Promise<Reservation>
  /**
   * Loads the scripts (on every master of a Cluster) ahead of the first
   * decision; a store that cannot run them is marked failing, with one
   * error line naming the cause.
   */
  warm(): Promise<void>
  /** Marks the store failing (start-up found it not ready), logging `message` once. */
  down(err: StoreError, message: string): void
  /**
   * Ends every wait at once, as `limiter.close()` does, and starts no new
   * one; the rest keeps working. For an adapter's shutdown, before it waits
   * for the requests in flight (which may be waiting).
   */
  endWaits(): void
}

/** Published for every decision: `{ key, decision }`. */
export const decisionChannel = diagnostics.channel('tollgate:decision')

/**
 * The framework-free limiter: token buckets in Redis (or, without `redis`,
 * in this process), decided atomically, with each policy's failure mode
 * applied when the store fails or misses its deadline.
 */
export function createLimiter (options: LimiterOptions = {}): Limiter {
  return createCore(options).limiter
}

/**
 * The limiter and the adapters' entries to it, over one store. Every
 * duration, wait and in-process bucket reads `time` (lib/core/clock.ts):
 * tests pass a fake one and move it by hand.
 */
export function createCore (options: LimiterOptions = {}, time: Time = realTime): Core {
  const input: unknown = options
  if (!isRecord(input)) throw optionError('options', input, 'an object')
  checkLimiterOptions(input)
  const prefix = options.prefix ?? DEFAULT_PREFIX
  const defaultTimeout = options.timeout ?? DEFAULT_TIMEOUT
  const clock = (): number => time.now()
  const micros = (): number => time.micros()
  const memory = new MemoryStore({ now: micros })
  const localStore = new MemoryStore({ maxKeys: 10_000, now: micros })
  const waiters = new Waiters(options.maxWaiters ?? 1000, clock, { set: (fn, ms) => time.hold(fn, ms), clear: (handle) => { time.clear(handle) } })
  const redis = options.redis === undefined ? undefined : new RedisStore(options.redis)
  const metrics = options.metrics === undefined ? undefined : new Metrics(options.metrics.meter, redis !== undefined)
  // Without a logger, the core's lines are process warnings (lib/core/process-warnings.ts): never silent.
  const logger = options.logger ?? processWarnings
  const guard = redis === undefined
    ? undefined
    : new Guard(redis, { ...DEFAULT_BREAKER, ...options.breaker }, logger, clock, metrics, { summaryMs: options.outageSummaryMs, target: redis.target })
  const leases = new LeaseBook(10_000, clock)
  let flights: LeaseFlights | undefined
  const checked = new WeakSet<object>()
  const denials = guard === undefined || options.denialCache === false
    ? undefined
    : new DenialCache(options.denialCache?.maxKeys ?? 10_000, options.denialCache?.maxAgeMs ?? DEFAULT_MAX_AGE_MS, clock)
  const changes = denials === undefined ? undefined : fleetChanges(options.redis as RedisClient, prefix, denials, leases, logger, clock)
  const book = settlements({ redis, guard, memory, local: localStore, denials, defaultTimeout, logger, refunded, clock })

  /** A refund applied in Redis, already applied to this server's cached denials: the other servers'. */
  async function refunded (specs: readonly BucketSpec[]): Promise<void> {
    await changes?.refund(specs.map((s) => s.key), defaultTimeout)
  }

  function policiesOf (input: Policy | readonly Policy[]): readonly Policy[] {
    const list = Array.isArray(input) ? input as readonly Policy[] : [input as Policy]
    if (list.length === 0) throw optionError('policy', input, 'a policy or a non-empty array of policies')
    for (const policy of list) {
      if (!checked.has(policy)) {
        checkPolicy(policy)
        checked.add(policy)
      }
    }
    checkPolicies(list)
    return list
  }

  function checkCall (clientKey: string, list: readonly Policy[], cost: number | undefined): void {
    if (typeof clientKey !== 'string') throw optionError('clientKey', clientKey, 'a string')
    if (cost === undefined) return
    positiveNumber(cost, 'cost')
    for (const policy of list) {
      if (cost > maxCost(policy)) throw optionError('cost', cost, `at most ${costBound(policy)} of bucket "${policy.bucket}"`)
    }
  }

  function specsOf (clientKey: string, list: readonly Policy[], costs: readonly number[] | undefined): BucketSpec[] {
    const id = clientId(clientKey)
    const specs: BucketSpec[] = []
    for (let i = 0; i < list.length; i++) {
      const policy = list[i] as Policy
      const spend = costs?.[i] ?? policy.cost ?? 1
      specs.push({ key: `${prefix}:{${id}}:${policy.bucket}`, capacity: policy.capacity, refillPerSecond: policy.refillPerSecond, cost: spend })
    }
    return specs
  }

  async function publicDecide (clientKey: string, input: Policy | readonly Policy[], cost: number | undefined, consume: boolean): Promise<Decision> {
    const list = policiesOf(input)
    checkCall(clientKey, list, cost)
    return decide(clientKey, list, cost === undefined ? undefined : list.map(() => cost), consume)
  }

  /**
   * One decision, in one promise: a store call's promise is settled by the
   * reply or by the deadline, never wrapped again. Shadow mode, lockouts and
   * reservations take a path of their own (lib's extras, below).
   */
  function decide (clientKey: string, list: readonly Policy[], costs: readonly number[] | undefined, consume: boolean): Promise<Decision> {
    if (special(list)) return extras(clientKey, list, costs, consume).then((decision) => published(clientKey, decision))
    return plain(clientKey, list, costs, consume, (decision) => published(clientKey, decision))
  }

  function plain (clientKey: string, list: readonly Policy[], costs: readonly number[] | undefined, consume: boolean, out: (d: Decision) => Decision): Promise<Decision> {
    const specs = specsOf(clientKey, list, costs)
    if (guard === undefined) return Promise.resolve(out(summarize(list, memory.decideSync(specs, consume), 'store')))
    const id = specs.length === 1 ? (specs[0] as BucketSpec).key : specs.map((s) => s.key).join('\n')
    const only = list[0] as Policy
    const cached = consume && only.lease === undefined ? denials?.get(id, specs) : undefined
    if (cached !== undefined) return Promise.resolve(out(cached))
    if (only.lease !== undefined && list.length === 1) {
      if (consume) return leased(guard, redis as RedisStore, only, only.lease, specs).then(out)
      return leasedPeek(guard, only, only.lease, specs[0] as BucketSpec).then(out)
    }
    return guard.decide(specs, consume, timeoutOf(list, defaultTimeout), (reply, sentAt) => {
      const decision = summarize(list, reply, 'store')
      if (!decision.allowed && consume) denials?.set(id, specs, decision, sentAt)
      return out(decision)
    }, () => out(fallback(guard, list, specs, consume)))
  }

  /**
   * Shadow mode: the enforced policies decide the request; the shadow ones
   * are decided after them, in a call of their own, spending only when the
   * request was allowed (as they would if enforced), and never refuse.
   */
  async function extras (clientKey: string, list: readonly Policy[], costs: readonly number[] | undefined, consume: boolean): Promise<Decision> {
    const enforced: number[] = []
    const shadow: number[] = []
    list.forEach((policy, i) => (policy.shadow === true ? shadow : enforced).push(i))
    const part = (at: number[]): [Policy[], number[] | undefined] => [at.map((i) => list[i] as Policy), costs === undefined ? undefined : at.map((i) => costs[i] as number)]
    if (shadow.length === 0) return await one(clientKey, ...part(enforced), consume)
    if (enforced.length === 0) return shadowed(await one(clientKey, ...part(shadow), consume))
    const decided = await one(clientKey, ...part(enforced), consume)
    const shadows = shadowed(await one(clientKey, ...part(shadow), consume && decided.allowed))
    const byPolicy: Decision[] = []
    const from = [decided.policies ?? [decided], shadows.policies ?? [shadows]]
    const next = [0, 0]
    for (const policy of list) {
      const side = policy.shadow === true ? 1 : 0
      byPolicy.push((from[side] as readonly Decision[])[(next[side] as number)++] as Decision)
    }
    const combined: Decision = { ...decided, policies: byPolicy }
    if (decided.allowed && shadows.shadow === true) combined.shadow = true
    return combined
  }

  /** One list of policies of one kind: a lockout or reservation, or a plain decision. */
  function one (clientKey: string, list: Policy[], costs: number[] | undefined, consume: boolean): Promise<Decision> {
    const only = list[0] as Policy
    if (list.length === 1 && (only.lockout !== undefined || only.maxWaitMs !== undefined)) return extended(clientKey, only, costs?.[0], consume)
    return plain(clientKey, list, costs, consume, (decision) => decision)
  }

  /**
   * One policy with a lockout or reservations (lua/token-bucket-ext.lua).
   * A consume that may wait takes a waiter slot first (lib/core/waiters.ts); a
   * reply with a delay holds it that long. Only lockout denials are cached:
   * a plain denial must reach the store, which counts it.
   */
  async function extended (clientKey: string, policy: Policy, cost: number | undefined, consume: boolean): Promise<Decision> {
    const spec = specsOf(clientKey, [policy], cost === undefined ? undefined : [cost])[0] as ExtSpec
    spec.maxWaitUs = (policy.maxWaitMs ?? 0) * 1000
    spec.mayWait = consume && policy.maxWaitMs !== undefined && waiters.take()
    spec.lockout = policy.lockout
    let outcome: ExtOutcome
    if (guard === undefined) {
      outcome = extOutcome(policy, memory.decideExtSync(spec, consume), 'store')
    } else {
      const cached = consume ? denials?.get(spec.key, [spec]) : undefined
      outcome = cached === undefined ? await extStore(guard, redis as RedisStore, policy, spec, consume) : { decision: cached, delayUs: 0 }
    }
    const { decision, delayUs } = outcome
    if (delayUs === 0) {
      if (spec.mayWait) waiters.release()
      return decision
    }
    const started = clock()
    const leftMs = await waiters.wait(delayUs / 1000)
    if (leftMs === 0) return { ...decision, waitedMs: clock() - started }
    return { ...decision, allowed: false, retryAfterMs: leftMs }
  }

  async function extStore (guard: Guard, store: RedisStore, policy: Policy, spec: ExtSpec, consume: boolean): Promise<ExtOutcome> {
    const sentAt = clock()
    let reply: ExtReply
    try {
      reply = await guard.run(() => store.decideExt(spec, consume), policy.timeout ?? defaultTimeout, [spec])
    } catch {
      const local = policy.local
      if (policy.failureMode !== 'local' || local === undefined) return { decision: fallback(guard, [policy], [spec], consume), delayUs: 0 }
      guard.fellBack('local')
      return extOutcome({ ...policy, ...local }, localStore.decideExtSync({ ...spec, ...local }, consume), 'local')
    }
    const outcome = extOutcome(policy, reply, 'store')
    if (reply.locked && consume) denials?.set(spec.key, [spec], outcome.decision, sentAt)
    return outcome
  }

  async function reserve (clientKey: string, list: readonly Policy[], costs: readonly number[] | undefined): Promise<Reservation> {
    const reservation = await book.reserve(list, specsOf(clientKey, list, costs))
    published(clientKey, reservation.decision)
    return reservation
  }

  function published (clientKey: string, decision: Decision): Decision {
    if (decisionChannel.hasSubscribers) decisionChannel.publish(decision.shadow === true ? { key: clientKey, decision, shadow: true } : { key: clientKey, decision })
    // A shadow policy's would-be denial passes (allowed: true): counted as the denial it reports.
    if (metrics !== undefined) metrics.decided(decision.shadow === true ? { ...decision, allowed: false } : decision, decision.shadow === true)
    return decision
  }

  /**
   * A single-policy consume with leases: spend from this server's batch;
   * else, unless a cached denial still holds, wait in the bucket's queue
   * for a lease call (lib/core/lease.ts: one in flight per bucket, the rest of
   * the old batch given back with it).
   */
  async function leased (guard: Guard, store: RedisStore, policy: Policy, lease: NonNullable<Policy['lease']>, specs: BucketSpec[]): Promise<Decision> {
    const served = leases.spend(policy, specs[0] as BucketSpec, lease.maxAgeMs)
    if (served !== undefined) return served
    flights ??= new LeaseFlights(leases, leaseCalls(guard, store))
    const request = { policy, lease, specs, timeoutMs: policy.timeout ?? defaultTimeout }
    const decision = denials?.get((specs[0] as BucketSpec).key, specs) ?? await flights.decide(request)
    return decision ?? fallback(guard, [policy], specs, true)
  }

  /**
   * A peek of a leased policy says what a consume would do on this server:
   * a lease that can pay the cost allows it (spending nothing); a cached
   * denial denies it; else the store decides, on the cost less the lease's
   * usable rest, which the consume's lease call gives back first (accepted
   * while no other server took from the bucket since: see lua/lease.lua).
   */
  async function leasedPeek (guard: Guard, policy: Policy, lease: NonNullable<Policy['lease']>, spec: BucketSpec): Promise<Decision> {
    const served = leases.peek(policy, spec, lease.maxAgeMs) ?? denials?.get(spec.key, [spec])
    if (served !== undefined) return served
    const rest = leases.usable(spec)
    const asked = [{ ...spec, cost: Math.max(0, spec.cost - rest) }]
    return await guard.decide(asked, false, policy.timeout ?? defaultTimeout, (reply) => {
      const decision = summarize([policy], reply, 'store')
      return rest === 0 ? decision : { ...decision, remaining: wholeTokens(Math.min(policy.capacity, (reply.buckets[0] as StoreReply['buckets'][number]).remaining + rest)) }
    }, () => fallback(guard, [policy], [spec], false))
  }

  /** The store side of lease calls: through the guard, each reply turned into a decision. */
  function leaseCalls (guard: Guard, store: RedisStore): LeaseCalls {
    return {
      take: (spec, most, back, timeoutMs, sent) => guard.run(() => {
        const reply = store.lease(spec, most, back?.tokens ?? 0, back?.fullAtUs ?? 0)
        sent(reply)
        return reply
      }, timeoutMs, [spec]),
      decide (request, reply, sentAt) {
        const { policy, lease, specs } = request
        const spec = specs[0] as BucketSpec
        const bucket = { ...reply.bucket, remaining: reply.bucket.remaining + Math.max(0, reply.taken - spec.cost) }
        const decision = summarize([policy], { allowed: reply.taken > 0, buckets: [bucket] }, 'store')
        if (!decision.allowed && denials !== undefined) {
          // A denied client waits until a whole batch is back, not just its
          // cost: otherwise a flood takes the bucket one token per call.
          decision.retryAfterMs += batchHoldMs(policy, lease, spec.cost)
          denials.set(spec.key, specs, decision, sentAt)
        }
        return decision
      },
      denied: (request) => denials?.get((request.specs[0] as BucketSpec).key, request.specs)
    }
  }

  function fallback (guard: Guard, list: readonly Policy[], specs: readonly BucketSpec[], consume: boolean): Decision {
    const plan = fallbackOf(list, specs)
    guard.fellBack(plan.mode)
    if (plan.mode === 'fail-closed') return failed(list, 'fail-closed', closedRetryMs(guard.cooldownLeftMs))
    if (plan.mode === 'fail-open') return failed(list, 'fail-open', 0)
    return summarize(plan.list, localStore.decideSync(plan.specs, consume), 'local')
  }

  const limiter: Limiter = {
    consume: (clientKey, policy, cost) => publicDecide(clientKey, policy, cost, true),
    peek: (clientKey, policy) => publicDecide(clientKey, policy, undefined, false),
    async reserve (clientKey, policy, cost) {
      const list = policiesOf(policy)
      checkCall(clientKey, list, cost)
      for (const p of list) {
        if (p.lease !== undefined) throw optionError('policy.lease', p.lease, 'unset to reserve: a leased bucket is spent from this server\'s batch, which a settlement cannot reach')
        unsettled(p, 'policy.')
      }
      return await reserve(clientKey, list, cost === undefined ? undefined : list.map(() => cost))
    },
    settle: (reservation, actual) => book.settle(reservation, actual),
    get failedSettlements () {
      return book.failures
    },
    async reset (clientKey, bucket) {
      nonEmptyString(bucket, 'bucket')
      checkCall(clientKey, [], undefined)
      const key = `${prefix}:{${clientId(clientKey)}}:${bucket}`
      await localStore.reset(key)
      await memory.reset(key)
      denials?.forget(key)
      leases.forget(key)
      if (guard === undefined) return
      await guard.reset(key, defaultTimeout)
      // Again once Redis has applied it: a call in flight meanwhile may have
      // been decided before the reset, and its reply comes after.
      const at = clock()
      denials?.reset(key, at)
      leases.forget(key)
      await changes?.reset(key, defaultTimeout)
    },
    async close () {
      waiters.close()
      changes?.close()
      await flights?.close(defaultTimeout)
      denials?.clear()
      memory.clear()
      localStore.clear()
      guard?.close()
      metrics?.close()
    },
    get state () {
      return guard?.state ?? 'healthy'
    }
  }
  async function warm (): Promise<void> {
    const refused = await redis?.warm(`${prefix}:warm`)
    if (refused !== undefined) (guard as Guard).down(refused)
  }
  // Only the adapters call `down`, and only with a `redis`, hence a guard.
  return { limiter, decide, reserve, warm, down: (err, message) => { (guard as Guard).down(err, message) }, endWaits: () => { waiters.close() } }
}

/**
 * The other app servers' resets and refunds (lib/core/invalidation.ts), applied
 * to this server's cached denials and leases as its own are.
 */
function fleetChanges (redis: RedisClient, prefix: string, denials: DenialCache, leases: LeaseBook, logger: Logger | undefined, clock: () => number): Invalidations {
  return new Invalidations(redis, prefix, {
    reset (key, at) {
      denials.reset(key, at)
      leases.forget(key)
    },
    refund: (keys, at) => { denials.refunded(keys, at) },
    resubscribed: (at) => { denials.distrust(at) }
  }, logger, clock)
}
