// Nest benchmark: on each of Nest's platforms (Express, Fastify), bare Nest,
// Nest with @nestjs/throttler on Redis (@nest-lab/throttler-storage-redis)
// and Nest with tollgate/nest exact, under one workload: 10,000 clients
// cycling, each under its limit (100 a 10 s window for the throttler, a
// bucket of 100 at 10/s for tollgate), BENCH_CONNECTIONS requests in
// flight, unpaced. Every cell runs in a fresh app server process of its
// own, so its CPU time is its own; the configurations alternate within a
// round, and the median of the rounds is reported: Node CPU per request
// added over bare Nest, tollgate's against the throttler's as a ratio, and
// Redis commands per request (counted in the app server, scripts included).
//
//   npm run build && node bench/nest.mjs                      the full run (5 rounds of 5 s)
//   BENCH_ROUNDS=1 BENCH_SECONDS=1 BENCH_WARMUP=0.5 node bench/nest.mjs    a smoke run
//
// Environment:
//   BENCH_ROUNDS       rounds of every cell, the median is reported (5)
//   BENCH_SECONDS      measured seconds per cell (5)
//   BENCH_WARMUP       warm-up seconds per cell, not measured (3)
//   BENCH_CONNECTIONS  requests in flight (32)
//   BENCH_PLATFORMS    express,fastify (both)
//
// It prints how long the run took, and how long the full run (the defaults)
// takes on this machine at the same cost per cell.

import { fork } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { envList, envNumber } from './env.mjs'
import { load } from './load.mjs'
import { startRedis } from './redis.mjs'

const SELF = fileURLToPath(import.meta.url)
const CONFIGS = ['bare', 'throttler', 'tollgate']
const CLIENTS = 10_000
const FULL = { rounds: 5, seconds: 5, warmup: 3 }

if (process.env.BENCH_NEST_APP !== undefined) await serve(JSON.parse(process.env.BENCH_NEST_APP))
else await main()

// ------------------------------------------------------------ the app server

/** One Nest app of `config` on `platform`; answers 'start', 'stop' (with its CPU, requests and Redis commands) and 'exit' over IPC. */
async function serve ({ platform, config, redisPort }) {
  await import('reflect-metadata')
  const { Controller, Get, Module } = await import('@nestjs/common')
  const { APP_GUARD, NestFactory } = await import('@nestjs/core')
  const { Redis } = await import('ioredis')
  let commands = 0
  let redis
  if (config !== 'bare') {
    redis = new Redis({ host: '127.0.0.1', port: redisPort })
    const send = redis.sendCommand
    redis.sendCommand = function counted (...args) {
      commands++
      return send.apply(this, args)
    }
  }
  const client = (req) => String(req.headers['x-client-id'] ?? 'anonymous')
  const imports = []
  const providers = []
  if (config === 'throttler') {
    const { ThrottlerGuard, ThrottlerModule } = await import('@nestjs/throttler')
    const { ThrottlerStorageRedisService } = await import('@nest-lab/throttler-storage-redis')
    imports.push(ThrottlerModule.forRoot({ throttlers: [{ ttl: 10_000, limit: 100 }], storage: new ThrottlerStorageRedisService(redis), getTracker: client }))
    providers.push({ provide: APP_GUARD, useClass: ThrottlerGuard })
  }
  if (config === 'tollgate') {
    const { TollgateModule } = await import('tollgate/nest')
    imports.push(TollgateModule.forRoot({ redis, capacity: 100, refillPerSecond: 10, failureMode: 'open', timeout: 1000, key: client, logger: { warn () {}, info () {}, error () {} } }))
  }
  class W { w () { return { ok: true } } }
  Get('w')(W.prototype, 'w', Object.getOwnPropertyDescriptor(W.prototype, 'w'))
  Controller()(W)
  class App {}
  Module({ imports, providers, controllers: [W] })(App)
  const app = platform === 'fastify'
    ? await NestFactory.create(App, new (await import('@nestjs/platform-fastify')).FastifyAdapter(), { logger: false })
    : await NestFactory.create(App, { logger: false })
  await app.listen(0, '127.0.0.1')
  let requests = 0
  app.getHttpServer().on('request', () => { requests++ })
  let window
  process.on('message', async (message) => {
    if (message === 'start') {
      window = { cpu: process.cpuUsage(), requests, commands }
      process.send('started')
    } else if (message === 'stop') {
      const cpu = process.cpuUsage(window.cpu)
      process.send({ cpuUs: cpu.user + cpu.system, requests: requests - window.requests, commands: commands - window.commands })
    } else if (message === 'exit') {
      await app.close()
      redis?.disconnect()
      process.exit(0)
    }
  })
  process.on('disconnect', () => process.exit(0))
  process.send({ port: app.getHttpServer().address().port })
}

// ------------------------------------------------------------ the run

/** Forks an app server; resolves with its port and how to talk to it. */
async function start (spec) {
  const child = fork(SELF, [], { env: { ...process.env, BENCH_NEST_APP: JSON.stringify(spec) }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const next = () => new Promise((resolve, reject) => {
    child.once('message', resolve)
    child.once('exit', (code) => reject(new Error(`app server ${spec.platform}/${spec.config} exited (${code})`)))
  })
  const { port } = await next()
  return {
    port,
    ask: async (message) => { const answer = next(); child.send(message); return await answer },
    exit: async () => { const gone = new Promise((resolve) => child.once('exit', resolve)); child.send('exit'); await gone }
  }
}

/** One cell: a fresh app server, warmed up, then one measured window. */
async function cell (platform, config, redisPort, settings) {
  const app = await start({ platform, config, redisPort })
  try {
    const shape = { ports: [app.port], connections: settings.connections, clients: CLIENTS }
    if (settings.warmup > 0) await load({ ...shape, seconds: settings.warmup })
    await app.ask('start')
    const run = await load({ ...shape, seconds: settings.seconds })
    const window = await app.ask('stop')
    const statuses = Object.entries(run.statuses).map(([s, n]) => `${s}: ${n}`).join(', ')
    if (Object.keys(run.statuses).some((s) => s !== '200')) throw new Error(`${platform}/${config}: not every request passed (${statuses}): the workload keeps each client under its limit`)
    return { cpuPerRequest: window.cpuUs / window.requests, commandsPerRequest: window.commands / window.requests, rps: run.rps }
  } finally {
    await app.exit()
  }
}

function median (values) {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2
}

async function main () {
  const settings = {
    rounds: Math.round(envNumber('BENCH_ROUNDS', FULL.rounds)),
    seconds: envNumber('BENCH_SECONDS', FULL.seconds),
    warmup: process.env.BENCH_WARMUP === '0' ? 0 : envNumber('BENCH_WARMUP', FULL.warmup),
    connections: Math.round(envNumber('BENCH_CONNECTIONS', 32))
  }
  const platforms = envList('BENCH_PLATFORMS') ?? ['express', 'fastify']
  const started = performance.now()
  const redis = await startRedis()
  const cells = new Map()
  try {
    for (let round = 1; round <= settings.rounds; round++) {
      for (const platform of platforms) {
        for (const config of CONFIGS) {
          const result = await cell(platform, config, redis.port, settings)
          const key = `${platform}/${config}`
          cells.set(key, [...cells.get(key) ?? [], result])
          console.error(`round ${round}, ${key}: ${result.cpuPerRequest.toFixed(1)} µs CPU a request, ${result.commandsPerRequest.toFixed(3)} Redis commands a request, ${Math.round(result.rps)} req/s`)
        }
      }
    }
  } finally {
    await redis.stop()
  }
  const seconds = (performance.now() - started) / 1000
  print(platforms, cells, settings, seconds)
}

function print (platforms, cells, settings, seconds) {
  const of = (key, field) => median(cells.get(key).map((c) => c[field]))
  console.log(`\nNest 12, ${CLIENTS} clients under their limits, ${settings.connections} requests in flight; medians of ${settings.rounds} round(s) of ${settings.seconds} s (warm-up ${settings.warmup} s)\n`)
  console.log('| platform | bare Nest, µs CPU a request | added by @nestjs/throttler + Redis storage | added by tollgate/nest exact | tollgate / throttler | Redis commands a request, throttler | tollgate |')
  console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: |')
  for (const platform of platforms) {
    const bare = of(`${platform}/bare`, 'cpuPerRequest')
    const throttler = of(`${platform}/throttler`, 'cpuPerRequest') - bare
    const tollgate = of(`${platform}/tollgate`, 'cpuPerRequest') - bare
    const calls = (config) => of(`${platform}/${config}`, 'commandsPerRequest').toFixed(3)
    console.log(`| ${platform} | ${bare.toFixed(1)} | ${throttler.toFixed(1)} µs | ${tollgate.toFixed(1)} µs | ${(tollgate / throttler).toFixed(2)}× | ${calls('throttler')} | ${calls('tollgate')} |`)
  }
  // A cell costs its load (warm-up and window) plus a fixed start and stop of its app server.
  const perCell = seconds / (settings.rounds * platforms.length * CONFIGS.length)
  const overhead = Math.max(0, perCell - settings.seconds - settings.warmup)
  const full = (overhead + FULL.seconds + FULL.warmup) * FULL.rounds * 2 * CONFIGS.length
  console.log(`\nthis run: ${seconds.toFixed(0)} s; the full run (${FULL.rounds} rounds of ${FULL.seconds} s, warm-up ${FULL.warmup} s, both platforms): about ${Math.ceil(full / 60)} min on this machine`)
}
