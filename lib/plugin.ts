import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify'
import fp from 'fastify-plugin'
import { BadRequestInputError, RateLimitedError, UnavailableError, describe, optionError } from './errors.js'
import { PolicyHeaders, retrySeconds, setHeaders, type HeaderMode } from './headers.js'
import { ipIdentity } from './keys.js'
import { checkPolicy, createLimiter, kDecide, kWarm, type CoreLimiter } from './limiter.js'
import {
  DEFAULT_PREFIX, FAILURE_MODES, HEADER_MODES, HOOKS, breaker, checkFields, cost, denialCache, ipv6Subnet, lease, isBoolean,
  isFunction, isRecord, keyPrefix, localPolicy, nonEmptyString, oneOf, positiveNumber, redisClient, warnings
} from './options.js'
import type { Policy } from './types.js'
import type { ProgrammaticPolicy, RoutePolicy, TollgateDecorator, TollgateOptions } from './plugin-types.js'

const kChecked = Symbol('tollgate.checked')
const START_WAIT_MS = 2000

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
  lease
}

const PLUGIN_CHECKS = {
  ...ROUTE_CHECKS,
  redis: redisClient,
  global: isBoolean,
  prefix: keyPrefix,
  ipv6Subnet,
  breaker,
  denialCache,
  warnings
}

/** Route-level settings: one per route, shared by all of its policies. */
const ROUTE_WIDE = ['key', 'headers', 'hook', 'allow'] as const

type CostFn = (request: FastifyRequest) => number | Promise<number>
type KeyFn = (request: FastifyRequest) => string | Promise<string>
type AllowFn = (request: FastifyRequest) => boolean | Promise<boolean>

/** Everything a route's hook needs, resolved once when the route is added. */
interface RouteLimit {
  name: string
  policies: Policy[]
  costFns: Array<CostFn | undefined>
  key: KeyFn | undefined
  allow: AllowFn | undefined
  headers: HeaderMode
  policyHeaders: PolicyHeaders
}

/** The request, with the guard against checking it twice (kept off Fastify's public types). */
type Checked = FastifyRequest & { [kChecked]?: boolean }

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

  // The HEAD route Fastify adds for a route with GET spends from that route's bucket.
  const getRoutes = new Map<string, string>()
  app.addHook('onRoute', (route) => {
    const config = (route.config as { rateLimit?: unknown } | undefined)?.rateLimit
    if (config === false) return
    if (config === undefined && !global) return
    let name = routeName(route)
    if (route.method === 'HEAD') name = getRoutes.get(route.url) ?? name
    else if (name.startsWith('GET') || name.includes(',GET')) getRoutes.set(route.url, name)
    const limit = compileRoute(name, config, defaults)
    const hook = routeHook(limit, limiter, subnet, onIp)
    const where = (findWide(config, 'hook') ?? defaults.hook ?? 'onRequest') as 'onRequest' | 'preHandler'
    const existing = route[where]
    route[where] = existing === undefined ? [hook] : [...(Array.isArray(existing) ? existing : [existing]), hook]
  })

  app.addHook('onClose', async () => {
    await limiter.close()
  })
}

/** The per-route hook: identity, cost, one store decision, headers, 429 or 503. */
function routeHook (limit: RouteLimit, limiter: CoreLimiter, subnet: number, onIp: ((request: FastifyRequest) => void) | undefined) {
  return async function tollgateCheck (request: Checked, reply: FastifyReply): Promise<void> {
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
      client = ipIdentity(request.ip, subnet)
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
    setHeaders(reply, limit.headers, decision, limit.policyHeaders)
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
function compileRoute (name: string, config: unknown, defaults: RoutePolicy): RouteLimit {
  const where = `config.rateLimit of ${name}: `
  const list: unknown[] = config === undefined ? [{}] : Array.isArray(config) ? config : [config]
  if (list.length === 0) throw optionError(`${where}rateLimit`, config, 'a policy, a non-empty array of policies, or false')
  const policies: Policy[] = []
  const costFns: Array<CostFn | undefined> = []
  const buckets = new Set<string>()
  for (let i = 0; i < list.length; i++) {
    const entry = list[i]
    const at = list.length === 1 ? where : `${where}[${i}].`
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
  for (const field of ROUTE_WIDE) {
    const values = new Set(list.map((e) => (e as Record<string, unknown>)[field]).filter((v) => v !== undefined))
    if (values.size > 1) throw optionError(`${where}${field}`, [...values][0], `the same in every policy of the route (it is one per route)`)
  }
  const headers = (findWide(config, 'headers') ?? defaults.headers ?? 'draft-6') as HeaderMode
  return {
    name,
    policies,
    costFns,
    key: (findWide(config, 'key') ?? defaults.key) as KeyFn | undefined,
    allow: (findWide(config, 'allow') ?? defaults.allow) as AllowFn | undefined,
    headers,
    policyHeaders: new PolicyHeaders(policies, policies.flatMap((p) => p.local === undefined ? [] : [{ ...p.local, bucket: p.bucket }]))
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
function routeName (route: RouteOptions): string {
  const methods = (Array.isArray(route.method) ? [...route.method] : [route.method]).map((m) => m === 'HEAD' ? 'GET' : m)
  return `${[...new Set(methods)].sort().join(',')} ${route.url}`
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
