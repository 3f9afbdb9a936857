// A master of a Redis Cluster (3 masters, 1 replica each, node timeout 1 s)
// goes away under steady traffic, once killed (its connections refused at
// once) and once paused (SIGSTOP: connections stay open, nothing answers,
// like a network partition). While its replica takes over:
// - the failure modes apply: an 'open' route answers 200 without RateLimit
//   headers, a 'closed' route answers 503 with Retry-After;
// - no request waits longer than the deadline plus a tolerance;
// - decisions come from the store again soon after the replica is promoted.
//
// Client options, chosen for the switch:
// - enableOfflineQueue: false: while the whole cluster is not ready,
//   commands fail at once instead of queueing (tollgate sends nothing then
//   anyway; this covers the app's own commands);
// - scaleReads: 'master' (the default, stated): the script writes, it must
//   run on the master;
// - slotsRefreshInterval: 1000: ioredis re-reads the slot map every second.
//   Without it, after a paused (not dead) master is replaced, the client
//   keeps sending that slot to the old master, whose socket stays open, and
//   never learns of the promotion until the old master answers again: every
//   decision for the slot fails until then. slotsRefreshTimeout: 1000 (the
//   default, stated): a refresh that asks the hung node first gives up on it
//   after 1 s and asks another;
// - redisOptions.commandTimeout: 1000: a command sent to a hung node is
//   dropped after 1 s instead of waiting in memory for as long as the node
//   hangs (tollgate has answered the request after `timeout` anyway);
// - connectTimeout: 1000: a connection attempt to a dead node gives up soon.
//
// Timing tolerances, on a shared 2-core machine:
// - deadline: TIMEOUT_MS is 250 ms, far above a healthy local reply, so a
//   busy machine does not turn healthy decisions into fallbacks (the test
//   wants every decision before the failure from the store). No request
//   takes longer than TIMEOUT_MS + 400 ms; the tolerance is timer and
//   scheduling lateness under load. What it must tell apart is a request
//   that waits for the failover itself (seconds) or for ioredis's internal
//   retries and command timeout (over 1 s; without the deadline the slowest
//   request here takes 1.1-1.3 s).
// - recovery: the last decision not from the store was made at most
//   RECOVERY_BOUND_MS after the promotion was visible in CLUSTER NODES:
//   up to one slot-refresh interval (1 s) and one refresh timeout (1 s, when
//   the refresh asks the hung node first) for the client to learn of it, up
//   to one breaker cool-down (1 s, the default) before the probe that closes
//   the breaker, and 1.5 s for everything on a busy machine.

import diagnostics from 'node:diagnostics_channel'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Cluster } from 'ioredis'
import t, { type Test } from 'tap'
import tollgate from '../lib/index.js'
import { uniquePrefix } from './helpers/app.js'
import { startCluster } from './helpers/cluster.js'
import type { RedisServer } from './helpers/redis.js'
import { keyUnder } from './helpers/keys.js'

const TIMEOUT_MS = 250
const DEADLINE_TOLERANCE_MS = 400
const SLOTS_REFRESH_MS = 1_000
const SLOTS_REFRESH_TIMEOUT_MS = 1_000
const COOLDOWN_MS = 1_000
const RECOVERY_BOUND_MS = SLOTS_REFRESH_MS + SLOTS_REFRESH_TIMEOUT_MS + COOLDOWN_MS + 1_500
/** One request per route every TICK_MS. */
const TICK_MS = 25
/** Traffic goes on this long after the last fallback, and all of it must be store decisions. */
const STEADY_AFTER_MS = 1_000

const cluster = await startCluster({ masters: 3, replicasPerMaster: 1, nodeTimeoutMs: 1_000 })
t.teardown(() => cluster.stop())

const ROUTES = ['open', 'closed'] as const
type Route = (typeof ROUTES)[number]

interface Seen {
  route: Route
  /** ms since the traffic started */
  at: number
  ms: number
  status: number
  source: string | undefined
  code: string | undefined
  headers: Record<string, unknown>
}

function client (t: Test): Cluster {
  const redis = cluster.client({
    enableOfflineQueue: false,
    scaleReads: 'master',
    slotsRefreshInterval: SLOTS_REFRESH_MS,
    slotsRefreshTimeout: SLOTS_REFRESH_TIMEOUT_MS,
    redisOptions: { connectTimeout: 1_000, commandTimeout: 1_000 }
  })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  return redis
}

/** Keys named with no read from Redis, so a test can name a client's key (and find its master) before any call. */
const KEY_SECRET = 'a key secret for these tests'

async function buildApp (t: Test, clientId: string): Promise<FastifyInstance> {
  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, {
    redis: client(t),
    prefix: uniquePrefix(),
    keySecret: KEY_SECRET,
    // Never limited: every answer other than a store 200 is the failure mode at work.
    capacity: 1e6,
    refillPerSecond: 1e3,
    failureMode: 'open',
    timeout: TIMEOUT_MS,
    breaker: { failures: 5, cooldownMs: COOLDOWN_MS },
    global: false,
    key: () => clientId
  })
  const handler = async (request: { rateLimit?: { source: string } }): Promise<{ source: string | undefined }> => ({ source: request.rateLimit?.source })
  app.get('/open', { config: { rateLimit: { bucket: 'open' } } }, handler)
  app.get('/closed', { config: { rateLimit: { bucket: 'closed', failureMode: 'closed' } } }, handler)
  await app.ready()
  return app
}

interface Traffic {
  /** Answers so far, in the order they arrived (sorted by `at` once stopped). */
  readonly seen: Seen[]
  readonly startedAt: number
  /** Sends no more, and resolves once every request sent has its answer. */
  stop(): Promise<Seen[]>
  /** Sends again after a stop. */
  resume(): void
}

/** One request per route every TICK_MS, without waiting for answers (open loop). */
function traffic (app: FastifyInstance): Traffic {
  const seen: Seen[] = []
  const pending = new Set<Promise<void>>()
  const startedAt = performance.now()
  const send = async (route: Route): Promise<void> => {
    const sent = performance.now()
    const res = await app.inject(`/${route}`)
    const ms = performance.now() - sent
    const body = res.json<{ source?: string, code?: string }>()
    seen.push({ route, at: sent - startedAt, ms, status: res.statusCode, source: body.source, code: body.code, headers: res.headers })
  }
  const tick = (): void => {
    for (const route of ROUTES) {
      const p = send(route)
      pending.add(p)
      void p.finally(() => pending.delete(p))
    }
  }
  let timer: NodeJS.Timeout | undefined = setInterval(tick, TICK_MS)
  return {
    seen,
    startedAt,
    async stop () {
      clearInterval(timer)
      timer = undefined
      await Promise.all(pending)
      return seen.sort((a, b) => a.at - b.at)
    },
    resume () {
      timer ??= setInterval(tick, TICK_MS)
    }
  }
}

async function waitFor (what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!await check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(50)
  }
}

const fromStore = (s: Seen): boolean => s.status === 200 && s.source === 'store'
const rateLimitHeaders = (s: Seen): string[] => Object.keys(s.headers).filter((h) => h.startsWith('ratelimit'))

async function failover (t: Test, clientId: string, how: 'kill' | 'pause'): Promise<void> {
  const app = await buildApp(t, clientId)
  // Every key of the client lives in the slot of its hash tag, whatever the prefix and bucket.
  const victim = await cluster.masterFor(keyUnder(KEY_SECRET, 'x', clientId, 'y'))
  const breakerEvents: string[] = []
  const onBreaker = (message: unknown): void => { breakerEvents.push((message as { state: string }).state) }
  diagnostics.subscribe('tollgate:breaker', onBreaker)
  t.teardown(() => diagnostics.unsubscribe('tollgate:breaker', onBreaker))

  // The client connects to a master on its first command there, and the
  // script is loaded on a node by its first call: warm both up before the
  // traffic that is measured.
  for (const route of ROUTES) {
    await waitFor(`a store decision on /${route}`, async () => {
      const res = await app.inject(`/${route}`)
      return res.statusCode === 200 && res.json<{ source?: string }>().source === 'store'
    }, 10_000)
  }
  const load = traffic(app)
  let downAt = 0
  let promotedAt = 0
  try {
    // Healthy traffic first.
    await sleep(500)
    downAt = performance.now() - load.startedAt
    if (how === 'kill') await victim.kill()
    else victim.pause()
    t.teardown(() => victim.resume())
    await waitFor('a replica to take over', async () => {
      const now = await cluster.masters()
      return now.length === 3 && !now.includes(victim)
    }, 30_000)
    promotedAt = performance.now() - load.startedAt
    // Let traffic run until it has been store-only for STEADY_AFTER_MS; give
    // up well past the bound. A request still in flight may yet turn out a
    // fallback (it answers at its deadline, after later requests did): so
    // the traffic is stopped, every answer awaited, and the run checked on
    // all of them; when a late one was a fallback, the traffic goes on.
    const giveUpAt = Date.now() + RECOVERY_BOUND_MS + STEADY_AFTER_MS + 5_000
    const steadySince = (): number => load.seen.filter((s) => !fromStore(s)).reduce((max, s) => Math.max(max, s.at), Math.max(downAt, promotedAt))
    for (;;) {
      await waitFor('decisions from the store again', async () => performance.now() - load.startedAt > steadySince() + STEADY_AFTER_MS, giveUpAt - Date.now())
      const stoppedAt = performance.now() - load.startedAt
      await load.stop()
      if (stoppedAt > steadySince() + STEADY_AFTER_MS) break
      load.resume()
    }
  } finally {
    await load.stop()
  }
  const seen = load.seen

  const before = seen.filter((s) => s.at + s.ms < downAt)
  const during = seen.filter((s) => s.at >= downAt)
  const fallbacks = during.filter((s) => !fromStore(s))
  const lastFallback = fallbacks.reduce((max, s) => Math.max(max, s.at), downAt)
  const slowest = seen.reduce((max, s) => Math.max(max, s.ms), 0)
  t.comment(`${how}: promotion visible ${(promotedAt - downAt).toFixed(0)} ms after the ${how}, ` +
    `last fallback ${(lastFallback - promotedAt).toFixed(0)} ms after it; ${seen.length} requests, ` +
    `${fallbacks.length} fallbacks, slowest ${slowest.toFixed(0)} ms; breaker: ${breakerEvents.join(' ')}`)

  t.ok(before.length >= 20 && before.every(fromStore), `before the ${how}: ${before.length} decisions, all from the store`)

  const open = during.filter((s) => s.route === 'open' && !fromStore(s))
  const closed = during.filter((s) => s.route === 'closed' && !fromStore(s))
  t.ok(open.length > 0 && closed.length > 0, `the switch was seen: ${open.length} open and ${closed.length} closed fallbacks`)
  t.ok(open.every((s) => s.status === 200 && s.source === 'fail-open' && rateLimitHeaders(s).length === 0),
    "'open': 200, no RateLimit headers (never a faked quota)")
  t.ok(closed.every((s) => s.status === 503 && s.code === 'TOLLGATE_UNAVAILABLE' && Number(s.headers['retry-after']) >= 1 &&
    rateLimitHeaders(s).length === 0), "'closed': 503 TOLLGATE_UNAVAILABLE with Retry-After")
  t.ok(seen.filter(fromStore).every((s) => rateLimitHeaders(s).length > 0), 'store decisions carry their headers')

  t.ok(slowest <= TIMEOUT_MS + DEADLINE_TOLERANCE_MS,
    `no request waited past the deadline: slowest ${slowest.toFixed(0)} ms <= ${TIMEOUT_MS} + ${DEADLINE_TOLERANCE_MS}`)

  t.ok(lastFallback - promotedAt <= RECOVERY_BOUND_MS,
    `store decisions resumed ${(lastFallback - promotedAt).toFixed(0)} ms after the promotion (bound ${RECOVERY_BOUND_MS} ms)`)
  // Everything after the last fallback is from the store by definition; it
  // must be a steady run, not the last request or two.
  const after = seen.filter((s) => s.at > lastFallback)
  for (const route of ROUTES) {
    const tail = after.filter((s) => s.route === route).length
    t.ok(tail >= STEADY_AFTER_MS / TICK_MS / 2, `'${route}': ${tail} store decisions in a row to the end`)
  }
  t.equal(app.tollgate.limiter.state, 'healthy', 'the limiter reports healthy again')
  t.equal(breakerEvents.at(-1), 'closed', 'the breaker closed again')
}

t.test('a master is killed: failure modes during the switch, the store after the promotion', async (t) => {
  await failover(t, 'kill-client', 'kill')
  // Bring the old master back (it rejoins as a replica) for the next test.
  const victim = cluster.nodes.find((n) => !n.running) as RedisServer
  await victim.restart()
  await cluster.waitHealthy()
})

t.test('a master hangs (paused): failure modes during the switch, the store after the promotion', async (t) => {
  await failover(t, 'pause-client', 'pause')
})
