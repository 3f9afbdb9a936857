// Tells every app server of a fleet about the resets and refunds made on
// any of them, so that no process-local cache (cached denials, leases)
// outlives a change made elsewhere (docs/design/algorithm.md, "Resets and refunds reach every
// app server").
//
// How: Redis pub/sub, one channel per key prefix (`<prefix>:changes`).
// Once Redis has applied a reset or a refund, the server that made it
// publishes the keys it changed, through the app's client (PUBLISH is an
// ordinary command). The limiters of one client and prefix listen on one
// connection of tollgate's own (lib/core/subscription.ts), a
// duplicate of the app's client (of a Cluster: a duplicate of one of its
// nodes, and of another one when that node is gone), so the app's client
// is never put in subscriber mode, never modified and never closed. The
// store's client (lib/store/client.ts StoreClient.subscribe) opens it,
// whichever client the app gave.
//
// Why that is enough, and when it is not. PUBLISH returns once Redis has
// written the message to the connection of every subscriber on that node
// (a Cluster node passes it on to the others over its cluster bus), so a
// subscribed server hears of a change within the delivery of one message.
// But Redis keeps no message for a subscriber that is not connected: what
// was published while the connection was down is lost. So:
// - when a subscription starts after a connection was lost or refused,
//   every cached denial is dropped, and a reply to a call sent before then
//   is not cached (DenialCache.distrust); the first one at start-up, a few
//   ms in, drops nothing (it follows no loss);
// - whatever is missed (the connection died silently, Redis refused the
//   subscription, a message was lost with a Cluster node), no cached denial
//   is trusted longer than `denialCache.maxAgeMs` after its call was sent
//   (lib/core/denial-cache.ts): that is the bound in every case, and the
//   subscription makes it one message's delivery in the usual one.
// A SUBSCRIBE or a PUBLISH that fails (refused by an ACL without pub/sub,
// NOPERM; a publish past its deadline) is logged once, until one succeeds
// again. A publish does not go through the guard: a Redis that refuses
// pub/sub is not a failing store, and must not open the breaker.
//
// Messages: JSON, `{ "from": <id>, "reset": [key] }` or
// `{ "from": <id>, "refund": [keys] }`. A limiter skips its own (it has
// applied the change already) and anything it cannot read.
//
// The subscriber follows the app's client: once that client has ended
// (quit or disconnect, no reconnection: 'end'), the subscriber is closed
// too, so tollgate never keeps alive a process whose client the app let go;
// and it closes when the last limiter using it is closed.

import { randomUUID } from 'node:crypto'
import type { StoreClient } from '../store/client.js'
import { realTime, type Clock, type Time } from './clock.js'
import { Deadlines } from './deadline.js'
import { join, type Membership } from './subscription.js'
import type { Logger } from './types.js'

/** What the limiter does with the changes it hears of; `at` is the limiter's monotonic clock on arrival. */
export interface ChangeHandlers {
  reset (key: string, at: number): void
  refund (keys: readonly string[], at: number): void
  /** A subscription started at `at` after a loss: changes made before may have gone unheard. */
  resubscribed (at: number): void
}

/** The name of our connection in CLIENT LIST. */
export const SUBSCRIBER_NAME = 'tollgate:changes'

export class Invalidations {
  readonly #client: StoreClient
  readonly #channel: string
  readonly #id = randomUUID()
  readonly #handlers: ChangeHandlers
  readonly #logger: Logger | undefined
  readonly #deadlines: Deadlines
  readonly #clock: Clock
  /** This limiter's place on the connection shared by the limiters of its client and prefix (lib/core/subscription.ts). */
  readonly #membership: Membership | undefined
  /** A SUBSCRIBE, or a PUBLISH, failed since the last success: logged once. */
  #refused = { subscribe: false, publish: false }

  constructor (client: StoreClient, prefix: string, handlers: ChangeHandlers, logger: Logger | undefined, time: Time = realTime) {
    this.#clock = () => time.now()
    this.#deadlines = new Deadlines(time)
    this.#client = client
    this.#channel = `${prefix}:changes`
    this.#handlers = handlers
    this.#logger = logger
    if (this.#client.status === 'end') return
    this.#membership = join(this.#client, this.#channel, SUBSCRIBER_NAME, {
      message: (text) => { this.#received(text) },
      subscribed: (afterLoss) => {
        this.#refused.subscribe = false
        if (afterLoss) this.#handlers.resubscribed(this.#clock())
      },
      refused: (err) => {
        if (this.#refused.subscribe) return
        this.#refused.subscribe = true
        this.#logger?.warn({ err, channel: this.#channel }, 'tollgate: could not subscribe to the resets and refunds of other app servers; they reach this one only when its cached denials age out (denialCache.maxAgeMs)')
      }
    })
  }

  /** Tells the other servers that `key` was reset (after Redis applied it). */
  async reset (key: string, timeoutMs: number): Promise<void> {
    await this.#publish({ from: this.#id, reset: [key] }, timeoutMs)
  }

  /** Tells the other servers that `keys` were refunded (after Redis applied it). */
  async refund (keys: readonly string[], timeoutMs: number): Promise<void> {
    await this.#publish({ from: this.#id, refund: keys }, timeoutMs)
  }

  /** Leaves the subscription (its connection closes with the last limiter to leave; never the app's client). Changes made here are still published. */
  close (): void {
    this.#membership?.leave()
  }

  #received (message: string): void {
    let parsed: unknown
    try {
      parsed = JSON.parse(message)
    } catch {
      return
    }
    if (typeof parsed !== 'object' || parsed === null) return
    const { from, reset, refund }: { from?: unknown, reset?: unknown, refund?: unknown } = parsed
    if (from === this.#id) return
    const at = this.#clock()
    if (isKeys(reset)) for (const key of reset) this.#handlers.reset(key, at)
    else if (isKeys(refund)) this.#handlers.refund(refund, at)
  }

  async #publish (message: object, timeoutMs: number): Promise<void> {
    try {
      await this.#deadlines.wrap(this.#client.publish(this.#channel, JSON.stringify(message)), timeoutMs)
      this.#refused.publish = false
    } catch (err) {
      if (this.#refused.publish) return
      this.#refused.publish = true
      this.#logger?.warn({ err, channel: this.#channel }, 'tollgate: the other app servers may not have been told of a reset or refund (PUBLISH failed or missed its deadline); they see it when their cached denials age out (denialCache.maxAgeMs)')
    }
  }
}

function isKeys (value: unknown): value is string[] {
  return Array.isArray(value) && value.length > 0 && value.every((key) => typeof key === 'string')
}
