// Concurrency limits on the in-process store with a fake clock (SPEC 13):
// renewal keeps a long request's slot without counting it twice, a slot
// nobody renews ends with its lease, shadow slots never refuse, a list with
// a rate policy is all or nothing, and every bad option value is refused
// with a coded error naming it. test/concurrency.test.ts holds the same
// promises on a real Redis.

import diagnostics from 'node:diagnostics_channel'
import t from 'tap'
import { createCore } from '../../lib/core/limiter.js'
import { SlotTable } from '../../lib/core/slot-table.js'
import { PolicyHeaders, headerPairs } from '../../lib/http/headers.js'
import type { Acquired, ConcurrencyPolicy, Policy } from '../../lib/core/types.js'
import { FakeTime } from './helpers/fake-time.js'

function limiterAt () {
  const time = new FakeTime()
  const core = createCore({}, { time })
  return { time, core, limiter: core.limiter }
}

const exports: ConcurrencyPolicy = { bucket: 'exports', concurrency: { max: 2, leaseMs: 3000 }, failureMode: 'closed' }

t.test('a held slot is renewed past its lease, one timer for every slot, and is counted once', async (t) => {
  const { time, limiter } = limiterAt()
  const a = await limiter.acquire('c', exports)
  const b = await limiter.acquire('c', { ...exports })
  t.equal(time.pending, 1, 'one renewal timer for both slots')
  await time.advance(10_000)
  t.equal((await limiter.acquire('c', exports)).decision.allowed, false, 'both still held after three leases')
  await a.release()
  await a.release()
  const c = await limiter.acquire('c', exports)
  t.match(c.decision, { allowed: true, remaining: 0 }, 'one freed, taken once')
  await b.release()
  await c.release()
  await time.advance(1000)
  t.equal(time.pending, 0, 'no timer once nothing is held')
})

t.test('a slot nobody renews ends with its lease; an early end never frees a live one', async (t) => {
  const time = new FakeTime()
  const table = new SlotTable(2, () => time.now())
  table.add('k', 'dead', 1000)
  table.add('k', 'live', 1000)
  await time.advance(600)
  table.renew('k', ['live', 'gone'], 1000)
  await time.advance(500)
  t.equal(table.taken('k'), 1, 'the dead holder\'s slot ended at 1000 ms, the renewed one holds')
  table.renew('k', ['dead'], 1000)
  t.equal(table.taken('k'), 1, 'an ended slot is not renewed back')
  table.renew('none', ['x'], 1000)
  table.remove('none', ['x'])
  t.equal(table.taken('none'), 0)
  await time.advance(2000)
  t.equal(table.taken('k'), 0)
  t.equal(table.size, 0, 'an empty key is dropped')
  table.add('a', '1', 100)
  table.add('b', '1', 100)
  await time.advance(200)
  table.add('c', '1', 100)
  t.equal(table.size, 1, 'at the cap, ended keys make room')
  table.clear()
  t.equal(table.size, 0)
})

t.test('shadow slots: a would-be denial passes, flagged, and holds nothing', async (t) => {
  const { limiter } = limiterAt()
  const shadow: ConcurrencyPolicy = { ...exports, bucket: 's', concurrency: { max: 1 }, shadow: true }
  const first = await limiter.acquire('c', shadow)
  const second = await limiter.acquire('c', shadow)
  t.match(first.decision, { allowed: true })
  t.equal(first.decision.shadow, undefined)
  t.match(second.decision, { allowed: true, shadow: true, remaining: 0 })
  await second.release()
  await first.release()
  t.equal((await limiter.acquire('c', shadow)).decision.shadow, undefined, 'released: room again')
})

t.test('in a list: all or nothing; the binding decision; shadow members', async (t) => {
  const { limiter } = limiterAt()
  const rate: Policy = { bucket: 'r', capacity: 2, refillPerSecond: 0.001, failureMode: 'open' }
  const one: ConcurrencyPolicy = { bucket: 'one', concurrency: { max: 1 }, failureMode: 'open' }
  const a = await limiter.acquire('c', [rate, one])
  t.match(a.decision, { allowed: true, bucket: 'r', remaining: 1 }, 'allowed: the top level describes the rate policy')
  t.match(a.decision.policies?.[1], { bucket: 'one', remaining: 0 })
  const b = await limiter.acquire('c', [rate, one])
  t.match(b.decision, { allowed: false, bucket: 'r', retryAfterMs: 1000 }, 'denied by the slot: the rate described, the slot\'s wait')
  const slotsOnly = await limiter.acquire('c', [{ ...one, bucket: 'p' }, { ...one, bucket: 'q', concurrency: { max: 2 } }])
  t.match(slotsOnly.decision, { allowed: true, bucket: 'p', remaining: 0 }, 'slots only: the fewest free binds')
  t.equal((await limiter.peek('c', rate)).remaining, 1, 'nothing spent by the denial')
  await a.release()
  const shadowRate: Policy = { ...rate, bucket: 'sr', capacity: 1, shadow: true }
  const c = await limiter.acquire('c', [one, shadowRate])
  t.match(c.decision, { allowed: true })
  t.equal(c.decision.shadow, undefined)
  await c.release()
  const d = await limiter.acquire('c', [one, shadowRate])
  t.match(d.decision, { allowed: true, shadow: true }, 'the shadow rate is spent: a would-be denial')
  t.equal(d.decision.policies?.[1]?.shadow, true)
  const onlyShadow = await limiter.acquire('c', [{ ...one, bucket: 'x', shadow: true }, { ...shadowRate, bucket: 'y' }])
  t.match(onlyShadow.decision, { allowed: true })
  const full = await limiter.acquire('c', [{ ...one, bucket: 'x', shadow: true }, { ...shadowRate, bucket: 'y' }])
  t.match(full.decision, { allowed: true, shadow: true }, 'all shadow: never refused')
  await limiter.close()
})

t.test('bad values are refused, naming the option', async (t) => {
  const { limiter } = limiterAt()
  const bad = async (policy: unknown, message: RegExp, what: string): Promise<unknown> =>
    t.rejects(limiter.acquire('c', policy as ConcurrencyPolicy), { code: 'TOLLGATE_INVALID_OPTION', message }, what)
  await bad({ ...exports, concurrency: { max: 0 } }, /`policy\.concurrency\.max` must be an integer from 1 to 100000, got 0/, 'max 0')
  await bad({ ...exports, concurrency: { max: 1.5 } }, /concurrency\.max/, 'max not whole')
  await bad({ ...exports, concurrency: { max: 100_001 } }, /concurrency\.max/, 'max too large')
  await bad({ ...exports, concurrency: {} }, /`policy\.concurrency\.max` must be an integer from 1 to 100000, got undefined/, 'max missing')
  await bad({ ...exports, concurrency: { max: 2, leaseMs: 999 } }, /`policy\.concurrency\.leaseMs` must be an integer from 1000 to 86400000 \(ms\), got 999/, 'lease too short')
  await bad({ ...exports, concurrency: { max: 2, leaseMs: 86_400_001 } }, /leaseMs/, 'lease too long')
  await bad({ ...exports, concurrency: 2 }, /`policy\.concurrency` must be an object \{ max, leaseMs\? \}, got 2/, 'not an object')
  await bad({ ...exports, concurrency: { max: 2, lease: 1 } }, /concurrency\.lease/, 'unknown field')
  await bad({ ...exports, capacity: 5 }, /`policy\.capacity` must be unset with `concurrency`/, 'a rate field')
  await bad({ ...exports, refillPerSecond: 5 }, /`policy\.refillPerSecond` must be unset with `concurrency`/, 'a rate field')
  await bad({ ...exports, cost: 1 }, /`policy\.cost` must be unset with `concurrency`/, 'a cost')
  await bad([{ ...exports, maxWaitMs: 10 }, { ...exports, bucket: 'y' }], /`policy\[0\]\.maxWaitMs` must be unset in an array of policies/, 'a wait in a list')
  await bad({ ...exports, maxWaitMs: 0 }, /`policy\.maxWaitMs` must be/, 'a wait of 0')
  await bad({ ...exports, maxWaitMs: 10, shadow: true }, /`policy\.maxWaitMs` must be unset with `shadow: true`/, 'a wait on a shadow policy')
  await bad({ ...exports, lockout: { after: 1, withinMs: 1, forMs: 1 } }, /`policy\.lockout` must be unset with `concurrency`/, 'a lockout')
  await bad({ ...exports, lease: { tokens: 1, maxAgeMs: 1 } }, /`policy\.lease` must be unset with `concurrency`/, 'a lease')
  await bad({ ...exports, failureMode: 'local', local: { capacity: 1, refillPerSecond: 1 } }, /`policy\.local` must be an object \{ max \} with `concurrency`/, 'a rate local')
  await bad({ bucket: 'r', capacity: 1, refillPerSecond: 1, failureMode: 'local', local: { max: 1 } }, /`policy\.local` must be an object \{ capacity, refillPerSecond \}/, 'a slot local on a rate')
  await bad({ ...exports, failureMode: 'local', local: { max: 0 } }, /`policy\.local\.max`/, 'a bad local max')
  await bad({ ...exports, failureMode: 'local' }, /`policy\.local` must be an object \{ max \} \(an in-process semaphore of that size\) with failureMode 'local', got undefined/, 'local without local: a semaphore is asked for')
  await bad('exports', /`policy` must be a policy object/, 'not an object')
  await bad([], /`policy` must be a policy or a non-empty array of policies/, 'an empty list')
  await t.rejects(limiter.acquire(JSON.parse('1'), exports), /`clientKey` must be a string/)
  await t.rejects(limiter.consume('c', JSON.parse(JSON.stringify(exports))), /`policy\.concurrency` must be unset to consume or peek/)
  await t.rejects(limiter.reserve('c', JSON.parse(JSON.stringify(exports))), /`policy\.concurrency` must be unset to reserve/)
})

t.test('maxWaitMs: a waiter takes the slot this process gives back, at once; past its wait it is denied', async (t) => {
  const { time, limiter } = limiterAt()
  const waiting: ConcurrencyPolicy = { ...exports, maxWaitMs: 1000 }
  const a = await limiter.acquire('c', exports)
  const b = await limiter.acquire('c', exports)
  let got: Acquired | undefined
  const first = limiter.acquire('c', waiting).then((x) => { got = x })
  const second = limiter.acquire('c', waiting)
  const other = limiter.acquire('other', waiting)
  await time.advance(0) // the calls are made, and wait
  await time.advance(100)
  t.equal(got, undefined, 'both slots held: it waits')
  t.match((await other).decision, { allowed: true, remaining: 1 }, 'another client waits for nothing')
  await a.release()
  await first
  t.match(got?.decision, { allowed: true, remaining: 0, waitedMs: 100 }, 'one slot given back: the oldest waiter takes it at once, and says how long it waited')
  await time.advance(1000)
  t.match((await second).decision, { allowed: false, retryAfterMs: 1000, source: 'store' }, 'the other one: denied once its wait is over')
  t.equal(time.now(), 1100, 'no earlier than maxWaitMs after it started')
  await b.release()
  await got?.release()
  await limiter.close()
})

t.test('maxWaitMs: each slot given back wakes one waiter', async (t) => {
  const { time, limiter } = limiterAt()
  const one: ConcurrencyPolicy = { ...exports, concurrency: { max: 2, leaseMs: 1000 }, maxWaitMs: 5000 }
  const held = [await limiter.acquire('c', one), await limiter.acquire('c', one)]
  const admitted: number[] = []
  const waits = [0, 1].map(async (i) => { const got = await limiter.acquire('c', one); admitted.push(i); return got })
  await time.advance(10)
  await Promise.all(held.map((h) => h.release()))
  const both = await Promise.all(waits)
  t.same(admitted, [0, 1], 'two slots given back at once: each wakes its own waiter, in order')
  t.equal(time.now(), 10, 'at once, not at a poll')
  for (const h of both) await h.release()
  await limiter.close()
})

t.test('maxWaitMs: close() ends a wait at once, denied; a full pool refuses without waiting', async (t) => {
  const time = new FakeTime()
  const { limiter } = createCore({ maxWaiters: 1 }, { time })
  const waiting: ConcurrencyPolicy = { ...exports, concurrency: { max: 1 }, maxWaitMs: 10_000 }
  const held = await limiter.acquire('c', waiting)
  t.equal(held.decision.waitedMs, undefined, 'a slot free at once: no wait')
  const pending = limiter.acquire('c', waiting)
  await time.advance(1)
  const refused = await limiter.acquire('c', waiting)
  t.match(refused.decision, { allowed: false }, 'the pool of one is taken: denied at once')
  t.equal(time.now(), 1)
  await limiter.close()
  t.match((await pending).decision, { allowed: false, retryAfterMs: 1000 }, 'close(): the wait ends, denied')
  t.equal(time.now(), 1, 'at once')
  t.equal(time.pending, 0, 'no timer left')
})

t.test('the same policy object is parsed once; close releases and stops the timer', async (t) => {
  const { time, limiter } = limiterAt()
  await limiter.acquire('c', exports)
  await limiter.acquire('c', exports)
  t.equal((await limiter.acquire('c', exports)).decision.allowed, false)
  t.equal(time.pending, 1)
  await limiter.close()
  t.equal(time.pending, 0)
})

t.test('decisions are published and counted as the other kinds are', async (t) => {
  const counted: Array<{ name: string, value: number, attributes?: object }> = []
  const instrument = (name: string) => ({
    add: (value: number, attributes?: object) => { counted.push({ name, value, attributes }) },
    record: (value: number, attributes?: object) => { counted.push({ name, value, attributes }) }
  })
  const meter = { createCounter: instrument, createUpDownCounter: instrument, createHistogram: instrument }
  const time = new FakeTime()
  const { limiter } = createCore({ metrics: { meter } }, { time })
  const published: unknown[] = []
  const listener = (message: unknown): void => { published.push(message) }
  diagnostics.subscribe('tollgate:decision', listener)
  t.teardown(() => diagnostics.unsubscribe('tollgate:decision', listener))
  const shadow: ConcurrencyPolicy = { ...exports, bucket: 'sh', concurrency: { max: 1 }, shadow: true }
  await limiter.acquire('c', exports)
  await limiter.acquire('c', shadow)
  await limiter.acquire('c', shadow)
  t.match(published, [{ key: 'c', decision: { bucket: 'exports' } }, { key: 'c', decision: { bucket: 'sh' } }, { key: 'c', shadow: true }])
  t.ok(counted.length > 0, 'counted by the limiter\'s metrics')
  await limiter.close()
})

t.test('a list picks its binding decision as summarize does', async (t) => {
  const { limiter } = limiterAt()
  const p: ConcurrencyPolicy = { bucket: 'p', concurrency: { max: 1 }, failureMode: 'open' }
  const q: ConcurrencyPolicy = { bucket: 'q', concurrency: { max: 2 }, failureMode: 'open' }
  t.match((await limiter.acquire('c', [q, p])).decision, { allowed: true, bucket: 'p' }, 'allowed: the fewest free, wherever it is')
  const slow: Policy = { bucket: 'slow', capacity: 1, refillPerSecond: 0.01, failureMode: 'open' }
  const fast: Policy = { bucket: 'fast', capacity: 1, refillPerSecond: 1, failureMode: 'open' }
  await limiter.acquire('c', [fast, slow, { ...q, bucket: 'r' }])
  t.match((await limiter.acquire('c', [fast, slow, { ...q, bucket: 'r' }])).decision, { allowed: false, bucket: 'slow', retryAfterMs: 100_000 }, 'denied: the longest wait')
  // A shadow slot with a shadow rate that cannot pay: the shadow side is taken all or nothing, so not the slot.
  const shadowSlot: ConcurrencyPolicy = { ...p, bucket: 'ss', shadow: true }
  const spent: Policy = { ...slow, bucket: 'spent', shadow: true }
  await limiter.consume('c', { ...spent, shadow: false })
  const got = await limiter.acquire('c', [shadowSlot, spent])
  t.match(got.decision, { allowed: true, shadow: true })
  t.match((await limiter.acquire('c', shadowSlot)).decision, { allowed: true }, 'the shadow slot was not taken')
  t.equal((await limiter.acquire('c', shadowSlot)).decision.shadow, true, 'now it is')
  await got.release()
})

t.test('headers: draft-10 and draft-11 list a concurrency policy by its max, the local semaphore too', async (t) => {
  const rate = { bucket: 'api', capacity: 10, refillPerSecond: 1 }
  const slot = { bucket: 'exports', capacity: 2, refillPerSecond: 2, concurrency: { max: 2 } }
  const headers = new PolicyHeaders([rate, slot], [{ bucket: 'exports', capacity: 1, refillPerSecond: 1, max: 1 }])
  const decision = { allowed: true, limit: 2, remaining: 1, resetMs: 0, retryAfterMs: 0, source: 'store' as const, bucket: 'exports' }
  t.same(headerPairs('draft-10', decision, headers)[0], ['ratelimit-policy', '"api";q=10;w=10, "exports";q=2'])
  t.same(headerPairs('draft-11', decision, headers)[0], ['ratelimit-policy', '"api";q=10;w=10, "exports";q=2;qu="concurrent-requests"'])
  const local = { ...decision, source: 'local' as const, limit: 1, remaining: 0 }
  t.same(headerPairs('draft-11', local, headers)[0], ['ratelimit-policy', '"exports";q=1;qu="concurrent-requests"'])
  t.same(headerPairs('draft-10', local, headers)[0], ['ratelimit-policy', '"exports";q=1'])
})
