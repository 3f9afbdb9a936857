// Node CPU per request of Fastify apps answered through `inject` (no
// sockets, no load generator: the app's own work and its Redis round trip
// only), against one Redis, for: bare Fastify; the floor (a hook awaiting
// one EVALSHA of `return 1`); @fastify/rate-limit with its Redis store; and
// tollgate exact (`denialCache: false`). The apps live in one process and
// take turns round by round, so a change in the machine's load hits them
// alike; the figure is the median over rounds of process.cpuUsage() (user +
// system) per request, and each limiter's CPU added over bare Fastify is
// also given as a ratio to @fastify/rate-limit's.
//
//   npm run build && node bench/inject.mjs
//
// Environment: ROUNDS (15), REQUESTS per app per round (4000), CONCURRENCY
// (comma-separated requests in flight, 1,32), REDIS_URL (a Redis of its own
// is started when absent).

import Fastify from 'fastify'
import rateLimit from '@fastify/rate-limit'
import { Redis } from 'ioredis'
import tollgate from 'tollgate'
import { startRedis } from './redis.mjs'

const ROUNDS = Number(process.env.ROUNDS ?? 15)
const REQUESTS = Number(process.env.REQUESTS ?? 4000)
const CONCURRENCY = (process.env.CONCURRENCY ?? '1,32').split(',').map(Number)
for (const [name, value] of [['ROUNDS', ROUNDS], ['REQUESTS', REQUESTS], ...CONCURRENCY.map((c) => ['CONCURRENCY', c])]) {
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a whole number >= 1`)
}

const own = process.env.REDIS_URL ? undefined : await startRedis()
const redis = process.env.REDIS_URL ? new Redis(process.env.REDIS_URL) : new Redis({ host: own.host, port: own.port })
await redis.flushall()

// Every client stays under its limit: 1000 clients, a bucket far larger
// than what a run spends.
const POLICY = { capacity: 1e6, refillPerSecond: 1e6 }
const clientOf = (request) => request.headers['x-client-id']
const handler = async () => 'ok'

async function build (config) {
  const app = Fastify({ logger: false })
  let routeConfig = {}
  if (config === 'round-trip') {
    const sha = await redis.script('LOAD', 'return 1')
    const roundTrip = async () => { await redis.evalsha(sha, 0) }
    app.addHook('onRoute', (route) => { route.onRequest = [roundTrip] })
  } else if (config === 'frl-redis') {
    await app.register(rateLimit, { global: false, keyGenerator: clientOf, redis })
    routeConfig = { rateLimit: { max: POLICY.capacity, timeWindow: 1000 } }
  } else if (config === 'tollgate-exact') {
    await app.register(tollgate, { redis, failureMode: 'open', timeout: 1000, key: clientOf, global: false, denialCache: false })
    routeConfig = { rateLimit: POLICY }
  }
  app.get('/w', { config: routeConfig }, handler)
  await app.ready()
  return app
}

const CONFIGS = ['bare', 'round-trip', 'frl-redis', 'tollgate-exact']
const apps = Object.fromEntries(await Promise.all(CONFIGS.map(async (c) => [c, await build(c)])))

/** CPU µs per request of `n` requests, `concurrency` in flight. */
async function measure (app, n, concurrency) {
  let next = 0
  let failed = 0
  const worker = async () => {
    while (next < n) {
      const i = next++
      const res = await app.inject({ method: 'GET', url: '/w', headers: { 'x-client-id': `c${i % 1000}` } })
      if (res.statusCode !== 200) failed++
    }
  }
  const before = process.cpuUsage()
  await Promise.all(Array.from({ length: concurrency }, worker))
  const used = process.cpuUsage(before)
  if (failed > 0) throw new Error(`${failed} requests were not answered 200`)
  return (used.user + used.system) / n
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2 }

console.log(`Fastify inject, one Redis; ${ROUNDS} rounds of ${REQUESTS} requests per app, apps interleaved in a new order each round; Node CPU µs per request, medians over rounds`)
for (const concurrency of CONCURRENCY) {
  const cpu = Object.fromEntries(CONFIGS.map((c) => [c, []]))
  for (const c of CONFIGS) await measure(apps[c], REQUESTS, concurrency) // warm-up
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? CONFIGS : [...CONFIGS].reverse()
    for (const c of order) cpu[c].push(await measure(apps[c], REQUESTS, concurrency))
  }
  const bare = median(cpu.bare)
  const peer = median(cpu['frl-redis']) - bare
  console.log(`\n${concurrency} request(s) in flight\n`)
  console.log('| configuration | CPU µs/req | added over bare | added / @fastify/rate-limit\'s |')
  console.log('| --- | ---: | ---: | ---: |')
  for (const c of CONFIGS) {
    const m = median(cpu[c])
    const added = m - bare
    console.log(`| ${c} | ${m.toFixed(1)} | ${c === 'bare' ? '' : added.toFixed(1)} | ${c === 'bare' ? '' : (added / peer).toFixed(2)} |`)
  }
}

await Promise.all(Object.values(apps).map((app) => app.close()))
await redis.quit()
await own?.stop()
