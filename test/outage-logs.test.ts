// An outage that a limit handles as it declared (failureMode 'closed': a
// 503 per request) is not an application error: by default no request of
// it is logged at error level, by tollgate or by the framework. tollgate
// logs the outage itself, twice (failing, recovered). Fastify's default
// error handler logs every error whose status is 500 or more at error
// level, so the plugin sends the 503 as a reply; `unavailable: 'throw'`
// hands it to the app's error handler instead. The 429 still goes through
// the error handler (Fastify logs it at info level).
//
// Express: tollgate's own answer logs nothing; a `handler` that passes the
// error to next() gets Express's final handler, which prints each one.
//
// Redis is a redis-server of the test's own, frozen (SIGSTOP) for
// FREEZE_MS. The deadline is 250 ms, one a live Redis meets even on this
// busy 2-core machine, so that no healthy call misses it and adds a line.

import { setTimeout as sleep } from 'node:timers/promises'
import express from 'express'
import Fastify, { type FastifyInstance } from 'fastify'
import pino from 'pino'
import t, { type Test } from 'tap'
import tollgate, { UnavailableError, type TollgateOptions } from '../lib/index.js'
import { rateLimit, type ExpressOptions } from '../lib/express.js'
import { captureLogs, uniquePrefix, type LogCapture } from './helpers/app.js'
import { listen } from './helpers/express.js'
import { faultClient, ownServer } from './helpers/load.js'
import { NO_REDIS_PORT, type RedisServer } from './helpers/redis.js'

const TIMEOUT_MS = 250
const FREEZE_MS = 2000
const GAP_MS = 20
const RECOVERY_MS = 2500

interface Outage { statuses: Map<number, number>, during: number }

/**
 * Requests every GAP_MS while Redis is frozen for FREEZE_MS, then until
 * Redis decides one again (at most RECOVERY_MS); `statuses` counts them
 * all, `during` those of the freeze.
 */
async function outage (server: RedisServer, send: () => Promise<{ status: number, fromStore: boolean }>): Promise<Outage> {
  const statuses = new Map<number, number>()
  let during = 0
  server.pause()
  const until = performance.now() + FREEZE_MS
  try {
    while (performance.now() < until) {
      const { status } = await send()
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
      during++
      await sleep(GAP_MS)
    }
  } finally {
    server.resume()
  }
  const recovering = performance.now() + RECOVERY_MS
  while (performance.now() < recovering) {
    const { status, fromStore } = await send()
    statuses.set(status, (statuses.get(status) ?? 0) + 1)
    if (fromStore) break
    await sleep(GAP_MS)
  }
  return { statuses, during }
}

async function fastifyApp (t: Test, server: RedisServer, logs: LogCapture, options: Partial<TollgateOptions> = {}, setUp?: (app: FastifyInstance) => void): Promise<FastifyInstance> {
  const redis = faultClient(t, server.url)
  const app = Fastify({ logger: { level: 'info', stream: logs.stream } })
  t.teardown(() => app.close())
  await app.register(tollgate, { redis, prefix: uniquePrefix(), capacity: 1000, refillPerSecond: 1000, failureMode: 'closed', timeout: TIMEOUT_MS, ...options })
  setUp?.(app)
  app.get('/', async () => 'ok')
  await app.ready()
  return app
}

const fromFastify = (app: FastifyInstance) => async () => {
  const res = await app.inject('/')
  return { status: res.statusCode, fromStore: res.headers['ratelimit-limit'] !== undefined }
}

t.test('Fastify, a frozen Redis, failureMode closed: 503s without an error line per request', async (t) => {
  const server = await ownServer(t)
  const logs = captureLogs()
  const app = await fastifyApp(t, server, logs)
  const { statuses, during } = await outage(server, fromFastify(app))
  t.ok((statuses.get(503) ?? 0) >= 20, `${statuses.get(503) ?? 0} requests answered 503, ${during} sent during the ${FREEZE_MS} ms freeze`)
  t.same(logs.lines.filter((l) => l.level === 50).map((l) => l.msg), [], 'no error line')
  t.same(logs.lines.filter((l) => (l.level as number) >= 40 || /^rate limit store/.test(String(l.msg))).map((l) => [l.level, l.msg]), [
    [40, 'rate limit store failing; limits follow their failure modes'],
    [30, 'rate limit store recovered']
  ], "tollgate's two lines for the outage")

  const res = await app.inject('/')
  t.equal(res.statusCode, 200, 'decided by Redis again')
})

/** A Fastify app on a Redis nobody listens on: every decision fails at once. */
async function downApp (t: Test, logs: LogCapture, options: Partial<TollgateOptions>, setUp?: (app: FastifyInstance) => void): Promise<FastifyInstance> {
  const redis = faultClient(t, `redis://127.0.0.1:${NO_REDIS_PORT}`, { retryStrategy: () => 1000 })
  const app = Fastify({ logger: { level: 'info', stream: logs.stream } })
  t.teardown(() => app.close())
  await app.register(tollgate, { redis, failureMode: 'closed', capacity: 1, refillPerSecond: 0.001, ...options })
  setUp?.(app)
  app.get('/', async () => 'ok')
  await app.ready()
  return app
}

const errorLines = (logs: LogCapture): unknown[] => logs.lines.filter((l) => l.level === 50).map((l) => l.msg)

t.test("Fastify: the 503 sent as a reply is the default error handler's answer, byte for byte; `unavailable: 'throw'` hands it to the app's error handler", async (t) => {
  const [sendLogs, throwLogs, handlerLogs] = [captureLogs(), captureLogs(), captureLogs()]
  const seen: unknown[] = []
  const [sent, thrown, handled] = await Promise.all([
    downApp(t, sendLogs, {}),
    downApp(t, throwLogs, { unavailable: 'throw' }),
    downApp(t, handlerLogs, { unavailable: 'throw' }, (app) => {
      app.setErrorHandler(async (err, _request, reply) => {
        seen.push(err instanceof UnavailableError)
        return await reply.code(503).send({ problem: (err as Error & { code: string }).code })
      })
    })
  ])
  const answers = await Promise.all([sent, thrown].map(async (app) => await app.inject('/')))
  const [a, b] = answers.map((res) => ({ status: res.statusCode, body: res.body, type: res.headers['content-type'], length: res.headers['content-length'], retry: res.headers['retry-after'] }))
  t.same(a, b, 'the same status, body and headers')
  t.same(a, {
    status: 503,
    body: '{"statusCode":503,"code":"TOLLGATE_UNAVAILABLE","error":"Service Unavailable","message":"Rate limiter unavailable, retry in 1 second(s)"}',
    type: 'application/json; charset=utf-8',
    length: String(Buffer.byteLength(a?.body ?? '')),
    retry: '1'
  })
  t.same(errorLines(sendLogs), [], 'sent: no error line')
  t.same(errorLines(throwLogs), ['Rate limiter unavailable, retry in 1 second(s)'], "thrown: Fastify's default error handler logs it at error level")

  const reshaped = await handled.inject('/')
  t.same([reshaped.statusCode, reshaped.json(), reshaped.headers['retry-after']], [503, { problem: 'TOLLGATE_UNAVAILABLE' }, '1'], "thrown: the app's error handler answers it")
  t.same(seen, [true], 'with an UnavailableError')
  t.same(errorLines(handlerLogs), [], 'and decides what to log')
})

t.test('`unavailable` is validated', async (t) => {
  await t.rejects(async () => await Fastify().register(tollgate, { failureMode: 'open', unavailable: 'reply' as never }), {
    code: 'TOLLGATE_INVALID_OPTION', message: 'tollgate: `unavailable` must be one of "send", "throw", got "reply"'
  })
})

/** An Express app on `server` with a pino logger; `handler` optional. */
async function expressApp (t: Test, server: RedisServer, logs: LogCapture, options: Partial<ExpressOptions> = {}) {
  const limit = rateLimit({
    redis: faultClient(t, server.url), prefix: uniquePrefix(), capacity: 1000, refillPerSecond: 1000, failureMode: 'closed', timeout: TIMEOUT_MS,
    logger: pino({ level: 'info' }, logs.stream), ...options
  })
  t.teardown(() => limit.close())
  await limit.ready
  const app = express()
  app.set('env', 'production') // Express's final handler prints errors outside 'test'
  app.get('/', limit(), (_req, res) => { res.send('ok') })
  const get = await listen(t, app)
  return async () => {
    const res = await get('/')
    return { status: res.status, fromStore: res.headers['ratelimit-limit'] !== undefined }
  }
}

/** console.error calls while `t` runs (Express's final handler prints there). */
function consoleErrors (t: Test): unknown[][] {
  const calls: unknown[][] = []
  const original = console.error
  console.error = (...args: unknown[]) => { calls.push(args) }
  t.teardown(() => { console.error = original })
  return calls
}

t.test("Express, a frozen Redis, failureMode closed: tollgate's answer logs nothing per request", async (t) => {
  const server = await ownServer(t)
  const logs = captureLogs()
  const printed = consoleErrors(t)
  const send = await expressApp(t, server, logs)
  const { statuses, during } = await outage(server, send)
  t.ok((statuses.get(503) ?? 0) >= 20, `${statuses.get(503) ?? 0} requests answered 503, ${during} sent during the freeze`)
  t.same(logs.lines.map((l) => [l.level, l.msg]), [
    [40, 'rate limit store failing; limits follow their failure modes'],
    [30, 'rate limit store recovered']
  ], 'two lines for the outage')
  t.same(printed, [], 'nothing printed')
})

t.test("Express: a `handler` passing the error to next() meets Express's final handler, which prints every one", async (t) => {
  const server = await ownServer(t)
  const logs = captureLogs()
  const printed = consoleErrors(t)
  const send = await expressApp(t, server, logs, { handler: (_req, _res, next, err) => { next(err) } })
  const { statuses } = await outage(server, send)
  const answered = statuses.get(503) ?? 0
  t.ok(answered >= 20, `${answered} requests answered 503`)
  t.equal(printed.filter((args) => /^RateLimitError: Rate limiter unavailable/.test(String(args[0]))).length, answered, 'one printed stack per 503 (docs/guides/failure-modes.md: answer them in an error middleware of your own)')
  t.equal(logs.lines.length, 2, "tollgate's own lines stay two")
})

/** console.warn, console.info and console.error calls while `t` runs, each as its level and arguments. */
function consoleLines (t: Test): Array<[string, unknown[]]> {
  const calls: Array<[string, unknown[]]> = []
  for (const level of ['warn', 'info', 'error'] as const) {
    const original = console[level]
    console[level] = (...args: unknown[]) => { calls.push([level, args]) }
    t.teardown(() => { console[level] = original })
  }
  return calls
}

t.test('Express with the default logger, a frozen then a killed Redis: one line per state change, with the error\'s message, code and the address, no stack', async (t) => {
  const server = await ownServer(t)
  const printed = consoleLines(t)
  const send = await expressApp(t, server, captureLogs(), { logger: undefined })
  const address = `redis="127.0.0.1:${server.port}"`
  await outage(server, send)
  await server.kill()
  for (let i = 0; i < 10; i++) await send()
  await server.restart()
  t.ok(await (async () => {
    const end = performance.now() + RECOVERY_MS
    while (performance.now() < end) {
      if ((await send()).fromStore) return true
      await sleep(GAP_MS)
    }
    return false
  })(), 'decided by Redis again after the restart')
  t.ok(printed.every(([, args]) => args.length === 1 && typeof args[0] === 'string' && !String(args[0]).includes('\n')), 'every call prints one line of text')
  const lines = printed.map(([level, args]) => [level, String(args[0])])
  t.match(lines, [
    ['warn', new RegExp(`^rate limit store failing; limits follow their failure modes err="[^"]+" code=TOLLGATE_STORE_TIMEOUT ${address}$`)],
    ['info', /^rate limit store recovered downMs=\d+(\.\d+)? decisions=\{"local":0,"fail-open":0,"fail-closed":\d+\}$/],
    ['warn', new RegExp(`^rate limit store failing; limits follow their failure modes err="Redis at 127\\.0\\.0\\.1:${server.port} is not connected[^"]*" code=TOLLGATE_STORE_DOWN ${address}$`)],
    ['info', /^rate limit store recovered /]
  ], 'the freeze, its recovery, the kill, its recovery')
  t.equal(lines.length, 4, 'and nothing else')
  t.comment(lines.map(([level, line]) => `${level}: ${line}`).join('\n'))
})
