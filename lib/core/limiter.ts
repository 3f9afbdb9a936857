import { DEFAULT_MAX_AGE_MS, DenialCache } from './denial-cache.js'
import { optionError, type StoreError } from './errors.js'
import { realTime, type Time } from './clock.js'
import { Engine, type EngineParts } from './engine.js'
import { Guard } from './guard.js'
import { Invalidations } from './invalidation.js'
import { isNonEmpty, type NonEmpty } from './lists.js'
import { LeaseBook } from './lease.js'
import { KeyNames, WARM_TIMEOUT_MS } from './key-secret.js'
import { MemoryStore } from '../store/memory-store.js'
import { Metrics } from './metrics.js'
import { DEFAULT_BREAKER, DEFAULT_PREFIX, DEFAULT_TIMEOUT, isRecord, nonEmptyString, positiveNumber } from './options.js'
import { checkLimiterOptions, checkPolicies, checkPolicy, parsePolicy } from './policy.js'
import { Slots } from './concurrency.js'
import { checkCombination, checkCost } from './policy-fields.js'
import { processWarnings } from './process-warnings.js'
import { RedisStore } from '../store/redis-store.js'
import type { StoreClient } from '../store/client.js'
import type { RemoteStore } from '../store/store.js'
import type { Remote } from './remote.js'
import { settlements, type Reservation } from './settle.js'
import type { Acquired, ConcurrencyPolicy, Decision, Limiter, LimiterOptions, Logger, Policy } from './types.js'
import { Waiters } from './waiters.js'

export { decisionChannel } from './engine.js'

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
  /** An acquisition of a list with concurrency policies (lib/core/concurrency.ts), one cost per policy, already checked (as `decide`). */
  acquire(clientKey: string, policies: readonly Policy[], costs: readonly number[] | undefined): Promise<Acquired>
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
  /** A client's partition key, the same on every server of the fleet (lib/core/key-secret.ts `partition`): draft-11's `pk`. */
  partition(clientKey: string): Buffer
}

/**
 * The framework-free limiter: token buckets in Redis (or, without `redis`,
 * in this process), decided atomically, with each policy's failure mode
 * applied when the store fails or misses its deadline.
 */
export function createLimiter (options: LimiterOptions = {}): Limiter {
  return createCore(options).limiter
}

/**
 * What a limiter runs on, besides its options: its time source, and its
 * remote store. Unset, the process's clock and timers (lib/core/clock.ts
 * realTime) and, with `redis`, a RedisStore over it; a test passes a fake
 * Time that it moves by hand, or a store of its own.
 */
export interface Runtime {
  readonly time?: Time | undefined
  readonly store?: RemoteStore | undefined
}

/**
 * The limiter and the adapters' entries to it, over one store. Every
 * duration, wait, deadline and in-process bucket reads the runtime's time.
 */
export function createCore (options: LimiterOptions = {}, runtime: Runtime = {}): Core {
  const input: unknown = options
  if (!isRecord(input)) throw optionError('options', input, 'an object')
  checkLimiterOptions(input)
  const parts = wire(options, runtime.time ?? realTime, runtime.store ?? redisStoreOf(options))
  const engine = new Engine(parts)
  const guard = parts.remote?.guard
  // Once per limiter, whoever asks first: the adapters' start-up wait, or
  // the app through `limiter.ready`.
  let warming: Promise<void> | undefined
  const warm = (): Promise<void> => {
    warming ??= (async () => {
      const refused = await parts.remote?.store.warm(`${parts.prefix}:warm`)
      if (refused !== undefined) guard?.down(refused)
      else await parts.names.load(WARM_TIMEOUT_MS)
    })()
    return warming
  }
  const slots = new Slots(parts, (clientKey, list, costs) => engine.specsOf(clientKey, list, costs))
  const limiter = facade(engine, slots, parts, warm)
  return {
    limiter,
    decide: (clientKey, list, costs, consume) => engine.decide(clientKey, listOf(list), costs, consume),
    reserve: (clientKey, list, costs) => engine.reserve(clientKey, listOf(list), costs),
    acquire: (clientKey, list, costs) => slots.acquire(clientKey, listOf(list), costs),
    warm,
    // Only the adapters call `down`, and only with a `redis`, hence a guard.
    down: (err: StoreError, message: string) => { guard?.down(err, message) },
    endWaits: () => { parts.waiters.close() },
    partition: (clientKey) => parts.names.partition(clientKey)
  }
}

/** The store of a limiter with `redis`. */
function redisStoreOf (options: LimiterOptions): RemoteStore | undefined {
  return options.redis === undefined ? undefined : new RedisStore(options.redis, { batch: options.batch })
}

/**
 * Builds the stores, caches and timers of one limiter from its (checked)
 * options, over `store` (none: the in-process store decides) and `time`.
 */
export function wire (options: LimiterOptions, time: Time, store: RemoteStore | undefined): EngineParts {
  const prefix = options.prefix ?? DEFAULT_PREFIX
  const defaultTimeout = options.timeout ?? DEFAULT_TIMEOUT
  const clock = (): number => time.now()
  const micros = (): number => time.micros()
  const memory = new MemoryStore({ now: micros })
  const local = new MemoryStore({ maxKeys: 10_000, now: micros })
  const waiters = new Waiters(options.maxWaiters ?? 1000, time)
  const leases = new LeaseBook(10_000, clock)
  // Without a logger, the core's lines are process warnings (lib/core/process-warnings.ts): never silent.
  const logger = options.logger ?? processWarnings
  const metrics = options.metrics === undefined ? undefined : new Metrics(options.metrics.meter, store !== undefined)
  const remote = store === undefined ? undefined : remoteOf(options, store, { prefix, logger, metrics, leases, time })
  const book = settlements({
    remote,
    memory,
    local,
    defaultTimeout,
    logger,
    clock,
    // A refund applied in Redis, already applied to this server's cached denials: the other servers'.
    refunded: async (specs) => { await remote?.changes?.refund(specs.map((s) => s.key), defaultTimeout) }
  })
  const names = new KeyNames(prefix, options.keySecret, remote === undefined ? undefined : { store: remote.store, guard: remote.guard, logger })
  return { prefix, defaultTimeout, time, memory, local, waiters, leases, metrics, remote, book, names }
}

/** The remote store with its guard, its denial cache and the fleet's change channel. */
function remoteOf (options: LimiterOptions, store: RemoteStore, shared: { prefix: string, logger: Logger, metrics: Metrics | undefined, leases: LeaseBook, time: Time }): Remote {
  const { prefix, logger, metrics, leases, time } = shared
  const guard = new Guard(store, { ...DEFAULT_BREAKER, ...options.breaker }, logger, time, metrics, { summaryMs: options.outageSummaryMs, target: store.target })
  const denials = options.denialCache === false
    ? undefined
    : new DenialCache(options.denialCache?.maxKeys ?? 10_000, options.denialCache?.maxAgeMs ?? DEFAULT_MAX_AGE_MS, () => time.now())
  // A store no other process shares (no client) has no fleet to hear from.
  const client = store.client
  const changes = denials === undefined || client === undefined ? undefined : fleetChanges(client, prefix, denials, leases, logger, time)
  return { store, guard, denials, changes }
}

/**
 * An adapter's list of policies, never empty (route compilation refuses an
 * empty one): the decision paths read its first policy, so it is checked
 * once more at this edge rather than trusted by a cast.
 */
function listOf (list: readonly Policy[]): NonEmpty<Policy> {
  if (!isNonEmpty(list)) throw optionError('policies', list, 'a non-empty list of policies')
  return list
}

/** Array.isArray, which does not narrow a union with a readonly array. */
function isList (input: Policy | readonly Policy[]): input is readonly Policy[] {
  return Array.isArray(input)
}

/** The public limiter over an engine: every argument checked here, once. */
function facade (engine: Engine, slots: Slots, parts: EngineParts, warm: () => Promise<void>): Limiter {
  const checked = new WeakSet<object>()
  // acquire's policies, parsed once each: a concurrency policy gets its sizes there (lib/core/policy-fields.ts checkRequired).
  const parsed = new WeakMap<object, Policy>()

  function acquired (input: ConcurrencyPolicy | Policy | ReadonlyArray<ConcurrencyPolicy | Policy>): NonEmpty<Policy> {
    const list = (Array.isArray(input) ? input : [input]).map((policy: unknown) => {
      // Not an object: parsePolicy throws, naming it.
      if (!isRecord(policy)) return parsePolicy(policy)
      let made = parsed.get(policy)
      if (made === undefined) {
        made = parsePolicy(policy)
        parsed.set(policy, made)
      }
      return made
    })
    if (!isNonEmpty(list)) throw optionError('policy', input, 'a policy or a non-empty array of policies')
    checkPolicies(list)
    return list
  }

  function policiesOf (input: Policy | readonly Policy[]): NonEmpty<Policy> {
    const list = isList(input) ? input : [input]
    if (!isNonEmpty(list)) throw optionError('policy', input, 'a policy or a non-empty array of policies')
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
    for (const policy of list) checkCost(cost, policy, (bound) => optionError('cost', cost, `at most ${bound} of bucket "${policy.bucket}"`))
  }

  /** The engine's own promise, not one more around it; whatever throws rejects it, as in an async function. */
  function decide (clientKey: string, input: Policy | readonly Policy[], cost: number | undefined, consume: boolean): Promise<Decision> {
    try {
      const list = policiesOf(input)
      checkCall(clientKey, list, cost)
      for (const p of list) checkCombination(p, ['decide'], 'policy.')
      return engine.decide(clientKey, list, cost === undefined ? undefined : list.map(() => cost), consume)
    } catch (err) {
      return Promise.reject(err)
    }
  }

  return {
    consume: (clientKey, policy, cost) => decide(clientKey, policy, cost, true),
    peek: (clientKey, policy) => decide(clientKey, policy, undefined, false),
    async reserve (clientKey, policy, cost): Promise<Reservation> {
      const list = policiesOf(policy)
      checkCall(clientKey, list, cost)
      for (const p of list) checkCombination(p, ['reserve'], 'policy.')
      return await engine.reserve(clientKey, list, cost === undefined ? undefined : list.map(() => cost))
    },
    settle: (reservation, actual) => parts.book.settle(reservation, actual),
    get failedSettlements () {
      return parts.book.failures
    },
    async reset (clientKey, bucket) {
      nonEmptyString(bucket, 'bucket')
      checkCall(clientKey, [], undefined)
      await engine.reset(clientKey, bucket)
    },
    async acquire (clientKey, policy) {
      const list = acquired(policy)
      checkCall(clientKey, list, undefined)
      return await slots.acquire(clientKey, list, undefined)
    },
    async close () {
      // Both at once: the engine stops its subscription and waits in the same
      // turn as close() is called, while the held slots are given back.
      await Promise.all([slots.close(), engine.close()])
    },
    get state () {
      return parts.remote?.guard.state ?? 'healthy'
    },
    get ready () {
      return warm()
    }
  }
}

/**
 * The other app servers' resets and refunds (lib/core/invalidation.ts), applied
 * to this server's cached denials and leases as its own are.
 */
function fleetChanges (redis: StoreClient, prefix: string, denials: DenialCache, leases: LeaseBook, logger: Logger | undefined, time: Time): Invalidations {
  return new Invalidations(redis, prefix, {
    reset (key, at) {
      denials.reset(key, at)
      leases.forget(key)
    },
    refund: (keys, at) => { denials.refunded(keys, at) },
    resubscribed: (at) => { denials.distrust(at) }
  }, logger, time)
}
