// Property test: on random sequences of (time gap, cost, consume or peek),
// lua/token-bucket.lua in Redis decides like the plain token bucket of
// test/helpers/model.ts (which shares no code or encoding with lib), and
// lib's in-process MemoryStore gives exactly the script's replies. The model
// needs Redis's clock at each decision, which the script does not return:
// the test runs a copy of the script text that only appends `now` to the
// reply (withClock in test/helpers/model.ts), so the decisions are the real
// script's. The gaps are the natural ones between calls plus short random
// sleeps.
//
// Replay a run: TOLLGATE_SEED=<seed printed below>. Check what the test
// catches: TOLLGATE_TEST_LUA=<modified copy of the script>.

import { randomInt } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { MemoryStore } from '../lib/store/memory-store.js'
import { bucketState, extReply, type BucketState } from '../lib/store/store.js'
import { ClockedExtRunner, ClockedScriptRunner, ReferenceHold, LUA, ReferenceBucket, ScriptRunner, randomSource, uniqueTag, withClock, type Shape, type ScriptSpec } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'

const seed = process.env.TOLLGATE_SEED === undefined ? randomInt(2 ** 31) : Number(process.env.TOLLGATE_SEED)
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)

const url = await redisUrl(t)
const redis = new Redis(url)
t.teardown(() => { redis.disconnect() })
// The real script text (or TOLLGATE_TEST_LUA's), with `now` appended to its reply.
const script = new ClockedScriptRunner(redis)

const STEPS = 250
/** Share of steps that are a peek (decide, spend nothing) rather than a consume. */
const PEEK_SHARE = 0.15
/** Share of steps preceded by a random sleep of up to `maxSleepMs`. */
const SLEEP_SHARE = 0.4

interface Scenario {
  name: string
  /** One or more buckets of one client, decided together (all or nothing). */
  buckets: Array<Shape & { costs: number[] }>
  maxSleepMs: number
}

// Capacities and rates chosen so that the sleeps refill a good part of the
// bucket: every scenario sees both allowed and denied steps. Some token
// intervals (1e6 / rate microseconds) are whole numbers, some are not.
const scenarios: Scenario[] = [
  { name: 'capacity 10, 100/s', buckets: [{ capacity: 10, refillPerSecond: 100, costs: [1, 1, 2, 3] }], maxSleepMs: 30 },
  { name: 'capacity 5, 333/s', buckets: [{ capacity: 5, refillPerSecond: 333, costs: [1, 0.5, 2] }], maxSleepMs: 8 },
  { name: 'capacity 2.5, 37.5/s, fractional costs', buckets: [{ capacity: 2.5, refillPerSecond: 37.5, costs: [0.5, 1, 1.25, 2.5] }], maxSleepMs: 40 },
  { name: 'capacity 3, 0.3/s, small fractional costs', buckets: [{ capacity: 3, refillPerSecond: 0.3, costs: [0.05, 0.1, 0.2] }], maxSleepMs: 20 },
  { name: 'capacity 1, 50/s, one token at a time', buckets: [{ capacity: 1, refillPerSecond: 50, costs: [1] }], maxSleepMs: 40 },
  { name: 'capacity 1, 60/s, one token at a time', buckets: [{ capacity: 1, refillPerSecond: 60, costs: [1] }], maxSleepMs: 40 },
  { name: 'capacity 100, 1000/7 per s, large costs', buckets: [{ capacity: 100, refillPerSecond: 1000 / 7, costs: [1, 5, 10, 25] }], maxSleepMs: 20 },
  {
    name: 'two buckets of one client, all or nothing',
    buckets: [
      { capacity: 4, refillPerSecond: 120, costs: [1, 2] },
      { capacity: 10, refillPerSecond: 70 / 3, costs: [1, 0.5, 3] }
    ],
    maxSleepMs: 30
  },
  {
    // A cost equal to the capacity, exactly affordable when full, and a
    // rate whose cost * (1e6 / rate) and cost * 1e6 / rate differ (7 at 7/s).
    name: 'two buckets, costs up to the capacity',
    buckets: [
      { capacity: 1, refillPerSecond: 60, costs: [1] },
      { capacity: 7, refillPerSecond: 7, costs: [0.01, 0.05, 7] }
    ],
    maxSleepMs: 40
  }
]

/** What one decision looked like, kept for the failure message. */
interface Mismatch {
  step: number
  what: string
  detail: Record<string, unknown>
}

interface Outcome {
  allowed: number
  denied: number
  skipped: number
  mismatches: Mismatch[]
}

/**
 * How far the script's token count may lag the model's, per bucket, in
 * microseconds of refill. The script stores the time the bucket is full
 * again as a whole microsecond, rounded up on every write, so each write
 * can put it behind the exact bucket by < 1 us of refill (under-admission);
 * these add up while the bucket never becomes full. It never leads: its
 * arithmetic is relative to now, so nothing else is rounded but for float
 * noise far below EPS_TOKENS.
 */
class Allowance {
  behindUs = 0

  wrote (): void {
    this.behindUs += 1
  }
}

/** Float noise in token counts computed two ways. */
const EPS_TOKENS = 1e-9

async function runScenario (scenario: Scenario, index: number): Promise<Outcome> {
  const random = randomSource(seed + index * 7919)
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)] as T
  const tag = uniqueTag(`model${index}`)
  const keys = scenario.buckets.map((_, i) => `test:${tag}:b${i}`)
  const models = scenario.buckets.map((shape) => new ReferenceBucket(shape))
  const allowances = scenario.buckets.map(() => new Allowance())
  let clock = 0
  const memory = new MemoryStore({ now: () => clock })
  const outcome: Outcome = { allowed: 0, denied: 0, skipped: 0, mismatches: [] }

  for (let step = 0; step < STEPS; step++) {
    if (random() < SLEEP_SHARE) await sleep(random() * scenario.maxSleepMs)
    const consume = random() >= PEEK_SHARE
    const specs: ScriptSpec[] = scenario.buckets.map((shape, i) => ({
      key: keys[i] as string,
      capacity: shape.capacity,
      refillPerSecond: shape.refillPerSecond,
      cost: pick(shape.costs)
    }))
    const reply = await script.run(specs, consume)
    const { values, nowUs } = reply
    // The script's reply as lib reads it; allowed when no value is negative.
    const states: BucketState[] = values.map((v, i) => bucketState(v, specs[i] as ScriptSpec))
    const scriptAllowed = values.every((v) => v >= 0)
    clock = nowUs
    const local = memory.decideSync(specs, consume)
    const fail = (what: string, detail: Record<string, unknown> = {}): void => {
      outcome.mismatches.push({ step, what, detail: { consume, specs, values, nowUs, local, ...detail } })
    }

    // The MemoryStore does the script's arithmetic on the same clock: its
    // replies must be the same to the last bit, not merely close.
    if (local.allowed !== scriptAllowed || JSON.stringify(local.buckets) !== JSON.stringify(states)) {
      fail('the MemoryStore and the script replied differently', { scriptStates: states })
    }

    // The model, on the script's clock.
    let modelAllowed = true
    let boundary = false
    const before: number[] = []
    for (let i = 0; i < specs.length; i++) {
      const model = models[i] as ReferenceBucket
      const allowance = allowances[i] as Allowance
      const spec = specs[i] as ScriptSpec
      const perUs = spec.refillPerSecond / 1e6
      const uncapped = model.advance(nowUs)
      // Past full by more than the script can lag: it is full as well.
      if (uncapped >= spec.capacity + allowance.behindUs * perUs) allowance.behindUs = 0
      before.push(model.tokens)
      if (!model.affords(spec.cost)) modelAllowed = false
      // A full bucket is exactly full in the script too (its key is gone or
      // in the past): it holds exactly `capacity`, and a cost of up to
      // `capacity` must be allowed, with no rounding excuse. This is the
      // steady state of a bucket that is used now and then, so it matters.
      const exactlyFull = model.tokens === spec.capacity && allowance.behindUs === 0
      // Otherwise, a boundary the script's rounding (above) can flip: the
      // model's margin over the cost is within what the script may lag by,
      // the rounding of every write since the bucket was last full.
      const margin = model.tokens - spec.cost
      if (!exactlyFull && margin >= -EPS_TOKENS && margin <= allowance.behindUs * perUs + EPS_TOKENS) boundary = true
    }

    let allowed = modelAllowed
    if (boundary) {
      // Skipped: within rounding of the cost, the model follows the script.
      outcome.skipped++
      allowed = scriptAllowed
    } else if (scriptAllowed !== modelAllowed) {
      fail(`the script ${scriptAllowed ? 'allowed' : 'denied'}, the model ${modelAllowed ? 'allowed' : 'denied'}`, { model: before })
      // Reported; carry on from the script's decision so one error is not
      // followed by a cascade of consequences.
      allowed = scriptAllowed
    }
    if (allowed) outcome.allowed++
    else outcome.denied++

    // Whatever the model says, an allowed call never leaves less than
    // nothing (but for the write's rounding up), and a peek that would be
    // allowed sees at least the cost in every bucket.
    if (scriptAllowed) {
      states.forEach((state, i) => {
        const spec = specs[i] as ScriptSpec
        const least = consume ? -(spec.refillPerSecond / 1e6 + EPS_TOKENS) : spec.cost - EPS_TOKENS
        if (!(state.remaining >= least)) fail(`the script allowed ${consume ? 'and left' : 'a peek with'} ${state.remaining} tokens in bucket ${i}`)
      })
    }

    for (let i = 0; i < specs.length; i++) {
      const spec = specs[i] as ScriptSpec
      const allowance = allowances[i] as Allowance
      const perUs = spec.refillPerSecond / 1e6
      const value = values[i] as number
      // A peek reports the tokens there are; an allowed consume, what is
      // left after the write, rounded up like one; a bucket that cannot pay
      // reports its wait rounded up to a whole microsecond, which makes the
      // tokens derived from it lag by less than one more.
      const spent = allowed && consume
      const expected = (before[i] as number) - (spent ? spec.cost : 0)
      const behind = (allowance.behindUs + (spent || value < 0 ? 1 : 0)) * perUs + EPS_TOKENS
      const got = (states[i] as BucketState).remaining
      const lag = expected - got
      if (!(lag >= -EPS_TOKENS && lag <= behind)) {
        fail(`bucket ${i}: the script reports ${got} tokens, the model ${expected}`, { lag, behind, model: before })
      }
      if (spent) {
        (models[i] as ReferenceBucket).spend(spec.cost)
        allowance.wrote()
      }
    }
  }
  return outcome
}

t.test('the script decides like the reference token bucket, and the MemoryStore exactly like the script', async (t) => {
  const started = Date.now()
  const outcomes = await Promise.all(scenarios.map(runScenario))
  let steps = 0
  let skipped = 0
  for (let i = 0; i < scenarios.length; i++) {
    const scenario = scenarios[i] as Scenario
    const outcome = outcomes[i] as Outcome
    steps += STEPS
    skipped += outcome.skipped
    t.comment(`${scenario.name}: ${outcome.allowed} allowed, ${outcome.denied} denied, ${outcome.skipped} skipped at the boundary`)
    t.same(outcome.mismatches.slice(0, 3), [], `${scenario.name}: no mismatch (${outcome.mismatches.length} found)`)
    // A sequence that never crosses the boundary would prove little.
    t.ok(outcome.allowed >= 10 && outcome.denied >= 10, `${scenario.name}: both sides seen`)
  }
  t.comment(`${steps} steps in ${Date.now() - started} ms, ${skipped} skipped`)
  // Skips must stay rare, or the comparison would be toothless.
  t.ok(skipped <= steps * 0.05, `${skipped} of ${steps} steps skipped (at most 5%)`)
})

t.test('the clocked copy is the script with its returns wrapped, and refuses a script it does not recognise', async (t) => {
  const clocked = withClock(LUA)
  // Undo the two changes: what is left must be the script, character for character.
  const helper = /\nlocal function clocked \(r\)\n[\s\S]*?\nend\n/
  t.match(clocked, helper, 'one local function added')
  t.equal(clocked.replace(helper, '\n').replace(/return clocked\((.+)\)$/gm, 'return $1'), LUA, 'and every return wrapped in it, nothing else')
  t.ok(clocked.indexOf('local function clocked') > clocked.indexOf('\nlocal now = '), 'defined after `now`, so it sees it')
  const returns = LUA.match(/^\s*return .+$/gm) ?? []
  t.ok(returns.length >= 3, `the script's ${returns.length} returns (one policy allowed and denied, several) are all wrapped`)
  t.throws(() => withClock(LUA.replace(/\nlocal now = /, '\nlocal clock = ')), /no longer has a `local now` line/,
    'a script whose clock is read differently breaks the test loudly')
})

t.test('the clocked copy replies like the script, plus the clock', async (t) => {
  const plain = new ScriptRunner(redis)
  const tag = uniqueTag('clocked')
  const one = (name: string): ScriptSpec => ({ key: `test:${tag}:${name}`, capacity: 2, refillPerSecond: 1e-6, cost: 1 })
  const single = await script.run([one('a')], true)
  t.same(single.values, [1e12], 'one policy: the value, and')
  t.ok(single.nowUs > 1e15, 'the clock')
  const raw = await plain.raw([one('a')], true)
  t.ok(typeof raw === 'number' && raw > 1e12 && raw <= 2e12, `the plain script: the same bucket, a plain integer reply (${String(raw)})`)
  const pair = await script.run([one('a'), one('b')], true)
  t.ok((pair.values[0] ?? 0) < 0 && pair.values[1] === 0, `several policies: one value each (${pair.values.join(', ')}) and the clock`)
})

t.test('the extended script (reservations, lockouts) decides like the reference, and the MemoryStore exactly like the script', async (t) => {
  const cases = [
    { name: 'reservations: capacity 3, 200/s, maxWait 20 ms', shape: { capacity: 3, refillPerSecond: 200 }, maxWaitUs: 20_000, costs: [1, 2], lockout: undefined, maxSleepMs: 15 },
    { name: 'lockout: capacity 2, 100/s, 3 denials then 30 ms', shape: { capacity: 2, refillPerSecond: 100 }, maxWaitUs: 0, costs: [1, 1.5], lockout: { after: 3, withinMs: 600_000, forMs: 30 }, maxSleepMs: 25 },
    { name: 'both: capacity 1, 60/s, maxWait 40 ms, 2 denials then 20 ms', shape: { capacity: 1, refillPerSecond: 60 }, maxWaitUs: 40_000, costs: [1, 0.5], lockout: { after: 2, withinMs: 600_000, forMs: 20 }, maxSleepMs: 20 },
    // Denials spaced around the counting period: some counts end before
    // the third denial, others lock out.
    { name: 'lockout periods: capacity 1, 20/s, 3 denials within 12 ms then 20 ms', shape: { capacity: 1, refillPerSecond: 20 }, maxWaitUs: 0, costs: [1], lockout: { after: 3, withinMs: 12, forMs: 20 }, maxSleepMs: 25 }
  ]
  const ext = new ClockedExtRunner(redis)
  for (const [index, c] of cases.entries()) {
    const random = randomSource(seed + 104729 * (index + 1))
    const key = `test:${uniqueTag(`ext${index}`)}:b`
    const model = new ReferenceHold(c.shape, c.maxWaitUs, c.lockout)
    let clock = 0
    const memory = new MemoryStore({ now: () => clock })
    const seen = { allowed: 0, denied: 0, locked: 0, waited: 0, skipped: 0 }
    let behindUs = 0
    const mismatches: string[] = []
    for (let step = 0; step < 200; step++) {
      if (random() < SLEEP_SHARE) await sleep(random() * c.maxSleepMs)
      const mode = random() < PEEK_SHARE ? '0' : c.maxWaitUs > 0 && random() < 0.7 ? '2' : '1'
      const cost = c.costs[Math.floor(random() * c.costs.length)] as number
      const call = { key, ...c.shape, cost, mode, maxWaitUs: c.maxWaitUs, lockout: c.lockout } as const
      const { value, extra, nowUs } = await ext.run(call)
      clock = nowUs
      const spec = { key, ...c.shape, cost, maxWaitUs: c.maxWaitUs, mayWait: mode === '2', lockout: c.lockout }
      const local = memory.decideExtSync(spec, mode !== '0')
      const reply = extReply(value, extra, spec)
      if (JSON.stringify(local) !== JSON.stringify(reply)) mismatches.push(`step ${step}: MemoryStore ${JSON.stringify(local)}, script ${JSON.stringify(reply)}`)
      model.bucket.advance(nowUs)
      // As in the test above: each write rounds the full-at time up by < 1 us,
      // adding up until the bucket is full again.
      if (model.bucket.tokens >= c.shape.capacity) behindUs = 0
      const margin = model.bucket.tokens + model.slack(mode) - cost
      const boundary = Math.abs(margin) < 1e-3 && nowUs >= model.blockedUntil
      if (boundary) seen.skipped++
      const expected = model.decide(nowUs, cost, mode, boundary ? reply.allowed : margin >= 0)
      if (!boundary && (reply.allowed !== (margin >= 0 && !expected.locked) || reply.locked !== expected.locked)) {
        mismatches.push(`step ${step} (mode ${mode}, cost ${cost}): script allowed ${String(reply.allowed)} locked ${String(reply.locked)}, model margin ${margin} locked ${String(expected.locked)}`)
      }
      if (reply.allowed && !(reply.delayUs - expected.delayUs >= -1e-6 && reply.delayUs - expected.delayUs <= behindUs + 1)) {
        mismatches.push(`step ${step}: delay ${reply.delayUs} us, model ${expected.delayUs} (may lag ${behindUs} us)`)
      }
      if (reply.allowed && mode !== '0') behindUs++
      if (reply.allowed) seen.allowed++
      else seen.denied++
      if (reply.locked) seen.locked++
      if (reply.delayUs > 0) seen.waited++
    }
    t.comment(`${c.name}: ${JSON.stringify(seen)}`)
    t.same(mismatches.slice(0, 3), [], `${c.name}: no mismatch (${mismatches.length})`)
    t.ok(seen.allowed >= 10 && seen.denied >= 10, `${c.name}: both sides seen`)
    if (c.maxWaitUs > 0) t.ok(seen.waited >= 5, `${c.name}: reservations seen`)
    if (c.lockout !== undefined) t.ok(seen.locked >= 5, `${c.name}: lockouts seen`)
    if (c.lockout !== undefined && c.lockout.withinMs < 1000) t.ok(model.lapsed >= 5, `${c.name}: counts that ended with their period (${model.lapsed})`)
  }
})
