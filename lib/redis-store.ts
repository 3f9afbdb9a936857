import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import type { Cluster, Redis, Result } from 'ioredis'
import { StoreError } from './errors.js'
import { bucketState, type BucketSpec, type BucketState, type LeaseReply, type LeaseStore, type Store, type StoreReply } from './store.js'
import type { RedisClient as Client } from './types.js'

type RedisClient = Redis | Cluster

const LUA = readFileSync(new URL('../lua/token-bucket.lua', import.meta.url), 'utf8')
const LEASE_LUA = readFileSync(new URL('../lua/lease.lua', import.meta.url), 'utf8')

/**
 * Command name on the user's client: the package name plus the script's
 * hash, so two versions of tollgate (or another plugin) sharing one client
 * never overwrite each other's command.
 */
export const SCRIPT_COMMAND = commandName(LUA)
export const LEASE_COMMAND = commandName(LEASE_LUA)

function commandName (lua: string): `tollgate_${string}` {
  return `tollgate_${createHash('sha1').update(lua).digest('hex').slice(0, 12)}`
}

function isCluster (redis: RedisClient): redis is Cluster {
  return redis.isCluster
}

type ScriptReply = Array<string | number>


declare module 'ioredis' {
  interface RedisCommander<Context> {
    [command: `tollgate_${string}`]: (...args: Array<string | number>) => Result<ScriptReply, Context>
  }
}

/**
 * Buckets in Redis, decided by lua/token-bucket.lua. ioredis's
 * defineCommand does EVALSHA, falls back to EVAL on first use, and recovers
 * from NOSCRIPT after a script flush or a failover.
 *
 * A command is only sent while the client is connected: when it is not,
 * the call fails at once instead of waiting in the client's offline queue.
 */
export class RedisStore implements Store, LeaseStore {
  readonly #redis: RedisClient

  constructor (client: Client) {
    const redis = client as RedisClient
    this.#redis = redis
    if (typeof redis[SCRIPT_COMMAND] !== 'function') redis.defineCommand(SCRIPT_COMMAND, { lua: LUA })
    if (typeof redis[LEASE_COMMAND] !== 'function') redis.defineCommand(LEASE_COMMAND, { lua: LEASE_LUA, numberOfKeys: 1 })
  }

  #ready (): void {
    if (this.#redis.status !== 'ready') {
      throw new StoreError('TOLLGATE_STORE_DOWN', `Redis is not connected (status ${this.#redis.status})`)
    }
  }

  async decide (specs: readonly BucketSpec[], consume: boolean): Promise<StoreReply> {
    this.#ready()
    const args: Array<string | number> = []
    for (const spec of specs) args.push(spec.key)
    args.push(consume ? '1' : '0')
    for (const spec of specs) args.push(spec.capacity, spec.refillPerSecond, spec.cost)
    const reply = await this.#redis[SCRIPT_COMMAND]!(specs.length, ...args) as number[]
    const buckets: BucketState[] = []
    let allowed = true
    for (let i = 0; i < specs.length; i++) {
      const value = reply[i] as number
      if (value < 0) allowed = false
      buckets.push(bucketState(value, specs[i] as BucketSpec))
    }
    return { allowed, buckets }
  }

  async lease (spec: BucketSpec, most: number, giveBack: number, giveBackFrom: number): Promise<LeaseReply> {
    this.#ready()
    const reply = await this.#redis[LEASE_COMMAND]!(spec.key, spec.capacity, spec.refillPerSecond, spec.cost, most, giveBack, giveBackFrom)
    return {
      taken: Number(reply[0]),
      nowUs: Number(reply[1]),
      bucket: { remaining: Number(reply[2]), fullInUs: Number(reply[3]), waitUs: Number(reply[4]) }
    }
  }

  /**
   * A Cluster client keeps sending a slot to a master that hangs (its socket
   * stays open) until its slot map is refreshed, even after a replica took
   * over: refresh it whenever the breaker opens.
   */
  recover (): void {
    const redis = this.#redis
    if (isCluster(redis)) redis.refreshSlotsCache(() => {})
  }

  /**
   * Loads the scripts on every master, which also opens the connections, so
   * the first decisions after start-up need neither. Failures are ignored:
   * the failure modes cover a store that is not there yet.
   */
  async warm (): Promise<void> {
    const redis = this.#redis
    const nodes: Redis[] = isCluster(redis) ? redis.nodes('master') : [redis]
    await Promise.allSettled(nodes.flatMap((node) => [LUA, LEASE_LUA].map((lua) => node.script('LOAD', lua))))
  }

  async reset (key: string): Promise<void> {
    this.#ready()
    await this.#redis.del(key)
  }
}
