// A proxy trust that trusts every address at every hop (Fastify's
// `trustProxy: true`, Express's `app.set('trust proxy', true)`) makes the
// client's address the leftmost X-Forwarded-For entry, which the client
// writes itself: a client that rotates it gets a fresh bucket per request.
// tollgate cannot tell a deliberate setting from a mistake, so it warns
// once (`warnings: { trustProxy: false }` silences it) and
// docs/guides/proxies.md gives the settings for the common set-ups; these
// tests check those settings do what that page says.
//
// Every request here comes from 127.0.0.1 (inject, or a loopback
// connection): "a proxy on this host" is the one set-up a test can be.

import express from 'express'
import Fastify, { type FastifyServerOptions } from 'fastify'
import t, { type Test } from 'tap'
import tollgate, { type TollgateOptions } from '../lib/index.js'
import { rateLimit, type ExpressOptions } from '../lib/express.js'
import { captureLogs, sharedRedis, uniquePrefix, type LogCapture } from './helpers/app.js'
import { listen, memoryLogger } from './helpers/express.js'
import { redisUrl } from './helpers/redis.js'

await redisUrl(t)

const REQUESTS = 5

const trustWarnings = (logs: LogCapture): Array<Record<string, unknown>> => logs.find('trusts every address at every hop')

/** A Fastify app with capacity 1 per client; `send(xff)` answers the status. */
async function fastifyApp (t: Test, server: FastifyServerOptions, plugin: Partial<TollgateOptions> = {}) {
  const logs = captureLogs()
  const app = Fastify({ ...server, logger: { level: 'warn', stream: logs.stream } })
  t.teardown(() => app.close())
  await app.register(tollgate, { redis: await sharedRedis(t), prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 1000, ...plugin })
  app.get('/', async () => 'ok')
  app.get('/ip', { config: { rateLimit: false } }, async (request) => request.ip)
  await app.ready()
  const send = async (xff: string): Promise<{ status: number }> => {
    const res = await app.inject({ url: '/', headers: { 'x-forwarded-for': xff } })
    return { status: res.statusCode }
  }
  const ip = async (xff: string): Promise<string> => (await app.inject({ url: '/ip', headers: { 'x-forwarded-for': xff } })).body
  return { logs, send, ip }
}

/** REQUESTS requests whose client rotates its own X-Forwarded-For entry; a proxy on this host appends the address it saw. */
async function rotating (send: (xff: string) => Promise<{ status: number }>, viaProxy: boolean): Promise<number> {
  let passed = 0
  for (let i = 0; i < REQUESTS; i++) {
    const forged = `198.51.100.${i + 1}`
    if ((await send(viaProxy ? `${forged}, 203.0.113.7` : forged)).status === 200) passed++
  }
  return passed
}

t.test('Fastify: trustProxy: true with no proxy in front: a client rotating X-Forwarded-For passes every time, and one warning says so', async (t) => {
  const { logs, send } = await fastifyApp(t, { trustProxy: true })
  t.equal(await rotating(send, false), REQUESTS, `${REQUESTS} of ${REQUESTS} passed a capacity of 1`)
  const found = trustWarnings(logs)
  t.equal(found.length, 1, `one warning for ${REQUESTS} requests`)
  t.match(found[0]?.msg, /Fastify's `trustProxy` trusts every address at every hop \(`trustProxy: true`\).*trust only your proxies' addresses.*warnings: \{ trustProxy: false \}/)
})

t.test("Fastify: the proxy guide's settings for a proxy on this host trust it alone", async (t) => {
  for (const trustProxy of ['127.0.0.1', ['127.0.0.1'], (address: string) => address === '127.0.0.1']) {
    const { logs, send, ip } = await fastifyApp(t, { trustProxy })
    t.equal(await rotating(send, true), 1, `${JSON.stringify(trustProxy) ?? 'a function'}: the forged entries are ignored, 1 of ${REQUESTS} passed`)
    t.equal(await ip('198.51.100.9, 203.0.113.7'), '203.0.113.7', 'keyed by the address the proxy saw')
    t.same(trustWarnings(logs), [], 'no warning')
  }
})

t.test('Fastify 5 ignores a hop count: it trusts no proxy, so every client shares the proxy\'s address', async (t) => {
  // Its types refuse a number too; a JavaScript app can still pass one.
  const { logs, ip } = await fastifyApp(t, { trustProxy: 1 as never })
  t.equal(await ip('203.0.113.7'), '127.0.0.1')
  t.same(trustWarnings(logs), [])
})

t.test('the warning is switched off by `warnings`; a trust function that throws on made-up input is no 500', async (t) => {
  for (const warnings of [{ trustProxy: false }, false] as const) {
    const { logs, send } = await fastifyApp(t, { trustProxy: true }, { warnings })
    await send('198.51.100.1')
    t.same(trustWarnings(logs), [], `warnings: ${JSON.stringify(warnings)}`)
  }
  const { logs, send } = await fastifyApp(t, { trustProxy: true }, { warnings: { proxy: false } })
  await send('198.51.100.1')
  t.equal(trustWarnings(logs).length, 1, 'warnings: { proxy: false } leaves it on')

  const picky = (address: string): boolean => {
    if (address.startsWith('203.0.113.')) throw new Error('not an address of ours')
    return address === '127.0.0.1'
  }
  const strict = await fastifyApp(t, { trustProxy: picky })
  t.equal((await strict.send('198.51.100.1')).status, 200)
  t.same(trustWarnings(strict.logs), [])
  await t.rejects(async () => await Fastify().register(tollgate, { failureMode: 'open', warnings: { trustProxy: 'no' as never } }), { message: /`warnings\.trustProxy` must be true or false, got "no"/ })
})

/** An Express app with capacity 1 per client and `trust proxy` set to `trust`. */
async function expressApp (t: Test, trust: unknown, options: Partial<ExpressOptions> = {}) {
  const logger = memoryLogger()
  const limit = rateLimit({ redis: await sharedRedis(t), prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 1000, logger, ...options })
  t.teardown(() => limit.close())
  const app = express()
  app.set('trust proxy', trust)
  app.get('/', limit(), (_req, res) => { res.send('ok') })
  app.get('/ip', (req, res) => { res.send(req.ip) })
  const get = await listen(t, app)
  await limit.ready
  const send = async (xff: string): Promise<{ status: number }> => ({ status: (await get('/', { 'x-forwarded-for': xff })).status })
  const ip = async (xff: string): Promise<string> => (await get('/ip', { 'x-forwarded-for': xff })).body
  return { logger, send, ip }
}

const expressWarnings = (logger: { lines: string[] }): string[] => logger.lines.filter((l) => l.includes('trusts every address at every hop'))

t.test("Express: 'trust proxy' true: a rotating client passes every time, and one warning says so; the proxy guide's settings do not", async (t) => {
  const open = await expressApp(t, true)
  t.equal(await rotating(open.send, false), REQUESTS, `${REQUESTS} of ${REQUESTS} passed a capacity of 1`)
  t.equal(expressWarnings(open.logger).length, 1, 'one warning')
  t.match(expressWarnings(open.logger)[0], /Express's 'trust proxy' trusts every address at every hop \(`app.set\('trust proxy', true\)`\).*warnings: \{ trustProxy: false \}/)

  for (const trust of ['loopback', '127.0.0.1', 1]) {
    const { logger, send, ip } = await expressApp(t, trust)
    t.equal(await rotating(send, true), 1, `${JSON.stringify(trust)}: 1 of ${REQUESTS} passed`)
    t.equal(await ip('198.51.100.9, 203.0.113.7'), '203.0.113.7', 'keyed by the address the proxy saw')
    t.same(expressWarnings(logger), [])
  }
  for (const warnings of [{ trustProxy: false }, false] as const) {
    const quiet = await expressApp(t, true, { warnings })
    await quiet.send('198.51.100.1')
    t.same(expressWarnings(quiet.logger), [], `warnings: ${JSON.stringify(warnings)}`)
  }
})
