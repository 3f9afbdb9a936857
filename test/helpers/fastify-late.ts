// The Fastify plugin's side of test/helpers/express-late.ts: a Fastify app
// in a process of its own, under Node's default unhandled-rejection
// behaviour, whose replies an app hook sends (a timeout's 503 after
// TIMEOUT_MS) while tollgate's hook still waits for its decision. Started
// by test/adapter-lifecycle.test.ts; REDIS_URL and TOLLGATE_PREFIX come
// from the environment; prints `port <n>` once it listens.
//
//   /wait   capacity 1 at 5/s with maxWaitMs: the second request waits 200 ms
//   /slow   Redis made slow by a proxy (SLOW_MS per reply) inside a 2 s
//           deadline, capacity 1: the first is allowed late, the second denied late
//   /gate   a route declared before the plugin loaded (checked by the
//           plugin's gate hooks), as /wait
//   /stats  how many requests reached each handler

import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify'
import { Redis } from 'ioredis'
import tollgate from '../../lib/index.js'
import { startProxy } from './proxy.js'

const TIMEOUT_MS = 30
const SLOW_MS = 150
const url = process.env.REDIS_URL as string
const prefix = process.env.TOLLGATE_PREFIX as string

const handled: Record<string, number> = {}
async function ok (request: FastifyRequest): Promise<{ ok: true }> {
  const route = request.url.split('/')[1] as string
  handled[route] = (handled[route] ?? 0) + 1
  return { ok: true }
}
function timeout (_request: FastifyRequest, reply: FastifyReply, done: () => void): void {
  const timer = setTimeout(() => { if (!reply.sent) void reply.code(503).send('timed out') }, TIMEOUT_MS)
  reply.raw.on('close', () => { clearTimeout(timer) })
  done()
}

const redis = new Redis(url)
const proxy = await startProxy(url)
const slowRedis = new Redis(proxy.url)
const app = Fastify({ logger: false })
app.addHook('onRequest', timeout)
await app.register(async (fast) => {
  await fast.register(tollgate, { redis, prefix, capacity: 1, refillPerSecond: 5, failureMode: 'closed', timeout: 1000 })
  fast.get('/wait', { config: { rateLimit: { bucket: 'wait', maxWaitMs: 2000 } } }, ok)
})
await app.register(async (slow) => {
  await slow.register(tollgate, { redis: slowRedis, prefix, capacity: 1, refillPerSecond: 0.01, failureMode: 'closed', timeout: 2000 })
  slow.get('/slow', { config: { rateLimit: { bucket: 'slow' } } }, ok)
})
await app.register(async (late) => {
  late.get('/gate', { config: { rateLimit: { bucket: 'gate', maxWaitMs: 2000 } } }, ok)
  await late.register(tollgate, { redis, prefix, capacity: 1, refillPerSecond: 5, failureMode: 'closed', timeout: 1000 })
})
app.get('/stats', async () => ({ handled }))
await app.listen({ port: 0, host: '127.0.0.1' })
proxy.delayMs = SLOW_MS
const address = app.server.address()
process.stdout.write(`port ${typeof address === 'object' && address !== null ? address.port : 0}\n`)
process.once('SIGTERM', () => {
  app.server.closeAllConnections()
  void app.close().then(async () => {
    await proxy.close()
    redis.disconnect()
    slowRedis.disconnect()
  })
})
