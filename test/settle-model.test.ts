// Property test of charging by outcome: on random sequences of reserves and
// settlements (refunds, extra charges, debts; one bucket and several of one
// client), lua/settle.lua in Redis decides like a plain token bucket with
// debt written from the definition (test/helpers/model.ts's ReferenceBucket
// plus the settlement rules below), and lib's MemoryStore gives exactly
// the script's replies on the script's clock.
//
// The definition: a reserve of `cost` is allowed when every bucket holds at
// least `cost` tokens, and then takes them from all (all or nothing). A
// settlement of `actual` for a reservation of `cost` adds `cost - actual`
// tokens: a charge may take the bucket below zero, down to -capacity (the
// rest is forgiven); a refund never takes it past capacity, nor gives back
// more than the reservation's part of the bucket still holds, which is at
// least the larger of two lines, in tokens: the tokens missing right after
// its reserve, less the refill since and every refund given back since;
// and its own cost, less the refill since (the rule of lua/settle.lua's
// header, drawn here from the model's own token counts).
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
import { MemoryStore } from '../lib/store/memory-store.js'
import { pushBucketArgs } from '../lib/store/redis-store.js'
import { bucketState, refundKey, type BucketSpec, type ReserveMark } from '../lib/store/store.js'
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


interface Reply { values: number[], marks: ReserveMark[], nowUs: number }

async function call (specs: readonly BucketSpec[], mode: '1' | '2', changes: readonly number[] = [], marks: readonly ReserveMark[] = []): Promise<Reply> {
  const args: Array<string | number> = [mode]
  specs.forEach((spec, i) => {
    if (mode === '1') {
      pushBucketArgs(args, spec)
    } else {
      const { epoch, mark, floor } = marks[i] as ReserveMark
      args.push(spec.capacity * (1e6 / spec.refillPerSecond), changes[i] as number, epoch, mark, floor)
    }
  })
  const reply = await runner.eval(specs.flatMap((s) => [s.key, refundKey(s.key)]), args) as number[]
  const n = specs.length
  const out: ReserveMark[] = []
  if (mode === '1' && reply.length > n + 1) {
    for (let i = 0; i < n; i++) out.push({ epoch: reply[n + 3 * i] as number, mark: reply[n + 3 * i + 1] as number, floor: reply[n + 3 * i + 2] as number })
  }
  return { values: reply.slice(0, n), marks: out, nowUs: reply[reply.length - 1] as number }
}

/** What the model keeps of one bucket of a reservation, from its reserve. */
interface Line {
  /** Tokens missing right after the reserve. */
  missing: number
  /** The bucket's refunds given back so far, tokens. */
  refunded: number
  atUs: number
  cost: number
}

class DebtBucket extends ReferenceBucket {
  /** Tokens given back by refunds so far. */
  refunded = 0

  /** The line of a reservation of `cost` just spent at `nowUs`. */
  line (cost: number, nowUs: number): Line {
    return { missing: this.capacity - this.tokens, refunded: this.refunded, atUs: nowUs, cost }
  }

  /**
   * Refunds `tokens`, at most what the reservation's part of the bucket still
   * holds, never past capacity; returns the tokens given back and whether
   * the line cut them.
   */
  refund (tokens: number, line: Line, nowUs: number): { given: number, cut: boolean } {
    const refill = (nowUs - line.atUs) / 1e6 * this.refillPerSecond
    const holds = Math.max(0, line.missing - refill - (this.refunded - line.refunded), line.cost - refill)
    const given = Math.min(tokens, holds)
    const before = this.tokens
    this.tokens = Math.min(this.capacity, this.tokens + given)
    this.refunded += this.tokens - before
    return { given, cut: holds < tokens }
  }

  /** Charges `tokens`, down to -capacity (the rest is forgiven). */
  charge (tokens: number): void {
    this.tokens = Math.max(-this.capacity, this.tokens - tokens)
  }
}

/** A reservation awaiting its settlement: its buckets, the script's and the MemoryStore's marks, the model's lines. */
interface Held { specs: BucketSpec[], marks: ReserveMark[], local: ReserveMark[], lines: Line[] }

interface Scenario {
  name: string
  buckets: Array<Shape & { costs: number[] }>
  /** Actual costs, as multiples of the reserved cost. */
  actuals: number[]
  maxSleepMs: number
  /** Share of the steps that settle an outstanding reservation, when there is one. */
  settleShare: number
  /**
   * Whether the scenario must end with a request in debt. Those whose costs
   * are mostly refunded (the point of the fourth) reach a debt only when
   * Redis's clock moved little between steps, which a loaded machine does
   * not promise; the others charge up to 6x and always do.
   */
  debts: boolean
}

const scenarios: Scenario[] = [
  { name: 'capacity 10, 100/s', buckets: [{ capacity: 10, refillPerSecond: 100, costs: [1, 2, 3] }], actuals: [0, 0.5, 1, 2, 6], maxSleepMs: 30, settleShare: 0.5, debts: true },
  { name: 'capacity 2.5, 37.5/s, fractional', buckets: [{ capacity: 2.5, refillPerSecond: 37.5, costs: [0.5, 1.25] }], actuals: [0, 0.3, 1, 3], maxSleepMs: 40, settleShare: 0.5, debts: true },
  { name: 'capacity 5, 100/s, deep debts', buckets: [{ capacity: 5, refillPerSecond: 100, costs: [1, 2] }], actuals: [0, 0.5, 1, 4, 9], maxSleepMs: 60, settleShare: 0.5, debts: true },
  {
    name: 'capacity 8, 200/s, reservations held for many windows, mostly refunded',
    buckets: [{ capacity: 8, refillPerSecond: 200, costs: [1, 2, 4] }],
    actuals: [0, 0, 0.25, 1, 2],
    maxSleepMs: 30,
    settleShare: 0.3,
    debts: false
  },
  {
    name: 'two buckets of one client, all or nothing',
    buckets: [
      { capacity: 4, refillPerSecond: 120, costs: [1, 2] },
      { capacity: 10, refillPerSecond: 70 / 3, costs: [1, 3] }
    ],
    actuals: [0, 0.5, 1, 3],
    maxSleepMs: 30,
    settleShare: 0.5,
    debts: true
  }
]

const STEPS = 300
const EPS = 1e-9

interface Outcome { allowed: number, denied: number, refunds: number, cut: number, charges: number, debts: number, floored: number, skipped: number, mismatches: string[] }

async function runScenario (scenario: Scenario, index: number): Promise<Outcome> {
  const random = randomSource(seed + index * 104729)
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)] as T
  const tag = uniqueTag(`settle${index}`)
  const models = scenario.buckets.map((shape) => new DebtBucket(shape))
  // Microseconds of refill each bucket may lag the model by: each write
  // rounds its full-at time up by < 1 us. Once a line has cut a refund, it
  // may lead the model by as much (`ahead`): the script draws the line from
  // its own full-at time, rounded up, and counts refunds in whole
  // microseconds. Both end when the bucket is full again.
  const behind = scenario.buckets.map(() => 0)
  const ahead = scenario.buckets.map(() => false)
  let clock = 0
  const memory = new MemoryStore({ now: () => clock })
  const outstanding: Held[] = []
  const out: Outcome = { allowed: 0, denied: 0, refunds: 0, cut: 0, charges: 0, debts: 0, floored: 0, skipped: 0, mismatches: [] }

  for (let step = 0; step < STEPS; step++) {
    if (random() < 0.4) await sleep(random() * scenario.maxSleepMs)
    const settling = outstanding.length > 0 && random() < scenario.settleShare
    const held = settling ? outstanding.splice(Math.floor(random() * outstanding.length), 1)[0] as Held : undefined
    const specs = held?.specs ?? scenario.buckets.map((shape, i) => ({ key: `test:${tag}:b${i}`, capacity: shape.capacity, refillPerSecond: shape.refillPerSecond, cost: pick(shape.costs) }))
    const factor = pick(scenario.actuals)
    const changes = specs.map((s) => (s.cost * factor - s.cost) * 1e6 / s.refillPerSecond)
    const { values, marks, nowUs } = await call(specs, held === undefined ? '1' : '2', changes, held?.marks)
    clock = nowUs
    let reserved: Held | undefined
    if (held !== undefined) {
      // (The MemoryStore has no reservation to settle if it denied what the script allowed: a mismatch already.)
      const local = held.local.length === 0 ? 'none' : memory.settleSync(specs, changes, held.local)
      if (JSON.stringify(local) !== JSON.stringify(values)) out.mismatches.push(`step ${step}: MemoryStore ${JSON.stringify(local)}, script ${JSON.stringify(values)}`)
    } else {
      const reply = memory.reserveSync(specs)
      const local = { values: reply.buckets.map((b) => b.waitUs > 0 ? -b.waitUs : b.fullInUs), marks: reply.marks }
      if (JSON.stringify(local) !== JSON.stringify({ values, marks })) out.mismatches.push(`step ${step}: MemoryStore ${JSON.stringify(local)}, script ${JSON.stringify({ values, marks })}`)
      if (marks.length > 0) reserved = { specs, marks, local: reply.marks, lines: [] }
    }

    /** How far the script may lag (or, once ahead, lead) the model, in tokens. */
    const tolerance = (i: number): number => ((behind[i] as number) + 1) * (specs[i] as BucketSpec).refillPerSecond / 1e6 + EPS
    const before = models.map((m, i) => {
      const uncapped = m.advance(nowUs)
      if (uncapped >= m.capacity + tolerance(i)) {
        behind[i] = 0
        ahead[i] = false
      }
      return m.tokens
    })
    const scriptAllowed = values.every((v) => v >= 0)
    if (held === undefined) {
      let modelAllowed = true
      let boundary = false
      specs.forEach((spec, i) => {
        const margin = (before[i] as number) - spec.cost
        if (margin < -EPS) modelAllowed = false
        const full = before[i] === spec.capacity && behind[i] === 0
        const lowest = ahead[i] === true ? -tolerance(i) : -EPS
        if (!full && margin >= lowest && margin <= (behind[i] as number) * spec.refillPerSecond / 1e6 + EPS) boundary = true
      })
      if (boundary) out.skipped++
      else if (modelAllowed !== scriptAllowed) out.mismatches.push(`step ${step}: script ${scriptAllowed ? 'allowed' : 'denied'}, model ${modelAllowed ? 'allowed' : 'denied'} (${JSON.stringify(before)})`)
      if (reserved !== undefined) {
        out.allowed++
        const lines = reserved.lines
        specs.forEach((spec, i) => {
          const model = models[i] as DebtBucket
          model.spend(spec.cost)
          lines.push(model.line(spec.cost, nowUs))
        })
        outstanding.push(reserved)
      } else {
        out.denied++
      }
    }
    const full = specs.map(() => false)
    if (held !== undefined) {
      specs.forEach((spec, i) => {
        const model = models[i] as DebtBucket
        const back = spec.cost - spec.cost * factor
        let given = back
        if (back > 0) {
          out.refunds++
          const refund = model.refund(back, held.lines[i] as Line, nowUs)
          given = refund.given
          if (refund.cut) {
            out.cut++
            ahead[i] = true
          }
        }
        if (back < 0) {
          out.charges++
          model.charge(-back)
        }
        if (model.tokens < 0) out.debts++
        if (model.tokens === -spec.capacity) out.floored++
        // Refunded past full by more than the script may differ by: it is exactly full too.
        full[i] = back > 0 && (before[i] as number) + given >= spec.capacity + 2 * tolerance(i)
      })
    }
    specs.forEach((spec, i) => {
      if (full[i] === true) {
        behind[i] = 0
        ahead[i] = false
      } else if (held !== undefined || scriptAllowed) {
        behind[i] = (behind[i] as number) + 1
      }
      const tokens = bucketState(values[i] as number, spec).remaining
      const expected = (models[i] as DebtBucket).tokens
      const lag = expected - tokens
      const lowest = ahead[i] === true ? -tolerance(i) : -EPS
      if (!(lag >= lowest && lag <= tolerance(i))) out.mismatches.push(`step ${step} bucket ${i}: script ${tokens} tokens, model ${expected} (lag ${lag}, allowed ${lowest} to ${tolerance(i)})`)
    })
  }
  return out
}

t.test('settlements: the script decides like the token bucket with debt, the MemoryStore exactly like the script', async (t) => {
  const outcomes = await Promise.all(scenarios.map(runScenario))
  scenarios.forEach((scenario, i) => {
    const o = outcomes[i] as Outcome
    t.comment(`${scenario.name}: ${o.allowed} allowed, ${o.denied} denied, ${o.refunds} refunds (${o.cut} cut by their line), ${o.charges} charges, ${o.debts} in debt after (${o.floored} at -capacity), ${o.skipped} skipped`)
    t.same(o.mismatches.slice(0, 3), [], `${scenario.name}: no mismatch (${o.mismatches.length} found)`)
    t.ok(o.allowed >= 10 && o.denied >= 10 && o.refunds >= 5 && o.charges >= 5 && (!scenario.debts || o.debts >= 1), `${scenario.name}: every kind of step seen`)
    if (i === 2) t.ok(o.floored >= 3, 'charges past -capacity are cut there')
    if (i === 3) t.ok(o.cut >= 10, 'refunds cut by their line')
    t.ok(o.skipped <= STEPS * 0.05, `${scenario.name}: ${o.skipped} skipped at the boundary`)
  })
})

t.test('the clocked copy changes only the replies', async (t) => {
  const clocked = clockedSettle(SETTLE_LUA)
  t.equal(clocked.replace(/^(\s*)out\[#out \+ 1\] = now\n/gm, ''), SETTLE_LUA)
  t.throws(() => clockedSettle(SETTLE_LUA.replace(/return out$/m, 'return {}')), /changed shape/)
})

t.test('clock steps: a step back cancels the refunds of earlier reservations, a step forward only lowers them; the bucket costs at most two windows', async (t) => {
  // The state a step of Redis's clock leaves: every stored time (the
  // full-at time, the refund key's epoch and last write) and the reserve's
  // floor in the handle move by the step against the clock; a mark is on
  // its epoch's own clock and does not move. Without the check of the last
  // write, the step back refunded the 4 tokens (16e6 us until full).
  const HOUR_US = 3600e6
  const shape = { capacity: 10, refillPerSecond: 1 }
  const window = 10e6
  const shift = async (key: string, marks: ReserveMark[], byUs: number): Promise<ReserveMark[]> => {
    const fullAt = Number(await redis.get(key))
    const [e, c, last] = String(await redis.get(refundKey(key))).split(' ').map(Number) as [number, number, number]
    await redis.set(key, String(fullAt + byUs), 'PX', 3 * 3600e3)
    await redis.set(refundKey(key), `${e + byUs} ${c} ${last + byUs}`, 'PX', 3 * 3600e3)
    return marks.map((m) => ({ epoch: m.epoch + byUs, mark: m.mark, floor: m.floor + byUs }))
  }

  const back = { key: `test:${uniqueTag('step')}:b`, ...shape, cost: 4 }
  const reserved = await call([back], '1')
  t.equal(reserved.values[0], 4e6, 'reserved 4 tokens of a full bucket')
  const settled = await call([back], '2', [-4e6], await shift(back.key, reserved.marks, HOUR_US))
  t.same(settled.values, [2 * window], 'a step back of an hour: nothing refunded; the bucket reads two windows from full, not an hour')
  // (The bucket then refills for two windows; its key stands for that time.)
  await redis.del(back.key)
  const next = await call([back], '1')
  t.equal((next.marks[0] as ReserveMark).epoch, next.nowUs, 'the next reserve starts a new epoch')
  const refunded = await call([back], '2', [-4e6], next.marks)
  t.ok((refunded.values[0] as number) === 0, `and its own refund is given back (${next.values[0]} -> ${refunded.values[0]} us until full)`)

  // A step forward of 3 s under two reservations of 4: the bucket reads 3 s
  // fuller, so the lower reservation has 1 s of its layer left, and its
  // refund gives back that much, not 4.
  const forward = { key: `test:${uniqueTag('step')}:f`, ...shape, cost: 4 }
  const lower = await call([forward], '1')
  await call([forward], '1')
  const cut = await call([forward], '2', [-4e6], await shift(forward.key, lower.marks, -3e6))
  t.ok(Math.abs((cut.values[0] as number) - 4e6) < 2000, `a step forward of 3 s: 1 s of 4 refunded (${cut.values[0]} us until full, 5 s before)`)

  // The MemoryStore, on a clock that steps.
  let clock = 1e15
  const memory = new MemoryStore({ now: () => clock })
  const spec = { key: 'm', ...shape, cost: 4 }
  const first = memory.reserveSync([spec])
  clock -= HOUR_US
  t.same(memory.settleSync([spec], [-4e6], first.marks), [2 * window], 'MemoryStore, back: nothing refunded, two windows at most')
  clock += 2 * window
  const second = memory.reserveSync([spec])
  t.equal(second.marks[0]?.epoch, clock, 'two windows later, still before the last write: a new epoch')
  memory.reserveSync([spec])
  clock += 3e6
  t.same(memory.settleSync([spec], [-4e6], second.marks), [4e6], 'MemoryStore, forward 3 s: 1 s of 4 refunded')
})
