// `tollgate/express`: the Fastify plugin's limits as Express middleware,
// for Express 5 and 4, on the same core (lib/http/request.ts), so the same
// options, Redis keys, headers and bodies.
//
// Buckets. Inside a route, a middleware's bucket is `<METHOD> <mount path +
// route pattern>` (`GET /users/:id`) as declared, never as the URL spells
// it (`ALL <pattern>` for `app.all`); outside a route, `ALL <mount path>/*`
// (APP_BUCKET on the whole app); a bucket has one policy per `rateLimit()`
// instance, and a limit met twice by one request spends once
// (lib/http/registry.ts, lib/http/sharing.ts). lib/adapters/express/limits.ts
// compiles and registers the limits, lib/adapters/express/routes.ts finds
// where a route or a mount is declared.
//
// `limit` itself. `rateLimit()` returns `limit`, which is a middleware too,
// as express-rate-limit users write it: `limit` is `limit()`, the options'
// own policy named where it is declared (`app.use(limit)`: APP_BUCKET),
// compiled on its first request (the options of a limiter used only with
// policies need no capacity). So Express's call `limit(req, res, next)` is
// told from `limit(policy)` by its third argument, a function; a value that
// is no policy (a request, a string) fails when `limit(value)` is called.
//
// Start-up. `rateLimit()` cannot be awaited, so the wait the plugin does at
// registration (for the client to be ready and the scripts loaded, bounded)
// starts there, and requests that arrive before it ends wait for it.
//
// Late answers. A request waits in tollgate (the start-up wait, the store,
// `maxWaitMs`) while the app may answer it anyway (a timeout middleware's
// 503; an earlier middleware that answered and still called `next()`) or
// its client may go away. Writing headers then would throw
// ERR_HTTP_HEADERS_SENT in a promise callback, out of Express's reach: an
// unhandled rejection, which ends the process. So a request whose response
// is sent, or whose client has gone (`res.destroyed`), when tollgate gets
// to it or when its decision arrives, is dropped: no headers, no answer,
// no `next()` (the handler does not run for an answered request). Tokens it
// spent stay spent (the cost of a request that was answered); a reservation
// is still settled once the response is finished. Its waiter slot is held
// to the end of its wait: the tokens were reserved when the wait began, so
// freeing the slot early would change no bucket, and the wait is bounded by
// `maxWaitMs`. Errors still go to `next(err)`, Express's error handling
// (which closes the connection of a response already sent), and an async
// `handler`'s rejection does too.
//
// Shutdown. `limit.close()` ends every wait at once: the held requests are
// answered as denied, so `server.close()` is not held for up to
// `maxWaitMs`; and every answer tollgate gives from then on says
// `Connection: close`, since server.close() waits for keep-alive
// connections that were busy when it was called (docs/guides/express.md,
// "Shutdown (Express)").

import type { NextFunction, Request, RequestHandler, Response } from 'express'
import { optionError } from '../../core/errors.js'
import { CONSOLE, RateLimitError, logger, programmatic, startGate, startUp, type Programmatic } from '../../http/instance.js'
import { APP_BUCKET, MAX_NAMES, badInput, registry, refuser, type LimitOf } from './limits.js'
import { bucketOwner, firstTime } from '../../http/sharing.js'
import { RoutePatterns } from './routes.js'
import type { HeaderValue } from '../../http/headers.js'
import { parseFields, isFunction, isRecord, outageSummaryMs, warningOn, warnings } from '../../core/options.js'
import { NO_ADDRESS, RequestLayer, answer, denialBody, type Decided, type Denial } from '../../http/request.js'
import { PROBE_HOPS, STORE_CHECKS, adapterCore, trustsEveryHop } from '../../http/setup.js'
import { takeReservation, type Pending } from '../../http/settle-route.js'
import type { Tier } from '../../http/tiers.js'
import { POLICY_CHECKS, checkDefaults, type Defaults, type RouteLimit } from '../../http/route.js'
import type { BreakerOptions, Decision, FailureMode, LocalPolicy, Lockout, Logger, MetricsOptions, RedisClient } from '../../core/types.js'

export { APP_BUCKET, MAX_NAMES, RateLimitError }

/**
 * A `cost` function. The functions of a policy are declared as methods, so
 * that their parameter is checked bivariantly: a function written for a
 * route's own `Request<Params>` fits.
 */
export type ExpressCostFunction = {
  cost (req: Request): number | Promise<number>
}['cost']

/** A limit as `rateLimit()` and `limit()` take it; `limit()`'s values merge over `rateLimit()`'s. */
export interface ExpressPolicy {
  /** Largest burst, in tokens. */
  capacity?: number | undefined
  /** Tokens added per second. */
  refillPerSecond?: number | undefined
  /** Tokens this request costs (default 1); a function may read the request. */
  cost?: number | ExpressCostFunction | undefined
  /** What the limit does when the store fails or misses its deadline. */
  failureMode?: FailureMode | undefined
  /** The in-process limit used by failureMode 'local'. */
  local?: LocalPolicy | undefined
  /** Client identity (default: `req.ip`, IPv6 reduced to its subnet). */
  key?(req: Request): string | Promise<string>
  /** Bucket name: required outside a route; default `<METHOD> <route pattern>`. */
  bucket?: string | undefined
  /** Deadline for one store decision, ms (default 10). */
  timeout?: number | undefined
  /** Which rate-limit headers to send (default 'draft-6'). */
  headers?: 'draft-6' | 'draft-10' | 'legacy' | false | undefined
  /** Requests for which it returns true skip the limiter. */
  allow?(req: Request): boolean | Promise<boolean>
  /** Opt-in token leases: take `tokens` at a time, give unspent ones back after `maxAgeMs`. */
  lease?: { tokens: number, maxAgeMs: number } | undefined
  /**
   * The client's plan, per request: `{ capacity, refillPerSecond }` over
   * this policy, or false for no limit. Each returned object is validated
   * once: return the same objects (`PLANS[user.plan]`).
   */
  limit?(req: Request): Tier | false | Promise<Tier | false>
  /**
   * Charging by outcome: the request reserves `cost`, and once the response
   * is finished this gives the actual cost (0: free); the difference is
   * refunded or charged. One per route.
   */
  settle?(req: Request, res: Response): number | Promise<number>
  /** Shadow mode: decided and counted as usual, never refuses. */
  shadow?: boolean | undefined
  /** Block the client for `forMs` after `after` denials within `withinMs` of the first. Single-policy limits only. */
  lockout?: Lockout | undefined
  /** Wait up to this many ms for the tokens (reserved at once) instead of a 429. Single-policy limits only. */
  maxWaitMs?: number | undefined
  /** Answers this limit's denied requests (default: the options' `handler`, else tollgate sends the 429 or 503 JSON body). One per route. */
  handler?: DeniedHandler | undefined
}

/**
 * Answers a denied request instead of tollgate: `(req, res, next, err) =>
 * next(err)` hands it to Express's error handler. It may be async: a
 * rejection goes to `next(err)`, as a throw does.
 */
export type DeniedHandler = (req: Request, res: Response, next: NextFunction, error: RateLimitError) => void | Promise<void>

/** The options of `rateLimit()`. */
export interface ExpressOptions extends ExpressPolicy {
  /** Shared store: an ioredis or iovalkey Redis or Cluster, a node-redis client or cluster, a GLIDE client; omitted, an in-process store. Never closed. */
  redis?: RedisClient | undefined
  /** Required: there is deliberately no default. */
  failureMode: FailureMode
  /** Redis key prefix (default 'tollgate'). */
  prefix?: string | undefined
  /**
   * The secret of the keys' hash tags, the same on every server of the fleet
   * (at least 16 characters); default: a random one kept in Redis
   * (docs/reference/keys.md).
   */
  keySecret?: string | undefined
  /** IPv6 clients are keyed by this prefix length (default 56). */
  ipv6Subnet?: number | undefined
  /** Circuit breaker (default { failures: 5, cooldownMs: 1000 }). */
  breaker?: Partial<BreakerOptions> | undefined
  /** Deny locally while a denied bucket cannot afford the cost yet (default on, { maxKeys: 10000 }). */
  denialCache?: { maxKeys?: number | undefined, maxAgeMs?: number | undefined } | false | undefined
  /**
   * Plain decisions asked in one turn of the event loop go to Redis as one
   * script call (on a Cluster, per set of keys), of at most `maxDecisions` (default 64,
   * from 2 to 1024); `false` sends each decision in a call of its own.
   */
  batch?: { maxDecisions?: number | undefined } | false | undefined
  /** OpenTelemetry metrics, off unless set: `{ meter }` (docs/reference/metrics.md). */
  metrics?: MetricsOptions | undefined
  /** Most requests waiting for reserved tokens at once in this process (default 1000); past it, they do not wait. */
  maxWaiters?: number | undefined
  /** Where warnings and store state changes go (default: the console). */
  logger?: Logger | undefined
  /**
   * Configuration warnings (default on): `proxy`, a forwarding header while
   * Express trusts no proxy; `trustProxy`, a 'trust proxy' that trusts every
   * address at every hop. `false` silences both.
   */
  warnings?: { proxy?: boolean | undefined, trustProxy?: boolean | undefined } | false | undefined
  /** While the store fails, one summary line per this many ms at most (default 30000, from 1000 to 3600000). */
  outageSummaryMs?: number | undefined
}

/** A policy of `limit.consume` / `peek`: it names its bucket; its cost is a number. */
export interface ExpressProgrammaticPolicy extends Omit<ExpressPolicy, 'cost' | 'key' | 'allow' | 'headers' | 'limit' | 'settle' | 'handler'> {
  bucket: string
  cost?: number | undefined
}

/** What `rateLimit()` returns: a function making middleware, itself the app-wide middleware, and the programmatic API. */
export interface RateLimit extends Programmatic<ExpressProgrammaticPolicy> {
  /** A middleware with this policy (merged over the options), or the options' own. */
  (policy?: ExpressPolicy | readonly ExpressPolicy[]): RequestHandler
  /** `app.use(limit)`: the whole app, one bucket per client, APP_BUCKET unless the options name a `bucket`. */
  (req: Request, res: Response, next: NextFunction): void
}

declare global {
  namespace Express {
    interface Request {
      /** The decision of the last tollgate middleware this request passed; undefined when none applied. */
      rateLimit?: Decision | undefined
    }
  }
}

const OPTION_CHECKS = { ...POLICY_CHECKS, ...STORE_CHECKS, handler: isFunction, logger, warnings, outageSummaryMs }

/** Creates the limiter of one Express app: validates `options` and returns `limit`. */
export function rateLimit (options: ExpressOptions): RateLimit {
  const input: unknown = options
  if (!isRecord(input)) throw optionError('options', input, 'an object')
  const defaults: Defaults = parseFields(input, OPTION_CHECKS, '', { failureMode: "one of 'open', 'closed', 'local' (there is no default: choose per limit)" }, 'express')
  checkDefaults(defaults, '')
  const log = options.logger ?? CONSOLE
  const core = adapterCore(options, log)
  const ready = startUp(core, options.redis, log)
  const proxy = proxyWarnings(log, warningOn(options.warnings, 'proxy'), warningOn(options.warnings, 'trustProxy'))
  const layer = new RequestLayer<Request>(core, options.ipv6Subnet ?? 56, {
    ip: (req) => req.ip,
    onAddress: proxy,
    noAddress: () => { log.warn({}, `tollgate: a request came with no client address (as on a Unix socket): such requests share the client identity "${NO_ADDRESS}", one bucket for all of them. Behind a proxy, set Express's 'trust proxy' so that req.ip is the client's address; otherwise give a \`key\` function`) },
    badInput: (route, detail) => badInput(`Rate limit of ${route}: ${detail}`),
    refuse: refuser(log),
    settleFailed: (_req, err) => { log.error({ err }, 'tollgate: settle failed; the reservation stands') }
  })
  const patterns = new RoutePatterns((pattern) => {
    log.warn({ pattern }, `tollgate: no router of the app holds the route ${pattern} (a router called from a function, or a sub-app mounted with router.use(), is hidden from tollgate), so its bucket is named from the sub-apps' mount paths and the route's own pattern; give its limit a \`bucket\` if the route is mounted elsewhere`)
  })
  const prefix = options.prefix ?? 'tollgate'
  const owner = bucketOwner(prefix, log)
  const { compile, wide } = registry(defaults, patterns, owner.claim)
  const checks = checker(layer, ready, prefix)
  const limit = limitFunction(compile, wide, checks.middleware)
  return Object.assign(limit, programmatic<ExpressProgrammaticPolicy>(core, defaults, 'express', ready, () => { checks.closing(); owner.release() }))
}

type RateLimitFunction = ((policy?: ExpressPolicy | readonly ExpressPolicy[]) => RequestHandler) & RequestHandler

/** A middleware finding its limit with `limitOf`; `handle` is the function Express holds, when it is not the middleware itself. */
type Middleware = (limitOf: LimitOf, handle?: object) => RequestHandler

/**
 * The middleware of one `rateLimit()` instance for a way of finding a
 * request's limit: the start-up wait, the decision, the answer, and the
 * drop of a request already answered (see the top of this file).
 */
function checker (layer: RequestLayer<Request>, ready: Promise<void>, prefix: string): { middleware: Middleware, closing: () => void } {
  const starting = startGate(ready)
  let closing = false
  function middleware (limitOf: LimitOf, handle?: object): RequestHandler {
    const tollgate: RequestHandler = (req, res, next) => {
      const waiting = starting()
      if (waiting !== undefined) {
        void waiting.then(() => { check(limitOf, self, req, res, next) })
        return
      }
      check(limitOf, self, req, res, next)
    }
    // The function Express holds in its layer: `limit` itself, used as a middleware.
    const self = handle ?? tollgate
    return tollgate
  }
  /** One request's check; never throws. A limit this request met before passes it (lib/http/sharing.ts). */
  function check (limitOf: LimitOf, self: object, req: Request, res: Response, next: NextFunction): void {
    if (answered(res)) return
    let limit: RouteLimit<Request>
    try {
      limit = limitOf(req, self)
    } catch (err) {
      next(err)
      return
    }
    if (!firstTime(req, limit, prefix)) return next()
    layer.decide(limit, req).then((decided) => { conclude(decided, req, res, next) }).catch(next)
  }
  function conclude (decided: Decided<Request> | undefined, req: Request, res: Response, next: NextFunction): void {
    const pending = takeReservation(req)
    if (pending !== undefined) settleWhenFinished(pending, req, res)
    if (answered(res)) return
    // Shutting down: the connection is not kept alive after this answer, or
    // server.close() would wait for the client to drop it.
    if (closing) res.setHeader('connection', 'close')
    if (decided === undefined) return next()
    const { decision } = decided
    req.rateLimit = decision
    const denial = answer(decided.limit, decision, res, setHeader)
    if (denial === undefined) return next()
    // The route's `handler`, or the options': a function, as parsed (lib/http/registry.ts).
    deny(req, res, next, denial, decision, decided.limit.handler as DeniedHandler | undefined)
  }
  function settleWhenFinished (pending: Pending, req: Request, res: Response): void {
    const settle = (): void => { void layer.settle(pending, req, res) }
    if (res.writableFinished) settle()
    else res.once('finish', settle)
  }
  return { middleware, closing: () => { closing = true } }
}

/**
 * `limit`: `limit(policy?)` makes a middleware; Express's call
 * `limit(req, res, next)` (its third argument a function) is `limit()`,
 * compiled on its first request (see the top of this file).
 */
function limitFunction (compile: (config: unknown) => LimitOf, wide: () => LimitOf, middleware: Middleware): RateLimitFunction {
  let itself: RequestHandler | undefined
  function ownMiddleware (): RequestHandler {
    let limitOf: LimitOf
    try {
      limitOf = wide()
    } catch (err) {
      return (_req, _res, next) => { next(err) }
    }
    return middleware(limitOf, limit)
  }
  const limit = function limit (policy?: unknown, res?: unknown, next?: unknown): RequestHandler | undefined {
    // Called by Express as a middleware (req, res, next), whose types the
    // overloads of limit state; the arguments are taken at those types.
    if (typeof next === 'function') {
      itself ??= ownMiddleware()
      itself(policy as Request, res as Response, next as NextFunction)
      return undefined
    }
    return middleware(compile(policy))
  } as RateLimitFunction
  return limit
}

/** The response is sent, or its client has gone: no decision can reach it any more. */
function answered (res: Response): boolean {
  return res.headersSent || res.writableEnded || res.destroyed
}

function setHeader (res: Response, name: string, value: HeaderValue): void {
  res.setHeader(name, value)
}

/** Sends a denial: to the app's handler, else as the JSON body Fastify sends. */
function deny (req: Request, res: Response, next: NextFunction, denial: Denial, decision: Decision, handler: DeniedHandler | undefined): void {
  if (handler !== undefined) {
    try {
      const done: unknown = handler(req, res, next, new RateLimitError(denial, decision))
      if (done instanceof Promise) done.catch(next)
    } catch (err) {
      next(err)
    }
    return
  }
  res.statusCode = denial.statusCode
  res.setHeader('content-type', 'application/json; charset=utf-8')
  res.end(denialBody(denial))
}

/**
 * The proxy warnings, each once, then free; undefined when both are off.
 *
 * - `proxy`: without 'trust proxy', req.ip is the proxy's address: behind a
 *   proxy every client would share one bucket. A forwarding header on a
 *   request of an app that trusts no proxy is the sign.
 * - `trustProxy`: a 'trust proxy' that trusts every address at every hop
 *   (`true`) makes req.ip the leftmost X-Forwarded-For entry, which any
 *   client writes: a client that rotates it gets a fresh bucket per
 *   request. Express keeps the compiled setting as 'trust proxy fn'; it is
 *   asked about a made-up chain (trustsEveryHop).
 */
function proxyWarnings (log: Logger, proxy: boolean, trustAll: boolean): ((req: Request) => void) | undefined {
  if (!proxy && !trustAll) return undefined
  let forwarding = proxy
  let trusting = trustAll
  return (req) => {
    if (trusting) {
      trusting = false
      // Express compiles its 'trust proxy' setting into this function; app.get returns any.
      const trust = req.app.get('trust proxy fn') as (address: string, hop: number) => boolean
      if (trustsEveryHop(() => PROBE_HOPS.every((address, hop) => trust(address, hop)))) {
        log.warn({ ip: req.ip }, `tollgate: Express's 'trust proxy' trusts every address at every hop (\`app.set('trust proxy', true)\`), so req.ip is whatever a client writes first in X-Forwarded-For, and a client that changes it gets a fresh bucket on every request; trust only your proxies (\`app.set('trust proxy', 'loopback')\`, see "Behind a proxy" in tollgate's README), or give a \`key\` function (\`warnings: { trustProxy: false }\` silences this)`)
      }
    }
    if (!forwarding) return
    const header = req.headers['x-forwarded-for'] !== undefined ? 'X-Forwarded-For' : req.headers.forwarded !== undefined ? 'Forwarded' : undefined
    if (header === undefined || req.app.get('trust proxy') !== false) return
    forwarding = false
    log.warn({ header, ip: req.ip }, `tollgate: a request carries ${header} but Express does not trust proxies, so every client behind the proxy shares the proxy's bucket; set Express's 'trust proxy', or a \`key\` function (\`warnings: { proxy: false }\` silences this)`)
  }
}
