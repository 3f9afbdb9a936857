// A store that fails on demand, and the limiter's engine wired over it by
// createCore's own wiring (lib/core/limiter.ts `wire`), on a fake clock. The
// store implements the RemoteStore interface of lib/store/store.ts over an
// in-process store; it is no Redis client: no command, no script, no
// connection (so no fleet channel: its `client` is undefined).

import { Engine, type EngineParts } from '../../../lib/core/engine.js'
import type { Guard } from '../../../lib/core/guard.js'
import { wire } from '../../../lib/core/limiter.js'
import type { BreakerOptions, Logger } from '../../../lib/core/types.js'
import { MemoryStore } from '../../../lib/store/memory-store.js'
import type { StoreError } from '../../../lib/store/errors.js'
import type { Script } from '../../../lib/store/script.js'
import type { BucketSpec, ExtReply, ExtSpec, LeaseReply, RemoteStore, ReserveMark, ReserveReply, StoreReply } from '../../../lib/store/store.js'
import type { FakeTime } from './fake-time.js'

/** How the store answers: as a store, by rejecting (a lost connection), by never answering, or with a reply error of a live server. */
export type Behaviour = 'answer' | 'reject' | 'hang' | 'reply-error'

export class FailingStore implements RemoteStore {
  readonly target = 'test store'
  readonly client = undefined
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

  /** Leases: no unit test takes one; a store call all the same, that fails as the others do. */
  lease (spec: BucketSpec): Promise<LeaseReply> {
    return this.#call(() => ({ taken: 0, bucket: { remaining: spec.capacity, fullInUs: 0, waitUs: 0 }, nowUs: 0 }))
  }

  /**
   * A script of another limit kind (lib/store/script.ts): it runs nothing,
   * and replies as a script that found none of its keys, nil for each. The
   * key secret's is one: every key secret is a keySecret here
   * (UNIT_KEY_SECRET), never read at a decision.
   */
  run (_script: Script, keys: readonly string[]): Promise<unknown> {
    return this.#call(() => keys.map(() => null))
  }

  /** Nothing to load: an in-process store runs no script. */
  warm (): Promise<StoreError | undefined> {
    return Promise.resolve(undefined)
  }
}

/** The keySecret of engineOver's limiter: keys in these tests are `keyOf(UNIT_KEY_SECRET, ...)`. */
export const UNIT_KEY_SECRET = 'unit tests key secret'

export interface Wired {
  engine: Engine
  guard: Guard
  parts: EngineParts
}

/** A logger that drops its lines (a test that reads them passes its own). */
const silent: Logger = { warn () {}, info () {}, error () {} }

/** The engine over `store`, wired as createCore wires it over Redis, without a denial cache. */
export function engineOver (store: FailingStore, time: FakeTime, options: { timeout?: number, breaker?: BreakerOptions, logger?: Logger } = {}): Wired {
  const parts = wire({ ...options, logger: options.logger ?? silent, keySecret: UNIT_KEY_SECRET, denialCache: false }, time, store)
  if (parts.remote === undefined) throw new Error('wired without its store')
  return { engine: new Engine(parts), guard: parts.remote.guard, parts }
}
