// One app server of the benchmark, run as a child process so that its CPU
// time is its own: Fastify (or, for the `express-*` and `erl-*`
// configurations, Express; for `hono-*` and `hrl-*`, Hono on
// @hono/node-server) with GET /w (and, with `probePolicy`, GET
// /probe), limited by the configuration named in BENCH_APP (JSON), or, for
// `round-trip`, making one empty Redis script call per request. Over IPC:
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
import { createAdaptorServer } from '@hono/node-server'
import express from 'express'
import { rateLimit as expressRateLimit } from 'express-rate-limit'
import Fastify from 'fastify'
import { Hono } from 'hono'
import { RedisStore as HonoRedisStore, rateLimiter as honoRateLimiter } from 'hono-rate-limiter'
import { Redis } from 'ioredis'
import { RedisStore } from 'rate-limit-redis'
import tollgate from 'tollgate'
import { rateLimit as tollgateExpress } from 'tollgate/express'
import { rateLimit as tollgateHono } from 'tollgate/hono'

const spec = JSON.parse(process.env.BENCH_APP ?? '{}')
const { config } = spec
const clientOf = (request) => request.headers['x-client-id']

let redis
/** Turns of round-trip-slow's empty Lua loop: about 4 µs more of Redis time a call (bench/RESULTS-headline.md). */
const ROUND_TRIP_SLOW_LOOPS = 1000
// Commands this process sends to Redis (every ioredis command, script calls
// included, goes through sendCommand): the round trips per request.
let commands = 0
const onExpress = config.startsWith('express') || config.startsWith('erl')
const onHono = config.startsWith('hono') || config.startsWith('hrl')
if (config === 'frl-redis' || config === 'erl-redis' || config.startsWith('round-trip') || config.startsWith('tollgate') || (onExpress && config !== 'express-bare') || (onHono && config !== 'hono-bare')) {
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

let requests = 0
const sources = {}
const tracked = new Map((spec.trackClients ?? []).map((id) => [id, { allowed: 0, lastAt: 0 }]))

/** Counts what the handler sees: the decision's source, and the tracked clients' admissions. */
function record (rateLimitDecision, client) {
  const source = rateLimitDecision?.source
  if (source !== undefined) sources[source] = (sources[source] ?? 0) + 1
  if (tracked.size > 0) {
    const entry = tracked.get(client)
    if (entry !== undefined) {
      entry.allowed++
      entry.lastAt = performance.timeOrigin + performance.now()
    }
  }
}

const { server, close } = onExpress ? await expressApp() : onHono ? await honoApp() : await fastifyApp()
server.on('request', () => { requests++ })

async function fastifyApp () {
  const app = Fastify({ logger: false })

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
  } else if (config.startsWith('round-trip')) {
    // The floor of any limiter that asks Redis on every request: one script
    // call that does nothing, awaited in a route hook; no key, no header.
    // `round-trip-slow` runs the same app code, its script spinning in
    // Redis (ROUND_TRIP_SLOW_LOOPS): what it adds to the app's CPU is the
    // machine's, the app waiting longer (bench/wake.mjs).
    const lua = config === 'round-trip-slow' ? `for i = 1, ${ROUND_TRIP_SLOW_LOOPS} do end return 1` : 'return 1'
    const sha = await redis.script('LOAD', lua)
    const roundTrip = async () => { await redis.evalsha(sha, 0) }
    routeConfig = () => ({})
    app.addHook('onRoute', (route) => { route.onRequest = [roundTrip] })
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
  record(request.rateLimit, clientOf(request))
  return 'ok'
}
app.get('/w', { config: routeConfig(spec.policy) }, handler)
if (spec.probePolicy !== undefined) app.get('/probe', { config: routeConfig(spec.probePolicy) }, handler)

await app.listen({ host: '127.0.0.1', port: 0 })
return { server: app.server, close: () => app.close() }
}

/**
 * The Express configurations: bare, express-rate-limit with rate-limit-redis
 * (a fixed window, as @fastify/rate-limit), and tollgate/express, exact or
 * with its caches (the `tollgate-*` cells' options, through `limit()`).
 */
async function expressApp () {
  const app = express()
  app.set('etag', false)
  app.set('x-powered-by', false)
  let limitOf = () => []
  if (config === 'erl-redis') {
    let n = 0
    limitOf = (policy) => [expressRateLimit({
      windowMs: Math.round(policy.capacity / policy.refillPerSecond * 1000),
      limit: policy.capacity,
      keyGenerator: clientOf,
      standardHeaders: 'draft-6',
      legacyHeaders: false,
      validate: false,
      store: new RedisStore({ prefix: `erl${n++}:`, sendCommand: (command, ...args) => redis.call(command, ...args) })
    })]
  } else if (config.startsWith('express-tollgate')) {
    const limit = tollgateExpress({ redis, failureMode: 'open', timeout: spec.timeout, key: clientOf, logger: { warn () {}, info () {}, error () {} }, ...spec.pluginExtra })
    limitOf = (policy) => [limit({ ...policy, ...spec.policyExtra })]
    await limit.ready
  }
  const handler = (req, res) => {
    record(req.rateLimit, clientOf(req))
    res.end('ok')
  }
  app.get('/w', ...limitOf(spec.policy), handler)
  if (spec.probePolicy !== undefined) app.get('/probe', ...limitOf(spec.probePolicy), handler)
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)) })
  return { server, close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve) }) }
}

/**
 * The Hono configurations, on @hono/node-server: bare, hono-rate-limiter
 * with its own Redis store (a fixed window, as express-rate-limit, whose
 * options it takes), and tollgate/hono exact or with its caches.
 */
async function honoApp () {
  const app = new Hono()
  const honoClient = (c) => c.req.header('x-client-id')
  let limitOf = () => []
  if (config === 'hrl-redis') {
    // Its store takes a client with scriptLoad and evalsha(sha, keys, args):
    // ioredis's, in those terms.
    const client = {
      scriptLoad: (script) => redis.script('LOAD', script),
      evalsha: (sha, keys, args) => redis.evalsha(sha, keys.length, ...keys, ...args),
      decr: (key) => redis.decr(key),
      del: (key) => redis.del(key)
    }
    let n = 0
    limitOf = (policy) => [honoRateLimiter({
      windowMs: Math.round(policy.capacity / policy.refillPerSecond * 1000),
      limit: policy.capacity,
      keyGenerator: honoClient,
      standardHeaders: 'draft-6',
      store: new HonoRedisStore({ client, prefix: `hrl${n++}:` })
    })]
  } else if (config.startsWith('hono-tollgate')) {
    const limit = tollgateHono({ redis, failureMode: 'open', timeout: spec.timeout, key: honoClient, logger: { warn () {}, info () {}, error () {} }, ...spec.pluginExtra })
    limitOf = (policy) => [limit({ ...policy, ...spec.policyExtra })]
    await limit.ready
  }
  const handler = (c) => {
    record(c.get('rateLimit'), honoClient(c))
    return c.text('ok')
  }
  app.get('/w', ...limitOf(spec.policy), handler)
  if (spec.probePolicy !== undefined) app.get('/probe', ...limitOf(spec.probePolicy), handler)
  const server = createAdaptorServer({ fetch: app.fetch })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { server, close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve) }) }
}

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
    await close()
    if (redis !== undefined) await redis.quit()
    process.exit(0)
  }
})
process.on('disconnect', () => process.exit(0))
process.send({ type: 'ready', port: server.address().port })
