// draft-11 headers (docs/reference/headers.md) against the reference token
// bucket, over random sequences on the in-process store with a fake clock:
// every mode's fields parse as RFC 9651 structured fields; in draft-11, `r`
// is the whole tokens the bucket holds, spending `r` within `t` never meets a
// denial, `t` is the least whole second by which the bucket refills what the
// client may spend at once, and on a denial Retry-After is no earlier than
// the end of the stated window and the request passes once it is over.

import t from 'tap'
import { parseItem, parseList, type Item } from 'structured-headers'
import { createCore } from '../../lib/core/limiter.js'
import { MAX_HEADER_INTEGER, PolicyHeaders, headerPairs, type HeaderMode } from '../../lib/http/headers.js'
import type { Decision, Policy } from '../../lib/core/types.js'
import { ReferenceBucket, randomSource } from '../helpers/model.js'
import { FakeTime } from './helpers/fake-time.js'
import type { Test } from './helpers/option-error.js'

const MODES = ['draft-6', 'draft-10', 'draft-11', 'legacy'] as const

function headersOf (mode: HeaderMode, decision: Decision, policy: Policy): Record<string, string> {
  const shown = new PolicyHeaders([policy], [])
  return Object.fromEntries(headerPairs(mode, decision, shown).map(([n, v]) => [n, String(v)]))
}

/** Every field of every mode parsed: integers for the single-number fields, lists for the rest. */
function checkParses (t: Test, decision: Decision, policy: Policy): void {
  for (const mode of MODES) {
    for (const [name, value] of Object.entries(headersOf(mode, decision, policy))) {
      const list = mode.startsWith('draft-1') || name === 'ratelimit-policy'
      const ok = list ? parseList(value).length > 0 : Number.isInteger(parseItem(value)[0])
      if (!ok) t.fail(`${mode} ${name}: ${value} does not parse`)
    }
  }
}

/** draft-11's RateLimit of one policy as { r, t }. */
function draft11 (decision: Decision, policy: Policy): { r: number, t: number, retry: number | undefined } {
  const h = headersOf('draft-11', decision, policy)
  const [member] = parseList(h.ratelimit ?? '') as Item[]
  const params = Object.fromEntries(member?.[1] ?? [])
  const retry = h['retry-after'] === undefined ? undefined : Number(parseItem(h['retry-after'])[0])
  return { r: Number(params.r), t: Number(params.t), retry }
}

interface Run {
  time: FakeTime
  model: ReferenceBucket
  consume: (cost: number) => Promise<Decision>
}

function runOf (t: Test, policy: Policy): Run {
  const time = new FakeTime()
  const { limiter } = createCore({}, { time })
  t.teardown(() => limiter.close())
  const model = new ReferenceBucket(policy)
  return {
    time,
    model,
    consume: async (cost) => {
      const decision = await limiter.consume('c', { ...policy, cost })
      model.advance(time.micros())
      t.equal(decision.allowed, model.affords(cost), 'the store decides as the reference bucket')
      if (decision.allowed) model.spend(cost)
      return decision
    }
  }
}

/** Spends `r` requests of cost 1 at random moments within `t` seconds: none may be denied. */
async function spendWithin (t: Test, run: Run, r: number, window: number, random: () => number): Promise<void> {
  const moments = Array.from({ length: r }, () => Math.floor(random() * window * 1000)).sort((a, b) => a - b)
  let at = 0
  for (const moment of moments) {
    await run.time.advance(moment - at)
    at = moment
    const d = await run.consume(1)
    if (!d.allowed) t.fail(`request at ${moment} ms of a stated ${r} within ${window} s was denied`)
  }
}

/** On a denial: Retry-After is not before the stated window ends, and the request passes then. */
function checkDenial (t: Test, run: Run, stated: { r: number, t: number, retry: number | undefined }, cost: number): void {
  if (stated.retry === undefined || stated.retry < stated.t) t.fail(`Retry-After ${String(stated.retry)} before the end of t=${stated.t}`)
  const later = new ReferenceBucket(run.model)
  later.tokens = run.model.tokens
  later.lastUs = run.model.lastUs
  later.advance((run.model.lastUs ?? 0) + (stated.retry ?? 0) * 1e6)
  if (!later.affords(cost)) t.fail(`cost ${cost} still denied after Retry-After ${String(stated.retry)}`)
}

/** On an allowance: t is the least whole second by which max(r, 1) tokens refill. */
function checkWindow (t: Test, policy: Policy, stated: { r: number, t: number }): void {
  const need = Math.max(stated.r, 1) / policy.refillPerSecond
  if (stated.t < need - 1e-9 || (stated.t > 1 && stated.t - 1 >= need + 1e-9)) {
    t.fail(`t=${stated.t} is not ceil(${Math.max(stated.r, 1)} / ${policy.refillPerSecond})`)
  }
}

async function sequence (t: Test, seed: number): Promise<void> {
  const random = randomSource(seed)
  const policy: Policy = {
    bucket: 'GET /x',
    capacity: 2 + Math.floor(random() * 20),
    refillPerSecond: [0.05, 0.5, 1, 3, 20][Math.floor(random() * 5)] ?? 1,
    cost: 1,
    failureMode: 'open'
  }
  const run = runOf(t, policy)
  for (let step = 0; step < 60; step++) {
    await run.time.advance(Math.floor(random() * 3000))
    const cost = [1, 1, 2, 0.5][Math.floor(random() * 4)] ?? 1
    const decision = await run.consume(cost)
    checkParses(t, decision, policy)
    const stated = draft11(decision, policy)
    if (stated.r > run.model.tokens + 1e-9 || stated.r < run.model.tokens - 1 - 1e-9) t.fail(`r=${stated.r} is not the whole tokens of ${run.model.tokens}`)
    if (decision.allowed) checkWindow(t, policy, stated)
    else checkDenial(t, run, stated, cost)
    if (stated.r > 0 && random() < 0.3) await spendWithin(t, run, stated.r, stated.t, random)
  }
}

t.test('draft-11 against the reference bucket, every mode parsed, over random sequences', async (t) => {
  for (let seed = 1; seed <= 40; seed++) await sequence(t, seed)
})

t.test('draft-11 with several policies, the local fallback, and a bucket the headers do not know', async (t) => {
  const time = new FakeTime()
  const { limiter } = createCore({}, { time })
  t.teardown(() => limiter.close())
  const burst: Policy = { bucket: 'burst', capacity: 2, refillPerSecond: 1, failureMode: 'open' }
  const day: Policy = { bucket: 'day', capacity: 10, refillPerSecond: 0.001, failureMode: 'open' }
  const decision = await limiter.consume('c', [burst, day])
  const both = new PolicyHeaders([burst, day], [])
  t.same(headerPairs('draft-11', decision, both), [
    ['ratelimit-policy', '"burst";q=2;w=2, "day";q=10;w=10000'],
    ['ratelimit', '"burst";r=1;t=1, "day";r=9;t=9000']
  ], 'every policy, each t from its own refill')
  const local: Decision = { allowed: true, limit: 2, remaining: 1, resetMs: 2000, retryAfterMs: 0, source: 'local', bucket: 'h' }
  const shapes = new PolicyHeaders([{ bucket: 'h', capacity: 100, refillPerSecond: 100 }], [{ bucket: 'h', capacity: 2, refillPerSecond: 0.5 }])
  t.same(headerPairs('draft-11', local, shapes)[1], ['ratelimit', '"h";r=1;t=2'], 'a local decision: t from the local refill (0.5/s), not the store policy\'s')
  const stranger: Decision = { ...local, source: 'store' }
  t.same(headerPairs('draft-11', stranger, new PolicyHeaders([], []))[1], ['ratelimit', `"h";r=1;t=${MAX_HEADER_INTEGER}`],
    'an unknown refill states the longest window, never a short made-up one')
})
