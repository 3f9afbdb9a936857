// Fastify listening on a Unix socket: `request.ip` is undefined there. A
// missing address is never a 500: every such request shares one client
// identity, and one warning (logged once) says how to do better. Behind a
// proxy on the socket, docs/guides/proxies.md's `trustProxy` (the socket's peer alone)
// keys by the address the proxy saw; `trustProxy: true` would believe what
// the client forges.

import { mkdtempSync, rmSync } from 'node:fs'
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify'
import tollgate, { type TollgateOptions } from '../lib/index.js'
import { captureLogs, keysUnder, sharedRedis, uniquePrefix, type LogCapture } from './helpers/app.js'
import { redisUrl } from './helpers/redis.js'

await redisUrl(t)

type TapTest = Parameters<Parameters<typeof t.test>[0]>[0]

interface Answer { status: number, headers: IncomingHttpHeaders, body: string }

/** One request over the socket at `socketPath`, on a connection of its own. */
async function get (socketPath: string, path: string, headers: Record<string, string> = {}): Promise<Answer> {
  return await new Promise((resolve, reject) => {
    const req = httpRequest({ socketPath, path, headers, agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { body += chunk })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

interface Listening {
  app: FastifyInstance
  socketPath: string
  logs: LogCapture
  prefix: string
  keys (): Promise<string[]>
}

async function listenOnSocket (t: TapTest, plugin: Partial<TollgateOptions> = {}, fastify: FastifyServerOptions = {}): Promise<Listening> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-sock-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const socketPath = join(dir, 'app.sock')
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const logs = captureLogs()
  const app = Fastify({ logger: { level: 'warn', stream: logs.stream }, ...fastify })
  t.teardown(() => app.close())
  await app.register(tollgate, { redis, prefix, failureMode: 'closed', timeout: 1000, capacity: 2, refillPerSecond: 0.01, ...plugin })
  app.get('/hello', async () => 'hello')
  app.get('/other', async () => 'other')
  await app.listen({ path: socketPath })
  return { app, socketPath, logs, prefix, keys: async () => await keysUnder(redis, prefix) }
}

t.test('requests without an address share one client identity, with one warning', async (t) => {
  const { socketPath, logs, prefix, keys } = await listenOnSocket(t)
  const first = await get(socketPath, '/hello')
  t.equal(first.status, 200, first.body)
  t.equal(first.headers['ratelimit-remaining'], '1')
  t.equal((await get(socketPath, '/hello')).status, 200, 'a new connection is no new bucket')
  const denied = await get(socketPath, '/hello')
  t.equal(denied.status, 429)
  t.equal(denied.headers['retry-after'], '100')
  t.equal((await get(socketPath, '/other')).status, 200, 'buckets stay per route')
  t.same(await keys(), [`${prefix}:{no-address}:GET /hello`, `${prefix}:{no-address}:GET /other`])
  const warnings = logs.find('no client address')
  t.equal(warnings.length, 1, 'one warning, however many requests')
  t.match(warnings[0]?.msg, /share the client identity "no-address".*trustProxy.*`key`/)
  t.equal(logs.lines.filter((l) => l.level === 50).length, 0, 'no error logged')
})

/** The setting of docs/guides/proxies.md ("Unix sockets") behind nginx on a Unix socket: trust the socket's peer, the one hop without an address, alone. */
const socketPeer = (address: string | undefined, hop: number): boolean => address === undefined && hop === 0

t.test('behind a proxy on the socket, trusting the socket peer alone keys by the address the proxy saw', async (t) => {
  const { socketPath, logs, prefix, keys } = await listenOnSocket(t, {}, { trustProxy: socketPeer })
  // nginx's `proxy_add_x_forwarded_for` appends the address it saw to what the client sent.
  const from = (forged: string, seen: string): Record<string, string> => ({ 'x-forwarded-for': `${forged}, ${seen}` })
  t.equal((await get(socketPath, '/hello', from('198.51.100.1', '203.0.113.7'))).status, 200)
  t.equal((await get(socketPath, '/hello', from('198.51.100.2', '203.0.113.7'))).status, 200)
  t.equal((await get(socketPath, '/hello', from('198.51.100.3', '203.0.113.7'))).status, 429, 'a forged entry buys no new bucket')
  t.equal((await get(socketPath, '/hello', { 'x-forwarded-for': '203.0.113.8' })).status, 200, 'another client, its own bucket')
  t.same(await keys(), [`${prefix}:{203.0.113.7}:GET /hello`, `${prefix}:{203.0.113.8}:GET /hello`])
  t.same(logs.find('no client address'), [], 'no warning: every request had an address')
  t.same(logs.find('trusts every address'), [])
})

t.test('trustProxy: true on the socket trusts what the client forges, and one warning says so', async (t) => {
  const { socketPath, logs } = await listenOnSocket(t, {}, { trustProxy: true })
  const statuses: number[] = []
  for (let i = 1; i <= 5; i++) statuses.push((await get(socketPath, '/hello', { 'x-forwarded-for': `198.51.100.${i}, 203.0.113.7` })).status)
  t.same(statuses, [200, 200, 200, 200, 200], 'a fresh bucket per forged entry')
  t.equal(logs.find('trusts every address at every hop').length, 1)
})

t.test('a key function on the socket: no address needed, no warning', async (t) => {
  const { socketPath, logs, prefix, keys } = await listenOnSocket(t, { key: (request) => String(request.headers['x-tenant']) })
  t.equal((await get(socketPath, '/hello', { 'x-tenant': 'acme' })).status, 200)
  t.same(await keys(), [`${prefix}:{acme}:GET /hello`])
  t.same(logs.find('no client address'), [])
})
