// The circuit breaker during an outage, counted on the Redis side: the
// calls that reach a frozen or blackholed Redis are the breaker's failures
// and one probe per cool-down, whatever the traffic; their late replies are
// ignored; the tokens their scripts spend when Redis gets to them are that
// same small number. And a 503's Retry-After follows the cool-down.
//
// Deadline: TIMEOUT_MS = 250, one a live Redis meets even on this busy
// 2-core machine: a deadline missed while Redis is healthy would send one
// more script that spends a token, and spoil the exact counts below. The
// deadline itself is tested in test/failure-modes.test.ts.

import diagnostics from 'node:diagnostics_channel'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import type { Decision } from '../lib/index.js'
import { buildApp } from './helpers/app.js'
import { faultClient as client, ownServer, startLoad } from './helpers/load.js'
import { startProxy } from './helpers/proxy.js'
import { infoField, redisCommand, type RedisServer, type TeardownTarget } from './helpers/redis.js'

const TIMEOUT_MS = 250
/** Not the defaults (5 and 1000 ms), so the test also shows the options are used. */
const BREAKER = { failures: 3, cooldownMs: 500 }
const OUTAGE_MS = 4000
const CAPACITY = 100



/** Breaker states published on 'tollgate:breaker' while the test runs. */
function watchBreaker (t: TeardownTarget): Array<{ state: string, at: number }> {
  const states: Array<{ state: string, at: number }> = []
  const listener = (message: unknown): void => { states.push({ state: (message as { state: string }).state, at: performance.now() }) }
  diagnostics.subscribe('tollgate:breaker', listener)
  t.teardown(() => diagnostics.unsubscribe('tollgate:breaker', listener))
  return states
}

/** Script calls Redis has executed since the last CONFIG RESETSTAT. */
async function scriptCalls (server: RedisServer): Promise<number> {
  const stats = await redisCommand(server, ['INFO', 'commandstats'])
  let calls = 0
  for (const command of ['evalsha', 'eval']) {
    const match = /^calls=(\d+),/.exec(infoField(stats, `cmdstat_${command}`) ?? '')
    calls += Number(match?.[1] ?? 0)
  }
  return calls
}

async function openApp (t: TeardownTarget, redis: Redis): Promise<FastifyInstance> {
  const { app } = await buildApp(t, {
    plugin: { redis, capacity: CAPACITY, refillPerSecond: 0.001, failureMode: 'open', timeout: TIMEOUT_MS, breaker: BREAKER },
    routes: (app) => { app.get('/x', async (request) => request.rateLimit) }
  })
  return app
}

async function decide (app: FastifyInstance): Promise<Decision> {
  const res = await app.inject('/x')
  return res.json() as Decision
}

/** Requests one after another until Redis decides one; at most `withinMs`. */
async function untilStore (t: Test, app: FastifyInstance, withinMs: number): Promise<Decision | undefined> {
  const from = performance.now()
  while (performance.now() - from < withinMs) {
    const decision = await decide(app)
    if (decision.source === 'store') return decision
    await sleep(20)
  }
  t.fail(`Redis decided nothing within ${withinMs} ms`)
  return undefined
}

interface Outage {
  requests: number
  /** Requests that waited for a deadline (the calls that reached Redis) and those decided at once. */
  waited: number
  sources: Set<string>
}

/** Sequential traffic (one request in flight at a time) for `ms`. */
async function sequentialLoad (app: FastifyInstance, ms: number): Promise<Outage> {
  const outage: Outage = { requests: 0, waited: 0, sources: new Set() }
  const load = startLoad({
    ratePerSecond: 50,
    concurrency: 1,
    send: () => decide(app),
    onResult: (r) => {
      outage.requests++
      if (r.latencyMs >= TIMEOUT_MS - 1) outage.waited++
      outage.sources.add(r.value?.source ?? 'rejected')
    }
  })
  await sleep(ms)
  await load.stop()
  return outage
}

t.test('a frozen Redis receives only the breaker\'s calls; their late replies are ignored, their tokens bounded', async (t) => {
  const server = await ownServer(t)
  const redis = client(t, server.url)
  const app = await openApp(t, redis)
  t.match(await decide(app), { source: 'store', remaining: CAPACITY - 1 }, 'warm-up: decided by Redis')
  const breaker = watchBreaker(t)
  await redisCommand(server, ['CONFIG', 'RESETSTAT'])

  server.pause()
  t.teardown(() => server.resume())
  const outage = await sequentialLoad(app, OUTAGE_MS)
  t.same([...outage.sources], ['fail-open'], `all ${outage.requests} requests during the freeze failed open`)
  server.resume()
  // PING queues behind every script sent during the freeze: once it is
  // answered, Redis has run them all and their late replies have arrived.
  await redis.ping()

  const probes = breaker.filter((b) => b.state === 'half-open').length
  const reached = await scriptCalls(server)
  const bound = BREAKER.failures + Math.ceil(OUTAGE_MS / BREAKER.cooldownMs)
  t.ok(probes >= 1, `the breaker let ${probes} probes through`)
  t.equal(reached, BREAKER.failures + probes, `the ${reached} scripts that reached Redis are the ${BREAKER.failures} failures that opened the breaker and its ${probes} probes`)
  t.ok(reached <= bound, `${reached} calls for ${outage.requests} requests: at most failures + one probe per cool-down (${bound})`)
  t.equal(outage.waited, reached, 'exactly those requests waited for the deadline; every other one was decided at once')

  t.same(breaker.map((b) => b.state).filter((s) => s === 'closed'), [], 'the late replies closed nothing')
  t.equal(app.tollgate.limiter.state, 'failing', 'and did not count as a recovery: they were ignored')

  // Each of those scripts spent a token when Redis got to it, although its
  // request had already been answered (fail-open). That is the cost
  // docs/guides/failure-modes.md states ("Late replies are ignored, but a
  // late script still runs"), and the breaker bounds it.
  const after = await untilStore(t, app, BREAKER.cooldownMs + TIMEOUT_MS + 500)
  const spentLate = CAPACITY - 1 - 1 - (after?.remaining ?? NaN)
  t.equal(spentLate, reached, `the late scripts spent ${spentLate} tokens: one per call that reached Redis, none for the other requests`)
  t.equal(breaker.at(-1)?.state, 'closed', 'the breaker closed on the first successful probe')
})

t.test('a blackholed Redis (commands run, replies lost): the same bound, and ioredis resends the unanswered ones', async (t) => {
  const server = await ownServer(t)
  const proxy = await startProxy(server.url)
  t.teardown(() => proxy.close())
  const redis = client(t, proxy.url)
  const app = await openApp(t, redis)
  t.match(await decide(app), { source: 'store', remaining: CAPACITY - 1 }, 'warm-up: decided by Redis')
  const breaker = watchBreaker(t)
  await redisCommand(server, ['CONFIG', 'RESETSTAT'])

  proxy.blackhole()
  const outage = await sequentialLoad(app, OUTAGE_MS)
  t.same([...outage.sources], ['fail-open'], `all ${outage.requests} requests during the outage failed open`)
  const probes = breaker.filter((b) => b.state === 'half-open').length
  const reached = await scriptCalls(server)
  const bound = BREAKER.failures + Math.ceil(OUTAGE_MS / BREAKER.cooldownMs)
  t.equal(reached, BREAKER.failures + probes, `${reached} scripts ran: the ${BREAKER.failures} failures and ${probes} probes`)
  t.ok(reached <= bound, `${reached} calls for ${outage.requests} requests (bound ${bound})`)

  // The repair resets the connections that lost replies. ioredis, with its
  // default autoResendUnfulfilledCommands, sends every command it never got
  // a reply for again on the new connection, so each of these scripts runs
  // a second time: twice the breaker's calls, still bounded by it.
  proxy.reset()
  const after = await untilStore(t, app, BREAKER.cooldownMs + TIMEOUT_MS + 2000)
  await redis.ping()
  const ran = await scriptCalls(server)
  const spentLate = CAPACITY - 1 - 1 - (after?.remaining ?? NaN)
  t.equal(ran - 1, 2 * reached, `${ran - 1} script runs besides the recovery's own: each of the ${reached} ran twice`)
  t.equal(spentLate, 2 * reached, `the lost-reply scripts spent ${spentLate} tokens, twice the ${reached} calls, still bounded by the breaker`)
})

t.test('a 503\'s Retry-After is the breaker\'s remaining cool-down, at least 1 s', async (t) => {
  const server = await ownServer(t)
  const redis = client(t, server.url)
  const cooldownMs = 3000
  const { app } = await buildApp(t, {
    plugin: { redis, capacity: CAPACITY, refillPerSecond: 1, failureMode: 'closed', timeout: TIMEOUT_MS, breaker: { failures: 1, cooldownMs } },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  t.equal((await app.inject('/x')).statusCode, 200, 'warm-up')
  const breaker = watchBreaker(t)
  await server.kill()
  // Disconnected: each call fails at once, and one failure opens the breaker.
  while (redis.status === 'ready') await sleep(5)
  const retryAt = async (): Promise<{ seconds: number, leftMs: number }> => {
    const res = await app.inject('/x')
    t.equal(res.statusCode, 503, 'closed: 503')
    const opened = breaker.filter((b) => b.state === 'open').at(-1)?.at ?? NaN
    return { seconds: Number(res.headers['retry-after']), leftMs: opened + cooldownMs - performance.now() }
  }
  const first = await retryAt()
  t.equal(breaker.map((b) => b.state).join(), 'open', 'the first failure opened the breaker')
  t.equal(first.seconds, 3, `right after it opened: Retry-After 3 s (${first.leftMs.toFixed(0)} ms of cool-down left)`)
  // Asked again with 1.5 s and 0.5 s left: the middle of a second, so
  // scheduling noise below 500 ms cannot change the rounded value.
  await sleep(first.leftMs - 1500)
  const middle = await retryAt()
  t.equal(middle.seconds, 2, `Retry-After 2 s with ${middle.leftMs.toFixed(0)} ms left`)
  await sleep(middle.leftMs - 500)
  const last = await retryAt()
  t.equal(last.seconds, 1, `Retry-After 1 s with ${last.leftMs.toFixed(0)} ms left: never 0`)
  t.equal(breaker.length, 1, 'the breaker stayed open throughout: no probe yet')
})
