// The public types of tollgate/nest, with no type of Express or Fastify:
// an app on either platform installs only its own. A request is what both
// platforms give a guard (Express's `req`, Fastify's request), read
// through the fields they share.

import type { IncomingHttpHeaders } from 'node:http'
import type { Decision } from '../../core/types.js'
import type { InstanceOptions, MiddlewareFields, PolicyFields, ProgrammaticFields, RequestCost } from '../../http/types.js'

/** A request as the guard reads it on either platform; `@Req()` gives the platform's own, which has these fields. */
export interface NestRequest {
  readonly method: string
  readonly headers: IncomingHttpHeaders
  /** The client's address as the platform resolves it (Express's 'trust proxy', Fastify's `trustProxy`). */
  readonly ip?: string | undefined
  /** The decision of this request's limit; undefined when none applied. */
  rateLimit?: Decision | undefined
}

/** A `cost` function of a request. */
export type NestCostFunction = RequestCost<NestRequest>

/**
 * A limit as `@RateLimit()` and the module's options take it. Its
 * `settle(req, res)` gets the platform's request and response (Express's
 * `res`, Fastify's reply: `res.statusCode` on both).
 */
export interface NestPolicy extends PolicyFields<NestRequest, [req: NestRequest, res: { readonly statusCode: number }]> {}

/** The options of `TollgateModule.forRoot()`. */
export interface NestOptions extends InstanceOptions<NestPolicy, MiddlewareFields> {
  /** Limit every route with the module's policy (default true); false: only handlers and controllers with `@RateLimit`. */
  global?: boolean | undefined
}

/** A policy of `consume` / `peek`: it names its bucket; its cost is a number. */
export interface NestProgrammaticPolicy extends ProgrammaticFields {}
