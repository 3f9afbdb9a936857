// A mixed fleet: one app server process per client family (ioredis,
// node-redis 6, 5 and 4, iovalkey, GLIDE), all on one bucket, once on one
// Redis and once on a 3-master Cluster. Under concurrent load over every
// server, the bucket admits exactly its capacity: the families send the
// same script with the same arguments, so one bucket is one bucket
// whichever client spends from it.

import t from 'tap'
import { uniquePrefix } from './helpers/app.js'
import { families, ioredisFamily } from './helpers/clients.js'
import { startCluster } from './helpers/cluster.js'
import { drive, startFleetServer, type FleetServer } from './helpers/fleet.js'
import { redisUrl } from './helpers/redis.js'

const CAPACITY = 100
const url = await redisUrl(t)
const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())

const fleetFamilies = [ioredisFamily, ...families.filter((f) => f.label !== 'node-redis 6 RESP2, database 3')]
const prefix = uniquePrefix()
const servers: FleetServer[] = await Promise.all(fleetFamilies.map((family) => startFleetServer(t, {
  name: family.label,
  stores: {
    single: family === ioredisFamily ? { url } : { url, family: family.label },
    cluster: family === ioredisFamily ? { cluster: cluster.startupNodes } : { cluster: cluster.startupNodes, family: family.label }
  },
  prefix,
  bucket: 'mixed',
  capacity: CAPACITY,
  // One token per 11.6 days: none comes back during the test.
  refillPerSecond: 1e-6,
  // Closed, with a deadline far above any reply here: a slow store turns
  // into 503s (too few admitted), never into extra 200s.
  failureMode: 'closed',
  timeout: 2000,
  denialCache: false
})))

for (const store of ['single', 'cluster']) {
  t.test(`${servers.length} processes, one per client family, on one bucket (${store === 'single' ? 'one Redis' : 'a Cluster'}): exactly the capacity`, async (t) => {
    const result = await drive(servers, { ms: 1500, concurrency: 8, path: `/${store}/hit`, headers: { 'x-client': `mixed-${store}` } })
    t.equal(result.statuses[200], CAPACITY, `exactly ${CAPACITY} of ${result.requests} admitted`)
    t.equal(result.statuses[503], undefined, 'none decided by the failure mode')
    for (const server of result.servers) t.ok((server.statuses[429] ?? 0) > 0, `${server.name} took part and was denied once the bucket was empty`)
    t.comment(result.servers.map((s) => `${s.name}: ${s.statuses[200] ?? 0} admitted`).join(', '))
  })
}
