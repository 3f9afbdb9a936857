// How every route gets its check, whatever the order of declaration.
//
// A route declared after the plugin (the usual order) is seen by its
// `onRoute` hook: its limit is compiled there, once, and its check is a
// route-level hook holding that limit in a closure, so it runs after the
// app's own instance hooks (an auth hook added after tollgate can still
// set what `key` reads). `onRoute` cannot see a route declared before the
// plugin loaded: before `await app.register(tollgate)`, after a register
// without `await` (avvio loads the plugin later), or in a plugin
// registered earlier. Those routes are caught by two instance hooks (a
// "gate"): Fastify gives an instance's lifecycle hooks to every route of
// that instance and of all its child instances, whenever they were
// declared. The gate does nothing for a route `onRoute` saw (one symbol
// read on its config), compiles the limit of any other route on its first
// request and keeps it, and runs the check there. So no route in the
// plugin's scope is left unlimited by the order of declaration.
//
// The gate also sees 404s (the not-found handler is a route of the
// instance too): they spend from one bucket per client, named '404' (never
// the raw URL, so unknown URLs cannot create keys), with the `notFound`
// policy; by default, with `global: true`, the plugin's own.
//
// A client gone. A request whose client disconnected while it waited in
// tollgate (the store, `maxWaitMs`) is dropped when tollgate gets to it or
// when its decision arrives, as on Express and Hono: the reply is
// hijacked, so Fastify runs no further hook and no handler, and sends
// nothing (no client would read it). Tokens it spent stay spent; a
// reservation is settled at once, since its response never finishes. The
// raw response tells: Node destroys it with its connection. What a request
// holds (lib/http/holds.ts) is released when its raw response ends, sent
// or closed first, whichever hook ran its check.
//
// Shutdown. preClose ends the waits, and from then on every answer
// tollgate gives (denials, and the headers of passed requests) says
// `Connection: close`: server.close() waits for the keep-alive
// connections that were busy when it was called until their client drops
// them, and Fastify keeps an idle one for 72 s (its keepAliveTimeout).
//
// A request without a client address (`request.ip` is undefined on a Unix
// socket) is keyed as one shared client, 'no-address', never a 500; a
// warning says so once. A key per connection would give a client a fresh
// bucket per reconnect.

import type { FastifyInstance, FastifyReply, FastifyRequest, onResponseHookHandler } from 'fastify'
import fp from 'fastify-plugin'
import { optionError } from '../../core/errors.js'
import type { HeaderValue } from '../../http/headers.js'
import { BadRequestInputError, RateLimitedError, UnavailableError } from './errors.js'
import { HOOKS, isBoolean, isRecord, oneOf, outageSummaryMs, warnings } from '../../core/options.js'
import { RequestLayer, answer, denialBody, denialType, type Decided, type Denial } from '../../http/request.js'
import { PROBE_HOPS, STORE_CHECKS, trustsEveryHop } from '../../http/setup.js'
import { BASE_DIALECT, POLICY_CHECKS, ROUTE_WIDE, compileRoute, routeName, routeWide, type Defaults, type Dialect, type RouteLimit } from '../../http/route.js'
import { programmatic } from '../../http/instance.js'
import { parseOptions, requestLayer, startInstance, type Identity } from '../../http/kit.js'
import { HOLDS, whenEnded } from '../../http/holds.js'
import type { ProgrammaticPolicy, TollgateDecorator, TollgateOptions } from './types.js'

const kChecked = Symbol('tollgate.checked')
/** A check's outcome: it sent the reply itself (the 503 of an outage). */
const SENT = Symbol('tollgate.sent')
/** On a route's config: `onRoute` saw the route, the gate has nothing to do. */
const kSeen = Symbol('tollgate.seen')
/** On a request: the limit the gate found for a route whose check runs at preHandler. */
const kPending = Symbol('tollgate.pending')
/** The bucket of 404s, unless the policy names one. */
const NOT_FOUND = '404'

const hookOption = oneOf(HOOKS)

/**
 * Where the check runs, per hook, for the log line of a `key` or `cost`
 * that threw: in onRequest, Fastify has not parsed the body yet, and an
 * authentication hook of preValidation or preHandler has not run.
 */
const PLACEMENT: Readonly<Record<Hook, string>> = {
  onRequest: "the check runs in Fastify's onRequest hook, before the body is parsed and before the preValidation and preHandler hooks: a `key` or `cost` that reads request.body, or a user that an authentication hook sets there, needs `hook: 'preHandler'` (in the route's config.rateLimit or the plugin's options)",
  preHandler: "the check runs in Fastify's preHandler hook, after the body is parsed and after the app's own hooks of the route"
}

/** Fastify's route settings: the common ones, and where the check runs. */
const FASTIFY: Dialect = {
  checks: { ...POLICY_CHECKS, hook: hookOption },
  wide: [...ROUTE_WIDE, 'hook'],
  hint: BASE_DIALECT.hint,
  adapter: 'fastify',
  placement: PLACEMENT.onRequest,
  call: BASE_DIALECT.call
}

const PLUGIN_CHECKS = {
  ...FASTIFY.checks,
  ...STORE_CHECKS,
  global: isBoolean,
  notFound: notFoundOption,
  warnings,
  outageSummaryMs,
  unavailable: oneOf(['send', 'throw'])
}

type Hook = (typeof HOOKS)[number]

/** A route's limit, and the hook its check runs in. */
interface FastifyLimit extends RouteLimit<FastifyRequest> {
  hook: Hook
}

/** The request, with the guard against checking it twice (kept off Fastify's public types). */
type Checked = FastifyRequest & { [kChecked]?: boolean }

/** A hook's callback: no argument to go on, the error Fastify answers otherwise. */
type Done = (err?: Error) => void
type Check = (limit: FastifyLimit, request: Checked, reply: FastifyReply, done: Done) => void
/** A route's limit from its method, URL and `config.rateLimit`; null: not limited. */
type LimitOf = (method: string | string[], url: string, config: unknown) => FastifyLimit | null
type GateRequest = FastifyRequest & { [kPending]?: FastifyLimit }

async function tollgate (app: FastifyInstance, options: TollgateOptions): Promise<void> {
  if (app.hasDecorator('tollgate')) throw alreadyRegistered()
  const defaults = parseOptions(options, PLUGIN_CHECKS, 'fastify')
  const { core, ready } = startInstance(options, app.log)
  const global = options.global ?? true
  await ready

  decorate(app, programmatic<ProgrammaticPolicy>(core, defaults, 'fastify'))
  const layer = requestLayer(core, options, app.log, IDENTITY)
  const hooked = new WeakSet<FastifyLimit>()
  const check = checker(layer, options.unavailable === 'throw', hooked)
  const limitOf = routeLimits(defaults, global)
  const notFound = notFoundLimit(options.notFound, global, defaults, app)

  app.addHook('onRoute', (route) => {
    const config = route.config?.rateLimit
    // The config with this plugin's mark, at the type Fastify gives the app's route configs.
    route.config = { ...route.config, [kSeen]: true } as typeof route.config
    const limit = limitOf(route.method, route.url, config)
    if (limit === null) return
    appendHook(route, limit.hook, routeHook(limit, check))
    if (limit.settle === undefined) return
    appendHook(route, 'onResponse', onResponse(layer))
    hooked.add(limit)
  })
  gate(app, limitOf, notFound, check)

  // Fastify waits for the requests in flight before it runs its onClose
  // hooks, and a request waiting for its tokens (`maxWaitMs`) is in flight:
  // ending the waits in preClose, before the server closes, answers them
  // (denied) at once, instead of holding app.close() as long as the longest
  // wait. Decisions go on until onClose; they just do not wait any more,
  // and their answers close their connections (see the top of this file).
  app.addHook('preClose', (done) => {
    layer.close()
    core.endWaits()
    done()
  })
  app.addHook('onClose', async () => {
    await core.limiter.close()
  })
}

/** `app.tollgate` and the request decorations. */
function decorate (app: FastifyInstance, decorator: TollgateDecorator): void {
  app.decorate('tollgate', decorator)
  app.decorateRequest('rateLimit', undefined)
  app.decorateRequest(kChecked, false)
  app.decorateRequest(HOLDS, undefined)
}

/**
 * Fastify's request identity and its words for the warnings. Fastify
 * defines `request.ips` only when it trusts proxies; it does not expose
 * its trustProxy setting, so the first request's `ips` getter is asked
 * about a made-up chain (lib/http/setup.ts, trustsEveryHop).
 */
const IDENTITY: Identity<FastifyRequest> = {
  ip: (request) => request.ip,
  logOf: (request) => request.log,
  refused: () => new BadRequestInputError(),
  noAddress: { where: 'as on a Unix socket', behindProxy: "set Fastify's `trustProxy` so that request.ip is the client's address" },
  proxy: {
    trustsNone: (request) => request.ips === undefined,
    header: (request, name) => request.headers[name],
    untrusted: (header) => `tollgate: a request carries ${header} but Fastify does not trust proxies, so every client behind the proxy shares the proxy's bucket; set Fastify's \`trustProxy\` option, or a \`key\` function (\`warnings: { proxy: false }\` silences this)`,
    everyHop: {
      trusts: (request) => trustsEveryHop((raw) => {
        const ips: unknown = Reflect.get(request, 'ips', { raw })
        return Array.isArray(ips) && ips.length === PROBE_HOPS.length + 1
      }),
      warning: `tollgate: Fastify's \`trustProxy\` trusts every address at every hop (\`trustProxy: true\`), so request.ip is whatever a client writes first in X-Forwarded-For, and a client that changes it gets a fresh bucket on every request; trust only your proxies' addresses (\`trustProxy: '127.0.0.1'\`, see "Behind a proxy" in tollgate's README), or give a \`key\` function (\`warnings: { trustProxy: false }\` silences this)`
    },
    showsIp: true
  }
}

/**
 * A settling route's onResponse hook: a sent response releases what the
 * request holds there, and Fastify waits for it before the route's later
 * onResponse hooks. Only on such a route (an instance-wide onResponse hook
 * would cost every request of the app its response listeners); a route the
 * gate compiles listens to its raw response instead (checker).
 */
function onResponse (layer: RequestLayer<FastifyRequest>): onResponseHookHandler {
  return function tollgateEnded (request, reply, done) {
    if (!layer.holding(request)) return done()
    void layer.ended(request, { how: 'finished', response: reply }).then(() => { done() })
  }
}

/** The gate: routes onRoute did not see, and 404s (see the top of this file). */
function gate (app: FastifyInstance, limitOf: LimitOf, notFound: FastifyLimit | null, check: Check): void {
  const late = new WeakMap<object, FastifyLimit | null | Error>()
  function unseen (request: FastifyRequest): FastifyLimit | null {
    if (request.is404) return notFound
    const config = request.routeOptions.config
    if (Reflect.get(config, kSeen) === true) return null
    let limit = late.get(config)
    if (limit === undefined) {
      try {
        limit = limitOf(config.method, config.url, config.rateLimit)
      } catch (err) {
        // What limitOf throws: the option error the gate replies with.
        limit = err as Error
      }
      late.set(config, limit)
    }
    if (limit instanceof Error) throw limit
    return limit
  }
  app.decorateRequest(kPending, undefined)
  app.addHook('onRequest', function tollgateGate (request: GateRequest, reply, done) {
    const limit = unseen(request)
    if (limit === null) return done()
    if (limit.hook === 'preHandler') {
      request[kPending] = limit
      return done()
    }
    check(limit, request, reply, done)
  })
  app.addHook('preHandler', function tollgatePendingGate (request: GateRequest, reply, done) {
    const limit = request[kPending]
    if (limit === undefined) return done()
    check(limit, request, reply, done)
  })
}

/** A route's limit for Fastify: the common one, with its hook. */
function compileFastify (name: string, config: unknown, defaults: Defaults, where?: string, listWhere?: string): FastifyLimit {
  const limit = compileRoute<FastifyRequest>(name, config, defaults, FASTIFY, where, listWhere)
  const hook = hookOption(routeWide(limit.fields, defaults, 'hook') ?? 'onRequest', 'hook')
  return { ...limit, hook, placement: PLACEMENT[hook] }
}

/**
 * Compiles a route's limit from its method, URL and `config.rateLimit`
 * (null: not limited). The HEAD route Fastify adds for a route with GET
 * spends from that route's bucket. (A HEAD route the gate compiles before
 * its GET route was seen is named `GET <url>`: right unless that route has
 * several methods.)
 */
function routeLimits (defaults: Defaults, global: boolean): LimitOf {
  const getRoutes = new Map<string, string>()
  return function limitOf (method: string | string[], url: string, config: unknown): FastifyLimit | null {
    if (config === false) return null
    if (config === undefined && !global) return null
    let name = routeName(method, url)
    if (method === 'HEAD') name = getRoutes.get(url) ?? name
    else if (name.startsWith('GET') || name.includes(',GET')) getRoutes.set(url, name)
    return compileFastify(name, config, defaults)
  }
}

/**
 * The limit of 404s: `notFound` over the plugin's options (null: not
 * limited). Unset, it follows `global`, and says so when the plugin's
 * options are no complete policy (every route sets its own).
 */
function notFoundLimit (option: TollgateOptions['notFound'], global: boolean, defaults: Defaults, app: FastifyInstance): FastifyLimit | null {
  if (option === undefined && global && (defaults.capacity === undefined || defaults.refillPerSecond === undefined)) {
    app.log.warn('tollgate: 404s are not limited: the plugin options set no `capacity` and `refillPerSecond` for them; set `notFound: { capacity, refillPerSecond }`, or `notFound: false` to say so')
    return null
  }
  const value = option ?? global
  if (value === false) return null
  return compileFastify(NOT_FOUND, value === true ? undefined : value, defaults, 'notFound.', 'notFound')
}

function notFoundOption (value: unknown, name: string): void {
  if (typeof value === 'boolean' || isRecord(value) || (Array.isArray(value) && value.length > 0)) return
  throw optionError(name, value, 'true, false, a policy object or a non-empty array of policies')
}

/** Adds `hook` after the route's own hooks of that name. */
function appendHook (route: { [name in Hook | 'onResponse']?: unknown }, name: Hook | 'onResponse', hook: unknown): void {
  const existing = route[name]
  route[name] = existing === undefined ? [hook] : [...(Array.isArray(existing) ? existing : [existing]), hook]
}

/**
 * The route-level hook: the check with the route's limit in a closure. A
 * callback hook, not an async one: Fastify chains no promise of its own on
 * it, and the check allocates no async function frame per request.
 */
function routeHook (limit: FastifyLimit, check: Check) {
  return function tollgateCheck (request: FastifyRequest, reply: FastifyReply, done: Done): void {
    check(limit, request, reply, done)
  }
}

const setHeader = (reply: FastifyReply, name: string, value: HeaderValue): void => { reply.header(name, value) }

/**
 * The check: once per request, the layer's decision, headers, then the 429
 * as a Fastify error (the app's error handler may reshape it; Fastify's
 * default one logs it at info level), and the 503 of an outage sent as a
 * reply, unless `throwUnavailable`. Fastify's default error handler logs
 * every error whose status is 500 or more at error level: thrown, each 503
 * of an outage the limit handles as declared would be an error line. The
 * reply is the body that handler would send, byte for byte. With
 * `problemDetails`, whose body that handler cannot write, the 429 is sent
 * as a reply too; `unavailable: 'throw'` hands both to the error handler.
 */
function checker (layer: RequestLayer<FastifyRequest>, throwUnavailable: boolean, hooked: WeakSet<FastifyLimit>): Check {
  /** Drops a request whose client has gone (see the top of this file); SENT: Fastify goes no further with it. */
  function drop (reply: FastifyReply): typeof SENT {
    reply.hijack()
    return SENT
  }
  /** What a decision makes of the request: undefined to go on, SENT when answered or dropped here, else the error to answer with. */
  function conclude (decided: Decided<FastifyRequest> | undefined, limit: FastifyLimit, request: Checked, reply: FastifyReply): Error | typeof SENT | undefined {
    // What the request holds is released when the raw response ends: sent
    // (unless the route's onResponse hook does it), or closed first (a
    // client gone, for which no onResponse hook runs): at once for a
    // request dropped here.
    if (layer.holding(request)) {
      const finishHooked = hooked.has(limit)
      whenEnded(reply.raw, (how) => { if (how === 'gone' || !finishHooked) void layer.ended(request, { how, response: reply }) })
    }
    if (reply.raw.destroyed) return drop(reply)
    layer.closeConnection(reply, setHeader)
    if (decided === undefined) return undefined
    const { decision } = decided
    request.rateLimit = decision
    const denial = answer(decided, reply, setHeader)
    if (denial === undefined) return undefined
    if (throwUnavailable) return denial.statusCode === 429 ? new RateLimitedError(denial.retryAfter) : new UnavailableError(denial.retryAfter)
    // Fastify's default error handler writes only its own JSON: a problem is sent as a reply.
    if (denial.statusCode === 429 && denial.violated === undefined) return new RateLimitedError(denial.retryAfter)
    sendDenial(reply, denial)
    return SENT
  }
  return function check (limit, request, reply, done) {
    if (request[kChecked] === true) return done()
    request[kChecked] = true
    if (reply.raw.destroyed) {
      drop(reply)
      return done()
    }
    // A failure of the decision or of its conclusion goes to `done`; what
    // Fastify runs after the hook is not taken for one.
    layer.decide(limit, request).then((decided) => conclude(decided, limit, request, reply)).then((outcome) => {
      if (outcome !== SENT) return done(outcome)
      // Fastify stops at a reply that has ended. One sent through an app's
      // async onSend hooks ends a microtask later: Fastify goes on then, as
      // it did when the check was an async hook, and finds it ended.
      queueMicrotask(done)
    }, done)
  }
}

function sendDenial (reply: FastifyReply, denial: Denial): void {
  reply.code(denial.statusCode).type(denialType(denial)).send(denialBody(denial))
}

function alreadyRegistered (): Error {
  const err = new Error('tollgate is already registered in this encapsulation context or in a parent of it: register it once, where its routes are (sibling contexts may each have their own); set per-route limits with config.rateLimit and other limits with app.tollgate')
  Object.defineProperty(err, 'code', { value: 'TOLLGATE_ALREADY_REGISTERED', enumerable: true })
  return err
}

export default fp(tollgate, { fastify: '5.x', name: 'tollgate' })
