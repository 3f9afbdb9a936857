// Four app servers (separate Fastify instances, each with its own ioredis
// client, listening on real ports) share one bucket of capacity 50 in one
// Redis. 400 concurrent requests, round-robin over the servers, must let
// exactly 50 through: with the plugin as configured by default, with the
// denial cache off (every request runs the script), and never more than 50
// with token leases. The same load through a read-modify-write limiter
// (GET, decide in JS, SET) lets more through: the race the atomic script
// exists to prevent, so this test would catch a script that raced.

import { Agent, request } from 'node:http'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import t from 'tap'
import tollgate from '../lib/index.js'
import { uniqueTag } from './helpers/model.js'
import { naiveBucketHook } from './helpers/naive.js'
import { redisUrl } from './helpers/redis.js'

const SERVERS = 4
const REQUESTS = 400
const CAPACITY = 50
/** Sockets per server: 4 x 25 = 100 requests in flight at once. */
const SOCKETS_PER_SERVER = 25

const url = await redisUrl(t)
const tag = uniqueTag('race')
const naiveKey = `test:${tag}:naive`
const serialKey = `test:${tag}:serial`

interface Server {
  app: FastifyInstance
  redis: Redis
  port: number
  agent: Agent
}

async function startServer (): Promise<Server> {
  const redis = new Redis(url)
  const app = Fastify()
  const options = {
    redis,
    capacity: CAPACITY,
    // One token per 11.6 days: none comes back during the test.
    refillPerSecond: 1e-6,
    // Closed, with a deadline far above any Redis reply here: a slow store
    // would turn into 503s (under-admission), never into extra 200s, so
    // exactly 50 is the only passing count.
    failureMode: 'closed',
    timeout: 2000,
    global: false,
    key: () => tag
  } as const
  await app.register(async (scope) => {
    await scope.register(tollgate, options)
    scope.get('/tollgate', { config: { rateLimit: { bucket: 'race' } } }, async () => 'ok')
    scope.get('/leased', { config: { rateLimit: { bucket: 'race-leased', lease: { tokens: 5, maxAgeMs: 60_000 } } } }, async () => 'ok')
  })
  await app.register(async (scope) => {
    await scope.register(tollgate, { ...options, denialCache: false })
    scope.get('/uncached', { config: { rateLimit: { bucket: 'race-uncached' } } }, async () => 'ok')
  })
  app.get('/naive', {
    onRequest: naiveBucketHook(redis, { key: naiveKey, capacity: CAPACITY, refillPerSecond: 1e-6 })
  }, async () => 'ok')
  app.get('/naive-serial', {
    onRequest: naiveBucketHook(redis, { key: serialKey, capacity: CAPACITY, refillPerSecond: 1e-6 })
  }, async () => 'ok')
  await app.listen({ port: 0, host: '127.0.0.1' })
  const address = app.server.address()
  const port = typeof address === 'object' && address !== null ? address.port : 0
  return { app, redis, port, agent: new Agent({ keepAlive: true, maxSockets: SOCKETS_PER_SERVER }) }
}

function get (server: Server, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: server.port, path, agent: server.agent }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode ?? 0))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

interface Tally {
  /** status code -> count */
  statuses: Record<number, number>
  /** 200s per server */
  admittedBy: number[]
}

/** All requests at once, round-robin over the servers; the agents cap what is in flight. */
async function hammer (servers: readonly Server[], path: string): Promise<Tally> {
  const tally: Tally = { statuses: {}, admittedBy: servers.map(() => 0) }
  await Promise.all(Array.from({ length: REQUESTS }, async (_, i) => {
    const index = i % servers.length
    const status = await get(servers[index] as Server, path)
    tally.statuses[status] = (tally.statuses[status] ?? 0) + 1
    if (status === 200) tally.admittedBy[index] = (tally.admittedBy[index] ?? 0) + 1
  }))
  return tally
}

const servers = await Promise.all(Array.from({ length: SERVERS }, startServer))
t.teardown(async () => {
  for (const server of servers) {
    server.agent.destroy()
    await server.app.close()
    server.redis.disconnect()
  }
})

t.test('400 concurrent requests over 4 app servers: exactly 50 pass', async (t) => {
  const started = Date.now()
  const tally = await hammer(servers, '/tollgate')
  t.comment(`tollgate: ${JSON.stringify(tally.statuses)}, admitted per server ${tally.admittedBy.join('/')}, ${Date.now() - started} ms`)
  t.equal(tally.statuses[200] ?? 0, CAPACITY, 'exactly the capacity is admitted')
  t.equal(tally.statuses[429] ?? 0, REQUESTS - CAPACITY, 'the rest are limited')
  t.equal(tally.statuses[503] ?? 0, 0, 'no store failure (a 503 would be under-admission)')
})

t.test('with the denial cache off, every one of the 400 runs the script: exactly 50 pass', async (t) => {
  const tally = await hammer(servers, '/uncached')
  t.comment(`uncached: ${JSON.stringify(tally.statuses)}, admitted per server ${tally.admittedBy.join('/')}`)
  t.equal(tally.statuses[200] ?? 0, CAPACITY, 'exactly the capacity is admitted')
  t.equal(tally.statuses[429] ?? 0, REQUESTS - CAPACITY, 'the rest are limited')
})

t.test('with leases of 5 tokens, never more than 50 pass', async (t) => {
  const tally = await hammer(servers, '/leased')
  t.comment(`leased: ${JSON.stringify(tally.statuses)}, admitted per server ${tally.admittedBy.join('/')}`)
  t.ok((tally.statuses[200] ?? 0) <= CAPACITY, `${tally.statuses[200] ?? 0} admitted: never more than the capacity`)
  t.equal(tally.statuses[503] ?? 0, 0, 'no store failure')
  // Every token goes into some server's lease in the first wave of calls,
  // and each server still has most of its 100 requests to come, which spend
  // the lease: all 50 are used.
  t.equal(tally.statuses[200] ?? 0, CAPACITY, 'and the leases are spent: exactly 50')
})

t.test('the same load through GET-compute-SET admits more than 50', async (t) => {
  // First, one request at a time: the naive limiter counts right when
  // nothing runs concurrently, so what follows is the race and nothing else.
  let serial = 0
  for (let i = 0; i < CAPACITY + 10; i++) {
    if (await get(servers[i % SERVERS] as Server, '/naive-serial') === 200) serial++
  }
  t.equal(serial, CAPACITY, `one at a time: ${serial} of ${CAPACITY + 10} admitted`)

  const started = Date.now()
  const tally = await hammer(servers, '/naive')
  t.comment(`naive: ${JSON.stringify(tally.statuses)}, admitted per server ${tally.admittedBy.join('/')}, ${Date.now() - started} ms`)
  t.ok((tally.statuses[200] ?? 0) > CAPACITY, `over-admits: ${tally.statuses[200] ?? 0} > ${CAPACITY}`)
  t.equal((tally.statuses[200] ?? 0) + (tally.statuses[429] ?? 0), REQUESTS, 'every request got an answer')
})
