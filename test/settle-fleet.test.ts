// Charging by outcome across a fleet: four app servers in separate
// processes (test/helpers/fleet-server.ts, route GET /redis/settle) take
// one client's requests concurrently, each reserving a random cost and
// settling at a random actual cost (refunds, exact, extra charges), all on
// one bucket in one Redis.
//
// What must hold:
// - The final state equals the model's. The first request reserves and
//   settles the whole capacity, so the bucket is empty from there on;
//   drained far faster than it refills, it is never full again nor down to
//   -capacity, and every refund is given in full: a reservation's part of
//   the bucket lies a whole window's refill, less the few reservations in
//   flight, below the bucket's top (lua/settle.lua cuts only refunds whose
//   part has refilled). So its full-at time is the first request's clock
//   plus the sum of every admitted request's actual cost, in microseconds
//   of refill, whatever the order of the reserves and settlements (each is
//   one atomic call). Tolerance: the first request's clock is known between
//   two Redis TIME readings around it, and each write rounds the full-at
//   time up by less than 1 us.
// - No window admits more settled cost than capacity + refill x window,
//   plus the debt the bucket may still hold at the window's end: extra
//   charges settle after the response, so the requests still settling
//   (at most one per worker, WORKERS in all, each at most MAX_EXTRA over
//   its reservation) can owe at most WORKERS x MAX_EXTRA tokens, which the
//   bucket then collects by making later requests wait.

import t from 'tap'
import { Redis } from 'ioredis'
import { uniquePrefix } from './helpers/app.js'
import { startFleet, type Reply } from './helpers/fleet.js'
import { randomSource } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'
import { fleetKey } from './helpers/keys.js'

const SERVERS = 4
const PER_SERVER = 2
const WORKERS = SERVERS * PER_SERVER
const CAPACITY = 200
const REFILL = 100
const T_US = 1e6 / REFILL
const MAX_EXTRA = 2
/** How long requests are sent, ms: long enough for the refill to matter. */
const RUN_MS = 3000

const seed = Number(process.env.TOLLGATE_SEED ?? Math.floor(Math.random() * 2 ** 31))
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)
const random = randomSource(seed)

const url = await redisUrl(t)
const redis = new Redis(url)
t.teardown(() => { redis.disconnect() })
const prefix = uniquePrefix()
const servers = await startFleet(t, SERVERS, {
  name: 'settle',
  stores: { redis: { url } },
  prefix,
  bucket: 'settled',
  capacity: CAPACITY,
  refillPerSecond: REFILL,
  failureMode: 'closed',
  timeout: 2000
})
// The servers' start-up created the fleet's key secret.
const key = await fleetKey(redis, prefix, 'fleet', 'settled')

interface Sent { reply: Reply, cost: number, actual: number }

function draw (): { cost: number, actual: number } {
  const cost = 1 + Math.floor(random() * 3)
  const kind = random()
  const actual = kind < 0.3 ? 0 : kind < 0.45 ? cost / 2 : kind < 0.7 ? cost : cost + (1 + Math.floor(random() * 2 * MAX_EXTRA)) / 2
  return { cost, actual }
}

async function send (index: number, cost: number, actual: number): Promise<Sent> {
  const server = servers[index % SERVERS] as (typeof servers)[number]
  const reply = await server.get('/redis/settle', { 'x-cost': String(cost), 'x-actual': String(actual) })
  return { reply, cost, actual }
}

async function redisNow (): Promise<number> {
  const [s, us] = await redis.time()
  return Number(s) * 1e6 + Number(us)
}

async function settledCount (): Promise<number> {
  const counts = await Promise.all(servers.map(async (s) => JSON.parse((await s.get('/settled')).body).settled as number))
  return counts.reduce((a, b) => a + b, 0)
}

t.test('four processes reserving and settling on one bucket end in the model\'s state, within the bound', async (t) => {
  for (const server of servers) await server.get('/clock')
  const before = await redisNow()
  const first = await send(0, CAPACITY, CAPACITY)
  const after = await redisNow()
  t.equal(first.reply.status, 200)

  const results: Sent[] = [first]
  const end = performance.now() + RUN_MS
  await Promise.all(Array.from({ length: WORKERS }, async (_, worker) => {
    while (performance.now() < end) {
      const { cost, actual } = draw()
      results.push(await send(worker, cost, actual))
    }
  }))
  const admitted = results.filter((r) => r.reply.status === 200)
  t.equal(results.filter((r) => r.reply.status !== 200 && r.reply.status !== 429).length, 0, 'only 200s and 429s')
  for (let i = 0; ; i++) {
    if (await settledCount() >= admitted.length) break
    if (i > 200) throw new Error('settlements did not finish')
    await new Promise((resolve) => setTimeout(resolve, 20))
  }

  // Final state.
  const [fullAt, now] = await Promise.all([redis.get(key), redisNow()])
  const total = admitted.reduce((sum, r) => sum + r.actual, 0)
  const writes = admitted.length * 2
  const low = before + total * T_US
  const high = after + total * T_US + writes
  const got = Number(fullAt)
  t.comment(`${admitted.length} admitted of ${results.length}, settled cost ${total}, ${admitted.filter((r) => r.actual > r.cost).length} extra charges, ${admitted.filter((r) => r.actual < r.cost).length} refunds`)
  t.ok(got >= low && got <= high, `full-at time ${got} within [${low}, ${high}] (the model's, with the first request's clock known to ${after - before} us)`)
  t.ok(got - now <= 2 * CAPACITY * T_US, 'never past the debt limit, so the model holds')
  t.ok(admitted.length >= 30 && results.length - admitted.length >= 30, 'both admitted and denied requests')

  // Windows: every admitted request opens one, of several lengths.
  let worst = -Infinity
  const sorted = admitted.map((r) => r.reply).sort((a, b) => a.sentAt - b.sentAt)
  const bySent = admitted.slice().sort((a, b) => a.reply.sentAt - b.reply.sentAt)
  for (const windowMs of [250, 1000, 4000]) {
    for (const opening of sorted) {
      const end = opening.sentAt + windowMs
      let cost = 0
      for (const r of bySent) if (r.reply.sentAt >= opening.sentAt && r.reply.doneAt <= end) cost += r.actual
      const bound = CAPACITY + REFILL * windowMs / 1000 + WORKERS * MAX_EXTRA
      worst = Math.max(worst, cost - bound)
    }
  }
  t.ok(worst <= 0, `no window admits more than capacity + refill x window + the most debt in flight (worst margin ${worst.toFixed(2)})`)
})
