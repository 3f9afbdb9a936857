// The Fastify plugin, tollgate/express and tollgate/hono answer one
// decision byte for byte alike: the same status, rate-limit headers,
// Retry-After, content-type, content-length and body, for a first call, a
// denial, each header mode, several policies, and a limit failing closed.
// Each app gets its own prefix on the same Redis and the same sequence of
// requests, so all three make the same decisions. The apps' own 200s are
// alike too: the Hono handler sends its JSON with the content-type the
// other two frameworks' JSON helpers write (Hono's `c.json` omits the
// charset), so that every header compared on a 200 is tollgate's or equal. Refill rates are tiny, so the second that
// passes between the two apps' requests moves no header value (reset and
// retry are ceil(ms / 1000) of hundreds of seconds).

import express from 'express'
import Fastify from 'fastify'
import { Hono } from 'hono'
import t, { type Test } from 'tap'
import tollgate, { type RouteRateLimit, type TollgateOptions } from '../lib/index.js'
import { rateLimit, type ExpressOptions, type ExpressPolicy } from '../lib/express.js'
import { rateLimit as honoRateLimit, type HonoOptions, type HonoPolicy, type RateLimitEnv } from '../lib/hono.js'
import { headerPairs, PolicyHeaders } from '../lib/http/headers.js'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { listen, memoryLogger, type Answer } from './helpers/express.js'
import { listenHono } from './helpers/hono.js'
import { faultClient, ownServer } from './helpers/load.js'
import type { RedisClient } from '../lib/core/types.js'

const COMPARED = /^(ratelimit|x-ratelimit|retry-after|content-type|content-length)/

interface Route { path: string, policy: ExpressPolicy | ExpressPolicy[] }

const ROUTES: Route[] = [
  { path: '/draft-6', policy: { capacity: 2, refillPerSecond: 0.01 } },
  { path: '/draft-10', policy: { capacity: 2, refillPerSecond: 0.01, headers: 'draft-10' } },
  { path: '/legacy', policy: { capacity: 2, refillPerSecond: 0.01, headers: 'legacy' } },
  { path: '/none', policy: { capacity: 2, refillPerSecond: 0.01, headers: false } },
  { path: '/multi', policy: [{ capacity: 5, refillPerSecond: 0.01, headers: 'draft-10' }, { capacity: 2, refillPerSecond: 0.001 }] },
  { path: '/multi-6', policy: [{ capacity: 5, refillPerSecond: 0.01 }, { capacity: 2, refillPerSecond: 0.001 }] },
  { path: '/cost', policy: { capacity: 10, refillPerSecond: 0.01, cost: 4 } }
]

type Get = (path: string) => Promise<Answer>

async function all (t: Test, redis: RedisClient, options: Partial<TollgateOptions & ExpressOptions>): Promise<[Get, Get, Get]> {
  // A deadline no loaded machine misses: these decisions are compared as
  // Redis made them (a missed 20 ms deadline would answer one adapter open).
  const base = { redis, capacity: 100, refillPerSecond: 1, failureMode: 'open' as const, timeout: 1000, ...options }
  const fastify = Fastify()
  await fastify.register(tollgate, { ...base, prefix: uniquePrefix(), global: false })
  const limit = rateLimit({ ...base, prefix: uniquePrefix(), logger: memoryLogger() })
  t.teardown(() => limit.close())
  const honoLimit = honoRateLimit({ ...base, prefix: uniquePrefix(), logger: memoryLogger() } as HonoOptions) // the options these tests give are every adapter's
  t.teardown(() => honoLimit.close())
  const app = express()
  const hono = new Hono<RateLimitEnv>()
  for (const { path, policy } of ROUTES) {
    fastify.get(path, { config: { rateLimit: policy as RouteRateLimit } }, async () => ({ ok: true }))
    app.get(path, limit(policy), (_req, res) => { res.json({ ok: true }) })
    hono.get(path, honoLimit(policy as HonoPolicy | HonoPolicy[]), (c) => c.body('{"ok":true}', 200, { 'content-type': 'application/json; charset=utf-8' }))
  }
  const address = await fastify.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(() => fastify.close())
  const getExpress = await listen(t, app)
  const getHono = await listenHono(t, hono)
  const getFastify: Get = async (path) => {
    const res = await fetch(address + path)
    return { status: res.status, headers: Object.fromEntries(res.headers), body: await res.text() }
  }
  return [getFastify, getExpress, getHono]
}

function comparable (a: Answer): { status: number, headers: Record<string, unknown>, body: string } {
  const headers = Object.fromEntries(Object.entries(a.headers).filter(([name]) => COMPARED.test(name)).sort())
  return { status: a.status, headers, body: a.status === 200 ? '' : a.body }
}

t.test('the same decisions: the same status, headers and body from all three adapters', async (t) => {
  const redis = await sharedRedis(t)
  const [fastify, express, hono] = await all(t, redis, {})
  let denied: ReturnType<typeof comparable> | undefined
  for (const { path } of ROUTES) {
    for (let i = 0; i < 4; i++) {
      const [f, e, h] = [await fastify(path), await express(path), await hono(path)]
      t.same(comparable(e), comparable(f), `${path}, request ${i + 1}: ${f.status}, Express as Fastify`)
      t.same(comparable(h), comparable(f), `${path}, request ${i + 1}: ${f.status}, Hono as Fastify`)
    }
    // Read at once: the bucket refills 1 token per 100 s, so the retry shown
    // is 100 s only within 1 s of the denials above (the other routes can
    // take longer than that on a loaded machine).
    if (path === '/draft-6') {
      denied = comparable(await express(path))
      t.same(comparable(await hono(path)), denied, 'the fixed 429, from Hono too')
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

t.test('a limit failing closed: the same 503 from all three adapters', async (t) => {
  const server = await ownServer(t)
  const redis = faultClient(t, server.url)
  const [fastify, express, hono] = await all(t, redis, { failureMode: 'closed', timeout: 50 })
  await server.kill()
  for (let i = 0; i < 3; i++) {
    const [f, e, h] = [await fastify('/draft-6'), await express('/draft-6'), await hono('/draft-6')]
    t.same(comparable(e), comparable(f), `request ${i + 1}: ${f.status}, Express as Fastify`)
    t.same(comparable(h), comparable(f), `request ${i + 1}: ${f.status}, Hono as Fastify`)
    t.equal(e.status, 503)
  }
  t.equal((await hono('/draft-6')).body, (await express('/draft-6')).body)
  t.equal((await express('/draft-6')).body, '{"statusCode":503,"code":"TOLLGATE_UNAVAILABLE","error":"Service Unavailable","message":"Rate limiter unavailable, retry in 1 second(s)"}')
})

t.test('headerPairs: the headers an adapter writes, as a list', async (t) => {
  const policies = new PolicyHeaders([{ bucket: 'b', capacity: 10, refillPerSecond: 1 }], [])
  const decision = { allowed: false, limit: 10, remaining: 0, resetMs: 9500, retryAfterMs: 1200, source: 'store' as const, bucket: 'b' }
  t.same(headerPairs('draft-6', decision, policies), [
    ['ratelimit-limit', 10], ['ratelimit-remaining', 0], ['ratelimit-reset', 10], ['ratelimit-policy', '10;w=10'], ['retry-after', 2]
  ])
  t.same(headerPairs(false, { ...decision, allowed: true, retryAfterMs: 0 }, policies), [])
})
