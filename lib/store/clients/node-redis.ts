// node-redis 5 and 6 (`redis`, `@redis/client`): `createClient()` and
// `createCluster()`, RESP2 or RESP3, any `database`, as a StoreClient.
// Everything goes through `sendCommand`, the client's raw command path
// (no command parser, no reply transform): a Lua integer comes back a
// number and a table an array in both protocols. A Cluster's `sendCommand`
// takes the key that routes the call.

import type { ClientStatus, StoreClient, SubscriberEvents } from '../client.js'
import { seedAddress, socketAddress, urlAddress } from './address.js'

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
  destroy (): void
  subscribe (channel: string, listener: (message: string) => void): Promise<void>
}

interface Standalone extends NodeRedis {
  sendCommand (args: readonly string[]): Promise<unknown>
}

interface Cluster extends NodeRedis {
  sendCommand (firstKey: string | undefined, isReadonly: boolean, args: readonly string[]): Promise<unknown>
  readonly masters: readonly unknown[]
  nodeClient (node: unknown): Promise<Standalone>
  readonly _slots?: { rediscover?: () => Promise<void> }
}

/** A node-redis client or Cluster: `isOpen`, `sendCommand` and `duplicate`. */
export function isNodeRedis (value: Record<string, unknown>): boolean {
  return typeof value.isOpen === 'boolean' && typeof value.sendCommand === 'function' && typeof value.duplicate === 'function'
}

function isCluster (client: NodeRedis): client is Cluster {
  return typeof (client as Partial<Cluster>).nodeClient === 'function'
}

function target (client: NodeRedis): string {
  const options = client.options ?? client._options ?? {}
  if (isCluster(client)) return `cluster seeds ${(options.rootNodes ?? []).map((node) => seedAddress(node, 'node-redis')).join(', ')}`
  if (typeof options.url === 'string' && options.socket?.path === undefined) return urlAddress(options.url, 'node-redis')
  return socketAddress(options.socket)
}

/** Closes a connection of ours, whatever its state (node-redis 5 throws on a closed one). */
function destroy (conn: NodeRedis | undefined): void {
  try {
    conn?.destroy()
  } catch {}
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
  const ready = client.isReady === undefined
    ? () => client.isOpen && (cluster?.masters.length ?? 0) > 0
    : () => client.isReady === true
  const send = cluster === undefined
    ? (_key: string | undefined, args: string[]): Promise<unknown> => (client as Standalone).sendCommand(args)
    : (key: string | undefined, args: string[]): Promise<unknown> => cluster.sendCommand(key, false, args)
  const script = (command: string, body: string, numKeys: number, args: ReadonlyArray<string | number>): Promise<unknown> => {
    const list = strings(args)
    return send(list[0], [command, body, String(numKeys), ...list])
  }
  return {
    family: 'node-redis',
    target: target(client),
    get status (): ClientStatus {
      if (ready()) return 'ready'
      if (client.isOpen) return 'connecting'
      return ended ? 'end' : 'wait'
    },
    connect () {
      client.connect().catch(() => {})
    },
    onReady (listener) {
      client.on(readyEvent, listener)
      return () => { client.off(readyEvent, listener) }
    },
    onEnd (listener) {
      client.on('end', listener)
      return () => { client.off('end', listener) }
    },
    evalsha: (sha, numKeys, args) => script('EVALSHA', sha, numKeys, args),
    eval: (lua, numKeys, args) => script('EVAL', lua, numKeys, args),
    isNoScript: (err) => err instanceof Error && err.message.startsWith('NOSCRIPT'),
    async loadScripts (scripts) {
      const nodes: Standalone[] = cluster === undefined
        ? [client as Standalone]
        : (await Promise.allSettled(cluster.masters.map((master) => cluster.nodeClient(master))))
            .flatMap((r) => r.status === 'fulfilled' ? [r.value] : [])
      await Promise.allSettled(nodes.flatMap((node) => scripts.map((lua) => node.sendCommand(['SCRIPT', 'LOAD', lua]))))
    },
    del: (keys) => send(keys[0], ['DEL', ...keys]),
    publish: (channel, message) => send(undefined, ['PUBLISH', channel, message]),
    subscribe: (channel, name, events) => subscribe(client, channel, name, events),
    refresh () {
      cluster?._slots?.rediscover?.().catch(() => {})
    }
  }
}

/**
 * A duplicate of the client (of one master of a Cluster) that never
 * reconnects and queues nothing while it is not connected.
 */
function subscribe (client: NodeRedis, channel: string, name: string, events: SubscriberEvents): { close (): void } {
  let closed = false
  let conn: NodeRedis | undefined
  let done = false
  const end = (): void => {
    if (done) return
    done = true
    if (!closed) events.ended()
  }
  void open().then(async (sub) => {
    conn = sub
    if (closed) return destroy(sub)
    // Its failures are the store's, and show on the app's client and in the guard.
    sub.on('error', () => {})
    sub.on('end', end)
    await sub.connect()
    try {
      await sub.subscribe(channel, (message) => { if (!closed) events.message(message) })
    } catch (err) {
      if (!closed) events.refused(err)
      destroy(sub)
      return end()
    }
    if (!closed) events.subscribed()
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
    return base.duplicate({ name, disableOfflineQueue: true, socket: { ...base.options?.socket, reconnectStrategy: false } })
  }

  return {
    close () {
      closed = true
      destroy(conn)
    }
  }
}
