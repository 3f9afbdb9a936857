// lua/lease.lua run directly through ioredis: how much a lease takes, the
// give-back before taking, the cap at capacity, the pure give-back, the
// denial and its wait, the TTL; then a property test in which several
// holders take leases, spend them in their own time and give the rest back,
// interleaved at random, against a plain token bucket that can be given
// tokens back: what they spend never exceeds capacity + refill x elapsed.
//
// Replay a run: TOLLGATE_SEED=<seed printed below>. Check what the test
// catches: TOLLGATE_TEST_LEASE_LUA=<modified copy of the script>.

import { randomInt } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { LeaseRunner, ReferenceBucket, randomSource, redisMicros, uniqueKey, type LeaseCall, type LeaseScriptReply } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'

const seed = process.env.TOLLGATE_SEED === undefined ? randomInt(2 ** 31) : Number(process.env.TOLLGATE_SEED)
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)

const url = await redisUrl(t)
const redis = new Redis(url)
t.teardown(() => { redis.disconnect() })
const lease = new LeaseRunner(redis)

/** A refill so slow that it adds less than 1e-5 tokens in 10 s. */
const NO_REFILL = 1e-6
/** One token at NO_REFILL, microseconds. */
const TOKEN_US = 1e12
/** Float noise, and the 14 significant digits of the script's strings. */
const EPS = 1e-9
/** What NO_REFILL can add during this file, in tokens (10 s). */
const DRIFT = 1e-5

interface Assert {
  ok: (value: boolean, message: string) => boolean
}

function near (tt: Assert, actual: number, expected: number, tolerance: number, what: string): void {
  tt.ok(Math.abs(actual - expected) <= tolerance, `${what}: ${actual} within ${tolerance} of ${expected}`)
}

/**
 * A lease call on a bucket of `capacity` tokens that does not refill during
 * the test; `from` names the lease given back (the full-at time its call left).
 */
function call (key: string, capacity: number, least: number, most: number, back = 0, from = 0): LeaseCall {
  return { key, capacity, refillPerSecond: NO_REFILL, least, most, back, from }
}

t.test('takes between least and most: the most available in whole tokens, never below least', async (t) => {
  const key = uniqueKey('take')
  const first = await lease.run(call(key, 10, 1, 4))
  t.equal(first.taken, 4, 'a full bucket of 10: takes the most asked, 4')
  t.equal(first.remaining, 6, '6 left')
  t.equal(first.fullInUs, 4 * TOKEN_US, 'full again after 4 tokens of refill')
  t.equal(first.waitUs, 0)
  t.equal(Number(await redis.get(key)), first.nowUs + first.fullInUs, 'stored: the microsecond it is full again, as in token-bucket.lua')

  const second = await lease.run(call(key, 10, 1, 8))
  t.equal(second.taken, 6, 'asked for up to 8 with 6 (and a hair) left: takes the 6 whole tokens')
  t.ok(second.remaining >= 0 && second.remaining < DRIFT, `nothing left but the hair (${second.remaining})`)

  const stored = await redis.get(key)
  const denied = await lease.run(call(key, 10, 1, 4))
  t.equal(denied.taken, 0, 'empty: takes nothing')
  t.equal(await redis.get(key), stored, 'and writes nothing')

  // Whole tokens are what is available after fractions were spent.
  const half = uniqueKey('half')
  t.equal((await lease.run(call(half, 10, 2.5, 2.5))).taken, 2.5, 'least = most = 2.5: takes 2.5')
  const rest = await lease.run(call(half, 10, 1, 10))
  t.equal(rest.taken, 7, '7.5 available, up to 10 asked: takes the 7 whole tokens')
  near(t, rest.remaining, 0.5, DRIFT, 'and leaves the half')

  // Never below least, even when fewer whole tokens than least are there.
  const little = uniqueKey('little')
  t.equal((await lease.run(call(little, 1, 0.4, 0.4))).taken, 0.4)
  const least = await lease.run(call(little, 1, 0.5, 4))
  t.equal(least.taken, 0.5, '0.6 available, no whole token, least 0.5: takes 0.5')
  near(t, least.remaining, 0.1, DRIFT, '0.1 left')

  // A fractional most is taken as it is.
  t.equal((await lease.run(call(uniqueKey('most'), 10, 1, 2.5))).taken, 2.5, 'most 2.5 with 10 available: takes 2.5')
})

t.test('gives back before taking', async (t) => {
  const key = uniqueKey('back')
  const control = uniqueKey('back-control')
  for (const k of [key, control]) t.equal((await lease.run(call(k, 10, 8, 8))).taken, 8, 'take 8 of 10')

  const without = await lease.run(call(control, 10, 3, 5))
  t.equal(without.taken, 0, 'without a give-back: 2 left cannot pay 3')

  const stored = Number(await redis.get(key))
  const with4 = await lease.run(call(key, 10, 3, 5, 4, stored))
  t.equal(with4.given, 4, 'the 4 are accepted: nothing was taken since the call that took them')
  t.equal(with4.taken, 5, 'giving back 4 first: 6 available, takes the most asked, 5')
  near(t, with4.remaining, 1, DRIFT, '1 left')
  t.equal(Number(await redis.get(key)), stored - 4 * TOKEN_US + 5 * TOKEN_US, 'full-at time: 4 tokens earlier, then 5 later')
})

t.test('never past full', async (t) => {
  const key = uniqueKey('full')
  t.equal((await lease.run(call(key, 10, 2, 2))).taken, 2)
  const back = await lease.run(call(key, 10, 0, 0, 100, Number(await redis.get(key))))
  t.equal(back.taken, 0, 'a pure give-back takes nothing')
  t.equal(back.remaining, 10, 'giving back 100 with 2 missing fills the bucket: 10, not 108')
  near(t, back.given, 2, DRIFT, 'and says it accepted 2')
  t.equal(back.fullInUs, 0)
  t.equal(await redis.exists(key), 0, 'a full bucket is a missing key: deleted')

  const all = await lease.run(call(key, 10, 1, 100))
  t.equal(all.taken, 10, 'then at most the capacity can be taken')
  t.ok(all.remaining >= 0 && all.remaining < EPS, 'leaving nothing')

  // A key still there after its full-at time (written with a longer TTL by
  // another version, say) is a full bucket, not an overfull one.
  const stale = uniqueKey('full-stale')
  await redis.set(stale, String(await redisMicros(redis) - 10_000_000))
  const most = await lease.run({ key: stale, capacity: 10, refillPerSecond: 200, least: 1, most: 100, back: 0 })
  t.equal(most.taken, 10, 'full 10 s ago at 200/s: 10 tokens to take, not 2010')
  t.equal(most.fullInUs, 50_000, 'and full again after 10 tokens of refill')

  const fresh = uniqueKey('full-fresh')
  const nothing = await lease.run(call(fresh, 10, 0, 0, 5))
  t.equal(nothing.remaining, 10, 'giving back to a full bucket changes nothing')
  t.equal(await redis.exists(fresh), 0, 'and creates no key')
})

t.test('a pure give-back (least 0) moves the full-at time back and never denies', async (t) => {
  const key = uniqueKey('pure')
  t.equal((await lease.run(call(key, 5, 5, 5))).taken, 5, 'empty the bucket')
  const stored = Number(await redis.get(key))
  const back = await lease.run(call(key, 5, 0, 0, 2, stored))
  t.equal(back.taken, 0, 'takes nothing')
  t.equal(back.waitUs, 0, 'an empty bucket does not make a give-back wait')
  near(t, back.remaining, 2, DRIFT, 'the 2 tokens are back')
  t.equal(Number(await redis.get(key)), stored - 2 * TOKEN_US, 'stored full-at time: exactly 2 tokens earlier')
  const expireAtUs = Number(await redis.pexpiretime(key)) * 1000
  t.ok(expireAtUs >= stored - 2 * TOKEN_US, 'and the expiry follows it, never before full')
  t.ok(expireAtUs <= stored - 2 * TOKEN_US + 2 * 60_000_000, 'nor far past it (a minute of slack on a 3e12 us TTL)')
})

t.test('denial: takes nothing, reports the wait, still applies the give-back', async (t) => {
  const key = uniqueKey('deny')
  t.equal((await lease.run(call(key, 10, 9, 9))).taken, 9)
  const stored = await redis.get(key)
  const expiry = await redis.pexpiretime(key)
  const denied = await lease.run(call(key, 10, 3, 5))
  t.equal(denied.taken, 0, '1 left cannot pay 3')
  near(t, denied.waitUs, 2 * TOKEN_US, DRIFT * TOKEN_US, 'wait: the 2 missing tokens')
  near(t, denied.remaining, 1, DRIFT, 'reports the 1 token left')
  t.equal(await redis.get(key), stored, 'nothing written')
  t.equal(await redis.pexpiretime(key), expiry, 'expiry unchanged')

  // The caller hands its unspent tokens over with the call whatever the
  // outcome, so a denied call must still put them back.
  const withBack = await lease.run(call(key, 10, 5, 5, 2, Number(stored)))
  t.equal(withBack.taken, 0, 'giving back 2: 3 available cannot pay 5')
  near(t, withBack.waitUs, 2 * TOKEN_US, DRIFT * TOKEN_US, 'wait: the 2 tokens still missing')
  near(t, withBack.remaining, 3, DRIFT, 'reports the 3 tokens, given-back ones included')
  t.equal(Number(await redis.get(key)), Number(stored) - 2 * TOKEN_US, 'and the give-back is stored')
})

t.test('a give-back is refused once another call has taken from the bucket', async (t) => {
  const key = uniqueKey('refused')
  const older = await lease.run(call(key, 10, 1, 4))
  const olderFrom = older.nowUs + older.fullInUs
  t.equal(olderFrom, Number(await redis.get(key)), 'a lease is named by the full-at time its call left')
  const younger = await lease.run(call(key, 10, 1, 4))
  t.equal(younger.taken, 4, 'another server takes a batch after it')
  const stored = await redis.get(key)
  const refused = await lease.run(call(key, 10, 0, 0, 3, olderFrom))
  t.equal(refused.given, 0, 'the older lease gives 3 back: refused')
  t.equal(await redis.get(key), stored, 'and nothing is written')
  const taking = await lease.run(call(key, 10, 1, 1, 3, olderFrom))
  t.equal(taking.given, 0, 'refused with a take as well')
  t.equal(taking.taken, 1, 'the take itself goes through')
  near(t, taking.remaining, 1, DRIFT, '10 - 4 - 4 - 1')
  const own = await lease.run(call(key, 10, 0, 0, 1, taking.nowUs + taking.fullInUs))
  t.equal(own.given, 1, 'the latest call\'s own give-back is accepted')
  t.equal((await lease.run(call(key, 10, 0, 0, 1, 0))).given, 0, 'a give-back that names no lease is refused')
})

t.test('a peek decides as the call would, give-back included, and writes nothing', async (t) => {
  const key = uniqueKey('peek')
  const older = await lease.run(call(key, 10, 3, 4))
  const olderFrom = older.nowUs + older.fullInUs
  const accepted = await lease.run({ ...call(key, 10, 7, 7, 1, olderFrom), peek: true })
  t.same([accepted.taken, accepted.given], [7, 1], 'the lease\'s 1 would be taken back: 6 + 1 pay 7')
  near(t, accepted.remaining, 7, DRIFT, 'the bucket as the call finds it: after the give-back, before the take')
  near(t, accepted.fullInUs, 3 * TOKEN_US, DRIFT * TOKEN_US, 'full again after the 3 tokens still out')
  t.equal(Number(await redis.get(key)), olderFrom, 'nothing written')
  await lease.run(call(key, 10, 3, 4))
  const stored = await redis.get(key)
  const refused = await lease.run({ ...call(key, 10, 3, 3, 1, olderFrom), peek: true })
  t.same([refused.taken, refused.given], [0, 0], 'another call took since: the give-back would be refused, and 2 cannot pay 3')
  near(t, refused.remaining, 2, DRIFT, '2 in the bucket')
  near(t, refused.waitUs, TOKEN_US, DRIFT * TOKEN_US, 'the wait for the missing token')
  t.equal(await redis.get(key), stored, 'nothing written')
})

t.test('a full-at time far ahead (Redis\'s clock stepped back) costs at most one window', async (t) => {
  // Capacity 10 at 10/s: a window is 1 s. The key holds a full-at time 1 h
  // ahead of Redis's clock: the state a step back of 1 h leaves behind.
  const HOUR_US = 3_600_000_000
  const shape = { capacity: 10, refillPerSecond: 10 }
  const key = uniqueKey('clock-step')
  const ahead = await redisMicros(redis) + HOUR_US
  await redis.set(key, String(ahead), 'PX', 2 * HOUR_US / 1000)
  const denied = await lease.run({ key, ...shape, least: 1, most: 5, back: 0 })
  t.equal(denied.taken, 0, 'an empty bucket: denied')
  t.ok(denied.waitUs <= 1_000_000, `wait ${denied.waitUs} us: at most one window (1 s), not the hour`)
  t.ok(denied.fullInUs <= 1_000_000, `full again in ${denied.fullInUs} us: at most one window`)
  t.equal(Number(await redis.get(key)), ahead, 'a denial writes nothing')
  const back = await lease.run({ key, ...shape, least: 0, most: 0, back: 4, from: ahead })
  t.equal(back.given, 4, 'a give-back counts from the clamped state')
  const stored = Number(await redis.get(key))
  t.ok(stored - back.nowUs <= 1_000_000, `and writes a full-at time at most one window ahead (${stored - back.nowUs} us)`)
  t.ok(await redis.pttl(key) <= 1_001, 'with a TTL to match')
})

t.test('TTL: the key expires at or just after the bucket is full again', async (t) => {
  const shapes: Array<[capacity: number, rate: number, least: number, most: number]> = [
    [100, 10, 1, 30], [5, 0.3, 0.5, 2.5], [1, 5, 1, 1], [60, 7, 1, 13.25], [1, 7, 1, 1], [10, 1000 / 7, 1, 3]
  ]
  for (let round = 0; round < 4; round++) {
    for (const [capacity, rate, least, most] of shapes) {
      const key = uniqueKey('lease-ttl')
      const reply = await lease.timed({ key, capacity, refillPerSecond: rate, least, most, back: 0 })
      const fullAtUs = Number(await redis.get(key))
      const expireAtUs = Number(await redis.pexpiretime(key)) * 1000
      const what = `capacity ${capacity}, ${rate}/s, taking ${reply.taken}`
      t.equal(fullAtUs, reply.nowUs + reply.fullInUs, `${what}: stored full-at time`)
      t.ok(expireAtUs >= fullAtUs, `${what}: expires at ${expireAtUs} us, full at ${fullAtUs} us`)
      // Rounded up to the ms (< 1 ms), 1 ms for the microseconds PX drops,
      // and however long the script took (at most the MULTI around it).
      const slack = 2_000 + (reply.afterUs - reply.beforeUs)
      t.ok(expireAtUs - fullAtUs <= slack, `${what}: expires ${expireAtUs - fullAtUs} us after full (at most ${slack})`)
    }
  }
})

// ------------------------------------------------------------ property test

/**
 * One app server's view: the unspent part of its last lease, the full-at
 * time that lease's call left, and how many calls had taken when it did.
 */
interface Holder {
  held: number
  from: number
  takenAt: number
}

interface Shape {
  name: string
  capacity: number
  refillPerSecond: number
  batch: number
  costs: number[]
  maxSleepMs: number
}

const SHAPES: Shape[] = [
  { name: 'capacity 10, 200/s, batches of 4', capacity: 10, refillPerSecond: 200, batch: 4, costs: [1, 1, 2, 0.5], maxSleepMs: 10 },
  { name: 'capacity 5, 37.5/s, batches of 2.5', capacity: 5, refillPerSecond: 37.5, batch: 2.5, costs: [1, 0.5, 1.25], maxSleepMs: 30 },
  { name: 'capacity 20, 1000/7 per s, batches of 8', capacity: 20, refillPerSecond: 1000 / 7, batch: 8, costs: [1, 3], maxSleepMs: 12 }
]
const HOLDERS = 3
const STEPS = 300

interface Run {
  spent: number
  boundUs: number
  bound: number
  calls: number
  taken: number
  denied: number
  skipped: number
  /** Give-backs accepted, and refused because another call had taken since. */
  accepted: number
  refused: number
  problems: string[]
}

/**
 * Holders act at random: a request of some cost is paid from the holder's
 * lease when it holds enough, else with a lease call that gives the unspent
 * rest back and takes between the cost and a batch; now and then a holder
 * gives everything back (as close() does). Now and then the holders pause
 * long enough for the bucket to fill up. After every call, and at the end,
 * the tokens spent so far must not exceed capacity + refill x (time since
 * the first call). The script's takings are also compared with a plain
 * token bucket; the script's whole-microsecond rounding makes it lag by
 * less than 1 us of refill per write, never lead.
 */
async function leaseRun (shape: Shape, index: number): Promise<Run> {
  const random = randomSource(seed + index * 104_729)
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)] as T
  const key = uniqueKey(`lease-model${index}`)
  const holders: Holder[] = Array.from({ length: HOLDERS }, () => ({ held: 0, from: 0, takenAt: 0 }))
  let takes = 0
  const model = new ReferenceBucket(shape)
  const perUs = shape.refillPerSecond / 1e6
  let behindUs = 0
  let startUs: number | undefined
  const run: Run = { spent: 0, boundUs: 0, bound: 0, calls: 0, taken: 0, denied: 0, skipped: 0, accepted: 0, refused: 0, problems: [] }

  const checkBound = (nowUs: number, where: string): void => {
    const bound = shape.capacity + shape.refillPerSecond * (nowUs - (startUs ?? nowUs)) / 1e6
    run.bound = bound
    if (run.spent > bound + EPS) run.problems.push(`${where}: spent ${run.spent} > capacity + refill x elapsed = ${bound}`)
  }

  for (let step = 0; step < STEPS; step++) {
    // Mostly short gaps, which keep the bucket near empty; now and then one
    // long enough to fill it, so that give-backs meet a full bucket.
    if (random() < 0.03) await sleep(shape.capacity / shape.refillPerSecond * 1000)
    else if (random() < 0.4) await sleep(random() * shape.maxSleepMs)
    const holder = pick(holders)
    const cost = pick(shape.costs)
    const close = random() < 0.05
    if (!close && holder.held >= cost && random() < 0.8) {
      // Spent from the lease, no call.
      holder.held -= cost
      run.spent += cost
      continue
    }
    const back = holder.held
    const least = close ? 0 : cost
    const most = close ? 0 : Math.max(cost, shape.batch)
    holder.held = 0
    // Accepted only when no call has taken since this holder's own.
    const accepted = back > 0 && holder.takenAt === takes
    const reply: LeaseScriptReply = await lease.run({ key, capacity: shape.capacity, refillPerSecond: shape.refillPerSecond, least, most, back, from: holder.from })
    if (!accepted && reply.given !== 0) run.problems.push(`step ${step}: a give-back of ${back} accepted (${reply.given}) after another call took`)
    if (accepted) run.accepted++
    else if (back > 0) run.refused++
    run.calls++
    startUs ??= reply.nowUs
    const where = `step ${step} (least ${least}, most ${most}, back ${back})`

    // The model, on the script's clock.
    const uncapped = model.advance(reply.nowUs)
    if (uncapped >= shape.capacity + behindUs * perUs) behindUs = 0
    if (accepted) {
      const before = model.tokens
      model.giveBack(back)
      // Moving the full-at time back rounds up too, unless it reaches full.
      if (before + back >= shape.capacity + behindUs * perUs) behindUs = 0
      else behindUs += 1
    }
    const tokens = model.tokens
    const lag = behindUs * perUs + EPS
    if (least > 0) {
      // What the script may hold: the model's tokens, or up to `lag` fewer.
      const low = tokens - lag
      const high = tokens + EPS
      const outcomes = new Set<number>()
      for (const held of [low, high]) {
        outcomes.add(held >= least ? Math.max(least, Math.min(most, Math.floor(held))) : 0)
      }
      if (!outcomes.has(reply.taken)) {
        run.problems.push(`${where}: took ${reply.taken}, the model ${[...outcomes].join(' or ')} of ${tokens} tokens`)
      }
      if (outcomes.size > 1) run.skipped++
      if (reply.taken > 0) {
        model.spend(reply.taken)
        behindUs += 1
        holder.held = reply.taken - cost
        holder.from = reply.nowUs + reply.fullInUs
        holder.takenAt = ++takes
        run.spent += cost
        run.taken++
      } else {
        run.denied++
        const waitUs = (least - tokens) / perUs
        if (!(reply.waitUs >= waitUs - 1 && reply.waitUs <= waitUs + behindUs + 1)) {
          run.problems.push(`${where}: wait ${reply.waitUs} us, the model ${waitUs} us`)
        }
      }
    }
    const reported = reply.remaining - model.tokens
    if (!(reported >= -(behindUs * perUs + EPS) && reported <= EPS)) {
      run.problems.push(`${where}: ${reply.remaining} tokens reported, the model ${model.tokens}`)
    }
    checkBound(reply.nowUs, where)
  }
  // The tokens spent from leases after the last call count as well.
  checkBound(await redisMicros(redis), 'at the end')
  return run
}

t.test('interleaved leases and give-backs never spend more than capacity + refill x elapsed', async (t) => {
  const runs = await Promise.all(SHAPES.map(leaseRun))
  for (let i = 0; i < SHAPES.length; i++) {
    const shape = SHAPES[i] as Shape
    const run = runs[i] as Run
    t.comment(`${shape.name}: ${run.calls} calls (${run.taken} took, ${run.denied} denied, ${run.skipped} at a rounding boundary), ` +
      `${run.spent} tokens spent of at most ${run.bound.toFixed(3)}; give-backs: ${run.accepted} accepted, ${run.refused} refused`)
    t.ok(run.accepted >= 3 && run.refused >= 3, `${shape.name}: give-backs both accepted and refused (at least 3 each)`)
    t.same(run.problems.slice(0, 5), [], `${shape.name}: no problem (${run.problems.length} found)`)
    t.ok(run.taken >= 10 && run.denied >= 10, `${shape.name}: both takings and denials seen`)
    // The demand keeps the bucket near empty, so the bound is nearly
    // reached and an over-spend could not hide under it.
    t.ok(run.spent >= run.bound * 0.6, `${shape.name}: the load spends ${(run.spent / run.bound * 100).toFixed(0)}% of the bound (at least 60%)`)
    t.ok(run.skipped <= run.calls * 0.05, `${shape.name}: rounding boundaries are rare (${run.skipped} of ${run.calls})`)
  }
})
