// tollgate against both ioredis majors it supports (the peer range is
// ^5.4.0 || ^6.0.0): the same checks with ioredis 5 (`ioredis`) and
// ioredis 6 (the `ioredis6` npm alias), through every member of the client
// tollgate uses: its own script calls (EVALSHA with the EVAL fallback,
// NOSCRIPT recovery), status, connect and the ready event, SCRIPT
// LOAD on every master, DEL, and a Cluster's master list.

import Fastify from 'fastify'
import * as ioredis5 from 'ioredis'
import * as ioredis6 from 'ioredis6'
import t from 'tap'
import tollgate, { createLimiter, type IoredisClient, type Policy } from '../lib/index.js'
import { uniquePrefix } from './helpers/app.js'
import { startCluster } from './helpers/cluster.js'
import { redisCommand, redisUrl } from './helpers/redis.js'

/** What these tests do with a client, whichever major made it. */
interface Client extends IoredisClient {
  disconnect (): void
  once (event: 'ready', listener: () => void): unknown
}

interface Major {
  label: string
  version: string
  redis: (url: string) => Client
  cluster: (nodes: Array<{ host: string, port: number }>) => Client
}

const majors: Major[] = [
  {
    label: 'ioredis 5',
    version: (await import('ioredis/package.json', { with: { type: 'json' } })).default.version,
    redis: (url) => new ioredis5.Redis(url, { lazyConnect: true }),
    cluster: (nodes) => new ioredis5.Cluster(nodes, { enableOfflineQueue: false })
  },
  {
    label: 'ioredis 6',
    version: (await import('ioredis6/package.json', { with: { type: 'json' } })).default.version,
    redis: (url) => new ioredis6.Redis(url, { lazyConnect: true }),
    cluster: (nodes) => new ioredis6.Cluster(nodes, { enableOfflineQueue: false })
  }
]
const url = await redisUrl(t)
const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())

for (const { label, version, redis: newRedis, cluster: newCluster } of majors) {
  t.test(`${label}: the plugin decides on Redis, recovers from a script flush, and fails as declared`, async (t) => {
    t.equal(version.split('.')[0], label.slice(-1), `running ${label} (${version})`)

    const redis = newRedis(url)
    t.teardown(() => redis.disconnect())
    const app = Fastify()
    t.teardown(() => app.close())
    const prefix = uniquePrefix()
    // A deadline far above the default's 10 ms: the call after the flush makes two round trips and
    // compiles the script, and what is tested is that it recovers, not how fast on a loaded machine.
    await app.register(tollgate, { redis, prefix, capacity: 2, refillPerSecond: 0.001, failureMode: 'closed', timeout: 1000 })
    t.equal(redis.status, 'ready', 'the plugin connected the lazyConnect client')
    app.get('/', async (request) => request.rateLimit)
    app.get('/pair', { config: { rateLimit: [{ capacity: 5, refillPerSecond: 1 }, { capacity: 1, refillPerSecond: 0.001 }] } }, async () => 'ok')
    app.get('/lease', { config: { rateLimit: { capacity: 10, refillPerSecond: 0.001, lease: { tokens: 5, maxAgeMs: 60_000 } } } }, async (request) => request.rateLimit)

    const first = await app.inject('/')
    t.equal(first.statusCode, 200)
    t.equal(first.json().source, 'store')
    t.equal(first.headers['ratelimit-remaining'], '1')

    const port = Number(new URL(url).port)
    const host = new URL(url).hostname
    await redisCommand({ host, port }, ['SCRIPT', 'FLUSH'])
    const afterFlush = await app.inject('/')
    t.equal(afterFlush.statusCode, 200, 'NOSCRIPT after a flush is recovered')
    t.equal(afterFlush.json().source, 'store')
    t.equal((await app.inject('/')).statusCode, 429, 'the third request of a bucket of 2 is denied')

    t.equal((await app.inject('/pair')).statusCode, 200)
    t.equal((await app.inject('/pair')).statusCode, 429, 'several policies in one script call')

    const leased = await app.inject('/lease')
    t.equal(leased.json().source, 'store', 'the lease script')
    t.equal((await app.inject('/lease')).json().source, 'cache', 'spends from the lease')

    await app.tollgate.reset('127.0.0.1', 'GET /')
    t.equal((await app.inject('/')).statusCode, 200, 'reset (DEL) gives a full bucket')

    redis.disconnect()
    const down = await app.inject('/')
    t.equal(down.statusCode, 503, 'a disconnected client: failureMode closed')
  })

  t.test(`${label}: the core limiter on a Redis Cluster`, async (t) => {
    const redis = newCluster(cluster.startupNodes)
    t.teardown(() => redis.disconnect())
    await new Promise<void>((resolve) => redis.once('ready', () => resolve()))
    const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
    t.teardown(() => limiter.close())
    const policy: Policy = { bucket: 'b', capacity: 1, refillPerSecond: 0.001, failureMode: 'closed' }
    const clients = ['alice', 'bob', 'carol', 'dave']
    for (const client of clients) {
      const decision = await limiter.consume(client, policy)
      t.same([decision.allowed, decision.source], [true, 'store'], `${client}: allowed by the cluster`)
    }
    for (const client of clients) t.equal((await limiter.consume(client, policy)).allowed, false, `${client}: then denied`)
  })
}
