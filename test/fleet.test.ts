// Four app servers in four separate Node processes (each with its own
// Fastify, and its own tollgate and ioredis client per store) share one
// bucket, once in a single Redis and once in a Redis Cluster. One client's requests are spread over
// all four for a few seconds, far faster than the bucket refills. Together
// the fleet must admit what one bucket allows, capacity + refill x elapsed:
// never more, and not much less.
//
// Bounds, with `elapsed` measured in this process from the first request
// sent to the last answer received (so every decision the store made lies
// inside it) and `refill` in tokens per second:
//
// - upper (safety): allowed <= capacity + refill x (elapsed + 10 ms). The
//   bucket starts full at the first decision and gains exactly
//   refill x (time between the first and last decision) tokens; each
//   admission spends one, and the script rounds in the bucket's disfavour.
//   The 10 ms cover that Redis TIME (wall clock) and performance.now()
//   (monotonic) are different clocks; their rates differ by NTP slew, at
//   most 0.05 %, i.e. 1.5 ms over 3 s.
// - lower (no under-admission): allowed >= capacity + refill x elapsed
//   - refill x (first round trip + 2 x slowest round trip) - 1. Tokens the
//   fleet could not have spent: those "refilled" before the first decision
//   reached Redis (the bucket was full, so they were capped: one round
//   trip), those refilled after the last decision (the last call can reach
//   Redis up to one round trip before the last answer, plus at most one
//   round trip of a server waiting out its denial cache), and the fraction
//   of a token left at the end (< 1). The round trips are measured in this
//   run, so a loaded machine widens the band by what it really cost.
//
// failureMode 'closed' with a 2 s deadline: a slow store becomes a 503
// (under-admission), never an extra 200, and no 503 is expected.

import t, { type Test } from 'tap'
import { uniquePrefix } from './helpers/app.js'
import { startCluster } from './helpers/cluster.js'
import { drive, startFleet } from './helpers/fleet.js'
import { redisUrl } from './helpers/redis.js'

const SERVERS = 4
const CAPACITY = 100
const REFILL = 50
const DRIVE_MS = 3_000
/** Requests in flight per server; 12 in all, far above what 50 tokens/s need. */
const CONCURRENCY = 3
const CLOCK_MARGIN_S = 0.01

const url = await redisUrl(t)
const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())

// One fleet of four processes, each serving both stores: /single/hit
// through the single Redis, /cluster/hit through the Cluster (its own
// client and tollgate instance per store). Started once for both tests.
const prefix = uniquePrefix()
const started = performance.now()
const servers = await startFleet(t, SERVERS, {
  name: 'app',
  stores: {
    single: { url },
    // Fail fast instead of queueing while the cluster is not ready; the
    // cluster here stays healthy, failover has its own test.
    cluster: { cluster: cluster.startupNodes, clusterOptions: { enableOfflineQueue: false } }
  },
  prefix,
  bucket: 'fleet',
  capacity: CAPACITY,
  refillPerSecond: REFILL,
  failureMode: 'closed',
  timeout: 2_000
})
t.comment(`${SERVERS} app server processes listening after ${(performance.now() - started).toFixed(0)} ms`)

async function fleetShares (t: Test, store: 'single' | 'cluster'): Promise<void> {
  t.equal(new Set(servers.map((s) => s.pid)).size, SERVERS, `${SERVERS} separate processes`)
  t.ok(servers.every((s) => s.pid !== process.pid), 'none of them is this process')
  // Opens each server's keep-alive sockets and warms its routes, outside the bucket.
  await Promise.all(servers.map((s) => s.get('/clock')))

  const result = await drive(servers, { ms: DRIVE_MS, concurrency: CONCURRENCY, path: `/${store}/hit`, headers: { 'x-client': `${store}-client` } })
  const allowed = result.statuses[200] ?? 0
  const elapsedS = result.elapsedMs / 1000
  const expected = CAPACITY + REFILL * elapsedS
  const upper = CAPACITY + REFILL * (elapsedS + CLOCK_MARGIN_S)
  const slackS = (result.firstLatencyMs + 2 * result.maxLatencyMs) / 1000
  const lower = expected - REFILL * slackS - 1
  t.comment(`${store}: ${result.requests} requests in ${result.elapsedMs.toFixed(0)} ms, ` +
    `allowed ${allowed}, expected ${expected.toFixed(1)}, band [${lower.toFixed(1)}, ${upper.toFixed(1)}], ` +
    `first round trip ${result.firstLatencyMs.toFixed(0)} ms, slowest ${result.maxLatencyMs.toFixed(0)} ms, ` +
    `per server ${result.servers.map((s) => `${s.name} ${JSON.stringify(s.statuses)}`).join(', ')}`)

  t.same(Object.keys(result.statuses).sort(), ['200', '429'], 'only admissions and limits: no store failure (503)')
  t.ok(allowed <= upper, `never above the bucket: ${allowed} <= ${upper.toFixed(1)}`)
  t.ok(allowed >= lower, `not much below it: ${allowed} >= ${lower.toFixed(1)}`)
  t.ok(result.requests >= 2 * upper, `the fleet was driven well past the limit (${result.requests} requests)`)
  for (const server of result.servers) {
    t.ok((server.statuses[200] ?? 0) > 0 && (server.statuses[429] ?? 0) > 0,
      `${server.name} admitted some and was limited by the shared bucket`)
  }
}

t.test('four processes on one Redis admit what one bucket allows', async (t) => {
  await fleetShares(t, 'single')
})

t.test('four processes on a Redis Cluster admit what one bucket allows', async (t) => {
  await fleetShares(t, 'cluster')
})
