// Plans (`limit: (request) => plan | false`, lib/http/tiers.ts) without
// Redis: the route's limit under each plan, validated once per returned
// object; false drops a policy; bad values are the adapter's error; a
// plan change keeps the bucket (on the in-process store and a fake clock);
// and through Fastify on the in-process store: headers of the client's
// own plan, no limit for false, a 500 for a bad plan.

import t from 'tap'
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify'
import tollgate, { type Tier } from '../../lib/index.js'
import { createCore } from '../../lib/core/limiter.js'
import { headerPairs } from '../../lib/http/headers.js'
import { compileRoute, type RouteLimit } from '../../lib/http/route.js'
import type { Policy } from '../../lib/core/types.js'
import { FakeTime } from './helpers/fake-time.js'
import type { Test } from './helpers/option-error.js'

type Req = { plan: string }
const bad = (detail: string, hinted: boolean): Error => Object.assign(new Error(`${detail}${hinted ? ' [where the check runs]' : ''}`), { code: 'BAD' })

function route (config: unknown): RouteLimit<Req> {
  return compileRoute<Req>('GET /api', config, { capacity: 5, refillPerSecond: 1, failureMode: 'open' })
}

async function resolve (limit: RouteLimit<Req>, plan: string): Promise<RouteLimit<Req> | null> {
  if (limit.tiers === undefined) throw new Error('no tiers')
  return await limit.tiers.resolve(limit, { plan }, bad)
}

t.test('a plan replaces capacity and refill; the rest of the policy and its bucket stay', async (t) => {
  const PLANS: Record<string, Tier | false> = { free: { capacity: 2, refillPerSecond: 0.1 }, pro: { capacity: 50, refillPerSecond: 5 }, internal: false }
  const limit = route({ cost: 1, failureMode: 'local', local: { capacity: 1, refillPerSecond: 1 }, limit: (r: Req) => PLANS[r.plan] as Tier | false })
  t.equal(compileRoute('GET /x', {}, { capacity: 1, refillPerSecond: 1, failureMode: 'open' }).tiers, undefined, 'no plan function, no tiers')
  const free = await resolve(limit, 'free')
  t.same(free?.policies, [{ bucket: 'GET /api', capacity: 2, refillPerSecond: 0.1, failureMode: 'local', cost: 1, local: { capacity: 1, refillPerSecond: 1 } }])
  const decision = { allowed: true, limit: 2, remaining: 1, resetMs: 10_000, retryAfterMs: 0, source: 'store' as const, bucket: 'GET /api' }
  t.same(headerPairs(free?.headers ?? false, decision, free!.policyHeaders)[3], ['ratelimit-policy', '2;w=20'], 'the headers describe the plan')
  t.same(headerPairs('draft-6', { ...decision, source: 'local', limit: 1 }, free!.policyHeaders)[3], ['ratelimit-policy', '1;w=1'], 'and the local fallback its own sizes')
  t.equal(await resolve(limit, 'free'), free, 'the same plan object: the same resolved limit')
  t.equal((await resolve(limit, 'pro'))?.policies[0]?.capacity, 50)
  t.equal(await resolve(limit, 'internal'), null, 'false: no limit at all')
})

t.test('several policies: each its own plan or none; false drops that policy only; shadow never shows', async (t) => {
  const limit = route([
    { bucket: 'second', capacity: 3, refillPerSecond: 1, limit: (r: Req) => r.plan === 'internal' ? false : { capacity: 4, refillPerSecond: 2 } },
    { bucket: 'day', capacity: 100, refillPerSecond: 0.01 }
  ])
  const pro = await resolve(limit, 'pro')
  t.same(pro?.policies.map((p) => [p.bucket, p.capacity]), [['second', 4], ['day', 100]])
  const internal = await resolve(limit, 'internal')
  t.same(internal?.policies.map((p) => p.bucket), ['day'])
  t.equal(internal?.headers, 'draft-6')

  const trial = route([
    { bucket: 'enforced', capacity: 3, refillPerSecond: 1, limit: (r: Req) => r.plan === 'internal' ? false : { capacity: 4, refillPerSecond: 2 } },
    { bucket: 'trial', capacity: 100, refillPerSecond: 0.01, shadow: true }
  ])
  t.equal((await resolve(trial, 'internal'))?.headers, false, 'only a shadow policy left: no headers')
  const d = { allowed: true, limit: 4, remaining: 3, resetMs: 500, retryAfterMs: 0, source: 'store' as const, bucket: 'enforced' }
  const enforced = await resolve(trial, 'pro')
  t.same(headerPairs('draft-10', { ...d, policies: [d] }, enforced!.policyHeaders)[0], ['ratelimit-policy', '"enforced";q=4;w=2'], 'the enforced policy under the plan, alone')
})

t.test('a returned object is validated once; a fresh object each time is validated each time', async (t) => {
  let reads = 0
  const counted = { get capacity () { reads++; return 10 }, refillPerSecond: 1 }
  const limit = route({ limit: async () => counted })
  await resolve(limit, 'x')
  const after = reads
  t.ok(after > 0)
  for (let i = 0; i < 3; i++) await resolve(limit, 'x')
  t.equal(reads, after, 'no read after the first')
  let fresh = 0
  const each = route({ limit: () => ({ get capacity () { fresh++; return 10 }, refillPerSecond: 1 }) })
  await resolve(each, 'x')
  const one = fresh
  await resolve(each, 'x')
  t.equal(fresh, one * 2, 'a fresh object pays the validation again')
})

t.test('bad plans are the adapter\'s error saying what is wrong, the same every time; a throw or nothing says where the check runs', async (t) => {
  const cases: Array<[string, () => unknown, RegExp]> = [
    ['undefined', () => undefined, /^`limit` must return \{ capacity, refillPerSecond \} or false, got undefined \[where the check runs\]$/],
    ['a string', () => 'pro', /got "pro"$/],
    ['capacity a string', () => ({ capacity: '5', refillPerSecond: 1 }), /got an object \(keys: capacity, refillPerSecond\): `limit\(\)\.capacity` must be a finite number > 0, got "5"$/],
    ['refill missing', () => ({ capacity: 5 }), /`limit\(\)\.refillPerSecond` must be a finite number > 0, got undefined$/],
    ['an unknown field', () => ({ capacity: 5, refillPerSecond: 1, max: 5 }), /unknown option `limit\(\)\.max`/],
    ['a capacity below the cost', () => ({ capacity: 0.5, refillPerSecond: 1 }), /: a capacity of at least the route's cost \(1\)$/],
    ['not storable', () => ({ capacity: 1e10, refillPerSecond: 1e-10 }), /`limit\(\)\.refillPerSecond` must be at least capacity/],
    ['throws', () => { throw new Error('plan lookup failed') }, /^`limit` threw Error: plan lookup failed \(.*tiers\.test\.ts:\d+:\d+\)?\) \[where the check runs\]$/],
    ['throws a string', () => { throw 'no plan' }, /`limit` threw "no plan" \[where the check runs\]$/], // eslint-disable-line no-throw-literal
    ['rejects', async () => { throw new Error('database down') }, /`limit` threw Error: database down \(at .*\) \[where the check runs\]$/],
    ['a huge object', () => ({ capacity: 5, refillPerSecond: 1, ...Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`secret${i}`, 'x'.repeat(1000)])) }), /^`limit` must return [\s\S]{0,420}$/]
  ]
  for (const [label, fn, message] of cases) {
    const limit = route({ limit: fn })
    for (const time of ['first', 'again']) {
      const err = await resolve(limit, 'x').then(() => undefined, (e: unknown) => e)
      t.match(err, { code: 'BAD', message }, `${label} (${time})`)
    }
  }
  const err = await resolve(route({ limit: () => { throw new Error('inner') } }), 'x').catch((e: unknown) => e)
  t.equal((err as Error).cause, undefined, 'the cause is in the message once, never attached (a log line would repeat it)')
})

t.test('a plan change keeps the bucket: the time until full is kept, read under the new plan', async (t) => {
  const time = new FakeTime()
  const { limiter } = createCore({}, { time })
  t.teardown(() => limiter.close())
  const base = { bucket: 'GET /api', failureMode: 'open' } as const
  const free: Policy = { ...base, capacity: 2, refillPerSecond: 0.1 }
  const pro: Policy = { ...base, capacity: 100, refillPerSecond: 1 }
  // Upgrade: two free tokens spent are 20 s until full; under pro that is 20 tokens missing: 79 left after one.
  await limiter.consume('up', free)
  await limiter.consume('up', free)
  t.equal((await limiter.consume('up', free)).allowed, false, 'free plan exhausted')
  t.match(await limiter.consume('up', pro), { allowed: true, remaining: 79 }, 'pro: 100 - 20 s x 1/s - 1')
  // Downgrade: 50 pro tokens spent are 50 s until full, longer than the
  // free window (20 s): an empty free bucket, one free token away, not 40 s.
  for (let i = 0; i < 50; i++) await limiter.consume('down', pro)
  const down = await limiter.consume('down', free)
  t.match(down, { allowed: false, retryAfterMs: 10_000 }, 'one free token, not the rest of the pro usage')
})

// lua/token-bucket.lua writes the clamped full-at time back on a consume
// (PSETEX to now + one window) even when it denies, so after a downgrade
// the client is one free token away, as the denial says; the in-process
// store does the same (before it wrote nothing on a denial, and the client
// was told "retry in 10 s" at 0, 10, 20 and 30 s, allowed only at 40 s).
t.test('after a downgrade, the retry the denial named is allowed', async (t) => {
  const time = new FakeTime()
  const { limiter } = createCore({}, { time })
  t.teardown(() => limiter.close())
  const free: Policy = { bucket: 'b', failureMode: 'open', capacity: 2, refillPerSecond: 0.1 }
  const pro: Policy = { bucket: 'b', failureMode: 'open', capacity: 100, refillPerSecond: 1 }
  for (let i = 0; i < 50; i++) await limiter.consume('down', pro)
  const denied = await limiter.consume('down', free)
  await time.advance(denied.retryAfterMs)
  t.match(await limiter.consume('down', free), { allowed: true, remaining: 0 }, 'allowed once the named retry has passed')
})

async function plansApp (t: Test): Promise<FastifyInstance> {
  const PLANS: Record<string, Tier | false> = { free: { capacity: 2, refillPerSecond: 0.1 }, pro: { capacity: 50, refillPerSecond: 5 }, internal: false }
  const plan = (request: FastifyRequest): string => String(request.headers['x-plan'])
  const app = Fastify()
  await app.register(tollgate, { capacity: 5, refillPerSecond: 1, failureMode: 'open', warnings: false, key: (request) => String(request.headers['x-client']) })
  app.get('/api', { config: { rateLimit: { limit: (request) => PLANS[plan(request)] as Tier | false } } }, async (request) => request.rateLimit ?? null)
  app.get('/bad', { config: { rateLimit: { limit: () => ({ capacity: 'lots' }) as never } } }, async () => 'handler ran')
  await app.ready()
  t.teardown(() => app.close())
  return app
}

t.test('through Fastify on the in-process store: the client\'s own plan in the headers and the 429; false is no limit', async (t) => {
  const app = await plansApp(t)
  const hit = (client: string, tier: string) => app.inject({ url: '/api', headers: { 'x-client': client, 'x-plan': tier } })
  const free = await hit('ann', 'free')
  t.equal(free.statusCode, 200)
  t.match(free.headers, { 'ratelimit-limit': '2', 'ratelimit-remaining': '1', 'ratelimit-policy': '2;w=20' })
  t.match(free.json(), { limit: 2, remaining: 1 })
  t.match((await hit('bob', 'pro')).headers, { 'ratelimit-limit': '50', 'ratelimit-remaining': '49', 'ratelimit-policy': '50;w=10' })
  await hit('ann', 'free')
  const denied = await hit('ann', 'free')
  t.equal(denied.statusCode, 429)
  t.equal(denied.headers['retry-after'], '10', 'one token of the free plan: 10 s')
  const internal = await hit('cid', 'internal')
  t.equal(internal.statusCode, 200)
  t.equal(internal.body, 'null', 'no decision')
  t.notOk('ratelimit-limit' in internal.headers, 'no headers')
  const broken = await app.inject('/bad')
  t.equal(broken.statusCode, 500)
  t.same(broken.json(), { statusCode: 500, code: 'TOLLGATE_BAD_INPUT', error: 'Internal Server Error', message: 'Rate limit check failed; the server log says why' }, 'the generic 500: the log says why')
  t.notMatch(broken.body, 'handler ran', 'the handler never ran')
})
