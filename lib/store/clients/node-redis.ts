// node-redis 4, 5 and 6 (`redis`, `@redis/client`): `createClient()` and
// `createCluster()`, RESP2 or RESP3, any `database`, as a StoreClient.
// Everything goes through `sendCommand`, the client's raw command path
// (no command parser, no reply transform): a Lua integer comes back a
// number and a table an array in both protocols. A Cluster's `sendCommand`
// takes the key that routes the call.

import type { ClientStatus, StoreClient, SubscriberEvents } from '../client.js'
import { seedAddress, socketAddress, urlAddress } from './address.js'
import { fanOut } from './fan-out.js'
import { prop } from './props.js'
import { replyError } from '../errors.js'

interface Options { url?: string, socket?: Record<string, unknown>, rootNodes?: unknown[] }

/** The members of a node-redis client (or Cluster) used here. */
interface NodeRedis {
  readonly isOpen: boolean
  /** Not on node-redis 5's Cluster: open, and its slots known, is ready there (its 'connect' event). */
  readonly isReady?: boolean
  readonly options?: Options | undefined
  /** A Cluster's options (it has no `options`). */
  readonly _options?: Options | undefined
  connect (): Promise<unknown>
  on (event: string, listener: (...args: unknown[]) => void): unknown
  off (event: string, listener: (...args: unknown[]) => void): unknown
  duplicate (overrides?: Record<string, unknown>): NodeRedis
  /** node-redis 5 and 6; node-redis 4 has `disconnect` only. */
  destroy? (): void
  disconnect? (): Promise<void>
  subscribe (channel: string, listener: (message: string) => void): Promise<void>
}

interface Standalone extends NodeRedis {
  sendCommand (args: readonly string[]): Promise<unknown>
}

/** A node of a Cluster's slot map, with its client once connected. */
interface Node {
  readonly address: string
  readonly client?: Standalone | undefined
}

interface Cluster extends NodeRedis {
  sendCommand (firstKey: string | undefined, isReadonly: boolean, args: readonly string[]): Promise<unknown>
  readonly masters: readonly Node[]
  readonly replicas: readonly Node[]
  nodeClient (node: unknown): Promise<Standalone>
  /** Not in node-redis's documented API: the slot map, rediscovered from a given node, skipping some. */
  readonly _slots?: { rediscover?: (startWith?: Standalone, excluded?: ReadonlySet<string>) => Promise<void> }
}

/** How long a node has to answer PING to count as alive, before a rediscovery, ms. */
const PROBE_MS = 500

/** A node-redis client or Cluster: `isOpen`, `sendCommand` and `duplicate`. */
export function isNodeRedis (value: object): boolean {
  return typeof prop(value, 'isOpen') === 'boolean' && typeof prop(value, 'sendCommand') === 'function' && typeof prop(value, 'duplicate') === 'function'
}

function isCluster (client: NodeRedis): client is Cluster {
  return typeof prop(client, 'nodeClient') === 'function'
}

function target (client: NodeRedis): string {
  const options = client.options ?? client._options ?? {}
  if (isCluster(client)) {
    // node-redis 4 keeps a Cluster's options private: its seeds are not known here.
    const seeds = options.rootNodes ?? []
    return seeds.length === 0 ? 'a node-redis cluster' : `cluster seeds ${seeds.map((node) => seedAddress(node, 'node-redis')).join(', ')}`
  }
  if (typeof options.url === 'string' && options.socket?.path === undefined) return urlAddress(options.url, 'node-redis')
  return socketAddress(options.socket)
}

/**
 * Closes a connection of ours at once. One that is not open (never
 * connected, or already lost) is left alone: node-redis 5 and 6 throw on
 * closing it, and there is nothing to close.
 */
function destroy (conn: NodeRedis | undefined): void {
  if (conn === undefined || !conn.isOpen) return
  if (conn.destroy !== undefined) conn.destroy()
  else conn.disconnect?.().catch(() => {})
}

/**
 * True for node-redis's form of an error Redis replied (its class ErrorReply,
 * or SimpleError and BlobError below it in node-redis 5 and 6), told from
 * the client's own errors (closed, timed out), which are plain Errors too.
 * The package is an optional peer, so the class is found by its name.
 */
function isErrorReply (err: unknown): err is Error {
  for (let proto: unknown = Object.getPrototypeOf(Object(err)); proto !== null; proto = Object.getPrototypeOf(proto)) {
    if (prop(prop(proto, 'constructor'), 'name') === 'ErrorReply') return true
  }
  return false
}

function strings (args: ReadonlyArray<string | number>): string[] {
  const out = new Array<string>(args.length)
  for (let i = 0; i < args.length; i++) out[i] = String(args[i])
  return out
}

export function nodeRedisClient (user: object): StoreClient {
  const client = user as NodeRedis
  // A client that ended is not connected again: it was closed by the app.
  let ended = false
  const cluster = isCluster(client) ? client : undefined
  const readyEvent = client.isReady === undefined ? 'connect' : 'ready'
  client.on('end', () => { ended = true })
  client.on(readyEvent, () => { ended = false })
  const ready = client.isReady !== undefined || cluster === undefined
    ? () => client.isReady === true
    : () => client.isOpen && cluster.masters.length > 0
  let refreshing = false
  const send = cluster === undefined
    ? (_key: string | undefined, args: string[]): Promise<unknown> => (client as Standalone).sendCommand(args)
    : (key: string | undefined, args: string[]): Promise<unknown> => cluster.sendCommand(key, false, args)
  const script = (command: string, body: string, numKeys: number, args: ReadonlyArray<string | number>): Promise<unknown> => {
    const list = strings(args)
    return send(list[0], [command, body, String(numKeys), ...list]).catch((err: unknown) => { throw isErrorReply(err) ? replyError(err.message, err) : err })
  }
  return {
    family: 'node-redis',
    target: target(client),
    cluster: cluster !== undefined,
    get status (): ClientStatus {
      if (ready()) return 'ready'
      if (client.isOpen) return 'connecting'
      return ended ? 'end' : 'wait'
    },
    connect () {
      client.connect().catch(() => {})
    },
    onReady: fanOut((call) => {
      client.on(readyEvent, call)
      return () => { client.off(readyEvent, call) }
    }),
    onEnd: fanOut((call) => {
      client.on('end', call)
      return () => { client.off('end', call) }
    }),
    evalsha: (sha, numKeys, args) => script('EVALSHA', sha, numKeys, args),
    eval: (lua, numKeys, args) => script('EVAL', lua, numKeys, args),
    isNoScript: (err) => err instanceof Error && err.message.startsWith('NOSCRIPT'),
    async loadScripts (scripts) {
      const load = (node: Standalone): Promise<unknown> => Promise.allSettled(scripts.map((lua) => node.sendCommand(['SCRIPT', 'LOAD', lua])))
      // A master whose client cannot be had fails its own load only.
      if (cluster === undefined) await load(client as Standalone)
      else await Promise.allSettled(cluster.masters.map(async (master) => await load(await cluster.nodeClient(master))))
    },
    del: (keys) => send(keys[0], ['DEL', ...keys]),
    publish: (channel, message) => send(undefined, ['PUBLISH', channel, message]),
    subscribe: (channel, name, events) => subscribe(client, channel, name, events),
    refresh () {
      if (cluster === undefined || refreshing) return
      refreshing = true
      rediscover(cluster).catch(() => {}).finally(() => { refreshing = false })
    }
  }
}

/** True when `client` answers PING within `ms`. */
async function answers (client: Standalone, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<boolean>((resolve) => { timer = setTimeout(() => resolve(false), ms).unref() })
  const ok = await Promise.race([client.sendCommand(['PING']).then(() => true, () => false), late])
  clearTimeout(timer)
  return ok
}

/**
 * A Cluster's slot map, read again from a node that answers. node-redis
 * rediscovers by itself on MOVED and on a closed connection, but a master
 * that hangs (its socket open, nothing answered) sends neither: the slot
 * stays with it after its replica took over. And a rediscovery that asks
 * the hung node first waits for ever (later ones join it): so the nodes
 * are asked for a PING first, and the rediscovery starts from one that
 * answered, skipping those that did not.
 */
async function rediscover (cluster: Cluster): Promise<void> {
  const slots = cluster._slots
  if (slots?.rediscover === undefined) return
  const nodes = [...cluster.masters, ...cluster.replicas].filter((node) => node.client?.isReady === true)
  const alive = await Promise.all(nodes.map((node) => answers(node.client as Standalone, PROBE_MS)))
  const from = nodes.find((_, i) => alive[i])
  if (from === undefined) return
  await slots.rediscover(from.client, new Set(nodes.filter((_, i) => !alive[i]).map((node) => node.address)))
}

/**
 * A duplicate of the client (of one master of a Cluster) that never
 * reconnects and queues nothing while it is not connected.
 */
function subscribe (client: NodeRedis, channel: string, name: string, events: SubscriberEvents): { close (): void } {
  // Nothing is told after close() or after the end (a SUBSCRIBE still in
  // flight when the connection is lost fails, and that is no refusal).
  let over = false
  let conn: NodeRedis | undefined
  const end = (): void => {
    if (over) return
    over = true
    events.ended()
  }
  void open().then(async (sub) => {
    conn = sub
    if (over) return destroy(sub)
    // Its failures are the store's, and show on the app's client and in the
    // guard. Without reconnection, a lost connection is told by an error
    // after which the client is no longer open (node-redis emits no 'end').
    sub.on('error', () => { if (!sub.isOpen) end() })
    sub.on('end', end)
    await sub.connect()
    try {
      await sub.subscribe(channel, (message) => { if (!over) events.message(message) })
    } catch (err) {
      if (!over) events.refused(err)
      destroy(sub)
      return end()
    }
    if (!over) events.subscribed()
  }).catch(() => {
    destroy(conn)
    end()
  })

  async function open (): Promise<NodeRedis> {
    let base: NodeRedis = client
    if (isCluster(client)) {
      const masters = client.masters
      if (masters.length === 0) throw new Error('no node known yet')
      base = await client.nodeClient(masters[Math.floor(Math.random() * masters.length)])
    }
    // node-redis 4 would copy the app's isolationPoolOptions, and open its pool's `min` connections besides this one.
    return base.duplicate({ name, disableOfflineQueue: true, isolationPoolOptions: undefined, socket: { ...base.options?.socket, reconnectStrategy: false } })
  }

  return {
    close () {
      over = true
      destroy(conn)
    }
  }
}
