// Batched decisions against single calls, without HTTP, on a redis-server
// of its own.
//
// 1. Node CPU per decision (process.cpuUsage, user + system, over a round of
//    CALLS decisions with N in flight, for N = 1, 8, 32, 128), for:
//    - tollgate with its batches (the build given, default dist/),
//    - the same build with `batch: false`: one script call per decision, the
//      previous path,
//    - any other build given (e.g. a pre-batching dist/, built from an older
//      commit), decided with its defaults,
//    - @fastify/rate-limit's Redis store alone (store.incr: its script through
//      ioredis's defineCommand), what its plugin runs per request.
//    The contenders take turns round by round (the order alternating), so a
//    change in the machine's load hits them alike; each figure is the median
//    of the rounds, with their spread (lowest to highest), and its ratio to
//    @fastify/rate-limit's. Redis time per decision (INFO commandstats, usec
//    of EVALSHA and EVAL over the decisions) is read over the same rounds.
// 2. Redis time per decision of the scripts alone, pipelined over 1,000
//    buckets: lua/token-bucket.lua one decision a call, lua/token-bucket-
//    batch.lua 8, 32 and 64 decisions a call, and the design note's script
//    (bench/seed-token-bucket.lua) one a call.
//
//   npm run build && node bench/batch.mjs [dist] [/other/build/dist ...]
//
// Environment: ROUNDS (default 7), CALLS (decisions per round, default
// 20000; 4000 at 1 in flight), LEVELS (default 1,8,32,128), TIMEOUT (the
// limiter's deadline, ms, default 10, as in production: the sources printed
// show whether any decision missed it), BENCH_PIN (off: no CPU pinning,
// see bench/pin.mjs; else this process on one core and Redis on another).
// It runs on the Node that runs it: `npx -y node@22 bench/batch.mjs` for
// Node 22.

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { Redis } from 'ioredis'
import { APP_CPU, LOAD_CPU, describe, pin, pinning } from './pin.mjs'
import { startRedis } from './redis.mjs'
import { commandStats, statsDelta } from './stats.mjs'

const require = createRequire(import.meta.url)
const RateLimitRedisStore = require('@fastify/rate-limit/store/RedisStore.js')

const dirs = process.argv.length > 2 ? process.argv.slice(2) : ['dist']
const ROUNDS = Number(process.env.ROUNDS ?? 7)
const CALLS = Number(process.env.CALLS ?? 20_000)
const LEVELS = (process.env.LEVELS ?? '1,8,32,128').split(',').map(Number)
const TIMEOUT = Number(process.env.TIMEOUT ?? 10)

// Redis inherits the core this process has when it starts it (bench/pin.mjs).
const cpus = pinning()
pin(cpus, process.pid, LOAD_CPU)
const server = await startRedis()
pin(cpus, process.pid, APP_CPU)
const pinned = describe(cpus, 'this process (the decisions, every contender\'s)', 'Redis')
const redis = new Redis({ host: server.host, port: server.port })
const admin = new Redis({ host: server.host, port: server.port })
await redis.ping()
const version = /redis_version:(\S+)/.exec(await admin.info('server'))?.[1] ?? 'unknown'
const policy = { bucket: 'bench', capacity: 1e12, refillPerSecond: 1e6, failureMode: 'open' }

/** Each contender: `decide(n)` resolves once decision number n is made, with its source. */
const contenders = []
for (const [i, dir] of dirs.entries()) {
  const { createLimiter } = await import(pathToFileURL(resolve(dir, 'index.js')).href)
  const add = (label, options) => {
    const limiter = createLimiter({ redis, prefix: `bench-batch-${contenders.length}`, timeout: TIMEOUT, ...options })
    contenders.push({ label, decide: (n) => limiter.consume(`c${n % 64}`, policy).then((d) => d.source) })
  }
  if (i === 0) {
    add(`${dir}, batched (default)`, {})
    add(`${dir}, batch: false (one call per decision)`, { batch: false })
  } else {
    add(`${dir} (its defaults)`, {})
  }
}
const frl = new RateLimitRedisStore(false, false, redis, 'bench-frl-')
contenders.push({
  label: '@fastify/rate-limit Redis store (store.incr)',
  frl: true,
  decide: (n) => new Promise((resolve, reject) => {
    frl.incr(`c${n % 64}`, (err) => { err === null ? resolve('store') : reject(err) }, 60_000, 1e12)
  })
})

async function round (contender, inFlight, calls) {
  let next = 0
  const sources = {}
  const worker = async () => {
    while (next < calls) {
      const source = await contender.decide(next++)
      sources[source] = (sources[source] ?? 0) + 1
    }
  }
  const stats = await commandStats(admin)
  const before = process.cpuUsage()
  await Promise.all(Array.from({ length: inFlight }, worker))
  const used = process.cpuUsage(before)
  const delta = statsDelta(stats, await commandStats(admin))
  return { cpu: (used.user + used.system) / calls, redisUs: delta.scriptUsec / calls, callsPerDecision: delta.scriptCalls / calls, sources }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  const mid = Math.floor(s.length / 2)
  return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2
}
const f = (x, digits = 2) => x.toFixed(digits)

const out = []
out.push(`CPUs: ${pinned}.`, '')
out.push(`Redis ${version}, Node ${process.version}; ${ROUNDS} rounds per level, contenders interleaved; ${CALLS} decisions per round (${Math.min(CALLS, 4000)} at 1 in flight), 64 clients, every decision allowed; deadline ${TIMEOUT} ms.`, '')
out.push('Node CPU µs per decision: median [lowest–highest round], and ratio of the medians to @fastify/rate-limit\'s Redis store. Redis µs per decision: usec of EVALSHA + EVAL in INFO commandstats over the decisions (median); calls: script calls per decision.', '')
out.push('| in flight | contender | Node CPU µs/decision | ratio to @fastify/rate-limit | Redis µs/decision | calls/decision | sources |')
out.push('| ---: | --- | ---: | ---: | ---: | ---: | --- |')
for (const level of LEVELS) {
  const calls = level === 1 ? Math.min(CALLS, 4000) : CALLS
  for (const c of contenders) await round(c, level, Math.min(calls, 2000)) // warm-up: JIT, script load
  const results = contenders.map(() => [])
  for (let r = 0; r < ROUNDS; r++) {
    const order = contenders.map((_, i) => i)
    if (r % 2 === 1) order.reverse()
    for (const i of order) results[i].push(await round(contenders[i], level, calls))
  }
  const frlIndex = contenders.findIndex((c) => c.frl)
  const base = median(results[frlIndex].map((x) => x.cpu))
  contenders.forEach((c, i) => {
    const cpus = results[i].map((x) => x.cpu)
    const sources = {}
    for (const x of results[i]) for (const [k, v] of Object.entries(x.sources)) sources[k] = (sources[k] ?? 0) + v
    out.push(`| ${level} | ${c.label} | ${f(median(cpus))} [${f(Math.min(...cpus))}–${f(Math.max(...cpus))}] | ${f(median(cpus) / base, 3)} | ` +
      `${f(median(results[i].map((x) => x.redisUs)))} | ${f(median(results[i].map((x) => x.callsPerDecision)), 3)} | ${JSON.stringify(sources)} |`)
  })
  process.stderr.write(`level ${level} done\n`)
}

// 2. The scripts alone.
const lua = (name) => readFileSync(new URL(name, import.meta.url), 'utf8')
// EVALSHA of each, loaded first (an EVAL would add hashing the source to every call).
const SINGLE = await admin.script('LOAD', lua('../lua/token-bucket.lua'))
const BATCH = await admin.script('LOAD', lua('../lua/token-bucket-batch.lua'))
const SEED = await admin.script('LOAD', lua('./seed-token-bucket.lua'))
const CAPACITY = 100
const REFILL = 10
const step = 1e6 / REFILL
const keyOf = (i) => `tollgate:{c${i % 1000}}:GET /w`
const scripts = [
  { label: 'lua/token-bucket.lua, one decision a call', per: 1, call: (p, i) => p.evalsha(SINGLE, 1, keyOf(i), '1', CAPACITY * step, step, 1e6 / REFILL) },
  ...[8, 32, 64].map((per) => ({
    label: `lua/token-bucket-batch.lua, ${per} decisions a call`,
    per,
    call: (p, i) => {
      const keys = []
      const args = []
      for (let j = 0; j < per; j++) {
        keys.push(keyOf(i + j))
        args.push('1', 1, j + 1, CAPACITY * step, step, 1e6 / REFILL)
      }
      return p.evalsha(BATCH, keys.length, ...keys, ...args)
    }
  })),
  { label: 'design note script (bench/seed-token-bucket.lua), one decision a call', per: 1, call: (p, i) => p.evalsha(SEED, 1, keyOf(i), CAPACITY, REFILL, 1) }
]
const DECISIONS = 64_000
async function measure (script) {
  await admin.flushdb()
  const pipeline = async () => {
    for (let done = 0; done < DECISIONS; done += 6400) {
      const p = redis.pipeline()
      for (let i = done; i < done + 6400; i += script.per) script.call(p, i)
      for (const [err] of await p.exec()) if (err !== null) throw err
    }
  }
  await pipeline() // every bucket created, the script cached
  const before = await commandStats(admin)
  await pipeline()
  const delta = statsDelta(before, await commandStats(admin))
  return delta.scriptUsec / DECISIONS
}
const times = scripts.map(() => [])
for (let r = 0; r < ROUNDS; r++) {
  for (let i = 0; i < scripts.length; i++) {
    const k = (i + r) % scripts.length
    times[k].push(await measure(scripts[k]))
  }
}
const single = median(times[0])
out.push('', `Redis µs per decision of the scripts alone: ${DECISIONS} pipelined decisions over 1,000 buckets (capacity ${CAPACITY}, ${REFILL}/s, cost 1, all allowed), usec of EVALSHA in INFO commandstats over the decisions, median of ${ROUNDS} rounds [lowest–highest].`, '')
out.push('| script | Redis µs/decision | ratio to lua/token-bucket.lua |', '| --- | ---: | ---: |')
scripts.forEach((s, i) => {
  out.push(`| ${s.label} | ${f(median(times[i]))} [${f(Math.min(...times[i]))}–${f(Math.max(...times[i]))}] | ${f(median(times[i]) / single, 3)} |`)
})
process.stdout.write(out.join('\n') + '\n')
redis.disconnect()
admin.disconnect()
await server.stop()
