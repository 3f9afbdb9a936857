// The composed limiter (createCore) on the in-process store, with a fake
// clock and fake timers: nothing here needs Redis or waits for real time.
// The store's arithmetic is the script's (test/model.test.ts holds them to
// each other on a real Redis); what this file checks is the wiring: every
// path of the core reads the injected time, and the promises of
// docs/design/algorithm.md hold on it for any window, not only the total
// since start.

import t from 'tap'
import { createCore } from '../../lib/core/limiter.js'
import type { Decision, Policy } from '../../lib/core/types.js'
import { FakeTime, settled } from './helpers/fake-time.js'

function limiterAt () {
  const time = new FakeTime()
  const core = createCore({}, { time })
  return { time, core, limiter: core.limiter }
}

const api: Policy = { bucket: 'api', capacity: 5, refillPerSecond: 10, failureMode: 'closed' }

t.test('a bucket empties, and refills only as the injected clock moves', async (t) => {
  const { time, limiter } = limiterAt()
  const first = await limiter.consume('alice', api)
  t.match(first, { allowed: true, limit: 5, remaining: 4, source: 'store', bucket: 'api' })
  for (let i = 0; i < 4; i++) t.equal((await limiter.consume('alice', api)).allowed, true)
  const denied = await limiter.consume('alice', api)
  t.equal(denied.allowed, false, 'the sixth is denied')
  t.equal(denied.retryAfterMs, 100, 'one token at 10/s is 100 ms away')
  t.equal((await limiter.consume('bob', api)).allowed, true, 'another client has a bucket of its own')
  await time.advance(99)
  t.equal((await limiter.consume('alice', api)).allowed, false, '1 ms early: still denied')
  await time.advance(1)
  t.equal((await limiter.consume('alice', api)).allowed, true, 'at 100 ms the token is back')
  t.equal((await limiter.consume('alice', api)).allowed, false, 'and only one')
  await limiter.close()
})

t.test('for any window w, at most capacity + refill x w are admitted (random arrivals on the fake clock)', async (t) => {
  const { time, limiter } = limiterAt()
  const policy: Policy = { bucket: 'w', capacity: 4, refillPerSecond: 8, failureMode: 'open' }
  const admitted: number[] = []
  let seed = 12345
  const random = (): number => { seed = (seed * 1103515245 + 12345) % 2 ** 31; return seed / 2 ** 31 }
  for (let i = 0; i < 3000; i++) {
    await time.advance(random() * 20)
    if ((await limiter.consume('c', policy)).allowed) admitted.push(time.now())
  }
  let worst = 0
  for (let i = 0; i < admitted.length; i++) {
    for (let j = i; j < admitted.length; j++) {
      const w = (admitted[j] as number) - (admitted[i] as number)
      const bound = policy.capacity + policy.refillPerSecond * w / 1000
      worst = Math.max(worst, (j - i + 1) - bound)
    }
  }
  t.ok(worst <= 1e-9, `no window admitted more than the bound (worst excess ${worst})`)
  t.ok(admitted.length > 200, `and the limit admitted what the refill allows (${admitted.length})`)
  await limiter.close()
})

t.test('several policies are all-or-nothing; the binding one is reported', async (t) => {
  const { limiter } = limiterAt()
  const burst: Policy = { bucket: 'burst', capacity: 2, refillPerSecond: 1, failureMode: 'open' }
  const daily: Policy = { bucket: 'daily', capacity: 3, refillPerSecond: 0.001, failureMode: 'open' }
  const both = [burst, daily]
  t.match(await limiter.consume('a', both), { allowed: true, bucket: 'burst', remaining: 1 })
  t.match(await limiter.consume('a', both), { allowed: true, bucket: 'burst', remaining: 0 })
  const denied = await limiter.consume('a', both)
  t.match(denied, { allowed: false, bucket: 'burst' })
  t.same(denied.policies?.map((d) => d.allowed), [false, true])
  t.match(await limiter.peek('a', daily), { allowed: true, remaining: 1 }, 'the denial spent nothing of the other policy')
  await limiter.close()
})

t.test('peek spends nothing', async (t) => {
  const { limiter } = limiterAt()
  for (let i = 0; i < 10; i++) await limiter.peek('p', api)
  t.match(await limiter.consume('p', api), { allowed: true, remaining: 4 })
  await limiter.close()
})

t.test('a reservation settles once: the refund comes back, a second settle is refused', async (t) => {
  const { time, limiter } = limiterAt()
  const policy: Policy = { bucket: 'export', capacity: 10, refillPerSecond: 1, failureMode: 'closed' }
  const reservation = await limiter.reserve('r', policy, 8)
  t.match(reservation.decision, { allowed: true, remaining: 2 })
  await time.advance(100)
  await limiter.settle(reservation, 3)
  t.match(await limiter.peek('r', policy), { remaining: 7 }, 'charged 3 of the 8 reserved')
  await t.rejects(limiter.settle(reservation, 0), /each settles once/)
  await limiter.close()
})

t.test('a refund never gives back tokens the bucket refilled while the reservation was held', async (t) => {
  const { time, limiter } = limiterAt()
  const policy: Policy = { bucket: 'long', capacity: 10, refillPerSecond: 2, failureMode: 'closed' }
  const reservation = await limiter.reserve('h', policy, 10)
  await time.advance(5000) // the bucket is full again
  for (let i = 0; i < 10; i++) t.equal((await limiter.consume('h', policy)).allowed, true)
  await limiter.settle(reservation, 0)
  const after = await limiter.peek('h', policy)
  t.ok(after.remaining <= 0, `the refund found nothing left of the reservation to give back (remaining ${after.remaining})`)
  await limiter.close()
})

t.test('shadow mode: would-be denials pass, flagged', async (t) => {
  const { limiter } = limiterAt()
  const policy: Policy = { bucket: 's', capacity: 1, refillPerSecond: 0.01, failureMode: 'open', shadow: true }
  t.match(await limiter.consume('s', policy), { allowed: true })
  const second = await limiter.consume('s', policy)
  t.equal(second.allowed, true)
  t.equal(second.shadow, true)
  await limiter.close()
})

t.test('a lockout blocks for forMs on the injected clock, and then lets the client back', async (t) => {
  const { time, limiter } = limiterAt()
  const policy: Policy = { bucket: 'login', capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', lockout: { after: 2, withinMs: 60_000, forMs: 10_000 } }
  t.equal((await limiter.consume('u', policy)).allowed, true)
  t.equal((await limiter.consume('u', policy)).locked, undefined, 'the first denial does not lock')
  const locked = await limiter.consume('u', policy)
  t.equal(locked.locked, true, 'the second denial within withinMs locks')
  t.ok(locked.retryAfterMs > 9000 && locked.retryAfterMs <= 10_000, `for forMs (${locked.retryAfterMs} ms)`)
  await time.advance(9000)
  t.equal((await limiter.consume('u', policy)).locked, true, 'still locked before forMs')
  await limiter.reset('u', 'login')
  t.equal((await limiter.consume('u', policy)).allowed, true, 'a reset ends the lockout and refills')
  await limiter.close()
})

t.test('a lockout counts denials within withinMs only: a denial after the period starts a new count', async (t) => {
  const { time, limiter } = limiterAt()
  const policy: Policy = { bucket: 'pin', capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', lockout: { after: 2, withinMs: 1000, forMs: 10_000 } }
  t.equal((await limiter.consume('v', policy)).allowed, true)
  t.equal((await limiter.consume('v', policy)).locked, undefined, 'a first denial')
  // Exactly withinMs later: the count is still stored (it is kept 1 ms past
  // its period), and the period is over.
  await time.advance(1000)
  t.equal((await limiter.consume('v', policy)).locked, undefined, 'a denial withinMs later is the first of a new period, not the second')
  t.equal((await limiter.consume('v', policy)).locked, true, 'the next one within the period locks')
  await limiter.close()
})

t.test('a waiting consume waits on the injected timers, and close() ends the wait', async (t) => {
  const { time, limiter } = limiterAt()
  const policy: Policy = { bucket: 'q', capacity: 1, refillPerSecond: 10, failureMode: 'open', maxWaitMs: 1000 }
  t.equal((await limiter.consume('q', policy)).allowed, true)
  let decision: Decision | undefined
  void limiter.consume('q', policy).then((d) => { decision = d })
  await settled()
  t.equal(decision, undefined, 'the second call waits for its token')
  await time.advance(99)
  t.equal(decision, undefined, 'not before its token is due')
  await time.advance(1)
  t.match(decision, { allowed: true, waitedMs: 100 }, 'served when the token is due, 100 ms on the fake clock')

  let third: Decision | undefined
  void limiter.consume('q', policy).then((d) => { third = d })
  await settled()
  t.equal(third, undefined)
  await limiter.close()
  await settled()
  t.match(third, { allowed: false }, 'close() ends a wait at once, as a denial')
  t.equal(time.pending, 0, 'and leaves no timer behind')
})

t.test('a step of the wall clock changes nothing: the core reads only the injected time', async (t) => {
  const { time, limiter } = limiterAt()
  const policy: Policy = { bucket: 'step', capacity: 2, refillPerSecond: 1, failureMode: 'open' }
  await limiter.consume('k', policy)
  await limiter.consume('k', policy)
  const realNow = Date.now
  Date.now = () => realNow() + 3_600_000
  try {
    t.equal((await limiter.consume('k', policy)).allowed, false, 'an hour ahead on the wall clock refills nothing')
  } finally {
    Date.now = realNow
  }
  await time.advance(1000)
  t.equal((await limiter.consume('k', policy)).allowed, true, 'a second on the injected clock refills one')
  await limiter.close()
})

t.test('the adapters\' entries refuse an empty list of policies, as the public limiter does', async (t) => {
  const { core, limiter } = limiterAt()
  t.throws(() => core.decide('alice', [], undefined, true), { code: 'TOLLGATE_INVALID_OPTION', message: /`policies` must be a non-empty list of policies/ })
  t.throws(() => core.reserve('alice', [], undefined), { code: 'TOLLGATE_INVALID_OPTION', message: /`policies` must be a non-empty list of policies/ })
  await t.rejects(limiter.consume('alice', []), { code: 'TOLLGATE_INVALID_OPTION', message: /`policy` must be a policy or a non-empty array of policies/ })
  await limiter.close()
})
