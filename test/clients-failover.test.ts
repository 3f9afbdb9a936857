// A master of a Redis Cluster (3 masters, 1 replica each, node timeout 1 s)
// goes away, killed and then paused (SIGSTOP: its connections stay open,
// nothing answers), under steady decisions through the Cluster client of
// each family besides ioredis (test/failover.test.ts): node-redis 6,
// iovalkey and GLIDE. Then every node hangs and comes back, under
// node-redis 6 (no node answers the probe before a rediscovery) and
// node-redis 4 (whose slot map tollgate cannot have rediscovered). While the replica takes over, decisions follow the
// failure mode within the deadline; after the promotion they come from
// the store again, within a bound, and stay so. A paused master is the
// case where the client must learn the new slot map (the breaker asks it
// to, lib/store/client.ts StoreClient.refresh), since the old master's
// socket stays open. GLIDE offers no way to ask: its own topology checks
// (every second here) do not move a slot off a master that hangs (its
// requests time out for as long as it does: 27 s of a pause were seen), so
// for GLIDE the paused master is resumed 2 s after the promotion, and the
// bound is counted from then; until then the failure mode decides, within
// the deadline, as it must (docs/guides/cluster.md,
// "Redis clients").

import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { createLimiter, type Policy } from '../lib/index.js'
import { uniquePrefix } from './helpers/app.js'
import { families } from './helpers/clients.js'
import { startCluster } from './helpers/cluster.js'
import { keyUnder } from './helpers/keys.js'

/** Keys named with no read from Redis, so a test can name a client's key (and find its master) before any call. */
const KEY_SECRET = 'a key secret for these tests'

const TIMEOUT_MS = 250
/** Timer and scheduling lateness on a loaded 2-core machine, on top of the deadline. */
const DEADLINE_TOLERANCE_MS = 600
/** From the promotion to the last decision not from the store: slot discovery, a breaker cool-down (1 s), and noise. */
const RECOVERY_BOUND_MS = 8_000
const TICK_MS = 25
const STEADY_AFTER_MS = 1_000

const cluster = await startCluster({ masters: 3, replicasPerMaster: 1, nodeTimeoutMs: 1_000 })
t.teardown(() => cluster.stop())

interface Seen { at: number, ms: number, source: string }

async function waitFor (what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!await check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(50)
  }
}

const targets = families.filter((f) => ['node-redis 6', 'iovalkey', 'GLIDE'].includes(f.label))

for (const family of targets) {
  for (const how of ['kill', 'pause'] as const) {
    t.test(`${family.label} Cluster: a master is ${how === 'kill' ? 'killed' : 'paused'}; the failure mode during the switch, the store after the promotion`, async (t: Test) => {
      await cluster.waitHealthy()
      const made = await (family.cluster as NonNullable<typeof family.cluster>)(cluster.startupNodes)
      t.teardown(() => made.close())
      const clientId = `${family.label}-${how}`.replace(/[^A-Za-z0-9]/g, '-')
      const prefix = uniquePrefix()
      const limiter = createLimiter({ redis: made.client, prefix, timeout: TIMEOUT_MS, breaker: { failures: 5, cooldownMs: 1000 }, keySecret: KEY_SECRET })
      t.teardown(() => limiter.close())
      const policy: Policy = { bucket: 'f', capacity: 1e6, refillPerSecond: 1e3, failureMode: 'open' }
      const victim = await cluster.masterFor(keyUnder(KEY_SECRET, prefix, clientId, 'f'))
      await waitFor('a first store decision', async () => (await limiter.consume(clientId, policy)).source === 'store', 10_000)

      const seen: Seen[] = []
      const started = performance.now()
      let running = true
      const loop = (async () => {
        while (running) {
          const sent = performance.now()
          const decision = await limiter.consume(clientId, policy)
          seen.push({ at: sent - started, ms: performance.now() - sent, source: decision.source })
          await sleep(TICK_MS)
        }
      })()
      let downAt = 0
      let promotedAt = 0
      try {
        await sleep(500)
        downAt = performance.now() - started
        if (how === 'kill') await victim.kill()
        else victim.pause()
        await waitFor('a replica to take over', async () => {
          const now = await cluster.masters()
          return now.length === 3 && !now.includes(victim)
        }, 30_000)
        promotedAt = performance.now() - started
        if (how === 'pause' && family.label === 'GLIDE') {
          await sleep(2000)
          victim.resume()
          promotedAt = performance.now() - started
        }
        // Counted in decisions made, not only in time: a decision still in
        // flight at the end of the wait (up to the deadline and its
        // tolerance) may be one more fallback, and a wait on time alone
        // then ended with no store decision after it.
        await waitFor('decisions from the store again', async () => {
          let i = seen.length
          while (i > 0 && seen[i - 1]?.source === 'store') i--
          const last = Math.max(downAt, seen[i - 1]?.at ?? 0)
          return seen.length - i >= STEADY_AFTER_MS / TICK_MS / 4 && performance.now() - started > Math.max(last, promotedAt) + STEADY_AFTER_MS
        }, RECOVERY_BOUND_MS + STEADY_AFTER_MS + 10_000)
      } finally {
        running = false
        await loop
        if (how === 'kill') await victim.restart()
        else victim.resume()
      }
      const before = seen.filter((s) => s.at + s.ms < downAt)
      const during = seen.filter((s) => s.at >= downAt)
      const fallbacks = during.filter((s) => s.source !== 'store')
      const lastFallback = fallbacks.reduce((max, s) => Math.max(max, s.at), downAt)
      const slowest = seen.reduce((max, s) => Math.max(max, s.ms), 0)
      t.comment(`promotion ${(promotedAt - downAt).toFixed(0)} ms after the ${how}, last fallback ${(lastFallback - promotedAt).toFixed(0)} ms after it; ${seen.length} decisions, ${fallbacks.length} fallbacks, slowest ${slowest.toFixed(0)} ms`)
      t.ok(before.length >= 5 && before.every((s) => s.source === 'store'), `before: ${before.length} decisions, all from the store`)
      t.ok(fallbacks.length > 0 && fallbacks.every((s) => s.source === 'fail-open'), `the switch was seen: ${fallbacks.length} fail-open decisions`)
      t.ok(slowest <= TIMEOUT_MS + DEADLINE_TOLERANCE_MS, `no decision waited past the deadline: slowest ${slowest.toFixed(0)} ms`)
      t.ok(lastFallback - promotedAt <= RECOVERY_BOUND_MS, `store decisions resumed ${(lastFallback - promotedAt).toFixed(0)} ms after the promotion (bound ${RECOVERY_BOUND_MS} ms)`)
      const tail = seen.filter((s) => s.at > lastFallback).length
      t.ok(tail >= STEADY_AFTER_MS / TICK_MS / 4, `${tail} store decisions in a row to the end`)
      t.equal(limiter.state, 'healthy')
    })
  }
}

for (const family of families.filter((f) => ['node-redis 6', 'node-redis 4, isolationPoolOptions'].includes(f.label))) {
  t.test(`${family.label} Cluster: every node hangs, then comes back: the failure mode meanwhile, with no slot map rediscovered, then the store`, async (t: Test) => {
    await cluster.waitHealthy()
    const made = await (family.cluster as NonNullable<typeof family.cluster>)(cluster.startupNodes)
    t.teardown(() => made.close())
    const limiter = createLimiter({ redis: made.client, prefix: uniquePrefix(), timeout: TIMEOUT_MS, breaker: { failures: 5, cooldownMs: 1000 } })
    t.teardown(() => limiter.close())
    const policy: Policy = { bucket: 'f', capacity: 1e6, refillPerSecond: 1e3, failureMode: 'open' }
    await waitFor('a first store decision', async () => (await limiter.consume('hang', policy)).source === 'store', 10_000)
    const during: string[] = []
    let slowest = 0
    for (const node of cluster.nodes) node.pause()
    try {
      // Past the deadline five times (the breaker opens, and asks for a
      // rediscovery: no node answers its PING), then a cool-down and a probe.
      const end = performance.now() + 3000
      while (performance.now() < end) {
        const sent = performance.now()
        during.push((await limiter.consume('hang', policy)).source)
        slowest = Math.max(slowest, performance.now() - sent)
        await sleep(TICK_MS)
      }
      t.equal(limiter.state, 'failing', 'the store is failing')
    } finally {
      for (const node of cluster.nodes) node.resume()
    }
    t.ok(during.length > 0 && during.every((s) => s === 'fail-open'), `${during.length} decisions by the failure mode`)
    t.ok(slowest <= TIMEOUT_MS + DEADLINE_TOLERANCE_MS, `none past the deadline: slowest ${slowest.toFixed(0)} ms`)
    await waitFor('decisions from the store again', async () => (await limiter.consume('hang', policy)).source === 'store', RECOVERY_BOUND_MS)
    t.equal(limiter.state, 'healthy', 'healthy again')
  })
}
