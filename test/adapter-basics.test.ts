// What every adapter does alike with a route's limit, over the rows of
// test/helpers/adapters.ts (Express 4 included), on a real Redis: the
// first call's draft-6 headers, exhaustion with its 429 (Retry-After, the
// JSON body and its length), and several policies on one route, all or
// nothing, listed by draft-10, the denied requests spending nothing; and
// the programmatic consume, peek and reset over the app's options. The
// runs that only one framework has, or that use its own request type, stay
// in test/express.test.ts, test/hono.test.ts and test/plugin.test.ts.

import t, { type Test } from 'tap'
import { keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { ADAPTERS, EXPRESS4, type AdapterRow, type RouteSpec, type SharedOptions } from './helpers/adapters.js'
import type { Answer } from './helpers/express.js'

/** A row's app on its own prefix: a bucket of 100 at 10/s by default, decided by Redis with a deadline a loaded machine does not miss. */
async function start (t: Test, row: AdapterRow, routes: RouteSpec[], options: SharedOptions = {}): Promise<{ app: Awaited<ReturnType<AdapterRow['start']>>, prefix: string, redis: Awaited<ReturnType<typeof sharedRedis>> }> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = await row.start(t, { options: { redis, prefix, capacity: 100, refillPerSecond: 10, failureMode: 'open', timeout: 1000, ...options }, routes })
  return { app, prefix, redis }
}

async function firstCall (t: Test, row: AdapterRow): Promise<void> {
  const { app } = await start(t, row, [{ path: '/search', policy: {} }])
  const a = await app.get('/search')
  t.equal(a.status, 200)
  t.same(JSON.parse(a.body), { source: 'store' }, `decided by Redis from the first request (${row.decisionAt})`)
  t.equal(a.headers['ratelimit-limit'], '100')
  t.equal(a.headers['ratelimit-remaining'], '99', 'the seed example: 99 left')
  t.equal(a.headers['ratelimit-reset'], '1')
  t.equal(a.headers['ratelimit-policy'], '100;w=10')
  t.equal(a.headers['retry-after'], undefined)
}

async function exhaustion (t: Test, row: AdapterRow): Promise<void> {
  const { app } = await start(t, row, [{ path: '/pay', policy: { capacity: 3, refillPerSecond: 0.01 } }])
  const statuses: number[] = []
  let last: Answer | undefined
  for (let i = 0; i < 5; i++) {
    last = await app.get('/pay')
    statuses.push(last.status)
  }
  t.same(statuses, [200, 200, 200, 429, 429])
  const denied = last as Answer
  t.equal(denied.headers['retry-after'], '100')
  t.equal(denied.headers['ratelimit-remaining'], '0')
  t.equal(denied.headers['content-type'], 'application/json; charset=utf-8')
  t.equal(denied.headers['content-length'], '133', 'the length of the body below')
  t.equal(denied.body, '{"statusCode":429,"code":"TOLLGATE_RATE_LIMITED","error":"Too Many Requests","message":"Rate limit exceeded, retry in 100 second(s)"}')
}

async function severalPolicies (t: Test, row: AdapterRow): Promise<void> {
  const { app, prefix, redis } = await start(t, row, [{
    path: '/pay',
    keyHeader: 'x-client',
    policy: [{ capacity: 5, refillPerSecond: 0.01, headers: 'draft-10' }, { capacity: 2, refillPerSecond: 0.01 }]
  }])
  const statuses: number[] = []
  let last: Answer | undefined
  for (let i = 0; i < 4; i++) {
    last = await app.get('/pay', { 'x-client': 'alice' })
    statuses.push(last.status)
  }
  t.same(statuses, [200, 200, 429, 429])
  t.equal(last?.headers.ratelimit, '"GET /pay";r=3;t=200, "GET /pay#1";r=0;t=100')
  t.equal(last?.headers['ratelimit-policy'], '"GET /pay";q=5;w=500, "GET /pay#1";q=2;w=200')
  const wide = await app.api.peek('alice', { bucket: 'GET /pay', capacity: 5, refillPerSecond: 0.01 })
  t.equal(wide.remaining, 3, 'the denied requests took nothing from the wide bucket')
  t.same(await keysUnder(redis, prefix), [`${prefix}:{alice}:GET /pay`, `${prefix}:{alice}:GET /pay#1`])
}

async function programmatic (t: Test, row: AdapterRow): Promise<void> {
  const { app: { api } } = await start(t, row, [], { capacity: 5, refillPerSecond: 0.01 })
  const login = { bucket: 'login', cost: 2 }
  t.match(await api.consume('carol', login), { allowed: true, remaining: 3 })
  t.match(await api.consume('carol', login, 3), { allowed: true, remaining: 0 })
  t.match(await api.peek('carol', login), { allowed: false })
  await api.reset('carol', 'login')
  t.match(await api.peek('carol', login), { remaining: 5 })
  t.equal(api.limiter.state, 'healthy')
  await t.rejects(api.consume('carol', { bucket: 'login', key: () => 'x' } as never), { code: 'TOLLGATE_INVALID_OPTION' })
}

for (const row of [...ADAPTERS, EXPRESS4]) {
  t.test(row.name, async (t) => {
    t.test('the first call: 200 and the draft-6 headers of a bucket of 100 at 10/s', (t) => firstCall(t, row))
    t.test('exhaustion: 429, Retry-After and the JSON body; a denied request spends nothing', (t) => exhaustion(t, row))
    t.test('several policies: all or nothing, in one call; draft-10 lists them', (t) => severalPolicies(t, row))
    t.test('the programmatic API: consume, peek, reset over the options', (t) => programmatic(t, row))
  })
}
