// One app server of the fleet demo: Fastify with the tollgate plugin and its
// own ioredis client, in its own process. demo.js forks several of these;
// they share their limits through one Redis (or one Redis Cluster) only.
//
// Configured by demo.js through the environment:
//   FLEET_NAME       this server's name
//   REDIS_URL        a single Redis, or
//   REDIS_CLUSTER    a Cluster's nodes, "host:port,host:port,..."
//   FLEET_PREFIX     Redis key prefix of this run
//   FLEET_CAPACITY, FLEET_REFILL   the limit
// Tells its parent its port over IPC once it listens; stops on 'stop' or
// when the parent goes away.
import Fastify from 'fastify'
import { Cluster, Redis } from 'ioredis'
import tollgate from 'tollgate'

const env = process.env
const name = env.FLEET_NAME ?? `server-${process.pid}`

const redis = env.REDIS_CLUSTER !== undefined
  ? new Cluster(env.REDIS_CLUSTER.split(',').map((node) => {
    const [host, port] = node.split(':')
    return { host, port: Number(port) }
  }), {
    // Nothing waits in memory while the cluster is not ready; tollgate then
    // follows its failure mode at once.
    enableOfflineQueue: false,
    // Learn of a failover even while the old master hangs.
    slotsRefreshInterval: 1000
  })
  : new Redis(env.REDIS_URL, { enableOfflineQueue: false, maxRetriesPerRequest: 1 })
redis.on('error', () => {}) // failures show as failure-mode decisions, counted by the demo

const app = Fastify()
await app.register(tollgate, {
  redis,
  prefix: env.FLEET_PREFIX,
  capacity: Number(env.FLEET_CAPACITY),
  refillPerSecond: Number(env.FLEET_REFILL),
  // A store failure answers 503: the demo counts it, so it can never pass
  // for an admission.
  failureMode: 'closed',
  // Loopback Redis; generous for a laptop busy running a whole fleet.
  timeout: 250,
  // One client, whichever server it reaches: the x-client header.
  key: (request) => String(request.headers['x-client'] ?? 'anonymous')
})
app.get('/api', { config: { rateLimit: { bucket: 'api' } } }, async () => ({ server: name }))

await app.listen({ host: '127.0.0.1', port: 0 })

let stopping
function stop () {
  stopping ??= app.close().then(() => {
    redis.disconnect()
    process.disconnect?.()
  })
  return stopping
}
process.on('message', (message) => { if (message === 'stop') stop() })
process.on('disconnect', stop)
process.on('SIGINT', stop) // Ctrl-C reaches the whole process group: the demo stops us
process.send?.({ port: app.server.address().port })
