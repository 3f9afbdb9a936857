// Nest's side of the middleware adapters' request path
// (lib/http/middleware.ts): the guard is a middleware whose `next` lets
// the handler run (true), and whose denial is thrown (RateLimitException),
// on either platform, from what both give a guard.
//
// Buckets. `<METHOD> <path>` with the path as the platform's router holds
// the route Nest declared on it (global prefix, version, controller and
// handler paths joined by Nest): Express's `req.route.path`, Fastify's
// `request.routeOptions.url`; never the URL. A handler is one declaration
// (lib/http/registry.ts keeps its names per method, and bounds them). A
// handler of `@All()` is one bucket, `ALL <path>`, as `app.all()` is on
// Express: a client gains nothing by varying the method. The platforms
// tell it: Express's route then serves several methods, Fastify's lists them.
//
// A request answered, or whose client left, before its decision arrives
// (a Nest middleware's timeout, a client gone during a wait) is dropped:
// the guard says false, so the handler does not run, and Nest's filter
// only ends a response that was sent.

import type { ServerResponse } from 'node:http'
import { whenEnded } from '../../http/holds.js'
import { RateLimitError } from '../../http/instance.js'
import type { Identity } from '../../http/kit.js'
import type { MiddlewareHooks } from '../../http/middleware.js'
import { badInput, type Routes } from '../../http/registry.js'
import { BAD_INPUT } from '../../http/request.js'
import { routeName } from '../../http/route.js'
import type { Decision, Logger } from '../../core/types.js'
import { RateLimitException } from './errors.js'
import type { NestRequest } from './types.js'

/** A response of either platform: Express's `res` is the Node response, Fastify's reply holds it as `raw`. */
export type PlatformResponse = { header (name: string, value: string | number): unknown, readonly statusCode: number } & (ServerResponse | { readonly raw: ServerResponse })

/** One request as the guard hands it to the request path. */
export interface NestContext {
  req: NestRequest & { readonly route?: { path: string, methods: object }, readonly routeOptions?: { url?: string, method?: string | string[] } }
  res: PlatformResponse
  raw: ServerResponse
}

/** The guard's middleware, called with one request. */
export type NestArgs = [ctx: NestContext]

export function nestContext (req: NestContext['req'], res: PlatformResponse): NestContext {
  return { req, res, raw: 'raw' in res ? res.raw : res }
}

/** The denial, thrown for Nest's exception filters (see errors.ts). */
function deny (ctx: NestContext, _next: null, _handler: undefined, error: RateLimitError): never {
  throw new RateLimitException(error, (type) => { ctx.res.header('content-type', type) })
}

export const HOOKS: MiddlewareHooks<NestRequest, NestContext, null, boolean, never, NestArgs> = {
  request: (ctx) => ctx.req,
  answered: ({ raw }) => raw.headersSent || raw.writableEnded || raw.destroyed,
  dropsUndecided: false,
  setHeader: (ctx, name, value) => { ctx.res.header(name, value) },
  show: (ctx, decision) => { ctx.req.rateLimit = decision },
  onEnd: (ctx, then) => { whenEnded(ctx.raw, (how) => { then({ how, response: ctx.res }) }) },
  pass: (_ctx, _next, listen) => {
    listen?.()
    return true
  },
  drop: () => false,
  // Nest answers denials through its exception filters: no `handler` option.
  handle: deny,
  // show() has put the decision on the request before a denial is sent.
  send: (ctx, denial) => deny(ctx, null, undefined, new RateLimitError(denial, ctx.req.rateLimit as Decision)),
  fail: (_next, err) => { throw err },
  wrap: (run) => function tollgate (ctx: NestContext) { return run(ctx, null, tollgate) },
  // The guard calls a middleware itself: `limit(...)` is always `limit(policy)`.
  isCall: (_args): _args is NestArgs => false
}

/** A handler's route as the platform's router declared it (see the top of this file). */
export const ROUTES: Routes<NestContext['req']> = {
  route: (_req, self) => self,
  method: (req) => req.method,
  name: (req) => routeName(everyMethod(req) ? 'ALL' : req.method, req.route?.path ?? String(req.routeOptions?.url))
}

/** Whether the request's route was declared for every method (`@All()`). */
function everyMethod (req: NestContext['req']): boolean {
  return Object.keys(req.route?.methods ?? {}).length > 1 || Array.isArray(req.routeOptions?.method)
}

/**
 * The client is the platform's `ip` (its proxy trust applied). A request
 * that carries X-Forwarded-For while the platform trusts no hop of it
 * (Express's `req.ips` empty, Fastify's undefined) is told once.
 */
export function identity (log: Logger): Identity<NestRequest & { readonly ips?: readonly string[] }> {
  return {
    ip: (req) => req.ip,
    logOf: () => log,
    refused: () => badInput(BAD_INPUT.message),
    noAddress: { where: 'as on a Unix socket', behindProxy: "set the platform's proxy trust (Express's 'trust proxy', Fastify's `trustProxy`) so that the request's ip is the client's address" },
    proxy: {
      trustsNone: (req) => req.ips === undefined || req.ips.length === 0,
      header: (req, name) => req.headers[name],
      untrusted: (header) => `tollgate: a request carries ${header} but the platform trusts no proxy, so every client behind the proxy shares the proxy's bucket; set Express's 'trust proxy' (app.set on the Nest app) or Fastify's \`trustProxy\` (new FastifyAdapter({ trustProxy })), or a \`key\` function (\`warnings: { proxy: false }\` silences this)`,
      showsIp: true
    }
  }
}
