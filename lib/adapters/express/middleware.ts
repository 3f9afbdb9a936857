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
// The instance, `limit`, the start-up wait and the request path are the
// middleware adapters' (lib/http/middleware.ts); this file gives Express's
// hooks. `limit` itself is `limit()` (lib/http/middleware.ts): Express's
// call `limit(req, res, next)` is told from `limit(policy)` by its third
// argument, a function; a value that is no policy (a request, a string)
// fails when `limit(value)` is called.
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
// is still settled once the response is finished, or at once when its
// client is gone (the response closes unfinished; lib/http/holds.ts). Its waiter slot is held
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
import { RateLimitError, type Programmatic } from '../../http/instance.js'
import { APP_BUCKET, MAX_NAMES, registry } from './limits.js'
import { RoutePatterns } from './routes.js'
import { isFunction, outageSummaryMs, warnings } from '../../core/options.js'
import { BAD_INPUT } from '../../http/request.js'
import { whenEnded } from '../../http/holds.js'
import { badInput } from '../../http/registry.js'
import { trustsAll, type Trust } from '../../http/proxy.js'
import type { Identity } from '../../http/kit.js'
import { middlewareInstance, type MiddlewareHooks } from '../../http/middleware.js'
import { LOGGER_CHECK, STORE_CHECKS } from '../../http/setup.js'
import { POLICY_CHECKS } from '../../http/route.js'
import type { HandledPolicy, InstanceOptions, MiddlewareFields, ProgrammaticFields, RequestCost } from '../../http/types.js'
import type { Decision, Logger } from '../../core/types.js'

export { APP_BUCKET, MAX_NAMES, RateLimitError }

/** A `cost` function of an Express request. */
export type ExpressCostFunction = RequestCost<Request>

/** A limit as `rateLimit()` and `limit()` take it; `limit()`'s values merge over `rateLimit()`'s. */
export interface ExpressPolicy extends HandledPolicy<Request, [req: Request, res: Response], DeniedHandler> {}

/**
 * Answers a denied request instead of tollgate: `(req, res, next, err) =>
 * next(err)` hands it to Express's error handler. It may be async: a
 * rejection goes to `next(err)`, as a throw does.
 */
export type DeniedHandler = (req: Request, res: Response, next: NextFunction, error: RateLimitError) => void | Promise<void>

/**
 * The options of `rateLimit()`. Its `warnings`: `proxy`, a forwarding
 * header while Express trusts no proxy; `trustProxy`, a 'trust proxy' that
 * trusts every address at every hop.
 */
export interface ExpressOptions extends InstanceOptions<ExpressPolicy, MiddlewareFields> {}

/** A policy of `limit.consume` / `peek`: it names its bucket; its cost is a number. */
export interface ExpressProgrammaticPolicy extends ProgrammaticFields {}

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

const OPTION_CHECKS = { ...POLICY_CHECKS, ...STORE_CHECKS, handler: isFunction, logger: LOGGER_CHECK, warnings, outageSummaryMs }

/** The response is sent, or its client has gone: no decision can reach it any more. */
function answered (res: Response): boolean {
  return res.headersSent || res.writableEnded || res.destroyed
}

/**
 * Express's side of the request path: the context is the response (its
 * `req` is the request). A request answered before its check starts is
 * dropped undecided (see the top of this file).
 */
const HOOKS: MiddlewareHooks<Request, Response, NextFunction, void, DeniedHandler, Parameters<RequestHandler>> = {
  request: (res) => res.req,
  answered,
  dropsUndecided: true,
  setHeader: (res, name, value) => { res.setHeader(name, value) },
  show: (res, decision) => { res.req.rateLimit = decision },
  onEnd: (res, then) => {
    whenEnded(res, (how) => { then({ how, response: res }) })
  },
  pass: (_res, next, listen) => {
    listen?.()
    next()
  },
  drop: () => undefined,
  handle: (res, next, handler, error) => {
    try {
      const done: unknown = handler(res.req, res, next, error)
      if (done instanceof Promise) done.catch(next)
    } catch (err) {
      next(err)
    }
  },
  send: (res, denial, body, type) => {
    res.statusCode = denial.statusCode
    res.setHeader('content-type', type)
    res.end(body)
  },
  fail: (next, err) => { next(err) },
  wrap: (run) => {
    const tollgate: RequestHandler = (_req, res, next) => { void run(res, next, tollgate) }
    return tollgate
  },
  // Express's call (req, res, next), at the types the overloads of RateLimit state.
  isCall: (args): args is Parameters<RequestHandler> => typeof args[2] === 'function'
}

/** Express's request identity and its words for the warnings. */
function identity (log: Logger): Identity<Request> {
  return {
    ip: (req) => req.ip,
    logOf: () => log,
    refused: () => badInput(BAD_INPUT.message),
    noAddress: { where: 'as on a Unix socket', behindProxy: "set Express's 'trust proxy' so that req.ip is the client's address" },
    proxy: {
      trustsNone: (req) => req.app.get('trust proxy') === false,
      header: (req, name) => req.headers[name],
      untrusted: (header) => `tollgate: a request carries ${header} but Express does not trust proxies, so every client behind the proxy shares the proxy's bucket; set Express's 'trust proxy', or a \`key\` function (\`warnings: { proxy: false }\` silences this)`,
      everyHop: {
        // Express compiles its 'trust proxy' setting into this function; app.get returns any.
        trusts: (req) => trustsAll(req.app.get('trust proxy fn') as Trust),
        warning: "tollgate: Express's 'trust proxy' trusts every address at every hop (`app.set('trust proxy', true)`), so req.ip is whatever a client writes first in X-Forwarded-For, and a client that changes it gets a fresh bucket on every request; trust only your proxies (`app.set('trust proxy', 'loopback')`, see \"Behind a proxy\" in tollgate's README), or give a `key` function (`warnings: { trustProxy: false }` silences this)"
      },
      showsIp: true
    }
  }
}

/** Creates the limiter of one Express app: validates `options` and returns `limit`. */
export function rateLimit (options: ExpressOptions): RateLimit {
  const limit = middlewareInstance<Request, Response, NextFunction, void, DeniedHandler, Parameters<RequestHandler>, ExpressProgrammaticPolicy>(options, {
    adapter: 'express',
    checks: OPTION_CHECKS,
    identity,
    limits: (defaults, log, claim) => registry(defaults, new RoutePatterns((pattern) => {
      log.warn({ pattern }, `tollgate: no router of the app holds the route ${pattern} (a router called from a function, or a sub-app mounted with router.use(), is hidden from tollgate), so its bucket is named from the sub-apps' mount paths and the route's own pattern; give its limit a \`bucket\` if the route is mounted elsewhere`)
    }), claim),
    hooks: HOOKS
  })
  // `limit` answers both call shapes of RateLimit (lib/http/middleware.ts).
  return limit as RateLimit
}
