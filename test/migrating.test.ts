// Users of express-rate-limit, @fastify/rate-limit and rate-limiter-flexible
// write their names first. Every name tollgate answers with a hint is tried
// in every place an option can be given (the plugin, a route, a
// programmatic policy; rateLimit(), limit(), limit.consume; createLimiter()
// and a core policy): the error is a coded TypeError that names the library
// as that adapter's users would mean it (`max` is express-rate-limit's on
// Express, @fastify/rate-limit's on Fastify) and the replacement, and no
// hint names an option that does not exist there: an option valid only
// elsewhere is said to be set elsewhere, in the right words. The migration
// tables (docs/guides/migrating.md) list every hinted name, and the README
// links to each, under the name the error points to. Users of
// @nestjs/throttler get its names answered in TollgateModule's options. Pure
// option checks: no store.

import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import express from 'express'
import Fastify from 'fastify'
import { Hono } from 'hono'
import t from 'tap'
import tollgate, { createLimiter, type TollgateOptions } from '../lib/index.js'
import { rateLimit, type ExpressOptions } from '../lib/express.js'
import { rateLimit as honoRateLimit, type HonoOptions } from '../lib/hono.js'
import { TollgateService, type NestOptions } from '../lib/nest.js'
import { listen, memoryLogger } from './helpers/express.js'
import { listenHono } from './helpers/hono.js'
import { ROOT } from './helpers/readme.js'

type Adapter = 'fastify' | 'express' | 'core'
type Library = 'express-rate-limit' | '@fastify/rate-limit' | 'rate-limiter-flexible'

const base = { capacity: 5, refillPerSecond: 1, failureMode: 'open' } as const

/**
 * Every option of tollgate, by where it may be given (docs/reference/options.md;
 * docs/guides/express.md, "How it maps onto the plugin"; docs/reference/api.md,
 * "The core, without Fastify").
 */
const POLICY = ['capacity', 'refillPerSecond', 'cost', 'failureMode', 'local', 'bucket', 'timeout', 'lease', 'shadow', 'lockout', 'maxWaitMs']
const ROUTE = [...POLICY, 'key', 'headers', 'allow', 'limit', 'settle']
const INSTANCE = ['redis', 'prefix', 'ipv6Subnet', 'breaker', 'denialCache', 'metrics', 'maxWaiters', 'warnings']

interface Place {
  label: string
  adapter: Adapter
  /** The options valid here. */
  valid: readonly string[]
  /** The error of giving `name: value` here; undefined when it is accepted. */
  error: (name: string, value: unknown) => Promise<unknown>
}

async function caught (fn: () => unknown): Promise<unknown> {
  try {
    await fn()
    return undefined
  } catch (err) {
    return err
  }
}

const PLACES: Place[] = [
  {
    label: 'the plugin',
    adapter: 'fastify',
    valid: [...ROUTE, ...INSTANCE, 'hook', 'global', 'notFound'],
    error: async (name, value) => await caught(async () => {
      const app = Fastify()
      try {
        await app.register(tollgate, { ...base, [name]: value } as TollgateOptions)
        await app.ready()
      } finally {
        await app.close().catch(() => {})
      }
    })
  },
  {
    label: 'a Fastify route',
    adapter: 'fastify',
    valid: [...ROUTE, 'hook'],
    error: async (name, value) => await caught(async () => {
      const app = Fastify()
      try {
        await app.register(tollgate, base)
        app.get('/x', { config: { rateLimit: { [name]: value } as never } }, async () => 'x')
        await app.ready()
      } finally {
        await app.close().catch(() => {})
      }
    })
  },
  {
    label: 'app.tollgate.consume',
    adapter: 'fastify',
    valid: POLICY,
    error: async (name, value) => await caught(async () => {
      const app = Fastify()
      try {
        await app.register(tollgate, base)
        await app.tollgate.consume('alice', { bucket: 'b', [name]: value } as never)
      } finally {
        await app.close().catch(() => {})
      }
    })
  },
  {
    label: 'rateLimit()',
    adapter: 'express',
    valid: [...ROUTE, ...INSTANCE, 'handler', 'logger'],
    error: async (name, value) => await caught(async () => {
      const limit = rateLimit({ ...base, logger: memoryLogger(), [name]: value } as ExpressOptions)
      await limit.close()
    })
  },
  {
    label: 'limit()',
    adapter: 'express',
    valid: [...ROUTE, 'handler'],
    error: async (name, value) => await caught(async () => {
      const limit = rateLimit({ ...base, logger: memoryLogger() })
      try {
        limit({ [name]: value } as never)
      } finally {
        await limit.close()
      }
    })
  },
  {
    label: 'limit.consume',
    adapter: 'express',
    valid: POLICY,
    error: async (name, value) => await caught(async () => {
      const limit = rateLimit({ ...base, logger: memoryLogger() })
      try {
        await limit.consume('alice', { bucket: 'b', [name]: value } as never)
      } finally {
        await limit.close()
      }
    })
  },
  {
    label: 'createLimiter()',
    adapter: 'core',
    valid: ['redis', 'prefix', 'timeout', 'breaker', 'denialCache', 'metrics', 'maxWaiters', 'logger'],
    error: async (name, value) => await caught(async () => { await createLimiter({ [name]: value } as never).close() })
  },
  {
    label: 'a core policy',
    adapter: 'core',
    valid: POLICY,
    error: async (name, value) => await caught(async () => {
      const limiter = createLimiter()
      try {
        await limiter.consume('alice', { bucket: 'b', ...base, [name]: value } as never)
      } finally {
        await limiter.close()
      }
    })
  }
]

/** How an option valid only elsewhere is said to be set, per adapter: of the instance, or of a route or policy. */
const ELSEWHERE: Record<Adapter, { instance: string, policy: string }> = {
  fastify: { instance: "on the plugin's options", policy: "in a route's config.rateLimit or the plugin's options" },
  express: { instance: "in rateLimit()'s options", policy: 'in rateLimit() or limit()' },
  core: { instance: "in createLimiter()'s options", policy: 'in the policy given to consume() and peek()' }
}
const INSTANCE_OF: Record<Adapter, readonly string[]> = {
  fastify: [...INSTANCE, 'global', 'notFound'],
  express: [...INSTANCE, 'logger'],
  core: ['redis', 'prefix', 'breaker', 'denialCache', 'metrics', 'maxWaiters', 'logger']
}

/** What one foreign name must be answered with, per adapter (`all` unless given). */
interface Hint {
  value?: unknown
  /** The library named, per adapter. */
  from: Library | Partial<Record<Adapter, Library>>
  /** What the message must say: the replacement. */
  all?: RegExp
  fastify?: RegExp
  express?: RegExp
  core?: RegExp
  /** Places where the name is a valid tollgate option (no error, or an error about its value only). */
  validAt?: readonly string[]
}

const ANSWER = { fastify: /Fastify's setErrorHandler \(a denial is an error with code TOLLGATE_RATE_LIMITED/, express: /use `handler`, e\.g\. \(req, res\) => res\.status\(429\)/, core: /consume\(\) returns a Decision \(allowed: false when denied\)/ }
const NO_HEADERS = /the core sends no headers/
const REDIS = /use `redis`/
const ALLOW = { all: /use `allow`, a function \(request\) => boolean: true skips the limiter/, core: /call consume\(\) only for the requests to limit/ }
const DENIAL_CACHE = /the denial cache \(`denialCache`, on by default\) denies a denied client in process/
const EVENLY = /use `refillPerSecond` \(points \/ duration\) with a small `capacity`.*`maxWaitMs` makes a request wait/
const ERL = 'express-rate-limit'
const FRL = '@fastify/rate-limit'
const RLF = 'rate-limiter-flexible'
/** Names both express-rate-limit and @fastify/rate-limit have: each adapter reads them as its own users' library. */
const SHARED = { fastify: FRL, express: ERL, core: ERL } as const

const HINTS: Record<string, Hint> = {
  // express-rate-limit
  windowMs: { value: 90_000, from: ERL, all: /`refillPerSecond` \(limit \/ seconds of windowMs\): limit: 100, windowMs: 90000 is capacity: 100, refillPerSecond: 100 \/ 90 \(1\.111 a second\)/ },
  max: { value: 100, from: SHARED, fastify: /`refillPerSecond` \(max \/ seconds of timeWindow\)/, express: /`refillPerSecond` \(max \/ seconds of windowMs\)/, core: /`refillPerSecond` \(max \/ seconds of windowMs\)/ },
  standardHeaders: { value: 'draft-8', from: ERL, all: /use `headers`: 'draft-10': the same RateLimit and RateLimit-Policy lists/, core: NO_HEADERS },
  legacyHeaders: { value: true, from: ERL, all: /use `headers`: 'legacy' \(one mode at a time.*X-RateLimit-Reset counts seconds from now/, core: NO_HEADERS },
  draft_polli_ratelimit_headers: { value: true, from: ERL, all: /use `headers`: 'draft-6'/, core: NO_HEADERS },
  skip: { value: () => false, from: ERL, ...ALLOW },
  message: { value: 'Too many', from: ERL, ...ANSWER },
  statusCode: { value: 429, from: ERL, ...ANSWER },
  onLimitReached: { value: () => {}, from: ERL, ...ANSWER },
  handler: { value: () => {}, from: ERL, ...ANSWER, validAt: ['rateLimit()', 'limit()'] },
  passOnStoreError: { value: true, from: ERL, all: /use `failureMode`: 'open'; 'closed' answers 503 with Retry-After, 'local' falls back/ },
  skipSuccessfulRequests: { value: true, from: ERL, fastify: /use `settle`: \(request, reply\) => reply\.statusCode < 400 \? 0 : 1 \(charging by outcome/, express: /use `settle`: \(req, res\) => res\.statusCode < 400 \? 0 : 1/, core: /use reserve\(\) and settle\(\): settle with 0 when the successful request/ },
  skipFailedRequests: { value: true, from: ERL, fastify: /use `settle`: \(request, reply\) => reply\.statusCode >= 400 \? 0 : 1/, express: /use `settle`: \(req, res\) => res\.statusCode >= 400 \? 0 : 1/, core: /settle with 0 when the failed request/ },
  requestWasSuccessful: { value: () => true, from: ERL, fastify: /use `settle`: \(request, reply\)/, express: /use `settle`: \(req, res\)/, core: /use reserve\(\) and settle\(\)/ },
  keyGenerator: { value: () => 'k', from: SHARED, all: /use `key`, a function \(request\) => string/, core: /use the client key, the first argument of consume\(\) and peek\(\)/ },
  requestPropertyName: { value: 'limits', from: ERL, fastify: /the decision is always on request\.rateLimit/, express: /the decision is always on req\.rateLimit/, core: /consume\(\) returns the Decision/ },
  store: { value: {}, from: SHARED, all: REDIS },
  validate: { value: false, from: ERL, all: /every option is checked at start-up; `warnings` turns off the warnings at run time/, core: /every option is checked when the limiter is created/ },
  identifier: { value: 'api', from: ERL, all: /use `bucket`: it names the policy in the 'draft-10' headers/, core: /use `bucket`, the name of the policy/ },
  retryAfter: { value: 60, from: ERL, all: /Retry-After is the wait until the cost is affordable/ },
  logger: { value: console, from: ERL, fastify: /tollgate logs through Fastify's logger/, express: /use `logger`/, core: /use `logger`/, validAt: ['rateLimit()', 'createLimiter()'] },
  // @fastify/rate-limit
  timeWindow: { value: 60_000, from: FRL, all: /`refillPerSecond` \(max \/ seconds of timeWindow\): max: 100, timeWindow: '1 minute' is capacity: 100, refillPerSecond: 100 \/ 60/ },
  allowList: { value: ['127.0.0.1'], from: FRL, ...ALLOW },
  skipOnError: { value: false, from: FRL, all: /use `failureMode`: 'closed'/ },
  nameSpace: { value: 'rl-', from: FRL, all: /use `prefix`/ },
  groupId: { value: 'g', from: FRL, all: /use `bucket` \(routes naming one bucket share it\)/ },
  addHeaders: { value: {}, from: FRL, all: /use `headers`: 'draft-6', 'draft-10', 'draft-11', 'legacy' or false/, core: NO_HEADERS },
  addHeadersOnExceeding: { value: {}, from: FRL, all: /use `headers`/, core: NO_HEADERS },
  enableDraftSpec: { value: true, from: FRL, all: /use `headers`: 'draft-6' \(the ratelimit-\* headers\)/, core: NO_HEADERS },
  errorResponseBuilder: { value: () => ({}), from: FRL, ...ANSWER },
  cache: { value: 5000, from: FRL, all: /caps its in-process maps itself/ },
  continueExceeding: { value: true, from: FRL, all: /a denied request spends no token/ },
  ban: { value: 3, from: FRL, all: /use `lockout`: \{ after, withinMs, forMs \}.*where ban answers 403/ },
  onBanReach: { value: () => {}, from: FRL, all: /'tollgate:decision' diagnostics channel \(a blocked decision has locked: true\)/ },
  onExceeding: { value: () => {}, from: FRL, all: /'tollgate:decision' diagnostics channel/ },
  onExceeded: { value: () => {}, from: FRL, all: /'tollgate:decision' diagnostics channel/ },
  exponentialBackoff: { value: true, from: FRL, all: /a denied request waits until its tokens are back/ },
  // rate-limiter-flexible
  points: { value: 10, from: RLF, all: /`refillPerSecond` \(points \/ seconds of duration\)/ },
  duration: { value: 60, from: RLF, all: /points: 10, duration: 60 is capacity: 10, refillPerSecond: 10 \/ 60/ },
  blockDuration: { value: 300, from: RLF, all: /use `lockout`: \{ after: 1, withinMs: 1000, forMs: blockDuration × 1000 \}/ },
  insuranceLimiter: { value: {}, from: RLF, all: /use `failureMode`: 'local' with `local`: \{ capacity, refillPerSecond \}/ },
  storeClient: { value: {}, from: RLF, all: /use `redis` \(an ioredis, iovalkey, node-redis or GLIDE client\)/ },
  useRedisPackage: { value: true, from: RLF, all: /pass the node-redis client itself; tollgate tells the client family from the object/ },
  useRedis3AndLowerPackage: { value: true, from: RLF, all: /a node-redis 4, 5 or 6 client \(node-redis 3 is not supported\)/ },
  rejectIfRedisNotReady: { value: true, from: RLF, all: /use `failureMode`: a client that is not ready is a store failure/ },
  storeType: { value: 'redis', from: RLF, all: REDIS },
  keyPrefix: { value: 'rlflx', from: RLF, all: /use `prefix`/ },
  execEvenly: { value: true, from: RLF, all: EVENLY },
  execEvenlyMinDelayMs: { value: 10, from: RLF, all: EVENLY },
  inMemoryBlockOnConsumed: { value: 10, from: RLF, all: DENIAL_CACHE },
  inMemoryBlockDuration: { value: 10, from: RLF, all: DENIAL_CACHE },
  inmemoryBlockOnConsumed: { value: 10, from: RLF, all: DENIAL_CACHE },
  inmemoryBlockDuration: { value: 10, from: RLF, all: DENIAL_CACHE },
  timeoutMs: { value: 50, from: RLF, all: /use `timeout` \(ms, default 10\)/ },
  maxQueueSize: { value: 100, from: RLF, all: /use `maxWaitMs` \(how long a call may wait for its tokens: RateLimiterQueue's removeTokens\) and `maxWaiters`/ },
  whiteList: { value: ['k'], from: RLF, ...ALLOW },
  isWhiteListed: { value: () => false, from: RLF, ...ALLOW },
  blackList: { value: ['k'], from: RLF, all: /refuse those clients before the limiter/ },
  isBlackListed: { value: () => false, from: RLF, all: /refuse those clients before the limiter/ }
}

const identifiers = (text: string): string[] => [...text.matchAll(/`([A-Za-z][A-Za-z0-9]*)`/g)].map((m) => m[1] as string)

/**
 * The hint names only options of this adapter: each valid here, or said to
 * be set where it is (of the instance, or of a route or policy).
 */
function namesOnlyOptions (t: Tap, message: string, place: Place, label: string): void {
  const advice = message.replace(/^tollgate: (unknown option `[^`]*`|`[^`]*` must be .*?, got [^:]*)/, '')
  const adapterOptions = new Set([...PLACES.filter((p) => p.adapter === place.adapter).flatMap((p) => p.valid)])
  for (const name of identifiers(advice)) {
    if (place.valid.includes(name)) continue
    t.ok(adapterOptions.has(name), `${label}: \`${name}\` is an option of the ${place.adapter} adapter`, { message })
    const where = INSTANCE_OF[place.adapter].includes(name) ? ELSEWHERE[place.adapter].instance : ELSEWHERE[place.adapter].policy
    t.match(advice, new RegExp(`\`${name}\`( and \`[A-Za-z]+\`)* (is|are) set ${where.replace(/[()]/g, '\\$&')}`), `${label}: \`${name}\` is said to be set ${where}`, { message })
  }
}

type Tap = Parameters<Parameters<typeof t.test>[0]>[0]

t.test('the places list every option valid there, and only those', async (t) => {
  // A value no check takes: an error about the value, not an unknown name.
  for (const place of PLACES) {
    for (const name of place.valid) {
      const err = await place.error(name, Symbol('no option takes this'))
      t.notMatch(String((err as Error | undefined)?.message), /unknown option/, `${place.label}: \`${name}\` is known`)
    }
  }
})

t.test('every foreign name: the library, as the adapter reads it, the replacement, and only options that exist there', async (t) => {
  for (const [name, hint] of Object.entries(HINTS)) {
    for (const place of PLACES) {
      const label = `${name} in ${place.label}`
      const err = await place.error(name, hint.value)
      if (hint.validAt?.includes(place.label) === true) {
        t.notMatch(String((err as Error | undefined)?.message), /unknown option/, `${label}: a tollgate option here`)
        continue
      }
      if (!(err instanceof TypeError)) {
        t.fail(`${label}: a TypeError`, { err })
        continue
      }
      t.equal((err as TypeError & { code?: string }).code, 'TOLLGATE_INVALID_OPTION', `${label}: code`)
      const library = typeof hint.from === 'string' ? hint.from : hint.from[place.adapter] as Library
      t.match(err.message, `unknown option \``, label)
      t.match(err.message, `: that is an option of ${library}; `, `${label}: names ${library}`)
      t.match(err.message, `(see "Migrating from ${library}" in tollgate's README)`, `${label}: points to its table`)
      t.match(err.message, hint[place.adapter] ?? hint.all as RegExp, `${label}: names the replacement`)
      namesOnlyOptions(t, err.message, place, label)
    }
  }
})

t.test("tollgate's own names that express-rate-limit uses otherwise: `limit: 100`, `headers: true` and draft-7/8", async (t) => {
  const valueCases: Array<[string, unknown, RegExp]> = [
    ['limit', 100, /`[^`]*limit` must be a function \(request\) => \{ capacity, refillPerSecond \} or false, the plan of each request, got 100: a number is express-rate-limit's `limit` \(requests per windowMs\): use `capacity` \(the burst\) and `refillPerSecond` \(limit \/ seconds of windowMs\) \(see "Migrating from express-rate-limit"/],
    ['headers', true, /`[^`]*headers` must be one of "draft-6", "draft-10", "draft-11", "legacy", false, got true: true is express-rate-limit's old `headers` \(its legacyHeaders\): use 'legacy'/],
    ['headers', 'draft-7', /got "draft-7": 'draft-7' is express-rate-limit's standardHeaders: use 'draft-6' or 'draft-10': tollgate has no draft-7 mode/],
    ['headers', 'draft-8', /got "draft-8": 'draft-8' is express-rate-limit's standardHeaders: use 'draft-10': the same RateLimit and RateLimit-Policy lists/]
  ]
  for (const place of PLACES.filter((p) => p.valid.includes('limit'))) {
    for (const [name, value, message] of valueCases) {
      const err = await place.error(name, value)
      t.match(err, { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message }, `${name}: ${String(value)} in ${place.label}`)
      namesOnlyOptions(t, (err as Error).message, place, `${name} in ${place.label}`)
    }
  }
  // Where they are no tollgate option, they are foreign names like any other.
  const programmatic = await PLACES[2]?.error('limit', 100)
  t.match(programmatic, { message: /unknown option `policy\.limit`: that is an option of express-rate-limit; use `capacity` \(the burst\) and `refillPerSecond`.*tollgate's own `limit` is a function giving each request's plan; `limit` is set in a route's config\.rateLimit or the plugin's options/ })
  const core = await PLACES[6]?.error('limit', 100)
  t.match(core, { message: /^tollgate: unknown option `limit`: that is an option of express-rate-limit; use `capacity` \(the burst\) and `refillPerSecond` \(limit \/ seconds of windowMs\); `capacity` and `refillPerSecond` are set in the policy given to consume\(\) and peek\(\)/ })
  t.notMatch((core as Error).message, /own `limit`/, 'the core has no plans: its hint does not name `limit`')
  t.match(await PLACES[6]?.error('headers', true), { message: /unknown option `headers`: that is an option of express-rate-limit; tollgate has no such option: the core sends no headers/ })
  // A plan function and the modes themselves are still accepted.
  t.equal(await PLACES[0]?.error('limit', () => false), undefined, 'a plan function registers')
  for (const mode of ['draft-6', 'draft-10', 'draft-11', 'legacy', false]) t.equal(await PLACES[1]?.error('headers', mode), undefined, `headers: ${String(mode)}`)
})

t.test('values read as their library meant them: standardHeaders, legacyHeaders, passOnStoreError, skipOnError', async (t) => {
  const plugin = PLACES[0] as Place
  const cases: Array<[string, unknown, RegExp]> = [
    ['standardHeaders', true, /use `headers`: 'draft-6' \(the same RateLimit-Policy, -Limit, -Remaining and -Reset; the default\)/],
    ['standardHeaders', 'draft-6', /use `headers`: 'draft-6'/],
    ['standardHeaders', 'draft-7', /use `headers`: 'draft-6' or 'draft-10': tollgate has no draft-7 mode/],
    ['standardHeaders', false, /use `headers`: 'legacy' for the X-RateLimit-\* headers express-rate-limit sends by default, or false for none/],
    ['standardHeaders', 'draft-9', /use `headers`: 'draft-6', 'draft-10', 'draft-11', 'legacy' or false/],
    ['legacyHeaders', false, /tollgate has no such option: the X-RateLimit-\* headers are sent only with `headers`: 'legacy'/],
    ['passOnStoreError', false, /use `failureMode`: 'closed'/],
    ['passOnStoreError', 'yes', /use `failureMode`: 'open' \(for true\) or 'closed' \(for false\)/],
    ['skipOnError', true, /use `failureMode`: 'open'/]
  ]
  for (const [name, value, message] of cases) t.match(await plugin.error(name, value), { message }, `${name}: ${String(value)}`)
})

t.test('several foreign names are reported at once; a name no library has still gets "did you mean"', async (t) => {
  const err = await PLACES[3]?.error('windowMs', 60_000) as Error
  t.match(err.message, /^tollgate: unknown option `windowMs`/, 'one name: the error itself')
  const several = await caught(() => rateLimit({ windowMs: 60_000, limit: 100, standardHeaders: 'draft-8', legacyHeaders: false, failureMode: 'open' } as never))
  t.match(several, { message: /^tollgate: 4 invalid options:\n/, errors: { length: 4 } })
  t.match((several as Error).message, /`limit` must be a function .* got 100: a number is express-rate-limit's `limit`/)
  const typo = await PLACES[3]?.error('windowsMs', 60_000) as Error
  t.match(typo.message, /^tollgate: unknown option `windowsMs`(; did you mean `[A-Za-z]+`\?)?$/, 'a misspelt foreign name is no foreign name')
  // Names are looked up as own keys only: Object.prototype's are no library's option.
  const proto = await PLACES[0]?.error('constructor', 1) as Error
  t.equal(proto.message, 'tollgate: unknown option `constructor`')
})

t.test('the windowMs hint works out the bucket from the app\'s own windowMs and max or limit', async (t) => {
  const express = async (options: Record<string, unknown>): Promise<string> => {
    const err = await caught(async () => { await rateLimit({ failureMode: 'open', logger: memoryLogger(), ...options } as never).close() }) as Error
    return err.message
  }
  const cases: Array<[Record<string, unknown>, string]> = [
    [{ windowMs: 900_000, max: 100 }, '`refillPerSecond` (max / seconds of windowMs): max: 100, windowMs: 900000 is capacity: 100, refillPerSecond: 100 / 900 (0.1111 a second)'],
    [{ windowMs: 1500, limit: 3 }, '`refillPerSecond` (limit / seconds of windowMs): limit: 3, windowMs: 1500 is capacity: 3, refillPerSecond: 3 / 1.5 (2 a second)'],
    [{ windowMs: 3_600_000, max: 0, limit: 'x' }, '`refillPerSecond` (limit / seconds of windowMs): limit: 100, windowMs: 3600000 is capacity: 100, refillPerSecond: 100 / 3600 (0.02778 a second)'],
    [{ windowMs: '15m', max: 10 }, '`refillPerSecond` (max / seconds of windowMs): max: 10, windowMs: 60000 is capacity: 10, refillPerSecond: 10 / 60 (0.1667 a second)']
  ]
  for (const [options, advice] of cases) {
    const message = await express(options)
    const line = message.split('\n').find((l) => l.includes('`windowMs`')) ?? ''
    t.ok(line.includes(`use \`capacity\` (the burst) and ${advice}`), `${JSON.stringify(options)}: ${line}`)
  }
  const core = await caught(async () => { await createLimiter({ windowMs: 60_000, max: 5 } as never).close() }) as Error
  t.match(core.message, /max: 5, windowMs: 60000 is capacity: 5, refillPerSecond: 5 \/ 60 \(0\.08333 a second\)/, 'the core too')
})

t.test("express-rate-limit's `limit` as a function of the request: its number is answered with the plan it should be, on its first call", async (t) => {
  const expected = /`limit` must return \{ capacity, refillPerSecond \} or false, got 100: a number is what express-rate-limit's `limit` function returns \(requests per windowMs\): tollgate's returns the client's plan, e\.g\. \{ capacity: 100, refillPerSecond: 100 \/ 60 \} for 100 a minute, or false for no limit \(see "Migrating from express-rate-limit" in tollgate's README\)/
  const logger = memoryLogger()
  const limit = rateLimit({ ...base, limit: (() => 100) as never, logger, warnings: false })
  t.teardown(() => limit.close())
  const app = express()
  app.use(limit)
  app.get('/', (_req, res) => { res.send('handler ran') })
  const a = await (await listen(t, app))('/')
  t.equal(a.status, 500)
  t.match(logger.lines.filter((l) => l.includes('rate limit of')), [expected], 'Express: the log line says what the number is')
  const honoLogger = memoryLogger()
  const honoLimit = honoRateLimit({ ...base, logger: honoLogger, warnings: false })
  t.teardown(() => honoLimit.close())
  const hono = new Hono()
  hono.get('/', honoLimit({ limit: (() => 100) as never }), (c) => c.text('handler ran'))
  t.equal((await (await listenHono(t, hono))('/')).status, 500)
  t.match(honoLogger.lines.filter((l) => l.includes('rate limit of')), [expected], 'Hono: the same')
})

t.test("hono-rate-limiter's handler(c, next, options) is refused at start-up with the way over, in rateLimit() and in limit()", async (t) => {
  const foreign = (c: { text: (body: string, status: number) => Response }, _next: unknown, options: { message: string, statusCode: number }): Response => c.text(options.message, options.statusCode)
  const message = /^tollgate: `(limit\(\): )?handler` must be a function \(c, err\) => Response, got a function: a handler of 3 parameters is hono-rate-limiter's \(c, next, options\): tollgate calls handler\(c, err\), err a RateLimitError with status, message and retryAfter, the rate-limit headers already set on c, e\.g\. \(c, err\) => c\.json\(\{ message: err\.message \}, err\.status\) \(see "Migrating from express-rate-limit" in tollgate's README\)$/
  t.throws(() => honoRateLimit({ ...base, handler: foreign as never } as HonoOptions), { code: 'TOLLGATE_INVALID_OPTION', message })
  const limit = honoRateLimit({ ...base, logger: memoryLogger(), warnings: false })
  t.teardown(() => limit.close())
  const app = new Hono()
  t.throws(() => app.get('/', limit({ capacity: 1, handler: foreign as never }), (c) => c.text('ok')), { code: 'TOLLGATE_INVALID_OPTION', message }, 'on the route, when it is declared')
  // tollgate's own handler of (c, err) answers the denials.
  app.get('/own', limit({ capacity: 1, handler: (c, err) => c.json({ message: err.message }, err.status) }), (c) => c.text('ok'))
  const get = await listenHono(t, app)
  await get('/own')
  const denied = await get('/own')
  t.same([denied.status, JSON.parse(denied.body)], [429, { message: 'Rate limit exceeded, retry in 1 second(s)' }])
})

t.test('nested options get no foreign hints: `local.timeWindow` is a typo, not @fastify/rate-limit', async (t) => {
  const err = await PLACES[0]?.error('local', { capacity: 1, refillPerSecond: 1, timeWindow: 1000 }) as Error
  t.match(err.message, /unknown option `local\.timeWindow`/)
  t.notMatch(err.message, /that is an option of/)
})

t.test('a programmatic policy with a misspelt name is refused, not merged away', async (t) => {
  const err = await PLACES[2]?.error('capcity', 1) as Error
  t.match(err, { code: 'TOLLGATE_INVALID_OPTION', message: /^tollgate: unknown option `policy\.capcity`; did you mean `policy\.capacity`\?$/ })
  const express = await PLACES[5]?.error('refilPerSecond', 1) as Error
  t.match(express, { message: /did you mean `policy\.refillPerSecond`\?$/ })
})

t.test('the migration tables list every hinted name under its library', async (t) => {
  const guide = readFileSync(join(ROOT, 'docs', 'guides', 'migrating.md'), 'utf8')
  const table = (library: Library): string => {
    const start = guide.indexOf(`## Migrating from ${library}\n`)
    t.ok(start >= 0, `a "Migrating from ${library}" section`)
    const end = guide.indexOf('\n## ', start + 1)
    return guide.slice(start, end === -1 ? undefined : end).split('\n').filter((l) => l.startsWith('| ')).map((l) => l.split(' | ')[0] ?? '').join('\n')
  }
  for (const [name, hint] of Object.entries(HINTS)) {
    const libraries = typeof hint.from === 'string' ? [hint.from] : [...new Set(Object.values(hint.from))]
    // `name`, or `name: value`, in the left column.
    for (const library of libraries) t.match(table(library), new RegExp(`\`${name}(\`|: )`), `${name} in the ${library} table`)
  }
})

t.test("@nestjs/throttler's names in TollgateModule's options, and the Nest words of the other libraries' answers", async (t) => {
  const nest = async (name: string, value: unknown): Promise<Error | undefined> => await caught(async () => {
    // The options are checked when the service is made, before the app scans its routes.
    await new TollgateService({ ...base, logger: memoryLogger(), [name]: value } as NestOptions, undefined as never).beforeApplicationShutdown()
  }) as Error | undefined
  const cases: Array<[string, unknown, RegExp]> = [
    ['ttl', 60_000, /use `capacity` \(the burst\) and `refillPerSecond` \(limit \/ seconds of ttl\): limit: 10, ttl: 60000 \(ms\) is capacity: 10, refillPerSecond: 10 \/ 60/],
    ['blockDuration', 30_000, /use `lockout`: \{ after: 1, withinMs: ttl, forMs: blockDuration \}/],
    ['throttlers', [{ ttl: 1000, limit: 3 }], /use an array of policies, @RateLimit\(\[\{ capacity, refillPerSecond \}, \{ bucket: 'long'/],
    ['name', 'short', /use `bucket`: it names the policy \(and its Redis key\)/],
    ['getTracker', () => 'k', /use `key`, a function \(request\) => string/],
    ['generateKey', () => 'k', /use `key` for the client and `bucket` for the route/],
    ['skipIf', () => false, /use `allow`, a function \(request\) => boolean: true skips the limiter/],
    ['ignoreUserAgents', [/bot/], /use `allow`, a function \(request\) => boolean/],
    ['storage', {}, /use `redis` \(an ioredis, iovalkey, node-redis or GLIDE client\), or nothing for the in-process store/],
    ['errorMessage', 'Too many', /use an exception filter: a denial is a RateLimitException \(an HttpException with code, retryAfter/],
    ['setHeaders', false, /use `headers`: 'draft-6', 'draft-10', 'draft-11', 'legacy' or false/]
  ]
  for (const [name, value, advice] of cases) {
    const err = await nest(name, value)
    t.match(err, { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message: `unknown option \`${name}\`: that is an option of @nestjs/throttler; ` }, name)
    t.match(err?.message, advice, `${name}: the replacement`)
    t.match(err?.message, '(see "Migrating from @nestjs/throttler" in tollgate\'s README)', `${name}: points to its table`)
  }
  t.match(await nest('handler', () => {}), { message: /express-rate-limit; use an exception filter: a denial is a RateLimitException/ }, "express-rate-limit's handler: Nest's way to answer")
  t.match(await nest('skipSuccessfulRequests', true), { message: /use `settle`: \(req, res\) => res\.statusCode < 400 \? 0 : 1/ }, 'settle reads res.statusCode on both platforms')
  t.match(await nest('blockDuration', 300), { message: /@nestjs\/throttler/ }, "blockDuration is @nestjs/throttler's first on Nest")
  t.equal(await nest('global', false), undefined, '`global` is an option of the module')
  const guide = readFileSync(join(ROOT, 'docs', 'guides', 'migrating.md'), 'utf8')
  const start = guide.indexOf('## Migrating from @nestjs/throttler\n')
  t.ok(start >= 0, 'a "Migrating from @nestjs/throttler" section')
  const end = guide.indexOf('\n## ', start + 1)
  const table = guide.slice(start, end === -1 ? undefined : end).split('\n').filter((l) => l.startsWith('| ')).map((l) => l.split(' | ')[0] ?? '').join('\n')
  for (const [name] of cases) t.match(table, new RegExp(`\`${name}(\`|: )`), `${name} in the @nestjs/throttler table`)
})
