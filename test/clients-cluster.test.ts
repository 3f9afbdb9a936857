// The Cluster client of every family besides ioredis (test/cluster.test.ts),
// on one real local Redis Cluster of 3 masters: node-redis 6, 5 and 4
// `createCluster()`, iovalkey's `Cluster` and GLIDE's `GlideClusterClient`.
// For each: the start-up loads the scripts on every master; buckets of many
// clients land on every master, each call routed to its key's slot; 400
// concurrent consumes over 4 clients admit exactly the capacity of 50; a
// SCRIPT FLUSH on every master is recovered; several policies of one client
// are one script call on one slot. And a Cluster client the app has not
// connected yet (node-redis 6, iovalkey): no subscriber while it knows no
// node, one once it does; none from a limiter closed before then.

import { setTimeout as sleep } from 'node:timers/promises'
import Fastify from 'fastify'
import { Cluster as ValkeyCluster } from 'iovalkey'
import { createCluster } from 'redis'
import t from 'tap'
import { SUBSCRIBER_NAME } from '../lib/core/invalidation.js'
import tollgate, { createLimiter, type Limiter, type Policy, type RedisClient } from '../lib/index.js'
import { TOKEN_BUCKET } from '../lib/store/redis-store.js'
import { uniquePrefix } from './helpers/app.js'
import { families } from './helpers/clients.js'
import { keysOn, startCluster } from './helpers/cluster.js'
import { redisCommand } from './helpers/redis.js'

const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())
const masters = await cluster.masters()


for (const family of families) {
  const connect = family.cluster?.bind(family)
  if (connect === undefined) continue
  t.test(`${family.label} Cluster`, async (t) => {
    const made = async (): Promise<Made> => {
      const m = await connect(cluster.startupNodes)
      t.teardown(() => m.close())
      return m
    }
    type Made = Awaited<ReturnType<typeof connect>>

    t.test('the start-up loads the scripts on every master, and decides on the Cluster', async (t) => {
      for (const master of masters) await redisCommand(master, ['SCRIPT', 'FLUSH'])
      const { client } = await made()
      const app = Fastify()
      t.teardown(() => app.close())
      await app.register(tollgate, { redis: client, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 2000 })
      for (const master of masters) {
        t.same(await redisCommand(master, ['SCRIPT', 'EXISTS', TOKEN_BUCKET.sha]), [1], `loaded on the master at port ${master.port}`)
      }
      app.get('/', async (request) => request.rateLimit)
      const first = await app.inject('/')
      t.equal(first.json().source, 'store')
      t.equal((await app.inject('/')).statusCode, 429)
    })

    t.test('many clients: every master holds buckets, each decided by its slot; a flush on every master is recovered', async (t) => {
      const prefix = uniquePrefix()
      const limiter = createLimiter({ redis: (await made()).client, prefix, timeout: 2000 })
      t.teardown(() => limiter.close())
      const policy: Policy = { bucket: 'b', capacity: 2, refillPerSecond: 0.001, failureMode: 'closed' }
      const pair: Policy[] = [policy, { bucket: 'p', capacity: 5, refillPerSecond: 0.001, failureMode: 'closed' }]
      const ids = Array.from({ length: 30 }, (_, i) => `client-${i}`)
      for (const id of ids) t.same(((await limiter.consume(id, policy))).source, 'store', `${id}: first by Redis`)
      for (const master of masters) await redisCommand(master, ['SCRIPT', 'FLUSH'])
      let allowed = 0
      for (const id of ids) {
        const decision = await limiter.consume(id, pair)
        if (decision.source !== 'store') t.fail(`${id}: after the flush, decided by ${decision.source}`)
        if (decision.allowed) allowed++
      }
      t.equal(allowed, ids.length, 'after the flush: every second token of a bucket of 2 allowed, with two policies in one call')
      for (const id of ids) t.equal((await limiter.consume(id, policy)).allowed, false, `${id}: the third is denied`)
      for (const master of masters) {
        const keys = await keysOn(master, `${prefix}:*`)
        t.ok(keys.length > 0, `master at port ${master.port} holds ${keys.length} keys`)
      }
    })

    t.test('400 concurrent consumes over 4 clients on a bucket of 50 admit exactly 50', async (t) => {
      const prefix = uniquePrefix()
      const limiters: Limiter[] = []
      for (let i = 0; i < 4; i++) {
        const limiter = createLimiter({ redis: (await made()).client, prefix, timeout: 5000, denialCache: false })
        t.teardown(() => limiter.close())
        limiters.push(limiter)
      }
      const policy: Policy = { bucket: 'race', capacity: 50, refillPerSecond: 1e-6, failureMode: 'closed' }
      const decisions = await Promise.all(Array.from({ length: 400 }, (_, i) => (limiters[i % 4] as Limiter).consume('racer', policy)))
      t.equal(decisions.filter((d) => d.allowed).length, 50, 'exactly the capacity')
      t.equal(decisions.filter((d) => d.source !== 'store').length, 0, 'every decision by Redis')
    })
  })
}

/** Our subscriber connections on the Cluster's masters (CLIENT LIST, by name). */
async function subscribers (): Promise<number> {
  let count = 0
  for (const master of masters) {
    const list = await redisCommand(master, ['CLIENT', 'LIST']) as string
    count += list.split('\n').filter((line) => line.includes(`name=${SUBSCRIBER_NAME} `)).length
  }
  return count
}

async function until (what: () => Promise<boolean>, ms: number): Promise<boolean> {
  const end = performance.now() + ms
  while (performance.now() < end) {
    if (await what()) return true
    await sleep(25)
  }
  return await what()
}

const unconnected: Array<[string, () => { client: RedisClient, connect (): Promise<unknown>, close (): void }]> = [
  ['node-redis 6', () => {
    const client = createCluster({ rootNodes: cluster.startupNodes.map((n) => ({ socket: n })) })
    client.on('error', () => {})
    return { client, connect: () => client.connect(), close: () => { try { client.destroy() } catch {} } }
  }],
  ['iovalkey', () => {
    const client = new ValkeyCluster([...cluster.startupNodes], { lazyConnect: true })
    client.on('error', () => {})
    return { client, connect: () => client.connect(), close: () => { client.disconnect() } }
  }]
]

for (const [label, make] of unconnected) {
  t.test(`${label}: a Cluster client not connected yet gets a subscriber once it knows a node, and none from a limiter closed before then`, async (t) => {
    const policy: Policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'open' }
    const before = await subscribers()

    const early = make()
    t.teardown(() => early.close())
    const closed = createLimiter({ redis: early.client, prefix: uniquePrefix(), timeout: 2000 })
    await closed.close()
    await early.connect()
    // A subscription tried again after the close would be made within the retries' first second.
    await sleep(1500)
    t.equal(await subscribers(), before, 'no subscriber from the limiter closed before its client knew a node')

    const late = make()
    t.teardown(() => late.close())
    const limiter = createLimiter({ redis: late.client, prefix: uniquePrefix(), timeout: 2000 })
    t.teardown(() => limiter.close())
    t.equal(await subscribers(), before, 'none while the client knows no node')
    t.equal((await limiter.consume('c', policy)).source, 'fail-open', 'the first call finds the client unconnected, and has it connect')
    t.ok(await until(async () => (await limiter.consume('c', policy)).source === 'store', 5000), 'then Redis decides')
    t.ok(await until(async () => await subscribers() === before + 1, 5000), 'and one subscriber is made')
  })
}
