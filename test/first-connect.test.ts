// A client that has never been connected yet (ioredis's lazyConnect, an
// ioredis client made a moment ago, a node-redis client nobody connected):
// its "not connected" failures answer by the failure mode at once, but they
// do not open the breaker, so the first request after the client connects
// is decided by Redis, not a cool-down later. A flood starts with the
// client: bursts of 10 decisions every 5 ms.

import diagnostics from 'node:diagnostics_channel'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { createClient } from 'redis'
import t from 'tap'
import { createLimiter, type Policy } from '../lib/index.js'
import type { RedisClient } from '../lib/store/client.js'
import { uniquePrefix } from './helpers/app.js'
import { redisUrl } from './helpers/redis.js'

const url = await redisUrl(t)
const policy: Policy = { bucket: 'b', capacity: 1000, refillPerSecond: 1, failureMode: 'open' }
/** The breaker's cool-down: a client whose first failures opened it would wait this long. */
const COOLDOWN_MS = 1000
/**
 * Most the first decision by Redis may come after the client turned ready:
 * the next burst (5 ms) plus a decision's round trip, with room for a busy
 * 2-core machine; far below the cool-down.
 */
const WITHIN_MS = 250

interface Client { redis: RedisClient, onReady (listener: () => void): void, close (): Promise<void> }

const clients: Array<{ label: string, make: () => Client }> = [
  {
    label: 'ioredis with lazyConnect (tollgate connects it on first use)',
    make: () => {
      const redis = new Redis(url, { lazyConnect: true, enableOfflineQueue: false })
      return { redis, onReady: (listener) => redis.once('ready', listener), close: async () => { redis.disconnect() } }
    }
  },
  {
    label: 'ioredis made just now (connecting)',
    make: () => {
      const redis = new Redis(url, { enableOfflineQueue: false })
      return { redis, onReady: (listener) => redis.once('ready', listener), close: async () => { redis.disconnect() } }
    }
  },
  {
    label: 'node-redis nobody connected (tollgate connects it on first use)',
    make: () => {
      const redis = createClient({ url })
      redis.on('error', () => {})
      return { redis, onReady: (listener) => redis.once('ready', listener), close: async () => { await redis.close().catch(() => {}) } }
    }
  }
]

for (const { label, make } of clients) {
  t.test(`${label}: decided by Redis from the first burst after it is ready; the breaker never opens`, async (t) => {
    const client = make()
    t.teardown(() => client.close())
    let readyAt: number | undefined
    client.onReady(() => { readyAt ??= performance.now() })
    const states: string[] = []
    const listener = (message: unknown): void => { states.push((message as { state: string }).state) }
    diagnostics.subscribe('tollgate:breaker', listener)
    t.teardown(() => diagnostics.unsubscribe('tollgate:breaker', listener))
    const limiter = createLimiter({ redis: client.redis, prefix: uniquePrefix(), timeout: 100, denialCache: false })
    t.teardown(() => limiter.close())

    const started = performance.now()
    let storeAt: number | undefined
    let fellBack = 0
    while (storeAt === undefined && performance.now() - started < 3 * COOLDOWN_MS) {
      const burst = await Promise.all(Array.from({ length: 10 }, () => limiter.consume('c', policy)))
      for (const d of burst) if (d.source !== 'store') fellBack++
      if (burst.some((d) => d.source === 'store')) storeAt = performance.now()
      await sleep(5)
    }
    t.ok(readyAt !== undefined && storeAt !== undefined, 'the client connected and Redis decided')
    const connectMs = (readyAt ?? NaN) - started
    const lateMs = (storeAt ?? NaN) - (readyAt ?? NaN)
    t.comment(`ready ${connectMs.toFixed(1)} ms after first use; first decision by Redis ${lateMs.toFixed(1)} ms after ready; ${fellBack} decisions by the failure mode before`)
    t.ok(fellBack > 0, 'decisions asked before the client was ready followed the failure mode')
    t.ok(lateMs < WITHIN_MS, `first decision by Redis ${lateMs.toFixed(1)} ms after the client turned ready (under ${WITHIN_MS})`)
    t.same(states, [], 'the breaker never opened')
  })
}
