// An Express app in a process of its own, run with Node's default
// unhandled-rejection behaviour (one ends the process), whose requests
// tollgate decides after their response was sent: started by
// test/adapter-lifecycle.test.ts, which asks one of its routes and then
// checks that it is still alive. REDIS_URL, TOLLGATE_PREFIX and
// EXPRESS_MAJOR ('5' or '4') come from the environment; it prints
// `port <n>` once it listens. Every route but /early starts with a timeout
// middleware, as connect-timeout's: it answers 503 after TIMEOUT_MS.
//
//   /startup   a limiter whose Redis never connects: decided (failing
//              closed, with Retry-After) once the 2 s start-up wait is over
//   /wait      capacity 1 at 5/s with maxWaitMs: the second request waits 200 ms
//   /slow      Redis made slow by a proxy (test/helpers/late-stores.ts) inside a 2 s
//              deadline, capacity 1: the first is allowed late, the second denied late
//   /settle    the same Redis, on a route that settles (free): reserved late
//   /early     an earlier middleware answered and still called next()
//   /handler   capacity 1; a denial goes to an async handler that rejects
//   /stats     how many requests reached each handler, what the error
//              handler saw, the settle bucket (read through the Redis that is
//              not slow), and whether the start-up wait is over

import express5, { type ErrorRequestHandler, type RequestHandler } from 'express'
import express4 from 'express4'
import { Redis } from 'ioredis'
import { rateLimit } from '../../lib/express.js'
import { memoryLogger } from './express.js'
import { lateStores } from './late-stores.js'
import { NO_REDIS_PORT } from './redis.js'

const TIMEOUT_MS = 30
const url = process.env.REDIS_URL as string
const prefix = process.env.TOLLGATE_PREFIX as string
const express = process.env.EXPRESS_MAJOR === '4' ? express4 : express5

const handled: Record<string, number> = {}
const errors: string[] = []
const ok: RequestHandler = (req, res) => {
  const route = req.path.split('/')[1] as string
  handled[route] = (handled[route] ?? 0) + 1
  res.json({ ok: true })
}
const timeout: RequestHandler = (_req, res, next) => {
  const timer = setTimeout(() => { res.status(503).end('timed out') }, TIMEOUT_MS)
  res.on('close', () => { clearTimeout(timer) })
  next()
}

const never = new Redis(`redis://127.0.0.1:${NO_REDIS_PORT}`, { retryStrategy: () => 100 })
never.on('error', () => {})
const startup = rateLimit({ redis: never, prefix, capacity: 5, refillPerSecond: 1, failureMode: 'closed', logger: memoryLogger() })
let startupOver = false
void startup.ready.then(() => { startupOver = true })

const { redis, slowRedis, proxy, wait, slow: slowOptions, slowDown } = await lateStores(url, prefix)
const limit = rateLimit(wait)
const slow = rateLimit(slowOptions)
await Promise.all([limit.ready, slow.ready])
slowDown()
const rejecting = rateLimit({ redis, prefix, capacity: 1, refillPerSecond: 0.01, failureMode: 'closed', timeout: 1000, logger: memoryLogger(), handler: async () => { throw new Error('the handler failed') } })

const app = express()
app.get('/startup', timeout, startup({ bucket: 'startup' }), ok)
app.get('/wait', timeout, limit({ bucket: 'wait', maxWaitMs: 2000 }), ok)
app.get('/slow', timeout, slow({ bucket: 'slow' }), ok)
app.get('/settle', timeout, slow({ bucket: 'settle', capacity: 5, key: () => 'settler', settle: () => 0 }), ok)
app.get('/early', (_req, res, next) => { res.json({ early: true }); next() }, limit({ bucket: 'early' }), ok)
app.get('/handler', rejecting({ bucket: 'handler' }), ok)
app.get('/stats', async (_req, res) => {
  const settle = await limit.peek('settler', { bucket: 'settle', capacity: 5, refillPerSecond: 0.01 })
  res.json({ handled, errors, settleRemaining: settle.remaining, startupOver })
})
app.use(((err, _req, res, _next) => {
  errors.push(err.message)
  if (!res.headersSent) res.status(500).json({ message: err.message })
}) as ErrorRequestHandler)
const server = app.listen(0, '127.0.0.1', () => {
  const address = server.address()
  process.stdout.write(`port ${typeof address === 'object' && address !== null ? address.port : 0}\n`)
})
process.once('SIGTERM', () => {
  server.closeAllConnections()
  server.close()
  void Promise.all([startup.close(), limit.close(), slow.close(), rejecting.close(), proxy.close()]).then(() => {
    never.disconnect()
    redis.disconnect()
    slowRedis.disconnect()
  })
})
