// The limits of one middleware adapter's instance (`rateLimit()` of
// tollgate/express and tollgate/hono): each policy compiled once, and how
// a request finds its own. The adapter says what a request's route is
// (`Routes`); the rest is the same for every framework.
//
// Buckets. A policy that names its `bucket` (or whose options name one) is
// compiled once, when `limit()` is called. Otherwise the bucket is named
// after where the middleware is declared, found by the adapter from the
// framework's own record of the declaration, never from the URL: in a
// route, `<METHOD> <route pattern>` (`GET /users/:id`), `ALL <pattern>`
// for a route declared for every method (`app.all`: one route, one bucket,
// so that a client gains nothing by varying the method); mounted outside a
// route (`app.use('/api', ...)`), `ALL /api/*`; mounted on the whole app,
// APP_BUCKET. `limit` used as a middleware itself is `limit()`, named the
// same way: so separate instances declared at separate places never share
// a bucket (express-rate-limit's pattern of one limiter on `/api` and
// another on one route). A name is kept per route object (or middleware)
// and method, so that a request after the first one of its route costs two
// map reads. A client can make no new name: the names of one middleware are
// its declarations times the methods they serve (only methods Node's HTTP
// parser knows), and past MAX_NAMES, a declaration's matter, it refuses (a
// 500 asking for a `bucket`).
//
// One bucket, one policy: every policy an instance compiles is registered
// by bucket name, and a second policy with the same bucket but another
// capacity or rate is refused, at `limit()` time when the bucket is named
// there, else on the first request (a 500 naming both). Two instances
// naming one bucket are told apart in lib/http/sharing.ts (a warning);
// another adapter's are not seen: the bucket then follows whichever
// capacity each call sends, as in Fastify.

import { optionError } from '../core/errors.js'
import { honoHandlerHint } from '../core/migrating.js'
import { hinted, isFunction, isRecord, type AppFunction } from '../core/options.js'
import { POLICY_CHECKS, ROUTE_WIDE, compileRoute, type Defaults, type Dialect, type RouteLimit } from './route.js'

/** Distinct route names one middleware compiles before it refuses (see the top of this file). */
export const MAX_NAMES = 1000
/** The bucket of a middleware mounted on the whole app (`app.use(limit)`), unless the options name one (see the top of this file). */
export const APP_BUCKET = 'app'

/** How a request finds its compiled limit; `self` is the middleware asking. */
export type LimitOf<Req> = (request: Req, self: object) => RouteLimit<Req>

/** What a middleware adapter tells the registry about a request's route. */
export interface Routes<Req, Route extends object = object> {
  /** The object the framework keeps for the declaration of `self` (its route, or `self` when it is mounted outside a route). */
  route(request: Req, self: object): Route
  /** The request's method. */
  method(request: Req): string
  /** The declaration's bucket name for this request's method (`GET /users/:id`, everyMethod()); asked once per route and method. */
  name(request: Req, route: Route): string
}

/**
 * Where a middleware's check runs: where the app placed it. A function of
 * the limit that reads what another middleware sets needs it placed after.
 */
const PLACEMENT = {
  express: 'the check runs where the limiter is placed among the app\'s middleware: a `key` or `cost` that reads req.body, or a user that authentication sets, needs the limiter placed after express.json() and after that middleware',
  hono: 'the check runs where the limiter is placed among the app\'s middleware: a `key` or `cost` that reads what a middleware sets (a user with c.get(), a validator\'s c.req.valid()) needs the limiter placed after that middleware',
  nest: 'the check runs in tollgate\'s guard, after the app\'s middleware and before its other guards, pipes and interceptors: a `key` or `cost` can read what a middleware sets (a user, a parsed body), not what a later guard sets'
} as const

/** Hono's `handler`: `(c, err)`; hono-rate-limiter's `(c, next, options)` is refused with the way over. */
export function honoHandler (value: unknown, name: string): AppFunction {
  const fn = isFunction(value, name)
  const hint = honoHandlerHint(fn)
  if (hint !== undefined) throw hinted(name, value, 'a function (c, err) => Response', hint)
  return fn
}

/**
 * The dialect of the middleware adapters: their options are set in
 * rateLimit() or limit(), and a route may answer its denials with its own
 * `handler` (one per route); Nest's are set in the module's options or
 * `@RateLimit()`, and its denials go to its exception filters.
 */
export function middlewareDialect (adapter: keyof typeof PLACEMENT): Dialect {
  if (adapter === 'nest') return { checks: POLICY_CHECKS, wide: ROUTE_WIDE, hint: 'set it in TollgateModule.forRoot() or @RateLimit()', adapter, placement: PLACEMENT.nest, call: '@RateLimit()' }
  const checks = { ...POLICY_CHECKS, handler: adapter === 'hono' ? honoHandler : isFunction }
  return { checks, wide: [...ROUTE_WIDE, 'handler'], hint: 'set it in rateLimit() or limit()', adapter, placement: PLACEMENT[adapter], call: 'limit()' }
}

/**
 * `limit(policy)` for one instance: checks the policy at once, and returns
 * how a request finds its compiled limit; `wide` does so for `limit` used
 * as a middleware itself (checked on its first request). Every compiled
 * policy is registered by bucket (see the top of this file), and handed to
 * `claim` (lib/http/sharing.ts).
 */
export function registry<Req, Route extends object> (defaults: Defaults, routes: Routes<Req, Route>, dialect: Dialect, claim: (limit: RouteLimit<never>) => void): {
  compile: (config: unknown) => LimitOf<Req>
  wide: () => LimitOf<Req>
} {
  const buckets = new Map<string, { capacity: number, refillPerSecond: number, where: string }>()
  function register (limit: RouteLimit<Req>): RouteLimit<Req> {
    for (const p of limit.policies) {
      const seen = buckets.get(p.bucket)
      if (seen === undefined) buckets.set(p.bucket, { capacity: p.capacity, refillPerSecond: p.refillPerSecond, where: limit.name })
      else if (seen.capacity !== p.capacity || seen.refillPerSecond !== p.refillPerSecond) {
        throw optionError(`${dialect.call} of ${limit.name}: bucket`, p.bucket, `a bucket name with one policy: ${seen.where} gives it capacity ${seen.capacity} and refillPerSecond ${seen.refillPerSecond}, this one ${p.capacity} and ${p.refillPerSecond} (name another bucket)`)
      }
    }
    claim(limit)
    return limit
  }
  function compile (config: unknown): LimitOf<Req> {
    if (config !== undefined && !isPlainObject(config) && !Array.isArray(config)) {
      throw optionError(dialect.call, config, 'a policy, a non-empty array of policies, or nothing (to limit the whole app per client, pass the limiter itself: `app.use(limit)`)')
    }
    const named = namedBucket(config, defaults)
    if (named !== undefined) {
      const limit = register(compileRoute<Req>(named, config, defaults, dialect, `${dialect.call}: `, dialect.call))
      return () => limit
    }
    // Checked now, under a stand-in name, so that a mistake fails at start-up.
    compileRoute(dialect.call, config, defaults, dialect, `${dialect.call}: `, dialect.call)
    return routeLimits(config)
  }
  /**
   * A route's limit: per route object, then per method (a route of several
   * methods serves each), a map read after the first request; a new name is
   * compiled and registered once.
   */
  function routeLimits (config: unknown): LimitOf<Req> {
    const byName = new Map<string, RouteLimit<Req>>()
    const byRoute = new WeakMap<object, Map<string, RouteLimit<Req>>>()
    return (request, self) => {
      const route = routes.route(request, self)
      let methods = byRoute.get(route)
      if (methods === undefined) {
        methods = new Map()
        byRoute.set(route, methods)
      }
      const method = routes.method(request)
      let limit = methods.get(method)
      if (limit === undefined) {
        const name = routes.name(request, route)
        limit = byName.get(name)
        if (limit === undefined) {
          if (byName.size >= MAX_NAMES) throw badInput(`Rate limit of ${name}: this limit() serves ${MAX_NAMES} routes and methods already: give it a \`bucket\``)
          limit = register(compileRoute(name, config, defaults, dialect))
          byName.set(name, limit)
        }
        methods.set(method, limit)
      }
      return limit
    }
  }
  function wide (): LimitOf<Req> {
    // Checked first as the whole app's limit, so that options that are no complete policy are named as `app.use(limit)`'s.
    compileRoute(APP_BUCKET, undefined, defaults, dialect, 'app.use(limit): ', 'app.use(limit)')
    return compile(undefined)
  }
  return { compile, wide }
}

/**
 * The bucket name of a declaration for every method at `patterns` (`app.all`,
 * a middleware mounted with `use`): APP_BUCKET on the whole app, else
 * `ALL <patterns>` (see the top of this file).
 */
export function everyMethod (patterns: readonly string[]): string {
  return patterns.every((p) => p === '*' || p === '/*') ? APP_BUCKET : `ALL ${patterns.join(',')}`
}

/** An object literal (a request, a class instance are not policies). */
function isPlainObject (value: unknown): boolean {
  if (!isRecord(value)) return false
  const proto: unknown = Object.getPrototypeOf(value)
  return proto === Object.prototype || proto === null
}

/** The bucket a policy names for itself (the first policy's, or the options'), if any. */
function namedBucket (config: unknown, defaults: Defaults): string | undefined {
  const first: unknown = Array.isArray(config) ? config[0] : config
  // A name only: compileRoute parses the policy right after and refuses a bucket that is not a string.
  return (isRecord(first) ? first.bucket as string | undefined : undefined) ?? defaults.bucket as string | undefined
}

/** A 500 for the framework's error handling: a `key` or `cost` that failed, a bucket that cannot be named. */
export function badInput (message: string): Error {
  const err = new Error(message)
  Object.defineProperties(err, {
    code: { value: 'TOLLGATE_BAD_INPUT', enumerable: true },
    status: { value: 500, enumerable: true },
    statusCode: { value: 500, enumerable: true }
  })
  return err
}
