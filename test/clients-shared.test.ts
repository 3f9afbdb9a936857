// Many limiters on one client, as an Express or Hono app makes them (one
// `rateLimit()` per route or per router): whatever their number, one
// subscriber connection of tollgate's and one listener per event on the
// app's client (lib/core/subscription.ts, lib/store/clients/fan-out.ts),
// for every client family. A reset made elsewhere still reaches every
// limiter; the connection stays while one limiter uses it and closes with
// the last one. Each family runs on a redis-server of its own, so CLIENT
// LIST shows this test's connections only.

import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { SUBSCRIBER_NAME } from '../lib/core/invalidation.js'
import { rateLimit as expressLimit } from '../lib/express.js'
import { rateLimit as honoLimit } from '../lib/hono.js'
import { createLimiter, type Policy } from '../lib/index.js'
import { families, ioredisFamily } from './helpers/clients.js'
import { redisCommand, startRedisServer } from './helpers/redis.js'

/** Polls `check` every 20 ms until it is true, at most `ms`; true if it became so. */
async function until (ms: number, check: () => Promise<boolean>): Promise<boolean> {
  const end = performance.now() + ms
  while (performance.now() < end) {
    if (await check()) return true
    await sleep(20)
  }
  return await check()
}

// Node's warning of more than ten listeners for one event on one emitter.
const tooManyListeners: Error[] = []
const onWarning = (warning: Error): void => { if (warning.name === 'MaxListenersExceededWarning') tooManyListeners.push(warning) }
process.on('warning', onWarning)
t.teardown(() => { process.off('warning', onWarning) })

// A denial that would hold for an hour, trusted from the cache for a minute:
// only the reset's message can end it in time.
const hourly: Policy = { bucket: 'shared', capacity: 1, refillPerSecond: 1 / 3600, failureMode: 'closed' }
const options = { capacity: 1, refillPerSecond: 1 / 3600, failureMode: 'closed', timeout: 2000, denialCache: { maxAgeMs: 60_000 } } as const

for (const family of [ioredisFamily, ...families]) {
  t.test(`${family.label}: 12 limiters on one client share one subscriber`, async (t) => {
    const server = await startRedisServer()
    t.teardown(() => server.stop())
    const address = { host: server.host, port: server.port }
    const list = async (): Promise<string[]> => (await redisCommand(address, ['CLIENT', 'LIST']) as string).split('\n').filter((line) => line !== '')
    const subscribers = async (): Promise<number> => (await list()).filter((line) => line.includes(`name=${SUBSCRIBER_NAME} `)).length
    const user = await family.standalone(server.url)
    t.teardown(() => user.close())
    await user.connect()
    const other = await family.standalone(server.url)
    t.teardown(() => other.close())
    await other.connect()
    const elsewhere = createLimiter({ redis: other.client, prefix: 'shared', timeout: 2000 })
    t.teardown(() => elsewhere.close())
    t.ok(await until(5000, async () => await subscribers() === 1), 'the other server\'s limiter is subscribed')
    const connections = (await list()).length
    const warned = tooManyListeners.length

    // Half Express, half Hono: the adapters differ, the client is one.
    const limiters = Array.from({ length: 12 }, (_, i) => (i % 2 === 0 ? expressLimit : honoLimit)({ ...options, redis: user.client, prefix: 'shared' }))
    t.teardown(() => Promise.all(limiters.map((limit) => limit.close())))
    t.ok(await until(5000, async () => {
      const [, count] = await redisCommand(address, ['PUBSUB', 'NUMSUB', 'shared:changes']) as [string, number]
      return count === 2
    }), 'two subscriptions on the channel: the other server\'s and one for the twelve limiters')
    t.equal(await subscribers(), 2, 'two subscriber connections in CLIENT LIST')
    t.equal((await list()).length - connections, 1, 'the twelve limiters opened exactly one connection')
    t.equal(tooManyListeners.length - warned, 0, 'no MaxListenersExceededWarning')

    /** Until every limiter in `which` holds a cached denial of the shared bucket (the first call of the first one spends its token). */
    const denyAll = async (which: typeof limiters): Promise<void> => {
      for (const limit of which) {
        await limit.consume('c', hourly)
        await limit.consume('c', hourly)
      }
      const sources = await Promise.all(which.map(async (limit) => (await limit.consume('c', hourly)).source))
      t.same(sources, which.map(() => 'cache'), `${which.length} limiter(s) answer from their cached denial`)
    }
    const askedRedis = async (which: typeof limiters): Promise<boolean> => {
      const sources = await Promise.all(which.map(async (limit) => (await limit.consume('c', hourly)).source))
      return sources.every((source) => source === 'store')
    }

    await denyAll(limiters)
    await elsewhere.reset('c', 'shared')
    t.ok(await until(2000, () => askedRedis(limiters)), 'a reset made elsewhere reaches all twelve: each asks Redis again')

    await Promise.all(limiters.slice(0, 11).map((limit) => limit.close()))
    const last = limiters.slice(11)
    await sleep(100)
    t.equal(await subscribers(), 2, 'eleven closed: the connection stays for the twelfth')
    await denyAll(last)
    await elsewhere.reset('c', 'shared')
    t.ok(await until(2000, () => askedRedis(last)), 'and a reset made elsewhere still reaches it')

    await last[0]?.close()
    // GLIDE lets go of a closed client's connection 2 to 3 s after close (test/clients-edges.test.ts).
    t.ok(await until(8000, async () => await subscribers() === 1), 'the last one closed: the connection is closed')
    t.equal((await list()).length, connections, 'back to the connections before the limiters')
    t.equal(await redisCommand(address, ['PING']), 'PONG')
  })
}

t.test('ioredis: 50 limiters on one client, one connection and no warning; a client that ends closes the shared subscriber', async (t) => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const address = { host: server.host, port: server.port }
  const count = async (): Promise<number> => (await redisCommand(address, ['CLIENT', 'LIST']) as string).split('\n').filter((line) => line.includes(`name=${SUBSCRIBER_NAME} `)).length
  const user = await ioredisFamily.standalone(server.url)
  t.teardown(() => user.close())
  const warned = tooManyListeners.length
  // Not connected yet: each limiter's start-up wait listens for 'ready' at once.
  const limiters = Array.from({ length: 50 }, () => expressLimit({ ...options, redis: user.client, prefix: 'fifty' }))
  t.teardown(() => Promise.all(limiters.map((limit) => limit.close())))
  await Promise.all(limiters.map((limit) => limit.ready))
  t.ok(await until(5000, async () => await count() === 1), 'one subscriber connection')
  await sleep(100)
  t.equal(await count(), 1, 'and only one')
  t.equal(tooManyListeners.length - warned, 0, 'no MaxListenersExceededWarning')
  const emitter = user.client
  if (!(emitter instanceof Redis)) throw new TypeError('the ioredis family builds ioredis clients')
  t.same([emitter.listenerCount('ready'), emitter.listenerCount('end')], [0, 1], 'one \'end\' listener on the app\'s client, no \'ready\' one left')
  await user.close()
  t.ok(await until(2000, async () => await count() === 0), 'the app lets its client go: the subscriber goes too')
})
