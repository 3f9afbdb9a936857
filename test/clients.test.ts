// Every client family tollgate takes besides ioredis (test/ioredis-majors.test.ts),
// each on a redis-server of its own: node-redis 6 (RESP3, and RESP2 on
// database 3), node-redis 5, node-redis 4 (with isolationPoolOptions), iovalkey and GLIDE. For each: the plugin's
// start-up wait connects a client nobody connected, every script runs and
// a SCRIPT FLUSH is recovered; 400 concurrent consumes on a bucket of 50
// admit exactly 50; a frozen Redis (SIGSTOP) and a killed one follow the
// failure mode within the deadline, and decisions come back to Redis when
// it does; a reset made through one client reaches another's cached denial
// over pub/sub, and the subscriber comes back after a restart; the Express
// adapter's first request waits for the client too.

import { once } from 'node:events'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import express from 'express'
import Fastify from 'fastify'
import t from 'tap'
import tollgate, { createLimiter, type Limiter, type Policy } from '../lib/index.js'
import { rateLimit } from '../lib/express.js'
import { uniquePrefix } from './helpers/app.js'
import { GlideClient } from '@valkey/valkey-glide'
import { families, type Family, type Made } from './helpers/clients.js'
import { keyUnder } from './helpers/keys.js'
import { redisCommand, startRedisServer, type TeardownTarget } from './helpers/redis.js'

/** Polls `check` every 50 ms until it is true, at most `ms`; true if it became so. */
async function until (ms: number, check: () => Promise<boolean>): Promise<boolean> {
  const end = performance.now() + ms
  while (performance.now() < end) {
    if (await check()) return true
    await sleep(50)
  }
  return false
}

/** A keySecret, so that a test names a key before any call (docs/reference/keys.md). */
const FOREIGN_SECRET = 'clients-test-foreign-secret'

async function made (t: TeardownTarget, family: Family, url: string, connect = true): Promise<Made> {
  const m = await family.standalone(url)
  t.teardown(() => m.close())
  if (connect) await m.connect()
  return m
}

for (const family of families) {
  t.test(family.label, async (t) => {
    const server = await startRedisServer()
    t.teardown(() => server.stop())
    const address = { host: server.host, port: server.port }

    t.test('the plugin connects the client, runs every script, recovers from a script flush', async (t) => {
      const { client } = await made(t, family, server.url, false)
      const app = Fastify()
      t.teardown(() => app.close())
      const prefix = uniquePrefix()
      await app.register(tollgate, { redis: client, prefix, capacity: 2, refillPerSecond: 0.001, failureMode: 'closed', timeout: 1000 })
      app.get('/', async (request) => request.rateLimit)
      app.get('/pair', { config: { rateLimit: [{ capacity: 5, refillPerSecond: 1 }, { capacity: 1, refillPerSecond: 0.001 }] } }, async () => 'ok')
      app.get('/lease', { config: { rateLimit: { capacity: 10, refillPerSecond: 0.001, lease: { tokens: 5, maxAgeMs: 60_000 } } } }, async (request) => request.rateLimit)
      app.get('/locked', { config: { rateLimit: { capacity: 1, refillPerSecond: 0.001, lockout: { after: 1, withinMs: 60_000, forMs: 60_000 } } } }, async () => 'ok')

      const first = await app.inject('/')
      t.equal(first.statusCode, 200)
      t.equal(first.json().source, 'store', 'decided by Redis from the first request: the start-up wait connected the client')
      t.equal(first.headers['ratelimit-remaining'], '1')

      await redisCommand(address, ['SCRIPT', 'FLUSH'])
      const afterFlush = await app.inject('/')
      t.equal(afterFlush.statusCode, 200, 'NOSCRIPT after a flush is recovered')
      t.equal(afterFlush.json().source, 'store')
      t.equal((await app.inject('/')).statusCode, 429, 'the third request of a bucket of 2 is denied')

      t.equal((await app.inject('/pair')).statusCode, 200)
      t.equal((await app.inject('/pair')).statusCode, 429, 'several policies in one script call')

      const leased = await app.inject('/lease')
      t.equal(leased.json().source, 'store', 'the lease script')
      t.equal((await app.inject('/lease')).json().source, 'cache', 'spends from the lease')

      t.equal((await app.inject('/locked')).statusCode, 200, 'the lockout script')
      t.equal((await app.inject('/locked')).statusCode, 429)

      await app.tollgate.reset('127.0.0.1', 'GET /')
      t.equal((await app.inject('/')).statusCode, 200, 'reset (DEL) gives a full bucket')

      const db = family.label.includes('database 3') ? 'db3' : 'db0'
      const keyspace = String(await redisCommand(address, ['INFO', 'keyspace']))
      t.match(keyspace, new RegExp(`^${db}:keys=`, 'm'), `the buckets are in the client's database (${db})`)
    })

    t.test('a key of another type fails its own requests as Redis\'s answer: the breaker stays closed for every other client', async (t) => {
      const { client } = await made(t, family, server.url)
      const prefix = uniquePrefix()
      const log = { lines: [] as string[], warn () {}, info () {}, error (_o: object, msg: string) { this.lines.push(msg) } }
      const limiter = createLimiter({ redis: client, prefix, timeout: 5000, denialCache: false, breaker: { failures: 1, cooldownMs: 60_000 }, keySecret: FOREIGN_SECRET, logger: log })
      t.teardown(() => limiter.close())
      await limiter.ready
      const policy: Policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }
      // In the client's own database, with a script (a connection's SELECT lasts one call of redisCommand).
      const db = family.label.includes('database 3') ? 3 : 0
      await redisCommand(address, ['EVAL', "redis.call('SELECT', ARGV[1]); return redis.call('HSET', KEYS[1], 'field', '1')", 1, keyUnder(FOREIGN_SECRET, prefix, 'poisoned', 'b'), db])
      for (let i = 0; i < 3; i++) t.equal((await limiter.consume('poisoned', policy)).source, 'fail-closed', 'the poisoned client\'s request fails')
      t.equal((await limiter.consume('other', policy)).source, 'store', 'another client is still decided by Redis: the breaker (1 failure) never opened')
      t.equal(limiter.state, 'healthy')
      t.equal(log.lines.filter((l) => l === 'rate limit key holds a value of the wrong type').length, 3, 'each logged as a key of the wrong type')
    })

    t.test('400 concurrent consumes on a bucket of 50 admit exactly 50', async (t) => {
      const prefix = uniquePrefix()
      const limiters: Limiter[] = []
      for (let i = 0; i < 4; i++) {
        const { client } = await made(t, family, server.url)
        const limiter = createLimiter({ redis: client, prefix, timeout: 5000, denialCache: false })
        t.teardown(() => limiter.close())
        limiters.push(limiter)
      }
      const policy: Policy = { bucket: 'race', capacity: 50, refillPerSecond: 1e-6, failureMode: 'closed' }
      const decisions = await Promise.all(Array.from({ length: 400 }, (_, i) => (limiters[i % 4] as Limiter).consume('racer', policy)))
      t.equal(decisions.filter((d) => d.allowed).length, 50, 'exactly the capacity')
      t.equal(decisions.filter((d) => d.source !== 'store').length, 0, 'every decision by Redis')
    })

    t.test('a frozen Redis, then a killed one: the failure mode within the deadline, then Redis again', async (t) => {
      const own = await startRedisServer()
      t.teardown(() => own.stop())
      const { client } = await made(t, family, own.url)
      const prefix = uniquePrefix()
      const limiter = createLimiter({ redis: client, prefix, timeout: 50, breaker: { failures: 3, cooldownMs: 200 } })
      t.teardown(() => limiter.close())
      // The scripts loaded first: on this new server a first call's NOSCRIPT
      // and EVAL missed the 50 ms deadline in a loaded run.
      await limiter.ready
      const open: Policy = { bucket: 'f', capacity: 100, refillPerSecond: 1, failureMode: 'open' }
      const closed: Policy = { bucket: 'g', capacity: 100, refillPerSecond: 1, failureMode: 'closed' }
      t.equal((await limiter.consume('c', open)).source, 'store')

      own.pause()
      t.teardown(() => own.resume())
      for (const [policy, source] of [[open, 'fail-open'], [closed, 'fail-closed']] as const) {
        for (let i = 0; i < 4; i++) {
          const started = performance.now()
          const decision = await limiter.consume('c', policy)
          const took = performance.now() - started
          t.equal(decision.source, source, `frozen: ${source}`)
          t.ok(took < 50 + 1000, `frozen: answered in ${Math.round(took)} ms, within the deadline and scheduling noise`)
        }
      }
      t.equal(limiter.state, 'failing', 'the limiter says it is failing')
      own.resume()
      t.ok(await until(10_000, async () => (await limiter.consume('c', open)).source === 'store'), 'after the freeze: decided by Redis again')

      await own.kill()
      const killed = await limiter.consume('c', closed)
      t.equal(killed.source, 'fail-closed', 'killed: fail-closed')
      t.equal(killed.allowed, false)
      t.equal((await limiter.consume('c', open)).source, 'fail-open', 'killed: fail-open')
      await own.restart()
      t.ok(await until(20_000, async () => (await limiter.consume('c', open)).source === 'store'), 'after a restart (an empty script cache): the client reconnected and Redis decides')
      t.equal(limiter.state, 'healthy')
      t.ok(await until(10_000, async () => {
        const [, count] = await redisCommand({ host: own.host, port: own.port }, ['PUBSUB', 'NUMSUB', `${prefix}:changes`]) as [string, number]
        return count === 1
      }), 'the subscriber of resets and refunds is back on the restarted server')
    })

    t.test('tollgate/express: the first request waits for the client and is decided by Redis', async (t) => {
      const { client } = await made(t, family, server.url, false)
      const limit = rateLimit({ redis: client, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 1000 })
      t.teardown(() => limit.close())
      const app = express()
      app.get('/', limit(), (req, res) => { res.json({ source: req.rateLimit?.source }) })
      const listening = app.listen(0, '127.0.0.1')
      await once(listening, 'listening')
      t.teardown(() => { listening.close() })
      const { port } = listening.address() as AddressInfo
      const first = await fetch(`http://127.0.0.1:${port}/`)
      t.equal(first.status, 200)
      t.same(await first.json(), { source: 'store' })
      t.equal((await fetch(`http://127.0.0.1:${port}/`)).status, 429, 'the second of a bucket of 1 is denied')
    })

    t.test('a reset through one client reaches the cached denial of another, over pub/sub', async (t) => {
      const prefix = uniquePrefix()
      // Cached denials trusted for a minute: only the message can end this one in time.
      const options = { prefix, timeout: 2000, denialCache: { maxAgeMs: 60_000 } }
      const a = createLimiter({ ...options, redis: (await made(t, family, server.url)).client })
      const b = createLimiter({ ...options, redis: (await made(t, family, server.url)).client })
      t.teardown(() => a.close())
      t.teardown(() => b.close())
      const policy: Policy = { bucket: 'inv', capacity: 1, refillPerSecond: 0.001, failureMode: 'closed' }
      // Both subscribed: a message on the channel reaches two subscribers.
      t.ok(await until(10_000, async () => {
        const [, count] = await redisCommand(address, ['PUBSUB', 'NUMSUB', `${prefix}:changes`]) as [string, number]
        return count === 2
      }), 'both limiters subscribed')
      t.equal((await a.consume('x', policy)).allowed, true)
      t.equal((await a.consume('x', policy)).source, 'store')
      t.equal((await a.consume('x', policy)).source, 'cache', 'a denial cached by a')
      await b.reset('x', 'inv')
      t.ok(await until(5000, async () => (await a.consume('x', policy)).allowed), "b's reset ended a's cached denial")
    })
  })
}

t.test('GLIDE with lazyConnect (no connection until its first command): decided by Redis from the first request', async (t) => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const client = await GlideClient.createClient({ addresses: [{ host: server.host, port: server.port }], lazyConnect: true, requestTimeout: 1000 })
  t.teardown(() => client.close())
  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, { redis: client, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 1000 })
  app.get('/', async (request) => request.rateLimit)
  const first = await app.inject('/')
  t.equal(first.json().source, 'store')
  t.equal((await app.inject('/')).statusCode, 429)
})
