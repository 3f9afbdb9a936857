// Promises and heap bytes per decision, through createLimiter's consume
// (no HTTP), on the in-process store and on Redis (a redis-server of its
// own), with 1 and 32 decisions in flight.
//
// - Promises: an async_hooks hook counts every promise created (type
//   PROMISE) over N decisions, in a pass of its own (the hook itself
//   allocates).
// - Bytes: heapUsed after N decisions minus before, with a young generation
//   large enough that no collection runs in between (checked: a pass that
//   saw a collection is left out, and counted); every allocation on the path is counted,
//   the Redis client's included.
//
//   npm run build && node --expose-gc --min-semi-space-size=128 --max-semi-space-size=128 bench/allocs.mjs [dist] [/other/build/dist ...]
//
// Environment: N (decisions per pass, default 20000), ROUNDS (passes,
// median reported, default 5).

import { createHook } from 'node:async_hooks'
import { PerformanceObserver } from 'node:perf_hooks'
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { Redis } from 'ioredis'
import { startRedis } from './redis.mjs'

if (typeof globalThis.gc !== 'function') throw new Error('run with --expose-gc (and a young generation of 128 MB: see the top)')
const dirs = process.argv.length > 2 ? process.argv.slice(2) : ['dist']
const N = Number(process.env.N ?? 20_000)
const ROUNDS = Number(process.env.ROUNDS ?? 5)
const LEVELS = [1, 32]

const server = await startRedis()
const redis = new Redis({ host: server.host, port: server.port })
await redis.ping()
const policy = { bucket: 'allocs', capacity: 1e12, refillPerSecond: 1e6, failureMode: 'open' }

let promises = 0
const hook = createHook({ init (_id, type) { if (type === 'PROMISE') promises++ } })
let collections = 0
new PerformanceObserver((list) => { collections += list.getEntries().length }).observe({ entryTypes: ['gc'] })

async function pass (limiter, inFlight) {
  let next = 0
  const worker = async () => {
    while (next < N) {
      const d = await limiter.consume(`c${next++ % 64}`, policy)
      if (d.source !== 'store') throw new Error(`a decision from ${d.source}: every one must be the store's`)
    }
  }
  await Promise.all(Array.from({ length: inFlight }, worker))
}

async function measure (limiter, inFlight) {
  await pass(limiter, inFlight) // warm: JIT, scripts
  const bytes = []
  const counts = []
  let noisy = 0
  for (let r = 0; r < ROUNDS; r++) {
    globalThis.gc()
    // The collection's own entry reaches the observer a little later.
    await new Promise((resolve) => setTimeout(resolve, 50))
    const seen = collections
    const before = process.memoryUsage().heapUsed
    await pass(limiter, inFlight)
    const after = process.memoryUsage().heapUsed
    await new Promise((resolve) => setTimeout(resolve, 50))
    if (collections !== seen) noisy++
    else bytes.push((after - before) / N)
    promises = 0
    hook.enable()
    await pass(limiter, inFlight)
    hook.disable()
    counts.push(promises / N)
  }
  return { bytes: median(bytes), promises: median(counts), noisy }
}

function median (xs) {
  if (xs.length === 0) return NaN
  const s = [...xs].sort((a, b) => a - b)
  const mid = Math.floor(s.length / 2)
  return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2
}

const rows = []
for (const dir of dirs) {
  const { createLimiter } = await import(pathToFileURL(resolve(dir, 'index.js')).href)
  const stores = [
    ['in-process', createLimiter({})],
    ['Redis', createLimiter({ redis, prefix: `allocs-${rows.length}`, denialCache: false, timeout: 1000 })]
  ]
  for (const [name, limiter] of stores) {
    for (const level of LEVELS) {
      const m = await measure(limiter, level)
      rows.push(`| ${dir} | ${name} | ${level} | ${m.promises.toFixed(2)} | ${Math.round(m.bytes)} |${m.noisy > 0 ? ` ${m.noisy} pass(es) saw a collection, left out` : ''}`)
    }
    await limiter.close()
  }
}
process.stdout.write([
  `Node ${process.version}; ${N} decisions a pass, median of ${ROUNDS} passes; 64 clients, every decision allowed.`, '',
  '| build | store | in flight | promises/decision | heap bytes/decision |',
  '| --- | --- | ---: | ---: | ---: |',
  ...rows
].join('\n') + '\n')
redis.disconnect()
await server.stop()
