// A concurrency policy beside a rate policy, through the core limiter on a
// redis-server of its own (docs/guides/concurrency.md cites the figures):
//
// - per request: `consume` of one rate policy, against `acquire` of one
//   concurrency policy and its `release` (two script calls: lua/concurrency.lua,
//   then lua/concurrency-release.lua). This process's CPU time per request
//   (process.cpuUsage) and Redis's (INFO commandstats: usec of EVALSHA and
//   EVAL per request), medians of interleaved rounds, and the ratios.
//   Requests go BENCH_CONC_INFLIGHT at a time (default 32), over 1,000
//   clients, none denied (max is above what any client has in flight). The
//   rate policy's consumes are batched as lib batches them by default.
// - renewal: BENCH_CONC_HELD slots (default 1,000, one per client) held for
//   three leases of BENCH_CONC_LEASE_MS (default 3,000; the default lease is
//   60,000): the renewal calls Redis ran, per held slot and second, and the
//   CPU time of this process and of Redis per renewal. One timer per
//   limiter renews every held key a third of a lease apart: per held slot,
//   3 / lease calls a second (3 per minute at the default lease).
//
// Knobs: BENCH_ROUNDS (default 5), BENCH_CONC_REQUESTS (per round and
// kind, default 5,000), and those above. The machine may be shared: read the
// ratios, and run again before trusting an absolute figure.

import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { createLimiter } from 'tollgate'
import { startRedis } from './redis.mjs'
import { commandStats } from './stats.mjs'

const ROUNDS = Math.round(Number(process.env.BENCH_ROUNDS ?? 5))
const REQUESTS = Math.round(Number(process.env.BENCH_CONC_REQUESTS ?? 5000))
const INFLIGHT = Math.round(Number(process.env.BENCH_CONC_INFLIGHT ?? 32))
const HELD = Math.round(Number(process.env.BENCH_CONC_HELD ?? 1000))
const LEASE_MS = Math.round(Number(process.env.BENCH_CONC_LEASE_MS ?? 3000))
const CLIENTS = 1000

const rate = { bucket: 'bench-rate', capacity: 1e6, refillPerSecond: 1e6, failureMode: 'open' }
const slots = { bucket: 'bench-slots', concurrency: { max: 1000 }, failureMode: 'open' }

/** Redis's script time so far, µs, and its script calls. */
async function scriptTime (redis) {
  const stats = await commandStats(redis)
  let usec = 0
  let calls = 0
  for (const name of ['evalsha', 'eval']) {
    usec += stats.get(name)?.usec ?? 0
    calls += stats.get(name)?.calls ?? 0
  }
  return { usec, calls }
}

/** `one(i)` REQUESTS times, INFLIGHT at a time: this process's CPU µs and Redis's script µs, per request. */
async function measure (redis, one) {
  const before = await scriptTime(redis)
  const cpu = process.cpuUsage()
  let next = 0
  await Promise.all(Array.from({ length: INFLIGHT }, async () => {
    while (next < REQUESTS) await one(next++)
  }))
  const used = process.cpuUsage(cpu)
  const after = await scriptTime(redis)
  return { cpuUs: (used.user + used.system) / REQUESTS, redisUs: (after.usec - before.usec) / REQUESTS }
}

function median (list) {
  const sorted = [...list].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]
}

async function perRequest (redis, limiter) {
  const kinds = {
    rate: async (i) => { await limiter.consume(`c${i % CLIENTS}`, rate) },
    concurrency: async (i) => {
      const { release } = await limiter.acquire(`c${i % CLIENTS}`, slots)
      await release()
    }
  }
  const seen = { rate: [], concurrency: [] }
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? ['rate', 'concurrency'] : ['concurrency', 'rate']
    for (const kind of order) seen[kind].push(await measure(redis, kinds[kind]))
  }
  const of = (kind, field) => median(seen[kind].map((m) => m[field]))
  return ['cpuUs', 'redisUs'].map((field) => ({ field, rate: of('rate', field), concurrency: of('concurrency', field) }))
}

async function renewal (redis, limiter) {
  const policy = { ...slots, bucket: 'bench-held', concurrency: { max: 1, leaseMs: LEASE_MS } }
  const held = await Promise.all(Array.from({ length: HELD }, async (_, i) => await limiter.acquire(`h${i}`, policy)))
  const before = await scriptTime(redis)
  const cpu = process.cpuUsage()
  const started = performance.now()
  await sleep(3 * LEASE_MS)
  const seconds = (performance.now() - started) / 1000
  const used = process.cpuUsage(cpu)
  const after = await scriptTime(redis)
  const calls = after.calls - before.calls
  await Promise.all(held.map(({ release }) => release()))
  return {
    callsPerSlotSecond: calls / HELD / seconds,
    cpuUsPerRenewal: (used.user + used.system) / Math.max(1, calls),
    redisUsPerRenewal: (after.usec - before.usec) / Math.max(1, calls)
  }
}

const server = await startRedis()
const redis = new Redis({ host: server.host, port: server.port })
const limiter = createLimiter({ redis: new Redis({ host: server.host, port: server.port }), timeout: 1000 })
try {
  await limiter.ready
  const rows = await perRequest(redis, limiter)
  const renewed = await renewal(redis, limiter)
  const out = [
    `${ROUNDS} rounds of ${REQUESTS} requests per kind, ${INFLIGHT} in flight, ${CLIENTS} clients; medians.`,
    '',
    '| per request | rate policy (consume) | concurrency policy (acquire + release) | ratio |',
    '| --- | ---: | ---: | ---: |'
  ]
  for (const { field, rate: r, concurrency: c } of rows) {
    out.push(`| ${field === 'cpuUs' ? 'app CPU µs' : 'Redis script µs'} | ${r.toFixed(1)} | ${c.toFixed(1)} | ${(c / r).toFixed(2)} |`)
  }
  out.push('', `Renewal, ${HELD} slots held for three leases of ${LEASE_MS} ms: ${renewed.callsPerSlotSecond.toFixed(3)} calls per held slot and second ` +
    `(3 / lease: ${(3000 / LEASE_MS).toFixed(3)}), ${renewed.cpuUsPerRenewal.toFixed(1)} app CPU µs and ${renewed.redisUsPerRenewal.toFixed(1)} Redis µs per renewal call.`)
  process.stdout.write(out.join('\n') + '\n')
} finally {
  await limiter.close()
  redis.disconnect()
  await server.stop()
  process.exit(0)
}
