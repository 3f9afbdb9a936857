// Other rate limiters' option names, and what tollgate has instead.
//
// Most users come to tollgate from express-rate-limit, @fastify/rate-limit
// or rate-limiter-flexible, and write those names first: `windowMs`, `max`,
// `points`. An unknown name that one of them uses is answered with its
// replacement (lib/core/options.ts `parseFields` asks here), read as the adapter's
// users most likely meant it: `max` is express-rate-limit's on Express and
// @fastify/rate-limit's on Fastify (their windows are named differently).
// A hint never names an option that does not exist where it is read: an
// option of the adapter itself (`redis`, `prefix`) is named as such when
// the unknown name sits in a route's policy, a policy field as such in
// createLimiter()'s options, and the core, which has no routes, is never
// pointed at a route setting. Two of tollgate's own names collide with
// express-rate-limit's: `limit` (a plan function here, a number there) and
// `headers` (its old boolean); their checks add the hints below.
// hono-rate-limiter takes express-rate-limit's names, so Hono's users are
// answered as Express's are, with Hono's own handler and context. The
// "Migrating from ..." sections of docs/guides/migrating.md hold the same
// tables (the README links to each under the name the messages give).

export type Adapter = 'fastify' | 'express' | 'hono' | 'nest' | 'core'
type Library = 'express-rate-limit' | '@fastify/rate-limit' | 'rate-limiter-flexible' | '@nestjs/throttler'

/** The libraries an adapter's users likely come from, the likeliest first. */
const ORDER: Readonly<Record<Adapter, readonly Library[]>> = {
  fastify: ['@fastify/rate-limit', 'express-rate-limit', 'rate-limiter-flexible'],
  express: ['express-rate-limit', 'rate-limiter-flexible', '@fastify/rate-limit'],
  hono: ['express-rate-limit', 'rate-limiter-flexible', '@fastify/rate-limit'],
  nest: ['@nestjs/throttler', 'express-rate-limit', 'rate-limiter-flexible', '@fastify/rate-limit'],
  core: ['rate-limiter-flexible', 'express-rate-limit', '@fastify/rate-limit']
}

/** Options of an adapter (or of createLimiter) itself, never of a route or a policy. */
const INSTANCE = new Set(['redis', 'prefix', 'keySecret', 'ipv6Subnet', 'breaker', 'denialCache', 'metrics', 'maxWaiters', 'warnings', 'logger', 'global', 'notFound'])

/** Where an option that is not valid here is set instead, per adapter. */
const ELSEWHERE: Readonly<Record<Adapter, { instance: string, policy: string }>> = {
  fastify: { instance: "on the plugin's options", policy: "in a route's config.rateLimit or the plugin's options" },
  express: { instance: "in rateLimit()'s options", policy: 'in rateLimit() or limit()' },
  hono: { instance: "in rateLimit()'s options", policy: 'in rateLimit() or limit()' },
  nest: { instance: "in TollgateModule.forRoot()'s options", policy: 'in TollgateModule.forRoot() or @RateLimit()' },
  core: { instance: "in createLimiter()'s options", policy: 'in the policy given to consume() and peek()' }
}

/** What an advice knows of the place it is given in. */
interface Place {
  readonly adapter: Adapter
  /** A tollgate option in backticks; one that is not valid here is noted, to say where it is set. */
  opt (name: string): string
  /** The other options given with it, so that an advice can use the app's own numbers. */
  readonly given: Readonly<Record<string, unknown>>
}

/** The replacement of one foreign option, for a place and the value given. */
type Advice = (at: Place, value: unknown) => string

const see = (library: Library): string => `(see "Migrating from ${library}" in tollgate's README)`

/** The burst and the rate from a count per window. */
function bucketOf (at: Place, count: string, window: string): string {
  return `${at.opt('capacity')} (the burst) and ${at.opt('refillPerSecond')} (${count} / seconds of ${window})`
}

/** How a denial is answered instead of by an option of the limiter. */
function answering (at: Place): string {
  if (at.adapter === 'express') return `${at.opt('handler')}, e.g. (req, res) => res.status(429).json({ message: '...' })`
  if (at.adapter === 'hono') return `${at.opt('handler')}, e.g. (c) => c.json({ message: '...' }, 429)`
  if (at.adapter === 'nest') return 'an exception filter: a denial is a RateLimitException (an HttpException with code, retryAfter and the rate-limit headers already set on the response)'
  if (at.adapter === 'fastify') return "Fastify's setErrorHandler (a denial is an error with code TOLLGATE_RATE_LIMITED and statusCode 429)"
  return 'nothing: the core answers no request; consume() returns a Decision (allowed: false when denied) for the app to answer'
}

/** Charging by outcome: `settle` returns the cost after the response (0: free). */
function settling (at: Place, free: string): string {
  if (at.adapter === 'core') return `reserve() and settle(): settle with 0 when the ${free} request is to be free`
  const [args, status] = at.adapter === 'fastify' ? ['(request, reply)', 'reply.statusCode'] : at.adapter === 'hono' ? ['(c)', 'c.res.status'] : ['(req, res)', 'res.statusCode']
  const test = free === 'successful' ? `${status} < 400 ? 0 : 1` : `${status} >= 400 ? 0 : 1`
  return `${at.opt('settle')}: ${args} => ${test} (charging by outcome: the cost after the response, 0 is free)`
}

/** The rate-limit headers, which the core does not send. */
function headersAs (at: Place, mode: string): string {
  return at.adapter === 'core' ? 'nothing: the core sends no headers (the Fastify plugin and tollgate/express do)' : `${at.opt('headers')}: ${mode}`
}

/** The client key. */
function keyed (at: Place): string {
  return at.adapter === 'core' ? 'the client key, the first argument of consume() and peek()' : `${at.opt('key')}, a function (request) => string`
}

/** Requests that skip the limiter. */
function allowing (at: Place, what: string): string {
  return at.adapter === 'core' ? `nothing: call consume() only for the requests to limit, not for ${what}` : `${at.opt('allow')}, a function (request) => boolean: true skips the limiter`
}

/** What to do when the store fails: true (go on) is 'open', false 'closed'. */
function failureOf (at: Place, value: unknown): string {
  const mode = value === true ? "'open'" : value === false ? "'closed'" : "'open' (for true) or 'closed' (for false)"
  return `${at.opt('failureMode')}: ${mode}; 'closed' answers 503 with Retry-After, 'local' falls back to a smaller in-process limit (${at.opt('local')})`
}

const EXPRESS_RATE_LIMIT: ReadonlyMap<string, Advice> = new Map<string, Advice>([
  ['windowMs', (at, value) => windowAdvice(at, value)],
  ['max', (at) => bucketOf(at, 'max', 'windowMs')],
  ['limit', (at) => bucketOf(at, 'limit', 'windowMs') + (at.adapter === 'core' ? '' : `; tollgate's own ${at.opt('limit')} is a function giving each request's plan`)],
  ['standardHeaders', (at, value) => headersAs(at, standardMode(value))],
  ['legacyHeaders', (at, value) => value === false && at.adapter !== 'core'
    ? `nothing: the X-RateLimit-* headers are sent only with ${at.opt('headers')}: 'legacy'`
    : headersAs(at, "'legacy' (one mode at a time, instead of the default 'draft-6'; X-RateLimit-Reset counts seconds from now, not a Unix time)")],
  ['draft_polli_ratelimit_headers', (at) => headersAs(at, "'draft-6'")],
  ['skip', (at) => allowing(at, 'the requests to skip')],
  ['message', (at) => answering(at)],
  ['statusCode', (at) => answering(at)],
  ['handler', (at) => answering(at)],
  ['onLimitReached', (at) => answering(at)],
  ['passOnStoreError', (at, value) => failureOf(at, value)],
  ['skipSuccessfulRequests', (at) => settling(at, 'successful')],
  ['skipFailedRequests', (at) => settling(at, 'failed')],
  ['requestWasSuccessful', (at) => settling(at, 'successful')],
  ['keyGenerator', (at) => keyed(at)],
  ['requestPropertyName', (at) => at.adapter === 'core'
    ? 'nothing: consume() returns the Decision'
    : at.adapter === 'hono' ? "nothing: the decision is always c.get('rateLimit')" : `nothing: the decision is always on ${at.adapter === 'express' ? 'req' : 'request'}.rateLimit`],
  ['store', (at) => `${at.opt('redis')} (an ioredis, iovalkey, node-redis or GLIDE client), or nothing for the in-process store`],
  ['validate', (at) => at.adapter === 'core'
    ? 'nothing: every option is checked when the limiter is created'
    : `nothing: every option is checked at start-up; ${at.opt('warnings')} turns off the warnings at run time`],
  ['identifier', (at) => at.adapter === 'core'
    ? `${at.opt('bucket')}, the name of the policy`
    : `${at.opt('bucket')}: it names the policy in the 'draft-10' headers`],
  ['retryAfter', () => 'nothing: Retry-After is the wait until the cost is affordable, computed per denial'],
  ['headers', (at) => headersAs(at, "'legacy'")],
  ['logger', (at) => at.adapter === 'fastify' ? "nothing: tollgate logs through Fastify's logger (app.log)" : at.opt('logger')]
])

/**
 * express-rate-limit's window as a bucket, worked out on the app's own
 * `windowMs` and `max` (or `limit`) when given, else on 60 s and 100.
 */
function windowAdvice (at: Place, windowMs: unknown): string {
  const positive = (n: unknown): n is number => typeof n === 'number' && Number.isFinite(n) && n > 0
  const ms = positive(windowMs) ? windowMs : 60_000
  const [name, count] = positive(at.given.max) ? ['max', at.given.max] : positive(at.given.limit) ? ['limit', at.given.limit] : ['limit', 100]
  const seconds = ms / 1000
  return `${bucketOf(at, name, 'windowMs')}: ${name}: ${count}, windowMs: ${ms} is capacity: ${count}, refillPerSecond: ${count} / ${seconds} (${Number((count / seconds).toPrecision(4))} a second)`
}

/** express-rate-limit's `standardHeaders` values, as tollgate's `headers` modes. */
function standardMode (value: unknown): string {
  if (value === true || value === 'draft-6') return "'draft-6' (the same RateLimit-Policy, -Limit, -Remaining and -Reset; the default)"
  if (value === 'draft-7') return DRAFT_7
  if (value === 'draft-8') return DRAFT_8
  if (value === false) return "'legacy' for the X-RateLimit-* headers express-rate-limit sends by default, or false for none"
  return "'draft-6', 'draft-10', 'draft-11', 'legacy' or false"
}

const DRAFT_7 = "'draft-6' or 'draft-10': tollgate has no draft-7 mode (one `RateLimit: limit=, remaining=, reset=` field); 'draft-6' sends the same RateLimit-Policy and the same numbers as RateLimit-Limit, -Remaining and -Reset, 'draft-10' the newer RateLimit list"
const DRAFT_8 = "'draft-10': the same RateLimit and RateLimit-Policy lists (\"name\";r=..;t=.. and \"name\";q=..;w=..), named by the bucket, without the partition key pk; 'draft-11' sends the same lists with t the effective window of the available quota, and pk with partitionKey: true"

const FASTIFY_RATE_LIMIT: ReadonlyMap<string, Advice> = new Map<string, Advice>([
  ['max', (at) => bucketOf(at, 'max', 'timeWindow')],
  ['timeWindow', (at) => `${bucketOf(at, 'max', 'timeWindow')}: max: 100, timeWindow: '1 minute' is capacity: 100, refillPerSecond: 100 / 60`],
  ['keyGenerator', (at) => keyed(at)],
  ['allowList', (at) => allowing(at, 'the clients to skip')],
  ['skipOnError', (at, value) => failureOf(at, value)],
  ['nameSpace', (at) => at.opt('prefix')],
  ['groupId', (at) => `${at.opt('bucket')} (routes naming one bucket share it)`],
  ['addHeaders', (at) => headersAs(at, "'draft-6', 'draft-10', 'draft-11', 'legacy' or false")],
  ['addHeadersOnExceeding', (at) => headersAs(at, "'draft-6', 'draft-10', 'draft-11', 'legacy' or false")],
  ['enableDraftSpec', (at) => headersAs(at, "'draft-6' (the ratelimit-* headers) or 'draft-10'")],
  ['errorResponseBuilder', (at) => answering(at)],
  ['store', (at) => `${at.opt('redis')}, or nothing for the in-process store`],
  ['cache', () => 'nothing: tollgate caps its in-process maps itself'],
  ['continueExceeding', () => 'nothing: a denied request spends no token'],
  ['ban', (at) => `${at.opt('lockout')}: { after, withinMs, forMs }: after that many denials within withinMs, the client is blocked for forMs (with 429s, where ban answers 403)`],
  ['onBanReach', () => "the 'tollgate:decision' diagnostics channel (a blocked decision has locked: true)"],
  ['onExceeding', () => "the 'tollgate:decision' diagnostics channel"],
  ['onExceeded', () => "the 'tollgate:decision' diagnostics channel"],
  ['exponentialBackoff', () => 'nothing: a denied request waits until its tokens are back']
])

const RATE_LIMITER_FLEXIBLE: ReadonlyMap<string, Advice> = new Map<string, Advice>([
  ['points', (at) => bucketOf(at, 'points', 'duration')],
  ['duration', (at) => `${bucketOf(at, 'points', 'duration')}: points: 10, duration: 60 is capacity: 10, refillPerSecond: 10 / 60`],
  ['blockDuration', (at) => `${at.opt('lockout')}: { after: 1, withinMs: 1000, forMs: blockDuration × 1000 } blocks a client for forMs from its first denial`],
  ['insuranceLimiter', (at) => `${at.opt('failureMode')}: 'local' with ${at.opt('local')}: { capacity, refillPerSecond }, the in-process limit used while Redis fails`],
  ['storeClient', (at) => `${at.opt('redis')} (an ioredis, iovalkey, node-redis or GLIDE client)`],
  ['useRedisPackage', (at) => `${at.opt('redis')}: pass the node-redis client itself; tollgate tells the client family from the object`],
  ['useRedis3AndLowerPackage', (at) => `${at.opt('redis')}: a node-redis 4, 5 or 6 client (node-redis 3 is not supported)`],
  ['rejectIfRedisNotReady', (at) => `${at.opt('failureMode')}: a client that is not ready is a store failure, decided by the failure mode at once`],
  ['storeType', (at) => `${at.opt('redis')}: tollgate keeps its buckets in Redis or, without it, in process`],
  ['keyPrefix', (at) => at.opt('prefix')],
  ['execEvenly', (at) => evenly(at)],
  ['execEvenlyMinDelayMs', (at) => evenly(at)],
  ['inMemoryBlockOnConsumed', (at) => inMemory(at)],
  ['inMemoryBlockDuration', (at) => inMemory(at)],
  ['inmemoryBlockOnConsumed', (at) => inMemory(at)],
  ['inmemoryBlockDuration', (at) => inMemory(at)],
  ['timeoutMs', (at) => `${at.opt('timeout')} (ms, default 10): the deadline of one store decision`],
  ['maxQueueSize', (at) => `${at.opt('maxWaitMs')} (how long a call may wait for its tokens: RateLimiterQueue's removeTokens) and ${at.opt('maxWaiters')} (how many calls may wait at once in this process)`],
  ['whiteList', (at) => allowing(at, 'the listed clients')],
  ['isWhiteListed', (at) => allowing(at, 'the listed clients')],
  ['blackList', () => 'nothing: refuse those clients before the limiter'],
  ['isBlackListed', () => 'nothing: refuse those clients before the limiter']
])

function evenly (at: Place): string {
  return `${at.opt('refillPerSecond')} (points / duration) with a small ${at.opt('capacity')}: past its burst, a token bucket admits requests at the refill rate; ${at.opt('maxWaitMs')} makes a request wait for its token instead of being refused`
}

function inMemory (at: Place): string {
  return `nothing: the denial cache (${at.opt('denialCache')}, on by default) denies a denied client in process, without a store call, until the wait Redis named is over`
}

/**
 * @nestjs/throttler's names: its throttlers count `limit` requests per
 * `ttl` ms (a fixed window), and are named; `blockDuration` blocks a
 * client that went over.
 */
const NESTJS_THROTTLER: ReadonlyMap<string, Advice> = new Map<string, Advice>([
  ['ttl', (at) => `${bucketOf(at, 'limit', 'ttl')}: limit: 10, ttl: 60000 (ms) is capacity: 10, refillPerSecond: 10 / 60`],
  ['blockDuration', (at) => `${at.opt('lockout')}: { after: 1, withinMs: ttl, forMs: blockDuration } blocks a client for forMs from its first denial`],
  ['throttlers', () => "an array of policies, @RateLimit([{ capacity, refillPerSecond }, { bucket: 'long', capacity, refillPerSecond }]): all must pass, and a denied request spends from none"],
  ['name', (at) => `${at.opt('bucket')}: it names the policy (and its Redis key)`],
  ['getTracker', (at) => keyed(at)],
  ['generateKey', (at) => `${at.opt('key')} for the client and ${at.opt('bucket')} for the route`],
  ['skipIf', (at) => allowing(at, 'the requests to skip')],
  ['ignoreUserAgents', (at) => allowing(at, 'those user agents')],
  ['storage', (at) => `${at.opt('redis')} (an ioredis, iovalkey, node-redis or GLIDE client), or nothing for the in-process store`],
  ['errorMessage', (at) => answering(at)],
  ['setHeaders', (at) => headersAs(at, "'draft-6', 'draft-10', 'draft-11', 'legacy' or false")]
])

const TABLES: Readonly<Record<Library, ReadonlyMap<string, Advice>>> = {
  '@nestjs/throttler': NESTJS_THROTTLER,
  'express-rate-limit': EXPRESS_RATE_LIMIT,
  '@fastify/rate-limit': FASTIFY_RATE_LIMIT,
  'rate-limiter-flexible': RATE_LIMITER_FLEXIBLE
}

/** The advice of `library` at a place: what to use, then where the options named that are not valid there are set. */
function advise (library: Library, advice: Advice, value: unknown, adapter: Adapter, known: readonly string[], given: Readonly<Record<string, unknown>>): string {
  const elsewhere = new Map<string, string[]>()
  const at: Place = {
    adapter,
    given,
    opt: (name) => {
      if (!known.includes(name)) {
        const where = INSTANCE.has(name) ? ELSEWHERE[adapter].instance : ELSEWHERE[adapter].policy
        const names = elsewhere.get(where) ?? []
        if (!names.includes(name)) elsewhere.set(where, [...names, name])
      }
      return `\`${name}\``
    }
  }
  const text = advice(at, value)
  let out = `that is an option of ${library}; ${text.startsWith('nothing: ') ? `tollgate has no such option: ${text.slice(9)}` : `use ${text}`}`
  for (const [where, names] of elsewhere) {
    out += `; ${names.map((n) => `\`${n}\``).join(' and ')} ${names.length === 1 ? 'is' : 'are'} set ${where}`
  }
  return `${out} ${see(library)}`
}

/**
 * What to use instead of `name`, an unknown option that another rate
 * limiter has, as the adapter's users most likely meant it; `known` are
 * the names valid where it was given, `given` the options given with it.
 * Undefined when no library has it.
 */
export function migrationHint (name: string, value: unknown, adapter: Adapter, known: readonly string[], given: Readonly<Record<string, unknown>>): string | undefined {
  for (const library of ORDER[adapter]) {
    const advice = TABLES[library].get(name)
    if (advice !== undefined) return advise(library, advice, value, adapter, known, given)
  }
  return undefined
}

/** Why a `limit` that is no function was given: express-rate-limit's `limit` is a count. */
export function limitValueHint (value: unknown): string | undefined {
  if (typeof value !== 'number') return undefined
  return `a number is express-rate-limit's \`limit\` (requests per windowMs): use \`capacity\` (the burst) and \`refillPerSecond\` (limit / seconds of windowMs) ${see('express-rate-limit')}`
}

/**
 * Why a `limit` function returned a number: express-rate-limit's `limit`
 * may be a function of the request giving the count per window. Known
 * only when it is called: both are functions of one request.
 */
export function limitResultHint (value: unknown): string | undefined {
  if (typeof value !== 'number') return undefined
  return `a number is what express-rate-limit's \`limit\` function returns (requests per windowMs): tollgate's returns the client's plan, e.g. { capacity: 100, refillPerSecond: 100 / 60 } for 100 a minute, or false for no limit ${see('express-rate-limit')}`
}

/**
 * Why Hono's `handler` declares three parameters: hono-rate-limiter's is
 * `(c, next, options)`, and would read `options.statusCode` from nothing
 * on every denial.
 */
export function honoHandlerHint (handler: { readonly length: number }): string | undefined {
  if (handler.length < 3) return undefined
  return `a handler of ${handler.length} parameters is hono-rate-limiter's (c, next, options): tollgate calls handler(c, err), err a RateLimitError with status, message and retryAfter, the rate-limit headers already set on c, e.g. (c, err) => c.json({ message: err.message }, err.status) ${see('express-rate-limit')}`
}

/** Why a `headers` value that is no mode was given: express-rate-limit's header settings. */
export function headersValueHint (value: unknown): string | undefined {
  if (value === true) return `true is express-rate-limit's old \`headers\` (its legacyHeaders): use 'legacy' for the X-RateLimit-* headers ${see('express-rate-limit')}`
  if (value === 'draft-7') return `'draft-7' is express-rate-limit's standardHeaders: use ${DRAFT_7} ${see('express-rate-limit')}`
  if (value === 'draft-8') return `'draft-8' is express-rate-limit's standardHeaders: use ${DRAFT_8} ${see('express-rate-limit')}`
  return undefined
}
