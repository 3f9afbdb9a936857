// `tollgate/hono`: the Fastify plugin's limits as Hono middleware, for Hono
// on Node (@hono/node-server), on the same core and request layer
// (lib/http/), so the same options, Redis keys, headers and bodies.
//
// Buckets. Inside a route, a middleware's bucket is `<METHOD> <route
// pattern>` of the route it is declared on, as Hono matched it
// (`matchedRoutes(c)[c.req.routeIndex]`: the declared path, with the
// `basePath` and `app.route()` prefixes Hono merged into it), never the
// URL: Hono decodes the path before matching, so `/items/%31` and
// `/items/1` are one bucket, and an app that matches case-insensitively
// (its own `getPath`) makes one bucket of `/Items/1` and `/items/1`. A
// route declared for every method (`app.all`, `app.use(path, ...)`: Hono
// keeps both as method ALL) is one bucket, `ALL /api/*`, and APP_BUCKET on
// the whole app (`*`, `/*`). `limit` used as a middleware itself is
// `limit()`: the options' own policy, named the same way (`app.use(limit)`:
// APP_BUCKET), compiled on its first request; `limit(c, next)`, Hono's
// call, is told from `limit(policy)` by its second argument, a function. A
// limit met twice by one request spends once (lib/http/sharing.ts).
//
// A client gone. A request whose client disconnected while it waited in
// tollgate (the start-up wait, the store, `maxWaitMs`) is dropped when its
// decision arrives, as on Express: its handler does not run, and it gets an
// empty 499 that no client reads. Tokens it spent stay spent: they were
// reserved when the wait began, as on Express. The Node request's abort
// signal (`c.req.raw.signal`, which @hono/node-server aborts when the
// connection closes early) tells it.
//
// The client. The socket's peer, from @hono/node-server's `getConnInfo`,
// or with `trustProxy` the address a trusted proxy appended to
// X-Forwarded-For (lib/http/proxy.ts; Express's 'trust proxy' values).
// Without the Node server (`app.request()` in tests), a request has no
// address and shares NO_ADDRESS, with one warning.
//
// Headers. They are set on the context (`c.header`) before the handler
// runs, so that Hono puts them on the response it makes (`c.json()`,
// `c.text()`), at no cost beyond the header; a handler that returns a
// Response it built itself gets them written onto it afterwards (one
// header looked up tells which). The decision is `c.get('rateLimit')`.
//
// Settlement. A request that reserved settles when it ends: its response
// finished (the Node response's 'finish'), or its client gone (the Node
// response closed unfinished), or, off the Node server, once the
// handler's response is made (lib/http/holds.ts).
//
// The instance, `limit`, the start-up wait, the request path and the
// shutdown are the middleware adapters' (lib/http/middleware.ts;
// docs/guides/hono.md, "Shutdown (Hono)"); this file gives Hono's hooks.

import type { ServerResponse } from 'node:http'
import { getConnInfo } from '@hono/node-server/conninfo'
import type { Context, MiddlewareHandler, Next } from 'hono'
import { matchedRoutes } from 'hono/route'
import { outageSummaryMs, warningOn, warnings } from '../../core/options.js'
import { RateLimitError, type Programmatic } from '../../http/instance.js'
import type { Identity } from '../../http/kit.js'
import { whenEnded, type EndKind } from '../../http/holds.js'
import { middlewareInstance, type MiddlewareHooks } from '../../http/middleware.js'
import { clientAddress, compileTrust, trustProxyOption, trustsAll, type Trust, type TrustProxy } from '../../http/proxy.js'
import { APP_BUCKET, MAX_NAMES, badInput, everyMethod, honoHandler, middlewareDialect, registry, type Routes } from '../../http/registry.js'
import { BAD_INPUT, answer, lastShown, type Decided } from '../../http/request.js'
import { POLICY_CHECKS, routeName } from '../../http/route.js'
import { LOGGER_CHECK, STORE_CHECKS } from '../../http/setup.js'
import type { HandledPolicy, InstanceOptions, MiddlewareFields, ProgrammaticFields, RequestCost } from '../../http/types.js'
import type { Decision, Logger } from '../../core/types.js'

export { APP_BUCKET, MAX_NAMES, RateLimitError }
export type { TrustProxy }

/** What tollgate puts in a request's context: `c.get('rateLimit')`, undefined when no limit applied. */
export interface RateLimitVariables {
  rateLimit: Decision | undefined
}

/** The Env of tollgate's middleware: `new Hono<RateLimitEnv>()` types `c.get('rateLimit')` app-wide. */
export interface RateLimitEnv {
  Variables: RateLimitVariables
}

/** A `cost` function of a Hono context. */
export type HonoCostFunction = RequestCost<Context>

/**
 * A limit as `rateLimit()` and `limit()` take it; `limit()`'s values merge
 * over `rateLimit()`'s. Its `settle(c)` reads the response from `c.res`.
 */
export interface HonoPolicy extends HandledPolicy<Context, [c: Context], HonoDeniedHandler> {}

/**
 * Answers a denied request instead of tollgate, after the rate-limit
 * headers and Retry-After are set on `c`: `(c, err) => c.json({ message:
 * err.message }, err.status)`. It may be async.
 */
export type HonoDeniedHandler = (c: Context, error: RateLimitError) => Response | Promise<Response>

/** The options of `rateLimit()`. */
export interface HonoOptions extends InstanceOptions<HonoPolicy, MiddlewareFields> {
  /**
   * Which proxies in front of the app to believe (default false: the
   * client is the socket's peer): Express's 'trust proxy' values
   * (docs/guides/proxies.md, docs/guides/hono.md "How it maps onto Express's").
   */
  trustProxy?: TrustProxy | undefined
}

/** A policy of `limit.consume` / `peek`: it names its bucket; its cost is a number. */
export interface HonoProgrammaticPolicy extends ProgrammaticFields {}

/** What `rateLimit()` returns: a function making middleware, itself the app-wide middleware, and the programmatic API. */
export interface RateLimit extends Programmatic<HonoProgrammaticPolicy> {
  /** A middleware with this policy (merged over the options), or the options' own. */
  (policy?: HonoPolicy | readonly HonoPolicy[]): MiddlewareHandler<RateLimitEnv>
  /** `app.use(limit)`: the whole app, one bucket per client, APP_BUCKET unless the options name a `bucket`. */
  (c: Context, next: Next): Promise<Response | undefined>
}

const OPTION_CHECKS = { ...POLICY_CHECKS, ...STORE_CHECKS, trustProxy: trustProxyOption, handler: honoHandler, logger: LOGGER_CHECK, warnings, outageSummaryMs }

/**
 * The route a middleware is declared on, as Hono matched it: Hono gives
 * matchedRoutes() without a type for its entries, and routeIndex is the
 * running handler's, always in range.
 */
interface MatchedRoute { method: string, path: string }

const ROUTES: Routes<Context, MatchedRoute> = {
  route: (c) => matchedRoutes(c)[c.req.routeIndex] as MatchedRoute,
  method: (c) => c.req.method,
  name: (_c, { method, path }) => method === 'ALL' ? everyMethod([path]) : routeName(method, path)
}

/** The status of a request whose client has gone (no client reads it): "client closed request", as proxies log it. */
const CLIENT_GONE = 499

function setHeader (c: Context, name: string, value: string | number): void {
  c.header(name, String(value))
}

/**
 * After the handler: a Response it built itself does not carry the
 * context's headers (Hono merges them only into the responses it makes),
 * so they are written again onto it, when the last one written before is
 * missing (see the top of this file); undefined when none was written.
 */
function rewriter (c: Context, decided: Decided<Context>, closing: () => boolean): (() => void) | undefined {
  const shown = lastShown(decided)
  if (shown === undefined) return undefined
  return () => {
    if (c.res.headers.get(shown) !== null) return
    answer(decided, c, setHeader)
    if (closing()) c.header('connection', 'close')
  }
}

/** Hono's side of the request path: the context is the request, its abort signal tells a client gone. */
const HOOKS: MiddlewareHooks<Context, Context, Next, Response | undefined, HonoDeniedHandler, Parameters<MiddlewareHandler<RateLimitEnv>>> = {
  request: (c) => c,
  answered: (c) => c.req.raw.signal.aborted,
  dropsUndecided: false,
  setHeader,
  show: (c, decision) => { c.set('rateLimit', decision) },
  onEnd: (c, then) => {
    const outgoing = nodeResponse(c)
    const end = (how: EndKind): void => { then({ how, response: c.res }) }
    // Off the Node server the handler's return is the end: the response is made, or the request was aborted.
    if (outgoing === undefined) end(c.req.raw.signal.aborted ? 'gone' : 'finished')
    else whenEnded(outgoing, end)
  },
  pass: async (c, next, listen, decided, closing) => {
    const rewrite = decided === undefined ? undefined : rewriter(c, decided, closing)
    // On the Node server the end is the response's, listened for before the
    // handler runs: a client that leaves mid-handler releases what its
    // request holds at once (a concurrency slot, SPEC 13). Off it, the end
    // is the handler's return.
    const early = nodeResponse(c) !== undefined
    if (early) listen?.()
    await next()
    rewrite?.()
    if (!early) listen?.()
    return undefined
  },
  drop: () => new Response(null, { status: CLIENT_GONE }),
  handle: async (c, _next, handler, error) => await handler(c, error),
  send: (c, denial, body, type) => c.body(body, denial.statusCode, { 'content-type': type }),
  fail: (_next, err) => { throw err },
  wrap: (run) => async function tollgate (c, next) { return await run(c, next, tollgate) },
  // Hono's call (c, next), at the types the overloads of RateLimit state.
  isCall: (args): args is Parameters<MiddlewareHandler<RateLimitEnv>> => typeof args[1] === 'function'
}

/** The Node server's objects of a request, when it came through @hono/node-server. */
interface NodeBindings { incoming?: unknown, outgoing?: ServerResponse, server?: NodeBindings }

function bindings (c: Context): NodeBindings | undefined {
  // Hono types env per app; @hono/node-server fills it with these bindings.
  const env = c.env as NodeBindings | undefined
  return env?.server ?? env
}

function nodeResponse (c: Context): ServerResponse | undefined {
  return bindings(c)?.outgoing
}

/** The client's address: the socket's peer, or past the trusted proxies; undefined off the Node server. */
function address (c: Context, trust: Trust | undefined): string | undefined {
  if (bindings(c)?.incoming === undefined) return undefined
  const peer = getConnInfo(c).remote.address
  return trust === undefined ? peer : clientAddress(peer, c.req.header('x-forwarded-for'), trust)
}

/**
 * Hono's request identity, with `trustProxy` compiled; a setting that
 * trusts every hop is told at once, the forwarding header (while no proxy
 * is trusted) on the first request that carries one.
 */
function identity (options: HonoOptions, log: Logger): Identity<Context> {
  const trust = compileTrust(options.trustProxy)
  if (trust !== undefined && warningOn(options.warnings, 'trustProxy') && trustsAll(trust)) {
    log.warn({}, 'tollgate: `trustProxy` trusts every address at every hop, so the client is whatever a client writes first in X-Forwarded-For, and a client that changes it gets a fresh bucket on every request; trust only your proxies (`trustProxy: \'loopback\'`, see "Behind a proxy" in tollgate\'s README), or give a `key` function (`warnings: { trustProxy: false }` silences this)')
  }
  return {
    ip: (c) => address(c, trust),
    logOf: () => log,
    refused: () => badInput(BAD_INPUT.message),
    noAddress: { where: 'off @hono/node-server, or on a Unix socket', behindProxy: "set `trustProxy` so that the proxy's X-Forwarded-For is read" },
    proxy: trust !== undefined
      ? undefined
      : {
          trustsNone: () => true,
          header: (c, name) => c.req.header(name),
          untrusted: (header) => `tollgate: a request carries ${header} but \`trustProxy\` trusts no proxy, so every client behind the proxy shares the proxy's bucket; set \`trustProxy\`, or a \`key\` function (\`warnings: { proxy: false }\` silences this)`,
          showsIp: false
        }
  }
}

/** Creates the limiter of one Hono app: validates `options` and returns `limit`. */
export function rateLimit (options: HonoOptions): RateLimit {
  const limit = middlewareInstance<Context, Context, Next, Response | undefined, HonoDeniedHandler, Parameters<MiddlewareHandler<RateLimitEnv>>, HonoProgrammaticPolicy>(options, {
    adapter: 'hono',
    checks: OPTION_CHECKS,
    identity: (log) => identity(options, log),
    limits: (defaults, _log, claim) => registry(defaults, ROUTES, middlewareDialect('hono'), claim),
    hooks: HOOKS
  })
  // `limit` answers both call shapes of RateLimit (lib/http/middleware.ts).
  return limit as RateLimit
}
