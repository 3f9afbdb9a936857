// A mixed fleet: two Fastify processes with the plugin, two Express
// processes with tollgate/express, two Hono processes with tollgate/hono
// and two Nest processes with tollgate/nest (one on each of its
// platforms), each with its own ioredis client, on one Redis and one
// bucket of capacity 50. Each process first admits one request, so that
// every framework spends from the bucket; then 800 requests of the same
// client are sent at once, 100 to each process (each process's HTTP agent keeps up to 16 in flight, so
// 128 are in flight at a time). The bucket refills 0.001 token/s,
// less than 0.01 token over the whole run, so the fleet must admit exactly
// 50 in all: any more means two adapters spent the last token twice (or keyed the
// bucket differently), any fewer that a decision was lost. failureMode
// 'closed' with a 2 s deadline: a slow store would show as a 503, never as
// an extra 200, and no 503 is expected.

import t from 'tap'
import { uniquePrefix } from './helpers/app.js'
import { startFleetServer, type FleetServer, type FleetServerConfig } from './helpers/fleet.js'
import { redisUrl } from './helpers/redis.js'

const CAPACITY = 50
const PER_SERVER = 100

const url = await redisUrl(t)

t.test('2 Fastify + 2 Express + 2 Hono + 2 Nest processes, one bucket of 50, 800 requests at once: exactly 50 admitted', async (t) => {
  const base: FleetServerConfig = {
    name: '',
    stores: { single: { url } },
    prefix: uniquePrefix(),
    bucket: 'mixed',
    capacity: CAPACITY,
    refillPerSecond: 0.001,
    failureMode: 'closed',
    timeout: 2000
  }
  const servers: FleetServer[] = await Promise.all([
    startFleetServer(t, { ...base, name: 'fastify-1', framework: 'fastify' }),
    startFleetServer(t, { ...base, name: 'fastify-2', framework: 'fastify' }),
    startFleetServer(t, { ...base, name: 'express-1', framework: 'express' }),
    startFleetServer(t, { ...base, name: 'express-2', framework: 'express' }),
    startFleetServer(t, { ...base, name: 'hono-1', framework: 'hono' }),
    startFleetServer(t, { ...base, name: 'hono-2', framework: 'hono' }),
    startFleetServer(t, { ...base, name: 'nest-express', framework: 'nest-express' }),
    startFleetServer(t, { ...base, name: 'nest-fastify', framework: 'nest-fastify' })
  ])
  // One request to each process first, one after the other: each framework
  // spends from the bucket (the burst below may well be won by the fastest).
  const first: string[] = []
  for (const server of servers) first.push(`${server.name} ${(await server.get('/single/hit', { 'x-client': 'mixed' })).status}`)
  t.same(first, servers.map((server) => `${server.name} 200`), 'each process admits its first request')
  const replies = await Promise.all(servers.flatMap((server) =>
    Array.from({ length: PER_SERVER }, async () => ({ server: server.name, reply: await server.get('/single/hit', { 'x-client': 'mixed' }) }))))
  const statuses: Record<number, number> = {}
  const admittedBy: Record<string, number> = {}
  for (const { server, reply } of replies) {
    statuses[reply.status] = (statuses[reply.status] ?? 0) + 1
    if (reply.status === 200) admittedBy[server] = (admittedBy[server] ?? 0) + 1
  }
  t.comment(`admitted per server in the burst: ${JSON.stringify(admittedBy)}`)
  const rest = CAPACITY - servers.length
  t.same(statuses, { 200: rest, 429: servers.length * PER_SERVER - rest },
    `with ${servers.length} tokens spent first, exactly ${rest} of ${servers.length * PER_SERVER} admitted, the rest denied: ${JSON.stringify(statuses)}`)
})
