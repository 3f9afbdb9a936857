// When the store sends a plain decision (lib/store/redis-store.ts, the
// class comment): at once when no decision call is in flight, batched
// behind the calls that are. A lone decision's call leaves in the turn it
// was asked, before a setImmediate scheduled right after it; decisions
// asked while a call is out go in one call once it returns; a queued
// decision's deadline counts from its own call being sent; and a decision
// never waits behind a slow call for longer than QUEUE_WAIT_MS: it is sent
// anyway, and falls back at its own deadline, not when the slow call ends.
// The script calls are seen on the real client (its sendCommand, wrapped
// to note each EVALSHA's number of keys) and in INFO commandstats.

import { Redis } from 'ioredis'
import t from 'tap'
import { createLimiter, type Decision, type Policy } from '../lib/index.js'
import { QUEUE_WAIT_MS, RedisStore, TOKEN_BUCKET, TOKEN_BUCKET_BATCH } from '../lib/store/redis-store.js'
import { uniquePrefix } from './helpers/app.js'
import { faultClient, ownServer } from './helpers/load.js'

const server = await ownServer(t)
const admin = new Redis(server.url)
t.teardown(() => admin.disconnect())

/** A client whose script calls are noted in `events` as they are issued: 'call <number of keys>'. */
async function client (t: { teardown(fn: () => unknown): void }, events: string[]): Promise<Redis> {
  const redis = faultClient(t, server.url)
  await redis.ping()
  for (const script of [TOKEN_BUCKET, TOKEN_BUCKET_BATCH]) await redis.script('LOAD', script.lua)
  const send = redis.sendCommand.bind(redis)
  redis.sendCommand = (command, stream) => {
    if (command.name === 'evalsha') events.push(`call ${String(command.args[1])}`)
    return send(command, stream)
  }
  return redis
}

const spec = (key: string): { key: string, capacity: number, refillPerSecond: number, cost: number } => ({ key, capacity: 50, refillPerSecond: 1e-6, cost: 1 })

function busy (ms: number): void {
  const until = performance.now() + ms
  while (performance.now() < until) { /* the app's own work */ }
}

const POLICY: Policy = { bucket: 'b', capacity: 50, refillPerSecond: 1e-6, failureMode: 'open' }

t.test('a lone decision\'s call is issued in the turn it was asked: before a setImmediate scheduled right after it', async (t) => {
  const events: string[] = []
  const redis = await client(t, events)
  const store = new RedisStore(redis)
  const prefix = uniquePrefix()
  // Scheduled first, it runs before any setImmediate the ask could schedule.
  setImmediate(() => { events.push('end of turn') })
  const reply = store.decide([spec(`${prefix}:{a}:b`)], true, () => { events.push('sent') })
  setImmediate(() => { events.push('end of turn') })
  t.match(await reply, { allowed: true, buckets: [{ remaining: 49 }] })
  t.same(events, ['sent', 'call 1', 'end of turn', 'end of turn'], 'sent and issued, one key (lua/token-bucket.lua), before the turn ended')

  const limiter = createLimiter({ redis, prefix, denialCache: false, timeout: 1000 })
  await limiter.ready
  events.length = 0
  setImmediate(() => { events.push('end of turn') })
  const decision = limiter.consume('c', POLICY)
  t.match(await decision, { allowed: true, remaining: 49, source: 'store' })
  t.same(events, ['call 1', 'end of turn'], 'through the limiter too')
  await limiter.close()
})

t.test('decisions asked while a call is out wait for it, then go in one call', async (t) => {
  const events: string[] = []
  const redis = await client(t, events)
  const store = new RedisStore(redis)
  const prefix = uniquePrefix()
  const first = store.decide([spec(`${prefix}:{a}:b`)], true, () => { events.push('a sent') }).then(() => { events.push('a answered') })
  await Promise.resolve() // the microtask that sent it has run
  t.same(events, ['a sent', 'call 1'], 'the first went at once')
  // The loop is held until the first call's reply waits in the socket:
  // it is read before the queue's wait (QUEUE_WAIT_MS, armed only below)
  // can be over, whatever the machine's load, so the queue goes on the reply.
  busy(50)
  const queued = ['b', 'c', 'd'].map((id) => store.decide([spec(`${prefix}:{${id}}:b`)], true, () => { events.push(`${id} sent`) }))
  queueMicrotask(() => { queued.push(store.decide([spec(`${prefix}:{e}:b`)], true, () => { events.push('e sent') })) })
  t.same(events, ['a sent', 'call 1'], 'asked while it was out: none sent yet')
  await first
  const replies = await Promise.all(queued)
  t.same(events, ['a sent', 'call 1', 'a answered', 'b sent', 'c sent', 'd sent', 'e sent', 'call 4'],
    'sent once the first call returned, the four in one call (lua/token-bucket-batch.lua, four keys)')
  t.same(replies.map((r) => r.allowed), [true, true, true, true])
})

t.test('a queued decision\'s deadline counts from its call being sent, not from its ask', async (t) => {
  const events: string[] = []
  const redis = await client(t, events)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 20, denialCache: false })
  await limiter.ready
  await limiter.consume('warm', POLICY)
  for (let round = 0; round < 3; round++) {
    events.length = 0
    const first = limiter.consume('a', POLICY)
    await Promise.resolve()
    const queued: Array<Promise<Decision>> = []
    for (let i = 0; i < 5; i++) queued.push(limiter.consume(`q${i}`, POLICY))
    // Three deadlines of the app's own work while the five wait in the queue.
    busy(60)
    const decisions = await Promise.all([first, ...queued])
    t.same(decisions.map((d) => d.source), Array.from({ length: 6 }, () => 'store'), `round ${round + 1}: every decision is Redis's`)
    t.same(events, ['call 1', 'call 5'], 'the first at once, the five queued behind it in one call')
  }
  await limiter.close()
})

t.test('behind a call that does not return, the queue goes anyway after QUEUE_WAIT_MS, and falls back at its own deadline', async (t) => {
  t.ok(QUEUE_WAIT_MS > 0 && QUEUE_WAIT_MS <= 5, `QUEUE_WAIT_MS is a few milliseconds (${QUEUE_WAIT_MS})`)
  const events: string[] = []
  const redis = await client(t, events)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 100, denialCache: false, breaker: { failures: 100, cooldownMs: 1000 } })
  await limiter.ready
  await limiter.consume('warm', POLICY)
  events.length = 0
  // Redis answers nothing for 600 ms: the first call is out all that time.
  await admin.client('PAUSE', 600, 'ALL')
  const pausedAt = performance.now()
  const first = limiter.consume('a', POLICY)
  await new Promise((resolve) => setImmediate(resolve))
  const askedAt = performance.now()
  const second = await limiter.consume('b', POLICY)
  const waited = performance.now() - askedAt
  t.equal(second.source, 'fail-open', 'the queued decision missed its deadline')
  // Its own deadline (100 ms) from a send QUEUE_WAIT_MS after the ask; the
  // slow call returns 600 ms after the pause began. Tolerance: 250 ms of a
  // loaded machine's scheduling.
  t.ok(waited < 350, `decided ${waited.toFixed(1)} ms after its ask, long before the slow call returns`)
  t.ok(performance.now() - pausedAt < 550, 'while Redis was still paused')
  t.same(events, ['call 1', 'call 1'], 'the queue was sent while the first call was out')
  t.equal((await first).source, 'fail-open')
  await limiter.close()
})
