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
// A request without a client address (`request.ip` is undefined on a Unix
// socket) is keyed as one shared client, 'no-address', never a 500; a
// warning says so once. A key per connection would give a client a fresh
// bucket per reconnect.

import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { BadRequestInputError, RateLimitedError, UnavailableError, describe, optionError } from './errors.js'
import { PolicyHeaders, retrySeconds, setHeaders, type HeaderMode } from './headers.js'
import { ipIdentity } from './keys.js'
import { checkPolicies, checkPolicy, createLimiter, kDecide, kWarm, shownDecision, type CoreLimiter } from './limiter.js'
import {
  DEFAULT_PREFIX, FAILURE_MODES, HEADER_MODES, HOOKS, breaker, checkFields, cost, denialCache, ipv6Subnet, lease, isBoolean,
  isFunction, isRecord, keyPrefix, localPolicy, lockout, maxWaitMs, nonEmptyString, oneOf, positiveInteger, positiveNumber, redisClient, warnings
} from './options.js'
import type { Policy } from './types.js'
import type { ProgrammaticPolicy, RoutePolicy, TollgateDecorator, TollgateOptions } from './plugin-types.js'

const kChecked = Symbol('tollgate.checked')
/** On a route's config: `onRoute` saw the route, the gate has nothing to do. */
const kSeen = Symbol('tollgate.seen')
/** On a request: the limit the gate found for a route whose check runs at preHandler. */
const kPending = Symbol('tollgate.pending')
const START_WAIT_MS = 2000
/** The bucket of 404s, unless the policy names one. */
const NOT_FOUND = '404'
/** The client identity of requests without an address. */
const NO_ADDRESS = 'no-address'

/** Options that may be set per route as well as for the plugin. */
const ROUTE_CHECKS = {
  capacity: positiveNumber,
  refillPerSecond: positiveNumber,
  cost,
  failureMode: oneOf(FAILURE_MODES),
  local: localPolicy,
  key: isFunction,
  bucket: nonEmptyString,
  timeout: positiveNumber,
  headers: oneOf(HEADER_MODES),
  hook: oneOf(HOOKS),
  allow: isFunction,
  lease,
  shadow: isBoolean,
  lockout,
  maxWaitMs
}

const PLUGIN_CHECKS = {
  ...ROUTE_CHECKS,
  redis: redisClient,
  global: isBoolean,
  prefix: keyPrefix,
  ipv6Subnet,
  breaker,
  denialCache,
  notFound: notFoundOption,
  warnings,
  maxWaiters: positiveInteger
}

/** Route-level settings: one per route, shared by all of its policies. */
const ROUTE_WIDE = ['key', 'headers', 'hook', 'allow'] as const

type CostFn = (request: FastifyRequest) => number | Promise<number>
type KeyFn = (request: FastifyRequest) => string | Promise<string>
type AllowFn = (request: FastifyRequest) => boolean | Promise<boolean>

type Hook = (typeof HOOKS)[number]

/** Everything a route's hook needs, resolved once when the route is added. */
interface RouteLimit {
  name: string
  hook: Hook
  policies: Policy[]
  costFns: Array<CostFn | undefined>
  key: KeyFn | undefined
  allow: AllowFn | undefined
  headers: HeaderMode
  policyHeaders: PolicyHeaders
}

/** The request, with the guard against checking it twice (kept off Fastify's public types). */
type Checked = FastifyRequest & { [kChecked]?: boolean }

type Check = (limit: RouteLimit, request: Checked, reply: FastifyReply) => Promise<void>
type GateRequest = FastifyRequest & { [kPending]?: RouteLimit }
type RouteConfig = Record<PropertyKey, unknown> & { url?: string, method?: string | string[], rateLimit?: unknown }

async function tollgate (app: FastifyInstance, options: TollgateOptions): Promise<void> {
  if (app.hasDecorator('tollgate')) throw alreadyRegistered()
  const input: unknown = options
  if (!isRecord(input)) throw optionError('options', input, 'an object')
  checkFields(input, PLUGIN_CHECKS, '', { failureMode: "one of 'open', 'closed', 'local' (there is no default: choose per limit)" })
  const defaults = pick(options)
  checkDefaults(defaults, '')

  const subnet = options.ipv6Subnet ?? 56
  const limiter = createLimiter({
    redis: options.redis,
    prefix: options.prefix ?? DEFAULT_PREFIX,
    timeout: options.timeout,
    breaker: options.breaker,
    denialCache: options.denialCache,
    maxWaiters: options.maxWaiters,
    logger: app.log
  })
  const global = options.global ?? true

  if (options.redis === undefined) {
    app.log.warn('tollgate: no `redis` given, limits are kept in this process only; with several app servers each one counts on its own')
  } else {
    const started = Date.now()
    await waitReady(options.redis, START_WAIT_MS)
    if (options.redis.status === 'ready') await within(limiter[kWarm](), START_WAIT_MS - (Date.now() - started))
    else app.log.warn({ status: options.redis.status }, `tollgate: Redis is not ready after ${START_WAIT_MS} ms; limits follow their failure modes until it connects (attach an 'error' listener to the client to see why)`)
  }
  const onIp = options.warnings === false || options.warnings?.proxy === false ? undefined : proxyWarning(app)

  const merged = new WeakMap<object, Policy>()
  function programmatic (policy: ProgrammaticPolicy): Policy {
    let core = merged.get(policy)
    if (core === undefined) {
      if (!isRecord(policy)) throw optionError('policy', policy, 'a policy object')
      if (typeof policy.cost === 'function') throw optionError('policy.cost', policy.cost, 'a number (pass a computed cost as the third argument)')
      for (const name of ROUTE_WIDE) {
        if (policy[name] !== undefined) throw optionError(`policy.${name}`, policy[name], 'unset: it is a route setting (the client key is the first argument)')
      }
      core = toPolicy({ ...defaults, ...policy, cost: policy.cost ?? (typeof defaults.cost === 'number' ? defaults.cost : undefined) }, policy.bucket, 'policy.')
      merged.set(policy, core)
    }
    return core
  }
  const decorator: TollgateDecorator = {
    consume: async (clientKey, policy, spend) => await limiter.consume(clientKey, programmatic(policy), spend),
    peek: async (clientKey, policy) => await limiter.peek(clientKey, programmatic(policy)),
    reset: (clientKey, bucket) => limiter.reset(clientKey, bucket),
    limiter
  }
  app.decorate('tollgate', decorator)
  app.decorateRequest('rateLimit', undefined)
  app.decorateRequest(kChecked, false)

  const check = checker(limiter, subnet, app, onIp)
  const limitOf = routeLimits(defaults, global)
  const notFound = notFoundLimit(options.notFound, global, defaults, app)

  app.addHook('onRoute', (route) => {
    const config = (route.config as RouteConfig | undefined)?.rateLimit
    route.config = { ...route.config, [kSeen]: true } as typeof route.config
    const limit = limitOf(route.method, route.url, config)
    if (limit === null) return
    const hook = routeHook(limit, check)
    const existing = route[limit.hook]
    route[limit.hook] = existing === undefined ? [hook] : [...(Array.isArray(existing) ? existing : [existing]), hook]
  })

  // The gate: routes onRoute did not see, and 404s (see the top of this file).
  const late = new WeakMap<object, RouteLimit | null | Error>()
  function unseen (request: FastifyRequest): RouteLimit | null {
    if (request.is404) return notFound
    const config = request.routeOptions.config as RouteConfig
    if (config[kSeen] === true) return null
    let limit = late.get(config)
    if (limit === undefined) {
      try {
        limit = limitOf(config.method as string | string[], config.url as string, config.rateLimit)
      } catch (err) {
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
    check(limit, request, reply).then(() => done(), done)
  })
  app.addHook('preHandler', function tollgatePendingGate (request: GateRequest, reply, done) {
    const limit = request[kPending]
    if (limit === undefined) return done()
    check(limit, request, reply).then(() => done(), done)
  })

  app.addHook('onClose', async () => {
    await limiter.close()
  })
}

/**
 * Compiles a route's limit from its method, URL and `config.rateLimit`
 * (null: not limited). The HEAD route Fastify adds for a route with GET
 * spends from that route's bucket. (A HEAD route the gate compiles before
 * its GET route was seen is named `GET <url>`: right unless that route has
 * several methods.)
 */
function routeLimits (defaults: RoutePolicy, global: boolean) {
  const getRoutes = new Map<string, string>()
  return function limitOf (method: string | string[], url: string, config: unknown): RouteLimit | null {
    if (config === false) return null
    if (config === undefined && !global) return null
    let name = routeName(method, url)
    if (method === 'HEAD') name = getRoutes.get(url) ?? name
    else if (name.startsWith('GET') || name.includes(',GET')) getRoutes.set(url, name)
    return compileRoute(name, config, defaults)
  }
}

/**
 * The limit of 404s: `notFound` over the plugin's options (null: not
 * limited). Unset, it follows `global`, and says so when the plugin's
 * options are no complete policy (every route sets its own).
 */
function notFoundLimit (option: TollgateOptions['notFound'], global: boolean, defaults: RoutePolicy, app: FastifyInstance): RouteLimit | null {
  if (option === undefined && global && (defaults.capacity === undefined || defaults.refillPerSecond === undefined)) {
    app.log.warn('tollgate: 404s are not limited: the plugin options set no `capacity` and `refillPerSecond` for them; set `notFound: { capacity, refillPerSecond }`, or `notFound: false` to say so')
    return null
  }
  const value = option ?? global
  if (value === false) return null
  return compileRoute(NOT_FOUND, value === true ? undefined : value, defaults, 'notFound.', 'notFound')
}

function notFoundOption (value: unknown, name: string): void {
  if (typeof value === 'boolean' || isRecord(value) || (Array.isArray(value) && value.length > 0)) return
  throw optionError(name, value, 'true, false, a policy object or a non-empty array of policies')
}

/** The route-level hook: the check with the route's limit in a closure. */
function routeHook (limit: RouteLimit, check: Check) {
  return function tollgateCheck (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    return check(limit, request, reply)
  }
}

/** The check: identity, cost, one store decision, headers, 429 or 503. */
function checker (limiter: CoreLimiter, subnet: number, app: FastifyInstance, onIp: ((request: FastifyRequest) => void) | undefined): Check {
  let warned = false
  function address (request: FastifyRequest): string {
    const ip: string | undefined = request.ip
    if (ip !== undefined && ip !== '') return ipIdentity(ip, subnet)
    if (!warned) {
      warned = true
      app.log.warn(`tollgate: a request came with no client address (as on a Unix socket): such requests share the client identity "${NO_ADDRESS}", one bucket for all of them. Behind a proxy, set Fastify's \`trustProxy\` so that request.ip is the client's address; otherwise give a \`key\` function`)
    }
    return NO_ADDRESS
  }

  return async function check (limit, request, reply) {
    if (request[kChecked] === true) return
    request[kChecked] = true
    if (limit.allow !== undefined) {
      let skip = run(limit, 'allow', limit.allow, request)
      if (skip instanceof Promise) skip = await skip
      if (skip === true) return
    }

    let client: unknown
    if (limit.key === undefined) {
      onIp?.(request)
      client = address(request)
    } else {
      client = run(limit, 'key', limit.key, request)
      if (client instanceof Promise) client = await client
      if (typeof client !== 'string' || client.length === 0) {
        throw new BadRequestInputError(limit.name, `\`key\` must return a non-empty string, got ${describe(client)}`)
      }
    }

    let costs: number[] | undefined
    for (let i = 0; i < limit.costFns.length; i++) {
      const fn = limit.costFns[i]
      if (fn === undefined) continue
      const policy = limit.policies[i] as Policy
      let value: unknown = run(limit, 'cost', fn, request)
      if (value instanceof Promise) value = await value
      if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0 || value > policy.capacity) {
        throw new BadRequestInputError(limit.name, `\`cost\` must return a finite number > 0 and <= capacity (${policy.capacity}), got ${describe(value)}`)
      }
      costs ??= limit.policies.map((p) => p.cost ?? 1)
      costs[i] = value
    }

    const decision = await limiter[kDecide](client as string, limit.policies, costs, true)
    request.rateLimit = decision
    if (decision.source === 'fail-open') return
    if (decision.source === 'fail-closed') {
      const seconds = retrySeconds(decision.retryAfterMs)
      reply.header('retry-after', seconds)
      throw new UnavailableError(seconds)
    }
    setHeaders(reply, limit.headers, shownDecision(decision, limit.policies), limit.policyHeaders)
    if (!decision.allowed) throw new RateLimitedError(retrySeconds(decision.retryAfterMs))
  }
}

/**
 * Without trustProxy, request.ip is the proxy's address: behind a proxy
 * every client would share one bucket. Fastify defines `request.ips` only
 * when it trusts proxies, so a forwarding header without it is the sign.
 * Warns once per plugin instance, then costs nothing.
 */
function proxyWarning (app: FastifyInstance): (request: FastifyRequest) => void {
  let armed = true
  return (request) => {
    if (!armed || request.ips !== undefined) return
    const header = request.headers['x-forwarded-for'] !== undefined ? 'X-Forwarded-For' : request.headers.forwarded !== undefined ? 'Forwarded' : undefined
    if (header === undefined) return
    armed = false
    app.log.warn({ header, ip: request.ip }, `tollgate: a request carries ${header} but Fastify does not trust proxies, so every client behind the proxy shares the proxy's bucket; set Fastify's \`trustProxy\` option, or a \`key\` function (\`warnings: { proxy: false }\` silences this)`)
  }
}

function alreadyRegistered (): Error {
  const err = new Error('tollgate is already registered in this encapsulation context or in a parent of it: register it once, where its routes are (sibling contexts may each have their own); set per-route limits with config.rateLimit and other limits with app.tollgate')
  Object.defineProperty(err, 'code', { value: 'TOLLGATE_ALREADY_REGISTERED', enumerable: true })
  return err
}

/**
 * Runs a user function of the route; its failure becomes a 500 that names
 * the route. A synchronous result is returned as it is, so the common
 * synchronous `key` costs no extra promise.
 */
function run<T> (limit: RouteLimit, what: string, fn: (request: FastifyRequest) => T | Promise<T>, request: FastifyRequest): T | Promise<T> {
  let out: T | Promise<T>
  try {
    out = fn(request)
  } catch (cause) {
    throw failed(limit, what, cause)
  }
  if (out instanceof Promise) return out.catch((cause: unknown) => { throw failed(limit, what, cause) })
  return out
}

function failed (limit: RouteLimit, what: string, cause: unknown): Error {
  const err = new BadRequestInputError(limit.name, `\`${what}\` threw: ${(cause as Error)?.message ?? describe(cause)}`)
  err.cause = cause
  return err
}

/** Resolves a route's `config.rateLimit` (object, array or undefined) over the plugin's defaults. */
function compileRoute (name: string, config: unknown, defaults: RoutePolicy, where = `config.rateLimit of ${name}: `, listWhere = where): RouteLimit {
  const list: unknown[] = config === undefined ? [{}] : Array.isArray(config) ? config : [config]
  if (list.length === 0) throw optionError(`${where}rateLimit`, config, 'a policy, a non-empty array of policies, or false')
  const policies: Policy[] = []
  const costFns: Array<CostFn | undefined> = []
  const buckets = new Set<string>()
  for (let i = 0; i < list.length; i++) {
    const entry = list[i]
    const at = list.length === 1 ? where : `${listWhere}[${i}].`
    if (!isRecord(entry)) throw optionError(at.slice(0, -1), entry, 'a policy object')
    checkFields(entry, ROUTE_CHECKS, at)
    if (list.length > 1 && entry.lease !== undefined) throw optionError(`${at}lease`, entry.lease, 'unset in an array of policies (leases serve single-policy routes)')
    const base = defaults.bucket ?? name
    const merged: RoutePolicy = { ...defaults, ...entry }
    if (list.length > 1) delete merged.lease
    const policy = toPolicy(merged, (entry.bucket as string | undefined) ?? (i === 0 ? base : `${base}#${i}`), at)
    if (buckets.has(policy.bucket)) throw optionError(`${at}bucket`, policy.bucket, 'a name used once per route')
    buckets.add(policy.bucket)
    const spend = entry.cost ?? defaults.cost
    costFns.push(typeof spend === 'function' ? spend as CostFn : undefined)
    policies.push(policy)
  }
  checkPolicies(policies, `${listWhere}rateLimit`)
  for (const field of ROUTE_WIDE) {
    const values = new Set(list.map((e) => (e as Record<string, unknown>)[field]).filter((v) => v !== undefined))
    if (values.size > 1) throw optionError(`${where}${field}`, [...values][0], `the same in every policy of the route (it is one per route)`)
  }
  const shown = policies.filter((p) => p.shadow !== true)
  const headers = (shown.length === 0 ? false : findWide(config, 'headers') ?? defaults.headers ?? 'draft-6') as HeaderMode
  return {
    name,
    hook: (findWide(config, 'hook') ?? defaults.hook ?? 'onRequest') as Hook,
    policies,
    costFns,
    key: (findWide(config, 'key') ?? defaults.key) as KeyFn | undefined,
    allow: (findWide(config, 'allow') ?? defaults.allow) as AllowFn | undefined,
    headers,
    policyHeaders: new PolicyHeaders(shown, shown.flatMap((p) => p.local === undefined ? [] : [{ ...p.local, bucket: p.bucket }]))
  }
}

/** A merged route or programmatic policy as the core's Policy; names the missing field. */
function toPolicy (merged: RoutePolicy, bucket: string, where: string): Policy {
  for (const name of ['capacity', 'refillPerSecond'] as const) {
    if (merged[name] === undefined) throw optionError(where + name, undefined, 'a finite number > 0 (set it on the plugin or the route)')
  }
  const policy: Policy = {
    bucket,
    capacity: merged.capacity as number,
    refillPerSecond: merged.refillPerSecond as number,
    failureMode: merged.failureMode as Policy['failureMode']
  }
  if (typeof merged.cost === 'number') policy.cost = merged.cost
  if (merged.local !== undefined) policy.local = merged.local
  if (merged.timeout !== undefined) policy.timeout = merged.timeout
  if (merged.lease !== undefined) policy.lease = merged.lease
  if (merged.shadow !== undefined) policy.shadow = merged.shadow
  if (merged.lockout !== undefined) policy.lockout = merged.lockout
  if (merged.maxWaitMs !== undefined) policy.maxWaitMs = merged.maxWaitMs
  checkPolicy(policy, where)
  return policy
}

/** Checks the plugin-level defaults that are checkable before any route merges over them. */
function checkDefaults (defaults: RoutePolicy, where: string): void {
  if (typeof defaults.cost === 'number' && defaults.capacity !== undefined && defaults.cost > defaults.capacity) {
    throw optionError(where + 'cost', defaults.cost, `at most capacity (${defaults.capacity})`)
  }
  if (defaults.lease !== undefined && defaults.capacity !== undefined && defaults.lease.tokens > defaults.capacity) {
    throw optionError(where + 'lease.tokens', defaults.lease.tokens, `at most capacity (${defaults.capacity})`)
  }
  if (defaults.failureMode === 'local' && defaults.local === undefined) {
    throw optionError(where + 'local', undefined, "an object { capacity, refillPerSecond } with failureMode 'local'")
  }
}

function pick (options: TollgateOptions): RoutePolicy {
  const out: Record<string, unknown> = {}
  for (const name of Object.keys(ROUTE_CHECKS)) {
    const value = (options as unknown as Record<string, unknown>)[name]
    if (value !== undefined) out[name] = value
  }
  return out as RoutePolicy
}

function findWide (config: unknown, field: (typeof ROUTE_WIDE)[number]): unknown {
  const list: unknown[] = Array.isArray(config) ? config : [config]
  for (const entry of list) {
    if (isRecord(entry) && entry[field] !== undefined) return entry[field]
  }
  return undefined
}

/** `GET /users/:id`: the route pattern, never the raw URL; HEAD spends from GET's bucket. */
function routeName (method: string | string[], url: string): string {
  const methods = (Array.isArray(method) ? [...method] : [method]).map((m) => m === 'HEAD' ? 'GET' : m)
  return `${[...new Set(methods)].sort().join(',')} ${url}`
}

/**
 * Waits, up to `ms`, for the client to be connected, so that the first
 * requests after `listen` are decided by Redis (then, within the same
 * budget, the scripts are loaded on every master). A client created with
 * `lazyConnect` is asked to connect, since the limiter sends nothing to a
 * client that is not connected.
 */
async function waitReady (redis: NonNullable<TollgateOptions['redis']>, ms: number): Promise<void> {
  if (redis.status === 'ready') return
  if (redis.status === 'wait') redis.connect().catch(() => {})
  await new Promise<void>((resolve) => {
    const done = (): void => {
      clearTimeout(timer)
      redis.off('ready', done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    redis.on('ready', done)
  })
}

/** Waits for `promise` at most `ms` (never rejects). */
async function within (promise: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  await Promise.race([promise, new Promise<void>((resolve) => { timer = setTimeout(resolve, Math.max(0, ms)) })])
  clearTimeout(timer)
}

export default fp(tollgate, { fastify: '5.x', name: 'tollgate' })
