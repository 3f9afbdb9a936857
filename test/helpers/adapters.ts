// The adapters as a table: one row per framework tollgate plugs into
// (ADAPTERS: the Fastify plugin, tollgate/express on Express 5,
// tollgate/hono on @hono/node-server; EXPRESS4, the Express adapter on the
// older major, for the promises about the HTTP server it runs on). A row
// starts an app with the given tollgate options and routes on a real HTTP
// server of 127.0.0.1, answers `GET <route>` with `{"source":<the
// decision's source or null>}` as `application/json; charset=utf-8` on
// every framework, offers the programmatic API, and knows how the app
// shuts down. What differs between frameworks, and that a test has to
// know, is data on the row (`decisionAt`, `defaultLog`, `startupWait`,
// `shutdowns`, `late`), never a test's `if` on the row's name. A new
// framework is one more row.

import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createAdaptorServer } from '@hono/node-server'
import express5, { type Request, type RequestHandler } from 'express'
import express4 from 'express4'
import Fastify, { LogController, type FastifyError, type FastifyReply, type FastifyRequest } from 'fastify'
import { Hono, type Context } from 'hono'
import { HTTPException } from 'hono/http-exception'
import { timeout } from 'hono/timeout'
import type { Test } from 'tap'
import tollgate, { type RouteRateLimit, type TollgateOptions } from '../../lib/index.js'
import { rateLimit, type ExpressOptions, type ExpressPolicy } from '../../lib/express.js'
import { rateLimit as honoRateLimit, type HonoOptions, type HonoPolicy, type RateLimitEnv } from '../../lib/hono.js'
import { TollgateModule, TollgateService, type NestOptions, type NestPolicy } from '../../lib/nest.js'
import type { Acquired, Decision, Limiter, Logger } from '../../lib/core/types.js'
import { captureLogs } from './app.js'
import { httpGet, type Answer } from './express.js'
import { controller, nestApp, rateLimitFilter, type Platform, type TestRequest } from './nest.js'

/** The options every adapter takes alike (no logger, no handler: the row sets those). */
export type SharedOptions = Omit<Partial<TollgateOptions & ExpressOptions>, 'logger' | 'handler' | 'key' | 'cost' | 'allow' | 'limit' | 'settle'>

/**
 * A route's limit, in the fields every adapter takes alike; a `key` and a
 * `cost` that ignore the request are among them (functions that read the
 * request are not: each framework hands its own request type).
 */
export type SharedPolicy = Omit<ExpressPolicy, 'key' | 'cost' | 'allow' | 'limit' | 'settle' | 'handler'> & { key?: () => string, cost?: number | (() => number) }

export interface RouteSpec {
  path: string
  /** The route's limit; several are all or nothing. */
  policy: SharedPolicy | SharedPolicy[]
  /** Each policy's client key is this request header ('anonymous' without it), read the framework's way. */
  keyHeader?: string
  /**
   * The route settles: its limit's `settle` calls this with the route's
   * path each time it runs, and returns 0 (the reservation is refunded).
   */
  settled?: (path: string) => void
  /** The handler answers this many ms after it starts (at once without it). */
  handlerMs?: number
  /** The handler fails (after `handlerMs`) with an error: the framework's 500. */
  fails?: boolean
  /**
   * A timeout of the app's, declared before the limit: the framework's own
   * 503 sent this many ms after the request arrives, whatever the handler
   * does; the handler, when it ends, finds the answer sent and sends none.
   */
  timeoutMs?: number
}

/** A programmatic policy: named bucket, numeric cost; a concurrency policy for `acquire`. */
export interface NamedPolicy { bucket: string, capacity?: number, refillPerSecond?: number, cost?: number, concurrency?: { max: number, leaseMs?: number }, maxWaitMs?: number }

/** What every adapter's programmatic API offers alike. */
export interface ProgrammaticApi {
  consume (clientKey: string, policy: NamedPolicy, cost?: number): Promise<Decision>
  peek (clientKey: string, policy: NamedPolicy): Promise<Decision>
  reset (clientKey: string, bucket: string): Promise<void>
  acquire (clientKey: string, policy: NamedPolicy | readonly NamedPolicy[]): Promise<Acquired>
  readonly limiter: Limiter
}

export interface AppSpec {
  options: SharedOptions
  routes: readonly RouteSpec[]
  /**
   * 'memory' (default): the limiter's lines are kept in memory, through the
   * `logger` option or the app's logger; 'default': the row's default
   * destination (`defaultLog`), which the row captures for the test.
   */
  log?: 'memory' | 'default'
  /**
   * The app answers tollgate's 429s and 503s itself, with the error's status
   * and headers and the body `{"code":...,"retryAfter":...}`.
   */
  ownAnswers?: boolean
}

export interface LogLine { level: 'info' | 'warn' | 'error', msg: string }

export type Get = (url: string, headers?: Record<string, string>, method?: string) => Promise<Answer>

export interface RunningApp {
  get: Get
  at: { host: string, port: number }
  server: Server
  /** The limiter's log lines so far (the framework's own are left out). */
  logs (): LogLine[]
  /** The paths of the requests whose route handler ran, in order. */
  handled: string[]
  /** The programmatic API over the app's options (`limit.consume`, `app.tollgate.consume`, ...). */
  api: ProgrammaticApi
  /** Shuts the app down, `first` (one of the row's `shutdowns`) first; resolves once the server has closed. */
  shutdown (first: string): Promise<void>
}

export interface AdapterRow {
  name: string
  /** Where a route handler reads its decision. */
  decisionAt: string
  /** Where the limiter's log lines go when the app gives no logger. */
  defaultLog: 'console' | 'the app logger'
  /** When an app pays the bounded wait for Redis at start-up. */
  startupWait: 'first request' | 'app start'
  /** The ways the app is shut down, each naming what is called first. */
  shutdowns: readonly string[]
  /**
   * The app of test/helpers/<child> that answers requests before tollgate
   * decides them, run in a process of its own with `env`
   * (test/helpers/late.ts).
   */
  late: { child: string, env: Record<string, string> }
  start (t: Test, spec: AppSpec): Promise<RunningApp>
}

const JSON_TYPE = 'application/json; charset=utf-8'

/**
 * The route's policies, each with the key function `key` makes for the
 * route's `keyHeader` (the row's own: its request type), if it names one.
 */
function keyed (route: RouteSpec, key: (header: string) => unknown): object {
  const policy = withKey(route, key)
  const { settled } = route
  if (settled === undefined) return policy
  const settle = (): number => { settled(route.path); return 0 }
  return Array.isArray(policy) ? policy.map((p: object) => ({ ...p, settle })) : { ...policy, settle }
}

function withKey (route: RouteSpec, key: (header: string) => unknown): object {
  const header = route.keyHeader
  if (header === undefined) return route.policy
  // One function for the route: its key is one per route, the same in every policy.
  const read = key(header)
  const withKey = (policy: SharedPolicy): object => ({ ...policy, key: read })
  return Array.isArray(route.policy) ? route.policy.map(withKey) : withKey(route.policy)
}

/** The error of a route that `fails`. */
const HANDLER_FAILED = 'the handler failed'

/** Express's handler of a route: `answer` (or the error of a route that `fails`), `handlerMs` later if set. */
function later (route: RouteSpec, answered: RequestHandler): RequestHandler {
  const answer: RequestHandler = route.fails === true ? (_req, _res, next) => { next(new Error(HANDLER_FAILED)) } : answered
  const ms = route.handlerMs
  if (ms === undefined) return answer
  return (req, res, next) => { setTimeout(() => { if (!res.headersSent) answer(req, res, next) }, ms) }
}

/** The Express middlewares of a route's `timeoutMs`: one that answers 503 when it is over, before the limit; none without it. */
function expressTimeout (route: RouteSpec): RequestHandler[] {
  const ms = route.timeoutMs
  if (ms === undefined) return []
  return [(_req, res, next) => {
    const timer = setTimeout(() => { if (!res.headersSent) res.status(503).send(TIMED_OUT) }, ms)
    res.once('close', () => { clearTimeout(timer) })
    next()
  }]
}

/** The Node requests a route's timeout answered (nodeTimeout). */
const TIMED_OUT_REQUESTS = new WeakSet<object>()

/** A Nest handler's request as Node's: Fastify's request holds it as `raw`, Express's is it. */
function nodeRequest (req: TestRequest): object {
  return 'raw' in req && typeof req.raw === 'object' && req.raw !== null ? req.raw : req
}

/** A Node-level middleware (either Nest platform's `app.use`) of a route's `timeoutMs`: the 503 when it is over. */
function nodeTimeout (path: string, ms: number) {
  return (req: IncomingMessage, res: ServerResponse, next: () => void): void => {
    if (req.url?.split('?')[0] !== path) return next()
    const timer = setTimeout(() => {
      if (res.headersSent) return
      TIMED_OUT_REQUESTS.add(req)
      res.writeHead(503).end(TIMED_OUT)
    }, ms)
    res.once('close', () => { clearTimeout(timer) })
    next()
  }
}

/** The body of a route's timeout. */
const TIMED_OUT = 'timed out'

/** The body every row's handlers answer with. */
function sourceBody (decision: { source: string } | undefined): string {
  return JSON.stringify({ source: decision?.source ?? null })
}

/** Listens on a free port of 127.0.0.1 (unless listening already); the server is closed at the end of `t` if still open. */
async function listening (t: Test, server: Server): Promise<{ at: { host: string, port: number }, get: Get }> {
  if (!server.listening) {
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
  }
  t.teardown(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()) }))
  const at = { host: '127.0.0.1', port: (server.address() as AddressInfo).port }
  return { at, get: httpGet(at) }
}

/** The limiter's lines: given as `logger`, or caught on the console. */
function middlewareLogs (t: Test, log: AppSpec['log']): { logger: Logger | undefined, lines: LogLine[] } {
  const lines: LogLine[] = []
  if (log === 'default') {
    const saved = { warn: console.warn, info: console.info, error: console.error }
    for (const level of ['warn', 'info', 'error'] as const) console[level] = (...args: unknown[]) => { lines.push({ level, msg: String(args[0]) }) }
    t.teardown(() => Object.assign(console, saved))
    return { logger: undefined, lines }
  }
  const keep = (level: LogLine['level']) => (_obj: object, msg: string): void => { lines.push({ level, msg }) }
  return { logger: { warn: keep('warn'), info: keep('info'), error: keep('error') }, lines }
}

/** Closing in the order named by `first`: the limiter's close(), or the HTTP server's. */
function middlewareShutdown (server: Server, closeLimit: () => Promise<void>) {
  return async (first: string): Promise<void> => {
    const closing = (): Promise<void> => new Promise<void>((resolve) => { server.close(() => resolve()) })
    if (first === 'limit.close()') return await closeLimit().then(closing)
    const closed = closing()
    await closeLimit()
    return await closed
  }
}

/** What the two middleware adapters share: the logger option, the console by default, close() on the limiter. */
const MIDDLEWARE = {
  defaultLog: 'console',
  startupWait: 'first request',
  shutdowns: ['server.close()', 'limit.close()']
} as const

/** Starts a middleware adapter's app: `make` builds the limiter with the given logger, `serve` the app's (unstarted or listening) server. */
async function middlewareStart<L extends ProgrammaticApi & { close: () => Promise<void> }> (t: Test, spec: AppSpec, make: (logging: { logger?: Logger }) => L, serve: (limit: L, handled: string[]) => Server): Promise<RunningApp> {
  const { logger, lines } = middlewareLogs(t, spec.log)
  const limit = make(logger === undefined ? {} : { logger })
  t.teardown(() => limit.close())
  const handled: string[] = []
  const server = serve(limit, handled)
  const { at, get } = await listening(t, server)
  return { at, get, server, logs: () => lines, handled, api: limit, shutdown: middlewareShutdown(server, () => limit.close()) }
}

/** tollgate/express on one Express major: `limit(policy)` before each route's handler. */
function expressRow (major: '5' | '4', express: typeof express5 | typeof express4): AdapterRow {
  const ownAnswers: Pick<ExpressOptions, 'handler'> = {
    handler: (_req, res, _next, err) => { res.status(err.status).set(err.headers).json({ code: err.code, retryAfter: err.retryAfter }) }
  }
  return {
    name: `express ${major}`,
    decisionAt: 'req.rateLimit',
    ...MIDDLEWARE,
    late: { child: 'express-late.ts', env: { EXPRESS_MAJOR: major } },
    start: async (t, spec) => await middlewareStart(t, spec,
      (logging) => rateLimit({ ...spec.options as ExpressOptions, ...logging, ...(spec.ownAnswers === true ? ownAnswers : {}) }),
      (limit, handled) => {
        const app = express()
        const answer: RequestHandler = (req, res) => { handled.push(req.path); res.type(JSON_TYPE).send(sourceBody(req.rateLimit)) }
        const key = (header: string) => (req: Request) => req.get(header) ?? 'anonymous'
        for (const route of spec.routes) app.get(route.path, ...expressTimeout(route), limit(keyed(route, key) as ExpressPolicy), later(route, answer))
        return createServer(app)
      })
  }
}

/** tollgate/hono on @hono/node-server. */
const honoOwnAnswers: Pick<HonoOptions, 'handler'> = {
  handler: (c, err) => c.json({ code: err.code, retryAfter: err.retryAfter }, err.status, err.headers)
}
const honoRow: AdapterRow = {
  name: 'hono',
  decisionAt: "c.get('rateLimit')",
  ...MIDDLEWARE,
  late: { child: 'hono-late.ts', env: {} },
  start: async (t, spec) => await middlewareStart(t, spec,
    // The shared options are every adapter's.
    (logging) => honoRateLimit({ ...spec.options as HonoOptions, ...logging, ...(spec.ownAnswers === true ? honoOwnAnswers : {}) }),
    (limit, handled) => {
      const app = new Hono<RateLimitEnv>()
      const key = (header: string) => (c: Context) => c.req.header(header) ?? 'anonymous'
      for (const route of spec.routes) {
        // Hono's own timeout middleware: a 503 once it is over, the handler left running.
        if (route.timeoutMs !== undefined) app.use(route.path, timeout(route.timeoutMs, () => new HTTPException(503, { message: TIMED_OUT })))
        app.get(route.path, limit(keyed(route, key) as HonoPolicy), async (c) => {
          if (route.handlerMs !== undefined) await sleep(route.handlerMs)
          if (route.fails === true) throw new Error(HANDLER_FAILED)
          handled.push(c.req.path)
          return c.body(sourceBody(c.get('rateLimit')), 200, { 'content-type': JSON_TYPE })
        })
      }
      return createAdaptorServer({ fetch: app.fetch }) as Server
    })
}

/** A Fastify route's `timeoutMs`: an onRequest hook whose timer sends the 503 when it is over. */
function fastifyTimeout (ms: number) {
  return (_request: FastifyRequest, reply: FastifyReply, done: () => void): void => {
    const timer = setTimeout(() => { if (!reply.sent) void reply.code(503).send(TIMED_OUT) }, ms)
    reply.raw.once('close', () => { clearTimeout(timer) })
    done()
  }
}

const PINO_LEVELS: Record<number, LogLine['level']> = { 30: 'info', 40: 'warn', 50: 'error' }

/** The Fastify plugin: `global: false`, each route's limit in its `config.rateLimit`. */
const fastifyRow: AdapterRow = {
  name: 'fastify',
  decisionAt: 'request.rateLimit',
  defaultLog: 'the app logger',
  startupWait: 'app start',
  shutdowns: ['app.close()'],
  late: { child: 'fastify-late.ts', env: {} },
  async start (t, spec) {
    // The plugin logs through the app's logger (pino); Fastify's per-request lines are off.
    const logs = captureLogs()
    const app = Fastify({ logger: { level: 'info', stream: logs.stream }, logController: new LogController({ disableRequestLogging: true }) })
    t.teardown(() => app.close())
    await app.register(tollgate, { ...spec.options as TollgateOptions, global: false, ...(spec.ownAnswers === true ? { unavailable: 'throw' as const } : {}) })
    if (spec.ownAnswers === true) {
      // Fastify's errors carry no retryAfter: the plugin has set Retry-After on the reply.
      app.setErrorHandler((err: FastifyError, _request: FastifyRequest, reply: FastifyReply) =>
        reply.code(err.statusCode ?? 500).send({ code: err.code, retryAfter: Number(reply.getHeader('retry-after')) }))
    }
    const handled: string[] = []
    const key = (header: string) => (request: FastifyRequest) => String(request.headers[header] ?? 'anonymous')
    for (const route of spec.routes) {
      app.get(route.path, { config: { rateLimit: keyed(route, key) as RouteRateLimit }, ...(route.timeoutMs === undefined ? {} : { onRequest: fastifyTimeout(route.timeoutMs) }) }, async (request, reply) => {
        if (route.handlerMs !== undefined) await sleep(route.handlerMs)
        if (reply.sent) return
        if (route.fails === true) throw new Error(HANDLER_FAILED)
        handled.push(request.url.split('?')[0] as string)
        return await reply.type(JSON_TYPE).send(sourceBody(request.rateLimit))
      })
    }
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { at, get } = await listening(t, app.server)
    const lines = (): LogLine[] => logs.lines
      .filter((l) => !String(l.msg).startsWith('Server listening at'))
      .map((l) => ({ level: PINO_LEVELS[l.level as number] ?? 'error', msg: String(l.msg) }))
    return { at, get, server: app.server, logs: lines, handled, api: app.tollgate, shutdown: async () => { await app.close() } }
  }
}

/**
 * tollgate/nest on one of Nest's platforms: `global: false`, each route's
 * limit in its handler's `@RateLimit`; the app's own answers are an
 * exception filter of RateLimitException.
 */
function nestRow (platform: Platform): AdapterRow {
  const ownAnswers = rateLimitFilter((err) => ({ code: err.code, retryAfter: err.retryAfter }))
  return {
    name: `nest-${platform}`,
    decisionAt: 'req.rateLimit',
    defaultLog: 'console',
    startupWait: 'app start',
    shutdowns: ['app.close()'],
    late: { child: 'nest-late.ts', env: { NEST_PLATFORM: platform } },
    async start (t, spec) {
      const { logger, lines } = middlewareLogs(t, spec.log)
      const handled: string[] = []
      const key = (header: string) => (req: TestRequest) => String(req.headers[header] ?? 'anonymous')
      const routes = spec.routes.map((route) => ({
        path: route.path,
        policy: keyed(route, key) as NestPolicy,
        answer: async (req: TestRequest) => {
          if (route.handlerMs !== undefined) await sleep(route.handlerMs)
          if (route.fails === true) throw new Error(HANDLER_FAILED)
          // The route's timeout has answered (nodeTimeout): the handler gives nothing more.
          if (TIMED_OUT_REQUESTS.has(nodeRequest(req))) return undefined
          handled.push(req.url.split('?')[0] as string)
          return sourceBody(req.rateLimit)
        }
      }))
      const options: NestOptions = { ...spec.options as NestOptions, ...(logger === undefined ? {} : { logger }), global: false }
      const app = await nestApp(platform, TollgateModule.forRoot(options), [controller('', routes)], spec.ownAnswers === true ? [ownAnswers] : [])
      // A route's timeout is a global middleware, before Nest's guards, on the Node request and response of either platform.
      for (const route of spec.routes) if (route.timeoutMs !== undefined) app.use(nodeTimeout(route.path, route.timeoutMs))
      let closed: Promise<void> | undefined
      const close = async (): Promise<void> => { closed ??= app.close(); await closed }
      t.teardown(close)
      await app.listen(0, '127.0.0.1')
      const server: Server = app.getHttpServer()
      const { at, get } = await listening(t, server)
      return { at, get, server, logs: () => lines, handled, api: app.get(TollgateService), shutdown: close }
    }
  }
}

/** One row per framework. */
export const ADAPTERS: readonly AdapterRow[] = [fastifyRow, expressRow('5', express5), honoRow, nestRow('express'), nestRow('fastify')]

/** Express 4: the Express adapter's code on the older major, for the promises about the HTTP server it runs on. */
export const EXPRESS4 = expressRow('4', express4)
