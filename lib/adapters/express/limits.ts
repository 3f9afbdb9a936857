// The limits of one `rateLimit()` instance: each policy compiled once, and
// how a request finds its own (lib/adapters/express/middleware.ts is the middleware around it).
//
// Buckets. Inside a route, a middleware's bucket is `<METHOD> <mount path +
// route pattern>` (`GET /users/:id`), as declared: never `req.baseUrl`,
// which is the mount path as the client spelled it (`/API` for
// `app.use('/api', ...)`, `/orgs/acme` for `/orgs/:org`). Express does not
// tell a middleware where it is mounted, so lib/adapters/express/routes.ts finds the
// declaration once per route object; here the limit is kept per route
// object and method, so that a request after the first one of its route
// costs two map reads. A client can make no new name: the names of one
// middleware are its routes times the methods they serve (only methods
// Node's HTTP parser knows), and past MAX_NAMES, a declaration's matter, it
// refuses (a 500 asking for a `bucket`). Outside a route (`app.use`,
// `router.use`) there is no pattern: the policy must name its `bucket`, and
// a policy that names one is compiled once, when `limit()` is called. The
// app-wide middleware (`app.use(limit)`) is the options' own policy, named
// APP_BUCKET unless the options name a `bucket`.
//
// One bucket, one policy: every policy a `rateLimit()` instance compiles is
// registered by bucket name, and a second policy with the same bucket but
// another capacity or rate is refused, at `limit()` time when the bucket is
// named there, else on the first request (a 500 naming both). Two
// instances, or a Fastify server, naming the same bucket are not seen: the
// bucket then follows whichever capacity each call sends, as in Fastify.

import type { Request } from 'express'
import { optionError } from '../../core/errors.js'
import type { RoutePatterns } from './routes.js'
import { isRecord } from '../../core/options.js'
import { POLICY_CHECKS, ROUTE_WIDE, compileRoute, routeName, type Defaults, type Dialect, type RouteLimit } from '../../http/route.js'

/** Distinct route names one middleware compiles before it refuses (see the top of this file). */
export const MAX_NAMES = 1000
/** The bucket of `app.use(limit)`, unless the options name one (see the top of this file). */
export const APP_BUCKET = 'app'

/** How a request finds its compiled limit. */
export type LimitOf = (req: Request) => RouteLimit<Request>

const EXPRESS: Dialect = { checks: POLICY_CHECKS, wide: ROUTE_WIDE, hint: 'set it in rateLimit() or limit()', adapter: 'express' }

/**
 * `limit(policy)` for one `rateLimit()` instance: checks the policy at once,
 * and returns how a request finds its compiled limit; `appWide` compiles
 * the limit of `app.use(limit)`. Every compiled policy is registered by
 * bucket (see the top of this file).
 */
export function registry (defaults: Defaults, patterns: RoutePatterns): {
  compile: (config: unknown) => LimitOf
  appWide: () => RouteLimit<Request>
} {
  const buckets = new Map<string, { capacity: number, refillPerSecond: number, where: string }>()
  function register (limit: RouteLimit<Request>): RouteLimit<Request> {
    for (const p of limit.policies) {
      const seen = buckets.get(p.bucket)
      if (seen === undefined) buckets.set(p.bucket, { capacity: p.capacity, refillPerSecond: p.refillPerSecond, where: limit.name })
      else if (seen.capacity !== p.capacity || seen.refillPerSecond !== p.refillPerSecond) {
        throw optionError(`limit() of ${limit.name}: bucket`, p.bucket, `a bucket name with one policy: ${seen.where} gives it capacity ${seen.capacity} and refillPerSecond ${seen.refillPerSecond}, this one ${p.capacity} and ${p.refillPerSecond} (name another bucket)`)
      }
    }
    return limit
  }
  function compile (config: unknown): LimitOf {
    if (config !== undefined && !isPlainObject(config) && !Array.isArray(config)) {
      throw optionError('limit()', config, 'a policy, a non-empty array of policies, or nothing (to limit the whole app per client, pass the limiter itself: `app.use(limit)`)')
    }
    const named = namedBucket(config, defaults)
    if (named !== undefined) {
      const limit = register(compileRoute(named, config, defaults, EXPRESS, 'limit(): ', 'limit()'))
      return () => limit
    }
    // Checked now, under a stand-in name, so that a mistake fails at start-up.
    compileRoute('limit()', config, defaults, EXPRESS, 'limit(): ', 'limit()')
    return routeLimits(config)
  }
  /**
   * A route's limit: per route object, then per method (a route of `all()`
   * serves several), a map read after the first request; a new name is
   * compiled and registered once.
   */
  function routeLimits (config: unknown): LimitOf {
    const byName = new Map<string, RouteLimit<Request>>()
    const byRoute = new WeakMap<object, Map<string, RouteLimit<Request>>>()
    return (req) => {
      const route: unknown = req.route
      if (typeof route !== 'object' || route === null) {
        throw badInput('Rate limit outside a route (app.use, router.use) has no route pattern to name its bucket: give the policy a `bucket`')
      }
      let methods = byRoute.get(route)
      if (methods === undefined) {
        methods = new Map()
        byRoute.set(route, methods)
      }
      let limit = methods.get(req.method)
      if (limit === undefined) {
        const name = routeName(req.method, patterns.of(req.app, route))
        limit = byName.get(name)
        if (limit === undefined) {
          if (byName.size >= MAX_NAMES) throw badInput(`Rate limit of ${name}: this limit() serves ${MAX_NAMES} routes and methods already: give it a \`bucket\``)
          limit = register(compileRoute(name, config, defaults, EXPRESS, `limit() of ${name}: `))
          byName.set(name, limit)
        }
        methods.set(req.method, limit)
      }
      return limit
    }
  }
  const appWide = (): RouteLimit<Request> => register(compileRoute(APP_BUCKET, undefined, defaults, EXPRESS, 'app.use(limit): ', 'app.use(limit)'))
  return { compile, appWide }
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
  return (isRecord(first) ? first.bucket as string | undefined : undefined) ?? defaults.bucket as string | undefined
}

/** A 500 for Express's error handler: a `key` or `cost` that failed, a bucket that cannot be named. */
export function badInput (message: string): Error {
  const err = new Error(message)
  Object.defineProperties(err, {
    code: { value: 'TOLLGATE_BAD_INPUT', enumerable: true },
    status: { value: 500, enumerable: true },
    statusCode: { value: 500, enumerable: true }
  })
  return err
}
