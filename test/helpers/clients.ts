// Every Redis client family tollgate takes, made the same way for tests:
// a client on one Redis (not connected: tollgate connects the ones that
// wait, as ioredis's lazyConnect), or on a Cluster (connected), with a
// close that never throws.

import { readFile } from 'node:fs/promises'
import { createClient, createCluster } from 'redis'
import * as redis4 from 'redis4'
import * as redis5 from 'redis5'
import { Cluster as ValkeyCluster, Redis as Valkey } from 'iovalkey'
import { Cluster as IoCluster, Redis as IoRedis } from 'ioredis'
import { GlideClient, GlideClusterClient } from '@valkey/valkey-glide'
import type { RedisClient } from '../../lib/index.js'

export interface Made {
  client: RedisClient
  /** Connects it, as the app would before using it (GLIDE's is connected already). */
  connect (): Promise<void>
  close (): Promise<void>
}

export interface Family {
  /** e.g. 'node-redis 6 RESP3' */
  label: string
  /** The package and version the client comes from. */
  version: string
  /** A client of the Redis at `url`; GLIDE's connect when created, the others when tollgate asks. */
  standalone (url: string): Promise<Made>
  /** A connected client of a Cluster, or undefined where the family has none. */
  cluster? (nodes: ReadonlyArray<{ host: string, port: number }>): Promise<Made>
}

async function version (name: string): Promise<string> {
  const file = new URL(`../../node_modules/${name}/package.json`, import.meta.url)
  return (JSON.parse(await readFile(file, 'utf8')) as { version: string }).version
}

function quiet<T extends { on (event: 'error', listener: (err: unknown) => void): unknown }> (client: T): T {
  client.on('error', () => {})
  return client
}

/** Closes a node-redis client or cluster, whatever its state. */
function nodeRedisClose (client: { destroy (): void }): () => Promise<void> {
  return async () => {
    try {
      client.destroy()
    } catch {}
  }
}

function hostPort (url: string): { host: string, port: number } {
  const { hostname, port } = new URL(url)
  return { host: hostname, port: Number(port) }
}

// A node-redis client made for tests never reconnects forever to a server a test killed for good.
const reconnect = (retries: number): number => Math.min(50 * 2 ** retries, 500)

export const families: Family[] = [
  {
    label: 'node-redis 6',
    version: await version('redis'),
    async standalone (url) {
      const client = quiet(createClient({ url, socket: { reconnectStrategy: reconnect } }))
      return { client, connect: async () => { await client.connect() }, close: nodeRedisClose(client) }
    },
    async cluster (nodes) {
      const client = quiet(createCluster({ rootNodes: nodes.map((n) => ({ socket: n })) }))
      await client.connect()
      return { client, connect: async () => {}, close: nodeRedisClose(client) }
    }
  },
  {
    label: 'node-redis 6 RESP2, database 3',
    version: await version('redis'),
    async standalone (url) {
      const client = quiet(createClient({ url, RESP: 2, database: 3, socket: { reconnectStrategy: reconnect } }))
      return { client, connect: async () => { await client.connect() }, close: nodeRedisClose(client) }
    }
  },
  {
    label: 'node-redis 5 RESP3',
    version: await version('redis5'),
    async standalone (url) {
      const client = quiet(redis5.createClient({ url, RESP: 3, socket: { reconnectStrategy: reconnect } }))
      return { client, connect: async () => { await client.connect() }, close: nodeRedisClose(client) }
    },
    async cluster (nodes) {
      const client = quiet(redis5.createCluster({ rootNodes: nodes.map((n) => ({ socket: n })) }))
      await client.connect()
      return { client, connect: async () => {}, close: nodeRedisClose(client) }
    }
  },
  {
    label: 'node-redis 4, isolationPoolOptions',
    version: await version('redis4'),
    async standalone (url) {
      const client = quiet(redis4.createClient({ url, isolationPoolOptions: { min: 1, max: 4 }, socket: { reconnectStrategy: reconnect } }))
      return { client, connect: async () => { await client.connect() }, close: async () => { await client.disconnect().catch(() => {}) } }
    },
    async cluster (nodes) {
      const client = quiet(redis4.createCluster({ rootNodes: nodes.map((n) => ({ socket: n })) }))
      await client.connect()
      return { client, connect: async () => {}, close: async () => { await client.disconnect().catch(() => {}) } }
    }
  },
  {
    label: 'iovalkey',
    version: await version('iovalkey'),
    async standalone (url) {
      const client = quiet(new Valkey(url, { lazyConnect: true, maxRetriesPerRequest: 1 }))
      return { client, connect: () => client.connect(), close: async () => { client.disconnect() } }
    },
    async cluster (nodes) {
      const client = quiet(new ValkeyCluster([...nodes]))
      await new Promise<void>((resolve) => client.once('ready', () => resolve()))
      return { client, connect: async () => {}, close: async () => { client.disconnect() } }
    }
  },
  {
    label: 'GLIDE',
    version: await version('@valkey/valkey-glide'),
    async standalone (url) {
      const client = await GlideClient.createClient({ addresses: [hostPort(url)], requestTimeout: 1000 })
      return { client, connect: async () => {}, close: async () => { client.close() } }
    },
    async cluster (nodes) {
      // Topology checked every second, as the ioredis Clusters of test/failover.test.ts refresh their slots:
      // GLIDE learns that a hung master was replaced only by such a check.
      const client = await GlideClusterClient.createClient({ addresses: [...nodes], requestTimeout: 1000, periodicChecks: { duration_in_sec: 1 } })
      return { client, connect: async () => {}, close: async () => { client.close() } }
    }
  }
]

/** ioredis, the reference the other families are compared with (test/clients-fleet.test.ts). */
export const ioredisFamily: Family = {
  label: 'ioredis 5',
  version: await version('ioredis'),
  async standalone (url) {
    const client = quiet(new IoRedis(url, { lazyConnect: true, maxRetriesPerRequest: 1 }))
    return { client, connect: () => client.connect(), close: async () => { client.disconnect() } }
  },
  async cluster (nodes) {
    const client = quiet(new IoCluster([...nodes]))
    await new Promise<void>((resolve) => client.once('ready', () => resolve()))
    return { client, connect: async () => {}, close: async () => { client.disconnect() } }
  }
}
