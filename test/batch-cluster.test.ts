// Batches on a real local Redis Cluster (3 masters): a script call holds
// the decisions of one set of keys (one client's, for one route), so the
// decisions of one turn are one batch per client here, each sent to the
// master that owns the client's slot (test/helpers/slot.ts, checked here
// against CLUSTER KEYSLOT, finds it). Every decision is right, and each
// master runs one call per client of its own among those asked.
// test/batch-reshard.test.ts shows why a batch never holds two clients.

import { once } from 'node:events'
import t from 'tap'
import { createLimiter, type Policy } from '../lib/index.js'
import { slotOf } from './helpers/slot.js'
import { TOKEN_BUCKET, TOKEN_BUCKET_BATCH } from '../lib/store/redis-store.js'
import { uniquePrefix } from './helpers/app.js'
import { startCluster } from './helpers/cluster.js'
import { infoField, redisCommand, type RedisServer } from './helpers/redis.js'
import { keyUnder } from './helpers/keys.js'

/** Keys named with no read from Redis, so a test can name a client's key (and find its master) before any call. */
const KEY_SECRET = 'a key secret for these tests'

const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())
const masters = await cluster.masters()

t.test('slotOf is CLUSTER KEYSLOT', async (t) => {
  const keys = ['foo', '123456789', '{user1000}.following', 'a{}b', '{}{x}', 'x{y', 'x}y{', 'tollgate:{#AbC-_x}:b', 'tollgate:{203.0.113.9}:api', 'é{ü}', '{}', '']
  for (let i = 0; i < 40; i++) keys.push(`t:{c${i * 7919}}:b${i}`)
  for (const key of keys) t.equal(slotOf(key), await redisCommand(masters[0] as RedisServer, ['CLUSTER', 'KEYSLOT', key]), JSON.stringify(key))
})

t.test('the decisions of one turn: one batch per client, each on its master, all right', async (t) => {
  const client = cluster.client({ enableOfflineQueue: false })
  client.on('error', () => {})
  t.teardown(() => client.disconnect())
  if (client.status !== 'ready') await once(client, 'ready')
  const prefix = uniquePrefix()
  const limiter = createLimiter({ redis: client, prefix, denialCache: false, timeout: 2000, keySecret: KEY_SECRET })
  t.teardown(() => limiter.close())
  for (const master of masters) {
    for (const script of [TOKEN_BUCKET, TOKEN_BUCKET_BATCH]) await redisCommand(master, ['SCRIPT', 'LOAD', script.lua])
    await redisCommand(master, ['CONFIG', 'RESETSTAT'])
  }
  const policy: Policy = { bucket: 'b', capacity: 3, refillPerSecond: 1e-6, failureMode: 'closed' }
  const second: Policy = { ...policy, bucket: 'b2', capacity: 10 }
  const clients = Array.from({ length: 12 }, (_, i) => `client${i}`)
  // Each client asks five times in the turn, with two policies: three pass.
  const asked = clients.flatMap((id) => Array.from({ length: 5 }, () => limiter.consume(id, [policy, second])))
  const decisions = await Promise.all(asked)
  for (let c = 0; c < clients.length; c++) {
    const mine = decisions.slice(c * 5, c * 5 + 5)
    t.same(mine.map((d) => [d.allowed, d.remaining, d.source]), [[true, 2, 'store'], [true, 1, 'store'], [true, 0, 'store'], [false, 0, 'store'], [false, 0, 'store']], clients[c] as string)
  }
  const slots = new Map<RedisServer, Set<number>>()
  for (const id of clients) {
    const key = keyUnder(KEY_SECRET, prefix, id, 'b')
    const owner = await cluster.masterFor(key)
    const mine = slots.get(owner) ?? new Set<number>()
    mine.add(slotOf(key))
    slots.set(owner, mine)
  }
  let total = 0
  for (const master of masters) {
    const stats = await redisCommand(master, ['INFO', 'commandstats'])
    const calls = Number(/calls=(\d+)/.exec(infoField(stats, 'cmdstat_evalsha') ?? '')?.[1] ?? 0)
    t.equal(calls, slots.get(master)?.size ?? 0, `${master.port}: one call per slot it owns`)
    total += calls
  }
  t.equal(total, clients.length, '12 clients of 12 slots: 12 calls for 60 decisions')
})
