// Bad input (docs/reference/options.md): every invalid option fails registration with a
// coded TypeError naming the option, the value and what is expected; the
// core validates its own options and calls; a failing `key`, `cost` or
// `allow` function is a 500 naming the route with no store call; a key of
// the wrong type in Redis is a store failure for that one request.

import t from 'tap'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import { createClientPool, createSentinel } from 'redis'
import { createLimiter, type Policy, type TollgateOptions } from '../lib/index.js'
import { buildApp, captureLogs, keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { infoField, redisCommand, redisUrl, startRedisServer } from './helpers/redis.js'
import { isOptionError, registerError, routeError, type Expected } from './unit/helpers/option-error.js'
import { fleetSecret, keyUnder } from './helpers/keys.js'

await redisUrl(t)

/** Every accepted client family, as the message lists them. */
const ACCEPTED = 'an ioredis or iovalkey Redis or Cluster, a node-redis createClient() or createCluster() client, or a GLIDE GlideClient or GlideClusterClient'

const base = { capacity: 10, refillPerSecond: 1, failureMode: 'open' } as const
const NUMBER = 'a finite number > 0'
const MODES = /one of ["']open["'], ["']closed["'], ["']local["']/

t.test('invalid plugin options', async (t) => {
  const cases: Array<[string, Record<string, unknown>, Expected]> = [
    ['options not an object', 'x' as never, { name: 'options', got: '"x"', expect: 'an object' }],
    ['options an array', [] as never, { name: 'options', got: 'an array' }],
    ['capacity as a string', { ...base, capacity: '10' }, { name: 'capacity', got: '"10"', expect: NUMBER }],
    ['capacity 0', { ...base, capacity: 0 }, { name: 'capacity', got: '0', expect: NUMBER }],
    ['capacity < 0', { ...base, capacity: -1 }, { name: 'capacity', got: '-1' }],
    ['capacity NaN', { ...base, capacity: NaN }, { name: 'capacity', got: 'NaN' }],
    ['capacity Infinity', { ...base, capacity: Infinity }, { name: 'capacity', got: 'Infinity' }],
    ['capacity null', { ...base, capacity: null }, { name: 'capacity', got: 'null' }],
    ['refillPerSecond as a string', { ...base, refillPerSecond: '1' }, { name: 'refillPerSecond', got: '"1"', expect: NUMBER }],
    ['refillPerSecond 0', { ...base, refillPerSecond: 0 }, { name: 'refillPerSecond', got: '0' }],
    ['refillPerSecond < 0', { ...base, refillPerSecond: -0.5 }, { name: 'refillPerSecond', got: '-0.5' }],
    ['refillPerSecond NaN', { ...base, refillPerSecond: NaN }, { name: 'refillPerSecond', got: 'NaN' }],
    ['refillPerSecond -Infinity', { ...base, refillPerSecond: -Infinity }, { name: 'refillPerSecond', got: '-Infinity' }],
    ['cost 0', { ...base, cost: 0 }, { name: 'cost', got: '0', expect: NUMBER }],
    ['cost as a string', { ...base, cost: '2' }, { name: 'cost', got: '"2"' }],
    ['cost NaN', { ...base, cost: NaN }, { name: 'cost', got: 'NaN' }],
    ['cost > capacity', { ...base, cost: 11 }, { name: 'cost', got: '11', expect: 'at most capacity (10)' }],
    ['failureMode missing', { capacity: 10, refillPerSecond: 1 }, { name: 'failureMode', got: 'undefined', expect: MODES }],
    ['failureMode unknown', { ...base, failureMode: 'maybe' }, { name: 'failureMode', got: '"maybe"', expect: MODES }],
    ["'local' without local", { ...base, failureMode: 'local' }, { name: 'local', got: 'undefined', expect: '{ capacity, refillPerSecond }' }],
    ['local not an object', { ...base, failureMode: 'local', local: 5 }, { name: 'local', got: '5' }],
    ['local.capacity 0', { ...base, failureMode: 'local', local: { capacity: 0, refillPerSecond: 1 } }, { name: 'local.capacity', got: '0' }],
    ['local.refillPerSecond missing', { ...base, failureMode: 'local', local: { capacity: 1 } }, { name: 'local.refillPerSecond', got: 'undefined' }],
    ['local.capacity missing', { ...base, failureMode: 'local', local: { refillPerSecond: 1 } }, { name: 'local.capacity', got: 'undefined' }],
    ['local.refillPerSecond a string', { ...base, failureMode: 'local', local: { capacity: 1, refillPerSecond: 'fast' } }, { name: 'local.refillPerSecond', got: '"fast"' }],
    ['breaker not an object', { ...base, breaker: 'x' }, { name: 'breaker', got: '"x"' }],
    ['breaker.failures 0', { ...base, breaker: { failures: 0 } }, { name: 'breaker.failures', got: '0', expect: 'an integer > 0' }],
    ['breaker.failures not an integer', { ...base, breaker: { failures: 2.5 } }, { name: 'breaker.failures', got: '2.5' }],
    ['breaker.cooldownMs < 0', { ...base, breaker: { cooldownMs: -1 } }, { name: 'breaker.cooldownMs', got: '-1' }],
    ['prefix empty', { ...base, prefix: '' }, { name: 'prefix', got: '""', expect: '[A-Za-z0-9._:-]' }],
    ['prefix with a space', { ...base, prefix: 'my app' }, { name: 'prefix', got: '"my app"' }],
    ['prefix with braces', { ...base, prefix: 'a{b}' }, { name: 'prefix', got: '"a{b}"' }],
    ['prefix too long', { ...base, prefix: 'p'.repeat(65) }, { name: 'prefix', got: JSON.stringify('p'.repeat(65)) }],
    ['prefix a number', { ...base, prefix: 5 }, { name: 'prefix', got: '5' }],
    ['ipv6Subnet 0', { ...base, ipv6Subnet: 0 }, { name: 'ipv6Subnet', got: '0', expect: 'an integer from 1 to 128' }],
    ['ipv6Subnet 129', { ...base, ipv6Subnet: 129 }, { name: 'ipv6Subnet', got: '129' }],
    ['ipv6Subnet fractional', { ...base, ipv6Subnet: 56.5 }, { name: 'ipv6Subnet', got: '56.5' }],
    ['ipv6Subnet a string', { ...base, ipv6Subnet: '56' }, { name: 'ipv6Subnet', got: '"56"' }],
    ['ipv6Subnet NaN', { ...base, ipv6Subnet: NaN }, { name: 'ipv6Subnet', got: 'NaN' }],
    ['headers unknown', { ...base, headers: 'draft-7' }, { name: 'headers', got: '"draft-7"', expect: /one of ["']draft-6["'], ["']draft-10["'], ["']draft-11["'], ["']legacy["'], false/ }],
    ['headers true', { ...base, headers: true }, { name: 'headers', got: 'true' }],
    ['headers in upper case', { ...base, headers: 'DRAFT-6' }, { name: 'headers', got: '"DRAFT-6"' }],
    ['hook unknown', { ...base, hook: 'preValidation' }, { name: 'hook', got: '"preValidation"', expect: /one of ["']onRequest["'], ["']preHandler["']/ }],
    ['hook lower case', { ...base, hook: 'onrequest' }, { name: 'hook', got: '"onrequest"' }],
    ['redis a URL', { ...base, redis: 'redis://127.0.0.1:6379' }, { name: 'redis', got: '"redis://127.0.0.1:6379"', expect: 'ioredis' }],
    ['redis a plain object', { ...base, redis: { host: '127.0.0.1' } }, { name: 'redis', got: '{"host":"127.0.0.1"}', expect: ACCEPTED }],
    ['redis a node-redis pool', { ...base, redis: createClientPool() }, { name: 'redis', got: 'a node-redis createClientPool() pool', expect: ACCEPTED }],
    ['redis a node-redis sentinel', { ...base, redis: createSentinel({ name: 'm', sentinelRootNodes: [{ host: '127.0.0.1', port: 1 }] }) }, { name: 'redis', got: 'a node-redis createSentinel() client', expect: ACCEPTED }],
    ['redis an object of another class', { ...base, redis: new URL('redis://127.0.0.1:6379') }, { name: 'redis', got: 'an instance of URL', expect: ACCEPTED }],
    ['redis null', { ...base, redis: null }, { name: 'redis', got: 'null' }],
    ['global a string', { ...base, global: 'yes' }, { name: 'global', got: '"yes"', expect: 'true or false' }],
    ['global a number', { ...base, global: 1 }, { name: 'global', got: '1' }],
    ['key not a function', { ...base, key: 'ip' }, { name: 'key', got: '"ip"', expect: 'a function' }],
    ['allow not a function', { ...base, allow: true }, { name: 'allow', got: 'true', expect: 'a function' }],
    ['timeout 0', { ...base, timeout: 0 }, { name: 'timeout', got: '0', expect: NUMBER }],
    ['timeout Infinity', { ...base, timeout: Infinity }, { name: 'timeout', got: 'Infinity' }],
    ['timeout a string', { ...base, timeout: '10' }, { name: 'timeout', got: '"10"' }],
    ['bucket empty', { ...base, bucket: '' }, { name: 'bucket', got: '""', expect: 'a non-empty string' }],
    ['bucket a number', { ...base, bucket: 5 }, { name: 'bucket', got: '5' }],
    ['lease not an object', { ...base, lease: 10 }, { name: 'lease', got: '10', expect: '{ tokens, maxAgeMs }' }],
    ['lease.tokens missing', { ...base, lease: { maxAgeMs: 100 } }, { name: 'lease.tokens', got: 'undefined' }],
    ['lease.maxAgeMs 0', { ...base, lease: { tokens: 2, maxAgeMs: 0 } }, { name: 'lease.maxAgeMs', got: '0' }],
    ['denialCache true', { ...base, denialCache: true }, { name: 'denialCache', got: 'true', expect: 'false or an object { maxKeys, maxAgeMs }' }],
    ['denialCache.maxKeys 0', { ...base, denialCache: { maxKeys: 0 } }, { name: 'denialCache.maxKeys', got: '0', expect: 'an integer > 0' }],
    ['denialCache.maxAgeMs 0', { ...base, denialCache: { maxAgeMs: 0 } }, { name: 'denialCache.maxAgeMs', got: '0', expect: NUMBER }],
    ['denialCache.maxAgeMs a string', { ...base, denialCache: { maxAgeMs: '1000' } }, { name: 'denialCache.maxAgeMs', got: '"1000"', expect: NUMBER }],
    ['denialCache.maxAgeMs Infinity', { ...base, denialCache: { maxAgeMs: Infinity } }, { name: 'denialCache.maxAgeMs', got: 'Infinity', expect: NUMBER }]
  ]
  for (const [label, options, want] of cases) {
    isOptionError(t, await registerError(options), want, label)
  }
  // Checked like cost > capacity, at registration rather than when a route
  // (if any) merges over the defaults.
  const lease = await registerError({ ...base, lease: { tokens: 20, maxAgeMs: 100 } })
  t.type(lease, TypeError, 'plugin lease.tokens > capacity fails registration')
})

t.test('unknown option names', async (t) => {
  const cases: Array<[Record<string, unknown>, string, string | undefined]> = [
    [{ ...base, capacty: 5 }, 'capacty', 'capacity'],
    [{ ...base, refilPerSecond: 5 }, 'refilPerSecond', 'refillPerSecond'],
    [{ ...base, failuremode: 'open' }, 'failuremode', 'failureMode'],
    [{ ...base, ipv6subnet: 64 }, 'ipv6subnet', 'ipv6Subnet'],
    [{ ...base, timeWindow: 1000 }, 'timeWindow', undefined],
    [{ ...base, max: 100 }, 'max', undefined],
    [{ ...base, failureMode: 'local', local: { capcity: 1, refillPerSecond: 1 } }, 'local.capcity', 'local.capacity'],
    [{ ...base, breaker: { cooldown: 100 } }, 'breaker.cooldown', 'breaker.cooldownMs']
  ]
  for (const [options, name, hint] of cases) {
    const err = await registerError(options)
    t.type(err, TypeError, name)
    t.equal((err as { code?: string }).code, 'TOLLGATE_INVALID_OPTION')
    t.match((err as Error).message, `unknown option \`${name}\``)
    if (hint === undefined) t.notMatch((err as Error).message, 'did you mean', `${name}: no hint when nothing is close`)
    else t.match((err as Error).message, `did you mean \`${hint}\`?`, `${name}: suggests ${hint}`)
  }
})

t.test('invalid route config', async (t) => {
  const x = async (): Promise<string> => 'x'
  const on = (rateLimit: unknown) => (app: FastifyInstance) => {
    app.get('/x', { config: { rateLimit: rateLimit as false } }, x)
  }
  const where = 'config.rateLimit of GET /x: '
  const cases: Array<[string, Partial<TollgateOptions>, (app: FastifyInstance) => void, Expected]> = [
    ['not an object', base, on('fast'), { name: `${where.trimEnd()}`, got: '"fast"', expect: 'a policy object' }],
    ['true', base, on(true), { name: `${where.trimEnd()}`, got: 'true' }],
    ['an empty array', base, on([]), { name: `${where}rateLimit`, got: 'an array', expect: 'non-empty array' }],
    ['a bad array member', base, on([{ bucket: 'a' }, 7]), { name: `${where}[1]`, got: '7' }],
    ['capacity 0', base, on({ capacity: 0 }), { name: `${where}capacity`, got: '0', expect: NUMBER }],
    ['refillPerSecond NaN', base, on({ refillPerSecond: NaN }), { name: `${where}refillPerSecond`, got: 'NaN' }],
    ['cost over the route capacity', base, on({ capacity: 3, cost: 4 }), { name: `${where}cost`, got: '4', expect: 'at most capacity (3)' }],
    ['plugin cost over the route capacity', { ...base, cost: 5 }, on({ capacity: 3 }), { name: `${where}cost`, got: '5', expect: 'at most capacity (3)' }],
    ['failureMode unknown', base, on({ failureMode: 'sometimes' }), { name: `${where}failureMode`, got: '"sometimes"' }],
    ["'local' without local", base, on({ failureMode: 'local' }), { name: `${where}local`, got: 'undefined' }],
    ['bad local', base, on({ failureMode: 'local', local: { capacity: -1, refillPerSecond: 1 } }), { name: `${where}local.capacity`, got: '-1' }],
    ['headers unknown', base, on({ headers: 'draft-7' }), { name: `${where}headers`, got: '"draft-7"' }],
    ['hook unknown', base, on({ hook: 'onSend' }), { name: `${where}hook`, got: '"onSend"' }],
    ['key not a function', base, on({ key: 'user' }), { name: `${where}key`, got: '"user"' }],
    ['bucket empty', base, on({ bucket: '' }), { name: `${where}bucket`, got: '""' }],
    ['duplicate bucket names', base, on([{ bucket: 'a' }, { capacity: 2, bucket: 'a' }]), { name: `${where}[1].bucket`, got: '"a"', expect: 'a name used once per route' }],
    ['array member capacity', base, on([{ bucket: 'a' }, { bucket: 'b', capacity: '2' }]), { name: `${where}[1].capacity`, got: '"2"' }],
    ['route-wide option differing between members', base,
      on([{ bucket: 'a', headers: 'legacy' }, { bucket: 'b', headers: 'draft-6' }]), { name: `${where}headers`, expect: 'the same in every policy' }],
    ['missing capacity (none on the plugin)', { refillPerSecond: 1 }, on({ refillPerSecond: 2 }), { name: `${where}capacity`, got: 'undefined', expect: 'set it on the plugin or the route' }],
    ['missing refillPerSecond (none on the plugin)', { capacity: 5 }, on({ capacity: 2 }), { name: `${where}refillPerSecond`, got: 'undefined' }],
    ['lease.tokens over the capacity', base, on({ capacity: 3, lease: { tokens: 4, maxAgeMs: 100 } }), { name: `${where}lease.tokens`, got: '4', expect: 'at most capacity (3)' }],
    ['lease in an array of policies', base, on([{ bucket: 'a' }, { bucket: 'b', lease: { tokens: 2, maxAgeMs: 100 } }]), { name: `${where}[1].lease` }],
    ['no config, global, no capacity anywhere', { refillPerSecond: 1 }, (app) => { app.get('/x', x) }, { name: `${where}capacity`, got: 'undefined' }],
    // Bounds of what Redis can store (lib/core/options.ts, storableBucket).
    ['a window over 2^52 µs', base, on({ capacity: 1e15, refillPerSecond: 0.001 }),
      { name: `${where}refillPerSecond`, got: '0.001', expect: /at least capacity \/ 4503599627\.370496 \(222044\.6049250313\): .* at most 2\^52 µs/ }],
    ['a window over 2^52 µs from the plugin\'s refill', { refillPerSecond: 1e-9, failureMode: 'open' }, on({ capacity: 5 }),
      { name: `${where}refillPerSecond`, got: '1e-9', expect: /2\^52 µs \(4503599627\.370496 s, about 142 years\)/ }],
    ['a capacity whose microseconds overflow', base, on({ capacity: 1e303, refillPerSecond: 1e303 }),
      { name: `${where}capacity`, got: '1e+303', expect: 'at most 1.7976931348623154e+302 (capacity × 1e6 µs must be a finite number)' }],
    ['a refill whose token interval overflows', base, on({ capacity: 1e-310, refillPerSecond: 1e-305 }),
      { name: `${where}refillPerSecond`, got: '1e-305', expect: 'at least 5.562684646268004e-303' }]
  ]
  for (const [label, plugin, declare, want] of cases) {
    isOptionError(t, await routeError(plugin, declare), want, label)
  }

  const plugged = await routeError(base, on({ prefix: 'other' }))
  t.match((plugged as Error).message, `unknown option \`${where}prefix\``, 'plugin-only options are unknown on a route')
  const typo = await routeError(base, on({ capcity: 5 }))
  t.match((typo as Error).message, `did you mean \`${where}capacity\`?`)

  t.equal(await routeError({ refillPerSecond: 1, global: false }, (app) => { app.get('/x', x) }), undefined,
    'no capacity anywhere is fine while no limit applies')
  t.equal(await routeError({ refillPerSecond: 1 }, on(false)), undefined, 'or when the route opts out')
})

t.test('createLimiter validates its options and calls', async (t) => {
  const redis = await sharedRedis(t)
  const badOptions: Array<[string, unknown, Expected]> = [
    ['not an object', 'redis://x', { name: 'options', got: '"redis://x"' }],
    ['prefix', { prefix: 'a b' }, { name: 'prefix', got: '"a b"' }],
    ['timeout', { timeout: 0 }, { name: 'timeout', got: '0' }],
    ['breaker', { breaker: { failures: -1 } }, { name: 'breaker.failures', got: '-1' }],
    ['logger', { logger: { warn: () => {} } }, { name: 'logger', expect: 'warn, info and error' }],
    ['redis', { redis: {} }, { name: 'redis', got: '{}' }]
  ]
  for (const [label, options, want] of badOptions) {
    let err: unknown
    try {
      createLimiter(options as never)
    } catch (e) {
      err = e
    }
    isOptionError(t, err, want, `createLimiter: ${label}`)
  }
  t.throws(() => createLimiter({ prefx: 'x' } as never), { message: /unknown option `prefx`; did you mean `prefix`\?/ })

  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }
  const calls: Array<[string, () => Promise<unknown>, Expected]> = [
    ['policy not an object', async () => limiter.consume('k', 'b' as never), { name: 'policy', got: '"b"' }],
    ['empty policy array', async () => limiter.consume('k', []), { name: 'policy', expect: 'non-empty array' }],
    ['policy without bucket', async () => limiter.consume('k', { ...policy, bucket: undefined } as never), { name: 'policy.bucket', got: 'undefined' }],
    ['policy capacity a string', async () => limiter.consume('k', { ...policy, capacity: '5' } as never), { name: 'policy.capacity', got: '"5"' }],
    ['policy refill 0', async () => limiter.peek('k', { ...policy, refillPerSecond: 0 }), { name: 'policy.refillPerSecond', got: '0' }],
    ['policy without failureMode', async () => limiter.consume('k', { ...policy, failureMode: undefined } as never), { name: 'policy.failureMode', got: 'undefined' }],
    ['policy local without local', async () => limiter.consume('k', { ...policy, failureMode: 'local' }), { name: 'policy.local', got: 'undefined' }],
    ['policy cost > capacity', async () => limiter.consume('k', { ...policy, cost: 6 }), { name: 'policy.cost', got: '6', expect: 'at most capacity (5)' }],
    ['policy unknown field', async () => limiter.consume('k', { ...policy, max: 1 } as never), { name: 'policy.max' }],
    ['policy window over 2^52 µs', async () => limiter.consume('k', { ...policy, capacity: 1e10, refillPerSecond: 1e-6 }),
      { name: 'policy.refillPerSecond', got: '0.000001', expect: 'an empty bucket may take at most 2^52 µs' }],
    ['cost argument > capacity', async () => limiter.consume('k', policy, 6), { name: 'cost', got: '6', expect: 'at most capacity (5) of bucket "b"' }],
    ['cost argument 0', async () => limiter.consume('k', policy, 0), { name: 'cost', got: '0' }],
    ['cost argument NaN', async () => limiter.consume('k', policy, NaN), { name: 'cost', got: 'NaN' }],
    ['key a number', async () => limiter.consume(42 as never, policy), { name: 'clientKey', got: '42', expect: 'a string' }],
    ['key undefined', async () => limiter.peek(undefined as never, policy), { name: 'clientKey', got: 'undefined' }],
    ['reset: key a number', async () => limiter.reset(42 as never, 'b'), { name: 'clientKey', got: '42' }],
    ['reset: bucket empty', async () => limiter.reset('k', ''), { name: 'bucket', got: '""' }]
  ]
  for (const [label, call, want] of calls) {
    let err: unknown
    try {
      await call()
    } catch (e) {
      err = e
    }
    isOptionError(t, err, want, label)
  }
  t.same(await keysUnder(redis, 'k'), [], 'nothing was written')
  t.equal((await limiter.consume('k', policy)).remaining, 4, 'the limiter still works after rejecting bad calls')
})

t.test('bad calls reject instead of throwing synchronously', async (t) => {
  const redis = await sharedRedis(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }
  for (const [label, call] of [
    ['consume, bad key', () => limiter.consume(42 as never, policy)],
    ['consume, bad policy', () => limiter.consume('k', { ...policy, capacity: 0 })],
    ['peek, bad key', () => limiter.peek(42 as never, policy)]
  ] as const) {
    let result: unknown
    let thrown = false
    try {
      result = call()
    } catch {
      thrown = true
    }
    t.notOk(thrown, `${label}: does not throw synchronously`)
    t.ok(result instanceof Promise, `${label}: returns a promise`)
    await t.rejects(Promise.resolve(result), TypeError, `${label}: which rejects with a TypeError`)
  }
  const reset = limiter.reset(42 as never, 'b')
  t.ok(reset instanceof Promise)
  await t.rejects(reset, TypeError, 'reset, bad key: rejects too')
})

t.test('app.tollgate validates programmatic policies', async (t) => {
  const { app } = await buildApp(t, { plugin: { capacity: 5, refillPerSecond: 1, global: false } })
  let err: unknown
  try {
    await app.tollgate.consume('k', { bucket: 'b', capacity: 0 })
  } catch (e) {
    err = e
  }
  isOptionError(t, err, { name: 'policy.capacity', got: '0' }, 'capacity 0 over the plugin defaults')

  err = undefined
  try {
    await app.tollgate.consume('k', { bucket: 'b', cost: (() => 2) as never })
  } catch (e) {
    err = e
  }
  t.type(err, TypeError, 'a cost function (it has no request to read) is refused, not replaced by 1')
})

t.test('a failing key, cost or allow function: the generic 500, a log line naming the route, no store call', async (t) => {
  // A private server, so INFO commandstats counts this test's calls only.
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url)
  t.teardown(() => redis.disconnect())
  const logs = captureLogs()
  const boom = (): never => { throw new Error('boom') }
  const routes: Array<[string, Record<string, unknown>, RegExp]> = [
    ['/key-throws', { key: boom }, /`key` threw Error: boom \(at .*options\.test\.ts:\d+:\d+\)?\)/],
    ['/key-rejects', { key: async () => { throw new Error('later') } }, /`key` threw Error: later/],
    ['/key-number', { key: () => 42 }, /`key` must return a non-empty string, got 42/],
    ['/key-undefined', { key: () => undefined }, /`key` must return a non-empty string, got undefined/],
    ['/key-empty', { key: () => '' }, /`key` must return a non-empty string, got ""/],
    ['/cost-throws', { cost: boom }, /`cost` threw Error: boom/],
    ['/cost-string', { cost: () => '2' }, /`cost` must return .*, got "2"/],
    ['/cost-nan', { cost: () => NaN }, /got NaN/],
    ['/cost-zero', { cost: () => 0 }, /got 0$/],
    ['/cost-negative', { cost: () => -1 }, /got -1$/],
    ['/cost-infinity', { cost: () => Infinity }, /got Infinity$/],
    ['/cost-over', { cost: () => 6 }, /<= capacity \(5\), got 6$/],
    ['/allow-throws', { allow: boom }, /`allow` threw Error: boom/],
    ['/throws-non-error', { key: () => { throw 'a string' } }, /`key` threw "a string"/] // eslint-disable-line no-throw-literal
  ]
  const { app, keys } = await buildApp(t, {
    plugin: { redis, capacity: 5, refillPerSecond: 1 },
    fastify: { logger: { level: 'error', stream: logs.stream } },
    routes: (app) => {
      for (const [url, config] of routes) app.get(url, { config: { rateLimit: config } }, async () => 'handler ran')
      app.get('/ok', async () => 'ok')
    }
  })
  const evals = async (): Promise<number> => {
    const info = await redisCommand(server, ['INFO', 'commandstats'])
    let calls = 0
    for (const command of ['evalsha', 'eval']) {
      const stat = infoField(info, `cmdstat_${command}`)
      if (stat !== undefined) calls += Number(/calls=(\d+)/.exec(stat)?.[1])
    }
    return calls
  }
  // The start-up peek and probe (lib/store/redis-store.ts warm) and the key
  // secret's read (lib/core/key-secret.ts) are the script calls so far.
  const before = await evals()
  t.equal(before, 3, 'the start-up peek, probe and the key secret\'s read')
  for (const [url, , message] of routes) {
    const res = await app.inject(url)
    t.equal(res.statusCode, 500, url)
    t.same(res.json(), { statusCode: 500, code: 'TOLLGATE_BAD_INPUT', error: 'Internal Server Error', message: 'Rate limit check failed; the server log says why' }, `${url}: the generic 500`)
    const logged = logs.lines.filter((l) => l.level === 50 && String(l.msg).startsWith(`tollgate: rate limit of GET ${url}: `))
    t.equal(logged.length, 1, `${url}: logged once as an error naming the route`)
    t.match(logged[0], { code: 'TOLLGATE_BAD_INPUT', msg: message }, `${url}: the line says what went wrong`)
  }
  t.equal(await evals() - before, 0, 'no store call for any of them')
  t.same(await keys(), [], 'and no key written')
  t.equal((await app.inject('/ok')).statusCode, 200)
  t.equal(await evals() - before, 1, 'control: a good request is one store call')
})

t.test('a key of the wrong type under the prefix is a store failure for that request', async (t) => {
  const logs = captureLogs()
  const { app, inspect, prefix } = await buildApp(t, {
    plugin: { capacity: 5, refillPerSecond: 1, failureMode: 'open' },
    fastify: { logger: { level: 'warn', stream: logs.stream } },
    routes: (app) => {
      const echo = async (request: FastifyRequest) => request.rateLimit
      app.get('/open', echo)
      app.get('/closed', { config: { rateLimit: { failureMode: 'closed' } } }, echo)
      app.get('/local', { config: { rateLimit: { failureMode: 'local', local: { capacity: 1, refillPerSecond: 0.01 } } } }, echo)
      app.get('/fine', echo)
    }
  })
  const secret = await fleetSecret(inspect, prefix)
  const keyOf = (route: string): string => keyUnder(secret, prefix, '127.0.0.1', `GET ${route}`)
  for (const route of ['/open', '/closed', '/local']) await inspect.hset(keyOf(route), 'tokens', '5')

  const open = await app.inject('/open')
  t.equal(open.statusCode, 200, "'open' passes")
  t.match(open.json(), { source: 'fail-open' })
  t.notOk('ratelimit-remaining' in open.headers)

  const closed = await app.inject('/closed')
  t.equal(closed.statusCode, 503, "'closed' refuses")
  t.equal(closed.json().code, 'TOLLGATE_UNAVAILABLE')
  t.equal(closed.headers['retry-after'], '1')

  t.match((await app.inject('/local')).json(), { source: 'local', remaining: 0 }, "'local' decides in process")
  t.equal((await app.inject('/local')).statusCode, 429)

  const wrongType = logs.find('wrong type')
  t.equal(wrongType.length, 4, 'logged for every such request')
  t.same(wrongType[0]?.keys, [keyOf('/open')], 'with the key')
  t.same(wrongType[1]?.keys, [keyOf('/closed')])

  // Not an outage: after more such failures than the breaker allows,
  // other keys are still decided by Redis, and nothing logs a failing store.
  for (let i = 0; i < 6; i++) await app.inject('/open')
  t.match((await app.inject('/fine')).json(), { source: 'store', remaining: 4 })
  t.equal(app.tollgate.limiter.state, 'healthy')
  t.same(logs.find('store failing'), [])
  t.equal(await inspect.type(keyOf('/open')), 'hash', 'the foreign key is left alone')
})
