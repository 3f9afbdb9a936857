// A middleware adapter's `rateLimit()` (tollgate/express, tollgate/hono),
// whatever the framework: the adapter gives its hooks (how a request is
// read and answered: `MiddlewareHooks`) and how its routes are named; the
// instance, its `limit` function and the request path are here.
//
// The request path. A middleware waits for the start-up wait while it
// lasts, finds its limit (lib/http/registry.ts), passes a limit the
// request met before (lib/http/sharing.ts), and asks the request layer for
// the decision. A request whose response is sent, or whose client has
// gone, by the time its decision arrives is dropped: no headers, no answer,
// and its handler does not run (each adapter's guide says what its
// framework does then). Otherwise the headers are written, and the request
// goes on to its handler, or its denial goes to the `handler` of its limit
// (or of the options), else the body of the 429 or 503 is sent (JSON, or
// problem details with `problemDetails`). What
// the request holds (a reservation) is released once it ends, whether its
// response finished or its client left (lib/http/holds.ts): the adapter's
// end signal is listened for only for a request that holds something.
//
// `limit` itself. `rateLimit()` returns `limit`, which is a middleware too,
// as express-rate-limit users write it: `limit` is `limit()`, the options'
// own policy named where it is declared (`app.use(limit)`: APP_BUCKET),
// compiled on its first request (the options of a limiter used only with
// policies need no capacity). The framework's call is told from
// `limit(policy)` by its arguments (the adapter's `isCall`).
//
// Shutdown. `limit.close()` ends every wait at once: the held requests are
// answered as denied, so `server.close()` is not held for up to
// `maxWaitMs`; and every answer tollgate gives from then on says
// `Connection: close`, since server.close() waits for keep-alive
// connections that were busy when it was called.

import type { Adapter } from '../core/migrating.js'
import type { Parsers } from '../core/options.js'
import type { Decision, Logger } from '../core/types.js'
import type { HeaderSink } from './headers.js'
import type { End } from './holds.js'
import { CONSOLE, RateLimitError, programmatic, startGate, type Programmatic } from './instance.js'
import { parseOptions, requestLayer, startInstance, type Identity } from './kit.js'
import type { LimitOf } from './registry.js'
import { answer, denialBody, denialType, type Decided, type Denial, type RequestLayer } from './request.js'
import type { Defaults, NamedPolicy, POLICY_CHECKS, RouteLimit } from './route.js'
import { bucketOwner, firstTime } from './sharing.js'
import type { MiddlewareFields } from './types.js'

/**
 * A framework's side of the request path. `Ctx` is what its middleware is
 * called with (Express's response, whose `req` is the request; Hono's
 * context), `Next` its `next`, `Out` what its middleware returns.
 */
export interface MiddlewareHooks<Req, Ctx, Next, Out, Handler, Args extends unknown[]> {
  /** The request the app's functions receive. */
  request(ctx: Ctx): Req
  /** The response is sent, or its client has gone: a decision reaching it is dropped. */
  answered(ctx: Ctx): boolean
  /** Whether a request answered before its check starts is dropped undecided (a framework that may call a middleware after the answer). */
  dropsUndecided: boolean
  /** Writes one header of the answer. */
  setHeader: HeaderSink<Ctx>
  /** Puts the decision where the app reads it (`req.rateLimit`, `c.get('rateLimit')`). */
  show(ctx: Ctx, decision: Decision): void
  /**
   * The framework's one end signal: runs `then` once, when the response
   * has finished or the client has gone (at once if either is so), with
   * the response a `settle` function reads.
   */
  onEnd(ctx: Ctx, then: (end: End) => void): void
  /**
   * Goes on to the handler. `listen` (when the request holds something)
   * starts listening for its end (onEnd): run it before the handler, or
   * once the handler has made its response where the framework does not
   * tell when the response ends. `decided`:
   * the decision whose headers were written; `closing`, whether answers
   * say `Connection: close` now.
   */
  pass(ctx: Ctx, next: Next, listen: (() => void) | undefined, decided: Decided<Req> | undefined, closing: () => boolean): Out | Promise<Out>
  /** What a dropped request's middleware returns. */
  drop(ctx: Ctx): Out
  /** Hands a denial to the app's handler. */
  handle(ctx: Ctx, next: Next, handler: Handler, error: RateLimitError): Out | Promise<Out>
  /** Sends the body of a denial, of content type `type` (JSON, or problem details: lib/http/request.ts). */
  send(ctx: Ctx, denial: Denial, body: string, type: string): Out
  /** A failure (a limit that cannot be compiled, a decision that threw) for the framework's error handling. */
  fail(next: Next, err: unknown): Out
  /** The framework's middleware around one check; `self` is that middleware. */
  wrap(run: (ctx: Ctx, next: Next, self: object) => Out | Promise<Out>): Middleware<Args>
  /**
   * Whether `limit`'s arguments are the framework's call of a middleware
   * (`limit(req, res, next)`), not `limit(policy)`: then they are taken at
   * the types the framework calls a middleware with.
   */
  isCall(args: unknown[]): args is Args
}

/** A framework's middleware, called with `Args`. */
export type Middleware<Args extends unknown[]> = (...args: Args) => unknown

/** What an adapter gives for its `rateLimit()`. */
export interface MiddlewareAdapter<Req extends object, Ctx, Next, Out, Handler, Args extends unknown[]> {
  adapter: Adapter & ('express' | 'hono' | 'nest')
  /** Every option `rateLimit()` takes. */
  checks: typeof POLICY_CHECKS & Parsers
  /** The framework's request identity; asked before the start-up begins, so it may warn of its settings first. */
  identity(log: Logger): Identity<Req>
  /** The instance's limits (lib/http/registry.ts), named the framework's way. */
  limits(defaults: Defaults, log: Logger, claim: (limit: RouteLimit<never>) => void): { compile: (config: unknown) => LimitOf<Req>, wide: () => LimitOf<Req> }
  hooks: MiddlewareHooks<Req, Ctx, Next, Out, Handler, Args>
}

/** `rateLimit()`: checks `options`, starts the instance, and returns `limit` with the programmatic API. */
export function middlewareInstance<Req extends object, Ctx, Next, Out, Handler, Args extends unknown[], P extends NamedPolicy> (
  options: MiddlewareFields, side: MiddlewareAdapter<Req, Ctx, Next, Out, Handler, Args>
): Programmatic<P> & ((...args: unknown[]) => unknown) {
  const defaults = parseOptions(options, side.checks, side.adapter)
  const log = options.logger ?? CONSOLE
  const identity = side.identity(log)
  const { core, ready } = startInstance(options, log)
  const layer = requestLayer(core, options, log, identity)
  const prefix = options.prefix ?? 'tollgate'
  const owner = bucketOwner(prefix, log)
  const { compile, wide } = side.limits(defaults, log, owner.claim)
  const checks = checker(layer, ready, prefix, side.hooks)
  const limit = limitFunction(compile, wide, checks.middleware, side.hooks)
  return Object.assign(limit, programmatic<P>(core, defaults, side.adapter), {
    // The shutdown: answers say `Connection: close` from now on, the bucket names are withdrawn, the waits end.
    close: async () => {
      checks.closing()
      owner.release()
      await core.limiter.close()
    },
    ready
  })
}

/** The middleware of one instance for a way of finding a request's limit; `handle` the function the framework holds, when not the middleware itself. */
type MakeMiddleware<Req, Args extends unknown[]> = (limitOf: LimitOf<Req>, handle?: object) => Middleware<Args>

/** The request path of one instance (see the top of this file). */
function checker<Req extends object, Ctx, Next, Out, Handler, Args extends unknown[]> (
  layer: RequestLayer<Req>, ready: Promise<void>, prefix: string, hooks: MiddlewareHooks<Req, Ctx, Next, Out, Handler, Args>
): {
  middleware: MakeMiddleware<Req, Args>
  closing: () => void
} {
  const starting = startGate(ready)
  const isClosing = (): boolean => layer.closing
  function middleware (limitOf: LimitOf<Req>, handle?: object): Middleware<Args> {
    return hooks.wrap((ctx, next, self) => {
      const waiting = starting()
      if (waiting !== undefined) return waiting.then(() => check(limitOf, handle ?? self, ctx, next))
      return check(limitOf, handle ?? self, ctx, next)
    })
  }
  /** One request's check. A limit this request met before passes it (lib/http/sharing.ts). */
  function check (limitOf: LimitOf<Req>, self: object, ctx: Ctx, next: Next): Out | Promise<Out> {
    if (hooks.dropsUndecided && hooks.answered(ctx)) return hooks.drop(ctx)
    const request = hooks.request(ctx)
    let limit: RouteLimit<Req>
    try {
      limit = limitOf(request, self)
    } catch (err) {
      return hooks.fail(next, err)
    }
    if (!firstTime(request, limit, prefix)) return hooks.pass(ctx, next, undefined, undefined, isClosing)
    return layer.decide(limit, request).then((decided) => conclude(decided, request, ctx, next)).catch((err: unknown) => hooks.fail(next, err))
  }
  function conclude (decided: Decided<Req> | undefined, request: Req, ctx: Ctx, next: Next): Out | Promise<Out> {
    const listen = layer.holding(request) ? () => { hooks.onEnd(ctx, (end) => { void layer.ended(request, end) }) } : undefined
    if (hooks.answered(ctx)) {
      listen?.()
      return hooks.drop(ctx)
    }
    layer.closeConnection(ctx, hooks.setHeader)
    if (decided === undefined) return hooks.pass(ctx, next, listen, undefined, isClosing)
    const { decision } = decided
    hooks.show(ctx, decision)
    const denial = answer(decided, ctx, hooks.setHeader)
    if (denial === undefined) return hooks.pass(ctx, next, listen, decided, isClosing)
    // The route's `handler`, or the options': a function, as the adapter's
    // dialect parsed it, taken at the type the adapter's options declare.
    const handler = decided.limit.handler as Handler | undefined
    if (handler !== undefined) return hooks.handle(ctx, next, handler, new RateLimitError(denial, decision))
    return hooks.send(ctx, denial, denialBody(denial), denialType(denial))
  }
  return { middleware, closing: () => { layer.close() } }
}

/** `limit`: `limit(policy?)` makes a middleware; the framework's call of `limit` itself is `limit()` (see the top of this file). */
function limitFunction<Req, Ctx, Next, Out, Handler, Args extends unknown[]> (compile: (config: unknown) => LimitOf<Req>, wide: () => LimitOf<Req>,
  middleware: MakeMiddleware<Req, Args>, hooks: MiddlewareHooks<Req, Ctx, Next, Out, Handler, Args>): (...args: unknown[]) => unknown {
  let itself: Middleware<Args> | undefined
  function ownMiddleware (): Middleware<Args> {
    let limitOf: LimitOf<Req>
    try {
      limitOf = wide()
    } catch (err) {
      return hooks.wrap((_ctx, next) => hooks.fail(next, err))
    }
    return middleware(limitOf, limit)
  }
  function limit (...args: unknown[]): unknown {
    if (hooks.isCall(args)) {
      itself ??= ownMiddleware()
      return itself(...args)
    }
    return middleware(compile(args[0]))
  }
  return limit
}
