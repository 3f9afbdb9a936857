// What one reset costs the servers of a fleet, with few and with many cached
// denials (docs/guides/cluster.md, "Scaling out"): a login limit resets the
// user's bucket on every successful login (docs/guides/login.md), so every
// login sends every app server one message.
//
// Per configuration (a build, and a number of cached denials: SMALL and
// LARGE clients each denied for an hour, so every entry stays live), one
// limiter of this process:
// 1. listens: a child process (another limiter of the same prefix) calls
//    reset() for MESSAGES users that have no cached denial, one at a time,
//    GAP_MS apart, so that each message wakes this process's event loop on
//    its own, as logins spread over time do. This process's CPU (user +
//    system, process.cpuUsage) from the first message to the last, divided by
//    MESSAGES: the wake-up, the socket read, the parse and the cache's work.
// 2. resets: this limiter calls reset() RESETS times, one at a time: CPU
//    per reset on the server that makes it (the Redis call, the PUBLISH and
//    the cache's work).
// Before the cache is filled, MARKS resets of other users reach the limiter
// (more than the 10 000 a limiter remembers), so the measured resets run
// with that memory full, as on a server that has seen many logins.
// Configurations take turns round by round; medians over ROUNDS, with the
// range. A last row measures the harness alone: the same messages on a
// prefix no limiter of this process listens to. Any dist dir given as an argument (an older build) is measured too,
// and compared with this build's.
//
//   npm run build && node bench/reset.mjs [<other dist dir> ...]
//
// Environment: ROUNDS (3), MESSAGES (1000), GAP_MS (2), RESETS (1000),
// SMALL (64), LARGE (10000), MARKS (12000). Runs a redis-server of its own.

import { fork } from 'node:child_process'
import { resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { Redis } from 'ioredis'
import { createLimiter } from 'tollgate'
import { ownRedis } from './redis.mjs'

const env = (name, fallback) => {
  const value = Number(process.env[name] ?? fallback)
  if (!Number.isInteger(value) || value < 0) throw new Error(`${name} must be a whole number >= 0`)
  return value
}
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const HOURLY = { bucket: 'login', capacity: 1, refillPerSecond: 1 / 3600, failureMode: 'open' }

// The child: publishes resets through a limiter of its own, on request.
if (process.argv[2] === '--publisher') {
  const redis = new Redis(process.argv[3])
  const limiters = new Map()
  process.on('message', async ({ prefix, users, from, gapMs, raw }) => {
    if (raw) {
      // Messages only (no bucket to reset): fills the listener's memory of resets, fast.
      await Promise.all(Array.from({ length: users }, (_, i) => redis.publish(`${prefix}:changes`, JSON.stringify({ from: 'bench', reset: [`${prefix}:{m${from + i}}:login`] }))))
    } else {
      if (!limiters.has(prefix)) limiters.set(prefix, createLimiter({ redis, prefix, timeout: 1000 }))
      const limiter = limiters.get(prefix)
      for (let i = 0; i < users; i++) {
        await limiter.reset(`u${from + i}`, HOURLY.bucket)
        if (gapMs > 0) await sleep(gapMs)
      }
    }
    process.send('done')
  })
  process.on('disconnect', async () => {
    for (const limiter of limiters.values()) await limiter.close()
    redis.disconnect()
  })
  process.send('ready')
} else {
  await main()
}

async function main () {
  const ROUNDS = env('ROUNDS', 3)
  const MESSAGES = env('MESSAGES', 1000)
  const GAP_MS = env('GAP_MS', 2)
  const RESETS = env('RESETS', 1000)
  const SIZES = [env('SMALL', 64), env('LARGE', 10_000)]
  const MARKS = env('MARKS', 12_000)

  const own = await ownRedis()
  const { url, connect } = own
  const admin = await connect()
  const publisher = fork(fileURLToPath(import.meta.url), ['--publisher', url], { cwd: new URL('..', import.meta.url) })
  const answered = () => new Promise((resolve) => publisher.once('message', resolve))
  await answered() // ready
  const ask = async (request) => { const done = answered(); publisher.send(request); await done }

  const builds = [{ name: 'this build', create: createLimiter }]
  for (const dir of process.argv.slice(2)) {
    const { createLimiter: other } = await import(pathToFileURL(resolve(dir, 'index.js')).href)
    builds.push({ name: dir, create: other })
  }
  const configs = []
  for (const build of builds) {
    for (const size of SIZES) configs.push({ build: build.name, create: build.create, size, prefix: `r${configs.length}`, listen: [], reset: [], users: 0 })
  }

  for (const config of configs) await prepare(config)
  for (const config of configs) await round(config) // warm-up
  for (const config of configs) { config.listen = []; config.reset = [] }
  for (let r = 0; r < ROUNDS; r++) {
    for (const config of (r % 2 === 0 ? configs : [...configs].reverse())) await round(config)
  }
  for (const config of configs) config.cached = await stillCached(config)
  // The harness alone: the same resets on a prefix no limiter of this process listens to.
  const idle = []
  for (let r = 0; r < ROUNDS; r++) {
    const before = process.cpuUsage()
    await ask({ prefix: 'unheard', users: MESSAGES, from: r * MESSAGES, gapMs: GAP_MS })
    idle.push(cpuUs(before) / MESSAGES)
  }

  report(configs, idle, { MESSAGES, GAP_MS, RESETS, ROUNDS, MARKS })
  publisher.disconnect()
  for (const config of configs) await config.limiter.close()
  await own.stop()

  /** A limiter that has heard MARKS resets, then holds `size` cached denials. */
  async function prepare (config) {
    config.limiter = config.create({ redis: await connect(), prefix: config.prefix, timeout: 1000, denialCache: { maxAgeMs: 3_600_000 } })
    for (let i = 0; i < 200 && (await admin.pubsub('NUMSUB', `${config.prefix}:changes`))[1] < 1; i++) await sleep(10)
    if (MARKS > 0) await ask({ prefix: config.prefix, users: MARKS, from: 0, raw: true })
    await sleep(300) // the last of them on their way to this process
    let next = 0
    await Promise.all(Array.from({ length: 64 }, async () => {
      while (next < config.size) {
        const client = `c${next++}`
        await config.limiter.consume(client, HOURLY) // spends the token
        const denied = await config.limiter.consume(client, HOURLY)
        if (denied.allowed || denied.source !== 'store') throw new Error(`${client}: expected a denial by Redis, got ${JSON.stringify(denied)}`)
      }
    }))
  }

  async function round (config) {
    let before = process.cpuUsage()
    await ask({ prefix: config.prefix, users: MESSAGES, from: config.users, gapMs: GAP_MS })
    config.listen.push(cpuUs(before) / MESSAGES)
    config.users += MESSAGES
    before = process.cpuUsage()
    for (let i = 0; i < RESETS; i++) await config.limiter.reset(`v${config.users + i}`, HOURLY.bucket)
    config.reset.push(cpuUs(before) / RESETS)
    config.users += RESETS
  }
}

function cpuUs (from) {
  const used = process.cpuUsage(from)
  return used.user + used.system
}

/** How many of 64 sampled cached clients are still answered by the cache. */
async function stillCached (config) {
  let cached = 0
  const sample = Math.min(64, config.size)
  for (let i = 0; i < sample; i++) {
    const client = `c${Math.floor(i * config.size / sample)}`
    if ((await config.limiter.consume(client, HOURLY)).source === 'cache') cached++
  }
  return `${cached}/${sample}`
}

function report (configs, idle, { MESSAGES, GAP_MS, RESETS, ROUNDS, MARKS }) {
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
  const spread = (xs) => `${median(xs).toFixed(1)} (${Math.min(...xs).toFixed(1)}-${Math.max(...xs).toFixed(1)})`
  const line = (text) => process.stdout.write(text + '\n')
  line(`Per reset: ${MESSAGES} messages published by another process ${GAP_MS} ms apart, ${RESETS} resets made here; ${MARKS} resets heard before; ${ROUNDS} rounds (medians, range over rounds)`)
  line('| build | cached denials | listening server: CPU µs per message | resetting server: CPU µs per reset | cached after (sample) |')
  line('| --- | ---: | ---: | ---: | ---: |')
  for (const c of configs) line(`| ${c.build} | ${c.size} | ${spread(c.listen)} | ${spread(c.reset)} | ${c.cached} |`)
  line(`| (none listening here: the harness alone) | | ${spread(idle)} | | |`)
  line('')
  const of = (build, size) => configs.find((c) => c.build === build && c.size === size)
  const builds = [...new Set(configs.map((c) => c.build))]
  const [small, large] = [configs[0].size, configs[1].size]
  for (const build of builds) {
    const [s, l] = [of(build, small), of(build, large)]
    line(`${build}: ${large} / ${small} cached denials, per message ${(median(l.listen) / median(s.listen)).toFixed(2)}x, per reset ${(median(l.reset) / median(s.reset)).toFixed(2)}x`)
  }
  for (const build of builds.slice(1)) {
    for (const size of [small, large]) {
      const [now, then] = [of(builds[0], size), of(build, size)]
      line(`${build} / this build, ${size} cached denials: per message ${(median(then.listen) / median(now.listen)).toFixed(2)}x, per reset ${(median(then.reset) / median(now.reset)).toFixed(2)}x`)
    }
  }
}
