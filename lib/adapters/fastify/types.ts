// Fastify infers a route's `config` type from the literal it is given, so
// the `rateLimit` declared on FastifyContextConfig below catches a mistyped
// field (`capacity: '5'`) but not an unknown one (`max: 5`), nor a value of
// the wrong kind (`'yes'`, `true`): TypeScript cannot do better there. A
// policy written through `routePolicy()` (or with `satisfies RoutePolicy`)
// is checked in full, and the registration rejects at run time whatever the
// types let through. The function options are declared as methods so that a
// policy typed for a route's generics (`request.params`) still fits the
// untyped route config. The fields are every adapter's (lib/http/types.ts).

import type { FastifyReply, FastifyRequest, RouteGenericInterface } from 'fastify'
import type { HOOKS } from '../../core/options.js'
import type { ProgrammaticApi } from '../../http/instance.js'
import type { InstanceFields, InstanceOptions, PolicyFields, ProgrammaticFields, RequestCost } from '../../http/types.js'
import type { Decision } from '../../core/types.js'

/** A limit as the plugin and routes take it; route values merge over the plugin's. */
export interface RoutePolicy<RouteGeneric extends RouteGenericInterface = RouteGenericInterface>
  extends PolicyFields<FastifyRequest<RouteGeneric>, [request: FastifyRequest<RouteGeneric>, reply: FastifyReply]> {
  /** Where the check runs (default 'onRequest'); 'preHandler' lets key and cost read the body. */
  hook?: (typeof HOOKS)[number] | undefined
}

/** A `cost` function: the tokens a request costs. */
export type CostFunction<RouteGeneric extends RouteGenericInterface = RouteGenericInterface> = RequestCost<FastifyRequest<RouteGeneric>>

/** What `config.rateLimit` of a route takes: one policy, several checked together, or false. */
export type RouteRateLimit<RouteGeneric extends RouteGenericInterface = RouteGenericInterface> =
  | RoutePolicy<RouteGeneric>
  | ReadonlyArray<RoutePolicy<RouteGeneric>>
  | false

/**
 * The plugin's options. Its `warnings`: `proxy`, requests that came
 * through a proxy Fastify does not trust; `trustProxy`, a `trustProxy`
 * that trusts every address at every hop.
 */
export interface TollgateOptions extends InstanceOptions<RoutePolicy, InstanceFields> {
  /** Limit every route (default true); false: only routes with config.rateLimit. */
  global?: boolean | undefined
  /**
   * 404s: true limits them with the plugin's options, a policy (or several)
   * over the plugin's options, false leaves them unlimited. One bucket per
   * client, named '404' unless the policy names one. Default: `global`.
   */
  notFound?: boolean | RoutePolicy | readonly RoutePolicy[] | undefined
  /**
   * How a 503 of a limit with failureMode 'closed' is answered during an
   * outage: 'send' (default), sent as a reply, so Fastify logs no error per
   * request; 'throw', thrown as an UnavailableError through Fastify's error
   * pipeline (the app's error handler answers it; Fastify's default one
   * logs each at error level).
   */
  unavailable?: 'send' | 'throw' | undefined
}

/**
 * A policy of `app.tollgate.consume` / `peek`: it names its bucket, is merged
 * over the plugin's options, and takes a numeric cost only (pass a computed
 * cost as the third argument). Route-only settings (`key`, `hook`,
 * `headers`, `allow`) have no meaning here.
 */
export interface ProgrammaticPolicy extends ProgrammaticFields {}

/**
 * `app.tollgate`: programmatic checks with the plugin's store and defaults;
 * `settle` refunds or charges the difference between the actual cost and
 * the reservation; `limiter` is the core limiter behind the plugin.
 */
export interface TollgateDecorator extends ProgrammaticApi<ProgrammaticPolicy> {}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** A policy over the plugin's defaults, several checked together, or false to opt out. */
    rateLimit?: RouteRateLimit | undefined
  }
  interface FastifyRequest {
    /** The decision for this request; undefined when no limit applied. */
    rateLimit?: Decision | undefined
  }
  interface FastifyInstance {
    tollgate: TollgateDecorator
  }
}
