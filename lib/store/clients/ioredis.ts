// ioredis 5 and 6, and iovalkey (a fork of ioredis 5 with the same API), as
// a StoreClient. Types come from ioredis at build time only: nothing here
// is in the published declarations (lib/store/client.ts).
//
// Why EVALSHA by hand rather than ioredis's defineCommand: the wrapper's
// extra command class, callback adapter and per-socket bookkeeping cost
// about a microsecond of app CPU per call, and it adds a method to the
// user's client (and its type).

import type { Cluster, Redis, RedisOptions } from 'ioredis'
import type { ClientStatus, StoreClient, SubscriberEvents } from '../client.js'
import { hostPort, seedAddress } from './address.js'
import { prop } from './props.js'
import { fanOut } from './fan-out.js'

type Client = Redis | Cluster

/** ioredis's Redis and Cluster, told apart by the `isCluster` both have. */
export function isIoredis (value: object): boolean {
  return typeof prop(value, 'evalsha') === 'function' && typeof prop(value, 'status') === 'string' && typeof prop(value, 'isCluster') === 'boolean'
}

function isCluster (redis: Client): redis is Cluster {
  return redis.isCluster
}

/** The seed nodes of a Cluster, or where a Redis connects. */
function target (redis: Client): string {
  if (isCluster(redis)) {
    const seeds = prop(redis, 'startupNodes')
    return `cluster seeds ${(Array.isArray(seeds) ? seeds : []).map((node) => seedAddress(node, 'ioredis')).join(', ')}`
  }
  const options = redis.options
  const path = prop(options, 'path')
  const sentinels = prop(options, 'sentinels')
  if (typeof path === 'string' && path !== '') return `unix:${path}`
  if (Array.isArray(sentinels) && sentinels.length > 0) return `sentinels ${sentinels.map((node) => seedAddress(node, 'ioredis')).join(', ')} (master "${String(prop(options, 'name'))}")`
  return hostPort(prop(options, 'host'), prop(options, 'port'))
}

/** Options of a subscriber connection over those of the client it duplicates. */
function subscriberOptions (name: string): Partial<RedisOptions> {
  return {
    lazyConnect: false,
    enableOfflineQueue: false,
    // Reconnecting is the caller's, with a new connection (to another node
    // of a Cluster), so that every new subscription is told of.
    autoResubscribe: false,
    retryStrategy: () => null,
    connectionName: name
  }
}

export function ioredisClient (user: object): StoreClient {
  const client = user as Client
  return {
    family: 'ioredis',
    target: target(client),
    cluster: isCluster(client),
    get status (): ClientStatus {
      return client.status
    },
    connect () {
      client.connect().catch(() => {})
    },
    onReady: fanOut((call) => {
      client.on('ready', call)
      return () => { client.off('ready', call) }
    }),
    onEnd: fanOut((call) => {
      client.on('end', call)
      return () => { client.off('end', call) }
    }),
    evalsha: (sha, numKeys, args) => client.evalsha(sha, numKeys, ...args),
    eval: (lua, numKeys, args) => client.eval(lua, numKeys, ...args),
    isNoScript: (err) => err instanceof Error && err.message.startsWith('NOSCRIPT'),
    async loadScripts (scripts) {
      const nodes: Redis[] = isCluster(client) ? client.nodes('master') : [client]
      await Promise.allSettled(nodes.flatMap((node) => scripts.map((lua) => node.script('LOAD', lua))))
    },
    del: (keys) => client.del(...keys),
    publish: (channel, message) => client.publish(channel, message),
    subscribe: (channel, name, events) => subscribe(client, channel, name, events),
    refresh () {
      if (isCluster(client)) client.refreshSlotsCache(() => {})
    }
  }
}

/** A duplicate of the client, or of one node of a Cluster (none while it knows no node). */
function subscribe (client: Client, channel: string, name: string, events: SubscriberEvents): { close (): void } {
  // Nothing is told after close() or after the end (a SUBSCRIBE still in
  // flight when the connection ends fails, and that is no refusal).
  let over = false
  let sub: Redis | undefined
  if (!isCluster(client)) sub = client.duplicate(subscriberOptions(name))
  else {
    const nodes = client.nodes('all')
    sub = nodes[Math.floor(Math.random() * nodes.length)]?.duplicate(subscriberOptions(name))
  }
  if (sub === undefined) {
    queueMicrotask(() => { if (!over) events.ended() })
    return { close () { over = true } }
  }
  const conn = sub
  // Its failures are the store's, and show on the app's client and in the guard.
  conn.on('error', () => {})
  conn.on('message', (_channel: string, message: string) => { if (!over) events.message(message) })
  conn.on('ready', () => {
    conn.subscribe(channel).then(() => { if (!over) events.subscribed() }, (err: unknown) => {
      if (over) return
      events.refused(err)
      conn.disconnect()
    })
  })
  conn.once('end', () => {
    if (over) return
    over = true
    events.ended()
  })
  return {
    close () {
      over = true
      conn.disconnect()
    }
  }
}
