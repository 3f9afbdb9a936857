// Batches while a Cluster reshards, on a real local Redis Cluster (3 masters):
// one slot is put MIGRATING on its master and IMPORTING on another, and one
// client's key is moved, while a flood of batched decisions runs for clients
// of that slot and for clients of the third master. Redis refuses a call
// whose keys are split between the two masters (TRYAGAIN), and sends a call
// of one client's keys on with ASK, which the client follows. Batching must
// not turn the migration into an outage: the share of decisions made by
// Redis in both groups is that of `batch: false`, the breaker stays closed,
// and no client is charged for more than it asked. And a decision whose own
// keys the migration has split (two policies, one key moved) is refused as
// it would be unbatched: a client that hands the TRYAGAIN over (node-redis)
// gets the failure mode at once, the breaker does not count it, and nothing
// is spent.

import diagnostics from 'node:diagnostics_channel'
import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { createCluster } from 'redis'
import t, { type Test } from 'tap'
import { createLimiter, type Limiter, type Policy } from '../lib/index.js'
import { uniquePrefix } from './helpers/app.js'
import { startCluster } from './helpers/cluster.js'
import { redisCommand, type RedisServer } from './helpers/redis.js'
import { keyUnder } from './helpers/keys.js'
import { slotOf } from './helpers/slot.js'

const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())

const BUCKET = 'b'
// Refill slow enough that the bucket's level counts what was spent (10 s of
// refill is 0.01 of a token, never a whole one).
const policy: Policy = { bucket: BUCKET, capacity: 10_000, refillPerSecond: 1e-3, failureMode: 'open' }
/** Clients per group, all asked in each turn. */
const CLIENTS = 6
const FLOOD_MS = 2000
const AFTER_MS = 1500
/**
 * A deadline well above a decision's time on a busy 2-core machine (one
 * stall past it fails a whole turn's 12 decisions, enough to open the
 * breaker), so that neither mode loses decisions to the machine's noise:
 * what it loses, it loses to the migration. ioredis retries a TRYAGAIN for
 * 1.6 s (16 times, 100 ms apart), past this deadline too.
 */
const TIMEOUT_MS = 250
/** Most the share decided by Redis may fall below `batch: false`'s: a call missing its deadline now and then, in either mode. */
const TOLERANCE = 0.05

/** The fleet's key secret, given so that the test can name keys, and find clients sharing a slot, before any call. */
const SECRET = 'batch-reshard-test-secret'
const keyOf = (prefix: string, id: string): string => keyUnder(SECRET, prefix, id, BUCKET)

async function nodeId (server: RedisServer): Promise<string> {
  return await redisCommand(server, ['CLUSTER', 'MYID']) as string
}

/** `CLIENTS` client ids whose keys share one slot, and that slot. */
function sameSlot (prefix: string): { slot: number, ids: string[] } {
  const slot = slotOf(keyOf(prefix, 'm0'))
  const ids: string[] = []
  for (let i = 0; ids.length < CLIENTS; i++) {
    if (slotOf(keyOf(prefix, `m${i}`)) === slot) ids.push(`m${i}`)
  }
  return { slot, ids }
}

/** `CLIENTS` client ids whose keys live on `master`. */
async function clientsOn (prefix: string, master: RedisServer): Promise<string[]> {
  const ids: string[] = []
  for (let i = 0; ids.length < CLIENTS; i++) {
    if ((await cluster.masterFor(keyOf(prefix, `o${i}`))).port === master.port) ids.push(`o${i}`)
  }
  return ids
}

interface Tally { asked: number, store: number }
interface Phase { slot: Tally, other: Tally }
type Group = keyof Phase

/** Per client: decisions asked, and those Redis allowed (each spent one token). */
interface Charges { asked: Map<string, number>, spentByStore: Map<string, number> }

function add (map: Map<string, number>, id: string): void {
  map.set(id, (map.get(id) ?? 0) + 1)
}

/** Every client of both groups asks once per turn (one batch per turn), a turn every 10 ms, for `ms`. */
async function flood (limiter: Limiter, groups: Record<Group, string[]>, ms: number, charges: Charges): Promise<Phase> {
  const phase: Phase = { slot: { asked: 0, store: 0 }, other: { asked: 0, store: 0 } }
  const end = Date.now() + ms
  while (Date.now() < end) {
    const turn: Array<Promise<void>> = []
    for (const group of ['slot', 'other'] as const) {
      for (const id of groups[group]) {
        add(charges.asked, id)
        turn.push(limiter.consume(id, policy).then((d) => {
          phase[group].asked++
          if (d.source !== 'store') return
          phase[group].store++
          if (d.allowed) add(charges.spentByStore, id)
        }))
      }
    }
    await Promise.all(turn)
    await sleep(10)
  }
  return phase
}

/** Puts `slot` MIGRATING from `source` to `target` and moves `key`, as `redis-cli --cluster reshard` does, one key at a time. */
async function startMigration (source: RedisServer, target: RedisServer, slot: number, key: string): Promise<void> {
  await redisCommand(target, ['CLUSTER', 'SETSLOT', slot, 'IMPORTING', await nodeId(source)])
  await redisCommand(source, ['CLUSTER', 'SETSLOT', slot, 'MIGRATING', await nodeId(target)])
  await redisCommand(source, ['MIGRATE', target.host, target.port, key, 0, 5000])
}

/** Moves the rest of `slot`'s keys and gives the slot to `target` on every master. */
async function endMigration (source: RedisServer, target: RedisServer, slot: number, masters: RedisServer[]): Promise<void> {
  const keys = await redisCommand(source, ['CLUSTER', 'GETKEYSINSLOT', slot, 1000]) as string[]
  for (const key of keys) await redisCommand(source, ['MIGRATE', target.host, target.port, key, 0, 5000])
  const id = await nodeId(target)
  for (const master of [target, source, ...masters.filter((m) => m !== target && m !== source)]) {
    await redisCommand(master, ['CLUSTER', 'SETSLOT', slot, 'NODE', id])
  }
}

interface Run { during: Phase, after: Phase, opened: number, charges: Charges, spent: Map<string, number> }

/** One run: a fresh slot migrates while both groups flood, then the migration ends and they flood on. */
async function run (t: Test, batch: false | undefined): Promise<Run> {
  const client = cluster.client({ enableOfflineQueue: false })
  client.on('error', () => {})
  t.teardown(() => client.disconnect())
  if (client.status !== 'ready') await once(client, 'ready')
  const prefix = uniquePrefix()
  const limiter = createLimiter({ redis: client, prefix, timeout: TIMEOUT_MS, denialCache: false, batch, keySecret: SECRET })
  t.teardown(() => limiter.close())
  const masters = await cluster.masters()
  const { slot, ids: slotIds } = sameSlot(prefix)
  const source = await cluster.masterFor(keyOf(prefix, slotIds[0] as string))
  const [target, other] = masters.filter((m) => m !== source) as [RedisServer, RedisServer]
  const groups = { slot: slotIds, other: await clientsOn(prefix, other) }
  const charges: Charges = { asked: new Map(), spentByStore: new Map() }
  await limiter.ready
  // Every client's key exists, on its master, before the migration starts.
  const first = await flood(limiter, groups, 1, charges)
  t.same(first, { slot: { asked: CLIENTS, store: CLIENTS }, other: { asked: CLIENTS, store: CLIENTS } }, 'all decided by Redis before the migration')
  for (const id of slotIds) t.equal(await redisCommand(source, ['EXISTS', keyOf(prefix, id)]), 1, `${id}'s key is on the slot's master`)

  let opened = 0
  const listener = (message: unknown): void => { if ((message as { state: string }).state === 'open') opened++ }
  diagnostics.subscribe('tollgate:breaker', listener)
  await startMigration(source, target, slot, keyOf(prefix, slotIds[0] as string))
  const during = await flood(limiter, groups, FLOOD_MS, charges)
  await endMigration(source, target, slot, masters)
  const after = await flood(limiter, groups, AFTER_MS, charges)
  diagnostics.unsubscribe('tollgate:breaker', listener)

  // Read by a limiter of its own, whatever the flood's breaker says.
  const reader = createLimiter({ redis: client, prefix, timeout: 2000, denialCache: false, keySecret: SECRET })
  t.teardown(() => reader.close())
  const spent = new Map<string, number>()
  for (const id of [...groups.slot, ...groups.other]) {
    const peeked = await reader.peek(id, policy)
    t.equal(peeked.source, 'store', `${id}: peeked in Redis`)
    spent.set(id, (policy.capacity as number) - peeked.remaining)
  }
  return { during, after, opened, charges, spent }
}

const share = (tally: Tally): number => tally.store / tally.asked
const shown = (tally: Tally): string => `${tally.store}/${tally.asked}`

t.test('a slot migrating under a batched flood: Redis decides as much as without batching, the breaker stays closed', async (t) => {
  const unbatched = await run(t, false)
  const batched = await run(t, undefined)
  for (const [name, r] of [['batch: false', unbatched], ['batched', batched]] as const) {
    t.comment(`${name}: decided by Redis during the migration: slot ${shown(r.during.slot)}, other master ${shown(r.during.other)}; ` +
      `${AFTER_MS} ms after it: slot ${shown(r.after.slot)}, other master ${shown(r.after.other)}; breaker opened ${r.opened} times`)
  }
  for (const phase of ['during', 'after'] as const) {
    for (const group of ['slot', 'other'] as const) {
      t.ok(share(batched[phase][group]) >= share(unbatched[phase][group]) - TOLERANCE,
        `${phase} the migration, ${group}: batched ${shown(batched[phase][group])} against batch: false ${shown(unbatched[phase][group])}`)
    }
  }
  t.equal(batched.opened, 0, 'the batched breaker never opened')
  for (const r of [unbatched, batched]) {
    for (const [id, spent] of r.spent) {
      const asked = r.charges.asked.get(id) ?? 0
      const allowed = r.charges.spentByStore.get(id) ?? 0
      t.ok(spent >= allowed && spent <= asked, `${id}: spent ${spent}, at least the ${allowed} Redis allowed, at most the ${asked} asked`)
    }
  }
})

t.test('a decision whose own keys the migration split: refused (TRYAGAIN), answered by the failure mode, not counted by the breaker, nothing spent', async (t) => {
  const client = createCluster({ rootNodes: cluster.startupNodes.map((n) => ({ socket: n })) })
  client.on('error', () => {})
  await client.connect()
  t.teardown(() => { try { client.destroy() } catch {} })
  const prefix = uniquePrefix()
  // One failure would open this breaker.
  const limiter = createLimiter({ redis: client, prefix, timeout: 1000, denialCache: false, breaker: { failures: 1, cooldownMs: 60_000 }, keySecret: SECRET })
  t.teardown(() => limiter.close())
  await limiter.ready
  const both: Policy[] = [policy, { ...policy, bucket: 'b2' }]
  const masters = await cluster.masters()
  const source = await cluster.masterFor(keyOf(prefix, 'split'))
  const target = masters.find((m) => m !== source) as RedisServer
  const slot = slotOf(keyOf(prefix, 'split'))
  t.match(await limiter.consume('split', both), { allowed: true, source: 'store' }, 'both buckets written on the slot\'s master')
  let opened = 0
  const listener = (message: unknown): void => { if ((message as { state: string }).state === 'open') opened++ }
  diagnostics.subscribe('tollgate:breaker', listener)
  t.teardown(() => diagnostics.unsubscribe('tollgate:breaker', listener))
  await startMigration(source, target, slot, keyOf(prefix, 'split'))
  for (let i = 0; i < 5; i++) {
    const started = performance.now()
    t.match(await limiter.consume('split', both), { allowed: true, source: 'fail-open' }, 'the two keys are on two masters: refused')
    t.ok(performance.now() - started < 500, 'at once, not at the deadline')
  }
  t.match(await limiter.consume('split', policy), { allowed: true, source: 'store' }, 'the moved bucket alone: sent on with ASK, decided by Redis')
  t.equal(limiter.state, 'healthy')
  await endMigration(source, target, slot, masters)
  t.match(await limiter.consume('split', both), { allowed: true, source: 'store' }, 'both, once the slot has moved')
  t.equal(opened, 0, 'the breaker never opened')
  const remaining = async (p: Policy): Promise<number> => (await limiter.peek('split', p)).remaining
  t.equal(await remaining(policy), (policy.capacity as number) - 3, 'bucket b: the three decisions Redis allowed, none of the refused')
  t.equal(await remaining(both[1] as Policy), (policy.capacity as number) - 2, 'bucket b2: the two Redis allowed')
})
