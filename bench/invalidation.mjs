// What it costs to keep process-local caches honest across a fleet (docs/guides/cluster.md,
// "Scaling out"), measured in one run so the figures can be compared
// as ratios:
//
// 1. A flood of denied requests. CLIENTS clients, each denied for an hour
//    (capacity 1, refill 1/3600 s, spent), call `consume` as fast as
//    CONCURRENCY callers allow, for ROUND_MS per configuration; the
//    configurations take turns round by round, so a change in the
//    machine's load hits them alike. Per configuration: process CPU (user +
//    system) per decision, the median over rounds, and the Redis calls per
//    second per flooding client (EVALSHA counted by INFO commandstats).
//    - exact: `denialCache: false`, every decision a script call;
//    - whole wait: the cache trusting a denial for the whole wait Redis
//      named (maxAgeMs one hour), the subscriber on: what the cache cost
//      before it had a cap;
//    - maxAgeMs 1000 (the default) and 100: the cap, the subscriber on;
//    - any dist dir given as an argument (an older build, say): its default.
// 2. A change. Per refund settled (reserve, then settle at 0; CONCURRENCY
//    at a time): CPU and Redis calls, against a charge (settle above the
//    reservation: the same settle call, no message), so the ratio is what
//    publishing costs the server that refunds.
// 3. The fan-out. A child process publishes MESSAGES refunds of random keys
//    while LISTENERS limiters of this process listen: this process's CPU per
//    message per listener, and Redis's CPU per PUBLISH with LISTENERS
//    subscribers against one.
//
//   npm run build && node bench/invalidation.mjs [<other dist dir> ...]
//
// Environment: ROUNDS (3), ROUND_MS (3000), CLIENTS (64), CONCURRENCY (32),
// SETTLES (3000), MESSAGES (20000), LISTENERS (8). Runs a redis-server of
// its own, so INFO counts only this benchmark's calls.

import { spawn } from 'node:child_process'
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { createLimiter } from 'tollgate'
import { ownRedis } from './redis.mjs'
import { commandStats, redisCpuUs } from './stats.mjs'

const env = (name, fallback) => {
  const value = Number(process.env[name] ?? fallback)
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a whole number >= 1`)
  return value
}
const ROUNDS = env('ROUNDS', 3)
const ROUND_MS = env('ROUND_MS', 3000)
const CLIENTS = env('CLIENTS', 64)
const CONCURRENCY = env('CONCURRENCY', 32)
const SETTLES = env('SETTLES', 3000)
const MESSAGES = env('MESSAGES', 20000)
const LISTENERS = env('LISTENERS', 8)

const own = await ownRedis()
const { url, connect } = own
const admin = await connect()
const limiters = []
const limiterOf = (create, options) => {
  const limiter = create({ timeout: 1000, ...options })
  limiters.push(limiter)
  return limiter
}
const evalshaCalls = async () => (await commandStats(admin)).get('evalsha')?.calls ?? 0
const cpuUs = (from) => { const used = process.cpuUsage(from); return used.user + used.system }
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
/** The median, and the range over rounds. */
const spread = (xs, digits) => `${median(xs).toFixed(digits)} (${Math.min(...xs).toFixed(digits)}-${Math.max(...xs).toFixed(digits)})`
const ratio = (a, b) => (b === 0 ? 'n/a' : `${(a / b).toFixed(b < 1e-3 ? 0 : 3)}`)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// 1. The flood.
const HOURLY = { bucket: 'flood', capacity: 1, refillPerSecond: 1 / 3600, failureMode: 'open' }
const configs = [
  { name: 'exact (denialCache: false)', options: { denialCache: false } },
  { name: 'whole wait (maxAgeMs 1 h)', options: { denialCache: { maxAgeMs: 3_600_000 } } },
  { name: 'maxAgeMs 1000 (default)', options: {} },
  { name: 'maxAgeMs 100', options: { denialCache: { maxAgeMs: 100 } } }
]
for (const dir of process.argv.slice(2)) {
  const { createLimiter: other } = await import(pathToFileURL(resolve(dir, 'index.js')).href)
  configs.push({ name: `${dir} (its default)`, options: {}, create: other })
}
for (const [i, config] of configs.entries()) {
  config.limiter = limiterOf(config.create ?? createLimiter, { redis: await connect(), prefix: `flood${i}`, ...config.options })
  config.cpu = []
  config.calls = []
  config.sources = {}
  for (let c = 0; c < CLIENTS; c++) await config.limiter.consume(`c${c}`, HOURLY) // spends each client's token
}

async function flood (config) {
  const end = performance.now() + ROUND_MS
  let decisions = 0
  const worker = async () => {
    while (performance.now() < end) {
      const decision = await config.limiter.consume(`c${decisions++ % CLIENTS}`, HOURLY)
      config.sources[decision.source] = (config.sources[decision.source] ?? 0) + 1
      // A cached denial resolves without I/O: let the loop read its sockets.
      if (decisions % 64 === 0) await new Promise((resolve) => setImmediate(resolve))
    }
  }
  const calls = await evalshaCalls()
  const started = performance.now()
  const before = process.cpuUsage()
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  const used = cpuUs(before)
  const seconds = (performance.now() - started) / 1000
  config.cpu.push(used / decisions)
  config.calls.push((await evalshaCalls() - calls) / seconds / CLIENTS)
}

for (const config of configs) await flood(config) // warm-up
for (const config of configs) { config.cpu = []; config.calls = []; config.sources = {} }
for (let r = 0; r < ROUNDS; r++) {
  for (const config of (r % 2 === 0 ? configs : [...configs].reverse())) await flood(config)
}

// 2. A refund against a charge, on one limiter.
const settling = limiterOf(createLimiter, { redis: await connect(), prefix: 'settle' })
const WIDE = { bucket: 'settle', capacity: 1e9, refillPerSecond: 1e6, failureMode: 'open' }
async function settleRound (actual) {
  const stats = await commandStats(admin)
  const before = process.cpuUsage()
  let next = 0
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < SETTLES) {
      const reservation = await settling.reserve(`s${next++ % CLIENTS}`, WIDE, 2)
      await settling.settle(reservation, actual)
    }
  }))
  const used = cpuUs(before)
  const after = await commandStats(admin)
  const count = (name) => ((after.get(name)?.calls ?? 0) - (stats.get(name)?.calls ?? 0)) / SETTLES
  return { cpu: used / SETTLES, scripts: count('evalsha'), publishes: count('publish') }
}
await settleRound(0)
await settleRound(3)
const refunds = []
const charges = []
for (let r = 0; r < ROUNDS; r++) {
  refunds.push(await settleRound(0))
  charges.push(await settleRound(3))
}

// 3. The fan-out of MESSAGES refunds to LISTENERS limiters, and to one.
async function fanOut (listeners) {
  const prefix = `fan${listeners}`
  const listening = []
  for (let i = 0; i < listeners; i++) listening.push(limiterOf(createLimiter, { redis: await connect(), prefix }))
  for (let i = 0; i < 200; i++) {
    const subscribed = (await admin.pubsub('NUMSUB', `${prefix}:changes`))[1]
    if (subscribed >= listeners) break
    await sleep(10)
  }
  const redisBefore = await redisCpuUs(admin)
  const before = process.cpuUsage()
  const publisher = spawn(process.execPath, ['--input-type=module', '-e', `
    import { Redis } from 'ioredis'
    const redis = new Redis(${JSON.stringify(url)})
    const pipeline = []
    for (let i = 0; i < ${MESSAGES}; i++) pipeline.push(redis.publish('${prefix}:changes', JSON.stringify({ from: 'bench', refund: ['${prefix}:{' + (i % 1000) + '}:b'] })))
    await Promise.all(pipeline)
    redis.disconnect()
  `], { stdio: 'inherit', cwd: new URL('..', import.meta.url) })
  await new Promise((resolve) => publisher.once('exit', resolve))
  await sleep(200) // the last messages on their way to this process
  const used = cpuUs(before)
  const redisUsed = await redisCpuUs(admin) - redisBefore
  for (const limiter of listening) await limiter.close()
  return { perMessagePerListener: used / MESSAGES / listeners, redisPerPublish: redisUsed / MESSAGES }
}
const one = await fanOut(1)
const many = await fanOut(LISTENERS)

// Report.
const exact = configs[0]
const rows = configs.map((c) => ({ name: c.name, cpu: median(c.cpu), calls: median(c.calls), cpus: c.cpu, callss: c.calls, sources: c.sources }))
const line = (text) => process.stdout.write(text + '\n')
line(`Flood: ${CLIENTS} clients denied for an hour, ${CONCURRENCY} callers, ${ROUNDS} rounds of ${ROUND_MS} ms per configuration (medians, range over rounds)`)
line('| configuration | CPU µs/decision | ratio to exact | Redis calls/s per flooding client | ratio to exact | sources |')
line('| --- | ---: | ---: | ---: | ---: | --- |')
for (const row of rows) {
  line(`| ${row.name} | ${spread(row.cpus, 2)} | ${ratio(row.cpu, median(exact.cpu))} | ${spread(row.callss, 2)} | ${ratio(row.calls, median(exact.calls))} | ${JSON.stringify(row.sources)} |`)
}
line('')
const med = (list, field) => median(list.map((x) => x[field]))
line(`Changes: ${SETTLES} settlements per round, ${CONCURRENCY} at a time, ${ROUNDS} rounds (medians)`)
line('| settlement | CPU µs | script calls | PUBLISH calls |')
line('| --- | ---: | ---: | ---: |')
line(`| refund (reserve 2, settle 0) | ${med(refunds, 'cpu').toFixed(1)} | ${med(refunds, 'scripts').toFixed(2)} | ${med(refunds, 'publishes').toFixed(2)} |`)
line(`| charge (reserve 2, settle 3) | ${med(charges, 'cpu').toFixed(1)} | ${med(charges, 'scripts').toFixed(2)} | ${med(charges, 'publishes').toFixed(2)} |`)
line(`refund / charge CPU: ${ratio(med(refunds, 'cpu'), med(charges, 'cpu'))}`)
line('')
line(`Fan-out: ${MESSAGES} refund messages published by another process`)
line('| listeners | this process µs per message per listener | Redis µs per PUBLISH |')
line('| ---: | ---: | ---: |')
line(`| 1 | ${one.perMessagePerListener.toFixed(2)} | ${one.redisPerPublish.toFixed(2)} |`)
line(`| ${LISTENERS} | ${many.perMessagePerListener.toFixed(2)} | ${many.redisPerPublish.toFixed(2)} |`)
line(`Redis per PUBLISH, ${LISTENERS} listeners / 1: ${ratio(many.redisPerPublish, one.redisPerPublish)}`)

for (const limiter of limiters) await limiter.close()
await own.stop()
