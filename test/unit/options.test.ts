// Option checks (README "Options"), without Redis: every parser of
// lib/core/options.ts with a bad value, the coded error naming the option,
// the value and what is expected; several problems reported at once;
// unknown names with "did you mean"; the plugin's options and a route's
// config through Fastify on the in-process store; createCore's options and
// calls on a fake clock.

import t from 'tap'
import type { FastifyInstance } from 'fastify'
import type { TollgateOptions } from '../../lib/index.js'
import { createCore } from '../../lib/core/limiter.js'
import {
  MAX_SUMMARY_MS, MAX_TIMEOUT, MAX_WAIT_MS, breaker, closest, deadlineMs, denialCache, hinted, ipv6Subnet, keySecret, isBoolean, isFunction,
  keyPrefix, lease, localPolicy, lockout, maxWaitMs, metricsOption, nonEmptyString, oneOf, outageSummaryMs, parseFields, planFunction,
  positiveInteger, positiveNumber, redisClient, warningOn, warnings
} from '../../lib/core/options.js'
import { describe, messageOf, optionError } from '../../lib/core/errors.js'
import { headerMode } from '../../lib/http/headers.js'
import type { Policy } from '../../lib/core/types.js'
import { FakeTime } from './helpers/fake-time.js'
import { isOptionError, registerError, rejected, routeError, thrown, type Expected } from './helpers/option-error.js'

const NUMBER = 'a finite number > 0'
const MODES = /one of ["']open["'], ["']closed["'], ["']local["']/
const ACCEPTED = 'an ioredis or iovalkey Redis or Cluster, a node-redis createClient() or createCluster() client, or a GLIDE GlideClient or GlideClusterClient'

t.test('the message: option, value and expectation, in one line, coded', async (t) => {
  const err = optionError('capacity', '10', NUMBER)
  t.type(err, TypeError)
  t.equal(err.message, 'tollgate: `capacity` must be a finite number > 0, got "10"')
  t.equal((err as { code?: string }).code, 'TOLLGATE_INVALID_OPTION')
  t.ok(Object.keys(err).includes('code'), 'the code is enumerable (logged with the error)')
  t.same([describe('x'), describe(() => 1), describe(5n), describe(null), describe(undefined), describe(NaN), describe([1]), describe({ a: 1 })],
    ['"x"', 'a function', '5n', 'null', 'undefined', 'NaN', 'an array', '{"a":1}'])
  const cyclic: Record<string, unknown> = {}
  cyclic.self = cyclic
  t.equal(describe(cyclic), 'an object', 'a value JSON cannot write')
  t.equal(messageOf(new Error('boom')), 'boom')
  t.equal(messageOf('plain'), '"plain"')
  t.equal(messageOf({ message: 7 }), '{"message":7}', 'a message that is no string is described')
})

t.test('each parser: accepted values come back as they are, others are named', async (t) => {
  type Parser = (value: unknown, name: string) => unknown
  const cases: Array<[string, Parser, unknown[], Array<[unknown, string | RegExp]>]> = [
    ['positiveNumber', positiveNumber, [1e-9, 1, 2.5, Number.MAX_VALUE], [[0, NUMBER], [-1, NUMBER], [NaN, NUMBER], [Infinity, NUMBER], ['1', NUMBER], [null, NUMBER], [1n, NUMBER]]],
    ['deadlineMs', deadlineMs, [0.5, 10, MAX_TIMEOUT], [[0, NUMBER], [MAX_TIMEOUT + 1, `at most ${MAX_TIMEOUT} (ms)`], [1e12, 'at most 60000 (ms)'], [Infinity, NUMBER]]],
    ['positiveInteger', positiveInteger, [1, 5, Number.MAX_SAFE_INTEGER], [[0, 'an integer > 0'], [2.5, 'an integer > 0'], [2 ** 53, 'an integer > 0'], ['3', 'an integer > 0']]],
    ['keyPrefix', keyPrefix, ['a', 'app-1.v2:rl_x', 'p'.repeat(64)], [['', '[A-Za-z0-9._:-]'], ['my app', '1 to 64'], ['a{b}', '1 to 64'], ['p'.repeat(65), '1 to 64'], [5, '1 to 64'], ['é', '1 to 64']]],
    ['ipv6Subnet', ipv6Subnet, [1, 56, 64, 128], [[0, 'an integer from 1 to 128'], [129, 'from 1 to 128'], [56.5, 'from 1 to 128'], ['56', 'from 1 to 128'], [NaN, 'from 1 to 128']]],
    ['isBoolean', isBoolean, [true, false], [[1, 'true or false'], ['yes', 'true or false'], [null, 'true or false']]],
    ['nonEmptyString', nonEmptyString, ['b', ' '], [['', 'a non-empty string'], [5, 'a non-empty string']]],
    ['isFunction', isFunction, [() => 1], [['ip', 'a function'], [{}, 'a function']]],
    ['maxWaitMs', maxWaitMs, [1, MAX_WAIT_MS], [[0, NUMBER], [MAX_WAIT_MS + 1, 'at most 3600000 (ms, an hour)']]],
    ['outageSummaryMs', outageSummaryMs, [1000, 30_000, MAX_SUMMARY_MS], [[999, 'from 1000 to 3600000'], [MAX_SUMMARY_MS + 1, 'from 1000 to 3600000'], [NaN, 'from 1000'], ['1000', 'from 1000']]],
    ['oneOf', oneOf(['open', 'closed', 'local'] as const), ['open', 'local'], [['Open', MODES], [undefined, MODES], [0, MODES]]]
  ]
  for (const [label, parse, good, bad] of cases) {
    for (const value of good) t.equal(parse(value, 'opt'), value, `${label}: ${describe(value).slice(0, 20)} accepted`)
    for (const [value, expect] of bad) {
      isOptionError(t, thrown(() => parse(value, 'opt')), { name: 'opt', got: describe(value), expect }, `${label}: ${describe(value).slice(0, 20)}`)
    }
  }
})

t.test('keySecret: a string of 16 characters or more, never shown in the error', async (t) => {
  for (const good of ['s'.repeat(16), 'a longer secret, of any characters: {}\n']) t.equal(keySecret(good, 'keySecret'), good)
  const expect = 'a string of at least 16 characters, the same on every server of the fleet'
  isOptionError(t, thrown(() => keySecret('fifteen chars!!', 'keySecret')), { name: 'keySecret', got: 'a string of 15 characters', expect }, 'too short')
  t.notMatch((thrown(() => keySecret('fifteen chars!!', 'keySecret')) as Error).message, 'fifteen', 'the secret itself is not in the message')
  isOptionError(t, thrown(() => keySecret(16, 'keySecret')), { name: 'keySecret', got: '16', expect }, 'a number')
  t.throws(() => createCore({ keySecret: 'short' }), { code: 'TOLLGATE_INVALID_OPTION', message: /`keySecret` must be a string of at least 16 characters/ }, 'checked by createLimiter')
})

t.test('nested objects: local, breaker, lease, lockout, denialCache, warnings, metrics', async (t) => {
  t.same(localPolicy({ capacity: 1, refillPerSecond: 0.5 }, 'local'), { capacity: 1, refillPerSecond: 0.5 })
  t.same(breaker({ failures: 3 }, 'breaker'), { failures: 3 }, 'breaker fields are optional')
  t.same(lease({ tokens: 2, maxAgeMs: 100 }, 'lease'), { tokens: 2, maxAgeMs: 100 })
  t.same(lockout({ after: 3, withinMs: 1000, forMs: 5000 }, 'lockout'), { after: 3, withinMs: 1000, forMs: 5000 })
  t.equal(denialCache(false, 'denialCache'), false)
  t.same(denialCache({ maxKeys: 5 }, 'denialCache'), { maxKeys: 5 })
  t.equal(warnings(false, 'warnings'), false)
  t.same(warnings({ proxy: false }, 'warnings'), { proxy: false })
  t.equal(warningOn(undefined, 'proxy'), true, 'every warning is on by default')
  t.equal(warningOn({ proxy: false }, 'proxy'), false)
  t.equal(warningOn({ proxy: false }, 'trustProxy'), true, 'turning one off leaves the other on')
  t.equal(warningOn(false, 'trustProxy'), false)
  const meter = { createCounter () {}, createUpDownCounter () {}, createHistogram () {} }
  t.equal(metricsOption({ meter }, 'metrics').meter, meter)

  type Parser = (value: unknown, name: string) => unknown
  const bad: Array<[string, Parser, unknown, Expected]> = [
    ['local not an object', localPolicy, 5, { name: 'local', got: '5', expect: 'an object { capacity, refillPerSecond }' }],
    ['local.capacity 0', localPolicy, { capacity: 0, refillPerSecond: 1 }, { name: 'local.capacity', got: '0', expect: NUMBER }],
    ['local.refillPerSecond missing', localPolicy, { capacity: 1 }, { name: 'local.refillPerSecond', got: 'undefined', expect: NUMBER }],
    ['local.refillPerSecond a string', localPolicy, { capacity: 1, refillPerSecond: 'fast' }, { name: 'local.refillPerSecond', got: '"fast"' }],
    ['breaker a string', breaker, 'x', { name: 'breaker', got: '"x"', expect: '{ failures, cooldownMs }' }],
    ['breaker.failures 0', breaker, { failures: 0 }, { name: 'breaker.failures', got: '0', expect: 'an integer > 0' }],
    ['breaker.failures 2.5', breaker, { failures: 2.5 }, { name: 'breaker.failures', got: '2.5' }],
    ['breaker.cooldownMs -1', breaker, { cooldownMs: -1 }, { name: 'breaker.cooldownMs', got: '-1', expect: NUMBER }],
    ['lease a number', lease, 10, { name: 'lease', got: '10', expect: '{ tokens, maxAgeMs }' }],
    ['lease.tokens missing', lease, { maxAgeMs: 100 }, { name: 'lease.tokens', got: 'undefined' }],
    ['lease.maxAgeMs 0', lease, { tokens: 2, maxAgeMs: 0 }, { name: 'lease.maxAgeMs', got: '0' }],
    ['lockout an array', lockout, [], { name: 'lockout', got: 'an array', expect: '{ after, withinMs, forMs }' }],
    ['lockout.after 1.5', lockout, { after: 1.5, withinMs: 1, forMs: 1 }, { name: 'lockout.after', got: '1.5', expect: 'an integer > 0' }],
    ['lockout.forMs over a year', lockout, { after: 1, withinMs: 1, forMs: 31_536_000_001 }, { name: 'lockout.forMs', got: '31536000001', expect: 'at most 31536000000 (ms, a year)' }],
    ['lockout.withinMs missing', lockout, { after: 1, forMs: 1 }, { name: 'lockout.withinMs', got: 'undefined', expect: 'an integer > 0 (ms)' }],
    ['denialCache true', denialCache, true, { name: 'denialCache', got: 'true', expect: 'false or an object { maxKeys, maxAgeMs }' }],
    ['denialCache.maxKeys 0', denialCache, { maxKeys: 0 }, { name: 'denialCache.maxKeys', got: '0', expect: 'an integer > 0' }],
    ['denialCache.maxAgeMs Infinity', denialCache, { maxAgeMs: Infinity }, { name: 'denialCache.maxAgeMs', got: 'Infinity', expect: NUMBER }],
    ['warnings true', warnings, true, { name: 'warnings', got: 'true', expect: 'false or an object { proxy, trustProxy }' }],
    ['warnings.proxy "no"', warnings, { proxy: 'no' }, { name: 'warnings.proxy', got: '"no"', expect: 'true or false' }],
    ['metrics without meter', metricsOption, {}, { name: 'metrics.meter', got: 'undefined', expect: 'an OpenTelemetry Meter' }],
    ['metrics.meter half a meter', metricsOption, { meter: { createCounter () {} } }, { name: 'metrics.meter', expect: 'with createCounter, createUpDownCounter, createHistogram' }],
    ['metrics a string', metricsOption, 'otel', { name: 'metrics', got: '"otel"', expect: 'an object { meter }' }]
  ]
  for (const [label, parse, value, want] of bad) isOptionError(t, thrown(() => parse(value, want.name.split('.')[0] as string)), want, label)
})

t.test('redis: anything but a client of an accepted family is named as what it is', async (t) => {
  const cases: Array<[unknown, string]> = [
    ['redis://127.0.0.1:6379', '"redis://127.0.0.1:6379"'],
    [{ host: '127.0.0.1' }, '{"host":"127.0.0.1"}'],
    [new URL('redis://127.0.0.1:6379'), 'an instance of URL'],
    [null, 'null'],
    [{}, '{}']
  ]
  for (const [value, got] of cases) isOptionError(t, thrown(() => redisClient(value, 'redis')), { name: 'redis', got, expect: ACCEPTED }, `redis ${got}`)
})

t.test('several problems are reported at once; one alone is thrown as it is', async (t) => {
  const parsers = { capacity: positiveNumber, refillPerSecond: positiveNumber, failureMode: oneOf(['open', 'closed'] as const) }
  t.same(parseFields({ capacity: 2, refillPerSecond: undefined }, parsers, ''), { capacity: 2 }, 'an undefined field is left out')
  const one = thrown(() => parseFields({ capacity: 0 }, parsers, 'route: '))
  isOptionError(t, one, { name: 'route: capacity', got: '0' }, 'one problem')
  t.equal(Reflect.get(one as object, 'errors'), undefined, 'one problem has no list')
  const many = thrown(() => parseFields({ capacity: 0, refillPerSecond: 'x', failureMode: 'maybe', capcity: 1 }, parsers, '', { failureMode: 'set' }))
  t.type(many, TypeError)
  t.equal((many as { code?: string }).code, 'TOLLGATE_INVALID_OPTION')
  const message = (many as Error).message
  t.match(message, /^tollgate: 4 invalid options:\n {2}- `capacity` must be a finite number > 0, got 0\n/, 'counted, one line each, without the repeated prefix')
  t.match(message, '- `refillPerSecond` must be a finite number > 0, got "x"')
  t.match(message, '- `failureMode` must be one of "open", "closed", got "maybe"')
  t.match(message, '- unknown option `capcity`; did you mean `capacity`?')
  const errors = Reflect.get(many as object, 'errors') as TypeError[]
  t.equal(errors.length, 4, 'each problem kept under `errors`')
  t.notOk(Object.keys(many as object).includes('errors'), 'not enumerable')
  const missing = thrown(() => parseFields({}, parsers, 'x.', { capacity: 'set on the route' }))
  isOptionError(t, missing, { name: 'x.capacity', got: 'undefined', expect: 'set on the route' }, 'a required field')
  const other = new Error('not an option error')
  t.throws(() => parseFields({ capacity: 1 }, { capacity: () => { throw other } }, ''), other, 'any other error is rethrown as it is')
})

t.test('unknown names: the closest known name when it is a likely typo; another library\'s name gets its replacement', async (t) => {
  const known = ['capacity', 'refillPerSecond', 'failureMode', 'ipv6Subnet', 'breaker', 'timeout']
  t.equal(closest('capacty', known), 'capacity')
  t.equal(closest('refilPerSecond', known), 'refillPerSecond')
  t.equal(closest('failuremode', known), 'failureMode', 'case does not count')
  t.equal(closest('ipv6subnet', known), 'ipv6Subnet')
  t.equal(closest('timeWindow', known), undefined, 'nothing close')
  t.equal(closest('xy', known), undefined)
  t.equal(closest('breakr', known), 'breaker')
  t.equal(closest('timeoutMsX', known), 'timeout', 'three edits for a name of 10 characters: still a typo')
  t.equal(closest('timeoutMsXY', known), undefined, 'four edits for a name of 11 characters: too far')
  t.equal(closest('timeouts', known), 'timeout')
  t.equal(closest('x', []), undefined)

  const parsers = { capacity: positiveNumber, refillPerSecond: positiveNumber }
  t.throws(() => parseFields({ capcity: 1 }, parsers, 'config.rateLimit of GET /x: '), {
    code: 'TOLLGATE_INVALID_OPTION', message: 'tollgate: unknown option `config.rateLimit of GET /x: capcity`; did you mean `config.rateLimit of GET /x: capacity`?'
  })
  t.throws(() => parseFields({ zzz: 1 }, parsers, ''), { message: 'tollgate: unknown option `zzz`' }, 'no hint when nothing is close')
  const fastify = thrown(() => parseFields({ max: 100 }, parsers, '', {}, 'fastify')) as Error
  t.match(fastify.message, /^tollgate: unknown option `max`: that is an option of @fastify\/rate-limit; use `capacity`/, 'on Fastify, `max` is @fastify/rate-limit\'s')
  t.notMatch(fastify.message, 'did you mean', 'the replacement, not a typo hint')
  const express = thrown(() => parseFields({ windowMs: 60_000 }, parsers, '', {}, 'express')) as Error
  t.match(express.message, 'that is an option of express-rate-limit')
  const core = thrown(() => parseFields({ points: 5 }, parsers, '', {}, 'core')) as Error
  t.match(core.message, 'that is an option of rate-limiter-flexible')
  t.match(core.message, 'Migrating from rate-limiter-flexible')
})

t.test('limit and headers: express-rate-limit\'s values are told their meaning', async (t) => {
  const limit = thrown(() => planFunction(100, 'limit')) as Error
  isOptionError(t, limit, { name: 'limit', got: '100', expect: 'a function (request) => { capacity, refillPerSecond } or false' }, 'limit: 100')
  t.match(limit.message, "a number is express-rate-limit's `limit` (requests per windowMs)")
  isOptionError(t, thrown(() => planFunction('pro', 'limit')), { name: 'limit', got: '"pro"' }, 'limit: a string, no hint')
  t.notMatch((thrown(() => planFunction('pro', 'limit')) as Error).message, 'express-rate-limit')
  const f = (): false => false
  t.equal(planFunction(f, 'limit'), f)

  for (const mode of ['draft-6', 'draft-10', 'legacy', false] as const) t.equal(headerMode(mode, 'headers'), mode)
  const draft7 = thrown(() => headerMode('draft-7', 'headers')) as Error
  isOptionError(t, draft7, { name: 'headers', got: '"draft-7"', expect: /one of "draft-6", "draft-10", "draft-11", "legacy", false/ }, 'draft-7')
  t.match(draft7.message, "'draft-7' is express-rate-limit's standardHeaders")
  t.match((thrown(() => headerMode('draft-8', 'headers')) as Error).message, "use 'draft-10'")
  t.match((thrown(() => headerMode(true, 'headers')) as Error).message, "use 'legacy' for the X-RateLimit-* headers")
  t.notMatch((thrown(() => headerMode('DRAFT-6', 'headers')) as Error).message, 'express-rate-limit', 'no hint for a value no library uses')
  t.equal(hinted('x', 1, 'y', undefined).message, 'tollgate: `x` must be y, got 1')
  t.equal(hinted('x', 1, 'y', 'z').message, 'tollgate: `x` must be y, got 1: z')
})



const base = { capacity: 10, refillPerSecond: 1, failureMode: 'open' } as const

t.test('the plugin (in-process store): valid options register, each bad one fails registration', async (t) => {
  t.equal(await registerError(base), undefined, 'the baseline is valid on its own')
  t.equal(await registerError({
    ...base,
    cost: 2,
    failureMode: 'local',
    local: { capacity: 5, refillPerSecond: 0.5 },
    key: () => 'k',
    bucket: 'b',
    timeout: 50,
    headers: false,
    global: false,
    hook: 'preHandler',
    allow: () => false,
    prefix: 'app-1.v2:rl_x',
    ipv6Subnet: 128,
    breaker: { failures: 1, cooldownMs: 0.5 }
  }), undefined, 'every option at once')
  const cases: Array<[string, unknown, Expected]> = [
    ['options not an object', 'x', { name: 'options', got: '"x"', expect: 'an object' }],
    ['options an array', [], { name: 'options', got: 'an array' }],
    ['capacity as a string', { ...base, capacity: '10' }, { name: 'capacity', got: '"10"', expect: NUMBER }],
    ['capacity NaN', { ...base, capacity: NaN }, { name: 'capacity', got: 'NaN' }],
    ['refillPerSecond -Infinity', { ...base, refillPerSecond: -Infinity }, { name: 'refillPerSecond', got: '-Infinity' }],
    ['cost > capacity', { ...base, cost: 11 }, { name: 'cost', got: '11', expect: 'at most capacity (10)' }],
    ['failureMode missing', { capacity: 10, refillPerSecond: 1 }, { name: 'failureMode', got: 'undefined', expect: MODES }],
    ['failureMode unknown', { ...base, failureMode: 'maybe' }, { name: 'failureMode', got: '"maybe"', expect: MODES }],
    ["'local' without local", { ...base, failureMode: 'local' }, { name: 'local', got: 'undefined', expect: '{ capacity, refillPerSecond }' }],
    ['local.capacity missing', { ...base, failureMode: 'local', local: { refillPerSecond: 1 } }, { name: 'local.capacity', got: 'undefined' }],
    ['breaker.failures not an integer', { ...base, breaker: { failures: 2.5 } }, { name: 'breaker.failures', got: '2.5' }],
    ['prefix with braces', { ...base, prefix: 'a{b}' }, { name: 'prefix', got: '"a{b}"' }],
    ['ipv6Subnet 129', { ...base, ipv6Subnet: 129 }, { name: 'ipv6Subnet', got: '129', expect: 'an integer from 1 to 128' }],
    ['headers unknown', { ...base, headers: 'draft-7' }, { name: 'headers', got: '"draft-7"', expect: /one of ["']draft-6["'], ["']draft-10["'], ["']draft-11["'], ["']legacy["'], false/ }],
    ['hook unknown', { ...base, hook: 'preValidation' }, { name: 'hook', got: '"preValidation"', expect: /one of ["']onRequest["'], ["']preHandler["']/ }],
    ['redis a URL', { ...base, redis: 'redis://127.0.0.1:6379' }, { name: 'redis', got: '"redis://127.0.0.1:6379"', expect: ACCEPTED }],
    ['global a number', { ...base, global: 1 }, { name: 'global', got: '1', expect: 'true or false' }],
    ['key not a function', { ...base, key: 'ip' }, { name: 'key', got: '"ip"', expect: 'a function' }],
    ['timeout over a minute', { ...base, timeout: 60_001 }, { name: 'timeout', got: '60001', expect: 'at most 60000' }],
    ['bucket empty', { ...base, bucket: '' }, { name: 'bucket', got: '""', expect: 'a non-empty string' }],
    ['lease.maxAgeMs 0', { ...base, lease: { tokens: 2, maxAgeMs: 0 } }, { name: 'lease.maxAgeMs', got: '0' }],
    ['lease.tokens > capacity', { ...base, lease: { tokens: 20, maxAgeMs: 100 } }, { name: 'lease.tokens', got: '20', expect: 'at most capacity (10)' }],
    ['denialCache true', { ...base, denialCache: true }, { name: 'denialCache', got: 'true' }],
    ['limit a number', { ...base, limit: 100 }, { name: 'limit', got: '100', expect: "express-rate-limit's `limit`" }]
  ]
  for (const [label, options, want] of cases) isOptionError(t, await registerError(options), want, label)

  const typos: Array<[Record<string, unknown>, string, string | undefined]> = [
    [{ ...base, capacty: 5 }, 'capacty', 'capacity'],
    [{ ...base, ipv6subnet: 64 }, 'ipv6subnet', 'ipv6Subnet'],
    [{ ...base, failureMode: 'local', local: { capcity: 1, refillPerSecond: 1 } }, 'local.capcity', 'local.capacity'],
    [{ ...base, breaker: { cooldown: 100 } }, 'breaker.cooldown', 'breaker.cooldownMs'],
    [{ ...base, timeWindow: 1000 }, 'timeWindow', undefined]
  ]
  for (const [options, name, hint] of typos) {
    const err = await registerError(options) as Error
    t.match(err.message, `unknown option \`${name}\``, name)
    if (hint === undefined) t.notMatch(err.message, 'did you mean', `${name}: no typo hint`)
    else t.match(err.message, `did you mean \`${hint}\`?`, `${name}: suggests ${hint}`)
  }
})

t.test('a route\'s config (in-process store): each bad one fails start-up, named with its route', async (t) => {
  const x = async (): Promise<string> => 'x'
  const on = (rateLimit: unknown) => (app: FastifyInstance) => { app.get('/x', { config: { rateLimit: rateLimit as false } }, x) }
  const where = 'config.rateLimit of GET /x: '
  const cases: Array<[string, Partial<TollgateOptions>, (app: FastifyInstance) => void, Expected]> = [
    ['not an object', base, on('fast'), { name: where.trimEnd(), got: '"fast"', expect: 'a policy object' }],
    ['an empty array', base, on([]), { name: `${where}rateLimit`, got: 'an array', expect: 'non-empty array' }],
    ['a bad array member', base, on([{ bucket: 'a' }, 7]), { name: `${where}[1]`, got: '7' }],
    ['cost over the route capacity', base, on({ capacity: 3, cost: 4 }), { name: `${where}cost`, got: '4', expect: 'at most capacity (3)' }],
    ['plugin cost over the route capacity', { ...base, cost: 5 }, on({ capacity: 3 }), { name: `${where}cost`, got: '5', expect: 'at most capacity (3)' }],
    ['bad local', base, on({ failureMode: 'local', local: { capacity: -1, refillPerSecond: 1 } }), { name: `${where}local.capacity`, got: '-1' }],
    ['duplicate bucket names', base, on([{ bucket: 'a' }, { capacity: 2, bucket: 'a' }]), { name: `${where}[1].bucket`, got: '"a"', expect: 'a name used once per route' }],
    ['route-wide option differing', base, on([{ bucket: 'a', headers: 'legacy' }, { bucket: 'b', headers: 'draft-6' }]), { name: `${where}headers`, expect: 'the same in every policy' }],
    ['missing capacity (none on the plugin)', { refillPerSecond: 1 }, on({ refillPerSecond: 2 }), { name: `${where}capacity`, got: 'undefined', expect: 'set it on the plugin or the route' }],
    ['lease in an array of policies', base, on([{ bucket: 'a' }, { bucket: 'b', lease: { tokens: 2, maxAgeMs: 100 } }]), { name: `${where}[1].lease`, expect: 'unset in an array of policies' }],
    ['lockout in an array of policies', base, on([{ bucket: 'a', lockout: { after: 1, withinMs: 1, forMs: 1 } }, { bucket: 'b' }]), { name: `${where}rateLimit[0].lockout`, expect: 'unset in an array of policies' }],
    ['no config, global, no capacity anywhere', { refillPerSecond: 1 }, (app) => { app.get('/x', x) }, { name: `${where}capacity`, got: 'undefined' }],
    ['a window over 2^52 µs', base, on({ capacity: 1e15, refillPerSecond: 0.001 }),
      { name: `${where}refillPerSecond`, got: '0.001', expect: /at least capacity \/ 4503599627\.370496 \(222044\.6049250313\): .* at most 2\^52 µs/ }],
    ['a capacity whose microseconds overflow', base, on({ capacity: 1e303, refillPerSecond: 1e303 }),
      { name: `${where}capacity`, got: '1e+303', expect: 'at most 1.7976931348623154e+302 (capacity × 1e6 µs must be a finite number)' }],
    ['a refill whose token interval overflows', base, on({ capacity: 1e-310, refillPerSecond: 1e-305 }),
      { name: `${where}refillPerSecond`, got: '1e-305', expect: 'at least 5.562684646268004e-303' }]
  ]
  for (const [label, plugin, declare, want] of cases) isOptionError(t, await routeError(plugin, declare), want, label)
  t.match((await routeError(base, on({ prefix: 'other' })) as Error).message, `unknown option \`${where}prefix\``, 'plugin-only options are unknown on a route')
  t.equal(await routeError({ refillPerSecond: 1, global: false }, (app) => { app.get('/x', x) }), undefined, 'no capacity anywhere is fine while no limit applies')
  t.equal(await routeError({ refillPerSecond: 1 }, on(false)), undefined, 'or when the route opts out')
})

t.test('createCore checks its options, and every call, before anything is spent', async (t) => {
  const badOptions: Array<[string, unknown, Expected]> = [
    ['not an object', 'redis://x', { name: 'options', got: '"redis://x"', expect: 'an object' }],
    ['null', null, { name: 'options', got: 'null' }],
    ['prefix', { prefix: 'a b' }, { name: 'prefix', got: '"a b"' }],
    ['timeout', { timeout: 0 }, { name: 'timeout', got: '0' }],
    ['breaker', { breaker: { failures: -1 } }, { name: 'breaker.failures', got: '-1' }],
    ['logger', { logger: { warn: () => {} } }, { name: 'logger', expect: 'a logger with warn, info and error methods' }],
    ['redis', { redis: {} }, { name: 'redis', got: '{}' }],
    ['maxWaiters', { maxWaiters: 0.5 }, { name: 'maxWaiters', got: '0.5', expect: 'an integer > 0' }],
    ['outageSummaryMs', { outageSummaryMs: 10 }, { name: 'outageSummaryMs', got: '10' }]
  ]
  for (const [label, options, want] of badOptions) isOptionError(t, thrown(() => createCore(options as never, { time: new FakeTime() })), want, `createCore: ${label}`)
  t.throws(() => createCore({ prefx: 'x' } as never, { time: new FakeTime() }), { message: /unknown option `prefx`; did you mean `prefix`\?/ })
  t.throws(() => createCore({ windowMs: 1000 } as never, { time: new FakeTime() }), { message: /that is an option of rate-limiter-flexible|express-rate-limit/ })

  const { limiter } = createCore({}, { time: new FakeTime() })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }
  const calls: Array<[string, () => Promise<unknown>, Expected]> = [
    ['policy not an object', async () => limiter.consume('k', 'b' as never), { name: 'policy', got: '"b"', expect: 'a policy object' }],
    ['empty policy array', async () => limiter.consume('k', []), { name: 'policy', expect: 'non-empty array' }],
    ['policy without bucket', async () => limiter.consume('k', { ...policy, bucket: undefined } as never), { name: 'policy.bucket', got: 'undefined' }],
    ['policy capacity a string', async () => limiter.consume('k', { ...policy, capacity: '5' } as never), { name: 'policy.capacity', got: '"5"' }],
    ['policy refill 0', async () => limiter.peek('k', { ...policy, refillPerSecond: 0 }), { name: 'policy.refillPerSecond', got: '0' }],
    ['policy without failureMode', async () => limiter.consume('k', { ...policy, failureMode: undefined } as never), { name: 'policy.failureMode', got: 'undefined', expect: MODES }],
    ['policy local without local', async () => limiter.consume('k', { ...policy, failureMode: 'local' }), { name: 'policy.local', got: 'undefined' }],
    ['policy cost > capacity', async () => limiter.consume('k', { ...policy, cost: 6 }), { name: 'policy.cost', got: '6', expect: 'at most capacity (5)' }],
    ['policy unknown field', async () => limiter.consume('k', { ...policy, max: 1 } as never), { name: 'policy.max' }],
    ['policy window over 2^52 µs', async () => limiter.consume('k', { ...policy, capacity: 1e10, refillPerSecond: 1e-6 }),
      { name: 'policy.refillPerSecond', got: '0.000001', expect: 'an empty bucket may take at most 2^52 µs' }],
    ['two policies, one with maxWaitMs', async () => limiter.consume('k', [policy, { ...policy, bucket: 'c', maxWaitMs: 10 }]), { name: 'policy[1].maxWaitMs', got: '10', expect: 'unset in an array of policies' }],
    ['two policies, one with a lease', async () => limiter.consume('k', [{ ...policy, lease: { tokens: 1, maxAgeMs: 10 } }, { ...policy, bucket: 'c' }]),
      { name: 'policy[0].lease', got: '{"tokens":1,"maxAgeMs":10}', expect: 'unset in an array of policies (leases serve single-policy routes)' }],
    ['cost argument > capacity', async () => limiter.consume('k', policy, 6), { name: 'cost', got: '6', expect: 'at most capacity (5) of bucket "b"' }],
    ['cost argument 0', async () => limiter.consume('k', policy, 0), { name: 'cost', got: '0' }],
    ['cost argument NaN', async () => limiter.consume('k', policy, NaN), { name: 'cost', got: 'NaN' }],
    ['key a number', async () => limiter.consume(42 as never, policy), { name: 'clientKey', got: '42', expect: 'a string' }],
    ['key undefined', async () => limiter.peek(undefined as never, policy), { name: 'clientKey', got: 'undefined' }],
    ['reset: key a number', async () => limiter.reset(42 as never, 'b'), { name: 'clientKey', got: '42' }],
    ['reset: bucket empty', async () => limiter.reset('k', ''), { name: 'bucket', got: '""' }],
    ['reserve: a lease', async () => limiter.reserve('k', { ...policy, lease: { tokens: 1, maxAgeMs: 10 } }), { name: 'policy.lease', expect: 'unset to reserve' }],
    ['reserve: a lockout', async () => limiter.reserve('k', { ...policy, lockout: { after: 1, withinMs: 1, forMs: 1 } }), { name: 'policy.lockout', expect: 'unset to reserve and settle' }]
  ]
  for (const [label, call, want] of calls) isOptionError(t, await rejected(call()), want, label)
  t.match(await limiter.peek('k', policy), { remaining: 5, allowed: true }, 'nothing was spent by the refused calls')
  t.equal((await limiter.consume('k', policy)).remaining, 4, 'and the limiter still works')
})

t.test('bad calls reject instead of throwing synchronously', async (t) => {
  const { limiter } = createCore({}, { time: new FakeTime() })
  t.teardown(() => limiter.close())
  const policy: Policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }
  for (const [label, call] of [
    ['consume, bad key', () => limiter.consume(42 as never, policy)],
    ['consume, bad policy', () => limiter.consume('k', { ...policy, capacity: 0 })],
    ['peek, bad key', () => limiter.peek(42 as never, policy)],
    ['reset, bad key', () => limiter.reset(42 as never, 'b')]
  ] as const) {
    let result: unknown
    t.doesNotThrow(() => { result = call() }, `${label}: does not throw synchronously`)
    t.ok(result instanceof Promise, `${label}: returns a promise`)
    await t.rejects(Promise.resolve(result), TypeError, `${label}: which rejects with a TypeError`)
  }
})
