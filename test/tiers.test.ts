// Plans and tiers: a policy's `limit` function picks the client's capacity
// and refill per request. The headers and request.rateLimit describe the
// client's own plan; a plan change keeps the bucket (upgrade and downgrade
// follow from the stored full-at time); bad values are a 500 before any
// store call; a returned object is validated once.

import t from 'tap'
import type { FastifyRequest } from 'fastify'
import { buildApp } from './helpers/app.js'
import { redisUrl } from './helpers/redis.js'
import type { Tier } from '../lib/index.js'
import { fleetKey } from './helpers/keys.js'

await redisUrl(t)

const plan = (request: FastifyRequest): string => String(request.headers['x-plan'])

t.test('the headers, request.rateLimit and the 429 describe the client\'s own plan; false is no limit', async (t) => {
  const PLANS: Record<string, Tier | false> = {
    free: { capacity: 2, refillPerSecond: 0.1 },
    pro: { capacity: 50, refillPerSecond: 5 },
    internal: false
  }
  const { app, keys } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 1, key: (request) => String(request.headers['x-client']) },
    routes: (app) => {
      app.get('/api', { config: { rateLimit: { limit: (request) => PLANS[plan(request)] as Tier | false } } }, async (request) => request.rateLimit ?? null)
    }
  })
  const hit = (client: string, tier: string) => app.inject({ url: '/api', headers: { 'x-client': client, 'x-plan': tier } })
  const free = await hit('ann', 'free')
  t.equal(free.statusCode, 200)
  t.match(free.headers, { 'ratelimit-limit': '2', 'ratelimit-remaining': '1', 'ratelimit-policy': '2;w=20' })
  t.match(free.json(), { limit: 2, remaining: 1 })
  const pro = await hit('bob', 'pro')
  t.match(pro.headers, { 'ratelimit-limit': '50', 'ratelimit-remaining': '49', 'ratelimit-policy': '50;w=10' })
  await hit('ann', 'free')
  const denied = await hit('ann', 'free')
  t.equal(denied.statusCode, 429)
  t.equal(denied.headers['retry-after'], '10', 'one token of the free plan: 10 s')
  t.equal(denied.headers['ratelimit-limit'], '2')
  const internal = await hit('cid', 'internal')
  t.equal(internal.statusCode, 200)
  t.equal(internal.body, 'null', 'no decision')
  t.notOk('ratelimit-limit' in internal.headers, 'no headers')
  t.equal((await keys()).filter((k) => k.includes('{cid}')).length, 0, 'no key for an unlimited client')
})

t.test('a plan change keeps the bucket: the time until full is kept, read under the new plan', async (t) => {
  // Both plans' windows (capacity / refill) differ: free 2 / 0.1 = 20 s, pro 100 / 1 = 100 s.
  const PLANS: Record<string, Tier> = { free: { capacity: 2, refillPerSecond: 0.1 }, pro: { capacity: 100, refillPerSecond: 1 } }
  const { app, inspect, prefix } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 1, key: (request) => String(request.headers['x-client']) },
    routes: (app) => {
      app.get('/api', { config: { rateLimit: { limit: (request) => PLANS[plan(request)] as Tier } } }, async (request) => request.rateLimit)
    }
  })
  const hit = (client: string, tier: string) => app.inject({ url: '/api', headers: { 'x-client': client, 'x-plan': tier } })

  // Upgrade: two free tokens spent are 20 s until full; under pro that is
  // 20 tokens missing of 100: the next request leaves 79.
  await hit('up', 'free')
  await hit('up', 'free')
  t.equal((await hit('up', 'free')).statusCode, 429, 'free plan exhausted')
  const upgraded = await hit('up', 'pro')
  t.equal(upgraded.statusCode, 200)
  t.equal(upgraded.headers['ratelimit-remaining'], '79', 'pro: 100 - 20 s x 1/s - 1')

  // Downgrade: 50 pro tokens spent are 50 s until full, longer than the
  // free window (20 s): it reads as an empty free bucket, never as a 50 s
  // lock-out; the wait is one free token (10 s), and the bucket is written
  // back to one free window ahead.
  for (let i = 0; i < 50; i++) await hit('down', 'pro')
  const downgraded = await hit('down', 'free')
  t.equal(downgraded.statusCode, 429)
  t.equal(downgraded.headers['retry-after'], '10', 'one free token, not the 40 s left of the pro usage')
  const key = await fleetKey(inspect, prefix, 'down', 'GET /api')
  const [fullAt, time] = await Promise.all([inspect.get(key), inspect.time()])
  const aheadS = (Number(fullAt) - (Number(time[0]) * 1e6 + Number(time[1]))) / 1e6
  t.ok(aheadS > 19 && aheadS <= 20.01, `full again in ${aheadS.toFixed(3)} s: one free window`)
})

t.test('bad values from limit are a 500 TOLLGATE_BAD_INPUT with no store call', async (t) => {
  const bad: Record<string, () => unknown> = {
    undefined: () => undefined,
    string: () => 'pro',
    'string-capacity': () => ({ capacity: '5', refillPerSecond: 1 }),
    'missing-refill': () => ({ capacity: 5 }),
    'unknown-field': () => ({ capacity: 5, refillPerSecond: 1, max: 5 }),
    'cost-over-capacity': () => ({ capacity: 0.5, refillPerSecond: 1 }),
    'not-storable': () => ({ capacity: 1e10, refillPerSecond: 1e-10 }),
    throws: () => { throw new Error('plan lookup failed') },
    'throws-a-string': () => { throw 'no plan' }, // eslint-disable-line no-throw-literal
    rejects: async () => { throw new Error('database down') }
  }
  const { app, keys } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 1 },
    routes: (app) => {
      for (const [name, fn] of Object.entries(bad)) {
        app.get(`/${name}`, { config: { rateLimit: { limit: fn as () => Tier } } }, async () => 'x')
      }
    }
  })
  for (const name of Object.keys(bad)) {
    for (let i = 0; i < 2; i++) {
      const res = await app.inject(`/${name}`)
      t.equal(res.statusCode, 500, `${name}: 500 (${i === 0 ? 'first' : 'cached'})`)
      t.equal(res.json().code, 'TOLLGATE_BAD_INPUT', `${name}: ${res.json().message as string}`)
    }
  }
  t.same(await keys(), [], 'no store call')
})

t.test('a returned object is validated once; several policies, each with its own plan or none', async (t) => {
  let reads = 0
  const counted = {
    get capacity () { reads++; return 10 },
    refillPerSecond: 1
  }
  const { app } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 1 },
    routes: (app) => {
      app.get('/once', { config: { rateLimit: { failureMode: 'local', local: { capacity: 2, refillPerSecond: 1 }, limit: async () => counted } } }, async (request) => request.rateLimit)
      app.get('/two', {
        config: {
          rateLimit: [
            { bucket: 'second', capacity: 3, refillPerSecond: 1, limit: (request) => request.headers['x-plan'] === 'internal' ? false : { capacity: 4, refillPerSecond: 2 } },
            { bucket: 'day', capacity: 100, refillPerSecond: 0.01 }
          ]
        }
      }, async (request) => request.rateLimit)
    }
  })
  t.equal((await app.inject('/once')).headers['ratelimit-limit'], '10')
  const after = reads
  for (let i = 0; i < 3; i++) await app.inject('/once')
  t.equal(reads, after, `validated on the first request only (${after} reads of capacity), none after`)

  const both = (await app.inject('/two')).json()
  t.same(both.policies.map((p: { bucket: string, limit: number }) => [p.bucket, p.limit]), [['second', 4], ['day', 100]], 'the plan over the first policy, the second as declared')
  const internal = (await app.inject({ url: '/two', headers: { 'x-plan': 'internal' } })).json()
  t.match(internal, { bucket: 'day', limit: 100, remaining: 98 }, 'false drops that policy only')
  t.equal(internal.policies, undefined, 'one policy left')
})

t.test('shadow policies never show: a plan that drops the enforced policy leaves no headers', async (t) => {
  const { app } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 1 },
    routes: (app) => {
      app.get('/trial', {
        config: {
          rateLimit: [
            { bucket: 'enforced', capacity: 3, refillPerSecond: 1, limit: (request) => request.headers['x-plan'] === 'internal' ? false : { capacity: 4, refillPerSecond: 2 } },
            { bucket: 'trial', capacity: 100, refillPerSecond: 0.01, shadow: true }
          ]
        }
      }, async (request) => request.rateLimit)
    }
  })
  const pro = await app.inject('/trial')
  t.match(pro.headers, { 'ratelimit-limit': '4', 'ratelimit-policy': '4;w=2' }, 'the enforced policy under the plan, alone')
  const internal = await app.inject({ url: '/trial', headers: { 'x-plan': 'internal' } })
  t.equal(internal.statusCode, 200)
  t.equal(internal.headers['ratelimit-limit'], undefined, 'only the shadow policy left: no headers')
  t.match(internal.json(), { bucket: 'trial', remaining: 98 })
})

t.test('the app\'s own functions have no deadline: a request waits for key, cost, allow and limit as long as they run', async (t) => {
  const gates: Record<string, () => void> = {}
  const held = <T>(name: string, value: T) => async (): Promise<T> => {
    await new Promise<void>((resolve) => { gates[name] = resolve })
    return value
  }
  const { app } = await buildApp(t, {
    // The store's deadline (10 ms; failing open past it) is Redis's; the functions' time is not counted.
    plugin: { capacity: 5, refillPerSecond: 1, timeout: 10, failureMode: 'open' },
    routes: (app) => {
      app.get('/key', { config: { rateLimit: { key: held('key', 'ann') } } }, async () => 'ok')
      app.get('/cost', { config: { rateLimit: { cost: held('cost', 1) } } }, async () => 'ok')
      app.get('/allow', { config: { rateLimit: { allow: held('allow', false) } } }, async () => 'ok')
      app.get('/limit', { config: { rateLimit: { limit: held('limit', { capacity: 5, refillPerSecond: 1 }) } } }, async () => 'ok')
    }
  })
  for (const name of ['key', 'cost', 'allow', 'limit']) {
    let answered = false
    const reply = app.inject(`/${name}`).then((res) => { answered = true; return res })
    await new Promise((resolve) => setTimeout(resolve, 300))
    t.equal(answered, false, `${name}: no answer while it runs (300 ms; tollgate's timeout is 10 ms)`)
    gates[name]?.()
    t.equal((await reply).statusCode, 200, `${name}: answered once it returns`)
  }
})
