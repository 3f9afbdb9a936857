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
// Settlement. A request that reserved settles when its response is
// finished (the Node response's 'finish'), or, off the Node server, once
// the handler's response is made.
//
// Shutdown. `limit.close()` ends every wait at once: the held requests are
// answered as denied, so `server.close()` is not held for up to
// `maxWaitMs`; and every answer tollgate gives from then on says
// `Connection: close`, since server.close() waits for keep-alive
// connections that were busy when it was called (docs/guides/hono.md,
// "Shutdown (Hono)").

import type { ServerResponse } from 'node:http'
import { getConnInfo } from '@hono/node-server/conninfo'
import type { Context, MiddlewareHandler, Next } from 'hono'
import { matchedRoutes } from 'hono/route'
import { optionError } from '../../core/errors.js'
import { parseFields, isRecord, outageSummaryMs, warningOn, warnings } from '../../core/options.js'
import type { HeaderValue } from '../../http/headers.js'
import { CONSOLE, RateLimitError, logger, programmatic, startGate, startUp, type Programmatic } from '../../http/instance.js'
import { clientAddress, compileTrust, trustProxyOption, trustsAll, type Trust, type TrustProxy } from '../../http/proxy.js'
import { APP_BUCKET, MAX_NAMES, badInput, everyMethod, honoHandler, middlewareDialect, refuser, registry, type LimitOf, type Routes } from '../../http/registry.js'
import { bucketOwner, firstTime } from '../../http/sharing.js'
import { NO_ADDRESS, RequestLayer, answer, denialBody, type Decided, type Denial } from '../../http/request.js'
import { POLICY_CHECKS, checkDefaults, routeName, type Defaults } from '../../http/route.js'
import { STORE_CHECKS, adapterCore } from '../../http/setup.js'
import { takeReservation, type Pending } from '../../http/settle-route.js'
import type { Tier } from '../../http/tiers.js'
import type { BreakerOptions, Decision, FailureMode, LocalPolicy, Lockout, Logger, MetricsOptions, RedisClient } from '../../core/types.js'

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

/**
 * A `cost` function. The functions of a policy are declared as methods, so
 * that their parameter is checked bivariantly: a function written for a
 * route's own `Context<Env, Path>` fits.
 */
export type HonoCostFunction = {
  cost (c: Context): number | Promise<number>
}['cost']

/** A limit as `rateLimit()` and `limit()` take it; `limit()`'s values merge over `rateLimit()`'s. */
export interface HonoPolicy {
  /** Largest burst, in tokens. */
  capacity?: number | undefined
  /** Tokens added per second. */
  refillPerSecond?: number | undefined
  /** Tokens this request costs (default 1); a function may read the request. */
  cost?: number | HonoCostFunction | undefined
  /** What the limit does when the store fails or misses its deadline. */
  failureMode?: FailureMode | undefined
  /** The in-process limit used by failureMode 'local'. */
  local?: LocalPolicy | undefined
  /** Client identity (default: the client's address, IPv6 reduced to its subnet). */
  key?(c: Context): string | Promise<string>
  /** Bucket name: default `<METHOD> <route pattern>`; `APP_BUCKET` for `app.use(limit)`. */
  bucket?: string | undefined
  /** Deadline for one store decision, ms (default 10). */
  timeout?: number | undefined
  /** Which rate-limit headers to send (default 'draft-6'). */
  headers?: 'draft-6' | 'draft-10' | 'legacy' | false | undefined
  /** Requests for which it returns true skip the limiter. */
  allow?(c: Context): boolean | Promise<boolean>
  /** Opt-in token leases: take `tokens` at a time, give unspent ones back after `maxAgeMs`. */
  lease?: { tokens: number, maxAgeMs: number } | undefined
  /**
   * The client's plan, per request: `{ capacity, refillPerSecond }` over
   * this policy, or false for no limit. Each returned object is validated
   * once: return the same objects (`PLANS[user.plan]`).
   */
  limit?(c: Context): Tier | false | Promise<Tier | false>
  /**
   * Charging by outcome: the request reserves `cost`, and once the response
   * is finished this gives the actual cost (0: free) from `c.res`; the
   * difference is refunded or charged. One per route.
   */
  settle?(c: Context): number | Promise<number>
  /** Shadow mode: decided and counted as usual, never refuses. */
  shadow?: boolean | undefined
  /** Block the client for `forMs` after `after` denials within `withinMs` of the first. Single-policy limits only. */
  lockout?: Lockout | undefined
  /** Wait up to this many ms for the tokens (reserved at once) instead of a 429. Single-policy limits only. */
  maxWaitMs?: number | undefined
  /** Answers this limit's denied requests (default: the options' `handler`, else tollgate sends the 429 or 503 JSON body). One per route. */
  handler?: HonoDeniedHandler | undefined
}

/**
 * Answers a denied request instead of tollgate, after the rate-limit
 * headers and Retry-After are set on `c`: `(c, err) => c.json({ message:
 * err.message }, err.status)`. It may be async.
 */
export type HonoDeniedHandler = (c: Context, error: RateLimitError) => Response | Promise<Response>

/** The options of `rateLimit()`. */
export interface HonoOptions extends HonoPolicy {
  /** Shared store, an ioredis Redis or Cluster; omitted, an in-process store. Never closed. */
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
  /**
   * Which proxies in front of the app to believe (default false: the
   * client is the socket's peer): Express's 'trust proxy' values
   * (docs/guides/proxies.md, docs/guides/hono.md "How it maps onto Express's").
   */
  trustProxy?: TrustProxy | undefined
  /** Where warnings and store state changes go (default: the console). */
  logger?: Logger | undefined
  /**
   * Configuration warnings (default on): `proxy`, a forwarding header while
   * `trustProxy` trusts no proxy; `trustProxy`, a setting that trusts every
   * address at every hop. `false` silences both.
   */
  warnings?: { proxy?: boolean | undefined, trustProxy?: boolean | undefined } | false | undefined
  /** While the store fails, one summary line per this many ms at most (default 30000, from 1000 to 3600000). */
  outageSummaryMs?: number | undefined
}

/** A policy of `limit.consume` / `peek`: it names its bucket; its cost is a number. */
export interface HonoProgrammaticPolicy extends Omit<HonoPolicy, 'cost' | 'key' | 'allow' | 'headers' | 'limit' | 'settle' | 'handler'> {
  bucket: string
  cost?: number | undefined
}

/** What `rateLimit()` returns: a function making middleware, itself the app-wide middleware, and the programmatic API. */
export interface RateLimit extends Programmatic<HonoProgrammaticPolicy> {
  /** A middleware with this policy (merged over the options), or the options' own. */
  (policy?: HonoPolicy | readonly HonoPolicy[]): MiddlewareHandler<RateLimitEnv>
  /** `app.use(limit)`: the whole app, one bucket per client, APP_BUCKET unless the options name a `bucket`. */
  (c: Context, next: Next): Promise<Response | undefined>
}

const OPTION_CHECKS = { ...POLICY_CHECKS, ...STORE_CHECKS, trustProxy: trustProxyOption, handler: honoHandler, logger, warnings, outageSummaryMs }

/**
 * The route a middleware is declared on, as Hono matched it: Hono gives
 * matchedRoutes() without a type for its entries, and routeIndex is the
 * running handler's, always in range; Routes hands the route back as it
 * was given.
 */
interface MatchedRoute { method: string, path: string }

const ROUTES: Routes<Context> = {
  route: (c) => matchedRoutes(c)[c.req.routeIndex] as MatchedRoute,
  method: (c) => c.req.method,
  name: (_c, route) => {
    const { method, path } = route as MatchedRoute
    return method === 'ALL' ? everyMethod([path]) : routeName(method, path)
  }
}

/** Creates the limiter of one Hono app: validates `options` and returns `limit`. */
export function rateLimit (options: HonoOptions): RateLimit {
  const input: unknown = options
  if (!isRecord(input)) throw optionError('options', input, 'an object')
  const defaults: Defaults = parseFields(input, OPTION_CHECKS, '', { failureMode: "one of 'open', 'closed', 'local' (there is no default: choose per limit)" }, 'hono')
  checkDefaults(defaults, '')
  const log = options.logger ?? CONSOLE
  const trust = compileTrust(options.trustProxy)
  if (trust !== undefined && warningOn(options.warnings, 'trustProxy') && trustsAll(trust)) {
    log.warn({}, 'tollgate: `trustProxy` trusts every address at every hop, so the client is whatever a client writes first in X-Forwarded-For, and a client that changes it gets a fresh bucket on every request; trust only your proxies (`trustProxy: \'loopback\'`, see "Behind a proxy" in tollgate\'s README), or give a `key` function (`warnings: { trustProxy: false }` silences this)')
  }
  const core = adapterCore(options, log)
  const ready = startUp(core, options.redis, log)
  const layer = new RequestLayer<Context>(core, options.ipv6Subnet ?? 56, {
    ip: (c) => address(c, trust),
    onAddress: trust === undefined && warningOn(options.warnings, 'proxy') ? forwardingWarning(log) : undefined,
    noAddress: () => { log.warn({}, `tollgate: a request came with no client address (off @hono/node-server, or on a Unix socket): such requests share the client identity "${NO_ADDRESS}", one bucket for all of them. Behind a proxy, set \`trustProxy\` so that the proxy's X-Forwarded-For is read; otherwise give a \`key\` function`) },
    badInput: (route, detail) => badInput(`Rate limit of ${route}: ${detail}`),
    refuse: refuser(log),
    settleFailed: (_c, err) => { log.error({ err }, 'tollgate: settle failed; the reservation stands') }
  })
  const prefix = options.prefix ?? 'tollgate'
  const owner = bucketOwner(prefix, log)
  const { compile, wide } = registry(defaults, ROUTES, middlewareDialect('hono'), owner.claim)
  const checks = checker(layer, ready, prefix)
  const limit = limitFunction(compile, wide, checks.middleware)
  return Object.assign(limit, programmatic<HonoProgrammaticPolicy>(core, defaults, 'hono', ready, () => { checks.closing(); owner.release() }))
}

type RateLimitFunction = ((policy?: HonoPolicy | readonly HonoPolicy[]) => MiddlewareHandler<RateLimitEnv>) & ((c: Context, next: Next) => Promise<Response | undefined>)

/** The middleware of one `rateLimit()` instance for a way of finding a request's limit. */
function checker (layer: RequestLayer<Context>, ready: Promise<void>, prefix: string): {
  middleware: (limitOf: LimitOf<Context>) => MiddlewareHandler<RateLimitEnv>
  closing: () => void
} {
  const starting = startGate(ready)
  let closing = false
  function middleware (limitOf: LimitOf<Context>): MiddlewareHandler<RateLimitEnv> {
    return async function tollgate (c, next) {
      const waiting = starting()
      if (waiting !== undefined) await waiting
      const limit = limitOf(c, tollgate)
      if (!firstTime(c, limit, prefix)) return await pass(c, next, undefined, undefined)
      const decided = await layer.decide(limit, c)
      const pending = takeReservation(c)
      if (c.req.raw.signal.aborted) return gone(c, pending)
      // Shutting down: the connection is not kept alive after this answer.
      if (closing) c.header('connection', 'close')
      if (decided === undefined) return await pass(c, next, pending, undefined)
      const { decision } = decided
      c.set('rateLimit', decision)
      written = undefined
      const denial = answer(decided.limit, decision, c, setHeader)
      // The route's `handler`, or the options': a function of (c, err), as parsed (honoHandler).
      if (denial !== undefined) return await deny(c, denial, decision, decided.limit.handler as HonoDeniedHandler | undefined)
      const shown = written
      return await pass(c, next, pending, shown === undefined ? undefined : () => { reapply(c, decided, shown) })
    }
  }
  /**
   * The handler runs; a Response it built itself does not carry the
   * context's headers (Hono merges them only into the responses it makes),
   * so they are written again onto it (see the top of this file).
   */
  async function pass (c: Context, next: Next, pending: Pending | undefined, check: (() => void) | undefined): Promise<undefined> {
    await next()
    check?.()
    settleWhenFinished(pending, c)
    return undefined
  }
  /** The client has gone: the handler does not run (see the top of this file); a reservation settles if its response finishes. */
  function gone (c: Context, pending: Pending | undefined): Response {
    settleWhenFinished(pending, c)
    return new Response(null, { status: CLIENT_GONE })
  }
  function reapply (c: Context, decided: Decided<Context>, shown: string): void {
    if (c.res.headers.get(shown) !== null) return
    answer(decided.limit, decided.decision, c, setHeader)
    if (closing) c.header('connection', 'close')
  }
  function settleWhenFinished (pending: Pending | undefined, c: Context): void {
    if (pending === undefined) return
    const settle = (): void => { void layer.settle(pending, c, c.res) }
    const outgoing = nodeResponse(c)
    if (outgoing === undefined || outgoing.writableFinished) settle()
    else outgoing.once('finish', settle)
  }
  return { middleware, closing: () => { closing = true } }
}

/** `limit`: `limit(policy?)` makes a middleware; Hono's call `limit(c, next)` is `limit()` (see the top of this file). */
function limitFunction (compile: (config: unknown) => LimitOf<Context>, wide: () => LimitOf<Context>, middleware: (limitOf: LimitOf<Context>) => MiddlewareHandler<RateLimitEnv>): RateLimitFunction {
  let itself: MiddlewareHandler<RateLimitEnv> | undefined
  function ownMiddleware (): MiddlewareHandler<RateLimitEnv> {
    let limitOf: LimitOf<Context>
    try {
      limitOf = wide()
    } catch (err) {
      return async () => { throw err }
    }
    return middleware(limitOf)
  }
  return function limit (policy?: unknown, next?: unknown): MiddlewareHandler<RateLimitEnv> | Promise<Response | undefined> {
    // Called by Hono as a middleware (c, next), whose types the overloads
    // of limit state; the arguments are taken at those types.
    if (typeof next === 'function') {
      itself ??= ownMiddleware()
      return itself(policy as Context<RateLimitEnv>, next as Next) as Promise<Response | undefined>
    }
    return middleware(compile(policy))
  } as RateLimitFunction
}

/** Sends a denial: through the app's handler, else as the JSON body Fastify sends. */
async function deny (c: Context, denial: Denial, decision: Decision, handler: HonoDeniedHandler | undefined): Promise<Response> {
  if (handler !== undefined) return await handler(c, new RateLimitError(denial, decision))
  return c.body(denialBody(denial), denial.statusCode, { 'content-type': 'application/json; charset=utf-8' })
}

/** The status of a request whose client has gone (no client reads it): "client closed request", as proxies log it. */
const CLIENT_GONE = 499

/** The last header name setHeader wrote (answer() writes synchronously): a name to look for on the handler's response. */
let written: string | undefined

function setHeader (c: Context, name: string, value: HeaderValue): void {
  c.header(name, String(value))
  written = name
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
 * The warning, once, of a forwarding header while no proxy is trusted: the
 * client is then the proxy's address, and every client behind the proxy
 * would share its bucket.
 */
function forwardingWarning (log: Logger): (c: Context) => void {
  let warned = false
  return (c) => {
    if (warned) return
    const header = c.req.header('x-forwarded-for') !== undefined ? 'X-Forwarded-For' : c.req.header('forwarded') !== undefined ? 'Forwarded' : undefined
    if (header === undefined) return
    warned = true
    log.warn({ header }, `tollgate: a request carries ${header} but \`trustProxy\` trusts no proxy, so every client behind the proxy shares the proxy's bucket; set \`trustProxy\`, or a \`key\` function (\`warnings: { proxy: false }\` silences this)`)
  }
}
