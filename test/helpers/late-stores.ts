// The stores of the child apps of test/helpers/late.ts (express-late.ts,
// hono-late.ts): Redis, and Redis behind a proxy made slow (SLOW_MS per
// reply) once the limits are ready, with the options of their two limits:
// `wait`, capacity 1 at 5/s, and `slow`, capacity 1 at 0.01/s inside a 2 s
// deadline, so that a slow reply arrives well after the apps' timeouts.

import type { Server } from 'node:http'
import { Redis } from 'ioredis'
import type { Logger } from '../../lib/core/types.js'
import { memoryLogger } from './express.js'
import { startProxy, type RedisProxy } from './proxy.js'

export const SLOW_MS = 150

interface LimitOptions { redis: Redis, prefix: string, capacity: number, refillPerSecond: number, failureMode: 'closed', timeout: number, logger: Logger }

export interface LateStores {
  redis: Redis
  slowRedis: Redis
  proxy: RedisProxy
  wait: LimitOptions
  slow: LimitOptions
  /** Once the limits are ready (their start-up calls are not slowed): every reply SLOW_MS later. */
  slowDown (): void
}

export async function lateStores (url: string, prefix: string): Promise<LateStores> {
  const redis = new Redis(url)
  const proxy = await startProxy(url)
  const slowRedis = new Redis(proxy.url)
  return {
    redis,
    slowRedis,
    proxy,
    wait: { redis, prefix, capacity: 1, refillPerSecond: 5, failureMode: 'closed', timeout: 1000, logger: memoryLogger() },
    slow: { redis: slowRedis, prefix, capacity: 1, refillPerSecond: 0.01, failureMode: 'closed', timeout: 2000, logger: memoryLogger() },
    slowDown: () => { proxy.delayMs = SLOW_MS }
  }
}

/**
 * Listens on a free port of 127.0.0.1 and prints `port <n>`; on SIGTERM
 * closes the server, then `close` (the app's limits), the proxy and the clients.
 */
export function serveLate (server: Server, stores: LateStores, close: () => Promise<unknown>): void {
  server.listen(0, '127.0.0.1', () => {
    const address = server.address()
    process.stdout.write(`port ${typeof address === 'object' && address !== null ? address.port : 0}\n`)
  })
  process.once('SIGTERM', () => {
    server.closeAllConnections()
    server.close()
    void Promise.all([close(), stores.proxy.close()]).then(() => {
      stores.redis.disconnect()
      stores.slowRedis.disconnect()
    })
  })
}
