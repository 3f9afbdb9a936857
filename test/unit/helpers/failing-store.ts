// A store that fails on demand, and the limiter's engine wired over it as
// createCore wires it over Redis (lib/core/limiter.ts `wire`), on a fake
// clock. The store implements the Store interface of lib/store/store.ts
// (and the calls the engine makes of a remote store: decideExt, reserve,
// settle) over an in-process store; it is no Redis client: no command,
// no script, no connection.

import { Engine, type EngineParts } from '../../../lib/core/engine.js'
import { Guard } from '../../../lib/core/guard.js'
import { KeyNames } from '../../../lib/core/key-secret.js'
import { LeaseBook } from '../../../lib/core/lease.js'
import { settlements } from '../../../lib/core/settle.js'
import { Waiters } from '../../../lib/core/waiters.js'
import type { Remote } from '../../../lib/core/remote.js'
import type { BreakerOptions, Logger } from '../../../lib/core/types.js'
import { MemoryStore } from '../../../lib/store/memory-store.js'
import type { RedisStore } from '../../../lib/store/redis-store.js'
import type { BucketSpec, ExtReply, ExtSpec, ReserveMark, ReserveReply, Store, StoreReply } from '../../../lib/store/store.js'
import type { Timers } from '../../../lib/core/outage.js'
import type { FakeTime } from './fake-time.js'

/** The outage summary's repeating timer, on the fake clock. */
export function everyOn (time: FakeTime): Timers {
  return {
    every (ms, fn) {
      let handle: unknown
      const arm = (): void => { handle = time.set(() => { fn(); arm() }, ms) }
      arm()
      return { stop: () => { time.clear(handle) } }
    }
  }
}

/** How the store answers: as a store, by rejecting (a lost connection), by never answering, or with a reply error of a live server. */
export type Behaviour = 'answer' | 'reject' | 'hang' | 'reply-error'

export class FailingStore implements Store {
  behaviour: Behaviour = 'reject'
  /** Calls that reached the store. */
  calls = 0
  readonly #inner: MemoryStore

  constructor (time: FakeTime) {
    this.#inner = new MemoryStore({ now: () => time.micros() })
  }

  #call<T> (answer: () => T): Promise<T> {
    this.calls++
    switch (this.behaviour) {
      case 'answer': return Promise.resolve(answer())
      case 'reject': return Promise.reject(new Error('Connection is closed.'))
      case 'hang': return new Promise<T>(() => {})
      case 'reply-error': {
        const err = new Error('WRONGTYPE Operation against a key holding the wrong kind of value')
        err.name = 'ReplyError'
        return Promise.reject(err)
      }
    }
  }

  /** Sent at once: `sent` is called before the call is made (lib/store/store.ts Store.decide). */
  decide (specs: readonly BucketSpec[], consume: boolean, sent?: () => void): Promise<StoreReply> {
    sent?.()
    return this.#call(() => this.#inner.decideSync(specs, consume))
  }

  decideExt (spec: ExtSpec, consume: boolean): Promise<ExtReply> {
    return this.#call(() => this.#inner.decideExtSync(spec, consume))
  }

  reserve (specs: readonly BucketSpec[]): Promise<ReserveReply> {
    return this.#call(() => this.#inner.reserveSync(specs))
  }

  settle (specs: readonly BucketSpec[], changes: readonly number[], marks: readonly ReserveMark[]): Promise<number[]> {
    return this.#call(() => this.#inner.settleSync(specs, changes, marks))
  }

  reset (key: string): Promise<void> {
    return this.#call(() => { void this.#inner.reset(key) })
  }
}

/** The keySecret of engineOver's limiter: keys in these tests are `keyOf(UNIT_KEY_SECRET, ...)`. */
export const UNIT_KEY_SECRET = 'unit tests key secret'

export interface Wired {
  engine: Engine
  guard: Guard
  parts: EngineParts
}

/** The engine over `store`, as createCore builds it over Redis, without a denial cache. */
export function engineOver (store: FailingStore, time: FakeTime, options: { timeout?: number, breaker?: BreakerOptions, logger?: Logger } = {}): Wired {
  const clock = (): number => time.now()
  const micros = (): number => time.micros()
  const logger = options.logger
  const guard = new Guard(store, options.breaker ?? { failures: 5, cooldownMs: 1000 }, logger, clock, undefined, { timers: everyOn(time), target: 'test store' })
  // The engine reads decideExt, reserve and settle of its remote store, which
  // FailingStore has; the rest of RedisStore (its client, its scripts) it
  // never reaches with `denials` and `changes` unset.
  const remote: Remote = { store: store as unknown as RedisStore, guard, denials: undefined, changes: undefined }
  const memory = new MemoryStore({ now: micros })
  const local = new MemoryStore({ maxKeys: 10_000, now: micros })
  const defaultTimeout = options.timeout ?? 10
  const parts: EngineParts = {
    prefix: 'tollgate',
    defaultTimeout,
    clock,
    memory,
    local,
    waiters: new Waiters(1000, clock, time),
    leases: new LeaseBook(10_000, clock),
    metrics: undefined,
    remote,
    book: settlements({ remote, memory, local, defaultTimeout, logger, clock }),
    // A keySecret: keys are named at once, with no read from the store.
    names: new KeyNames('tollgate', UNIT_KEY_SECRET, undefined)
  }
  return { engine: new Engine(parts), guard, parts }
}
