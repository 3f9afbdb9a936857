// One app server of the benchmark, run as a child process so that its CPU
// time is its own: Fastify with GET /w (and, with `probePolicy`, GET /probe),
// limited by the configuration named in BENCH_APP (JSON). Over IPC:
//   -> 'ready'   { port }                       once listening
//   <- 'start'   opens the measured window
//   <- 'stop'    -> 'stats' { cpuUs, requests, commands, sources } of the window
//   <- 'counts'  -> 'counts' { tracked: { [client]: { allowed, lastAt } } }
//                for the clients named in `trackClients` (lastAt: epoch ms
//                of the last admitted request)
//   <- 'exit'    closes everything and exits (so does losing the parent)
// With `profileFile`, the window is also CPU-profiled (250 µs sampling) into
// that file, with the window's request count added as `benchRequests`.

import { writeFileSync } from 'node:fs'
import { Session } from 'node:inspector/promises'
import rateLimit from '@fastify/rate-limit'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import tollgate from 'tollgate'

const spec = JSON.parse(process.env.BENCH_APP ?? '{}')
const { config } = spec
const clientOf = (request) => request.headers['x-client-id']

let redis
// Commands this process sends to Redis (every ioredis command, script calls
// included, goes through sendCommand): the round trips per request.
let commands = 0
if (config === 'frl-redis' || config.startsWith('tollgate')) {
  redis = new Redis({ host: '127.0.0.1', port: spec.redisPort })
  const send = redis.sendCommand
  redis.sendCommand = function countedSendCommand (...args) {
    commands++
    return send.apply(this, args)
  }
  await new Promise((resolve, reject) => {
    redis.once('ready', resolve)
    redis.once('error', reject)
  })
}

const app = Fastify({ logger: false })

let requests = 0
const sources = {}
const tracked = new Map((spec.trackClients ?? []).map((id) => [id, { allowed: 0, lastAt: 0 }]))
app.server.on('request', () => { requests++ })

/** The route config that puts `policy` on a route, in this configuration's terms. */
let routeConfig = () => ({})
if (config === 'frl-local' || config === 'frl-redis') {
  await app.register(rateLimit, { global: false, keyGenerator: clientOf, ...(config === 'frl-redis' ? { redis } : {}) })
  // A route's own settings get a store of their own, sized by the route's `cache`.
  routeConfig = (policy) => ({
    rateLimit: {
      max: policy.capacity,
      timeWindow: Math.round(policy.capacity / policy.refillPerSecond * 1000),
      ...(config === 'frl-local' ? { cache: spec.localCache } : {})
    }
  })
} else if (config.startsWith('tollgate')) {
  await app.register(tollgate, {
    redis,
    failureMode: 'open',
    timeout: spec.timeout,
    key: clientOf,
    global: false,
    ...spec.pluginExtra
  })
  routeConfig = (policy) => ({ rateLimit: { ...policy, ...spec.policyExtra } })
}

async function handler (request) {
  const source = request.rateLimit?.source
  if (source !== undefined) sources[source] = (sources[source] ?? 0) + 1
  if (tracked.size > 0) {
    const client = tracked.get(clientOf(request))
    if (client !== undefined) {
      client.allowed++
      client.lastAt = performance.timeOrigin + performance.now()
    }
  }
  return 'ok'
}
app.get('/w', { config: routeConfig(spec.policy) }, handler)
if (spec.probePolicy !== undefined) app.get('/probe', { config: routeConfig(spec.probePolicy) }, handler)

await app.listen({ host: '127.0.0.1', port: 0 })

let profiler
if (spec.profileFile !== undefined) {
  profiler = new Session()
  profiler.connect()
  await profiler.post('Profiler.enable')
  await profiler.post('Profiler.setSamplingInterval', { interval: 250 })
}

let cpuAtStart
process.on('message', async (message) => {
  if (message.type === 'start') {
    await profiler?.post('Profiler.start')
    requests = 0
    commands = 0
    for (const name of Object.keys(sources)) delete sources[name]
    cpuAtStart = process.cpuUsage()
    process.send({ type: 'started' })
  } else if (message.type === 'stop') {
    const cpu = process.cpuUsage(cpuAtStart)
    if (profiler !== undefined) {
      const { profile } = await profiler.post('Profiler.stop')
      writeFileSync(spec.profileFile, JSON.stringify({ ...profile, benchRequests: requests }))
    }
    process.send({ type: 'stats', cpuUs: cpu.user + cpu.system, requests, commands, sources: { ...sources } })
  } else if (message.type === 'counts') {
    process.send({ type: 'counts', tracked: Object.fromEntries(tracked) })
  } else if (message.type === 'exit') {
    await app.close()
    if (redis !== undefined) await redis.quit()
    process.exit(0)
  }
})
process.on('disconnect', () => process.exit(0))
process.send({ type: 'ready', port: app.server.address().port })
