// Concurrency limits on every adapter (SPEC 13), over the rows of
// test/helpers/adapters.ts, Express 4 included, on a real Redis: a route
// with `concurrency: { max: 1 }` admits one request at a time per client
// (the adapter's own capacity and rate do not apply to it), answers the
// next with a 429 and Retry-After: 1, and gives the slot back when the
// response finishes, and when the client disconnects while the handler
// still runs, when the handler fails, and on shutdown; the draft-11 headers name the unit; the slot set in Redis is
// empty once every request has ended.
//
// Tolerances: the slow handler answers 400 ms after it starts; a request
// sent 100 ms into it finds the slot taken on any machine that starts the
// handler within 300 ms. After a disconnect, the slot is checked free
// RELEASE_MS later: the release is one Redis call once the server sees the
// socket close, a few ms, with room for a loaded 2-core machine.

import { request } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify from 'fastify'
import t, { type Test } from 'tap'
import tollgate from '../lib/index.js'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { ADAPTERS, EXPRESS4, type AdapterRow } from './helpers/adapters.js'

const RELEASE_MS = 150

async function oneAtATime (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, {
    options: { redis, prefix, capacity: 100, refillPerSecond: 100, failureMode: 'closed', timeout: 1000, headers: 'draft-11' },
    routes: [{ path: '/export', policy: { bucket: 'exports', key: () => 'one', concurrency: { max: 1 }, failureMode: 'local', local: { max: 1 } }, handlerMs: 400 }]
  })
  const first = app.get('/export')
  await sleep(100)
  const second = await app.get('/export')
  t.equal(second.status, 429, 'the one slot is taken: the next request is refused')
  t.equal(second.headers['retry-after'], '1', 'Retry-After: 1')
  t.equal(second.headers['ratelimit-policy'], '"exports";q=1;qu="concurrent-requests"', 'draft-11 names the unit, with no window')
  const done = await first
  t.equal(done.status, 200)
  t.equal(done.headers['ratelimit'], '"exports";r=0;t=1', 'no slot left while it ran')
  t.equal((await app.get('/export')).status, 200, 'finished: the slot is free again')

  // The client goes away 100 ms into the 400 ms handler: the slot comes back at once.
  const gone = request({ ...app.at, path: '/export' })
  gone.on('error', () => {})
  gone.end()
  await sleep(100)
  gone.destroy()
  await sleep(RELEASE_MS)
  const after = await app.get('/export')
  t.equal(after.status, 200, 'the client left mid-handler: its slot was given back while its handler still ran')
  await sleep(500)
  t.same(await redis.keys(`${prefix}:*!slots`), [], 'every slot given back: no slot set left in Redis')
  t.same(app.logs().filter((l) => l.level === 'error'), [], 'nothing was logged as an error')
}

async function failing (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, {
    options: { redis, prefix, failureMode: 'closed', timeout: 1000 },
    routes: [{ path: '/fails', policy: { bucket: 'fails', key: () => 'one', concurrency: { max: 1 } }, handlerMs: 50, fails: true }]
  })
  for (let i = 0; i < 3; i++) {
    t.equal((await app.get('/fails')).status, 500, `a handler that fails: its 500 (${i + 1})`)
    await sleep(RELEASE_MS)
  }
  t.same(await redis.keys(`${prefix}:*!slots`), [], 'each released its slot: the next one took it, and none is left')
}

async function badValues (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  for (const [concurrency, message] of [[{ max: 0 }, /concurrency\.max` must be an integer from 1 to 100000, got 0/], [{ max: 1, leaseMs: 10 }, /concurrency\.leaseMs` must be an integer from 1000/]] as const) {
    await t.rejects(row.start(t, {
      options: { redis, prefix: uniquePrefix(), failureMode: 'closed' },
      routes: [{ path: '/bad', policy: { bucket: 'bad', concurrency } }]
    }), { code: 'TOLLGATE_INVALID_OPTION', message }, `${JSON.stringify(concurrency)} is refused at start-up`)
  }
  await t.rejects(row.start(t, {
    options: { redis, prefix: uniquePrefix(), failureMode: 'closed' },
    routes: [{ path: '/bad', policy: { bucket: 'bad', concurrency: { max: 1 }, capacity: 5 } }]
  }), { code: 'TOLLGATE_INVALID_OPTION', message: /capacity` must be unset with `concurrency`/ }, 'a rate field in the same policy is refused')
  await t.rejects(row.start(t, {
    options: { redis, prefix: uniquePrefix(), failureMode: 'closed' },
    routes: [{ path: '/bad', policy: { bucket: 'bad', concurrency: { max: 1 }, cost: () => 2 } }]
  }), { code: 'TOLLGATE_INVALID_OPTION', message: /cost` must be unset with `concurrency` \(a concurrency policy limits concurrency only: list a rate policy beside it\), got a function/ }, 'a cost function in the same policy is refused, not ignored')
  await t.rejects(row.start(t, {
    options: { redis, prefix: uniquePrefix(), failureMode: 'closed' },
    routes: [{ path: '/bad', policy: { bucket: 'bad', concurrency: { max: 1 }, failureMode: 'local' } }]
  }), { code: 'TOLLGATE_INVALID_OPTION', message: /local` must be an object \{ max \} \(an in-process semaphore of that size\) with failureMode 'local'/ }, "failureMode 'local' without local asks for a semaphore")
}

/**
 * A timeout of the app's (declared before the limit) answers 503 50 ms
 * into a 600 ms handler: the slot is given back at that answer, checked
 * RELEASE_MS later, while the handler still runs (400 ms of margin).
 */
async function timedOut (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, {
    options: { redis, prefix, failureMode: 'closed', timeout: 1000 },
    routes: [{ path: '/export', policy: { bucket: 'exports', key: () => 'one', concurrency: { max: 1 } }, handlerMs: 600, timeoutMs: 50 }]
  })
  const started = performance.now()
  const first = await app.get('/export')
  t.equal(first.status, 503, 'the timeout answered first')
  await sleep(RELEASE_MS)
  t.ok(performance.now() - started < 550, 'checked while its handler still runs')
  t.same(await redis.keys(`${prefix}:*!slots`), [], 'its slot was given back at that answer')
  t.equal((await app.get('/export')).status, 503, 'the next request takes the slot (its own timeout answers it, not a 429)')
  await sleep(600)
  t.same(app.logs().filter((l) => l.level === 'error'), [], 'nothing was logged as an error')
}

/**
 * maxWaitMs: two holders of a 600 ms handler; a waiter sent 100 ms in waits
 * 400 ms and gets the 429 (the holders end at 600 ms at the earliest); one
 * sent 450 ms in is admitted when a holder ends (~600 ms), 250 ms before
 * its wait would end, room for a loaded machine.
 */
async function waiting (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, {
    options: { redis, prefix, failureMode: 'closed', timeout: 1000 },
    routes: [{ path: '/export', policy: { bucket: 'exports', key: () => 'one', concurrency: { max: 2 }, maxWaitMs: 400 }, handlerMs: 600 }]
  })
  const started = performance.now()
  const holders = [app.get('/export'), app.get('/export')]
  await sleep(100)
  const late = await app.get('/export')
  t.equal(late.status, 429, 'both slots held past its wait: the 429')
  t.equal(late.headers['retry-after'], '1', 'Retry-After: 1')
  t.ok(performance.now() - started >= 490, 'answered once its 400 ms wait was over, not before')
  await sleep(450 - (performance.now() - started))
  const admitted = app.get('/export')
  const ends = await Promise.all(holders)
  const endedAt = performance.now()
  t.same(ends.map((r) => r.status), [200, 200])
  t.equal((await admitted).status, 200, 'admitted when a holder ended')
  t.ok(performance.now() - endedAt >= 500, 'its handler ran after a holder ended (it waited, it was not let through)')
  await sleep(RELEASE_MS)
  t.same(await redis.keys(`${prefix}:*!slots`), [], 'every slot given back')
}

/**
 * A client that leaves while it waits for a slot: when the holder's 400 ms
 * handler ends, the slot its wait then takes is given back at once (its
 * request has ended), so none is left held.
 */
async function goneWhileWaiting (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, {
    options: { redis, prefix, failureMode: 'closed', timeout: 1000 },
    routes: [{ path: '/export', policy: { bucket: 'exports', key: () => 'one', concurrency: { max: 1 }, maxWaitMs: 2000 }, handlerMs: 400 }]
  })
  const holder = app.get('/export')
  await sleep(100)
  const gone = request({ ...app.at, path: '/export' })
  gone.on('error', () => {})
  gone.end()
  await sleep(100)
  gone.destroy()
  t.equal((await holder).status, 200)
  await sleep(RELEASE_MS)
  t.same(await redis.keys(`${prefix}:*!slots`), [], 'the waiter gone before the slot freed holds none')
  t.equal((await app.get('/export')).status, 200, 'the next request takes the slot at once')
}

/** The programmatic API's `acquire`, over the instance's options: the route's slots, a list all or nothing, bad values refused. */
async function programmaticAcquire (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, {
    options: { redis, prefix, capacity: 5, refillPerSecond: 1, failureMode: 'closed', timeout: 1000 },
    routes: [{ path: '/export', policy: { bucket: 'exports', key: () => 'one', concurrency: { max: 1 } } }]
  })
  const exports = { bucket: 'exports', concurrency: { max: 1 } }
  const held = await app.api.acquire('one', exports)
  t.match(held.decision, { allowed: true, limit: 1, remaining: 0, source: 'store' }, 'a slot, sized by its max (the options\' capacity does not apply)')
  t.equal((await app.get('/export')).status, 429, 'the route\'s slot: its request is refused while it is held')
  t.match((await app.api.acquire('one', exports)).decision, { allowed: false, retryAfterMs: 1000 })
  await held.release()
  await held.release()
  t.equal((await app.get('/export')).status, 200, 'given back once: the route takes it')
  const both = [{ bucket: 'rate', capacity: 1, refillPerSecond: 0.001 }, { bucket: 'slots', concurrency: { max: 2 } }]
  const first = await app.api.acquire('two', both)
  const second = await app.api.acquire('two', both)
  t.same([first.decision.allowed, second.decision.allowed], [true, false], 'a list: the rate policy\'s one token spent, the next is refused')
  t.equal(await redis.zcard((await redis.keys(`${prefix}:*slots!slots`))[0] ?? ''), 1, 'all or nothing: the denied call took no slot')
  await first.release()
  await t.rejects(app.api.acquire(JSON.parse('42'), exports), { code: 'TOLLGATE_INVALID_OPTION', message: /`clientKey` must be a string/ })
  await t.rejects(app.api.acquire('x', { ...exports, cost: 2 }), { code: 'TOLLGATE_INVALID_OPTION', message: /`policy\.cost` must be unset with `concurrency`/ })
  await t.rejects(app.api.acquire('x', [{ ...exports, maxWaitMs: 10 }, { ...exports, bucket: 'other' }]), { code: 'TOLLGATE_INVALID_OPTION', message: /maxWaitMs` must be unset in an array of policies/ })
  await t.rejects(app.api.acquire('x', []), { code: 'TOLLGATE_INVALID_OPTION' }, 'an empty list')
}

/**
 * Shutdown with a request holding a slot (its handler runs 300 ms), a
 * programmatic holder, and a request waiting for a slot (maxWaitMs 5 s):
 * the waiter is answered 429 at the shutdown, not at the end of its wait,
 * the request in flight is answered, and every slot is given back.
 */
async function shutdown (t: Test, row: AdapterRow, first: string): Promise<void> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, {
    options: { redis, prefix, failureMode: 'closed', timeout: 1000 },
    routes: [
      { path: '/export', policy: { bucket: 'exports', key: () => 'one', concurrency: { max: 2 } }, handlerMs: 300 },
      { path: '/single', policy: { bucket: 'single', key: () => 'one', concurrency: { max: 1 }, maxWaitMs: 5000 }, handlerMs: 300 }
    ]
  })
  const held = await app.api.limiter.acquire('other', { bucket: 'exports', concurrency: { max: 2 }, failureMode: 'closed' })
  t.equal(held.decision.allowed, true)
  const inFlight = app.get('/export')
  const holder = app.get('/single')
  await sleep(100)
  let closing = Infinity
  let waited: number | undefined
  const waiter = app.get('/single').then((answer) => { waited = performance.now() - closing; return answer })
  await sleep(100)
  t.equal((await redis.keys(`${prefix}:*!slots`)).length, 3, 'two clients hold a slot of exports, one of single')
  closing = performance.now()
  await app.shutdown(first)
  t.equal((await waiter).status, 429, 'the request waiting for a slot is answered as denied at the shutdown')
  // The shutdown itself may last longer: a request answered after it began keeps its
  // keep-alive connection open until the server's keepAliveTimeout, as on any Node server.
  t.ok(waited !== undefined && waited >= 0 && waited < 2500, `answered at the shutdown (it waited until then), well before its 5 s wait was over (${Math.round(waited ?? -1)} ms)`)
  t.same([(await inFlight).status, (await holder).status], [200, 200], 'the requests in flight are answered')
  t.same(await redis.keys(`${prefix}:*!slots`), [], 'the shutdown gave back every slot, the programmatic one too')
  await held.release()
}

t.test('the adapter\'s own cost and plan do not apply to a concurrency policy', async (t) => {
  const redis = await sharedRedis(t)
  for (const cost of [2, () => 5]) {
    const app = Fastify()
    t.teardown(() => app.close())
    await app.register(tollgate, { redis, prefix: uniquePrefix(), capacity: 3, refillPerSecond: 1, cost, failureMode: 'closed', timeout: 1000, global: false })
    app.get('/x', { config: { rateLimit: { bucket: 'x', concurrency: { max: 1 } } } }, async () => 'ok')
    const answer = await app.inject('/x')
    t.equal(answer.statusCode, 200, `a cost of ${typeof cost === 'number' ? cost : 'a function returning 5'} on the plugin: the route takes its slot`)
  }
  const planned = Fastify()
  t.teardown(() => planned.close())
  await planned.register(tollgate, { redis, prefix: uniquePrefix(), capacity: 3, refillPerSecond: 1, limit: () => ({ capacity: 1, refillPerSecond: 1 }), failureMode: 'closed', timeout: 1000, global: false })
  planned.get('/x', { config: { rateLimit: { bucket: 'x', concurrency: { max: 2 } } } }, async () => 'ok')
  t.same([(await planned.inject('/x')).statusCode, (await planned.inject('/x')).statusCode], [200, 200], 'nor does its plan')
  const own = Fastify()
  t.teardown(() => own.close())
  await own.register(tollgate, { redis, prefix: uniquePrefix(), capacity: 3, refillPerSecond: 1, failureMode: 'closed', timeout: 1000, global: false })
  t.throws(() => own.get('/x', { config: { rateLimit: { bucket: 'x', concurrency: { max: 2 }, limit: () => false } } }, async () => 'ok'),
    { code: 'TOLLGATE_INVALID_OPTION', message: /limit` must be unset with `concurrency`/ }, 'a plan on the policy itself is refused')
})

for (const row of [...ADAPTERS, EXPRESS4]) {
  t.test(row.name, async (t) => {
    t.test('bad values fail the start-up, naming the option', (t) => badValues(t, row))
    t.test('one request at a time; released on finish and on disconnect', (t) => oneAtATime(t, row))
    t.test('released when the handler fails', (t) => failing(t, row))
    t.test('the programmatic API\'s acquire', (t) => programmaticAcquire(t, row))
    t.test('released when a timeout of the app answers first, while the handler runs', (t) => timedOut(t, row))
    t.test('maxWaitMs: a waiter is admitted when a holder ends, or denied once its wait is over', (t) => waiting(t, row))
    t.test('maxWaitMs: a client gone while it waits holds no slot', (t) => goneWhileWaiting(t, row))
    for (const first of row.shutdowns) t.test(`released on shutdown, ${first} first`, (t) => shutdown(t, row, first))
  })
}
