// The adapter kit: what an adapter's instance does that is no framework
// hook, once for every framework. An adapter (lib/adapters/*) gives its
// framework's accessors and its words; the kit checks the options, builds
// the core and starts the start-up wait (lib/http/setup.ts), resolves a
// request's identity (its address, the proxy warnings, the no-address
// warning, the 500 of a function of the app that failed) and builds the
// request layer (lib/http/request.ts) over them. The middleware adapters'
// shared request path is lib/http/middleware.ts.
//
// Words as data: a warning names the framework's own setting (Express's
// 'trust proxy', Fastify's `trustProxy`, Hono's `trustProxy` option), so
// the adapter passes its sentences; the kit decides when they are logged
// (each once per instance).

import { optionError } from '../core/errors.js'
import type { Core } from '../core/limiter.js'
import type { Adapter } from '../core/migrating.js'
import { isRecord, parseFields, warningOn, type Parsers } from '../core/options.js'
import { POLICY_CHECKS, checkDefaults, type Defaults } from './route.js'
import { BAD_INPUT, NO_ADDRESS, RequestLayer, type RequestSide } from './request.js'
import { badInput } from './registry.js'
import { adapterCore, startUp } from './setup.js'
import type { InstanceFields } from './types.js'
import type { Logger } from '../core/types.js'

/** What `failureMode` expects when an instance's options leave it out. */
const FAILURE_MODE_REQUIRED = "one of 'open', 'closed', 'local' (there is no default: choose per limit)"
/** IPv6 clients are keyed by this prefix length unless `ipv6Subnet` says otherwise. */
const IPV6_SUBNET = 56

/** An instance's options, checked (`checks`: every option it takes), as the defaults its routes merge over. */
export function parseOptions (options: unknown, checks: typeof POLICY_CHECKS & Parsers, adapter: Adapter): Defaults {
  if (!isRecord(options)) throw optionError('options', options, 'an object')
  const defaults: Defaults = parseFields(options, checks, '', { failureMode: FAILURE_MODE_REQUIRED }, adapter)
  checkDefaults(defaults, '')
  return defaults
}

/** What a framework tells the kit about its requests' identity, and its words for the warnings. */
export interface Identity<Req> {
  /** The client's address as the framework resolves it (its proxy trust applied); undefined or '' without one. */
  ip(request: Req): string | undefined
  /** The logger of a request's failures: the framework's per-request one, or the instance's. */
  logOf(request: Req): Logger
  /** The error a request is answered with when a function of the app failed: the 500 of BAD_INPUT. */
  refused(): Error
  /** The no-address warning's words: where a request has no address, and what gives it one behind a proxy. */
  noAddress: { where: string, behindProxy: string }
  /** The proxy warnings' probe of the framework; undefined: the framework has none to give. */
  proxy?: ProxyProbe<Req> | undefined
}

/** How the proxy warnings read a request of the framework, and their words. */
export interface ProxyProbe<Req> {
  /** Whether no proxy is trusted: a forwarding header then comes from a proxy the app does not trust. */
  trustsNone(request: Req): boolean
  /** A request header, by its lower-case name. */
  header(request: Req, name: 'x-forwarded-for' | 'forwarded'): unknown
  /** The warning of a forwarding header that no proxy setting reads (`header`: the header's name). */
  untrusted(header: string): string
  /** A setting that trusts every hop, asked of the first request: whether the framework's does, and the warning. */
  everyHop?: { trusts(request: Req): boolean, warning: string } | undefined
  /** Whether the warnings' fields carry the request's `ip` (where the framework resolves one of its own). */
  showsIp: boolean
}

/** An instance's core and its start-up wait, begun now (it never rejects). */
export function startInstance (options: InstanceFields, log: Logger): { core: Core, ready: Promise<void> } {
  const core = adapterCore(options, log)
  return { core, ready: startUp(core, options.redis, log) }
}

/** The request layer of an instance: its identity from `identity`, its warnings on `log` as `options.warnings` allow. */
export function requestLayer<Req extends object> (core: Core, options: InstanceFields, log: Logger, identity: Identity<Req>): RequestLayer<Req> {
  const { where, behindProxy } = identity.noAddress
  const side: RequestSide<Req> = {
    ip: (request) => identity.ip(request),
    onAddress: identity.proxy === undefined ? undefined : proxyWarnings(log, identity, identity.proxy, options.warnings),
    noAddress: () => { log.warn({}, `tollgate: a request came with no client address (${where}): such requests share the client identity "${NO_ADDRESS}", one bucket for all of them. Behind a proxy, ${behindProxy}; otherwise give a \`key\` function`) },
    badInput: (route, detail) => badInput(`Rate limit of ${route}: ${detail}`),
    refuse: (request, message) => {
      identity.logOf(request).error({ code: BAD_INPUT.code }, message)
      return identity.refused()
    },
    settleFailed: (request, err) => { identity.logOf(request).error({ err }, 'tollgate: settle failed; the reservation stands') }
  }
  return new RequestLayer<Req>(core, options.ipv6Subnet ?? IPV6_SUBNET, side)
}

/**
 * The proxy warnings, each once per instance, then free; undefined when
 * both are off.
 *
 * - `proxy`: while no proxy is trusted, the client is the proxy's address:
 *   behind a proxy every client would share one bucket. A forwarding
 *   header on a request is the sign.
 * - `trustProxy`: a setting that trusts every address at every hop makes
 *   the client the leftmost X-Forwarded-For entry, which any client
 *   writes: a client that rotates it gets a fresh bucket per request. The
 *   framework's setting is asked about a made-up chain (lib/http/setup.ts,
 *   trustsEveryHop).
 */
function proxyWarnings<Req> (log: Logger, identity: Identity<Req>, probe: ProxyProbe<Req>, warnings: InstanceFields['warnings']): ((request: Req) => void) | undefined {
  let forwarding = warningOn(warnings, 'proxy')
  let everyHop = warningOn(warnings, 'trustProxy') ? probe.everyHop : undefined
  if (!forwarding && everyHop === undefined) return undefined
  const fields = (request: Req): object => probe.showsIp ? { ip: identity.ip(request) } : {}
  return (request) => {
    if (everyHop !== undefined) {
      const { trusts, warning } = everyHop
      everyHop = undefined
      if (trusts(request)) log.warn(fields(request), warning)
    }
    if (!forwarding || !probe.trustsNone(request)) return
    const header = probe.header(request, 'x-forwarded-for') !== undefined ? 'X-Forwarded-For' : probe.header(request, 'forwarded') !== undefined ? 'Forwarded' : undefined
    if (header === undefined) return
    forwarding = false
    log.warn({ header, ...fields(request) }, probe.untrusted(header))
  }
}
