// Type fixture, compiled by test/types.test.ts and by `npm run typecheck`:
// every line after an `@ts-expect-error` marker must be a type error. The
// markers keep this file clean for the compiler (an unused marker is itself
// an error); test/types.test.ts also compiles it with the markers disarmed
// and checks that exactly the marked lines fail. Never executed.

import type { Request } from 'express'
import type { FastifyInstance } from 'fastify'
import { rateLimit } from '../../lib/express.js'
import tollgate, { createLimiter, routePolicy, type ProgrammaticPolicy, type RoutePolicy } from '../../lib/index.js'

export async function invalidUsage (app: FastifyInstance): Promise<void> {
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error capacity is a number, not a string
    capacity: '10'
  })
  await app.register(tollgate, {
    // @ts-expect-error not a failure mode
    failureMode: 'maybe'
  })
  // @ts-expect-error failureMode is required
  await app.register(tollgate, { capacity: 10, refillPerSecond: 1 })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error not a header mode
    headers: 'draft-7'
  })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error not a hook the plugin supports
    hook: 'preValidation'
  })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error unknown option (a typo of capacity)
    capacty: 10
  })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error redis is a client, not a URL
    redis: 'redis://127.0.0.1:6379'
  })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error key returns a string
    key: () => 42
  })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error cost returns a number
    cost: () => '2'
  })
  await app.register(tollgate, {
    failureMode: 'local',
    // @ts-expect-error local.capacity is a number
    local: { capacity: '1', refillPerSecond: 1 }
  })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error ipv6Subnet is a number
    ipv6Subnet: '56'
  })
  await app.register(tollgate, {
    failureMode: 'open',
    // @ts-expect-error global is a boolean
    global: 'yes'
  })

  // @ts-expect-error route capacity is a number
  app.get('/a', { config: { rateLimit: { capacity: '5' } } }, async () => 'x')
  // @ts-expect-error route header mode
  app.get('/b', { config: { rateLimit: { headers: 'draft-7' } } }, async () => 'x')
  // @ts-expect-error route failure mode
  app.get('/c', { config: { rateLimit: { failureMode: 'maybe' } } }, async () => 'x')
  // @ts-expect-error route key returns a string
  app.get('/d', { config: { rateLimit: { key: () => 42 } } }, async () => 'x')
  // Fastify infers the route's config type from the literal, which hides
  // errors in array members, `true` and unknown names; `satisfies` restores them.
  // @ts-expect-error array member capacity is a number
  app.get('/e', { config: { rateLimit: [{ bucket: 'x', capacity: '5' }] satisfies RoutePolicy[] } }, async () => 'x')
  // @ts-expect-error unknown route option
  app.get('/f', { config: { rateLimit: { capacty: 5 } satisfies RoutePolicy } }, async () => 'x')

  // @ts-expect-error routePolicy: an option of @fastify/rate-limit
  app.get('/h', { config: { rateLimit: routePolicy({ max: 5 }) } }, async () => 'x')
  // @ts-expect-error routePolicy: not a policy
  app.get('/i', { config: { rateLimit: routePolicy('yes') } }, async () => 'x')
  // @ts-expect-error routePolicy: true is not a policy (false opts out)
  app.get('/j', { config: { rateLimit: routePolicy(true) } }, async () => 'x')
  // @ts-expect-error routePolicy: capacity is a number
  app.get('/k', { config: { rateLimit: routePolicy([{ capacity: '5' }]) } }, async () => 'x')
  // @ts-expect-error routePolicy: the route's params have no `name`
  app.get('/l/:id', { config: { rateLimit: routePolicy<{ Params: { id: string } }>({ key: (request) => request.params.name }) } }, async () => 'x')
  // @ts-expect-error routePolicy: without generics, params are unknown
  app.get('/m/:id', { config: { rateLimit: routePolicy({ key: (request) => request.params.id }) } }, async () => 'x')

  app.get('/g', async (request) => {
    // @ts-expect-error request.rateLimit is undefined when no limit applied
    return request.rateLimit.remaining
  })
  // @ts-expect-error a programmatic policy names its bucket
  await app.tollgate.consume('user:1', { capacity: 3 })
  // @ts-expect-error the cost argument is a number
  await app.tollgate.consume('user:1', { bucket: 'login' }, '2')
  // @ts-expect-error the client key is a string
  await app.tollgate.peek(42, { bucket: 'login' })
  // @ts-expect-error acquire takes no cost argument
  await app.tollgate.acquire('user:1', { bucket: 'exports', concurrency: { max: 2 } }, 2)
  // @ts-expect-error a programmatic cost is a number (the runtime refuses a function)
  await app.tollgate.consume('user:1', { bucket: 'login', cost: () => 2 })
  // @ts-expect-error key is a route setting: the client key is the first argument
  await app.tollgate.consume('user:1', { bucket: 'login', key: () => 'x' })
  // @ts-expect-error hook is a route setting
  await app.tollgate.peek('user:1', { bucket: 'login', hook: 'preHandler' })
  // @ts-expect-error a policy constant with a failure mode that does not exist
  const retry = { bucket: 'login', failureMode: 'retry' } satisfies ProgrammaticPolicy
  void retry
  // @ts-expect-error the core limiter's internals are not public
  void app.tollgate.limiter.warm

  // @ts-expect-error a plan is { capacity, refillPerSecond } or false, not a name
  routePolicy({ limit: () => 'pro' })
  // @ts-expect-error settle returns the actual cost, a number
  routePolicy({ settle: () => 'free' })
  // @ts-expect-error a settlement takes the actual cost
  await app.tollgate.settle(await app.tollgate.reserve('user:1', { bucket: 'llm' }), '8')

  // @ts-expect-error timeout is a number
  const limiter = createLimiter({ timeout: '10' })
  // @ts-expect-error a core policy needs its failureMode
  await limiter.consume('k', { bucket: 'b', capacity: 1, refillPerSecond: 1 })
  // @ts-expect-error no such failure mode
  await limiter.consume('k', { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'retry' })
}

export async function invalidExpressUsage (req: Request): Promise<void> {
  // @ts-expect-error failureMode is required
  rateLimit({ capacity: 5 })
  // @ts-expect-error an option of express-rate-limit
  rateLimit({ failureMode: 'open', windowMs: 60_000 })
  const limit = rateLimit({ failureMode: 'open', capacity: 5, refillPerSecond: 1 })
  // @ts-expect-error an unknown option of limit()
  limit({ max: 5 })
  // @ts-expect-error Fastify's hook is no Express option
  limit({ hook: 'preHandler' })
  // @ts-expect-error a mistyped field
  limit({ capacity: '5' })
  // @ts-expect-error a mistyped field in an array of policies
  limit([{ capacity: 5 }, { refillPerSecond: '1' }])
  // @ts-expect-error not a policy
  limit('yes')
  // @ts-expect-error a request is no policy (the limiter itself is the app-wide middleware)
  limit(req)
  // @ts-expect-error a programmatic policy takes no key
  await limit.consume('alice', { bucket: 'login', key: () => 'x' })
  // @ts-expect-error nor a handler: its caller answers
  await limit.consume('alice', { bucket: 'login', handler: () => {} })
  // @ts-expect-error a route's handler is a function
  limit({ handler: 'send 429' })
  // @ts-expect-error req.rateLimit is a Decision
  const remaining: number | undefined = req.rateLimit
  void remaining
}
