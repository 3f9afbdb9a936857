// Shadow mode (`shadow: true`): a shadow policy is decided and spent like
// an enforced one, but never refuses: its would-be denials pass, flagged
// `shadow: true` on the decision and on the 'tollgate:decision' message;
// a route shows no rate-limit headers for it. Against the shared Redis
// and the in-process store.

import diagnostics from 'node:diagnostics_channel'
import { Redis } from 'ioredis'
import t from 'tap'
import { createLimiter, type Decision, type DecisionMessage, type Policy } from '../lib/index.js'
import { buildApp, captureLogs, sharedRedis, uniquePrefix } from './helpers/app.js'
import { NO_REDIS_PORT } from './helpers/redis.js'

const NO_REFILL = 1e-6
const shadowPolicy: Policy = { bucket: 'new-limit', capacity: 2, refillPerSecond: NO_REFILL, failureMode: 'open', shadow: true }

for (const store of ['redis', 'memory'] as const) {
  t.test(`${store}: a shadow policy spends as usual and lets its would-be denials through, flagged`, async (t) => {
    const redis = store === 'redis' ? await sharedRedis(t) : undefined
    const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
    t.teardown(() => limiter.close())
    const messages: DecisionMessage[] = []
    const listen = (m: unknown): void => { messages.push(m as DecisionMessage) }
    diagnostics.subscribe('tollgate:decision', listen)
    t.teardown(() => diagnostics.unsubscribe('tollgate:decision', listen))
    const got: Decision[] = []
    for (let i = 0; i < 5; i++) got.push(await limiter.consume('client', shadowPolicy))
    t.same(got.map((d) => d.allowed), [true, true, true, true, true], 'nothing refused')
    t.same(got.map((d) => d.shadow === true), [false, false, true, true, true], 'the three past capacity are would-be denials')
    t.ok((got[4] as Decision).retryAfterMs > 1e6, 'with the wait the limit would have told')
    const mine = messages.filter((m) => m.key === 'client')
    t.same(mine.map((m) => m.shadow === true), [false, false, true, true, true], 'the diagnostics messages say so too')
    const enforced = { ...shadowPolicy, shadow: false }
    t.equal((await limiter.peek('client', enforced)).remaining, 0, 'the two allowed spent their tokens; the would-be denials spent nothing more')
  })
}

t.test('with enforced policies, the enforced ones decide; the shadow one spends only when the request is allowed', async (t) => {
  const redis = await sharedRedis(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
  t.teardown(() => limiter.close())
  const real: Policy = { bucket: 'real', capacity: 3, refillPerSecond: NO_REFILL, failureMode: 'open' }
  const list = [real, { ...shadowPolicy, capacity: 1 }]
  const got: Decision[] = []
  for (let i = 0; i < 4; i++) got.push(await limiter.consume('c', list, 1))
  t.same(got.map((d) => [d.allowed, d.shadow === true]), [[true, false], [true, true], [true, true], [false, false]],
    'the shadow limit would deny the 2nd and 3rd; the real one denies the 4th, not a would-be denial')
  t.same((got[1] as Decision).policies?.map((d) => [d.bucket, d.allowed, d.shadow === true]), [['real', true, false], ['new-limit', true, true]], 'per policy, in order')
  t.equal((got[3] as Decision).bucket, 'real', 'the denial is the enforced policy\'s')
  t.equal((await limiter.peek('c', { ...real, capacity: 3 })).remaining, 0, 'the enforced bucket spent 3')
  t.equal((await limiter.peek('c', { ...shadowPolicy, capacity: 1, shadow: false })).remaining, 0, 'the shadow bucket spent 1 (its own allowed request)')
})

t.test('a shadow policy with failureMode closed does not refuse while the store is down', async (t) => {
  const redis = new Redis({ host: '127.0.0.1', port: NO_REDIS_PORT, lazyConnect: true })
  redis.on('error', () => {})
  t.teardown(() => { redis.disconnect() })
  const limiter = createLimiter({ redis, prefix: uniquePrefix() })
  t.teardown(() => limiter.close())
  const decision = await limiter.consume('c', { ...shadowPolicy, failureMode: 'closed' })
  t.equal(decision.allowed, true)
  t.equal(decision.source, 'fail-open')
})

t.test('routes: a shadow route never answers 429 and shows no rate-limit headers; a mixed one shows its enforced policies only', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 1, refillPerSecond: NO_REFILL },
    routes (app) {
      app.get('/shadow', { config: { rateLimit: { shadow: true } } }, async (request) => ({ shadow: request.rateLimit?.shadow === true }))
      app.get('/mixed', { config: { rateLimit: [{ capacity: 5, headers: 'draft-10' }, { bucket: 'tight', shadow: true }] } }, async () => 'ok')
    }
  })
  const first = await app.inject('/shadow')
  const second = await app.inject('/shadow')
  t.same([first.statusCode, second.statusCode], [200, 200], 'never refused')
  t.same([first.json(), second.json()], [{ shadow: false }, { shadow: true }], 'the second is a would-be denial')
  t.same(Object.keys(second.headers).filter((h) => h.startsWith('ratelimit') || h === 'retry-after'), [], 'no rate-limit header, no Retry-After')
  await app.inject('/mixed')
  const mixed = await app.inject('/mixed')
  t.equal(mixed.statusCode, 200)
  t.equal(mixed.headers['ratelimit-policy'], '"GET /mixed";q=5;w=5000000', 'the policy list names the enforced bucket only')
  t.match(String(mixed.headers.ratelimit), /^"GET \/mixed";r=3;t=\d+$/, 'and so do the counts')
})

t.test('options: shadow must be a boolean, and is not combined with maxWaitMs', async (t) => {
  const limiter = createLimiter()
  t.teardown(() => limiter.close())
  await t.rejects(limiter.consume('c', { ...shadowPolicy, shadow: 'yes' as never }), { code: 'TOLLGATE_INVALID_OPTION', message: /`policy.shadow` must be true or false, got "yes"/ })
  await t.rejects(limiter.consume('c', { ...shadowPolicy, maxWaitMs: 100 }), { code: 'TOLLGATE_INVALID_OPTION', message: /`policy.maxWaitMs` must be unset with `shadow: true`/ })
  // A shadow cost may exceed capacity, up to 2^52 µs of refill (here 1 token per 1e6 s: 4503.6 tokens).
  await t.rejects(limiter.consume('c', { ...shadowPolicy, cost: 1e4 }), { code: 'TOLLGATE_INVALID_OPTION', message: /`policy.cost` must be at most 4503.59962737\d* \(2\^52 µs of refill, on a shadow policy\), got 10000/ })
  await t.rejects(limiter.consume('c', shadowPolicy, 1e4), { code: 'TOLLGATE_INVALID_OPTION', message: /`cost` must be at most 4503.59962737\d* \(2\^52 µs of refill, on a shadow policy\) of bucket "new-limit", got 10000/ })
  await t.rejects(limiter.consume('c', { ...shadowPolicy, shadow: false, cost: 3 }), { message: /`policy.cost` must be at most capacity \(2\), got 3/ })
})

t.test('several shadow policies: only those the request could not afford are flagged', async (t) => {
  const limiter = createLimiter()
  t.teardown(() => limiter.close())
  const tight: Policy = { ...shadowPolicy, bucket: 'tight', capacity: 1 }
  const loose: Policy = { ...shadowPolicy, bucket: 'loose', capacity: 10 }
  await limiter.consume('c', [tight, loose])
  const second = await limiter.consume('c', [tight, loose])
  t.match(second, { allowed: true, shadow: true, bucket: 'tight' })
  t.same(second.policies?.map((d) => [d.bucket, d.allowed, d.shadow === true]), [['tight', true, true], ['loose', true, false]], 'the policy that could afford it is not a would-be denial')
})

t.test('a cost above a shadow policy\'s capacity is a would-be denial, never an error: scripts and the in-process store alike', async (t) => {
  // A shadow capacity of 2 at 1/s, requests of cost 5: the limit could never
  // afford one, so each passes, flagged, and spends nothing from it. Its
  // retryAfterMs is the time until the bucket is full plus what the cost
  // above capacity would take to refill (here 3 s). Before, the policy was
  // refused at registration and the requests were 500s.
  const tight: Policy = { bucket: 'tight', capacity: 2, refillPerSecond: 1, failureMode: 'open', shadow: true, cost: 5 }
  const redis = await sharedRedis(t)
  for (const [name, options, policy] of [
    ['Redis', { redis }, tight],
    ['the in-process store', {}, tight],
    ['Redis, with a lockout', { redis }, { ...tight, bucket: 'locked', lockout: { after: 2, withinMs: 60_000, forMs: 60_000 } }],
    ['Redis, leased', { redis }, { ...tight, bucket: 'leased', lease: { tokens: 2, maxAgeMs: 1000 } }]
  ] as const) {
    const limiter = createLimiter({ ...options, prefix: uniquePrefix(), timeout: 1000 })
    t.teardown(() => limiter.close())
    const got = [await limiter.consume('c', policy), await limiter.consume('c', policy)]
    t.same(got.map((d) => [d.allowed, d.shadow === true]), [[true, true], [true, true]], `${name}: both pass, flagged`)
    t.match(got[0], { remaining: 2, resetMs: 0, retryAfterMs: 3000 }, `${name}: a full bucket, 3 s of refill short of the cost`)
    t.match(await limiter.peek('c', { ...tight, bucket: policy.bucket, cost: 1, shadow: false }), { allowed: true, remaining: 2 }, `${name}: nothing spent from the shadow bucket`)
    if ('lockout' in policy) t.equal(got[1]?.locked, true, `${name}: the second would-be denial is a would-be lockout`)
    const programmatic = await limiter.consume('c', { ...policy, cost: undefined }, 7)
    t.match(programmatic, { allowed: true, shadow: true }, `${name}: a cost argument above capacity too`)
  }
})

t.test('routes: a cost function above a shadow policy\'s capacity is a would-be denial; enforced policies still refuse one', async (t) => {
  const logs = captureLogs()
  const { app } = await buildApp(t, {
    fastify: { logger: { level: 'error', stream: logs.stream } },
    plugin: { capacity: 10, refillPerSecond: NO_REFILL, shadow: true, cost: 20 },
    routes (app) {
      const cost = (request: { query: unknown }): number => Number((request.query as { cost: string }).cost)
      app.get('/shadow', { config: { rateLimit: { capacity: 2, cost } } }, async (request) => ({ shadow: request.rateLimit?.shadow === true }))
      app.get('/mixed', { config: { rateLimit: [{ bucket: 'real', shadow: false, cost }, { bucket: 'tight', capacity: 2, cost }] } }, async (request) => ({ shadow: request.rateLimit?.shadow === true }))
      app.get('/static', async (request) => ({ shadow: request.rateLimit?.shadow === true }))
      app.get('/plan', { config: { rateLimit: { cost: undefined, limit: () => ({ capacity: 0.5, refillPerSecond: 1 }) } } }, async (request) => ({ shadow: request.rateLimit?.shadow === true }))
    }
  })
  const shadow = await app.inject('/shadow?cost=5')
  t.same([shadow.statusCode, shadow.json()], [200, { shadow: true }], 'a shadow route: passes, flagged')
  const mixed = await app.inject('/mixed?cost=5')
  t.same([mixed.statusCode, mixed.json()], [200, { shadow: true }], 'mixed: the enforced policy affords it, the shadow one would deny')
  t.equal(mixed.headers['ratelimit-remaining'], '5', 'and the headers are the enforced policy\'s')
  t.equal((await app.inject('/mixed?cost=11')).statusCode, 500, 'a cost above the enforced policy\'s capacity is still bad input')
  t.same((await app.inject('/static')).json(), { shadow: true }, 'the plugin\'s shadow cost of 20 on capacity 10 registers and passes')
  t.same((await app.inject('/plan')).json(), { shadow: true }, 'a plan below the default cost of 1, on a shadow policy')
  const huge = await app.inject('/shadow?cost=1e300')
  t.equal(huge.statusCode, 500, 'a shadow cost past 2^52 µs of refill is bad input')
  t.match(huge.json(), { message: 'Rate limit check failed; the server log says why' }, 'the client is told nothing of the value')
  t.match(logs.lines.map((l) => JSON.stringify(l)).join('\n'), /`cost` must return a finite number > 0 and <= 4503.59962737\d* \(2\^52 µs of refill, on a shadow policy\), got 1e\+300/, 'the log says why')
})
