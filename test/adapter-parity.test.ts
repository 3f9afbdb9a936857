// Every adapter of test/helpers/adapters.ts (the Fastify plugin,
// tollgate/express, tollgate/hono) answers one decision byte for byte
// alike: the same status, rate-limit headers, Retry-After, content-type,
// content-length and body, for a first call, a denial, each header mode,
// several policies, and a limit failing closed. Each app gets its own
// prefix on the same Redis and the same sequence of requests, asked of
// each adapter in turn, so all make the same decisions; each is compared
// with the first row's. The apps' own 200s are alike too: every row's
// handler sends the same JSON with the same content-type, so that every
// header compared on a 200 is tollgate's or equal. Refill rates are tiny,
// so the second that passes between the apps' requests moves no header
// value (reset and retry are ceil(ms / 1000) of hundreds of seconds).

import t, { type Test } from 'tap'
import { headerPairs, PolicyHeaders } from '../lib/http/headers.js'
import type { RedisClient } from '../lib/core/types.js'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { ADAPTERS, type AdapterRow, type Get, type RouteSpec, type SharedOptions } from './helpers/adapters.js'
import type { Answer } from './helpers/express.js'
import { faultClient, ownServer } from './helpers/load.js'

const COMPARED = /^(ratelimit|x-ratelimit|retry-after|content-type|content-length)/

const ROUTES: RouteSpec[] = [
  { path: '/draft-6', policy: { capacity: 2, refillPerSecond: 0.01 } },
  { path: '/draft-10', policy: { capacity: 2, refillPerSecond: 0.01, headers: 'draft-10' } },
  { path: '/legacy', policy: { capacity: 2, refillPerSecond: 0.01, headers: 'legacy' } },
  { path: '/none', policy: { capacity: 2, refillPerSecond: 0.01, headers: false } },
  { path: '/multi', policy: [{ capacity: 5, refillPerSecond: 0.01, headers: 'draft-10' }, { capacity: 2, refillPerSecond: 0.001 }] },
  { path: '/multi-6', policy: [{ capacity: 5, refillPerSecond: 0.01 }, { capacity: 2, refillPerSecond: 0.001 }] },
  { path: '/cost', policy: { capacity: 10, refillPerSecond: 0.01, cost: 4 } }
]

/** The first row, which every other is compared with, and the others. */
const [REFERENCE, ...OTHERS] = ADAPTERS as [AdapterRow, ...AdapterRow[]]

/** Every row's app with the same options and ROUTES, each on its own prefix; the first row's first. */
async function all (t: Test, redis: RedisClient, options: SharedOptions): Promise<Get[]> {
  // A deadline no loaded machine misses: these decisions are compared as
  // Redis made them (a missed 20 ms deadline would answer one adapter open).
  const base = { redis, capacity: 100, refillPerSecond: 1, failureMode: 'open' as const, timeout: 1000, ...options }
  const gets: Get[] = []
  for (const row of ADAPTERS) gets.push((await row.start(t, { options: { ...base, prefix: uniquePrefix() }, routes: ROUTES })).get)
  return gets
}

function comparable (a: Answer): { status: number, headers: Record<string, unknown>, body: string } {
  const headers = Object.fromEntries(Object.entries(a.headers).filter(([name]) => COMPARED.test(name)).sort())
  return { status: a.status, headers, body: a.status === 200 ? '' : a.body }
}

/** One request to every row in turn, each compared with the first row's answer; the answers. */
async function compareAll (t: Test, gets: readonly Get[], path: string, label: string): Promise<Answer[]> {
  const answers: Answer[] = []
  for (const get of gets) answers.push(await get(path))
  const [reference, ...others] = answers as [Answer, ...Answer[]]
  others.forEach((a, i) => { t.same(comparable(a), comparable(reference), `${label}: ${reference.status}, ${OTHERS[i]?.name} as ${REFERENCE.name}`) })
  return answers
}

t.test('the same decisions: the same status, headers and body from every adapter', async (t) => {
  const redis = await sharedRedis(t)
  const gets = await all(t, redis, {})
  let denied: ReturnType<typeof comparable> | undefined
  for (const { path } of ROUTES) {
    for (let i = 0; i < 4; i++) await compareAll(t, gets, path, `${path}, request ${i + 1}`)
    // Read at once: the bucket refills 1 token per 100 s, so the retry shown
    // is 100 s only within 1 s of the denials above (the other routes can
    // take longer than that on a loaded machine).
    if (path === '/draft-6') {
      const [reference, ...others] = gets
      const fixed = comparable(await (reference as Get)(path))
      denied = fixed
      for (const [i, get] of others.entries()) t.same(comparable(await get(path)), fixed, `the fixed 429, from ${OTHERS[i]?.name} too`)
    }
  }
  if (denied === undefined) throw new Error('/draft-6 is one of ROUTES')
  t.equal(denied.body, '{"statusCode":429,"code":"TOLLGATE_RATE_LIMITED","error":"Too Many Requests","message":"Rate limit exceeded, retry in 100 second(s)"}')
  t.same(denied.headers, {
    'content-length': String(denied.body.length),
    'content-type': 'application/json; charset=utf-8',
    'ratelimit-limit': '2',
    'ratelimit-policy': '2;w=200',
    'ratelimit-remaining': '0',
    'ratelimit-reset': '200',
    'retry-after': '100'
  }, 'and they are the headers of section 6')
})

t.test('a limit failing closed: the same 503 from every adapter', async (t) => {
  const server = await ownServer(t)
  const redis = faultClient(t, server.url)
  const gets = await all(t, redis, { failureMode: 'closed', timeout: 50 })
  await server.kill()
  for (let i = 0; i < 3; i++) {
    const [reference] = await compareAll(t, gets, '/draft-6', `request ${i + 1}`)
    t.equal(reference?.status, 503)
  }
  for (const [i, get] of gets.slice(1).entries()) {
    t.equal((await get('/draft-6')).body, '{"statusCode":503,"code":"TOLLGATE_UNAVAILABLE","error":"Service Unavailable","message":"Rate limiter unavailable, retry in 1 second(s)"}', `${OTHERS[i]?.name}: the 503 body`)
  }
})

t.test('headerPairs: the headers an adapter writes, as a list', async (t) => {
  const policies = new PolicyHeaders([{ bucket: 'b', capacity: 10, refillPerSecond: 1 }], [])
  const decision = { allowed: false, limit: 10, remaining: 0, resetMs: 9500, retryAfterMs: 1200, source: 'store' as const, bucket: 'b' }
  t.same(headerPairs('draft-6', decision, policies), [
    ['ratelimit-limit', 10], ['ratelimit-remaining', 0], ['ratelimit-reset', 10], ['ratelimit-policy', '10;w=10'], ['retry-after', 2]
  ])
  t.same(headerPairs(false, { ...decision, allowed: true, retryAfterMs: 0 }, policies), [])
})
