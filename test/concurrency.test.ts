// Concurrency limits on a real Redis (SPEC 13, lua/concurrency.lua): at most
// `max` slots per client and bucket across several limiters (each with its
// own client, as app servers have), exact under a concurrent load that a
// read-then-write acquisition over-admits; a list with a rate policy taken
// all or nothing; release, renewal, a dead server's slots coming back
// within one lease, and the clock-step clamp of the script.

import { spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { createLimiter } from '../lib/index.js'
import { POLL_MS } from '../lib/core/slot-wait.js'
import type { ConcurrencyPolicy, Limiter, Policy } from '../lib/core/types.js'
import { uniqueTag } from './helpers/model.js'
import { naiveAcquire } from './helpers/naive.js'
import { redisUrl, startRedisServer, type TeardownTarget } from './helpers/redis.js'

const url = await redisUrl(t)
const prefix = `test:${uniqueTag('conc').replace(/[{}]/g, '')}`
const admin = new Redis(url)
t.teardown(() => admin.quit())

async function limiterOf (t: TeardownTarget, options: { timeout?: number } = {}): Promise<Limiter> {
  const redis = new Redis(url)
  const limiter = createLimiter({ redis, prefix, timeout: options.timeout ?? 1000 })
  t.teardown(async () => {
    await limiter.close()
    await redis.quit()
  })
  await limiter.ready
  return limiter
}

/** The slot set of `bucket` for `client` (the one key under the prefix that ends so). */
async function slotKey (bucket: string): Promise<string> {
  const keys = await admin.keys(`${prefix}:*:${bucket}!slots`)
  if (keys.length !== 1) throw new Error(`expected one slot set for ${bucket}, found ${keys.length}`)
  return keys[0] as string
}

const slots = (bucket: string, max: number, leaseMs?: number): ConcurrencyPolicy => ({ bucket, concurrency: leaseMs === undefined ? { max } : { max, leaseMs }, failureMode: 'closed' })

t.test('at most max slots, released once, a second release does nothing', async (t) => {
  const limiter = await limiterOf(t)
  const policy = slots('one', 2)
  const a = await limiter.acquire('client', policy)
  const b = await limiter.acquire('client', policy)
  const c = await limiter.acquire('client', policy)
  t.same([a.decision.allowed, b.decision.allowed, c.decision.allowed], [true, true, false])
  t.match(a.decision, { limit: 2, remaining: 1, source: 'store', bucket: 'one' })
  t.match(c.decision, { limit: 2, remaining: 0, retryAfterMs: 1000 })
  const key = await slotKey('one')
  t.equal(await admin.zcard(key), 2, 'two members: the held slots')
  const ttl = await admin.pttl(key)
  t.ok(ttl > 0 && ttl <= 60_000, `the key expires with the lease (${ttl} ms)`)
  await a.release()
  await a.release()
  t.equal(await admin.zcard(key), 1, 'one slot given back, once')
  await c.release()
  t.equal(await admin.zcard(key), 1, 'a denied acquisition holds nothing to give back')
  t.equal((await limiter.acquire('client', policy)).decision.allowed, true, 'the freed slot is taken again')
  t.equal((await limiter.acquire('other', policy)).decision.allowed, true, 'another client has slots of its own')
})

t.test('four limiters, 200 acquisitions at once: exactly max taken; a read-then-write acquisition takes more', async (t) => {
  const MAX = 5
  const limiters = await Promise.all([0, 1, 2, 3].map(async () => await limiterOf(t)))
  const policy = slots('race', MAX)
  const results = await Promise.all(Array.from({ length: 200 }, (_, i) => (limiters[i % 4] as Limiter).acquire('client', policy)))
  t.equal(results.filter((r) => r.decision.allowed).length, MAX, 'exactly max admitted')
  t.equal(await admin.zcard(await slotKey('race')), MAX, 'and max members in Redis')

  const clients = [0, 1, 2, 3].map(() => new Redis(url))
  t.teardown(() => Promise.all(clients.map((c) => c.quit())))
  const naiveKey = `${prefix}:naive`
  const naive = await Promise.all(Array.from({ length: 200 }, (_, i) => naiveAcquire(clients[i % 4] as Redis, naiveKey, MAX, randomUUID(), 60_000)))
  const taken = naive.filter(Boolean).length
  t.ok(taken > MAX, `the naive acquisition admits ${taken} for ${MAX} slots: the race this test catches`)
})

t.test('with a rate policy: all or nothing in one call', async (t) => {
  const limiter = await limiterOf(t)
  const rate: Policy = { bucket: 'rate', capacity: 2, refillPerSecond: 0.001, failureMode: 'closed' }
  const list = [rate, slots('pair', 1)]
  const first = await limiter.acquire('client', list)
  t.equal(first.decision.allowed, true)
  t.equal(first.decision.policies?.length, 2)
  const key = await slotKey('pair')
  const second = await limiter.acquire('client', list)
  t.equal(second.decision.allowed, false, 'the slot is held: denied')
  t.same(second.decision.policies?.map((d) => d.allowed), [true, false])
  t.equal((await limiter.peek('client', rate)).remaining, 1, 'the denied request spent no token')
  await first.release()
  const third = await limiter.acquire('client', list)
  t.equal(third.decision.allowed, true, 'slot free, a token left')
  t.equal((await limiter.peek('client', rate)).remaining, 0, 'the allowed one spent its token')
  await third.release()
  const fourth = await limiter.acquire('client', list)
  t.equal(fourth.decision.allowed, false, 'no token: denied')
  t.same(fourth.decision.policies?.map((d) => d.allowed), [false, true])
  t.equal(await admin.zcard(key), 0, 'and it took no slot')
})

t.test('a slot held past its lease is renewed, never counted twice', async (t) => {
  const holder = await limiterOf(t)
  const other = await limiterOf(t)
  const policy = slots('long', 1, 1000)
  const held = await holder.acquire('client', policy)
  t.equal(held.decision.allowed, true)
  // Two and a half leases: without renewal the slot would have ended twice.
  for (let i = 0; i < 5; i++) {
    await sleep(500)
    t.equal((await other.acquire('client', policy)).decision.allowed, false, `still held after ${(i + 1) * 500} ms`)
    t.equal(await admin.zcard(await slotKey('long')), 1, 'one member, the holder\'s')
  }
  await held.release()
  t.equal((await other.acquire('client', policy)).decision.allowed, true, 'released: taken by the other')
})

t.test('the slots of a process killed with SIGKILL come back within one lease', async (t) => {
  const LEASE = 1000
  const config = { url, prefix, bucket: 'killed', max: 3, leaseMs: LEASE, count: 3 }
  const child = spawn(process.execPath, [...process.execArgv, new URL('./helpers/slot-holder.ts', import.meta.url).pathname], {
    env: { ...process.env, TOLLGATE_HOLDER: JSON.stringify(config) },
    stdio: ['ignore', 'pipe', 'inherit']
  })
  t.teardown(() => { child.kill('SIGKILL') })
  const line = await new Promise<string>((resolve) => {
    child.stdout.once('data', (data: Buffer) => { resolve(String(data)) })
    child.once('exit', (code) => { resolve(`exited with ${code}`) })
  })
  t.equal(line.trim(), 'held 3')
  const limiter = await limiterOf(t)
  const policy = slots('killed', 3, LEASE)
  t.equal((await limiter.acquire('client', policy)).decision.allowed, false, 'the live holder keeps its slots')
  child.kill('SIGKILL')
  const killedAt = performance.now()
  let freedAfter = Infinity
  while (performance.now() - killedAt < 3 * LEASE) {
    const got = await limiter.acquire('client', policy)
    if (got.decision.allowed) {
      freedAfter = performance.now() - killedAt
      break
    }
    await sleep(50)
  }
  // The last renewal came at most a third of a lease before the kill, so the lease ends within one lease
  // of it; 250 ms on top for the 50 ms polling and a loaded machine's scheduling.
  t.ok(freedAfter <= LEASE + 250, `a slot came back ${Math.round(freedAfter)} ms after the kill (lease ${LEASE} ms)`)
})

t.test('clock steps: a member scored past one lease is clamped; an ended one is dropped', async (t) => {
  const limiter = await limiterOf(t)
  const policy = slots('step', 2, 1000)
  const first = await limiter.acquire('client', policy)
  t.equal(first.decision.allowed, true)
  const key = await slotKey('step')
  const [seconds, micros] = (await admin.time()).map(Number) as [number, number]
  const nowMs = seconds * 1000 + Math.floor(micros / 1000)
  // Written before Redis's clock stepped back an hour: its score is an hour past now + lease.
  await admin.zadd(key, nowMs + 3_600_000 + 1000, 'stepped-back')
  t.equal((await limiter.acquire('client', policy)).decision.allowed, false, 'both slots taken')
  const score = Number(await admin.zscore(key, 'stepped-back'))
  t.ok(score <= nowMs + 1000 + 1000, `clamped to one lease ahead (${score - nowMs} ms)`)
  await sleep(1100)
  // The holder renewed its own slot; the clamped ghost ended with one lease.
  const third = await limiter.acquire('client', policy)
  t.equal(third.decision.allowed, true, 'the clamped slot freed after one lease')
  t.equal(await admin.zscore(key, 'stepped-back'), null)
  // A step forward past a lease's end: dropped at once.
  await third.release()
  await admin.zadd(key, nowMs - 1, 'stepped-forward')
  t.equal((await limiter.acquire('client', policy)).decision.allowed, true)
  t.equal(await admin.zscore(key, 'stepped-forward'), null, 'the ended lease was dropped')
  await first.release()
})

t.test('maxWaitMs across servers: a slot given back by another limiter is found by polling, within POLL_MS', async (t) => {
  const [holder, waiter] = [await limiterOf(t), await limiterOf(t)]
  const policy: ConcurrencyPolicy = { ...slots('polled', 1), maxWaitMs: 2000 }
  const held = await holder.acquire('client', policy)
  const waiting = waiter.acquire('client', policy)
  await sleep(300)
  const releasedAt = performance.now()
  await held.release()
  const got = await waiting
  const late = performance.now() - releasedAt
  t.match(got.decision, { allowed: true, source: 'store' }, 'admitted once the other server gave its slot back')
  t.ok((got.decision.waitedMs ?? 0) >= 300, `it waited for it (${got.decision.waitedMs} ms)`)
  // One poll interval, and 150 ms for the script calls on a loaded machine.
  t.ok(late <= POLL_MS + 150, `found ${Math.round(late)} ms after the release: no later than a poll`)
  await got.release()
})

t.test('close gives back every held slot', async (t) => {
  const redis = new Redis(url)
  t.teardown(() => redis.quit())
  const limiter = createLimiter({ redis, prefix, timeout: 1000 })
  await limiter.ready
  await limiter.acquire('client', slots('closing', 3))
  await limiter.acquire('client', slots('closing', 3))
  const key = await slotKey('closing')
  t.equal(await admin.zcard(key), 2)
  await limiter.close()
  t.equal(await admin.zcard(key), 0, 'released by close')
})

t.test('failure modes: open takes nothing, closed refuses, local is an in-process semaphore of local.max', async (t) => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url, { maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => 50 })
  redis.on('error', () => {})
  await new Promise((resolve) => redis.once('ready', resolve))
  const limiter = createLimiter({ redis, prefix, timeout: 200, breaker: { failures: 1000 }, logger: { warn () {}, info () {}, error () {} } })
  t.teardown(async () => {
    await limiter.close()
    redis.disconnect()
  })
  await limiter.ready
  const held = await limiter.acquire('client', slots('outage', 1))
  t.equal(held.decision.source, 'store')
  const waitedFrom = performance.now()
  const waiting = limiter.acquire('client', { ...slots('outage', 1), maxWaitMs: 5000 })
  await sleep(50)
  await server.kill()
  t.match((await waiting).decision, { allowed: false, source: 'fail-closed' }, 'a waiter whose retry fails closed is answered so: an outage is not waited out')
  t.ok(performance.now() - waitedFrom < 2000, 'long before its wait would end')
  const open = await limiter.acquire('client', { ...slots('outage', 1), failureMode: 'open' })
  t.match(open.decision, { allowed: true, source: 'fail-open' })
  await open.release()
  const closed = await limiter.acquire('client', slots('outage', 1))
  t.match(closed.decision, { allowed: false, source: 'fail-closed' })
  const withRate = await limiter.acquire('client', [{ bucket: 'r', capacity: 5, refillPerSecond: 1, failureMode: 'open' }, slots('outage', 1)])
  t.match(withRate.decision, { allowed: false, source: 'fail-closed' }, 'a list with a rate policy follows its closed policy')
  const local: ConcurrencyPolicy = { bucket: 'outage', concurrency: { max: 5 }, failureMode: 'local', local: { max: 1 } }
  const first = await limiter.acquire('client', local)
  const second = await limiter.acquire('client', local)
  t.match(first.decision, { allowed: true, source: 'local', limit: 1 })
  t.match(second.decision, { allowed: false, source: 'local' })
  await first.release()
  const again = await limiter.acquire('client', local)
  t.match(again.decision, { allowed: true, source: 'local' }, 'released in this process')
  const startedAt = performance.now()
  t.match((await limiter.acquire('client', { ...slots('outage', 1), maxWaitMs: 5000 })).decision, { allowed: false, source: 'fail-closed' }, 'failed closed: no wait')
  t.ok(performance.now() - startedAt < 1000, 'answered at once (the call\'s 200 ms deadline at most)')
  const queued = limiter.acquire('client', { ...local, maxWaitMs: 5000 })
  await sleep(50)
  await again.release()
  t.match((await queued).decision, { allowed: true, source: 'local' }, 'the local semaphore is waited for too, and woken by its release')
  await held.release()
  t.pass('a release the store cannot take does not reject: the slot ends with its lease')
})

t.test('shadow policies on Redis: would-be denials pass, the shadow side taken all or nothing', async (t) => {
  const redis = new Redis(url)
  t.teardown(() => redis.quit())
  await new Promise((resolve) => redis.once('ready', resolve))
  // No `ready`: the first call reads the fleet's key secret itself.
  const limiter = createLimiter({ redis, prefix, timeout: 1000 })
  t.teardown(() => limiter.close())
  const shadowSlot: ConcurrencyPolicy = { ...slots('shadow', 1), shadow: true }
  const shadowRate: Policy = { bucket: 'shadow-rate', capacity: 1, refillPerSecond: 0.001, failureMode: 'open', shadow: true }
  const first = await limiter.acquire('client', [slots('enforced', 5), shadowSlot, shadowRate])
  t.match(first.decision, { allowed: true })
  t.equal(first.decision.shadow, undefined, 'both shadow policies had room: taken')
  const second = await limiter.acquire('client', [slots('enforced', 5), shadowSlot, shadowRate])
  t.match(second.decision, { allowed: true, shadow: true }, 'a would-be denial passes, flagged')
  t.equal(await admin.zcard(await slotKey('shadow')), 1, 'the shadow slot was not taken twice')
  t.equal(await admin.zcard(await slotKey('enforced')), 2, 'the enforced slot was')
  await first.release()
  await second.release()
})
