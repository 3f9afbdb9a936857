// Rate-limit headers (docs/reference/headers.md): exact values in every mode, for a 200
// and for a 429, with one policy and with several; draft-10 values checked
// with an RFC 9651 parser; every value, in every mode, over a sweep of
// extreme capacities, refills and costs, parses as an integer.
//
// Timing: expected values below assume the requests of one sequence run
// within 250 ms of each other. Every expected number is a floor or a ceiling
// of a quantity that moves by at most (elapsed time x refill), and each one
// sits at least 250 ms (or 0.5 token) away from the next whole number, so any
// elapsed time under 250 ms gives the same integers. Each sequence checks its
// own elapsed time, so a machine too slow for that fails loudly instead of
// producing a confusing mismatch.

import { Redis } from 'ioredis'
import t from 'tap'
import type { LightMyRequestResponse } from 'fastify'
import { parseItem, parseList, type Item, type List } from 'structured-headers'
import { MAX_HEADER_INTEGER } from '../lib/http/headers.js'
import type { Decision } from '../lib/index.js'
import { buildApp, type TestApp } from './helpers/app.js'
import { NO_REDIS_PORT, redisUrl } from './helpers/redis.js'

await redisUrl(t)

type Mode = 'draft-6' | 'draft-10' | 'draft-11' | 'legacy' | false
/** A tap test object, as passed to a t.test callback. */
type TapTest = Parameters<Parameters<typeof t.test>[0]>[0]

const RATE_HEADERS = /^(ratelimit|ratelimit-.*|x-ratelimit-.*|retry-after)$/

function rateHeaders (res: LightMyRequestResponse): Record<string, string> {
  const out: Record<string, string> = {}
  for (const [name, value] of Object.entries(res.headers)) {
    if (RATE_HEADERS.test(name)) out[name] = String(value)
  }
  return out
}

/** A parsed list member as [string, {params}], for t.same. */
function member (entry: List[number]): [unknown, Record<string, unknown>] {
  const [value, params] = entry as Item
  return [value, Object.fromEntries(params)]
}

function parsed (header: string | undefined): Array<[unknown, Record<string, unknown>]> {
  if (header === undefined) throw new Error('header missing')
  return parseList(header).map(member)
}

/** The formulas of docs/reference/headers.md, from a decision. */
const formula = {
  remaining: (d: Decision) => d.remaining,
  reset: (d: Decision) => Math.ceil(d.resetMs / 1000),
  retry: (d: Decision) => Math.max(1, Math.ceil(d.retryAfterMs / 1000))
}

/** Runs `fn`, failing the test when it took longer than the 250 ms the expectations allow. */
async function timed<T> (t: TapTest, fn: () => Promise<T>): Promise<T> {
  const started = performance.now()
  const result = await fn()
  const took = performance.now() - started
  t.ok(took < 250, `sequence ran in ${took.toFixed(0)} ms (expectations hold under 250 ms)`)
  return result
}

/**
 * One route per mode: capacity 5, refill 2/s, cost 1.5, so w = ceil(5/2) = 3.
 * From a full bucket: 3.5 tokens left (remaining 3, full in 0.75 s: reset 1),
 * then 2 (reset ceil(1.5 s) = 2), then 0.5 (remaining 0, reset ceil(2.25 s) =
 * 3), then a denial: 1 more token needed at 2/s is 0.5 s, retry 1.
 */
async function modeApp (t: TapTest, headers: Mode): Promise<TestApp> {
  return await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 2, cost: 1.5, headers },
    routes: (app) => { app.get('/x', async (request) => request.rateLimit) }
  })
}

async function fourRequests (t: TapTest, app: TestApp['app']): Promise<LightMyRequestResponse[]> {
  return await timed(t, async () => {
    const out: LightMyRequestResponse[] = []
    for (let i = 0; i < 4; i++) out.push(await app.inject('/x'))
    return out
  })
}

t.test("'draft-6'", async (t) => {
  const { app } = await modeApp(t, 'draft-6')
  const [a, b, c, denied] = await fourRequests(t, app) as [LightMyRequestResponse, LightMyRequestResponse, LightMyRequestResponse, LightMyRequestResponse]
  const expect = (remaining: number, reset: number) => ({
    'ratelimit-limit': '5',
    'ratelimit-remaining': String(remaining),
    'ratelimit-reset': String(reset),
    'ratelimit-policy': '5;w=3'
  })
  t.same(rateHeaders(a), expect(3, 1))
  t.same(rateHeaders(b), expect(2, 2))
  t.same(rateHeaders(c), expect(0, 3))
  t.equal(denied.statusCode, 429)
  t.same(rateHeaders(denied), { ...expect(0, 3), 'retry-after': '1' })
  for (const res of [a, b, c]) {
    const d = res.json<Decision>()
    t.equal(res.headers['ratelimit-remaining'], String(formula.remaining(d)))
    t.equal(res.headers['ratelimit-reset'], String(formula.reset(d)))
  }
})

/**
 * A list mode's four answers: per allowed answer its headers and the (r, t)
 * of `rows`; on the 429, r=0 and t equal to Retry-After. Returns the answers.
 */
async function listMode (t: TapTest, mode: 'draft-10' | 'draft-11', rows: ReadonlyArray<readonly [number, number]>): Promise<LightMyRequestResponse[]> {
  const { app } = await modeApp(t, mode)
  const answers = await fourRequests(t, app)
  const denied = answers[3] as LightMyRequestResponse
  const policy = [['GET /x', { q: 5, w: 3 }]]
  rows.forEach(([r, window], i) => {
    const res = answers[i] as LightMyRequestResponse
    t.same(Object.keys(rateHeaders(res)).sort(), ['ratelimit', 'ratelimit-policy'])
    t.same(parsed(res.headers['ratelimit-policy'] as string), policy)
    t.same(parsed(res.headers.ratelimit as string), [['GET /x', { r, t: window }]])
  })
  t.equal(denied.statusCode, 429)
  t.same(Object.keys(rateHeaders(denied)).sort(), ['ratelimit', 'ratelimit-policy', 'retry-after'])
  t.equal(denied.headers['retry-after'], '1')
  t.same(parsed(denied.headers['ratelimit-policy'] as string), policy)
  t.same(parsed(denied.headers.ratelimit as string), [['GET /x', { r: 0, t: 1 }]], 't equals retry on a 429')
  t.same(parseItem(denied.headers['retry-after'] as string)[0], 1, 'Retry-After is a plain integer')
  return answers
}

t.test("'draft-10'", async (t) => {
  const answers = await listMode(t, 'draft-10', [[3, 1], [2, 2], [0, 3]])
  for (const res of answers.slice(0, 3)) {
    const d = res.json<Decision>()
    t.same(parsed(res.headers.ratelimit as string), [['GET /x', { r: formula.remaining(d), t: formula.reset(d) }]])
  }
})

// draft-11: r as draft-10's; t the effective window, ceil(max(r, 1) / 2): 2, 1, 1; on the 429 the retry.
t.test("'draft-11'", async (t) => {
  await listMode(t, 'draft-11', [[3, 2], [2, 1], [0, 1]])
})

t.test("'legacy'", async (t) => {
  const { app } = await modeApp(t, 'legacy')
  const [a, b, c, denied] = await fourRequests(t, app) as [LightMyRequestResponse, LightMyRequestResponse, LightMyRequestResponse, LightMyRequestResponse]
  const expect = (remaining: number, reset: number) => ({
    'x-ratelimit-limit': '5',
    'x-ratelimit-remaining': String(remaining),
    'x-ratelimit-reset': String(reset)
  })
  t.same(rateHeaders(a), expect(3, 1))
  t.same(rateHeaders(b), expect(2, 2))
  t.same(rateHeaders(c), expect(0, 3))
  t.equal(denied.statusCode, 429)
  t.same(rateHeaders(denied), { ...expect(0, 3), 'retry-after': '1' })
})

t.test('false', async (t) => {
  const { app } = await modeApp(t, false)
  const [a, b, c, denied] = await fourRequests(t, app) as [LightMyRequestResponse, LightMyRequestResponse, LightMyRequestResponse, LightMyRequestResponse]
  for (const res of [a, b, c]) {
    t.equal(res.statusCode, 200)
    t.same(rateHeaders(res), {}, 'no rate-limit headers on a 200')
  }
  t.equal(denied.statusCode, 429)
  t.same(rateHeaders(denied), { 'retry-after': '1' }, 'only Retry-After on a 429')
})

t.test('default mode is draft-6', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 2 },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  t.same(rateHeaders(await app.inject('/x')), {
    'ratelimit-limit': '5', 'ratelimit-remaining': '4', 'ratelimit-reset': '1', 'ratelimit-policy': '5;w=3'
  })
})

t.test('retry and reset round up to whole seconds', async (t) => {
  // capacity 2 at 0.25/s: each token takes 4 s, w = 8. After two requests
  // the bucket is full in 8 s (minus the elapsed time: reset 8); the next
  // token comes in 4 s (minus the elapsed time: retry 4).
  const { app } = await buildApp(t, {
    plugin: { capacity: 2, refillPerSecond: 0.25 },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  const [, second, denied] = await timed(t, async () => [await app.inject('/x'), await app.inject('/x'), await app.inject('/x')])
  t.same(rateHeaders(second as LightMyRequestResponse), {
    'ratelimit-limit': '2', 'ratelimit-remaining': '0', 'ratelimit-reset': '8', 'ratelimit-policy': '2;w=8'
  })
  t.same(rateHeaders(denied as LightMyRequestResponse), {
    'ratelimit-limit': '2', 'ratelimit-remaining': '0', 'ratelimit-reset': '8', 'ratelimit-policy': '2;w=8', 'retry-after': '4'
  })
  t.equal((denied as LightMyRequestResponse).json().message, 'Rate limit exceeded, retry in 4 second(s)')
})

t.test('a fraction of a second counts as a whole one', async (t) => {
  // capacity 1 at 0.8/s: a token takes 1.25 s. After one request the
  // bucket is full in 1.25 s (reset 2); the next token is 1.25 s away
  // (retry 2, where rounding to the nearest second would say 1).
  const { app } = await buildApp(t, {
    plugin: { capacity: 1, refillPerSecond: 0.8 },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  const [first, denied] = await timed(t, async () => [await app.inject('/x'), await app.inject('/x')]) as LightMyRequestResponse[]
  t.same(rateHeaders(first as LightMyRequestResponse), {
    'ratelimit-limit': '1', 'ratelimit-remaining': '0', 'ratelimit-reset': '2', 'ratelimit-policy': '1;w=2'
  })
  t.equal(denied?.headers['retry-after'], '2')
  t.equal(denied?.json().message, 'Rate limit exceeded, retry in 2 second(s)')
})

t.test('remaining is exact when a token is not a whole number of microseconds', async (t) => {
  // At 3/s a token is 333333.3 us; the stores keep whole microseconds. One
  // request on a full bucket of 5 leaves exactly 4, never 3.999998 shown as 3.
  for (const [store, redis] of [['Redis', {}], ['in-process', { redis: undefined }]] as const) {
    const { app } = await buildApp(t, {
      plugin: { capacity: 5, refillPerSecond: 3, ...redis },
      routes: (app) => { app.get('/x', async (request) => request.rateLimit) }
    })
    const res = await app.inject('/x')
    t.equal(res.headers['ratelimit-remaining'], '4', `${store}: header`)
    t.equal(res.json<Decision>().remaining, 4, `${store}: decision`)
  }
})

t.test('several policies', async (t) => {
  // burst: capacity 2 at 1/s (w 2); day: capacity 10 at 0.001/s (w 10000).
  const policies = [
    { bucket: 'burst', capacity: 2, refillPerSecond: 1 },
    { bucket: 'day', capacity: 10, refillPerSecond: 0.001 }
  ]

  t.test('draft-10 lists every policy, t is retry for the one that denied', async (t) => {
    const { app } = await buildApp(t, {
      plugin: { headers: 'draft-10' },
      routes: (app) => { app.get('/x', { config: { rateLimit: policies } }, async () => 'x') }
    })
    const [a, b, denied] = await timed(t, async () => [await app.inject('/x'), await app.inject('/x'), await app.inject('/x')]) as LightMyRequestResponse[]
    const policy = [['burst', { q: 2, w: 2 }], ['day', { q: 10, w: 10000 }]]
    for (const res of [a, b, denied]) t.same(parsed(res?.headers['ratelimit-policy'] as string), policy)
    t.same(parsed(a?.headers.ratelimit as string), [['burst', { r: 1, t: 1 }], ['day', { r: 9, t: 1000 }]])
    t.same(parsed(b?.headers.ratelimit as string), [['burst', { r: 0, t: 2 }], ['day', { r: 8, t: 2000 }]])
    t.equal(denied?.statusCode, 429)
    t.equal(denied?.headers['retry-after'], '1')
    t.same(parsed(denied?.headers.ratelimit as string), [['burst', { r: 0, t: 1 }], ['day', { r: 8, t: 2000 }]],
      'burst denied: its t is the retry; day was not spent: its t is still its reset')
  })

  t.test('draft-6 and legacy describe the policy closest to exhaustion', async (t) => {
    for (const mode of ['draft-6', 'legacy'] as const) {
      const { app } = await buildApp(t, {
        plugin: { headers: mode },
        // day first, so the binding policy is not simply the first one
        routes: (app) => { app.get('/x', { config: { rateLimit: [policies[1], policies[0]] } }, async () => 'x') }
      })
      const res = await app.inject('/x')
      const h = mode === 'draft-6' ? 'ratelimit' : 'x-ratelimit'
      t.equal(res.headers[`${h}-limit`], '2', `${mode}: burst (1 left) binds, not day (9 left)`)
      t.equal(res.headers[`${h}-remaining`], '1')
      t.equal(res.headers[`${h}-reset`], '1')
      if (mode === 'draft-6') t.equal(res.headers['ratelimit-policy'], '2;w=2')
    }
  })

  t.test('on a 429, draft-6 describes the policy that denied', async (t) => {
    // few: capacity 2, cost 1, slow refill. many: capacity 9, cost 5, 1/s.
    // After one request few has 1 left and many 4: many denies (needs 5)
    // although few is closer to empty; the headers must describe many.
    const { app } = await buildApp(t, {
      plugin: { headers: 'draft-6' },
      routes: (app) => {
        app.get('/x', {
          config: {
            rateLimit: [
              { bucket: 'few', capacity: 2, refillPerSecond: 0.001 },
              { bucket: 'many', capacity: 9, refillPerSecond: 1, cost: 5 }
            ]
          }
        }, async () => 'x')
      }
    })
    const [first, denied] = await timed(t, async () => [await app.inject('/x'), await app.inject('/x')]) as LightMyRequestResponse[]
    t.equal(first?.headers['ratelimit-limit'], '2', 'allowed: few (1 left) binds')
    t.equal(denied?.statusCode, 429)
    t.same(rateHeaders(denied as LightMyRequestResponse), {
      'ratelimit-limit': '9',
      'ratelimit-remaining': '4',
      'ratelimit-reset': '5',
      'ratelimit-policy': '9;w=9',
      'retry-after': '1'
    })
  })

  t.test('when several deny, Retry-After is the longest wait', async (t) => {
    // fast refills a token in 1 s, slow in 10 s: a retry after 1 s would be
    // denied again by slow.
    const { app } = await buildApp(t, {
      plugin: { headers: 'draft-6' },
      routes: (app) => {
        app.get('/x', {
          config: {
            rateLimit: [
              { bucket: 'fast', capacity: 1, refillPerSecond: 1 },
              { bucket: 'slow', capacity: 1, refillPerSecond: 0.1 }
            ]
          }
        }, async () => 'x')
      }
    })
    const [, denied] = await timed(t, async () => [await app.inject('/x'), await app.inject('/x')]) as LightMyRequestResponse[]
    t.equal(denied?.statusCode, 429)
    t.equal(denied?.headers['retry-after'], '10')
    t.equal(denied?.headers['ratelimit-policy'], '1;w=10', 'describes slow')
  })
})

t.test('bucket names are escaped into valid sf-strings', async (t) => {
  const names = ['say "hi"', 'back\\slash', '"\\"', 'café ☕', 'tab\there']
  const { app } = await buildApp(t, {
    plugin: { capacity: 3, refillPerSecond: 1, headers: 'draft-10' },
    routes: (app) => {
      names.forEach((bucket, i) => app.get(`/r${i}`, { config: { rateLimit: { bucket } } }, async () => 'x'))
      app.get('/both', { config: { rateLimit: [{ bucket: names[0] }, { bucket: names[1] }] } }, async () => 'x')
    }
  })
  for (let i = 0; i < names.length; i++) {
    const res = await app.inject(`/r${i}`)
    const name = names[i] as string
    // Printable ASCII survives exactly; anything else is replaced, never sent raw.
    const expected = /^[\x20-\x7e]*$/.test(name) ? name : name.replace(/[^\x20-\x7e]/g, '?')
    t.same(parsed(res.headers['ratelimit-policy'] as string), [[expected, { q: 3, w: 3 }]], JSON.stringify(name))
    t.same(parsed(res.headers.ratelimit as string), [[expected, { r: 2, t: 1 }]])
  }
  const both = await app.inject('/both')
  t.same(parsed(both.headers['ratelimit-policy'] as string).map(([name]) => name), [names[0], names[1]])
})

/** Checks one header value as its draft says; returns what is wrong with it, if anything. */
function headerProblem (name: string, value: string): string | undefined {
  const integer = (n: unknown): boolean => typeof n === 'number' && Number.isInteger(n) && n >= 0 && n <= MAX_HEADER_INTEGER
  try {
    if (name === 'ratelimit' || (name === 'ratelimit-policy' && value.startsWith('"'))) {
      // draft-10: a list of sf-strings, each with integer parameters.
      const params = name === 'ratelimit' ? ['r', 't'] : ['q', 'w']
      for (const [bucket, p] of parsed(value)) {
        if (typeof bucket !== 'string') return 'a member that is not an sf-string'
        if (Object.keys(p).sort().join() !== params.join()) return `parameters ${Object.keys(p).join()}, not ${params.join()}`
        for (const key of params) if (!integer(p[key])) return `${key}=${String(p[key])} is not an integer in 0..${MAX_HEADER_INTEGER}`
      }
    } else if (name === 'ratelimit-policy') {
      // draft-6: a list of integers with an integer `w`.
      for (const [quota, p] of parsed(value)) {
        if (!integer(quota) || !integer(p.w) || Object.keys(p).join() !== 'w') return 'not <integer>;w=<integer>'
      }
    } else {
      // An sf-integer Item (draft-6), a plain integer (legacy), delay-seconds (Retry-After).
      if (!/^\d{1,15}$/.test(value)) return 'not an integer of at most 15 digits'
      if (name.startsWith('ratelimit-') && !integer(parseItem(value)[0])) return 'not an sf-integer'
    }
  } catch (err) {
    return `does not parse: ${(err as Error).message}`
  }
  return undefined
}

t.test('every header value is an integer that parses as its draft says, for extreme capacities, refills and costs', async (t) => {
  // Capacities from 1e-9 to 1e300, each with refills that fill it in a
  // microsecond, 2.5 s or 4 months, and costs of the whole capacity, a
  // third of it and (where it fits) 1. The store's arithmetic bounds the
  // sweep: the wait of one request must stay within Redis's integers.
  const capacities = [1e-9, 0.5, 1, 2.5, 7.999, 999_999_999_999_999, 1e15, 1e21, 1e300]
  const windows = [1e-6, 2.5, 1e7]
  const shapes: Array<{ capacity: number, refillPerSecond: number, cost: number }> = []
  for (const capacity of capacities) {
    for (const window of windows) {
      const costs = new Set([capacity, capacity / 3, ...(capacity >= 1 ? [1] : [])])
      for (const cost of costs) shapes.push({ capacity, refillPerSecond: capacity / window, cost })
    }
  }
  const problems: string[] = []
  let values = 0
  for (const headers of ['draft-6', 'draft-10', 'legacy', false] as const) {
    const { app } = await buildApp(t, {
      plugin: { headers },
      routes: (app) => {
        shapes.forEach((shape, i) => app.get(`/s${i}`, { config: { rateLimit: shape } }, async (request) => request.rateLimit))
      }
    })
    for (let i = 0; i < shapes.length; i++) {
      const shape = shapes[i] as typeof shapes[number]
      // Until a denial (at most 4 requests): 200s and a 429.
      for (let n = 0; n < 4; n++) {
        const res = await app.inject(`/s${i}`)
        const what = `${String(headers)} ${JSON.stringify(shape)} request ${n + 1} (${res.statusCode})`
        if (res.statusCode !== 200 && res.statusCode !== 429) {
          problems.push(`${what}: status ${res.statusCode}`)
          break
        }
        const rate = rateHeaders(res)
        for (const [name, value] of Object.entries(rate)) {
          values++
          const problem = headerProblem(name, value)
          if (problem !== undefined) problems.push(`${what}: ${name}: ${value}: ${problem}`)
        }
        // No fake quota: no more than the capacity, no more than is left.
        const shown = Math.min(MAX_HEADER_INTEGER, Math.floor(shape.capacity))
        const limit = rate['ratelimit-limit'] ?? rate['x-ratelimit-limit']
        if (limit !== undefined && Number(limit) !== shown) problems.push(`${what}: limit ${limit}, not ${shown}`)
        const remaining = rate['ratelimit-remaining'] ?? rate['x-ratelimit-remaining']
        if (res.statusCode === 200 && remaining !== undefined && Number(remaining) > res.json<Decision>().remaining) {
          problems.push(`${what}: remaining ${remaining} > ${res.json<Decision>().remaining} left`)
        }
        if (res.statusCode === 429) {
          if (rate['retry-after'] === undefined) problems.push(`${what}: no Retry-After`)
          break
        }
      }
    }
  }
  t.comment(`${shapes.length} shapes x 4 modes, ${values} header values checked`)
  t.same(problems.slice(0, 10), [], `every value parses (${problems.length} problems)`)
})

t.test('the local fallback\'s headers parse too, up to a window longer than a double holds', async (t) => {
  const redis = new Redis({ port: NO_REDIS_PORT, lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  // capacity / refill overflows to Infinity; the in-process bucket copes.
  const local = { capacity: 1e300, refillPerSecond: 1e-300 }
  for (const headers of ['draft-6', 'draft-10'] as const) {
    const { app } = await buildApp(t, {
      plugin: { redis, capacity: 1, refillPerSecond: 1, failureMode: 'local', local, headers },
      routes: (app) => { app.get('/x', async () => 'x') }
    })
    const res = await app.inject('/x')
    t.equal(res.statusCode, 200)
    const rate = rateHeaders(res)
    for (const [name, value] of Object.entries(rate)) t.equal(headerProblem(name, value), undefined, `${headers} ${name}: ${value}`)
    const max = MAX_HEADER_INTEGER
    if (headers === 'draft-6') t.equal(rate['ratelimit-policy'], `${max};w=${max}`, 'capacity and window capped at 15 digits')
    else t.equal(rate['ratelimit-policy'], `"GET /x";q=${max};w=${max}`, 'capacity and window capped at 15 digits')
  }
})

t.test('fractional capacities show whole tokens, rounded down; below 1 shows 0', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { refillPerSecond: 0.01, headers: 'draft-6' },
    routes: (app) => {
      app.get('/frac', { config: { rateLimit: { capacity: 2.5 } } }, async () => 'x')
      app.get('/tiny', { config: { rateLimit: { capacity: 0.5, cost: 0.25 } } }, async () => 'x')
    }
  })
  // 2.5 tokens, w = ceil(250 s); after one request 1.5 left.
  t.same(rateHeaders(await app.inject('/frac')), {
    'ratelimit-limit': '2', 'ratelimit-remaining': '1', 'ratelimit-reset': '100', 'ratelimit-policy': '2;w=250'
  })
  const tiny = await app.inject('/tiny')
  t.equal(tiny.statusCode, 200, 'a request within a capacity of 0.5 passes')
  t.same(rateHeaders(tiny), {
    'ratelimit-limit': '0', 'ratelimit-remaining': '0', 'ratelimit-reset': '25', 'ratelimit-policy': '0;w=50'
  }, 'and its headers show no whole token')
})
