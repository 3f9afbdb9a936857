// lua/token-bucket.lua run directly through ioredis: the decisions, the
// refill, the reply format, the TTL and the stored encoding, in the style of
// redis_rate's script tests. The reply is one integer per bucket (see the
// script's header); token counts are derived from it with lib's
// bucketState, as lib does. Where a token count depends on elapsed time, the
// call runs between two reads of Redis TIME in one MULTI, so the script's
// own clock is known to a few microseconds and no assertion depends on how
// fast this machine is.

import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { createLimiter } from '../lib/core/limiter.js'
import { checkPolicy } from '../lib/core/policy.js'
import { MAX_CAPACITY, MIN_REFILL } from '../lib/core/options.js'
import { RedisStore } from '../lib/store/redis-store.js'
import { bucketState, wholeTokens } from '../lib/store/store.js'
import { ScriptRunner, redisMicros, uniqueKey, uniqueTag, type ScriptSpec, type TimedReply } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'
import { keyUnder } from './helpers/keys.js'

const url = await redisUrl(t)
const redis = new Redis(url)
t.teardown(() => { redis.disconnect() })
const script = new ScriptRunner(redis)

/** A refill so slow that it adds less than 1e-5 tokens in 10 s (one token per 11.6 days). */
const NO_REFILL = 1e-6
/** One token at NO_REFILL, microseconds. */
const TOKEN_US = 1e12
/** Float noise allowed when comparing token counts computed two ways. */
const EPS = 1e-9

interface Assert {
  ok: (value: boolean, message: string) => boolean
}

function spec (key: string, capacity: number, refillPerSecond: number, cost = 1): ScriptSpec {
  return { key, capacity, refillPerSecond, cost }
}

/** Tokens left, fractions kept, as lib derives them from a reply value. */
function tokens (value: number | undefined, s: ScriptSpec): number {
  return bucketState(value ?? NaN, s).remaining
}

/** |actual - expected| <= tolerance, with both numbers in the message. */
function near (tt: Assert, actual: number, expected: number, tolerance: number, what: string): void {
  tt.ok(Math.abs(actual - expected) <= tolerance, `${what}: ${actual} within ${tolerance} of ${expected}`)
}

/** low - tolerance <= actual <= high + tolerance. */
function between (tt: Assert, actual: number, low: number, high: number, tolerance: number, what: string): void {
  tt.ok(actual >= low - tolerance && actual <= high + tolerance, `${what}: ${actual} in [${low}, ${high}] ± ${tolerance}`)
}

/** Least and most microseconds of Redis's clock between the scripts of two timed calls. */
function elapsed (earlier: TimedReply, later: TimedReply): [number, number] {
  return [later.beforeUs - earlier.afterUs, later.afterUs - earlier.beforeUs]
}

/** One microsecond of refill, in tokens: what one write's rounding up may take away. */
function microOf (s: ScriptSpec): number {
  return s.refillPerSecond / 1e6
}

t.test('a first call on a new client, capacity 100, refill 10/s, is allowed and leaves 99', async (t) => {
  const key = uniqueKey('first')
  const s = spec(key, 100, 10)
  const first = await script.timed([s], true)
  t.same(first.values, [100_000], 'one integer: allowed, full again in 100 000 us (one token at 10/s)')
  t.same(bucketState(100_000, s), { remaining: 99, fullInUs: 100_000, waitUs: 0 }, 'bucketState: 99 left, no wait')
  t.equal(wholeTokens(tokens(first.values[0], s)), 99, 'displayed: 99')

  // The stored value is Redis TIME in microseconds plus the reply value.
  const stored = Number(await redis.get(key))
  between(t, stored - 100_000, first.beforeUs, first.afterUs, 0, 'stored full-at time minus the reply is the script\'s clock')
  // Units check only: Redis runs on a machine whose clock is close to ours
  // (a minute of skew would still pass); ms or s would be off by 1000x.
  near(t, first.beforeUs / 1000, Date.now(), 60_000, 'the clock is Redis TIME in microseconds')

  // The same bucket through lib's RedisStore: one more token spent, plus the
  // refill between the two calls, measured on Redis's clock. Every term is a
  // whole number of microseconds here, so the count is exact.
  const store = new RedisStore(redis)
  const before = await redisMicros(redis)
  const second = await store.decide([s], true)
  const after = await redisMicros(redis)
  t.equal(second.allowed, true)
  between(t, second.buckets[0]?.remaining ?? NaN, 98 + (before - first.afterUs) * 10 / 1e6, 98 + (after - first.beforeUs) * 10 / 1e6, EPS,
    'second call: 99 less 1, plus the refill since the first')
  t.equal(second.buckets[0]?.waitUs, 0)
})

t.test('exhaustion: capacity 5 gives exactly 5, then denials that spend nothing', async (t) => {
  const key = uniqueKey('exhaust')
  const s = spec(key, 5, NO_REFILL)
  for (let i = 1; i <= 5; i++) {
    const [value] = await script.run([s], true)
    t.ok((value ?? -1) >= 0, `call ${i} allowed (${value})`)
    near(t, tokens(value, s), 5 - i, 1e-5, `call ${i} remaining`)
  }
  const stored = await redis.get(key)
  for (let i = 6; i <= 7; i++) {
    const [value] = await script.run([s], true)
    t.ok((value ?? 0) < 0, `call ${i} denied (${value})`)
    const state = bucketState(value ?? NaN, s)
    t.ok(state.remaining >= -EPS && state.remaining < 1e-5, `call ${i}: nothing left (${state.remaining})`)
    // Waiting for one whole token, less the < 1e-5 that came back.
    between(t, state.waitUs, TOKEN_US * (1 - 1e-5), TOKEN_US, 0, `call ${i} wait, us`)
    between(t, state.fullInUs, 5 * TOKEN_US * (1 - 1e-5), 5 * TOKEN_US, 1, `call ${i} full in, us`)
  }
  t.equal(await redis.get(key), stored, 'denied calls left the stored value as it was')
})

t.test('refill over time, capped at capacity', async (t) => {
  const key = uniqueKey('refill')
  // 200 tokens/s: one token every 5 ms, the whole bucket of 10 in 50 ms.
  const all = spec(key, 10, 200, 10)
  const one = spec(key, 10, 200, 1)
  const empty = await script.timed([all], true)
  t.same(empty.values, [50_000], 'emptied in one call of cost 10: full again in 50 ms')
  t.equal(tokens(empty.values[0], all), 0, 'nothing left')

  await sleep(20)
  const later = await script.timed([one], false)
  const [least, most] = elapsed(empty, later)
  // Timers fire no earlier than asked (Node may round down by < 1 ms).
  t.ok(least >= 19_000, `Redis's clock moved at least ${least} us during a 20 ms sleep`)
  t.ok((later.values[0] ?? -1) >= 0, 'about 4 tokens came back: a cost of 1 is affordable')
  between(t, tokens(later.values[0], one), Math.min(10, least * 200 / 1e6), Math.min(10, most * 200 / 1e6), EPS,
    'the tokens a peek reports: the refill since the bucket was emptied')

  // Long enough to be full again; more time adds nothing past capacity.
  await sleep(60)
  const [full] = await script.run([one], true)
  t.equal(full, 5_000, 'a full bucket spends one token: full again in 5 ms')
  t.equal(tokens(full, one), 9, 'a full bucket of 10, less 1')

  // A key still there long after its full-at time (say, written with a
  // longer TTL by another version) is a full bucket, not an overfull one.
  const stale = uniqueKey('stale')
  await redis.set(stale, String(await redisMicros(redis) - 10_000_000))
  const [capped] = await script.run([spec(stale, 10, 200)], true)
  t.equal(capped, 5_000, 'full 10 s ago: 10 tokens, not 2010')
  t.equal(tokens(capped, one), 9)
  await redis.del(stale)
})

t.test('a cost above the tokens held is denied and spends nothing', async (t) => {
  const key = uniqueKey('cost')
  const first = await script.timed([spec(key, 10, NO_REFILL, 7)], true)
  t.same(first.values, [7 * TOKEN_US], 'cost 7 from 10')
  const stored = await redis.get(key)
  const expiresAt = await redis.pexpiretime(key)

  const five = spec(key, 10, NO_REFILL, 5)
  const denied = await script.timed([five], true)
  const [least, most] = elapsed(first, denied)
  const state = bucketState(denied.values[0] ?? NaN, five)
  t.ok((denied.values[0] ?? 0) < 0, 'cost 5 with about 3 tokens: denied')
  // 3 tokens and the refill since; the derived count may lag by the one
  // microsecond the wait is rounded up by.
  between(t, state.remaining, 3 + least * NO_REFILL / 1e6, 3 + most * NO_REFILL / 1e6, microOf(five) + EPS, 'still 3 tokens')
  between(t, state.waitUs, 2 * TOKEN_US - most, 2 * TOKEN_US - least, 1, 'wait for the 2 missing tokens, less the refill')
  t.equal(await redis.get(key), stored, 'stored value unchanged')
  t.equal(await redis.pexpiretime(key), expiresAt, 'expiry unchanged')

  const [rest] = await script.run([spec(key, 10, NO_REFILL, 3)], true)
  t.ok((rest ?? -1) >= 0, 'cost 3 with 3 (and a hair) tokens: allowed')

  // A hair short is short: 0.5 tokens (plus < 1e-7 of refill) cannot pay 0.5000002.
  const hair = uniqueKey('hair')
  t.ok(((await script.run([spec(hair, 10, NO_REFILL, 9.5)], true))[0] ?? -1) >= 0)
  const short = (await script.run([spec(hair, 10, NO_REFILL, 0.5000002)], true))[0] ?? 0
  t.ok(short < 0, `0.5 tokens, cost 0.5000002: denied (${short})`)
  t.ok(((await script.run([spec(hair, 10, NO_REFILL, 0.5)], true))[0] ?? -1) >= 0, '0.5 tokens, cost 0.5: allowed')

  // Exactly as many tokens as the cost: a new bucket holds exactly its capacity.
  const exact = spec(uniqueKey('exact'), 2.5, NO_REFILL, 2.5)
  const [all] = await script.run([exact], true)
  t.equal(all, 2.5 * TOKEN_US, 'tokens == cost is allowed')
  t.equal(tokens(all, exact), 0)
})

t.test('a full bucket pays a cost equal to its capacity, whatever the rate', async (t) => {
  // A bucket that is full holds exactly `capacity` tokens and stays there, so
  // a cost equal to the capacity (a capacity-1 bucket paying 1 token, for
  // one) must be allowed. Rates whose token interval is not a whole number
  // of microseconds are the ones where the arithmetic has to be exact.
  const shapes: Array<[capacity: number, rate: number]> = [
    [1, 50], [10, 10], [1, 7], [1, 60], [1, 0.7], [2.5, 37.5], [4, 6], [10, 1.3], [100, 60], [3, 7], [1, 1000 / 7]
  ]
  for (const [capacity, rate] of shapes) {
    for (let round = 0; round < 3; round++) {
      const s = spec(uniqueKey('whole'), capacity, rate, capacity)
      const [value] = await script.run([s], true)
      t.equal(value, Math.ceil(capacity * 1e6 / rate), `capacity ${capacity}, ${rate}/s, cost ${capacity} on a full bucket: allowed, full again after the whole interval`)
      // Empty, less up to 1 us of refill: the full-at time is rounded up.
      between(t, tokens(value, s), -microOf(s), 0, EPS, 'and empties it')
    }
    // The same next to a second bucket: the path of several policies.
    const tag = uniqueTag('whole')
    const pair = [spec(`test:${tag}:a`, capacity, rate, capacity), spec(`test:${tag}:b`, 10, 10, 1)]
    t.same(await script.run(pair, true), [Math.ceil(capacity * 1e6 / rate), 100_000],
      `capacity ${capacity}, ${rate}/s, with a second policy: allowed, full again after the whole interval`)
  }
})

t.test('TTL: the key expires at or just after the bucket is full again', async (t) => {
  // Several shapes, including fractional costs and rates whose token interval
  // is not a whole number of microseconds.
  const shapes: Array<[capacity: number, rate: number, cost: number]> = [
    [100, 10, 30], [100, 10, 1], [5, 0.3, 2.5], [1, 5, 1], [60, 7, 13.25], [3, 0.5, 0.5], [1, 7, 1], [10, 1000 / 7, 3]
  ]
  for (let round = 0; round < 4; round++) {
    for (const [capacity, rate, cost] of shapes) {
      const key = uniqueKey('ttl')
      // Read in the MULTI of the script: the 21 ms key of the last shape was
      // gone by the time a separate GET reached a loaded machine's Redis.
      const reply = await script.timed([spec(key, capacity, rate, cost)], true, key)
      const fullAtUs = Number(reply.value)
      const expireAtUs = Number(reply.expireAtMs) * 1000
      const what = `capacity ${capacity}, ${rate}/s, cost ${cost}`
      // Never before: a key that expired before the bucket is full would
      // make a partly empty bucket read as full.
      t.ok(expireAtUs >= fullAtUs, `${what}: expires at ${expireAtUs} us, full at ${fullAtUs} us`)
      // Just after: the TTL is the time until full rounded up to the ms
      // (< 1 ms), plus 1 ms for the microseconds of now that PX counts from
      // Redis's ms clock, plus however long the script itself took (at
      // most the span of the MULTI around it).
      const slack = 2_000 + (reply.afterUs - reply.beforeUs)
      t.ok(expireAtUs - fullAtUs <= slack, `${what}: expires ${expireAtUs - fullAtUs} us after full (at most ${slack})`)
    }
  }
})

t.test('the key really expires once the bucket is full', async (t) => {
  const key = uniqueKey('expire')
  const s = spec(key, 5, 100, 5)
  const [value] = await script.run([s], true)
  const fullInMs = bucketState(value ?? NaN, s).fullInUs / 1000
  t.equal(fullInMs, 50, 'full again in 50 ms')
  t.equal(await redis.exists(key), 1, 'there while the bucket is not full')
  // Margin: the TTL adds up to 2 ms, and timers may run late.
  await sleep(fullInMs + 15)
  t.equal(await redis.exists(key), 0, 'gone once full: a full bucket and a missing key are the same')
})

t.test('fractions survive the reply', async (t) => {
  const key = uniqueKey('fraction')
  const s = spec(key, 100, 0.5, 2.5)
  const first = await script.timed([s], true)
  t.same(first.values, [5_000_000], '2.5 tokens at 0.5/s: full again in 5 s')
  near(t, tokens(first.values[0], s), 97.5, EPS, 'cost 2.5 from 100 leaves 97.5, not a truncated 97')
  const second = await script.timed([s], true)
  const [least, most] = elapsed(first, second)
  between(t, tokens(second.values[0], s), 95 + least * 0.5 / 1e6, 95 + most * 0.5 / 1e6, EPS,
    'second spend, with the refill in between')

  const small = uniqueKey('small')
  const two = spec(small, 2.5, 0.5, 2)
  const spent = await script.timed([two], true)
  near(t, tokens(spent.values[0], two), 0.5, EPS, 'a fractional capacity: 0.5 left')
  const one = spec(small, 2.5, 0.5, 1)
  const denied = await script.timed([one], true)
  const [from, to] = elapsed(spent, denied)
  t.ok((denied.values[0] ?? 0) < 0, '0.5 (and a hair) tokens cannot pay 1')
  const state = bucketState(denied.values[0] ?? NaN, one)
  between(t, state.remaining, 0.5 + from * 0.5 / 1e6, 0.5 + to * 0.5 / 1e6, microOf(one) + EPS,
    'the half token is kept, plus the refill since')
  between(t, state.waitUs, 1e6 - to, 1e6 - from, 1, 'wait for the missing half token, about 1 s')
})

t.test('several buckets: all or nothing; peek writes nothing', async (t) => {
  const tag = uniqueTag('multi')
  const a = `test:${tag}:a`
  const b = `test:${tag}:b`
  const c = `test:${tag}:c`
  t.same(await script.run([spec(a, 1, NO_REFILL)], true), [TOKEN_US], 'a: its only token spent')
  const storedA = await redis.get(a)

  const denied = await script.run([spec(a, 1, NO_REFILL), spec(b, 10, NO_REFILL, 3)], true)
  t.ok((denied[0] ?? 0) < 0, `a is empty: it reports a wait (${denied[0]}), so the pair is denied`)
  t.equal(denied[1], 0, 'b could have paid: it reports itself as it is, full')
  t.equal(tokens(denied[1], spec(b, 10, NO_REFILL, 3)), 10, 'b reports its tokens untouched')
  t.equal(await redis.exists(b), 0, 'b was not written')
  t.equal(await redis.get(a), storedA, 'a was not written')

  const both = await script.run([spec(b, 10, NO_REFILL, 3), spec(c, 4, NO_REFILL, 1)], true)
  t.same(both, [3 * TOKEN_US, TOKEN_US], 'b and c can both pay, and both are spent')
  t.equal(tokens(both[0], spec(b, 10, NO_REFILL, 3)), 7)
  t.equal(tokens(both[1], spec(c, 4, NO_REFILL, 1)), 3)

  const storedB = Number(await redis.get(b))
  const expiryB = await redis.pexpiretime(b)
  const d = `test:${tag}:d`
  const peekB = spec(b, 10, NO_REFILL, 2)
  const peek = await script.timed([peekB, spec(d, 5, NO_REFILL, 5)], false)
  t.ok(peek.values.every((v) => v >= 0), 'peek: would be allowed')
  // A peek reports the bucket as it is: its full-at time less the script's clock.
  between(t, peek.values[0] ?? NaN, storedB - peek.afterUs, storedB - peek.beforeUs, 0, 'peek: b as it is, nothing spent')
  near(t, tokens(peek.values[0], peekB), 7, 1e-5, 'the tokens b holds')
  t.equal(peek.values[1], 0, 'and d full')
  t.equal(Number(await redis.get(b)), storedB, 'peek left b as it was')
  t.equal(await redis.pexpiretime(b), expiryB, 'and its expiry')
  t.equal(await redis.exists(d), 0, 'peek created no key')

  const [peekDenied] = await script.run([spec(a, 1, NO_REFILL)], false)
  t.ok((peekDenied ?? 0) < 0, 'peek on the empty bucket: denied')
  t.equal(await redis.get(a), storedA, 'and nothing written')
})

t.test('the stored value is one integer: the microsecond the bucket is full again', async (t) => {
  // Rates whose token interval is not a whole number of microseconds, and a
  // fractional cost, so a float could leak into the value if it were not rounded.
  // At 7/s a cost of 7 is worth cost * (1e6 / 7) = 1000000.0000000001 us, but
  // the spend moves the full-at time by cost * 1e6 / 7 = 1000000 exactly,
  // as lib's MemoryStore does: the two must not be mixed up.
  for (const [rate, cost] of [[10, 1], [0.3, 2.5], [7, 1], [30 / 7, 1.5], [7, 7]] as const) {
    for (const several of [false, true]) {
      const tag = uniqueTag('encoding')
      const key = `test:${tag}:a`
      const buckets = several ? [spec(key, 100, rate, cost), spec(`test:${tag}:b`, 100, 10, 1)] : [spec(key, 100, rate, cost)]
      const reply = await script.timed(buckets, true)
      const value = await redis.get(key)
      const what = `${rate}/s, cost ${cost}${several ? ', with a second policy' : ''}`
      t.match(value, /^[1-9][0-9]*$/, `${what}: "${value}" is an integer string`)
      t.equal(reply.values[0], Math.ceil(cost * 1e6 / rate), `${what}: the reply is the cost's interval, rounded up to a whole microsecond`)
      between(t, Number(value) - (reply.values[0] ?? NaN), reply.beforeUs, reply.afterUs, 0, 'stored: the script\'s clock plus the reply')
      t.equal(await redis.type(key), 'string')
      t.equal(await redis.object('ENCODING', key), 'int', 'kept by Redis as an integer inside the object header')
    }
  }
})

t.test('memory per bucket', async (t) => {
  // MEMORY USAGE of a string key in Redis 7.0 = dict entry (24 B) + object
  // header (16 B; an integer value lives inside it, no allocation of its own)
  // + the key's allocation (the name, a 1-3 B sds header, and the allocator
  // rounding up to its size class). The expiry adds a 24 B entry in the
  // expires dict that MEMORY USAGE does not count. Since the rounding depends
  // on the name's length, the figure is taken over 32 consecutive lengths of
  // realistic keys: the least of them is the bucket's cost net of its name
  // and of the rounding, the spread is the rounding.
  const tag = uniqueTag('mem')
  const extras: number[] = []
  for (let pad = 0; pad < 32; pad++) {
    const key = `tollgate:${tag}:GET /search${'x'.repeat(pad)}`
    await script.run([spec(key, 100, 10)], true)
    extras.push(Number(await redis.memory('USAGE', key)) - Buffer.byteLength(key))
  }
  const least = Math.min(...extras)
  const most = Math.max(...extras)
  const version = /redis_version:(\S+)/.exec(await redis.info('server'))?.[1] ?? 'unknown'
  t.comment(`Redis ${version}: MEMORY USAGE per bucket minus its key's length: ${least} to ${most} B over 32 key lengths (${extras.join(' ')})`)
  t.ok(least <= 48, `per-bucket cost apart from the key name: ${least} B <= 48 B (Redis 7.0 figure)`)
  t.ok(most - least < 32, `the rest is the allocator rounding the name up: ${most - least} B < 32 B`)
})

t.test('a step back of Redis\'s clock costs at most one window, not the size of the step', async (t) => {
  // The state a step back of 1 h leaves (an NTP correction, a failover to a
  // replica whose clock is behind): a full-at time 1 h ahead of Redis TIME.
  // Before the clamp, a capacity-10, 1/s bucket answered Retry-After 3592 s.
  const HOUR_US = 3600e6
  const prefix = `test-step-${process.pid}`
  const keySecret = 'a key secret for this test'
  const limiter = createLimiter({ redis, prefix, denialCache: false, keySecret, timeout: 1000 })
  t.teardown(() => limiter.close())
  const policy = { bucket: 'api', capacity: 10, refillPerSecond: 1, failureMode: 'closed' } as const
  const windowMs = 10_000
  const stepBack = async (client: string, bucket: string): Promise<string> => {
    const key = keyUnder(keySecret, prefix, client, bucket)
    await redis.set(key, String(await redisMicros(redis) + HOUR_US), 'PX', 2 * 3600e3)
    return key
  }

  const key = await stepBack('alice', 'api')
  const peek = await limiter.peek('alice', policy)
  t.equal(peek.allowed, false, 'peek: an empty bucket')
  t.ok(peek.retryAfterMs <= 1000, `peek: retry after ${peek.retryAfterMs} ms, at most the cost's interval (1000 ms)`)
  t.ok(peek.resetMs <= windowMs, `peek: full in ${peek.resetMs} ms, at most one window (${windowMs} ms)`)
  const stored = await redis.get(key)
  const denied = await limiter.consume('alice', policy)
  t.equal(denied.allowed, false, 'consume: denied, the bucket reads as empty')
  t.ok(denied.retryAfterMs <= 1000, `consume: retry after ${denied.retryAfterMs} ms`)
  t.ok(denied.resetMs <= windowMs, `consume: full in ${denied.resetMs} ms`)
  t.not(await redis.get(key), stored, 'the consume re-anchored the key')
  const ahead = Number(await redis.get(key)) - await redisMicros(redis)
  t.ok(ahead <= windowMs * 1000 && ahead > windowMs * 1000 - 1e6, `it is now full at most one window ahead (${ahead} us)`)
  t.ok(await redis.pttl(key) <= windowMs + 2, 'with the TTL of one window')

  // Several policies: the loop path clamps and re-anchors each bucket.
  const other = { bucket: 'other', capacity: 2.5, refillPerSecond: 0.3, failureMode: 'closed' } as const
  const otherWindowMs = 2.5 / 0.3 * 1000
  const k1 = await stepBack('bob', 'api')
  const k2 = await stepBack('bob', 'other')
  const both = await limiter.consume('bob', [policy, other])
  t.equal(both.allowed, false)
  const [p1, p2] = both.policies ?? []
  t.ok((p1?.retryAfterMs ?? Infinity) <= 1000 && (p1?.resetMs ?? Infinity) <= windowMs, `first: retry ${p1?.retryAfterMs} ms, full in ${p1?.resetMs} ms`)
  // The window of 2.5 tokens at 0.3/s is not a whole number of microseconds:
  // the waits are rounded up to the next one.
  t.ok((p2?.retryAfterMs ?? Infinity) <= 1000 / 0.3 + 0.001 && (p2?.resetMs ?? Infinity) <= otherWindowMs + 0.001,
    `second: retry ${p2?.retryAfterMs} ms, full in ${p2?.resetMs} ms (window ${otherWindowMs} ms)`)
  for (const [k, w] of [[k1, windowMs], [k2, otherWindowMs]] as const) {
    const left = Number(await redis.get(k)) - await redisMicros(redis)
    t.ok(left <= w * 1000 + 1, `${k}: re-anchored at most one window ahead (${left} us)`)
  }

  // The script alone (or the TOLLGATE_TEST_LUA text), both of its paths: an
  // empty bucket waits for its cost, 1 s, and a consume re-anchors the key.
  const lone = spec(await stepBack('dave', 'api'), 10, 1, 1)
  const pair = [spec(await stepBack('dave', 'x'), 10, 1, 1), spec(await stepBack('dave', 'y'), 10, 1, 1)]
  t.same(await script.run([lone], false), [-1_000_000], 'script, one policy, peek: wait 1 s')
  t.same(await script.run([lone], true), [-1_000_000], 'script, one policy, consume: wait 1 s')
  t.same(await script.run(pair, true), [-1_000_000, -1_000_000], 'script, two policies, consume: wait 1 s each')
  for (const s of [lone, ...pair]) {
    const left = Number(await redis.get(s.key)) - await redisMicros(redis)
    t.ok(left <= 10_000_000, `${s.key}: re-anchored at most one window ahead (${left} us)`)
  }

  // And the client really gets back in after the wait it was given: a
  // 100 ms window, so the test waits 10 ms, not an hour.
  const fast = { bucket: 'fast', capacity: 10, refillPerSecond: 100, failureMode: 'closed' } as const
  await stepBack('carol', 'fast')
  const first = await limiter.consume('carol', fast)
  t.equal(first.allowed, false)
  t.ok(first.retryAfterMs <= 10, `retry after ${first.retryAfterMs} ms`)
  await sleep(Math.min(first.retryAfterMs, 50) + 5)
  const again = await limiter.consume('carol', fast)
  t.equal(again.allowed, true, 'allowed once the wait it was told is over')
  t.equal(again.source, 'store')
})

t.test('extreme options: every accepted bucket decides in the real script, every rejected one names the limit', async (t) => {
  // Before the bounds, 18 of 108 such combinations were accepted and then
  // failed every allowed request ("ERR value is not an integer" from PSETEX).
  const capacities = [5e-324, 1e-300, 1e-9, 0.001, 1, 10, 1e6, 1e9, 1e15, 1e300, MAX_CAPACITY, 1e303]
  const refills = [5e-324, 1e-303, MIN_REFILL, 1e-300, 1e-9, 1e-6, 0.001, 1, 1000, 1e9, 1e300, Number.MAX_VALUE]
  const costsOf = (capacity: number): number[] => [capacity, capacity / 2, capacity * 1e-9, 5e-324]
  const store = new RedisStore(redis)
  const tag = uniqueTag('extreme')
  let accepted = 0
  let rejected = 0
  const failures: string[] = []
  for (const capacity of capacities) {
    for (const refillPerSecond of refills) {
      for (const cost of costsOf(capacity)) {
        if (cost <= 0) continue
        const what = `capacity ${capacity}, refill ${refillPerSecond}/s, cost ${cost}`
        const policy = { bucket: 'x', capacity, refillPerSecond, cost, failureMode: 'closed' }
        let error: unknown
        try {
          checkPolicy(policy)
        } catch (err) {
          error = err
        }
        if (error !== undefined) {
          rejected++
          const message = error instanceof Error ? error.message : String(error)
          const names = /`policy\.(capacity|refillPerSecond)` must be (at most|at least) .*(finite number|2\^52 µs)/.test(message)
          if (!names || (error as { code?: unknown }).code !== 'TOLLGATE_INVALID_OPTION') failures.push(`${what}: rejected with ${message}`)
          continue
        }
        accepted++
        const key = `test:${tag}:${accepted}`
        const spec = { key, capacity, refillPerSecond, cost }
        try {
          const first = await store.decide([spec], true)
          const state = first.buckets[0]
          // Left: capacity - cost, less what rounding the full-at time up to
          // a whole microsecond takes (one microsecond of refill).
          const least = capacity - cost - refillPerSecond / 1e6 - capacity * 1e-9
          if (!first.allowed || state === undefined || !(state.remaining >= least && state.remaining <= capacity) ||
            !Number.isFinite(state.fullInUs)) {
            failures.push(`${what}: a new bucket should afford its cost, got ${JSON.stringify(first)}`)
          }
          // Spend again (denied once the bucket is short), peek, and the same
          // bucket next to a second one: every path of the script.
          await store.decide([spec], true)
          await store.decide([spec], false)
          const pair = await store.decide([spec, { ...spec, key: `${key}:b` }], true)
          if (pair.buckets.some((b) => !Number.isFinite(b.remaining) || !Number.isFinite(b.fullInUs) || !Number.isFinite(b.waitUs))) {
            failures.push(`${what}: not finite: ${JSON.stringify(pair)}`)
          }
        } catch (err) {
          failures.push(`${what}: ${err instanceof Error ? err.message : String(err)}`)
        }
      }
    }
  }
  t.comment(`${accepted} accepted, ${rejected} rejected`)
  t.same(failures.slice(0, 40), [], `no script error and no unnamed limit (${failures.length} failures)`)
  t.ok(accepted >= 200 && rejected >= 100, 'both sides of the bounds were swept')
})

t.test('the bounds: a window of exactly 2^52 us is accepted, one microsecond-ish more is not', async (t) => {
  const window = (capacity: number, refill: number): number => capacity * (1e6 / refill)
  const capacity = 2 ** 52 / 1e6
  t.equal(window(capacity, 1), 2 ** 52)
  t.doesNotThrow(() => checkPolicy({ bucket: 'x', capacity, refillPerSecond: 1, failureMode: 'open' }))
  t.throws(() => checkPolicy({ bucket: 'x', capacity: capacity * (1 + Number.EPSILON), refillPerSecond: 1, failureMode: 'open' }),
    { code: 'TOLLGATE_INVALID_OPTION', message: /`policy\.refillPerSecond` must be at least capacity \/ 4503599627\.370496 \(1\.0000000000000002\): an empty bucket may take at most 2\^52 µs/ })
  t.doesNotThrow(() => checkPolicy({ bucket: 'x', capacity: MAX_CAPACITY, refillPerSecond: 1e300, failureMode: 'open' }))
  t.throws(() => checkPolicy({ bucket: 'x', capacity: 1.797693134862316e302, refillPerSecond: 1e300, failureMode: 'open' }),
    { message: /`policy\.capacity` must be at most 1\.7976931348623154e\+302 \(capacity × 1e6 µs must be a finite number\)/ })
  t.doesNotThrow(() => checkPolicy({ bucket: 'x', capacity: 1e-300, refillPerSecond: MIN_REFILL, failureMode: 'open' }))
  t.throws(() => checkPolicy({ bucket: 'x', capacity: 1e-300, refillPerSecond: 5.5626846462680035e-303, failureMode: 'open' }),
    { message: /`policy\.refillPerSecond` must be at least 5\.562684646268004e-303 \(1e6 \/ refillPerSecond µs per token must be a finite number\)/ })

  // At the largest window, the script still writes an exact integer.
  const key = uniqueKey('bound')
  const s = spec(key, capacity, 1, capacity)
  const reply = await script.timed([s], true)
  t.same(reply.values, [2 ** 52], 'the whole window, in one spend')
  between(t, Number(await redis.get(key)) - 2 ** 52, reply.beforeUs, reply.afterUs, 0, 'stored exactly: now + 2^52')
  await redis.del(key)
})

t.test('a key holding a string that is not a bucket fails the call, like a key of the wrong type, naming the key', async (t) => {
  const tag = uniqueTag('garbage')
  const key = `test:${tag}:a`
  await redis.set(key, 'tokens:5', 'PX', 60_000)
  const named = new RegExp(`^WRONGTYPE ${key.replace(/[{}]/g, '\\$&')} holds a string that is not a tollgate bucket`)
  await t.rejects(script.run([spec(key, 10, 1)], true), named, 'one policy')
  await t.rejects(script.run([spec(`test:${tag}:b`, 10, 1), spec(key, 10, 1)], true), named, 'several')
  t.equal(await redis.get(key), 'tokens:5', 'and it is left as it was')
  t.equal(await redis.exists(`test:${tag}:b`), 0, 'nothing else written')
  await redis.rpush(`test:${tag}:list`, 'x')
  await t.rejects(script.run([spec(`test:${tag}:b`, 10, 1), spec(`test:${tag}:list`, 10, 1)], true), /^WRONGTYPE test:\{.*\}:list holds a list that is not a tollgate bucket/,
    'a key of another type among several: GET refuses it (MGET read it as a full bucket)')
  t.equal(await redis.type(`test:${tag}:list`), 'list', 'left a list')
  t.equal(await redis.exists(`test:${tag}:b`), 0, 'nothing else written')
})
