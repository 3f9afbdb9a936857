// The client families tollgate takes, told apart by what the object has,
// never by importing a client package: each is an optional peer. Without
// the packages' types, the adapters here read a client through the members
// they have just checked it has (the `as` of this folder: a record to
// look into, then the family's own shape once recognised).

import type { RedisClient, StoreClient } from '../client.js'
import { glideClient, isGlide } from './glide.js'
import { ioredisClient, isIoredis } from './ioredis.js'
import { isNodeRedis, nodeRedisClient } from './node-redis.js'
import { prop } from './props.js'

/** What `redis` accepts, for the start-up error. */
export const ACCEPTED_CLIENTS = 'an ioredis or iovalkey Redis or Cluster, a node-redis createClient() or createCluster() client, or a GLIDE GlideClient or GlideClusterClient'

/** The family of a client, or undefined for anything tollgate does not take. */
export function clientFamily (value: unknown): 'ioredis' | 'node-redis' | 'glide' | undefined {
  if (typeof value !== 'object' || value === null) return undefined
  if (unsupported(value) !== undefined) return undefined
  if (isIoredis(value)) return 'ioredis'
  if (isNodeRedis(value)) return 'node-redis'
  if (isGlide(value)) return 'glide'
  return undefined
}

/** Clients of the families above that tollgate does not take, by what they are. */
function unsupported (value: object): string | undefined {
  if (typeof prop(value, 'getMasterNode') === 'function') return 'a node-redis createSentinel() client'
  if (typeof prop(value, 'idleClients') === 'number' && typeof prop(value, 'execute') === 'function') return 'a node-redis createClientPool() pool'
  return undefined
}

/**
 * What a value that clientFamily refused is, for the start-up error: the
 * known client kinds tollgate does not take by name, any other object by
 * its class (a plain object as JSON).
 */
export function describeClient (value: unknown, describe: (value: unknown) => string): string {
  if (typeof value !== 'object' || value === null) return describe(value)
  const known = unsupported(value)
  if (known !== undefined) return known
  const name = prop(prop(value, 'constructor'), 'name')
  if (typeof name === 'string' && name !== '' && name !== 'Object') return `an instance of ${name}`
  return describe(value)
}

// One adapter per client object: the start-up wait, the store and the
// subscriber of one limiter (and of several over one client) share it.
const adapters = new WeakMap<object, StoreClient>()

/**
 * The StoreClient of a client that clientFamily accepted (options parsing
 * refuses any other): not ioredis nor node-redis, it is GLIDE.
 */
export function storeClient (client: RedisClient): StoreClient {
  let adapter = adapters.get(client)
  if (adapter === undefined) {
    adapter = isIoredis(client) ? ioredisClient(client) : isNodeRedis(client) ? nodeRedisClient(client) : glideClient(client)
    adapters.set(client, adapter)
  }
  return adapter
}
