// How an Express request finds its limit: the route Express matched, named
// by its mount path and route pattern as declared (lib/adapters/express/routes.ts),
// over the limits every middleware adapter keeps alike (lib/http/registry.ts:
// compiled once, one policy per bucket, a bounded number of names).
//
// Why not `req.baseUrl`: it is the mount path as the client spelled it
// (`/API` for `app.use('/api', ...)`, `/orgs/acme` for `/orgs/:org`).
// Express does not tell a middleware where it is mounted, so routes.ts
// finds the declaration once per route object. Outside a route (`app.use`,
// `router.use`) there is no pattern: the policy must name its `bucket`.

import type { Request } from 'express'
import type { RoutePatterns } from './routes.js'
import { routeName, type Defaults, type RouteLimit } from '../../http/route.js'
import { APP_BUCKET, MAX_NAMES, badInput, middlewareDialect, refuser, registry as limits, type LimitOf as Of, type Routes } from '../../http/registry.js'

export { APP_BUCKET, MAX_NAMES, badInput, refuser }

/** How a request finds its compiled limit. */
export type LimitOf = Of<Request>

/** The limits of one `rateLimit()` instance, its routes named by `patterns`. */
export function registry (defaults: Defaults, patterns: RoutePatterns): {
  compile: (config: unknown) => LimitOf
  appWide: () => RouteLimit<Request>
} {
  const routes: Routes<Request> = {
    route (req) {
      const route: unknown = req.route
      if (typeof route !== 'object' || route === null) {
        throw badInput('Rate limit outside a route (app.use, router.use) has no route pattern to name its bucket: give the policy a `bucket`')
      }
      return route
    },
    method: (req) => req.method,
    name: (req, route) => routeName(req.method, patterns.of(req.app, route))
  }
  return limits(defaults, routes, middlewareDialect('express'))
}
