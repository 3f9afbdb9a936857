// The Cluster client of every family besides ioredis (test/cluster.test.ts),
// on one real local Redis Cluster of 3 masters: node-redis 6, 5 and 4
// `createCluster()`, iovalkey's `Cluster` and GLIDE's `GlideClusterClient`.
// For each: the start-up loads the scripts on every master; buckets of many
// clients land on every master, each call routed to its key's slot; 400
// concurrent consumes over 4 clients admit exactly the capacity of 50; a
// SCRIPT FLUSH on every master is recovered; several policies of one client
// are one script call on one slot.

import Fastify from 'fastify'
import t from 'tap'
import tollgate, { createLimiter, type Limiter, type Policy } from '../lib/index.js'
import { TOKEN_BUCKET } from '../lib/store/redis-store.js'
import { uniquePrefix } from './helpers/app.js'
import { families } from './helpers/clients.js'
import { startCluster } from './helpers/cluster.js'
import { redisCommand, type RedisServer } from './helpers/redis.js'

const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())
const masters = await cluster.masters()

/** Keys on one master matching `pattern`, by SCAN. */
async function keysOn (node: RedisServer, pattern: string): Promise<string[]> {
  const found: string[] = []
  let cursor = '0'
  do {
    const [next, batch] = await redisCommand(node, ['SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000]) as [string, string[]]
    cursor = next
    found.push(...batch)
  } while (cursor !== '0')
  return found
}

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
