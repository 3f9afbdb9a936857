// tollgate benchmark: the configurations below (Fastify, Express and Hono,
// each bare, with its incumbent limiter on Redis and with tollgate) x the
// workloads, alternating, on one throwaway Redis; prints a markdown report
// and writes bench/RESULTS.md.
//
//   npm run bench              builds dist/ first; every configuration and
//                              workload: about 80 minutes on 2 cores
//   BENCH_CONFIGS=bare,frl-redis,round-trip,tollgate-exact,tollgate-single,express-bare,erl-redis,express-tollgate-exact,express-tollgate-single BENCH_WORKLOADS=W1,W4 npm run bench
//                              exact mode against the incumbents: about 6 minutes a round
//   BENCH_ROUNDS=1 BENCH_SECONDS=1 BENCH_WARMUP=0.5 npm run bench    smoke run
//
// Environment:
//   BENCH_ROUNDS       rounds of every cell, the median is reported (5)
//   BENCH_SECONDS      measured seconds per cell (3)
//   BENCH_WARMUP       warm-up seconds per cell, not measured (3): app servers start fresh for every cell, and at W3's ~475 requests per second per server a shorter warm-up measures the JIT compiling the app's code more than the code itself; W2 and W3 also get one unpaced second from 10,000 clients before it
//   BENCH_LEVELS       W1's requests in flight, one W1 workload each (1,8,32,128):
//                      that many connections, unpaced, so each keeps exactly
//                      that many requests in flight
//   BENCH_W4_RATE      W4's pace over its 4 app servers, req/s (8000)
//   BENCH_CONFIGS      only these configurations, comma-separated ids (all)
//   BENCH_WORKLOADS    only these workloads, e.g. W1,W4 (all; W1 means every level, W1/32 one)
//   BENCH_LUA_CALLS    decisions per script in the script-only measurement (20000)
//   BENCH_CPU_PROF     a directory: app servers CPU-profile each measured window into
//                      <config>-<workload>-r<round>-<server>.cpuprofile there (W1/32 as W1-32)
//                      (see bench/profile.mjs; profiling inflates the CPU figures)
//   BENCH_OUT          where to write the report (bench/RESULTS.md)

import { fork } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { cpus as machineCpus, loadavg } from 'node:os'
import { join, resolve } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import tollgate from 'tollgate'
import { envList, envNumber } from './env.mjs'
import { load } from './load.mjs'
import { APP_CPU, LOAD_CPU, describe, pin, pinning, redisCpu } from './pin.mjs'
import { SCRIPTS, defineScripts, measureScript } from './lua.mjs'
import { startRedis } from './redis.mjs'
import { commandStats, statsDelta } from './stats.mjs'
import { report } from './report.mjs'

const APP = fileURLToPath(new URL('./app.mjs', import.meta.url))


const settings = {
  rounds: Math.round(envNumber('BENCH_ROUNDS', 5)),
  seconds: envNumber('BENCH_SECONDS', 3),
  warmup: process.env.BENCH_WARMUP === '0' ? 0 : envNumber('BENCH_WARMUP', 3),
  levels: (envList('BENCH_LEVELS') ?? ['1', '8', '32', '128']).map((text) => {
    const n = Number(text)
    if (!Number.isInteger(n) || n < 1) throw new Error(`BENCH_LEVELS must list integers >= 1, got ${JSON.stringify(text)}`)
    return n
  }),
  w4Rate: Math.round(envNumber('BENCH_W4_RATE', 8000)),
  luaCalls: Math.round(envNumber('BENCH_LUA_CALLS', 20_000)),
  profileDir: process.env.BENCH_CPU_PROF ? resolve(process.env.BENCH_CPU_PROF) : undefined,
  out: process.env.BENCH_OUT || fileURLToPath(new URL('./RESULTS.md', import.meta.url))
}

/** How long to let in-flight requests finish after autocannon stops. */
const SETTLE_MS = 100
/** tollgate's deadline here: every measured decision must come from Redis, even on a saturated 2-core box. */
const TOLLGATE_TIMEOUT_MS = 1000
/** @fastify/rate-limit's in-process LRU, large enough to keep every W1 client (its default is 5000). */
const FRL_LOCAL_CACHE = 20_000

const CONFIGS = [
  { id: 'bare', label: 'bare Fastify' },
  { id: 'frl-local', label: '@fastify/rate-limit, in-process store' },
  { id: 'frl-redis', label: '@fastify/rate-limit, Redis store' },
  { id: 'round-trip', label: 'bare Fastify plus one Redis round trip per request, and nothing else (a hook awaiting EVALSHA of `return 1`): the floor of any limiter that asks Redis on every request' },
  { id: 'round-trip-slow', label: 'round-trip, its script spinning in Redis for about 4 µs more (1 000 turns of an empty Lua loop): the same app code, so what it adds to the app\'s CPU per request is the machine\'s (the app waits, and so sleeps, longer; bench/wake.mjs)' },
  { id: 'tollgate-exact', label: 'tollgate, exact (a decision sent at once when no call is out; those asked while one is, in one script call)' },
  { id: 'tollgate-single', label: 'tollgate, exact with `batch: false` (a script call per request, as before batching)' },
  { id: 'tollgate-cached', label: 'tollgate, local caches (denial cache; leases on W2 and W3)' },
  { id: 'express-bare', label: 'bare Express 5' },
  { id: 'erl-redis', label: 'express-rate-limit with rate-limit-redis, on Express 5' },
  { id: 'express-tollgate-exact', label: 'tollgate/express, exact (batched as tollgate-exact), on Express 5' },
  { id: 'express-tollgate-single', label: 'tollgate/express, exact with `batch: false`, on Express 5' },
  { id: 'express-tollgate-cached', label: 'tollgate/express, local caches (as tollgate-cached), on Express 5' },
  { id: 'hono-bare', label: 'bare Hono 4 on @hono/node-server' },
  { id: 'hrl-redis', label: 'hono-rate-limiter with its Redis store, on Hono 4' },
  { id: 'hono-tollgate-exact', label: 'tollgate/hono, exact (batched as tollgate-exact), on Hono 4' }
].filter((c) => envList('BENCH_CONFIGS')?.includes(c.id) ?? true)

/** W1, 10,000 clients each under its limit, at every level of requests in flight. */
const W1 = settings.levels.map((level) => ({
  id: `W1/${level}`,
  family: 'W1',
  level,
  label: `10,000 clients cycling, each under its limit, ${level} request(s) in flight`,
  servers: 1,
  policy: { capacity: 100, refillPerSecond: 10 },
  clients: 10_000,
  // Unpaced: each connection sends its next request when the last is
  // answered, so exactly `level` requests are in flight, and the CPU
  // figures come from that window, at the rate each configuration reaches.
  connections: level,
  underLimit: true
}))

const WORKLOADS = [
  ...W1,
  {
    id: 'W2',
    label: 'one client flooding at 20x its limit',
    servers: 1,
    policy: { capacity: 100, refillPerSecond: 100 },
    rate: 2000, // 20 x refillPerSecond
    client: 'flood',
    connections: 20,
    lease: { tokens: 20, maxAgeMs: 1000 }
  },
  {
    id: 'W3',
    label: 'one hot client at 95% of its limit over 4 app servers',
    servers: 4,
    policy: { capacity: 2000, refillPerSecond: 2000 },
    rate: 1900, // over all 4 servers
    client: 'hot',
    connections: 8,
    underLimit: true,
    lease: { tokens: 50, maxAgeMs: 500 },
    // Under its limit no limiter can over-admit, so W3 ends with a second
    // client flooding a tight limit on the same 4 servers (same pace, leases
    // as above): there, a fleet that spent more than its bucket would show.
    probe: { policy: { capacity: 100, refillPerSecond: 200 }, client: 'over', seconds: 1 }
  },
  {
    id: 'W4',
    label: '10,000 clients, each under its limit, over 4 app servers sharing a steady load',
    servers: 4,
    policy: { capacity: 100, refillPerSecond: 10 },
    clients: 10_000,
    rate: settings.w4Rate,
    connections: 32,
    underLimit: true
  }
].filter((w) => envList('BENCH_WORKLOADS')?.some((id) => id === w.id || id === w.family) ?? true)

// ------------------------------------------------------------------ processes

const children = new Set()
let redisServer
let admin
/** CPU pinning (bench/pin.mjs): app servers on one core, this process (the load generator) on another, Redis on a third or with it. */
const cpus = pinning()

function killEverythingSync () {
  for (const child of children) child.kill('SIGKILL')
  children.clear()
  redisServer?.stopSync()
}
process.on('exit', killEverythingSync)
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(signal, () => {
    process.stderr.write(`\n${signal}: stopping app servers and Redis\n`)
    killEverythingSync()
    process.exit(130)
  })
}

/** Forks one app server and resolves once it listens. */
async function startApp (spec) {
  const child = fork(APP, [], {
    env: { ...process.env, BENCH_APP: JSON.stringify(spec) },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  children.add(child)
  pin(cpus, child.pid, APP_CPU)
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => {
    children.delete(child)
    resolve(signal ?? code)
  }))
  const reply = (type) => Promise.race([
    new Promise((resolve) => {
      const listener = (message) => {
        if (message.type !== type) return
        child.off('message', listener)
        resolve(message)
      }
      child.on('message', listener)
    }),
    exited.then((how) => { throw new Error(`app server (${spec.config}) exited (${how}) while waiting for '${type}'`) })
  ])
  const { port } = await reply('ready')
  return {
    port,
    async ask (type, answer) {
      const answered = reply(answer)
      child.send({ type })
      return await answered
    },
    async stop () {
      if (!children.has(child)) return
      child.send({ type: 'exit' })
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000)
      await exited
      clearTimeout(timer)
    }
  }
}

// ------------------------------------------------------------------ features

/**
 * Whether this build of tollgate knows an option: registration with it
 * either works or fails with TOLLGATE_INVALID_OPTION naming it as unknown.
 * Any other failure is a real error and ends the run.
 */
async function supports (name, pluginExtra, policyExtra) {
  const app = Fastify({ logger: false })
  try {
    await app.register(tollgate, { redis: admin, failureMode: 'open', ...pluginExtra })
    app.get('/', { config: { rateLimit: { capacity: 100, refillPerSecond: 100, ...policyExtra } } }, async () => 'ok')
    await app.ready()
    return true
  } catch (err) {
    if (err?.code === 'TOLLGATE_INVALID_OPTION' && new RegExp(`unknown option \`[^\`]*${name}\``).test(err.message)) return false
    throw err
  } finally {
    await app.close().catch(() => {})
  }
}

// ------------------------------------------------------------------ cells

/** What the app servers of one cell get, or a reason the cell cannot run with this build. */
function appSpec (config, workload, features) {
  const spec = {
    config: config.id,
    policy: workload.policy,
    redisPort: redisServer.port,
    timeout: TOLLGATE_TIMEOUT_MS,
    localCache: FRL_LOCAL_CACHE,
    pluginExtra: {},
    policyExtra: {},
    probePolicy: workload.probe?.policy
  }
  if (config.id.endsWith('tollgate-exact') && features.denialCache) spec.pluginExtra = { denialCache: false }
  if (config.id.endsWith('tollgate-single')) {
    if (!features.batch) return { unavailable: 'this build has no `batch` option' }
    spec.pluginExtra = { denialCache: false, batch: false }
  }
  if (config.id.endsWith('tollgate-cached')) {
    if (!features.denialCache) return { unavailable: 'this build has no `denialCache` option' }
    if (workload.lease !== undefined) {
      if (!features.lease) return { unavailable: 'this build has no `lease` option' }
      spec.policyExtra = { lease: workload.lease }
    }
  }
  return spec
}

function loadShape (workload, seconds, client, rate = workload.rate) {
  return {
    seconds,
    connections: workload.connections,
    rate: rate === undefined ? undefined : Math.round(rate / workload.servers),
    clients: workload.clients,
    client: workload.clients === undefined ? client : undefined
  }
}

/**
 * One measured window: the app servers' CPU, requests and Redis commands
 * and Redis's commandstats, around `run` (plus time for in-flight requests
 * to finish).
 */
async function measured (apps, run) {
  const before = await commandStats(admin)
  await Promise.all(apps.map((a) => a.ask('start', 'started')))
  const startedAt = epochMs()
  const traffic = await run()
  await sleep(SETTLE_MS)
  const stats = await Promise.all(apps.map((a) => a.ask('stop', 'stats')))
  const redis = statsDelta(before, await commandStats(admin))
  const requests = sum(stats.map((s) => s.requests))
  const sources = {}
  for (const s of stats) for (const [name, n] of Object.entries(s.sources)) sources[name] = (sources[name] ?? 0) + n
  return {
    startedAt,
    traffic,
    cpuUsPerReq: sum(stats.map((s) => s.cpuUs)) / requests,
    callsPerReq: sum(stats.map((s) => s.commands)) / requests,
    statCallsPerReq: redis.calls / requests,
    usPerCall: redis.scriptCalls > 0 ? redis.scriptUsec / redis.scriptCalls : undefined,
    redisUsPerReq: redis.scriptCalls > 0 ? redis.scriptUsec / requests : undefined,
    fallbacks: sum(Object.entries(sources).filter(([name]) => name !== 'store' && name !== 'cache').map(([, n]) => n))
  }
}

async function runCell (config, workload, spec, round) {
  await admin.flushall()
  const client = `${workload.client}-${round}`
  const probeClient = workload.probe === undefined ? undefined : `${workload.probe.client}-${round}`
  const apps = await Promise.all(Array.from({ length: workload.servers }, (_, i) => startApp({
    ...spec,
    trackClients: workload.servers > 1 ? [client, probeClient] : [],
    profileFile: settings.profileDir === undefined ? undefined : join(settings.profileDir, `${config.id}-${workload.id.replace('/', '-')}-r${round}-${i + 1}.cpuprofile`)
  })))
  try {
    const ports = apps.map((a) => a.port)
    const shape = (seconds, id, rate) => ({ ports, ...loadShape(workload, seconds, id, rate) })
    if (settings.warmup > 0) {
      // A paced workload reaches each server a few hundred times a second,
      // too few for the JIT to finish with the app's code in a few seconds:
      // one unpaced second from 10,000 clients, each under its limit, comes
      // first, so every configuration is measured compiled, as on a server
      // that has run for a while.
      if (workload.clients === undefined) {
        await load({ ports, seconds: 1, connections: workload.connections, clients: 10_000 })
        await admin.flushall()
      }
      await load(shape(settings.warmup, `${workload.client}-warm`))
      await sleep(SETTLE_MS)
    }
    let traffic
    let keys
    const window = await measured(apps, async () => {
      traffic = await load(shape(settings.seconds, client))
      keys = await admin.dbsize()
      return traffic
    })
    const cell = {
      rps: traffic.rps,
      p50: traffic.p50,
      p99: traffic.p99,
      okPct: 100 * (traffic.statuses[200] ?? 0) / traffic.responses,
      statuses: traffic.statuses,
      errors: traffic.errors,
      keys,
      cpuUsPerReq: window.cpuUsPerReq,
      callsPerReq: window.callsPerReq,
      statCallsPerReq: window.statCallsPerReq,
      usPerCall: window.usPerCall,
      redisUsPerReq: window.redisUsPerReq,
      fallbacks: window.fallbacks
    }
    if (workload.client !== undefined && workload.servers > 1) cell.admission = await admissions(apps, client, workload.policy, window.startedAt, traffic)
    if (workload.probe !== undefined) {
      const probeStart = epochMs()
      const flood = await load({ ...shape(workload.probe.seconds, probeClient), path: '/probe' })
      await sleep(SETTLE_MS)
      cell.probe = await admissions(apps, probeClient, workload.probe.policy, probeStart, flood)
    }
    return cell
  } finally {
    await Promise.all(apps.map((a) => a.stop()))
  }
}

function epochMs () {
  return performance.timeOrigin + performance.now()
}

/**
 * What the app servers admitted for one client since `startedAt`, against
 * the most its bucket allows: capacity + refill x (time of the last
 * admitted request - startedAt). The client is new at `startedAt`, so its
 * bucket is full then.
 */
async function admissions (apps, client, policy, startedAt, traffic) {
  const counts = await Promise.all(apps.map((a) => a.ask('counts', 'counts')))
  const mine = counts.map((c) => c.tracked[client])
  const allowed = sum(mine.map((c) => c.allowed))
  const last = Math.max(...mine.map((c) => c.lastAt))
  const elapsedS = allowed === 0 ? 0 : Math.max(0, last - startedAt) / 1000
  const bound = policy.capacity + policy.refillPerSecond * elapsedS
  return { allowed, bound, over: Math.max(0, allowed - Math.floor(bound)), denied: traffic.statuses[429] ?? 0, responses: traffic.responses }
}

function sum (values) {
  return values.reduce((a, b) => a + b, 0)
}

// ------------------------------------------------------------------ main

async function main () {
  const started = Date.now()
  const loadStart = loadavg()[0]
  if (settings.profileDir !== undefined) mkdirSync(settings.profileDir, { recursive: true })
  // Before Redis starts: it inherits this process's core, then gets its own where there is one.
  pin(cpus, process.pid, LOAD_CPU)
  const pinned = describe(cpus, 'the app server(s)', 'the load generator (this process)', 'Redis')
  process.stderr.write(`CPUs: ${pinned}; Node ${process.version}\n`)
  redisServer = await startRedis()
  pin(cpus, redisServer.pid, redisCpu())
  admin = new Redis({ host: redisServer.host, port: redisServer.port })
  const redisVersion = /redis_version:(\S+)/.exec(await admin.info('server'))?.[1] ?? 'unknown'

  const features = {
    denialCache: await supports('denialCache', { denialCache: false }, {}),
    lease: await supports('lease', {}, { lease: { tokens: 10, maxAgeMs: 100 } }),
    batch: await supports('batch', { batch: false }, {})
  }
  process.stderr.write(`tollgate options: denialCache ${features.denialCache ? 'yes' : 'no'}, lease ${features.lease ? 'yes' : 'no'}\n`)

  // Every cell of every round: { [workload]: { [config]: cell[] | { unavailable } } }
  const results = {}
  const lua = Object.fromEntries(SCRIPTS.map((s) => [s.name, []]))
  const scripts = defineScripts(admin)
  for (let round = 1; round <= settings.rounds; round++) {
    for (const script of SCRIPTS) {
      lua[script.name].push(await measureScript(admin, scripts[script.name], { calls: settings.luaCalls, keys: 1000 }))
    }
    for (const workload of WORKLOADS) {
      results[workload.id] ??= {}
      // A different configuration goes first in each round, so none always runs on a cold machine.
      const order = CONFIGS.map((_, i) => CONFIGS[(i + round - 1) % CONFIGS.length])
      for (const config of order) {
        const spec = appSpec(config, workload, features)
        if (spec.unavailable !== undefined) {
          results[workload.id][config.id] = { unavailable: spec.unavailable }
          continue
        }
        const cell = await runCell(config, workload, spec, round)
        ;(results[workload.id][config.id] ??= []).push(cell)
        process.stderr.write(`[round ${round}/${settings.rounds}] ${workload.id} ${config.id}: ` +
          `${Math.round(cell.rps)} req/s, p99 ${cell.p99.toFixed(2)} ms, ${cell.cpuUsPerReq.toFixed(1)} CPU us/req, ` +
          `${cell.callsPerReq.toFixed(3)} Redis calls/req\n`)
      }
    }
  }

  const text = report({
    settings,
    configs: CONFIGS,
    workloads: WORKLOADS,
    results,
    lua,
    scripts: SCRIPTS,
    features,
    machine: {
      // The machine's, not this process's: it is pinned to one of them (bench/pin.mjs).
      nproc: machineCpus().length,
      cpu: /model name\s*:\s*(.+)/.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? 'unknown',
      node: process.version,
      redis: redisVersion,
      loadStart,
      loadEnd: loadavg()[0],
      pinned
    },
    date: new Date().toISOString(),
    command: commandLine(),
    minutes: (Date.now() - started) / 60_000,
    tollgateTimeoutMs: TOLLGATE_TIMEOUT_MS,
    frlLocalCache: FRL_LOCAL_CACHE
  })
  process.stdout.write(text)
  writeFileSync(settings.out, text)
  process.stderr.write(`written to ${settings.out}; the run took ${((Date.now() - started) / 60_000).toFixed(1)} min\n`)
}

function commandLine () {
  const vars = Object.entries(process.env)
    .filter(([name]) => name.startsWith('BENCH_') && name !== 'BENCH_APP')
    .map(([name, value]) => `${name}=${value}`)
    .sort()
  const event = process.env.npm_lifecycle_event
  const run = event?.startsWith('bench') === true ? `npm run ${event}` : `node ${process.argv[1]?.endsWith('headline.mjs') ? 'bench/headline.mjs' : 'bench/run.mjs'}`
  return [...vars, run].join(' ')
}

try {
  await main()
} catch (err) {
  process.stderr.write(`bench failed: ${err?.stack ?? err}\n`)
  process.exitCode = 1
} finally {
  for (const child of children) child.kill('SIGKILL')
  await admin?.quit().catch(() => {})
  await redisServer?.stop()
}
