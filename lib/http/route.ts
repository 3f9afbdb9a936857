// A route's limit, compiled once, whatever the framework.
//
// Each adapter names a route (`GET /users/:id`: the method and the route
// pattern, never the raw URL) and hands over what the app wrote for it (a
// Fastify route's `config.rateLimit`, the argument of Express's `limit()`):
// one policy, several checked together, or nothing (the adapter's own
// options). Here that is merged over the adapter's options and checked, so
// that the per-request path (lib/http/request.ts) holds only resolved values.
// The settings that are one per route (`key`, `headers`, `allow`, `settle`,
// and Fastify's `hook`) must agree across a route's policies; the rest is per
// policy. An adapter adds its own route settings through a `Dialect`.

import { describe, optionError } from '../core/errors.js'
import { PolicyHeaders, headerMode, type HeaderMode } from './headers.js'
import { CORE_POLICY_CHECKS, checkCost, checkPolicies, parsePolicy } from '../core/policy.js'
import { SLOTS_ONLY, checkCombination, checkLocalSet, policyFields } from '../core/policy-fields.js'
import { hasSlots } from '../core/concurrency.js'
import { cost, isBoolean, isFunction, isRecord, parseFields, planFunction, type AppFunction, type Parsed, type Parsers } from '../core/options.js'
import type { Adapter } from '../core/migrating.js'
import { checkSettle, type SettleFunction } from './settle-route.js'
import { compileTiers, type LimitFunction, type Tiers } from './tiers.js'
import type { Policy } from '../core/types.js'

/**
 * Options every adapter takes per route as well as for itself: a core
 * policy's fields (checked as the core checks them), with `cost` that may be
 * a function of the request, and the route's own settings.
 */
export const POLICY_CHECKS = {
  ...CORE_POLICY_CHECKS,
  cost,
  key: isFunction,
  headers: headerMode,
  problemDetails: isBoolean,
  partitionKey: isBoolean,
  allow: isFunction,
  limit: planFunction,
  settle: isFunction
}

/** Route-level settings: one per route, shared by all of its policies. */
export const ROUTE_WIDE: readonly string[] = ['key', 'headers', 'problemDetails', 'partitionKey', 'allow', 'settle']

/**
 * Settings that only a route has, refused in a programmatic policy. Its plans
 * (`limit`) are left to the unknown-option error, which tells tollgate's
 * function from express-rate-limit's number (lib/core/migrating.ts).
 */
const ROUTE_ONLY = ['key', 'headers', 'problemDetails', 'partitionKey', 'hook', 'allow', 'settle']

/**
 * The names a programmatic policy may have: a route's policy but for its
 * route settings and its plans (`limit`). Checked before the merge, which
 * keeps known fields only and would drop a misspelt one unseen.
 */
const PROGRAMMATIC_CHECKS: Parsers = Object.fromEntries(
  Object.entries(POLICY_CHECKS).filter(([name]) => !ROUTE_ONLY.includes(name) && name !== 'limit')
)

/** A route's settings, parsed: the fields POLICY_CHECKS knows, and an adapter's own (Fastify's `hook`). */
export type RouteFields = Parsed<typeof POLICY_CHECKS> & { readonly [adapterOwn: string]: unknown }

/** What an adapter adds to a route's settings (Fastify: `hook`). */
export interface Dialect {
  /** Parsers of every option a route may set: POLICY_CHECKS and the adapter's own. */
  checks: typeof POLICY_CHECKS & Parsers
  /** The names among them that are one per route. */
  wide: readonly string[]
  /** Where a missing capacity or rate can be set, for the error message. */
  hint: string
  /** Whose users write the route's policies, for the hints of other libraries' names (lib/core/migrating.ts). */
  adapter: Adapter
  /** Where the check runs, and what to change when a function of the app finds the request without what it reads (RouteLimit's). */
  placement: string
  /** What the app calls to set a route's policies, as error messages name it: `limit()`, `@RateLimit()`. */
  call: string
}

export const BASE_DIALECT: Dialect = {
  checks: POLICY_CHECKS,
  wide: ROUTE_WIDE,
  hint: 'set it on the plugin or the route',
  adapter: 'fastify',
  placement: 'the check runs before the route\'s handler',
  call: 'config.rateLimit'
}

/** A function of the request, as the app wrote it; its result is checked per request. */
export type RequestFn<Req, T> = (request: Req) => T | Promise<T>

/** The adapter's options that routes merge over (its parsed options: the store's are never read here). */
export type Defaults = RouteFields

/** Everything one request's check needs, resolved once per route. */
export interface RouteLimit<Req> {
  /** The route's name (`GET /users/:id`), used in error messages. */
  name: string
  policies: Policy[]
  /** Per policy: its `cost` function, if it has one. */
  costFns: Array<RequestFn<Req, number> | undefined>
  key: RequestFn<Req, string> | undefined
  allow: RequestFn<Req, boolean> | undefined
  headers: HeaderMode
  policyHeaders: PolicyHeaders
  /** Denials are answered as RFC 9457 problem details (default false). */
  problemDetails: boolean
  /** draft-11's RateLimit items carry the client's partition key `pk` (default false). */
  partitionKey: boolean
  /** A policy of the route limits concurrency: its requests acquire slots (lib/core/concurrency.ts). */
  slots: boolean
  /** The per-client plans of the route's policies (lib/http/tiers.ts), if any has a `limit`. */
  tiers: Tiers<Req, RouteLimit<Req>> | undefined
  /** Charging by outcome (lib/http/settle-route.ts): the actual cost, from the request and the response. */
  settle: SettleFunction<Req, never> | undefined
  /** The route's policies as parsed, where an adapter reads its own settings (routeWide). */
  fields: readonly RouteFields[]
  /**
   * Where the check runs, and what to change when `key` or `cost` finds the
   * request without what it reads (the body, a user set by authentication):
   * the adapter's words, in the log line of a function that threw.
   */
  placement: string
  /**
   * The route's own answer to a denial, over the options' (the `handler` of
   * tollgate/express and tollgate/hono; the Fastify plugin has none: its
   * routes answer through Fastify's error handler). Typed by the adapter.
   */
  handler: AppFunction | undefined
}

/**
 * Compiles a route's limit from `config` (a policy, an array of policies or
 * undefined) over `defaults`. `where` prefixes option names in errors;
 * `listWhere` does for an array's entries.
 */
export function compileRoute<Req> (
  name: string, config: unknown, defaults: Defaults, dialect: Dialect = BASE_DIALECT,
  where = `${dialect.call} of ${name}: `, listWhere = where
): RouteLimit<Req> {
  const list: unknown[] = config === undefined ? [{}] : Array.isArray(config) ? config : [config]
  if (list.length === 0) throw optionError(`${where}rateLimit`, config, 'a policy, a non-empty array of policies, or false')
  const entries: RouteFields[] = []
  const policies: Policy[] = []
  const costFns: Array<RequestFn<Req, number> | undefined> = []
  const buckets = new Set<string>()
  for (let i = 0; i < list.length; i++) {
    const entry = list[i]
    const at = list.length === 1 ? where : `${listWhere}[${i}].`
    if (!isRecord(entry)) throw optionError(at.slice(0, -1), entry, 'a policy object')
    const fields: RouteFields = parseFields(entry, dialect.checks, at, {}, dialect.adapter)
    // Before the merge, which drops the adapter's lease from a list's policies.
    if (list.length > 1) checkCombination({ lease: fields.lease }, ['list'], at)
    if (fields.concurrency !== undefined && fields.limit !== undefined) {
      throw optionError(`${at}limit`, fields.limit, 'unset with `concurrency` (a plan sizes a rate: list a rate policy beside it)')
    }
    const base = defaults.bucket ?? name
    const merged: RouteFields = { ...mergedOver(defaults, fields), ...(list.length > 1 ? { lease: undefined } : {}) }
    const policy = toPolicy(merged, fields.bucket ?? (i === 0 ? base : `${base}#${i}`), at, dialect.hint, dialect.adapter)
    if (buckets.has(policy.bucket)) throw optionError(`${at}bucket`, policy.bucket, 'a name used once per route')
    buckets.add(policy.bucket)
    costFns.push(declared<RequestFn<Req, number>>(merged.cost))
    entries.push(fields)
    policies.push(policy)
  }
  checkPolicies(policies, listWhere === where ? `${where}rateLimit` : listWhere)
  for (const field of dialect.wide) {
    const values = new Set(entries.map((e) => e[field]).filter((v) => v !== undefined))
    if (values.size > 1) throw optionError(`${where}${field}`, [...values][0], 'the same in every policy of the route (it is one per route)')
  }
  const settle = declared<SettleFunction<Req, never>>(routeWide(entries, defaults, 'settle'))
  checkSettle(settle, policies, where)
  // Shadow policies never show in the headers: a client is not told of a limit that does not hold.
  const shown = policies.filter((p) => p.shadow !== true)
  const headers = routeWide(entries, defaults, 'headers') ?? 'draft-6'
  const partitionKey = routeWide(entries, defaults, 'partitionKey') ?? false
  // `pk` is a parameter of draft-11 only: set for another mode, it would be silently dropped.
  if (partitionKey && headers !== 'draft-11') throw optionError(`${where}partitionKey`, true, "set with headers: 'draft-11' only (the one mode with a partition key)", `true with headers ${describe(headers)}`)
  return {
    name,
    policies,
    costFns,
    key: declared<RequestFn<Req, string>>(routeWide(entries, defaults, 'key')),
    allow: declared<RequestFn<Req, boolean>>(routeWide(entries, defaults, 'allow')),
    headers: shown.length === 0 ? false : headers,
    policyHeaders: new PolicyHeaders(shown, shown.flatMap((p) => p.local === undefined ? [] : [{ ...p.local, bucket: p.bucket }])),
    problemDetails: routeWide(entries, defaults, 'problemDetails') ?? false,
    partitionKey,
    slots: policies.some(hasSlots),
    // The adapter's plan sizes its rate policies, never a concurrency policy (mergedOver).
    tiers: compileTiers(entries.map((e) => declared<LimitFunction<Req>>(e.concurrency === undefined ? e.limit ?? defaults.limit : undefined))),
    settle,
    fields: entries,
    placement: dialect.placement,
    handler: appFunction(routeWide(entries, defaults, 'handler'))
  }
}

/**
 * An app's function (`key`, `allow`, `cost`, `limit`, `settle`) typed as its
 * option declares it. Parsing knows only that it is a function; what it
 * returns is checked at each call (lib/http/request.ts, tiers.ts,
 * settle-route.ts), so the declared signature is safe to take: the one cast
 * of route compilation.
 */
function declared<F> (fn: AppFunction | number | undefined): F | undefined {
  return typeof fn === 'function' ? fn as F : undefined
}

/** A setting of an adapter's own (parsed by its dialect as a function), or undefined. */
function appFunction (value: unknown): AppFunction | undefined {
  return typeof value === 'function' ? value as AppFunction : undefined
}

/**
 * A policy's fields over the adapter's: a concurrency policy takes none of
 * the adapter's rate sizes or cost (SPEC 13: they do not apply to it), so
 * that only the ones it sets itself are refused (lib/core/policy-fields.ts).
 */
function mergedOver (defaults: Defaults, fields: RouteFields): RouteFields {
  if (fields.concurrency === undefined) return { ...defaults, ...fields }
  const { capacity: _capacity, refillPerSecond: _refill, cost: _cost, ...rest } = defaults
  return { ...rest, ...fields }
}

/** A route-wide setting: from the route's policies (parsed), else the adapter's options. */
export function routeWide<K extends keyof RouteFields> (entries: readonly RouteFields[], defaults: Defaults, field: K): RouteFields[K] {
  for (const entry of entries) {
    if (entry[field] !== undefined) return entry[field]
  }
  return defaults[field]
}

/** A merged route or programmatic policy as the core's Policy; names the missing field (`adapter`: whose names a foreign one is read as). */
export function toPolicy (merged: RouteFields, bucket: string, where: string, hint = BASE_DIALECT.hint, adapter: Adapter = BASE_DIALECT.adapter): Policy {
  // The core's fields only: a route's own settings, and a cost that is a function of the request, are not the core's.
  // A slot has no cost: a cost function there would be silently ignored.
  if (merged.concurrency !== undefined && typeof merged.cost === 'function') throw optionError(where + 'cost', merged.cost, SLOTS_ONLY)
  const core = { ...policyFields(merged), bucket, cost: typeof merged.cost === 'number' ? merged.cost : undefined }
  return parsePolicy(core, where, adapter, `a finite number > 0 (${hint})`)
}

/** Checks the adapter-level defaults that are checkable before any route merges over them. */
export function checkDefaults (defaults: Defaults, where: string): void {
  const { capacity, cost, lease, shadow } = defaults
  if (typeof cost === 'number' && capacity !== undefined && shadow !== true) checkCost(cost, { capacity }, (bound) => optionError(where + 'cost', cost, `at most ${bound}`))
  if (lease !== undefined && capacity !== undefined && lease.tokens > capacity) {
    throw optionError(where + 'lease.tokens', lease.tokens, `at most capacity (${capacity})`)
  }
  checkLocalSet(defaults, where)
}

/** `GET /users/:id`: the route pattern, never the raw URL; HEAD spends from GET's bucket. */
export function routeName (method: string | readonly string[], pattern: string): string {
  const methods = (typeof method === 'string' ? [method] : [...method]).map((m) => m === 'HEAD' ? 'GET' : m)
  return `${[...new Set(methods)].sort().join(',')} ${pattern}`
}

/** A policy of the programmatic API (`consume`, `peek`): it names its bucket, its cost is a number. */
export interface NamedPolicy {
  bucket: string
  cost?: number | undefined
}

/**
 * The programmatic API's policies: each merged over `defaults` once (kept
 * per policy object), rejecting the settings that only a route has; other
 * libraries' names are read as `adapter`'s users would mean them.
 */
export function programmaticPolicies (defaults: Defaults, adapter: Adapter): (policy: NamedPolicy) => Policy {
  const merged = new WeakMap<object, Policy>()
  return function programmatic (policy) {
    let core = merged.get(policy)
    if (core === undefined) {
      if (!isRecord(policy)) throw optionError('policy', policy, 'a policy object')
      if (typeof policy.cost === 'function') throw optionError('policy.cost', policy.cost, 'a number (pass a computed cost as the third argument)')
      for (const name of ROUTE_ONLY) {
        if (policy[name] !== undefined) throw optionError(`policy.${name}`, policy[name], 'unset: it is a route setting (the client key is the first argument)')
      }
      const fields: RouteFields = parseFields(policy, PROGRAMMATIC_CHECKS, 'policy.', {}, adapter)
      const over = mergedOver(defaults, fields)
      core = toPolicy({ ...over, cost: typeof over.cost === 'number' ? over.cost : undefined }, policy.bucket, 'policy.', BASE_DIALECT.hint, adapter)
      merged.set(policy, core)
    }
    return core
  }
}
