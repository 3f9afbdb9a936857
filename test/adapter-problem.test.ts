// `problemDetails: true` on every adapter (docs/reference/errors.md), over
// the table of test/helpers/adapters.ts: the 429 of one policy and of
// several (naming the buckets that denied, never a shadow one), the 503 of
// a limit failing closed while its Redis is down, the app's own handler
// answering instead, and the option left off, which keeps the JSON body.
// Each row's bodies and content types are kept, and the last test checks
// that every row sent the same bytes.

import t, { type Test } from 'tap'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { ADAPTERS, EXPRESS4, type AdapterRow, type RouteSpec, type SharedOptions } from './helpers/adapters.js'
import express from 'express'
import { listen, type Answer } from './helpers/express.js'
import { rateLimit } from '../lib/express.js'
import { faultClient, ownServer } from './helpers/load.js'
import type { RedisServer } from './helpers/redis.js'

const PROBLEM = 'application/problem+json; charset=utf-8'
const QUOTA = 'https://iana.org/assignments/http-problem-types#quota-exceeded'
const REDUCED = 'https://iana.org/assignments/http-problem-types#temporary-reduced-capacity'

/** What each row sent, per case: content type and body, compared across rows at the end. */
const sent = new Map<string, Map<string, string>>()

function keep (row: AdapterRow, what: string, a: Answer): void {
  const seen = sent.get(what) ?? new Map<string, string>()
  seen.set(row.name, `${a.headers['content-type'] ?? ''}\n${a.body}`)
  sent.set(what, seen)
}

async function start (t: Test, row: AdapterRow, routes: RouteSpec[], options: SharedOptions, ownAnswers = false): Promise<Awaited<ReturnType<AdapterRow['start']>>> {
  const redis = await sharedRedis(t)
  return await row.start(t, { options: { redis, prefix: uniquePrefix(), capacity: 100, refillPerSecond: 10, failureMode: 'open', timeout: 1000, ...options }, routes, ownAnswers })
}

/** Asks `path` `times` times; the statuses, and the last answer. */
async function ask (get: (url: string) => Promise<Answer>, path: string, times: number): Promise<{ statuses: number[], last: Answer }> {
  const statuses: number[] = []
  let last: Answer | undefined
  for (let i = 0; i < times; i++) {
    last = await get(path)
    statuses.push(last.status)
  }
  return { statuses, last: last as Answer }
}

async function onePolicy (t: Test, row: AdapterRow): Promise<void> {
  const app = await start(t, row, [{ path: '/pay', policy: { capacity: 1, refillPerSecond: 0.01 } }], { problemDetails: true })
  const { statuses, last } = await ask(app.get, '/pay', 2)
  t.same(statuses, [200, 429])
  t.equal(last.headers['content-type'], PROBLEM)
  t.equal(last.headers['retry-after'], '100')
  t.equal(last.headers['ratelimit-remaining'], '0', 'the rate-limit headers are sent as without the option')
  t.same(JSON.parse(last.body), {
    type: QUOTA,
    title: 'Rate limit exceeded',
    status: 429,
    detail: 'Rate limit exceeded, retry in 100 second(s)',
    'violated-policies': ['GET /pay']
  })
  keep(row, 'one policy', last)
}

async function severalPolicies (t: Test, row: AdapterRow): Promise<void> {
  const app = await start(t, row, [
    // Set on one policy of the route: the setting is one per route.
    { path: '/pay', policy: [{ capacity: 5, refillPerSecond: 0.01, problemDetails: true }, { capacity: 2, refillPerSecond: 0.01 }, { capacity: 1, refillPerSecond: 0.01, shadow: true }] },
    { path: '/both', policy: [{ capacity: 2, refillPerSecond: 0.01 }, { capacity: 2, refillPerSecond: 0.01, bucket: 'both-wide' }] }
  ], { problemDetails: true })
  const pay = await ask(app.get, '/pay', 3)
  t.same(pay.statuses, [200, 200, 429])
  t.same(JSON.parse(pay.last.body)['violated-policies'], ['GET /pay#1'], 'only the policy that denied; never the shadow one, which would have denied too')
  keep(row, 'several policies, one denied', pay.last)
  const both = await ask(app.get, '/both', 3)
  t.same(both.statuses, [200, 200, 429])
  t.same(JSON.parse(both.last.body)['violated-policies'], ['GET /both', 'both-wide'], 'both denied: both named, in the route\'s order')
  keep(row, 'several policies, all denied', both.last)
}

async function closedOutage (t: Test, row: AdapterRow, server: RedisServer): Promise<void> {
  const app = await row.start(t, {
    options: { redis: faultClient(t, server.url), prefix: uniquePrefix(), capacity: 5, refillPerSecond: 1, failureMode: 'closed', timeout: 50, problemDetails: true },
    // A shadow policy beside it: an outage denies the enforced one only.
    routes: [{ path: '/x', policy: [{}, { shadow: true, bucket: 'x-shadow' }] }]
  })
  t.equal((await app.get('/x')).status, 200, 'ready: decided by Redis')
  await server.kill()
  t.teardown(() => server.running ? undefined : server.restart())
  const a = await app.get('/x')
  t.equal(a.status, 503)
  t.equal(a.headers['content-type'], PROBLEM)
  t.equal(a.headers['retry-after'], '1')
  t.same(JSON.parse(a.body), {
    type: REDUCED,
    title: 'Rate limiter unavailable',
    status: 503,
    detail: 'Rate limiter unavailable, retry in 1 second(s)',
    'violated-policies': ['GET /x']
  }, 'the enforced policy is named, never the shadow one')
  keep(row, 'fail-closed 503', a)
  await server.restart()
}

async function ownHandler (t: Test, row: AdapterRow): Promise<void> {
  const app = await start(t, row, [{ path: '/pay', policy: { capacity: 1, refillPerSecond: 0.01 } }], { problemDetails: true }, true)
  const { statuses, last } = await ask(app.get, '/pay', 2)
  t.same(statuses, [200, 429])
  t.same(JSON.parse(last.body), { code: 'TOLLGATE_RATE_LIMITED', retryAfter: 100 }, 'the app\'s answer, not the problem')
  t.not(last.headers['content-type'], PROBLEM)
}

async function offByDefault (t: Test, row: AdapterRow): Promise<void> {
  const app = await start(t, row, [
    { path: '/pay', policy: { capacity: 1, refillPerSecond: 0.01 } },
    { path: '/off', policy: { capacity: 1, refillPerSecond: 0.01, problemDetails: false } }
  ], {})
  for (const path of ['/pay', '/off']) {
    const { statuses, last } = await ask(app.get, path, 2)
    t.same(statuses, [200, 429])
    t.equal(last.headers['content-type'], 'application/json; charset=utf-8')
    t.equal(last.body, '{"statusCode":429,"code":"TOLLGATE_RATE_LIMITED","error":"Too Many Requests","message":"Rate limit exceeded, retry in 100 second(s)"}', `${path}: the JSON body, byte for byte`)
  }
}

async function badValue (t: Test, row: AdapterRow): Promise<void> {
  await t.rejects(start(t, row, [], { problemDetails: 'yes' as never }), { code: 'TOLLGATE_INVALID_OPTION', message: /problemDetails.*"yes"/ })
  await t.rejects(start(t, row, [{ path: '/bad', policy: { problemDetails: 1 as never } }], {}), { code: 'TOLLGATE_INVALID_OPTION', message: /problemDetails/ })
}

const server = await ownServer(t)
const rows = [...ADAPTERS, EXPRESS4]

for (const row of rows) {
  t.test(row.name, async (t) => {
    t.test('one policy: the 429 as a quota-exceeded problem', (t) => onePolicy(t, row))
    t.test('several policies: the problem names those that denied', (t) => severalPolicies(t, row))
    t.test('failing closed while Redis is down: the 503 as a temporary-reduced-capacity problem', (t) => closedOutage(t, row, server))
    t.test('the app\'s own handler still answers instead', (t) => ownHandler(t, row))
    t.test('off by default, or set false: the JSON body unchanged', (t) => offByDefault(t, row))
    t.test('a bad value: a coded TypeError naming the option', (t) => badValue(t, row))
  })
}

t.test('a handler can send the problem itself: the error carries its body and content type', async (t) => {
  const limit = rateLimit({
    capacity: 1, refillPerSecond: 0.01, failureMode: 'open', problemDetails: true, logger: { warn: () => {}, info: () => {}, error: () => {} },
    handler: (_req, res, _next, err) => { res.status(err.status).set('x-answered-by', 'app').type(err.contentType).send(err.body) }
  })
  t.teardown(() => limit.close())
  const app = express()
  app.get('/pay', limit(), (_req, res) => { res.json({}) })
  const { statuses, last } = await ask(await listen(t, app), '/pay', 2)
  t.same(statuses, [200, 429])
  t.equal(last.headers['x-answered-by'], 'app')
  t.equal(`${last.headers['content-type'] ?? ''}\n${last.body}`, sent.get('one policy')?.get('express 5'), 'the bytes tollgate sends itself')
})

t.test('every adapter sends the same bytes, content type included', async (t) => {
  t.same([...sent.keys()], ['one policy', 'several policies, one denied', 'several policies, all denied', 'fail-closed 503'])
  for (const [what, byRow] of sent) {
    t.same([...byRow.keys()], rows.map((r) => r.name), `${what}: every row answered`)
    t.equal(new Set(byRow.values()).size, 1, `${what}: one body for all rows`)
  }
})
