// One app server of a fleet, in its own process: Fastify, the tollgate
// plugin and its own ioredis client (Redis or Cluster), once per configured
// store; or, with `framework: 'express'`, Express and tollgate/express; or,
// with `framework: 'hono'`, Hono on @hono/node-server and tollgate/hono; or,
// with `framework: 'nest-express'` or `'nest-fastify'`, a Nest app on that
// platform with tollgate/nest (one store: one module). Started by test/helpers/fleet.ts with fork(); configured by the
// JSON in TOLLGATE_FLEET (a FleetServerConfig). Reports `{ port }` over IPC once it
// listens, stops on the 'stop' message, and exits if its parent goes away.
//
// Routes:
//   GET /<label>/hit  for each configured store: limited by one policy on the
//                     configured bucket, through that store; the client is
//                     the `x-client` header (default 'fleet'); answers the
//                     decision's source
//   GET /<label>/settle  the same bucket, charged by outcome: reserves the
//                     `x-cost` header's cost, settles at the `x-actual` header's,
//                     after holding the request for the `x-hold-ms` header's
//                     milliseconds if set, or the `x-delay` header's (Fastify only)
//   GET /<label>/locked  with `lockout` configured: bucket `<bucket>:locked`
//                     under that lockout (Fastify only)
//   GET /<label>/leased  with `lease` configured: bucket `<bucket>:leased`
//                     with that lease (Fastify only)
//   GET /<label>/reset  not limited: app.tollgate.reset of the client and the
//                     `x-bucket` header's bucket (default the configured one),
//                     answered once it resolved (Fastify only)
//   GET /settled      not limited; settlements this process has finished
//   GET /clock        not limited; this process's Date.now() and performance.now()

// Each process loads only its own framework, adapter and client family
// (imported where they are used): through the tests' TypeScript loader,
// six processes starting at once on two cores each took seconds more to
// listen when every one of them loaded all three frameworks and every
// client package.

import type { Server } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { Cluster, Redis } from 'ioredis'
import type { RateLimitEnv } from '../../lib/hono.js'
import type { RedisClient as TollgateClient } from '../../lib/index.js'
import type { Family, Made } from './clients.js'
import type { FleetServerConfig } from './fleet.js'
import { LUA } from './model.js'
import { naiveAcquire, trustAppClock } from './naive.js'
import { randomUUID } from 'node:crypto'

type RedisClient = Redis | Cluster

const config = JSON.parse(process.env.TOLLGATE_FLEET ?? 'null') as FleetServerConfig | null
if (config === null) throw new Error('TOLLGATE_FLEET is not set: start this file through test/helpers/fleet.ts')

if (config.clockSkewMs !== undefined) shiftClock(config.clockSkewMs)

/**
 * Moves this process's clocks `ms` ahead: Date.now(), new Date() and
 * performance.now(), everything lib could read time from.
 */
function shiftClock (ms: number): void {
  const RealDate = Date
  const realNow = RealDate.now.bind(RealDate)
  class ShiftedDate extends RealDate {
    constructor (...args: unknown[]) {
      if (args.length === 0) super(realNow() + ms)
      else super(...(args as [string | number]))
    }

    static override now (): number {
      return realNow() + ms
    }
  }
  globalThis.Date = ShiftedDate as DateConstructor
  const realPerf = performance.now.bind(performance)
  performance.now = () => realPerf() + ms
}

const clients: RedisClient[] = []
const others: Made[] = []
/** The store's client: ioredis unless `family` names one of test/helpers/clients.ts. */
async function client (store: FleetServerConfig['stores'][string]): Promise<TollgateClient> {
  if (store.family !== undefined) {
    const { families } = await import('./clients.js')
    const family = families.find((f) => f.label === store.family)
    if (family === undefined) throw new Error(`no client family ${store.family}`)
    const made = store.cluster === undefined ? await family.standalone(store.url ?? '') : await (family.cluster as NonNullable<Family['cluster']>)(store.cluster)
    others.push(made)
    return made.client
  }
  const redis: RedisClient = store.cluster === undefined
    ? new Redis(store.url ?? '', { enableOfflineQueue: false, maxRetriesPerRequest: 1 })
    : new Cluster(store.cluster, store.clusterOptions ?? {})
  redis.on('error', () => {})
  if (store.trustAppClock === true) trustAppClock(redis, LUA)
  clients.push(redis)
  return redis
}

const APPS = { express: expressApp, hono: honoApp, fastify: fastifyApp, 'nest-express': nestFleetApp, 'nest-fastify': nestFleetApp }
const { port, close } = await APPS[config.framework ?? 'fastify'](config)

async function fastifyApp (config: FleetServerConfig): Promise<{ port: number, close: () => Promise<void> }> {
  const { default: Fastify } = await import('fastify')
  const { default: tollgate } = await import('../../lib/index.js')
  const app = Fastify()
  let settled = 0
  for (const [label, store] of Object.entries(config.stores)) {
    const redis = await client(store)
    await app.register(async (scope) => {
      await scope.register(tollgate, {
        redis,
        prefix: config.prefix,
        capacity: config.capacity,
        refillPerSecond: config.refillPerSecond,
        failureMode: config.failureMode,
        timeout: config.timeout,
        global: false,
        ...(config.denialCache === undefined ? {} : { denialCache: config.denialCache }),
        key: (request) => {
          const client = request.headers['x-client']
          return typeof client === 'string' ? client : 'fleet'
        }
      })
      scope.get('/settle', {
        config: {
          rateLimit: {
            bucket: config.bucket,
            cost: (request) => Number(request.headers['x-cost']),
            settle: (request) => Number(request.headers['x-actual'])
          }
        }
      }, async (request) => {
        const hold = Number(request.headers['x-hold-ms'] ?? request.headers['x-delay'] ?? 0)
        if (hold > 0) await sleep(hold)
        return { server: config.name, source: request.rateLimit?.source }
      })
      if (config.lockout !== undefined) {
        scope.get('/locked', { config: { rateLimit: { bucket: `${config.bucket}:locked`, lockout: config.lockout } } }, async (request) => ({
          server: config.name,
          source: request.rateLimit?.source
        }))
      }
      if (config.lease !== undefined) {
        scope.get('/leased', { config: { rateLimit: { bucket: `${config.bucket}:leased`, lease: config.lease } } }, async (request) => ({
          server: config.name,
          source: request.rateLimit?.source
        }))
      }
      scope.get('/reset', { config: { rateLimit: false } }, async (request) => {
        const client = request.headers['x-client']
        const bucket = request.headers['x-bucket']
        await scope.tollgate.reset(typeof client === 'string' ? client : 'fleet', typeof bucket === 'string' ? bucket : config.bucket)
        return { server: config.name, reset: true }
      })
      // Runs after the plugin's own onResponse hook, so after its settlement.
      scope.addHook('onResponse', async (request) => {
        if (request.url.endsWith('/settle') && request.rateLimit?.allowed === true) settled++
      })
      if (config.concurrency !== undefined) slotRoutes(scope, store, label, config.concurrency)
      scope.get('/hit', { config: { rateLimit: { bucket: config.bucket } } }, async (request) => ({
        server: config.name,
        source: request.rateLimit?.source
      }))
    }, { prefix: `/${label}` })
  }
  app.get('/settled', async () => ({ settled }))
  app.get('/clock', async () => ({ now: Date.now(), perf: performance.now() }))
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  return { port: typeof address === 'object' && address !== null ? address.port : 0, close: async () => { await app.close() } }
}

/**
 * The routes of `concurrency` (see FleetServerConfig). The counter goes up
 * once the handler holds its slot and down before its answer is sent, so
 * it never counts a request whose slot was released: at every instant, it
 * is at most the slots held.
 */
function slotRoutes (scope: import('fastify').FastifyInstance, store: FleetServerConfig['stores'][string], label: string, limit: NonNullable<FleetServerConfig['concurrency']>): void {
  const counter: RedisClient = store.cluster === undefined ? new Redis(store.url ?? '') : new Cluster(store.cluster, store.clusterOptions ?? {})
  counter.on('error', () => {})
  clients.push(counter)
  const tag = `${config?.prefix ?? ''}:{inflight}:${label}`
  const held = async (key: string, holdMs: number): Promise<number> => {
    const inFlight = await counter.incr(key)
    await sleep(holdMs)
    await counter.decr(key)
    return inFlight
  }
  const holdOf = (request: import('fastify').FastifyRequest): number => Number(request.headers['x-hold-ms'] ?? 0)
  scope.get('/slot', { config: { rateLimit: { bucket: `${config?.bucket ?? ''}:slots`, concurrency: limit } } }, async (request) => ({
    server: config?.name,
    source: request.rateLimit?.source,
    inFlight: await held(`${tag}:slot`, holdOf(request))
  }))
  scope.get('/naive-slot', { config: { rateLimit: false } }, async (request, reply) => {
    const id = randomUUID()
    const key = `${tag}:naive-slots`
    if (!(counter instanceof Redis) || !await naiveAcquire(counter, key, limit.max, id, limit.leaseMs ?? 60_000)) return await reply.code(429).send({ server: config?.name })
    const inFlight = await held(`${tag}:naive`, holdOf(request))
    await counter.zrem(key, id)
    return { server: config?.name, inFlight }
  })
}

/** A middleware or module limiter's options over one store (its client made here). */
async function limitOptions (config: FleetServerConfig, store: FleetServerConfig['stores'][string]) {
  const { prefix, capacity, refillPerSecond, failureMode, timeout } = config
  return { redis: await client(store), prefix, capacity, refillPerSecond, failureMode, timeout }
}

/** The client: the `x-client` header of a Node request ('fleet' without it). */
function clientHeader (req: { headers: Record<string, string | string[] | undefined> }): string {
  const client = req.headers['x-client']
  return typeof client === 'string' ? client : 'fleet'
}

async function expressApp (config: FleetServerConfig): Promise<{ port: number, close: () => Promise<void> }> {
  const { default: express } = await import('express')
  const { rateLimit } = await import('../../lib/express.js')
  const app = express()
  const limits: Array<ReturnType<typeof rateLimit>> = []
  for (const [label, store] of Object.entries(config.stores)) {
    const limit = rateLimit({ ...await limitOptions(config, store), key: clientHeader })
    limits.push(limit)
    await limit.ready
    app.get(`/${label}/hit`, limit({ bucket: config.bucket }), (req, res) => {
      res.json({ server: config.name, source: req.rateLimit?.source })
    })
  }
  app.get('/clock', (_req, res) => { res.json({ now: Date.now(), perf: performance.now() }) })
  const server: Server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)) })
  const address = server.address()
  return {
    port: typeof address === 'object' && address !== null ? address.port : 0,
    close: async () => {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
      for (const limit of limits) await limit.close()
    }
  }
}

async function honoApp (config: FleetServerConfig): Promise<{ port: number, close: () => Promise<void> }> {
  const { Hono } = await import('hono')
  const { createAdaptorServer } = await import('@hono/node-server')
  const { rateLimit: honoRateLimit } = await import('../../lib/hono.js')
  const app = new Hono<RateLimitEnv>()
  const limits: Array<ReturnType<typeof honoRateLimit>> = []
  for (const [label, store] of Object.entries(config.stores)) {
    const limit = honoRateLimit({ ...await limitOptions(config, store), key: (c) => c.req.header('x-client') ?? 'fleet' })
    limits.push(limit)
    await limit.ready
    app.get(`/${label}/hit`, limit({ bucket: config.bucket }), (c) => c.json({ server: config.name, source: c.get('rateLimit')?.source }))
  }
  app.get('/clock', (c) => c.json({ now: Date.now(), perf: performance.now() }))
  const server = createAdaptorServer({ fetch: app.fetch }) as Server
  await new Promise<void>((resolve) => { server.listen(0, '127.0.0.1', () => { resolve() }) })
  const address = server.address()
  return {
    port: typeof address === 'object' && address !== null ? address.port : 0,
    close: async () => {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
      for (const limit of limits) await limit.close()
    }
  }
}

async function nestFleetApp (config: FleetServerConfig): Promise<{ port: number, close: () => Promise<void> }> {
  const { TollgateModule } = await import('../../lib/nest.js')
  const { controller, nestApp } = await import('./nest.js')
  const [entry, ...more] = Object.entries(config.stores)
  if (entry === undefined || more.length > 0) throw new Error('a Nest fleet server has one store: one TollgateModule')
  const [label, store] = entry
  const module = TollgateModule.forRoot({ ...await limitOptions(config, store), global: false, key: clientHeader })
  const hit = { path: 'hit', policy: { bucket: config.bucket }, answer: (req: { rateLimit?: { source: string } | undefined }) => JSON.stringify({ server: config.name, source: req.rateLimit?.source }) }
  const clock = { path: 'clock', answer: () => JSON.stringify({ now: Date.now(), perf: performance.now() }) }
  const app = await nestApp(config.framework === 'nest-fastify' ? 'fastify' : 'express', module, [controller(label, [hit]), controller('', [clock])])
  await app.listen(0, '127.0.0.1')
  const address = (app.getHttpServer() as Server).address()
  return { port: typeof address === 'object' && address !== null ? address.port : 0, close: async () => { await app.close() } }
}

let stopping: Promise<void> | undefined
function stop (): Promise<void> {
  stopping ??= (async () => {
    await close()
    for (const redis of clients) redis.disconnect()
    for (const made of others) await made.close()
    process.disconnect?.()
  })()
  return stopping
}

process.on('message', (message) => {
  if (message === 'stop') void stop()
})
// The parent died or closed the channel: nobody will ever ask us to stop.
process.on('disconnect', () => { void stop() })
process.send?.({ port })
