// Concurrency limits across a fleet (SPEC 13): three app server processes
// (test/helpers/fleet-server.ts, Fastify) share `concurrency: { max: 3 }`
// for one client, on one Redis and on a Redis Cluster. 45 requests at once,
// each held 300 ms in its handler, spread over the servers: a Redis counter
// that each handler increments once it holds its slot, and decrements before
// its answer is sent, is never above max at any instant (read by every
// handler as it enters: the largest value any saw). No tolerance: the
// counter only counts requests that hold a slot. The same load through a
// read-then-write acquisition (test/helpers/naive.ts naiveAcquire) sees more
// in flight: the race this test would catch in the script.

import { randomBytes } from 'node:crypto'
import t from 'tap'
import { startCluster } from './helpers/cluster.js'
import { startFleet, type FleetServer, type Reply } from './helpers/fleet.js'
import { redisUrl } from './helpers/redis.js'

const MAX = 3
const REQUESTS = 45
const HOLD_MS = 300

const url = await redisUrl(t)
const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())
const servers = await startFleet(t, 3, {
  name: 'conc',
  stores: { single: { url }, cluster: { cluster: cluster.startupNodes } },
  prefix: `t-${randomBytes(6).toString('hex')}`,
  bucket: 'exports',
  capacity: 1000,
  refillPerSecond: 1000,
  failureMode: 'closed',
  timeout: 1000,
  concurrency: { max: MAX }
})

async function load (path: string): Promise<Reply[]> {
  return await Promise.all(Array.from({ length: REQUESTS }, async (_, i) => await (servers[i % servers.length] as FleetServer).get(path, { 'x-hold-ms': String(HOLD_MS) })))
}

function inFlight (replies: readonly Reply[]): number[] {
  return replies.filter((r) => r.status === 200).map((r) => (JSON.parse(r.body) as { inFlight: number }).inFlight)
}

for (const label of ['single', 'cluster']) {
  t.test(`${label}: never more than max in flight across the fleet`, async (t) => {
    const replies = await load(`/${label}/slot`)
    const seen = inFlight(replies)
    t.ok(seen.length >= MAX, `${seen.length} admitted (at least max: the first ${MAX} found the slots free)`)
    t.ok(Math.max(...seen) <= MAX, `at most ${MAX} in flight at any instant (largest seen ${Math.max(...seen)})`)
    const denied = replies.filter((r) => r.status === 429)
    t.equal(denied.length + seen.length, REQUESTS, 'every other request was refused')
    t.ok(denied.every((r) => r.headers['retry-after'] === '1'), 'with Retry-After: 1')
    const again = await load(`/${label}/slot`)
    t.ok(inFlight(again).length >= MAX, 'every slot was given back: the next wave is admitted again')
  })
}

t.test('a read-then-write acquisition lets more than max in flight under the same load', async (t) => {
  // The race needs two acquisitions to read before either writes, which the
  // load does not force: most waves see 12 to 24 in flight, one in many saw
  // only 4, one none over max. A race shown in any of up to 5 waves is shown.
  const largest: number[] = []
  while (largest.length < 5 && !largest.some((n) => n > MAX)) largest.push(Math.max(...inFlight(await load('/single/naive-slot'))))
  t.ok(largest.some((n) => n > MAX), `largest seen in flight per wave: ${largest.join(', ')} for ${MAX} slots`)
})
