// Rate-limit headers (README "Headers") from decisions of the composed
// limiter on the in-process store and a fake clock, so every number is
// exact: each mode for 200s and a 429, several policies, bucket names as
// sf-strings, and the bounds: every value a whole number of at most 15
// digits, parsed by an RFC 9651 parser, over a sweep of extreme sizes.

import t from 'tap'
import { parseItem, parseList, type Item, type List } from 'structured-headers'
import { createCore } from '../../lib/core/limiter.js'
import { MAX_HEADER_INTEGER, PolicyHeaders, headerPairs, retrySeconds, sfString, windowSeconds, type HeaderMode } from '../../lib/http/headers.js'
import { compileRoute } from '../../lib/http/route.js'
import { answer } from '../../lib/http/request.js'
import type { Decision, Policy } from '../../lib/core/types.js'
import { FakeTime } from './helpers/fake-time.js'
import type { Test } from './helpers/option-error.js'

type Pairs = Array<[string, string | number]>

function limiterAt (t: Test): { time: FakeTime, consume: (key: string, policy: Policy | Policy[]) => Promise<Decision> } {
  const time = new FakeTime()
  const { limiter } = createCore({}, { time })
  t.teardown(() => limiter.close())
  return { time, consume: (key, policy) => limiter.consume(key, policy) }
}

function headersOf (mode: HeaderMode, decision: Decision, policies: readonly Policy[]): Record<string, string> {
  const shown = new PolicyHeaders(policies, policies.flatMap((p) => p.local === undefined ? [] : [{ ...p.local, bucket: p.bucket }]))
  return Object.fromEntries(headerPairs(mode, decision, shown).map(([n, v]) => [n, String(v)]))
}

function parsed (header: string | undefined): Array<[unknown, Record<string, unknown>]> {
  if (header === undefined) throw new Error('header missing')
  return parseList(header).map((entry: List[number]) => {
    const [value, params] = entry as Item
    return [value, Object.fromEntries(params)]
  })
}

/**
 * Capacity 5, refill 2/s, cost 1.5, so w = ceil(5/2) = 3. From a full
 * bucket: 3.5 tokens left (remaining 3, full in 0.75 s: reset 1), then 2
 * (reset ceil(1.5 s) = 2), then 0.5 (remaining 0, reset ceil(2.25 s) = 3),
 * then a denial: 1 more token needed at 2/s is 0.5 s, retry 1.
 */
const five: Policy = { bucket: 'GET /x', capacity: 5, refillPerSecond: 2, cost: 1.5, failureMode: 'open' }

async function fourDecisions (t: Test): Promise<Decision[]> {
  const { consume } = limiterAt(t)
  const out: Decision[] = []
  for (let i = 0; i < 4; i++) out.push(await consume('c', five))
  return out
}

t.test("'draft-6': limit, remaining, reset, policy; Retry-After on the denial", async (t) => {
  const [a, b, c, denied] = await fourDecisions(t) as [Decision, Decision, Decision, Decision]
  const expect = (remaining: number, reset: number) => ({ 'ratelimit-limit': '5', 'ratelimit-remaining': String(remaining), 'ratelimit-reset': String(reset), 'ratelimit-policy': '5;w=3' })
  t.same(headersOf('draft-6', a, [five]), expect(3, 1))
  t.same(headersOf('draft-6', b, [five]), expect(2, 2))
  t.same(headersOf('draft-6', c, [five]), expect(0, 3))
  t.equal(denied.allowed, false)
  t.same(headersOf('draft-6', denied, [five]), { ...expect(0, 3), 'retry-after': '1' })
  t.same(headerPairs('draft-6', a, new PolicyHeaders([five], [])).map(([n]) => n), ['ratelimit-limit', 'ratelimit-remaining', 'ratelimit-reset', 'ratelimit-policy'], 'in this order')
})

t.test("'draft-10': the policy list and the RateLimit list, parsed as RFC 9651 lists", async (t) => {
  const [a, b, c, denied] = await fourDecisions(t) as [Decision, Decision, Decision, Decision]
  for (const [d, r, reset] of [[a, 3, 1], [b, 2, 2], [c, 0, 3]] as const) {
    const h = headersOf('draft-10', d, [five])
    t.same(Object.keys(h).sort(), ['ratelimit', 'ratelimit-policy'])
    t.same(parsed(h['ratelimit-policy']), [['GET /x', { q: 5, w: 3 }]])
    t.same(parsed(h.ratelimit), [['GET /x', { r, t: reset }]])
  }
  const h = headersOf('draft-10', denied, [five])
  t.same(parsed(h.ratelimit), [['GET /x', { r: 0, t: 1 }]], 't is the retry on a denial')
  t.equal(h['retry-after'], '1')
  t.same(parseItem(h['retry-after'] as string)[0], 1)
})

t.test("'legacy' and false", async (t) => {
  const [a, , c, denied] = await fourDecisions(t) as [Decision, Decision, Decision, Decision]
  t.same(headersOf('legacy', a, [five]), { 'x-ratelimit-limit': '5', 'x-ratelimit-remaining': '3', 'x-ratelimit-reset': '1' })
  t.same(headersOf('legacy', denied, [five]), { 'x-ratelimit-limit': '5', 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': '3', 'retry-after': '1' })
  t.same(headersOf(false, c, [five]), {}, 'nothing on an allowed request')
  t.same(headersOf(false, denied, [five]), { 'retry-after': '1' }, 'only Retry-After on a denial')
})

t.test('retry and reset round up to whole seconds, on the fake clock', async (t) => {
  // capacity 2 at 0.25/s: a token takes 4 s, w = 8.
  const slow: Policy = { bucket: 's', capacity: 2, refillPerSecond: 0.25, failureMode: 'open' }
  const { time, consume } = limiterAt(t)
  await consume('c', slow)
  t.same(headersOf('draft-6', await consume('c', slow), [slow]), { 'ratelimit-limit': '2', 'ratelimit-remaining': '0', 'ratelimit-reset': '8', 'ratelimit-policy': '2;w=8' })
  await time.advance(1)
  const denied = await consume('c', slow)
  t.same(headersOf('draft-6', denied, [slow]), { 'ratelimit-limit': '2', 'ratelimit-remaining': '0', 'ratelimit-reset': '8', 'ratelimit-policy': '2;w=8', 'retry-after': '4' }, '3.999 s is 4')
  await time.advance(2999)
  t.equal(headersOf('draft-6', await consume('c', slow), [slow])['retry-after'], '1', '1 ms left is a whole second')
  // capacity 1 at 0.8/s: a token takes 1.25 s: retry 2 where rounding to the nearest would say 1.
  const odd: Policy = { bucket: 'o', capacity: 1, refillPerSecond: 0.8, failureMode: 'open' }
  t.same(headersOf('draft-6', await consume('c', odd), [odd]), { 'ratelimit-limit': '1', 'ratelimit-remaining': '0', 'ratelimit-reset': '2', 'ratelimit-policy': '1;w=2' })
  t.equal(headersOf('draft-6', await consume('c', odd), [odd])['retry-after'], '2')
  t.equal(retrySeconds(0), 1, 'Retry-After is at least 1')
})

t.test('remaining is exact when a token is not a whole number of microseconds', async (t) => {
  const three: Policy = { bucket: 'r', capacity: 5, refillPerSecond: 3, failureMode: 'open' }
  const { consume } = limiterAt(t)
  const d = await consume('c', three)
  t.equal(d.remaining, 4)
  t.equal(headersOf('draft-6', d, [three])['ratelimit-remaining'], '4')
})

t.test('several policies: draft-10 lists each; draft-6 and legacy describe the binding one', async (t) => {
  const burst: Policy = { bucket: 'burst', capacity: 2, refillPerSecond: 1, failureMode: 'open' }
  const day: Policy = { bucket: 'day', capacity: 10, refillPerSecond: 0.001, failureMode: 'open' }
  const { consume } = limiterAt(t)
  const a = await consume('c', [burst, day])
  const b = await consume('c', [burst, day])
  const denied = await consume('c', [burst, day])
  const ten = (d: Decision) => headersOf('draft-10', d, [burst, day])
  t.same(parsed(ten(a)['ratelimit-policy']), [['burst', { q: 2, w: 2 }], ['day', { q: 10, w: 10000 }]])
  t.same(parsed(ten(a).ratelimit), [['burst', { r: 1, t: 1 }], ['day', { r: 9, t: 1000 }]])
  t.same(parsed(ten(b).ratelimit), [['burst', { r: 0, t: 2 }], ['day', { r: 8, t: 2000 }]])
  t.same(parsed(ten(denied).ratelimit), [['burst', { r: 0, t: 1 }], ['day', { r: 8, t: 2000 }]], 'burst denied: its t is the retry; day unspent keeps its reset')
  t.equal(ten(denied)['retry-after'], '1')

  const { consume: other } = limiterAt(t)
  const first = await other('d', [day, burst])
  t.match(headersOf('draft-6', first, [day, burst]), { 'ratelimit-limit': '2', 'ratelimit-remaining': '1', 'ratelimit-policy': '2;w=2' }, 'burst (1 left) binds, though listed second')
  t.match(headersOf('legacy', first, [day, burst]), { 'x-ratelimit-limit': '2', 'x-ratelimit-remaining': '1' })

  // few: 2, slow refill; many: 9 at 1/s, cost 5. After one request many
  // (4 left, needs 5) denies though few (1 left) is closer to empty.
  const few: Policy = { bucket: 'few', capacity: 2, refillPerSecond: 0.001, failureMode: 'open' }
  const many: Policy = { bucket: 'many', capacity: 9, refillPerSecond: 1, cost: 5, failureMode: 'open' }
  const { consume: third } = limiterAt(t)
  t.equal(headersOf('draft-6', await third('e', [few, many]), [few, many])['ratelimit-limit'], '2')
  t.same(headersOf('draft-6', await third('e', [few, many]), [few, many]),
    { 'ratelimit-limit': '9', 'ratelimit-remaining': '4', 'ratelimit-reset': '5', 'ratelimit-policy': '9;w=9', 'retry-after': '1' }, 'a denial describes the policy that denied')

  const fast: Policy = { bucket: 'fast', capacity: 1, refillPerSecond: 1, failureMode: 'open' }
  const slow: Policy = { bucket: 'slow', capacity: 1, refillPerSecond: 0.1, failureMode: 'open' }
  const { consume: fourth } = limiterAt(t)
  await fourth('f', [fast, slow])
  const both = headersOf('draft-6', await fourth('f', [fast, slow]), [fast, slow])
  t.equal(both['retry-after'], '10', 'when several deny, the longest wait')
  t.equal(both['ratelimit-policy'], '1;w=10', 'and that policy is described')
})

t.test('bucket names are escaped into valid sf-strings', async (t) => {
  t.equal(sfString('say "hi"'), '"say \\"hi\\""')
  t.equal(sfString('back\\slash'), '"back\\\\slash"')
  t.equal(sfString('café ☕\ttab'), '"caf? ??tab"', 'anything but printable ASCII is replaced')
  for (const name of ['say "hi"', 'back\\slash', '"\\"', 'café ☕', 'tab\there', '']) {
    const expected = name.replace(/[^\x20-\x7e]/g, '?')
    const p: Policy = { bucket: name, capacity: 3, refillPerSecond: 1, failureMode: 'open' }
    const d: Decision = { allowed: true, limit: 3, remaining: 2, resetMs: 1000, retryAfterMs: 0, source: 'store', bucket: name }
    const h = headersOf('draft-10', d, [p])
    t.same(parsed(h['ratelimit-policy']), [[expected, { q: 3, w: 3 }]], JSON.stringify(name))
    t.same(parsed(h.ratelimit), [[expected, { r: 2, t: 1 }]])
  }
})

/** What is wrong with one header value as its draft reads it, if anything. */
function headerProblem (name: string, value: string): string | undefined {
  const integer = (n: unknown): boolean => typeof n === 'number' && Number.isInteger(n) && n >= 0 && n <= MAX_HEADER_INTEGER
  try {
    if (name === 'ratelimit' || (name === 'ratelimit-policy' && value.startsWith('"'))) {
      const params = name === 'ratelimit' ? ['r', 't'] : ['q', 'w']
      for (const [bucket, p] of parsed(value)) {
        if (typeof bucket !== 'string') return 'a member that is not an sf-string'
        if (Object.keys(p).sort().join() !== params.join()) return `parameters ${Object.keys(p).join()}`
        for (const key of params) if (!integer(p[key])) return `${key}=${String(p[key])} is not an integer in 0..${MAX_HEADER_INTEGER}`
      }
    } else if (name === 'ratelimit-policy') {
      for (const [quota, p] of parsed(value)) {
        if (!integer(quota) || !integer(p.w) || Object.keys(p).join() !== 'w') return 'not <integer>;w=<integer>'
      }
    } else {
      if (!/^\d{1,15}$/.test(value)) return 'not an integer of at most 15 digits'
      if (name.startsWith('ratelimit-') && !integer(parseItem(value)[0])) return 'not an sf-integer'
    }
  } catch (err) {
    return `does not parse: ${(err as Error).message}`
  }
  return undefined
}

t.test('every value is a whole number of at most 15 digits, for extreme capacities, refills and costs', async (t) => {
  const capacities = [1e-9, 0.5, 1, 2.5, 7.999, 999_999_999_999_999, 1e15, 1e21, 1e300]
  const windows = [1e-6, 2.5, 1e7]
  const problems: string[] = []
  let values = 0
  const { consume } = limiterAt(t)
  let n = 0
  for (const capacity of capacities) {
    for (const window of windows) {
      for (const cost of new Set([capacity, capacity / 3, ...(capacity >= 1 ? [1] : [])])) {
        const policy: Policy = { bucket: `s${n++}`, capacity, refillPerSecond: capacity / window, cost, failureMode: 'open' }
        for (let i = 0; i < 4; i++) {
          const d = await consume('c', policy)
          for (const mode of ['draft-6', 'draft-10', 'legacy', false] as const) {
            const h = headersOf(mode, d, [policy])
            const what = `${String(mode)} ${JSON.stringify({ capacity, window, cost })} #${i + 1}`
            for (const [name, value] of Object.entries(h)) {
              values++
              const problem = headerProblem(name, value)
              if (problem !== undefined) problems.push(`${what}: ${name}: ${value}: ${problem}`)
            }
            const limit = h['ratelimit-limit'] ?? h['x-ratelimit-limit']
            const shown = Math.min(MAX_HEADER_INTEGER, Math.floor(capacity))
            if (limit !== undefined && Number(limit) !== shown) problems.push(`${what}: limit ${limit}, not ${shown}`)
            const remaining = h['ratelimit-remaining'] ?? h['x-ratelimit-remaining']
            if (remaining !== undefined && Number(remaining) > Math.min(d.remaining, shown)) problems.push(`${what}: remaining ${remaining} > ${d.remaining}`)
            if (!d.allowed && h['retry-after'] === undefined) problems.push(`${what}: no Retry-After`)
          }
          if (!d.allowed) break
        }
      }
    }
  }
  t.ok(values > 1000, `${values} values checked`)
  t.same(problems.slice(0, 10), [], `every value parses (${problems.length} problems)`)
})

t.test('the bounds themselves: capped at 15 digits, fractions floored, below 1 shows 0', async (t) => {
  const max = MAX_HEADER_INTEGER
  t.equal(max, 999_999_999_999_999)
  const huge: Policy = { bucket: 'h', capacity: 1e300, refillPerSecond: 1e-300, failureMode: 'open' }
  t.equal(windowSeconds(huge), max, 'a window over a double\'s range is capped')
  const d: Decision = { allowed: false, limit: 1e300, remaining: 1e300, resetMs: Infinity, retryAfterMs: 1e300, source: 'local', bucket: 'h' }
  const local = new PolicyHeaders([], [{ bucket: 'h', capacity: 1e300, refillPerSecond: 1e-300 }])
  t.same(headerPairs('draft-6', d, local), [['ratelimit-limit', max], ['ratelimit-remaining', max], ['ratelimit-reset', max], ['ratelimit-policy', `${max};w=${max}`], ['retry-after', max]])
  t.same(headerPairs('draft-10', d, local)[0], ['ratelimit-policy', `"h";q=${max};w=${max}`], 'the local fallback\'s own list, capped')

  const frac: Policy = { bucket: 'f', capacity: 2.5, refillPerSecond: 0.01, failureMode: 'open' }
  const tiny: Policy = { bucket: 't', capacity: 0.5, refillPerSecond: 0.01, cost: 0.25, failureMode: 'open' }
  const { consume } = limiterAt(t)
  t.same(headersOf('draft-6', await consume('c', frac), [frac]), { 'ratelimit-limit': '2', 'ratelimit-remaining': '1', 'ratelimit-reset': '100', 'ratelimit-policy': '2;w=250' })
  const small = await consume('c', tiny)
  t.equal(small.allowed, true, 'a request within a capacity of 0.5 passes')
  t.same(headersOf('draft-6', small, [tiny]), { 'ratelimit-limit': '0', 'ratelimit-remaining': '0', 'ratelimit-reset': '25', 'ratelimit-policy': '0;w=50' })
  const over: Decision = { allowed: true, limit: 2.5, remaining: 7, resetMs: 0, retryAfterMs: 0, source: 'store', bucket: 'f' }
  t.equal(headersOf('draft-6', over, [frac])['ratelimit-remaining'], '2', 'remaining never shows more than the limit shown')
  const negative: Decision = { ...over, remaining: -3, resetMs: -5 }
  t.match(headersOf('draft-6', negative, [frac]), { 'ratelimit-remaining': '0', 'ratelimit-reset': '0' }, 'never below 0')
})

t.test('the answer of a decision: a 429 with headers, a 503 with Retry-After only, nothing for failing open', async (t) => {
  const limit = compileRoute('GET /x', { capacity: 5, refillPerSecond: 2, failureMode: 'closed' }, {})
  const sink = (list: Pairs, name: string, value: string | number): void => { list.push([name, value]) }
  const run = (d: Decision): [Pairs, unknown] => { const list: Pairs = []; return [list, answer({ limit, decision: d }, list, sink)] }
  const [allowedHeaders, allowed] = run({ allowed: true, limit: 5, remaining: 4, resetMs: 500, retryAfterMs: 0, source: 'store', bucket: 'GET /x' })
  t.equal(allowed, undefined)
  t.same(allowedHeaders, [['ratelimit-limit', 5], ['ratelimit-remaining', 4], ['ratelimit-reset', 1], ['ratelimit-policy', '5;w=3']])
  const [deniedHeaders, denied] = run({ allowed: false, limit: 5, remaining: 0, resetMs: 2500, retryAfterMs: 1500, source: 'store', bucket: 'GET /x' })
  t.same(denied, { statusCode: 429, code: 'TOLLGATE_RATE_LIMITED', error: 'Too Many Requests', message: 'Rate limit exceeded, retry in 2 second(s)', retryAfter: 2 })
  t.same(deniedHeaders.at(-1), ['retry-after', 2])
  const [closedHeaders, closed] = run({ allowed: false, limit: 5, remaining: 0, resetMs: 0, retryAfterMs: 4200, source: 'fail-closed', bucket: 'GET /x' })
  t.same(closed, { statusCode: 503, code: 'TOLLGATE_UNAVAILABLE', error: 'Service Unavailable', message: 'Rate limiter unavailable, retry in 5 second(s)', retryAfter: 5 })
  t.same(closedHeaders, [['retry-after', 5]], 'no made-up quota, only when to retry')
  const [openHeaders, open] = run({ allowed: true, limit: 5, remaining: 0, resetMs: 0, retryAfterMs: 0, source: 'fail-open', bucket: 'GET /x' })
  t.equal(open, undefined)
  t.same(openHeaders, [], 'failing open sends no headers')
})
