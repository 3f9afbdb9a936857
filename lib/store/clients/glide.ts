// @valkey/valkey-glide's GlideClient and GlideClusterClient as a
// StoreClient, through `customCommand` (routed by key on a Cluster).
//
// GLIDE has no connection status and no events: a client exists once it
// has connected (`createClient` resolves then), reconnects by itself and
// fails its commands while it cannot reach the server, which the guard
// counts as for any client. It is 'ready' until closed. Its reply errors
// name the error's kind instead of Redis's code ("... - NoScriptError:
// No matching script"): they are rewritten to Redis's form ("NOSCRIPT No
// matching script"), which the rest of tollgate reads.

import type { ClientStatus, StoreClient, SubscriberEvents } from '../client.js'
import { seedAddress } from './address.js'
import { fanOut } from './fan-out.js'
import { prop } from './props.js'
import { replyError } from '../errors.js'

type Route = { type: 'primarySlotKey', key: string } | 'allPrimaries' | 'randomNode'

interface Glide {
  customCommand (args: readonly string[], options?: { route?: Route }): Promise<unknown>
  close (message?: string): void
  /** Private in GLIDE's types: the configuration the client was created with, copied for a subscriber. */
  readonly config?: Record<string, unknown> & { addresses?: unknown[] }
  /** Protected in GLIDE's types. */
  readonly isClosed?: boolean
  readonly constructor: { createClient?: (config: Record<string, unknown>) => Promise<Glide> }
}

/** A GLIDE client: `customCommand`, `invokeScript` and `close`. */
export function isGlide (value: object): boolean {
  return typeof prop(value, 'customCommand') === 'function' && typeof prop(value, 'invokeScript') === 'function' && typeof prop(value, 'close') === 'function'
}

/** GlideClusterClient's own members: commands with a route. */
function isCluster (client: Glide): boolean {
  return typeof prop(client, 'fcallWithRoute') === 'function'
}

const SERVER_ERROR = /^An error was signalled by the server: - (\w+): /
const CODES: Record<string, string> = { NoScriptError: 'NOSCRIPT', PermissionDenied: 'NOPERM', ResponseError: 'ERR' }

/** GLIDE's other form of a reply error, a script's own among them: Redis's code, a colon, its words ("WRONGTYPE: ..."). */
const CODED_ERROR = /^([A-Z][A-Z_]*): /

/** A GLIDE reply error in Redis's form (its original as `cause`); any other error as it is. */
function redisError (err: unknown): unknown {
  // Object() boxes a value that is no object, whose message reads undefined.
  const message = String(Reflect.get(Object(err), 'message'))
  const match = SERVER_ERROR.exec(message)
  if (match !== null) {
    // The group is not optional: a match always holds it.
    const kind = String(match[1])
    return replyError(`${CODES[kind] ?? kind} ${message.slice(match[0].length)}`, err)
  }
  const coded = CODED_ERROR.exec(message)
  return coded === null ? err : replyError(`${String(coded[1])} ${message.slice(coded[0].length)}`, err)
}

const POLL_MS = 1000

/**
 * What GLIDE needs done where other clients need something: it is never
 * 'wait' (it exists once connected), tells of no ready, and keeps a
 * Cluster's slot map by itself.
 */
const nothing = (): void => {}

export function glideClient (user: object): StoreClient {
  const client = user as Glide
  const cluster = isCluster(client)
  const send = (key: string | undefined, args: string[]): Promise<unknown> => {
    const call = cluster && key !== undefined ? client.customCommand(args, { route: { type: 'primarySlotKey', key } }) : client.customCommand(args)
    return call.catch((err: unknown) => { throw redisError(err) })
  }
  const script = (command: string, body: string, numKeys: number, args: ReadonlyArray<string | number>): Promise<unknown> => {
    const list = new Array<string>(args.length)
    for (let i = 0; i < args.length; i++) list[i] = String(args[i])
    return send(list[0], [command, body, String(numKeys), ...list])
  }
  const addresses = client.config?.addresses ?? []
  return {
    family: 'glide',
    cluster,
    // A client that keeps its configuration out of sight is named, not left blank.
    target: addresses.length === 0 ? 'a GLIDE client' : `${cluster ? 'cluster seeds ' : ''}${addresses.map((node) => seedAddress(node, 'GLIDE')).join(', ')}`,
    get status (): ClientStatus {
      return client.isClosed === true ? 'end' : 'ready'
    },
    connect: nothing,
    onReady: () => nothing,
    // No event tells of a close: it is looked for once a second, by one timer whoever listens.
    onEnd: fanOut((call) => {
      const timer = setInterval(() => {
        if (client.isClosed !== true) return
        clearInterval(timer)
        call()
      }, POLL_MS).unref()
      return () => { clearInterval(timer) }
    }),
    evalsha: (sha, numKeys, args) => script('EVALSHA', sha, numKeys, args),
    eval: (lua, numKeys, args) => script('EVAL', lua, numKeys, args),
    isNoScript: (err) => err instanceof Error && err.message.startsWith('NOSCRIPT'),
    async loadScripts (scripts) {
      await Promise.allSettled(scripts.map((lua) => cluster ? client.customCommand(['SCRIPT', 'LOAD', lua], { route: 'allPrimaries' }) : client.customCommand(['SCRIPT', 'LOAD', lua])))
    },
    del: (keys) => send(keys[0], ['DEL', ...keys]),
    publish: (channel, message) => send(undefined, ['PUBLISH', channel, message]),
    subscribe: (channel, name, events) => subscribe(client, send, channel, name, events),
    refresh: nothing
  }
}

/**
 * Rejects when the server refuses the user the channel (an ACL without
 * it), asked by an empty PUBLISH on the app's client: subscribers take
 * an empty message for nothing (lib/core/invalidation.ts reads only JSON).
 * A subscriber client made for a refused channel would not fail: GLIDE
 * tries to subscribe again in a tight loop until its creation times out,
 * logging each refusal at its error level (thousands of lines a second on
 * the app's standard output). Any other failure of the PUBLISH (a user
 * that may subscribe but not publish, a slow server) leaves the
 * subscription to be tried.
 */
function channelAllowed (send: (key: undefined, args: string[]) => Promise<unknown>, channel: string): Promise<void> {
  return send(undefined, ['PUBLISH', channel, '']).then(() => {}, (err: unknown) => {
    if (err instanceof Error && err.message.startsWith('NOPERM') && /channel/i.test(err.message)) throw err
  })
}

/**
 * A new client of the same class and configuration, subscribed to
 * `channel` from its creation (GLIDE's way: it resubscribes by itself
 * after a reconnection, so no loss is told of, and `denialCache.maxAgeMs`
 * is the bound on what a lost message costs).
 */
function subscribe (client: Glide, send: (key: undefined, args: string[]) => Promise<unknown>, channel: string, name: string, events: SubscriberEvents): { close (): void } {
  let closed = false
  let sub: Glide | undefined
  const create = client.constructor.createClient
  const config = client.config
  const opened = create === undefined || config === undefined
    ? Promise.reject(new Error('this GLIDE client does not show the configuration it was created with'))
    : channelAllowed(send, channel).then(() => create.call(client.constructor, {
      ...config,
      clientName: name,
      pubsubSubscriptions: {
        channelsAndPatterns: { 0: new Set([channel]) },
        callback: (msg: { message: unknown }) => { if (!closed) events.message(String(msg.message)) }
      }
    }))
  opened.then((conn) => {
    sub = conn
    if (closed) return conn.close()
    events.subscribed()
  }, (err: unknown) => {
    if (closed) return
    events.refused(err)
    events.ended()
  })
  return {
    close () {
      closed = true
      sub?.close()
    }
  }
}
