// How an Express request finds its limit: the route Express matched, named
// by its mount path and route pattern as declared (lib/adapters/express/routes.ts),
// over the limits every middleware adapter keeps alike (lib/http/registry.ts:
// compiled once, one policy per bucket, a bounded number of names).
//
// Why not `req.baseUrl`: it is the mount path as the client spelled it
// (`/API` for `app.use('/api', ...)`, `/orgs/acme` for `/orgs/:org`).
// Express does not tell a middleware where it is mounted, so routes.ts
// finds the declaration once per route object. A route declared for every
// method is one bucket, `ALL <pattern>`: `route.all()` marks the route
// `methods._all`; `app.all()` declares it for each method Node's parser
// knows (Express's own list). Outside a route (`app.use`, `router.use`) the
// middleware is named by its mount paths (`ALL /api/*`; APP_BUCKET on the
// whole app). `req.route` is the last route the request went through, even
// in a middleware after it: a middleware is in a route only if the route's
// own stack holds it.

import { METHODS } from 'node:http'
import type { Request } from 'express'
import type { RoutePatterns } from './routes.js'
import { routeName, type Defaults, type RouteLimit } from '../../http/route.js'
import { APP_BUCKET, MAX_NAMES, everyMethod, middlewareDialect, registry as limits, type LimitOf as Of, type Routes } from '../../http/registry.js'

export { APP_BUCKET, MAX_NAMES }

/** How a request finds its compiled limit. */
export type LimitOf = Of<Request>

/** What the registry reads of Express's route object: its layers, and whether it serves every method. */
interface ExpressRoute { stack: Array<{ handle?: unknown }>, methods: Record<string, boolean | undefined> }

/** The methods `app.all()` declares a route for, as Express names them. */
const EVERY_METHOD = METHODS.map((m) => m.toLowerCase())

/** A route declared for every method (see the top of this file). */
function everyMethodRoute (route: ExpressRoute): boolean {
  return route.methods._all === true || EVERY_METHOD.every((m) => route.methods[m] === true)
}

/** The limits of one `rateLimit()` instance, its routes named by `patterns`; `claim` as registry()'s. */
export function registry (defaults: Defaults, patterns: RoutePatterns, claim: (limit: RouteLimit<never>) => void): {
  compile: (config: unknown) => LimitOf
  wide: () => LimitOf
} {
  const routes: Routes<Request> = {
    route (req, self) {
      // Express types req.route as any; a route object holds its layers in `stack`.
      const route = req.route as ExpressRoute | undefined
      return route?.stack.some((layer) => layer.handle === self) === true ? route : self
    },
    method: (req) => req.method,
    name (req, route) {
      if (typeof route === 'function') return everyMethod(patterns.mounts(req.app, route))
      return routeName(everyMethodRoute(route as ExpressRoute) ? 'ALL' : req.method, patterns.of(req.app, route))
    }
  }
  return limits(defaults, routes, middlewareDialect('express'), claim)
}
