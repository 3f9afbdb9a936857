// Charging by outcome with reservations that outlive the window: four app
// servers in separate processes (test/helpers/fleet-server.ts, route
// GET /redis/settle) share one bucket of one client in one Redis. Some
// requests reserve a large cost and hold it for 0.1 to 1 s (the bucket
// refills from empty in 0.5 s) before they settle at a fraction of it or at
// nothing; the others reserve a small cost and settle at it at once.
//
// What must hold: no window, of any length and wherever it starts, admits
// more settled cost than capacity + refill x window (every actual cost is at
// most its reservation, so there is no debt to add). A refund that arrives
// after the bucket has refilled past the reservation must not give those
// tokens back a second time.
//
// How a window is measured from outside: a request is admitted while its
// reserve runs in Redis, between the moment it was sent and the moment its
// answer came back less the time its handler held it; it counts in a window
// only if that whole interval lies inside the window, so a count can only
// be too low, never too high.

import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { uniquePrefix } from './helpers/app.js'
import { startFleet, type Reply } from './helpers/fleet.js'
import { randomSource } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'

const SERVERS = 4
const CAPACITY = 10
const REFILL = 20
/** The bucket refills from empty in WINDOW_MS. */
const WINDOW_MS = 1000 * CAPACITY / REFILL
/** Rounds of ROUND_MS: holders at its start, spenders for SPEND_MS, then quiet until the bucket is full again. */
const ROUNDS = 5
const ROUND_MS = 1700
const SPEND_MS = 1100
/** Window lengths checked, ms, each opened at every admitted request. */
const WINDOWS_MS = [100, 250, 500, 1000, 2000]

const seed = Number(process.env.TOLLGATE_SEED ?? Math.floor(Math.random() * 2 ** 31))
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)
const random = randomSource(seed)

const url = await redisUrl(t)
const servers = await startFleet(t, SERVERS, {
  name: 'lifetime',
  stores: { redis: { url } },
  prefix: uniquePrefix(),
  bucket: 'held',
  capacity: CAPACITY,
  refillPerSecond: REFILL,
  failureMode: 'closed',
  timeout: 2000
})

interface Sent { reply: Reply, cost: number, actual: number, holdMs: number }

async function until (at: number): Promise<void> {
  const wait = at - performance.now()
  if (wait > 0) await sleep(wait)
}

async function send (server: (typeof servers)[number], cost: number, actual: number, holdMs: number): Promise<Sent> {
  const headers: Record<string, string> = { 'x-cost': String(cost), 'x-actual': String(actual) }
  if (holdMs > 0) headers['x-hold-ms'] = String(holdMs)
  return { reply: await server.get('/redis/settle', headers), cost, actual, holdMs }
}

t.test('reservations held past a refill and then refunded: no window admits more than capacity + refill x window', async (t) => {
  for (const server of servers) await server.get('/clock')
  const results: Sent[] = []
  const started = performance.now()
  for (let round = 0; round < ROUNDS; round++) {
    const from = started + round * ROUND_MS
    await until(from)
    await Promise.all(servers.flatMap((server) => [
      // One holder per server, at the start of the round, on a bucket refilled
      // by the quiet end of the last one: 3 to 5 tokens, held 0.1 to 1 s,
      // settled at nothing or at half.
      (async () => {
        while (performance.now() < from + 100) {
          const cost = 3 + Math.floor(random() * 3)
          const sent = await send(server, cost, random() < 0.5 ? 0 : cost / 2, Math.round(100 + random() * 900))
          results.push(sent)
          if (sent.reply.status === 200) return
          await sleep(5)
        }
      })(),
      // Two spenders per server, from a random moment after the bucket has
      // refilled what the holders took until SPEND_MS: 1 or 2 tokens, settled
      // at their cost at once. They spend the refilled bucket, then every
      // token it refills and every token a refund gives back.
      ...[0, 1].map(async () => {
        await until(from + WINDOW_MS + random() * 300)
        while (performance.now() < from + SPEND_MS) {
          const cost = 1 + Math.floor(random() * 2)
          const sent = await send(server, cost, cost, 0)
          results.push(sent)
          if (sent.reply.status !== 200) await sleep(2 + random() * 8)
        }
      })
    ]))
  }
  t.equal(results.filter((r) => r.reply.status !== 200 && r.reply.status !== 429).length, 0, 'only 200s and 429s')
  const admitted = results.filter((r) => r.reply.status === 200)
  const late = admitted.filter((r) => r.holdMs > WINDOW_MS && r.actual < r.cost)
  t.comment(`${admitted.length} admitted of ${results.length}; ${late.length} reservations refunded after more than a window`)
  t.ok(late.length >= 3, 'reservations refunded after outliving the window')
  t.ok(admitted.some((r) => r.holdMs > 0 && r.holdMs < WINDOW_MS && r.actual < r.cost), 'and some refunded within it')

  let worst = -Infinity
  let worstAt = ''
  const bySent = admitted.slice().sort((a, b) => a.reply.sentAt - b.reply.sentAt)
  for (const windowMs of WINDOWS_MS) {
    for (const opening of bySent) {
      const from = opening.reply.sentAt
      const to = from + windowMs
      let cost = 0
      for (const r of bySent) {
        if (r.reply.sentAt < from) continue
        if (r.reply.sentAt > to) break
        if (r.reply.doneAt - r.holdMs <= to) cost += r.actual
      }
      const margin = cost - (CAPACITY + REFILL * windowMs / 1000)
      if (margin > worst) {
        worst = margin
        worstAt = `${cost} of settled cost in a window of ${windowMs} ms (bound ${CAPACITY + REFILL * windowMs / 1000})`
      }
    }
  }
  t.comment(`worst window: ${worstAt}`)
  t.ok(worst <= 1e-9, `no window admits more than capacity + refill x window (worst: ${worstAt})`)
})
