// The diagnostics channels through an outage, on a redis-server of the
// test's own: 'tollgate:store' publishes the two state changes (failing,
// with the error; healthy, with the outage's length and its decisions per
// mode), 'tollgate:breaker' every open, half-open and close in a valid
// order, and 'tollgate:decision' one message per decision, the same
// decision the request got.
//
// Deadline: 250 ms, one a live Redis meets even on this busy 2-core
// machine, so that a missed deadline while Redis is healthy cannot add a
// state change to the exact sequences checked here.

import diagnostics from 'node:diagnostics_channel'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import t, { type Test } from 'tap'
import type { Decision } from '../lib/index.js'
import { buildApp } from './helpers/app.js'
import { MODES, faultClient as client, modeApp, ownServer, type Mode } from './helpers/load.js'
import type { TeardownTarget } from './helpers/redis.js'
import { fleetKey } from './helpers/keys.js'

const TIMEOUT_MS = 250
const COOLDOWN_MS = 1000
const OUTAGE_MS = 3500
const RECOVERY_TOLERANCE_MS = 500



interface Message { channel: string, message: Record<string, unknown> }

/** Every message on the three channels, in publication order, until the test ends. */
function subscribeAll (t: TeardownTarget): Message[] {
  const messages: Message[] = []
  for (const channel of ['tollgate:store', 'tollgate:breaker', 'tollgate:decision']) {
    const listener = (message: unknown): void => { messages.push({ channel, message: message as Record<string, unknown> }) }
    diagnostics.subscribe(channel, listener)
    t.teardown(() => diagnostics.unsubscribe(channel, listener))
  }
  return messages
}

/** What one request got: its status, source and body (the decision, on a 200). */
interface Reply { mode: Mode, status: number, source: string, body: unknown }

async function send (app: FastifyInstance, mode: Mode, clientId: string): Promise<Reply> {
  const res = await app.inject({ url: `/${mode}`, headers: { 'x-client': clientId } })
  return { mode, status: res.statusCode, source: String(res.headers['x-source']), body: res.json() }
}

/** Requests one after another, round-robin over the modes, for `ms`. */
async function sequential (app: FastifyInstance, clientId: string, ms: number, replies: Reply[]): Promise<void> {
  const until = performance.now() + ms
  for (let i = 0; performance.now() < until; i++) {
    replies.push(await send(app, MODES[i % MODES.length] as Mode, clientId))
    await sleep(10)
  }
}

/** Requests until Redis decides one, at most `ms`. */
async function untilStore (app: FastifyInstance, clientId: string, ms: number, replies: Reply[]): Promise<void> {
  const until = performance.now() + ms
  for (let i = 0; performance.now() < until; i++) {
    const reply = await send(app, MODES[i % MODES.length] as Mode, clientId)
    replies.push(reply)
    if (reply.source === 'store') return
    await sleep(10)
  }
}

function counts (replies: readonly Reply[]): Record<'local' | 'fail-open' | 'fail-closed', number> {
  const count = (source: string): number => replies.filter((r) => r.source === source).length
  return { local: count('local'), 'fail-open': count('fail-open'), 'fail-closed': count('fail-closed') }
}

/** Checks the 'tollgate:decision' messages against the replies, one for one. */
function checkDecisions (t: Test, messages: readonly Message[], replies: readonly Reply[], clientId: string): void {
  const decisions = messages.filter((m) => m.channel === 'tollgate:decision').map((m) => m.message)
  t.equal(decisions.length, replies.length, `one decision message per request (${replies.length})`)
  t.same(decisions.filter((d) => d.key !== clientId), [], `each with the client key ${clientId}`)
  const mismatched = replies.filter((reply, i) => {
    const decision = decisions[i]?.decision as Decision | undefined
    if (decision === undefined || decision.source !== reply.source) return true
    if (decision.allowed !== (reply.status === 200)) return true
    // On a 200 the route replies with request.rateLimit: the very decision.
    return reply.status === 200 && JSON.stringify(decision) !== JSON.stringify(reply.body)
  })
  t.same(mismatched, [], 'each the decision its request got, in order')
}

t.test('through a freeze: failing, breaker cycles, healthy with the counts; a decision message per request', async (t) => {
  const server = await ownServer(t)
  const redis = client(t, server.url)
  const { app } = await modeApp(t, { redis, timeout: TIMEOUT_MS })
  const messages = subscribeAll(t)
  const replies: Reply[] = []
  for (const mode of MODES) replies.push(await send(app, mode, 'diag'))
  t.same(replies.map((r) => r.source), ['store', 'store', 'store'], 'warm-up: decided by Redis')

  server.pause()
  const pausedAt = performance.now()
  t.teardown(() => server.resume())
  await sequential(app, 'diag', OUTAGE_MS, replies)
  server.resume()
  const resumedAt = performance.now()
  await untilStore(app, 'diag', COOLDOWN_MS + TIMEOUT_MS + RECOVERY_TOLERANCE_MS, replies)
  t.equal(replies.at(-1)?.source, 'store', 'Redis decides again after the freeze')

  const states = messages.filter((m) => m.channel !== 'tollgate:decision')
  const sequence = states.map((m) => `${m.channel.slice(9)}:${String(m.message.state)}`).join(' ')
  t.match(sequence, /^store:failing breaker:open( breaker:half-open breaker:open)* breaker:half-open breaker:closed store:healthy$/,
    'failing, the breaker opens, probes fail and reopen it, one succeeds and closes it, healthy')
  const probes = states.filter((m) => m.message.state === 'half-open').length
  t.ok(probes >= 2, `${probes} probes over a ${OUTAGE_MS} ms freeze with a ${COOLDOWN_MS} ms cool-down`)
  t.same(states.filter((m) => m.message.state === 'open').map((m) => m.message), Array(probes).fill({ state: 'open', cooldownMs: COOLDOWN_MS }),
    'each open names its cool-down')
  const [failing] = states
  t.match(failing?.message, { state: 'failing', error: { name: 'StoreError', code: 'TOLLGATE_STORE_TIMEOUT' } }, 'failing: with the error, a missed deadline')
  t.ok(failing?.message.error instanceof Error, 'an Error object')
  const healthy = states.at(-1)?.message
  t.same(healthy?.decisions, counts(replies), 'healthy: with the decisions each mode made meanwhile')
  const downMs = healthy?.downMs as number
  t.ok(downMs >= resumedAt - pausedAt - TIMEOUT_MS - 50 && downMs <= performance.now() - pausedAt,
    `healthy: downMs ${downMs} spans the freeze (${(resumedAt - pausedAt).toFixed(0)} ms)`)
  checkDecisions(t, messages, replies, 'diag')
})

t.test('through a kill and a restart: failing with a store-down error, healthy again', async (t) => {
  const server = await ownServer(t)
  const redis = client(t, server.url)
  const { app } = await modeApp(t, { redis, timeout: TIMEOUT_MS })
  const messages = subscribeAll(t)
  const replies: Reply[] = []
  for (const mode of MODES) replies.push(await send(app, mode, 'killed'))

  await server.kill()
  while (redis.status === 'ready') await sleep(5)
  await sequential(app, 'killed', 1500, replies)
  await server.restart()
  await untilStore(app, 'killed', 2 * COOLDOWN_MS + RECOVERY_TOLERANCE_MS, replies)
  t.equal(replies.at(-1)?.source, 'store', 'Redis decides again after the restart')

  const states = messages.filter((m) => m.channel === 'tollgate:store').map((m) => m.message)
  t.equal(states.length, 2, 'two state changes')
  t.match(states[0], { state: 'failing', error: { code: 'TOLLGATE_STORE_DOWN', message: /not connected/ } }, 'failing: the client is not connected')
  t.match(states[1], { state: 'healthy', downMs: Number }, 'healthy again')
  t.same(states[1]?.decisions, counts(replies), 'with the decisions made meanwhile')
  checkDecisions(t, messages, replies, 'killed')
})

t.test('decisions from the denial cache are published as such; denialCache: false asks Redis every time', async (t) => {
  const server = await ownServer(t)
  const redis = client(t, server.url)
  const messages = subscribeAll(t)
  const build = (denialCache?: false): Promise<{ app: FastifyInstance }> => buildApp(t, {
    plugin: { redis, capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: TIMEOUT_MS, key: () => 'cached', ...(denialCache === false ? { denialCache } : {}) },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  const sources = async (app: FastifyInstance): Promise<string[]> => {
    const before = messages.length
    for (let i = 0; i < 4; i++) await app.inject('/x')
    return messages.slice(before).map((m) => String((m.message.decision as Decision).source))
  }
  const cached = await build()
  t.same(await sources(cached.app), ['store', 'store', 'cache', 'cache'], 'a denial by Redis is then repeated from the cache')
  const uncached = await build(false)
  t.same(await sources(uncached.app), ['store', 'store', 'store', 'store'], 'without the cache every request is decided by Redis')
  t.same(messages.filter((m) => m.channel !== 'tollgate:decision'), [], 'no state change on the way')
})

t.test('the recovery counts only the outage\'s decisions, not earlier wrong-type fallbacks', async (t) => {
  const server = await ownServer(t)
  const redis = client(t, server.url)
  const { app, prefix } = await modeApp(t, { redis, timeout: TIMEOUT_MS })
  const messages = subscribeAll(t)
  await redis.hset(await fleetKey(redis, prefix, 'wrong', 'GET /open'), 'tokens', '5')
  for (let i = 0; i < 3; i++) t.equal((await send(app, 'open', 'wrong')).source, 'fail-open', 'a wrong-type key: fail-open, store healthy')
  t.same(messages.filter((m) => m.channel === 'tollgate:store'), [], 'no state change yet')

  await server.kill()
  while (redis.status === 'ready') await sleep(5)
  const replies: Reply[] = []
  await sequential(app, 'outage', 300, replies)
  await server.restart()
  await untilStore(app, 'outage', 2 * COOLDOWN_MS + RECOVERY_TOLERANCE_MS, replies)
  t.equal(replies.at(-1)?.source, 'store', 'Redis decides again after the restart')
  const healthy = messages.filter((m) => m.channel === 'tollgate:store').at(-1)?.message
  // A wrong-type fallback made while the store was healthy must not be
  // counted into the next outage's tally.
  t.same(healthy?.decisions, counts(replies), 'the decisions made during the outage, and only those')
})
