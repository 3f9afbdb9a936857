// CPU per decision of the core limiter against a real Redis, for one or
// more builds of tollgate compared in the same process: rounds of
// `limiter.consume` calls (CALLS per round, CONCURRENCY in flight), the
// builds interleaved round by round so that a change in the machine's load
// hits them alike. Reports process.cpuUsage() (user + system) per call, the
// median over the rounds, in µs. The client and Redis are the same for all.
//
//   REDIS_URL=redis://127.0.0.1:6379 node bench/hot-path.mjs dist [/other/checkout/dist ...]
//
// A dir written `<dir>+metrics` is that build with OpenTelemetry metrics on
// (`metrics: { meter }`, a MeterProvider of @opentelemetry/sdk-metrics whose
// reader is never collected during the run), to be compared with `<dir>`.
//
// Environment: ROUNDS (default 8), CALLS (20000), CONCURRENCY (32), TIMEOUT
// (the limiter's deadline, ms, default 10 as in production; the sources
// printed show whether any call missed it).

import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { Redis } from 'ioredis'

const dirs = process.argv.slice(2)
if (dirs.length === 0) {
  process.stderr.write('usage: node bench/hot-path.mjs <dist dir> [<dist dir> ...]\n')
  process.exit(2)
}
const ROUNDS = Number(process.env.ROUNDS ?? 8)
const CALLS = Number(process.env.CALLS ?? 20_000)
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 32)
const TIMEOUT = Number(process.env.TIMEOUT ?? 10)

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
await redis.ping() // connected before the first decision
const policy = { bucket: 'bench', capacity: 1e12, refillPerSecond: 1e6, failureMode: 'open' }

const builds = []
for (const [i, arg] of dirs.entries()) {
  const [dir, withMetrics] = arg.endsWith('+metrics') ? [arg.slice(0, -'+metrics'.length), true] : [arg, false]
  const { createLimiter } = await import(pathToFileURL(resolve(dir, 'index.js')).href)
  const options = { redis, prefix: `bench-hot-${i}`, timeout: TIMEOUT }
  if (withMetrics) options.metrics = { meter: await sdkMeter() } // no `metrics` key otherwise: older builds reject it
  builds.push({ dir: arg, limiter: createLimiter(options), perCall: [], sources: {} })
}

async function sdkMeter () {
  const { MeterProvider, MetricReader } = await import('@opentelemetry/sdk-metrics')
  class Reader extends MetricReader {
    async onShutdown () {}
    async onForceFlush () {}
  }
  return new MeterProvider({ readers: [new Reader()] }).getMeter('bench')
}

async function round (build) {
  let next = 0
  const worker = async () => {
    while (next < CALLS) {
      const n = next++
      const decision = await build.limiter.consume(`c${n % 64}`, policy)
      build.sources[decision.source] = (build.sources[decision.source] ?? 0) + 1
    }
  }
  const before = process.cpuUsage()
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  const used = process.cpuUsage(before)
  return (used.user + used.system) / CALLS
}

for (const build of builds) await round(build) // warm-up: JIT, script load
for (const build of builds) build.sources = {}
for (let r = 0; r < ROUNDS; r++) {
  for (const build of (r % 2 === 0 ? builds : [...builds].reverse())) build.perCall.push(await round(build))
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
for (const build of builds) {
  const all = build.perCall.map((x) => x.toFixed(1)).join(' ')
  process.stdout.write(`${build.dir}: ${median(build.perCall).toFixed(2)} µs CPU per call (median of ${ROUNDS} rounds of ${CALLS}; rounds: ${all}) sources ${JSON.stringify(build.sources)}\n`)
}
redis.disconnect()
