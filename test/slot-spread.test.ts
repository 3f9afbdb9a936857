// No input picks its Cluster slot (SPEC section 10), on a real local Redis
// Cluster of 3 masters: 200 client ids crafted against the earlier key
// layout (`<prefix>:{<client part>}:<bucket>`, whose slot anyone could
// compute) all landed in slot 4242, on one master. Under the keyed hash tag
// (lib/core/keys.ts hashTag) they spread over the three, and ids crafted
// under a secret the attacker knows spread too on a fleet whose secret they
// do not know (while a fleet that uses that very secret shows the crafting
// works: the test can fail).
//
// Tolerance: each id lands on a master with probability about 1/3 (each
// master serves a third of the slots), so a master's count out of 200 is
// Binomial(200, 1/3): mean 66.7, standard deviation 6.7. The test asks at
// least 40 on each (4 standard deviations under the mean: a false failure
// about once in 30 000 runs), and at most 3 ids in any one slot (200 ids in
// 16 384 slots: about one pair shares a slot; three in one slot happen about
// once in 200 runs, four about once in 70 000).

import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import t, { type Test } from 'tap'
import { createLimiter, type Limiter, type Policy } from '../lib/index.js'
import { slotOf } from './helpers/slot.js'
import { uniquePrefix } from './helpers/app.js'
import { keysOn, startCluster } from './helpers/cluster.js'
import { isSecretKey } from './helpers/keys.js'
import { oldSlot, keyedSlot, type SlotAttack } from './helpers/slot-attack.js'

const attack = JSON.parse(readFileSync(new URL('fixtures/slot-attack.json', import.meta.url), 'utf8')) as SlotAttack
const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())
const masters = await cluster.masters()
const policy: Policy = { bucket: 'login', capacity: 5, refillPerSecond: 0.001, failureMode: 'closed' }

/** Each master's count of bucket keys under `prefix` (the secret's key left out). */
async function perMaster (prefix: string): Promise<number[]> {
  const counts: number[] = []
  for (const master of masters) counts.push((await keysOn(master, `${prefix}:*`)).filter((key) => !isSecretKey(key, prefix)).length)
  return counts
}


/** A limiter on the cluster, ready (its key secret read), closed after `t`. */
async function limiterOn (t: Test, prefix: string, keySecret?: string): Promise<Limiter> {
  const redis = cluster.client({ enableOfflineQueue: false })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  // createLimiter, unlike the adapters, does not wait for its client to connect.
  if (redis.status !== 'ready') await once(redis, 'ready')
  const limiter = createLimiter({ redis, prefix, timeout: 2_000, ...(keySecret === undefined ? {} : { keySecret }) })
  t.teardown(() => limiter.close())
  await limiter.ready
  return limiter
}

/** Spends once for each id; returns the slots their keys landed in (from the keys Redis holds). */
async function spend (t: Test, limiter: Limiter, prefix: string, ids: readonly string[]): Promise<number[]> {
  for (const id of ids) {
    const decision = await limiter.consume(id, policy)
    if (decision.source !== 'store') t.fail(`${id}: decided by ${decision.source}`)
  }
  const keys = (await Promise.all(masters.map((m) => keysOn(m, `${prefix}:*`)))).flat().filter((key) => !isSecretKey(key, prefix))
  t.equal(keys.length, ids.length, 'one key per id')
  return keys.map(slotOf)
}

function spread (t: Test, label: string, counts: number[], slots: number[]): void {
  t.comment(`${label}: per master ${counts.join(' / ')}, ${new Set(slots).size} distinct slots`)
  for (const [i, count] of counts.entries()) t.ok(count >= 40, `${label}: master ${i + 1} holds ${count} (at least 40 of ${slots.length})`)
  const most = Math.max(...[...countBy(slots).values()])
  t.ok(most <= 3, `${label}: at most 3 ids in one slot (${most})`)
}

function countBy (values: number[]): Map<number, number> {
  const counts = new Map<number, number>()
  for (const v of values) counts.set(v, (counts.get(v) ?? 0) + 1)
  return counts
}

t.test('the crafted ids did aim at one slot under the earlier layout', async (t) => {
  t.equal(attack.oldScheme.length, 200)
  t.equal(new Set(attack.oldScheme).size, 200, 'distinct ids')
  t.ok(attack.oldScheme.every((id) => oldSlot(id) === attack.slot), `every one in slot ${attack.slot}, 150 kept ids and 50 hashed`)
  t.equal(attack.oldScheme.filter((id) => id.includes('@')).length, 50)
  t.ok(attack.keyed.every((id) => keyedSlot(attack.knownSecret, id) === attack.slot), `the keyed ones in slot ${attack.slot} under the known secret`)
})

t.test('200 ids crafted against the earlier layout spread over the three masters', async (t) => {
  const prefix = uniquePrefix()
  const limiter = await limiterOn(t, prefix)
  const slots = await spend(t, limiter, prefix, attack.oldScheme)
  spread(t, 'zero-configuration secret', await perMaster(prefix), slots)
})

t.test('ids crafted under a known secret spread on a fleet with another one, and stay together on a fleet with it', async (t) => {
  const other = uniquePrefix()
  const slots = await spend(t, await limiterOn(t, other, 'the fleet\'s own secret, unknown to them'), other, [...attack.keyed, ...attack.oldScheme.slice(0, 140)])
  spread(t, 'another keySecret', await perMaster(other), slots)

  // The control: with the secret they know, the crafting works.
  const known = uniquePrefix()
  const aimed = await spend(t, await limiterOn(t, known, attack.knownSecret), known, attack.keyed)
  t.same([...new Set(aimed)], [attack.slot], `all ${attack.keyed.length} in slot ${attack.slot} when the attacker knows the secret`)
  t.equal((await perMaster(known)).filter((n) => n > 0).length, 1, 'on one master')
})
