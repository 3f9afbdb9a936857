// The store's script seam (lib/store/script.ts, RemoteStore.run): a script
// declared outside the store is loaded by the store's start-up with the
// store's own, sent by EVALSHA, answered by EVAL after a NOSCRIPT; one that
// is not kept loaded (the key secret's) is sent as one EVAL and never
// loaded. On a redis-server of this file's own, whose script cache and
// command counts nothing else touches, and on a Cluster of its own.
// lua/key-secret.lua stands for a limit kind's script: it replies what its
// two keys hold, after writing one.

import { Redis } from 'ioredis'
import t from 'tap'
import { LEASE, PROBE, RedisStore, SETTLE, TOKEN_BUCKET, TOKEN_BUCKET_BATCH, TOKEN_BUCKET_EXT } from '../lib/store/redis-store.js'
import { loadedScripts, script } from '../lib/store/script.js'
import { keysOn, startCluster } from './helpers/cluster.js'
import { infoField, redisCommand, startRedisServer, type RedisServer } from './helpers/redis.js'

/** A script of another limit kind, kept loaded: declared at module load, as a limit kind's file declares its own. */
const KEPT = script('key-secret.lua')
/** The same script sent as EVAL, as lib/core/key-secret.ts sends its own. */
const ONCE = script('key-secret.lua', { loaded: false })

const server = await startRedisServer()
t.teardown(() => server.stop())
const redis = new Redis(server.url)
t.teardown(() => { redis.disconnect() })
const store = new RedisStore(redis)
await store.warm('seam:warm')

/** EVALSHA and EVAL calls since the last CONFIG RESETSTAT. */
async function scriptCalls (on: RedisServer): Promise<{ evalsha: number, eval: number }> {
  const info = await redisCommand(on, ['INFO', 'commandstats'])
  const calls = (command: string): number => Number(/calls=(\d+)/.exec(infoField(info, `cmdstat_${command}`) ?? '')?.[1] ?? 0)
  return { evalsha: calls('evalsha'), eval: calls('eval') }
}

t.test('start-up loads a script declared outside the store; run sends it by its SHA-1', async (t) => {
  t.same(await redis.script('EXISTS', KEPT.sha), [1], 'loaded by warm')
  await redisCommand(server, ['CONFIG', 'RESETSTAT'])
  t.same(await store.run(KEPT, ['seam:{a}:secret', 'seam:{a}:check'], [1, 'first']), ['first', null], 'the script\'s reply, as Redis gives it')
  t.same(await scriptCalls(server), { evalsha: 1, eval: 0 }, 'one EVALSHA')
})

t.test('after a script flush, run answers NOSCRIPT with one EVAL, which loads the script again', async (t) => {
  await redis.script('FLUSH')
  await redisCommand(server, ['CONFIG', 'RESETSTAT'])
  t.same(await store.run(KEPT, ['seam:{b}:secret', 'seam:{b}:check'], [2, 'digest']), [null, 'digest'], 'the reply of the EVAL')
  t.same(await scriptCalls(server), { evalsha: 1, eval: 1 }, 'EVALSHA refused, then EVAL')
  t.same(await redis.script('EXISTS', KEPT.sha), [1], 'loaded again')
  t.same(await store.run(KEPT, ['seam:{b}:secret', 'seam:{b}:check'], [1, 'later']), ['later', 'digest'])
  t.same(await scriptCalls(server), { evalsha: 2, eval: 1 }, 'then EVALSHA alone')
})

t.test('a script not kept loaded is sent as one EVAL, and start-up does not load it', async (t) => {
  t.ok(loadedScripts().includes(KEPT), 'control: the kept script is among those start-up loads')
  t.notOk(loadedScripts().includes(ONCE), 'the other is not')
  t.same(loadedScripts().slice(0, 6), [TOKEN_BUCKET, TOKEN_BUCKET_BATCH, LEASE, SETTLE, TOKEN_BUCKET_EXT, PROBE], 'the store\'s own first, in the order start-up loaded them before')
  await redis.script('FLUSH')
  await redisCommand(server, ['CONFIG', 'RESETSTAT'])
  t.same(await store.run(ONCE, ['seam:{c}:secret', 'seam:{c}:check'], [1, 'once']), ['once', null])
  t.same(await scriptCalls(server), { evalsha: 0, eval: 1 }, 'one EVAL, no EVALSHA')
  t.equal(ONCE.name, 'lua/key-secret.lua', 'named by its file, for the errors of replies of another shape')
})

t.test('on a Cluster: start-up loads it on every master, and each call goes to the master of its keys', async (t) => {
  const cluster = await startCluster({ masters: 3 })
  t.teardown(() => cluster.stop())
  const masters = await cluster.masters()
  const client = cluster.client()
  await new Promise((resolve) => client.once('ready', resolve))
  const on = new RedisStore(client)
  await on.warm('seam:{warm}:w')
  for (const master of masters) t.same(await redisCommand(master, ['SCRIPT', 'EXISTS', KEPT.sha]), [1], `loaded on the master at port ${master.port}`)
  const holders = new Set<number>()
  for (let i = 0; i < 12; i++) {
    const [secret, check] = [`seam:{t${i}}:secret`, `seam:{t${i}}:check`]
    t.same(await on.run(KEPT, [secret, check], [1, `v${i}`]), [`v${i}`, null], `tag t${i}: the script's reply`)
    const owner = await cluster.masterFor(secret)
    t.same(await keysOn(owner, `seam:{t${i}}:*`), [secret], `tag t${i}: written on the master of its slot`)
    holders.add(owner.port)
  }
  t.equal(holders.size, masters.length, 'the calls reached every master')
})
