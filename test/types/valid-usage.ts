// Type fixture, compiled by test/types.test.ts and by `npm run typecheck`:
// every use of the public types below must compile with zero diagnostics.
// It is never executed (it only exports a function).

import diagnostics from 'node:diagnostics_channel'
import express from 'express'
import Fastify, { type FastifyRequest } from 'fastify'
import { Cluster, Redis } from 'ioredis'
import { Cluster as Cluster6, Redis as Redis6 } from 'ioredis6'
import { Cluster as ValkeyCluster, Redis as Valkey } from 'iovalkey'
import { createClient, createCluster } from 'redis'
import * as redis4 from 'redis4'
import * as redis5 from 'redis5'
import { GlideClient, GlideClusterClient } from '@valkey/valkey-glide'
import { RateLimitError, rateLimit, type ExpressPolicy, type RateLimit } from '../../lib/express.js'
import tollgate, {
  createLimiter,
  routePolicy,
  type Acquired,
  type BreakerMessage,
  type Decision,
  type DecisionMessage,
  type DecisionSource,
  type Limiter,
  type Policy,
  type ProgrammaticPolicy,
  type RedisClient,
  type RoutePolicy,
  type StoreStateMessage,
  type TollgateOptions
} from '../../lib/index.js'

export async function validUsage (): Promise<void> {
  const app = Fastify()
  await app.register(tollgate, {
    redis: new Redis(),
    capacity: 100,
    refillPerSecond: 10,
    failureMode: 'open'
  })

  // Every option, with the function options reading the request.
  const all: TollgateOptions = {
    redis: new Cluster([{ host: '127.0.0.1', port: 7000 }]),
    capacity: 5,
    refillPerSecond: 0.5,
    cost: async (request: FastifyRequest) => request.url.length > 10 ? 2 : 1,
    failureMode: 'local',
    local: { capacity: 2, refillPerSecond: 0.1 },
    key: (request) => request.headers['x-api-key'] as string,
    bucket: 'api',
    timeout: 25,
    headers: 'draft-10',
    global: false,
    hook: 'preHandler',
    allow: async (request) => request.ip === '127.0.0.1',
    prefix: 'my-app',
    ipv6Subnet: 64,
    breaker: { failures: 3 }
  }
  await app.register(tollgate, all)
  await app.register(tollgate, { failureMode: 'closed', headers: false })
  await app.register(tollgate, { failureMode: 'open', headers: 'legacy', hook: 'onRequest', cost: 2 })

  // Route config: an object over the defaults, an array, or false.
  app.get('/search', { config: { rateLimit: { capacity: 20, refillPerSecond: 2 } } }, async (request) => {
    const decision: Decision | undefined = request.rateLimit
    if (decision === undefined) return 'not limited'
    const left: number = decision.remaining
    const source: DecisionSource = decision.source
    const each: readonly Decision[] | undefined = decision.policies
    return { left, source, each, retry: decision.retryAfterMs, reset: decision.resetMs, limit: decision.limit }
  })
  app.post('/pay', { config: { rateLimit: { capacity: 5, refillPerSecond: 0.1, failureMode: 'closed' } } }, async () => 'paid')
  app.get('/health', { config: { rateLimit: false } }, async () => 'ok')
  app.get('/tiered', {
    config: {
      rateLimit: [
        { bucket: 'burst', capacity: 10, refillPerSecond: 5 },
        { bucket: 'daily', capacity: 1000, refillPerSecond: 0.01, cost: (request) => Number(request.headers['x-units']) }
      ]
    }
  }, async () => 'x')
  app.route({
    method: 'POST',
    url: '/login',
    config: { rateLimit: { hook: 'preHandler', key: (request) => (request.body as { user: string }).user } },
    handler: async (request, reply) => {
      const { user } = request.body as { user: string }
      const decision = await app.tollgate.consume(`user:${user}`, { bucket: 'login', capacity: 5 })
      if (!decision.allowed) return await reply.code(429).send({ retryInMs: decision.retryAfterMs })
      await app.tollgate.consume(`user:${user}`, { bucket: 'login' }, 2)
      const peeked: Decision = await app.tollgate.peek(`user:${user}`, { bucket: 'login' })
      await app.tollgate.reset(`user:${user}`, 'login')
      const core: Limiter = app.tollgate.limiter
      return { peeked, state: core.state }
    }
  })
  const shared = { capacity: 3 } satisfies RoutePolicy
  app.get('/shared', { config: { rateLimit: shared } }, async () => 'x')

  // routePolicy(): checked in full, and typed for the route's generics.
  app.get('/helper', { config: { rateLimit: routePolicy({ capacity: 20, refillPerSecond: 2 }) } }, async () => 'x')
  app.get('/helpers', { config: { rateLimit: routePolicy([{ capacity: 1 }, { capacity: 2, bucket: 'two' }]) } }, async () => 'x')
  app.get<{ Params: { id: string } }>('/users/:id', {
    config: {
      rateLimit: routePolicy<{ Params: { id: string } }>({
        key: (request) => request.params.id,
        cost: (request) => request.params.id.length,
        allow: (request) => request.params.id === 'admin'
      })
    }
  }, async (request) => request.params.id)
  const typed: RoutePolicy<{ Querystring: { units: string } }> = { cost: (request) => Number(request.query.units) }
  app.get('/typed', { config: { rateLimit: routePolicy(typed) } }, async () => 'x')

  // A programmatic policy in a constant keeps its literal types.
  const loginLimit = { bucket: 'login', capacity: 5, refillPerSecond: 1 / 60, failureMode: 'closed' } satisfies ProgrammaticPolicy
  await app.tollgate.consume('alice', loginLimit)
  const exportLimit: Policy = { bucket: 'export', capacity: 10, refillPerSecond: 1 / 60, failureMode: 'closed' }

  // Diagnostics messages.
  diagnostics.subscribe('tollgate:decision', (message) => {
    const { key, decision } = message as DecisionMessage
    void key.length
    void decision.allowed
  })
  diagnostics.subscribe('tollgate:store', (message) => {
    const change = message as StoreStateMessage
    if (change.state === 'failing') void change.error.code
    else void change.decisions['fail-open']
  })
  diagnostics.subscribe('tollgate:breaker', (message) => {
    const change = message as BreakerMessage
    if (change.state === 'open') void change.cooldownMs
  })

  // Both ioredis majors, iovalkey, node-redis 6, 5 and 4 (client and cluster, RESP2 and RESP3) and GLIDE fit the redis option.
  const clients: RedisClient[] = [
    new Redis(), new Cluster([]), new Redis6(), new Cluster6([]), new Valkey(), new ValkeyCluster([]),
    createClient(), createClient({ RESP: 3, database: 2 }), createCluster({ rootNodes: [] }),
    redis5.createClient({ RESP: 3 }), redis5.createCluster({ rootNodes: [] }),
    redis4.createClient({ isolationPoolOptions: { max: 4 } }), redis4.createCluster({ rootNodes: [] }),
    await GlideClient.createClient({ addresses: [] }), await GlideClusterClient.createClient({ addresses: [] })
  ]
  await app.register(tollgate, { redis: new Redis6(), failureMode: 'open' })
  await app.register(tollgate, { redis: createClient({ RESP: 3 }), failureMode: 'open' })
  await app.register(tollgate, { redis: await GlideClusterClient.createClient({ addresses: [] }), failureMode: 'open' })
  void clients

  // The core, framework-free.
  const limiter = createLimiter({ redis: new Redis(), prefix: 'core', timeout: 10, breaker: { cooldownMs: 500 } })
  const inProcess: Limiter = createLimiter()
  const policy: Policy = { bucket: 'b', capacity: 10, refillPerSecond: 1, failureMode: 'local', local: { capacity: 2, refillPerSecond: 1 } }
  const one: Decision = await limiter.consume('client', policy)
  const many: Decision = await limiter.consume('client', [policy, { ...policy, bucket: 'c', cost: 2 }], 1)
  await limiter.peek('client', policy)
  await limiter.reset('client', 'b')
  await inProcess.close()
  // Reserve and settle by handle; plans and settlements on routes.
  const reservation = await limiter.reserve('client', policy, 2)
  const reserved: Decision = reservation.decision
  await limiter.settle(reservation, 0)
  const failedSettlements: number = limiter.failedSettlements
  await app.tollgate.settle(await app.tollgate.reserve('user:1', { bucket: 'llm' }, 4), 8)
  const slot: Acquired = await app.tollgate.acquire('user:1', { bucket: 'exports', concurrency: { max: 2 }, maxWaitMs: 1000 })
  await slot.release()
  await (await app.tollgate.acquire('user:1', [{ bucket: 'llm' }, { bucket: 'llm-slots', concurrency: { max: 4 } }])).release()
  app.get('/planned', {
    config: {
      rateLimit: routePolicy({
        limit: (request) => request.headers['x-plan'] === 'internal' ? false : { capacity: 10, refillPerSecond: 1 },
        settle: (_request, reply) => reply.statusCode >= 500 ? 0 : 1
      })
    }
  }, async () => 'ok')
  app.get('/async-plan', { config: { rateLimit: { limit: async () => ({ capacity: 5, refillPerSecond: 1 }), settle: async () => 0 } } }, async () => 'ok')
  void reserved
  void failedSettlements
  void one
  void many
  void exportLimit
}

/** tollgate/express: options, middleware, req.rateLimit, a handler, the programmatic API. */
export async function expressUsage (): Promise<void> {
  const limit: RateLimit = rateLimit({
    redis: new Redis(),
    capacity: 100,
    refillPerSecond: 10,
    failureMode: 'open',
    handler: (_req, res, next, err: RateLimitError) => {
      if (err.status === 503) next(err)
      else res.status(err.status).set(err.headers).json({ retryAfter: err.retryAfter, bucket: err.decision.bucket })
    }
  })
  const app = express()
  app.use(limit({ bucket: 'site', capacity: 1000, refillPerSecond: 100 }))
  app.use(limit)
  app.use(rateLimit({ capacity: 100, refillPerSecond: 10, failureMode: 'open' }))
  app.use(rateLimit({ capacity: 100, refillPerSecond: 10, failureMode: 'open', handler: async (_req, res) => { res.status(429).end() } }))
  app.get('/search', limit({ capacity: 20, refillPerSecond: 2, key: (req) => req.get('x-user') ?? req.ip ?? 'anonymous' }), (req, res) => {
    const decision: Decision | undefined = req.rateLimit
    res.json({ remaining: decision?.remaining })
  })
  app.get('/users/:id', limit(), (_req, res) => { res.end() })
  app.get('/own-answer', limit({ capacity: 5, handler: (_req, res, _next, err) => { res.status(err.status).json({ retryAfter: err.retryAfter }) } }), (_req, res) => { res.end() })
  app.post('/pay', limit([{ capacity: 5, refillPerSecond: 1 }, { capacity: 100, refillPerSecond: 100 / 3600, failureMode: 'closed' }]), (_req, res) => { res.end() })
  const costly: ExpressPolicy = { cost: async (req) => Number(req.query.n), allow: (req) => req.path === '/health', headers: 'draft-10' }
  app.get('/costly', limit(costly), (_req, res) => { res.end() })
  app.get('/orgs/:org', limit({ key: (req: express.Request<{ org: string }>) => req.params.org }), (_req, res) => { res.end() })
  const decision: Decision = await limit.consume('alice', { bucket: 'login', capacity: 5 }, 2)
  await limit.peek('alice', { bucket: 'login' })
  await limit.reset('alice', 'login')
  await limit.ready
  void limit.limiter.state
  await limit.close()
  void decision
}
