// One subscriber connection per app client and channel, whatever the
// number of limiters on them (lib/core/invalidation.ts says what goes over
// it). An app that makes a limiter per route, as Express and Hono apps do
// with `rateLimit()`, would otherwise open a connection per limiter, and a
// listener per limiter on its client (past ten, Node's
// MaxListenersExceededWarning).
//
// The limiters of one client and key prefix join one Subscription: it
// opens the connection when the first joins, passes every message to each
// of them, opens a new connection after a loss (each member is told, so
// that it drops what it may have missed), and closes it when the last one
// leaves, or once the app's client has ended. The app's client is never
// closed, and carries one 'end' listener of ours per Subscription
// (the client adapters fan one listener out: lib/store/clients/fan-out.ts).

import type { StoreClient } from '../store/client.js'

/** What a member of a Subscription is told. */
export interface Member {
  message (text: string): void
  /** SUBSCRIBE succeeded; `afterLoss`: a connection was lost or refused since this member's last one. */
  subscribed (afterLoss: boolean): void
  refused (err: unknown): void
}

/** A member's place in its Subscription. */
export interface Membership {
  /** Leaves it: the last member to leave closes the connection. */
  leave (): void
}

const RETRY_MIN_MS = 50
const RETRY_MAX_MS = 2000

// Per client adapter (one per client object), per channel.
const open = new WeakMap<StoreClient, Map<string, Subscription>>()

/** Joins the subscription of `client` to `channel`, opening it when none is. */
export function join (client: StoreClient, channel: string, name: string, member: Member): Membership {
  let byChannel = open.get(client)
  if (byChannel === undefined) {
    byChannel = new Map()
    open.set(client, byChannel)
  }
  let subscription = byChannel.get(channel)
  if (subscription === undefined) {
    subscription = new Subscription(client, channel, name, () => { byChannel.delete(channel) })
    byChannel.set(channel, subscription)
  }
  return subscription.add(member)
}

class Subscription {
  readonly #client: StoreClient
  readonly #channel: string
  readonly #name: string
  readonly #closed: () => void
  /** Each member with whether a connection was lost or refused since its last subscription. */
  readonly #members = new Map<Member, { gap: boolean }>()
  #subscriber: { close (): void } | undefined
  readonly #offEnd: () => void
  #retryMs = RETRY_MIN_MS
  #timer: NodeJS.Timeout | undefined

  constructor (client: StoreClient, channel: string, name: string, closed: () => void) {
    this.#client = client
    this.#channel = channel
    this.#name = name
    this.#closed = closed
    // Follows the app's client: once it has ended for good, so does the subscriber.
    this.#offEnd = client.onEnd(() => { this.#close() })
    this.#connect()
  }

  add (member: Member): Membership {
    this.#members.set(member, { gap: false })
    return {
      leave: () => {
        if (!this.#members.delete(member) || this.#members.size > 0) return
        this.#close()
      }
    }
  }

  #close (): void {
    clearTimeout(this.#timer)
    this.#offEnd()
    this.#subscriber?.close()
    this.#subscriber = undefined
    this.#members.clear()
    this.#closed()
  }

  #connect (): void {
    this.#subscriber = this.#client.subscribe(this.#channel, this.#name, {
      message: (text) => { for (const member of [...this.#members.keys()]) member.message(text) },
      subscribed: () => {
        this.#retryMs = RETRY_MIN_MS
        for (const [member, state] of [...this.#members]) {
          member.subscribed(state.gap)
          state.gap = false
        }
      },
      refused: (err) => { for (const member of [...this.#members.keys()]) member.refused(err) },
      ended: () => {
        this.#subscriber = undefined
        for (const state of this.#members.values()) state.gap = true
        this.#retry()
      }
    })
  }

  /** A new connection after a pause that doubles up to RETRY_MAX_MS; the timer never keeps the process alive. */
  #retry (): void {
    this.#timer = setTimeout(() => { this.#connect() }, this.#retryMs).unref()
    this.#retryMs = Math.min(RETRY_MAX_MS, this.#retryMs * 2)
  }
}
