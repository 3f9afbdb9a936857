// Property test of charging by outcome: on random sequences of reserves and
// settlements (refunds, extra charges, debts; one bucket and several of one
// client), lua/settle.lua in Redis decides like a plain token bucket with
// debt written from the definition (test/helpers/model.ts's ReferenceBucket
// plus the two settlement rules below), and lib's MemoryStore gives exactly
// the script's replies on the script's clock.
//
// The definition: a reserve of `cost` is allowed when every bucket holds at
// least `cost` tokens, and then takes them from all (all or nothing). A
// settlement of `actual` for a reservation of `cost` adds `cost - actual`
// tokens: a refund never takes the bucket past capacity, a charge may take
// it below zero, down to -capacity (the rest is forgiven).
//
// The script's clock: a copy whose two `return out` lines also append `now`
// (nothing else changed; checked below). Replay a run with
// TOLLGATE_SEED=<seed printed below>; check what the test catches with
// TOLLGATE_TEST_SETTLE_LUA=<modified copy of lua/settle.lua>.

import { randomInt } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { MemoryStore } from '../lib/memory-store.js'
import { pushBucketArgs } from '../lib/redis-store.js'
import { bucketState, type BucketSpec } from '../lib/store.js'
import { LuaRunner, ReferenceBucket, randomSource, uniqueTag, type Shape } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'

const SETTLE_LUA = readFileSync(process.env.TOLLGATE_TEST_SETTLE_LUA ?? new URL('../lua/settle.lua', import.meta.url), 'utf8')
const seed = process.env.TOLLGATE_SEED === undefined ? randomInt(2 ** 31) : Number(process.env.TOLLGATE_SEED)
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)

const url = await redisUrl(t)
const redis = new Redis(url)
t.teardown(() => { redis.disconnect() })

/** The script with `now` appended to both of its replies. */
function clockedSettle (lua: string): string {
  const returns = /^(\s*)return out$/gm
  if ((lua.match(returns) ?? []).length !== 2 || !/\nlocal now = /.test(lua)) throw new Error('lua/settle.lua changed shape; update clockedSettle')
  return lua.replace(returns, '$1out[#out + 1] = now\n$1return out')
}
const runner = new LuaRunner(redis, clockedSettle(SETTLE_LUA))

async function call (specs: readonly BucketSpec[], mode: '1' | '2', changes: readonly number[] = []): Promise<{ values: number[], nowUs: number }> {
  const args: Array<string | number> = [mode]
  specs.forEach((spec, i) => {
    if (mode === '1') pushBucketArgs(args, spec)
    else args.push(spec.capacity * (1e6 / spec.refillPerSecond), changes[i] as number, 0)
  })
  const reply = await runner.eval(specs.map((s) => s.key), args) as number[]
  return { values: reply.slice(0, specs.length), nowUs: reply[specs.length] as number }
}

class DebtBucket extends ReferenceBucket {
  /** Adds `tokens` (negative: a charge), within [-capacity, capacity]. */
  settle (tokens: number): void {
    this.tokens = Math.max(-this.capacity, Math.min(this.capacity, this.tokens + tokens))
  }
}

interface Scenario {
  name: string
  buckets: Array<Shape & { costs: number[] }>
  /** Actual costs, as multiples of the reserved cost. */
  actuals: number[]
  maxSleepMs: number
}

const scenarios: Scenario[] = [
  { name: 'capacity 10, 100/s', buckets: [{ capacity: 10, refillPerSecond: 100, costs: [1, 2, 3] }], actuals: [0, 0.5, 1, 2, 6], maxSleepMs: 30 },
  { name: 'capacity 2.5, 37.5/s, fractional', buckets: [{ capacity: 2.5, refillPerSecond: 37.5, costs: [0.5, 1.25] }], actuals: [0, 0.3, 1, 3], maxSleepMs: 40 },
  { name: 'capacity 5, 100/s, deep debts', buckets: [{ capacity: 5, refillPerSecond: 100, costs: [1, 2] }], actuals: [0, 0.5, 1, 4, 9], maxSleepMs: 60 },
  {
    name: 'two buckets of one client, all or nothing',
    buckets: [
      { capacity: 4, refillPerSecond: 120, costs: [1, 2] },
      { capacity: 10, refillPerSecond: 70 / 3, costs: [1, 3] }
    ],
    actuals: [0, 0.5, 1, 3],
    maxSleepMs: 30
  }
]

const STEPS = 300
const EPS = 1e-9

interface Outcome { allowed: number, denied: number, refunds: number, charges: number, debts: number, floored: number, skipped: number, mismatches: string[] }

async function runScenario (scenario: Scenario, index: number): Promise<Outcome> {
  const random = randomSource(seed + index * 104729)
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)] as T
  const tag = uniqueTag(`settle${index}`)
  const models = scenario.buckets.map((shape) => new DebtBucket(shape))
  /** Microseconds of refill each bucket may lag the model by: each write rounds its full-at time up by < 1 us. */
  const behind = scenario.buckets.map(() => 0)
  let clock = 0
  const memory = new MemoryStore({ now: () => clock })
  const outstanding: BucketSpec[][] = []
  const out: Outcome = { allowed: 0, denied: 0, refunds: 0, charges: 0, debts: 0, floored: 0, skipped: 0, mismatches: [] }

  for (let step = 0; step < STEPS; step++) {
    if (random() < 0.4) await sleep(random() * scenario.maxSleepMs)
    const settling = outstanding.length > 0 && random() < 0.5
    const specs = settling
      ? outstanding.splice(Math.floor(random() * outstanding.length), 1)[0] as BucketSpec[]
      : scenario.buckets.map((shape, i) => ({ key: `test:${tag}:b${i}`, capacity: shape.capacity, refillPerSecond: shape.refillPerSecond, cost: pick(shape.costs) }))
    const factor = pick(scenario.actuals)
    const changes = specs.map((s) => (s.cost * factor - s.cost) * 1e6 / s.refillPerSecond)
    const { values, nowUs } = await call(specs, settling ? '2' : '1', changes)
    clock = nowUs
    const local = settling ? memory.settleSync(specs, changes) : memory.reserveSync(specs).buckets.map((b) => b.waitUs > 0 ? -b.waitUs : b.fullInUs)
    if (JSON.stringify(local) !== JSON.stringify(values)) out.mismatches.push(`step ${step}: MemoryStore ${JSON.stringify(local)}, script ${JSON.stringify(values)}`)

    const before = models.map((m, i) => {
      const uncapped = m.advance(nowUs)
      if (uncapped >= m.capacity + (behind[i] as number) * m.refillPerSecond / 1e6) behind[i] = 0
      return m.tokens
    })
    const scriptAllowed = values.every((v) => v >= 0)
    if (!settling) {
      let modelAllowed = true
      let boundary = false
      specs.forEach((spec, i) => {
        const margin = (before[i] as number) - spec.cost
        if (margin < -EPS) modelAllowed = false
        const full = before[i] === spec.capacity && behind[i] === 0
        if (!full && margin >= -EPS && margin <= (behind[i] as number) * spec.refillPerSecond / 1e6 + EPS) boundary = true
      })
      if (boundary) out.skipped++
      else if (modelAllowed !== scriptAllowed) out.mismatches.push(`step ${step}: script ${scriptAllowed ? 'allowed' : 'denied'}, model ${modelAllowed ? 'allowed' : 'denied'} (${JSON.stringify(before)})`)
      if (scriptAllowed) {
        out.allowed++
        specs.forEach((spec, i) => { (models[i] as DebtBucket).spend(spec.cost) })
        outstanding.push(specs)
      } else {
        out.denied++
      }
    }
    const full = specs.map(() => false)
    if (settling) {
      specs.forEach((spec, i) => {
        const model = models[i] as DebtBucket
        const back = spec.cost - spec.cost * factor
        if (back > 0) out.refunds++
        if (back < 0) out.charges++
        model.settle(back)
        if (model.tokens < 0) out.debts++
        if (model.tokens === -spec.capacity) out.floored++
        // Refunded past full by more than the script may lag: it is exactly full too.
        full[i] = (before[i] as number) + back >= spec.capacity + (behind[i] as number) * spec.refillPerSecond / 1e6
      })
    }
    specs.forEach((spec, i) => {
      if (full[i] === true) behind[i] = 0
      else if (settling || scriptAllowed) behind[i] = (behind[i] as number) + 1
      const tokens = bucketState(values[i] as number, spec).remaining
      const expected = (models[i] as DebtBucket).tokens
      const lag = expected - tokens
      const slack = ((behind[i] as number) + 1) * spec.refillPerSecond / 1e6 + EPS
      if (!(lag >= -EPS && lag <= slack)) out.mismatches.push(`step ${step} bucket ${i}: script ${tokens} tokens, model ${expected} (lag ${lag}, allowed ${slack})`)
    })
  }
  return out
}

t.test('settlements: the script decides like the token bucket with debt, the MemoryStore exactly like the script', async (t) => {
  const outcomes = await Promise.all(scenarios.map(runScenario))
  scenarios.forEach((scenario, i) => {
    const o = outcomes[i] as Outcome
    t.comment(`${scenario.name}: ${o.allowed} allowed, ${o.denied} denied, ${o.refunds} refunds, ${o.charges} charges, ${o.debts} in debt after (${o.floored} at -capacity), ${o.skipped} skipped`)
    t.same(o.mismatches.slice(0, 3), [], `${scenario.name}: no mismatch (${o.mismatches.length} found)`)
    t.ok(o.allowed >= 10 && o.denied >= 10 && o.refunds >= 5 && o.charges >= 5 && o.debts >= 1, `${scenario.name}: every kind of step seen`)
    if (i === 2) t.ok(o.floored >= 3, 'charges past -capacity are cut there')
    t.ok(o.skipped <= STEPS * 0.05, `${scenario.name}: ${o.skipped} skipped at the boundary`)
  })
})

t.test('the clocked copy changes only the replies', async (t) => {
  const clocked = clockedSettle(SETTLE_LUA)
  t.equal(clocked.replace(/^(\s*)out\[#out \+ 1\] = now\n/gm, ''), SETTLE_LUA)
  t.throws(() => clockedSettle(SETTLE_LUA.replace(/return out$/m, 'return {}')), /changed shape/)
})
