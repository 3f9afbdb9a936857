// The client adapters' paths that the per-family tests do not reach, on a
// real Redis: a subscription the server refuses (an ACL without channels)
// on node-redis, GLIDE and ioredis; a GLIDE or node-redis client the app
// closes (GLIDE tells of no close: tollgate looks once a second), or a
// GLIDE client passed already closed; a limiter closed while its GLIDE or
// node-redis subscriber is still being made; a GLIDE reply error of a kind
// that has no Redis code in the adapter (a master demoted to a replica:
// READONLY); a GLIDE client that shows no configuration.

import { setTimeout as sleep } from 'node:timers/promises'
import { GlideClient } from '@valkey/valkey-glide'
import { Redis } from 'ioredis'
import { createClient, RESP_TYPES } from 'redis'
import t from 'tap'
import { SUBSCRIBER_NAME } from '../lib/core/invalidation.js'
import { rateLimit } from '../lib/express.js'
import { createLimiter, type Logger } from '../lib/index.js'
import { storeTarget } from '../lib/store/redis-store.js'
import { NO_REDIS_PORT, redisCommand, startRedisServer } from './helpers/redis.js'

const server = await startRedisServer()
t.teardown(() => server.stop())
const admin = new Redis(server.url)
t.teardown(() => { admin.disconnect() })
const { hostname, port } = new URL(server.url)
const address = { host: hostname, port: Number(port) }

function logger (): Logger & { lines: string[], errors: unknown[] } {
  const lines: string[] = []
  const errors: unknown[] = []
  const keep = (o: object, msg: string): void => {
    lines.push(msg)
    if ('err' in o) errors.push(o.err)
  }
  return { lines, errors, warn: keep, info: keep, error: keep }
}

/** The messages of the errors logged. */
const messages = (errors: readonly unknown[]): string[] => errors.map((err) => err instanceof Error ? err.message : String(err))

/** Our subscriber connections on this file's Redis (CLIENT LIST, by name). */
async function subscribers (): Promise<number> {
  const list = await admin.client('LIST') as string
  return list.split('\n').filter((line) => line.includes(`name=${SUBSCRIBER_NAME} `)).length
}

async function until (what: () => Promise<boolean> | boolean, ms: number): Promise<boolean> {
  const end = performance.now() + ms
  while (performance.now() < end) {
    if (await what()) return true
    await sleep(10)
  }
  return await what()
}

let prefixes = 0
const refused = /could not subscribe to the resets and refunds of other app servers/
const warnings = (lines: string[]): number => lines.filter((l) => refused.test(l)).length

/** How many SUBSCRIBEs the server refused to `user` since the last ACL LOG RESET. */
async function channelDenials (user: string): Promise<number> {
  const entries = await admin.call('ACL', 'LOG') as unknown[][]
  let count = 0
  for (const entry of entries) {
    const fields = new Map<unknown, unknown>()
    for (let i = 0; i < entry.length; i += 2) fields.set(entry[i], entry[i + 1])
    if (fields.get('reason') === 'channel' && fields.get('username') === user) count += Number(fields.get('count'))
  }
  return count
}

t.test('a subscription the server refuses: node-redis and GLIDE log it once however often it is refused, and their limiter still decides on Redis', async (t) => {
  await admin.acl('SETUSER', 'nochannels', 'on', '>secret', '~*', 'resetchannels', '+@all')
  t.teardown(() => admin.acl('DELUSER', 'nochannels'))
  const policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' } as const

  await admin.call('ACL', 'LOG', 'RESET')
  const node = createClient({ url: `redis://nochannels:secret@${hostname}:${port}` })
  node.on('error', () => {})
  await node.connect()
  t.teardown(() => node.destroy())
  const nodeLog = logger()
  const viaNode = createLimiter({ redis: node, prefix: `edges${++prefixes}`, timeout: 2000, logger: nodeLog })
  t.teardown(() => viaNode.close())
  t.ok(await until(async () => await channelDenials('nochannels') >= 3, 5000), 'node-redis: refused, again and again')
  t.equal(warnings(nodeLog.lines), 1, 'node-redis: the refusal is logged once')
  t.match(await viaNode.consume('c', policy), { allowed: true, source: 'store' }, 'node-redis: decided by Redis')
  await viaNode.close()

  await admin.call('ACL', 'LOG', 'RESET')
  const glide = await GlideClient.createClient({ addresses: [address], credentials: { username: 'nochannels', password: 'secret' }, requestTimeout: 2000 })
  t.teardown(() => glide.close())
  const before = await subscribers()
  const glideLog = logger()
  const viaGlide = createLimiter({ redis: glide, prefix: `edges${++prefixes}`, timeout: 2000, logger: glideLog })
  t.teardown(() => viaGlide.close())
  // The channel is asked for by a PUBLISH first: a GLIDE subscriber client
  // made for a refused channel tries again in a tight loop until its
  // creation times out, thousands of refusals (each logged by GLIDE) a second.
  t.ok(await until(() => warnings(glideLog.lines) > 0, 5000), 'GLIDE: refused')
  t.ok(await until(async () => await channelDenials('nochannels') >= 3, 5000), 'GLIDE: refused again and again')
  t.equal(warnings(glideLog.lines), 1, 'GLIDE: the refusal is logged once, after more than one')
  t.equal(await subscribers(), before, 'GLIDE: no subscriber client is made for a refused channel')
  const denials = await channelDenials('nochannels')
  await sleep(500)
  t.ok(await channelDenials('nochannels') - denials <= 2, 'GLIDE: a few refusals a second at most, not a loop')
  t.match(await viaGlide.consume('c', policy), { allowed: true, source: 'store' }, 'GLIDE: decided by Redis')
})

t.test('GLIDE: a user who may subscribe but not publish still subscribes', async (t) => {
  await admin.acl('SETUSER', 'nopublish', 'on', '>secret', '~*', '&*', '+@all', '-publish')
  t.teardown(() => admin.acl('DELUSER', 'nopublish'))
  const before = await subscribers()
  const glide = await GlideClient.createClient({ addresses: [address], credentials: { username: 'nopublish', password: 'secret' }, requestTimeout: 2000 })
  t.teardown(() => glide.close())
  const log = logger()
  const limiter = createLimiter({ redis: glide, prefix: `edges${++prefixes}`, timeout: 2000, logger: log })
  t.teardown(() => limiter.close())
  t.ok(await until(async () => await subscribers() === before + 1, 5000), 'subscribed')
  t.equal(warnings(log.lines), 0, 'nothing refused')
})

t.test('GLIDE: the app closes its client, and the subscriber tollgate made from it is closed', async (t) => {
  const before = await subscribers()
  const glide = await GlideClient.createClient({ addresses: [address], requestTimeout: 2000 })
  const limiter = createLimiter({ redis: glide, prefix: `edges${++prefixes}`, timeout: 2000 })
  t.teardown(() => limiter.close())
  t.ok(await until(async () => await subscribers() === before + 1, 5000), 'one subscriber connection')
  glide.close()
  // Seen within POLL_MS, then let go of as GLIDE does (see the next test).
  t.ok(await until(async () => await subscribers() === before, 8000), 'gone after the app closed its client')
})

t.test('GLIDE: a limiter closed while its subscriber is being made leaves no connection behind', async (t) => {
  const before = await subscribers()
  const glide = await GlideClient.createClient({ addresses: [address], requestTimeout: 2000 })
  t.teardown(() => glide.close())
  const limiter = createLimiter({ redis: glide, prefix: `edges${++prefixes}` })
  await limiter.close()
  // The subscriber is made after the close, and closed as soon as it is.
  // GLIDE lets go of a closed client's connection lazily: here 2 to 3 s
  // after close, whenever it was made (a connection that was never closed
  // stays for good), hence the 8 s bound.
  await until(async () => await subscribers() > before, 1000)
  t.ok(await until(async () => await subscribers() === before, 8000), 'no subscriber left')
  await sleep(500)
  t.equal(await subscribers(), before, 'nor later')
})

t.test('GLIDE: a client passed already closed: the start-up wait ends at its bound, with one warning naming it', async (t) => {
  const glide = await GlideClient.createClient({ addresses: [address], requestTimeout: 2000 })
  glide.close()
  const log = logger()
  const limit = rateLimit({ redis: glide, capacity: 5, refillPerSecond: 1, failureMode: 'closed', logger: log })
  t.teardown(() => limit.close())
  t.ok(await until(() => log.lines.some((l) => /is not ready after 2000 ms/.test(l)), 5000), 'warned once the wait is over')
  t.match(await limit.limiter.consume('c', { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }), { allowed: false, source: 'fail-closed' }, 'its limits follow their failure mode')
})

t.test('ioredis: a subscription the server refuses is logged once however often it is refused, and the limiter still decides on Redis', async (t) => {
  await admin.acl('SETUSER', 'nochannels', 'on', '>secret', '~*', 'resetchannels', '+@all')
  t.teardown(() => admin.acl('DELUSER', 'nochannels'))
  await admin.call('ACL', 'LOG', 'RESET')
  const io = new Redis(`redis://nochannels:secret@${hostname}:${port}`)
  io.on('error', () => {})
  t.teardown(() => { io.disconnect() })
  const log = logger()
  const limiter = createLimiter({ redis: io, prefix: `edges${++prefixes}`, timeout: 2000, logger: log })
  t.teardown(() => limiter.close())
  t.ok(await until(async () => await channelDenials('nochannels') >= 3, 5000), 'refused, again and again')
  t.equal(warnings(log.lines), 1, 'the refusal is logged once')
  t.match(await limiter.consume('c', { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }), { allowed: true, source: 'store' }, 'decided by Redis')
})

t.test('node-redis: a limiter closed while its subscriber is being made leaves no connection behind', async (t) => {
  const node = createClient({ url: server.url })
  node.on('error', () => {})
  await node.connect()
  t.teardown(() => node.destroy())
  const before = await subscribers()
  const limiter = createLimiter({ redis: node, prefix: `edges${++prefixes}` })
  await limiter.close()
  await sleep(500)
  t.equal(await subscribers(), before, 'no subscriber connection')
})

t.test('node-redis: the app closes its client: the subscriber tollgate made from it is closed, and calls say the client ended', async (t) => {
  const node = createClient({ url: server.url })
  node.on('error', () => {})
  await node.connect()
  const before = await subscribers()
  const log = logger()
  const limiter = createLimiter({ redis: node, prefix: `edges${++prefixes}`, timeout: 2000, logger: log })
  t.teardown(() => limiter.close())
  t.ok(await until(async () => await subscribers() === before + 1, 5000), 'one subscriber connection')
  node.destroy()
  t.ok(await until(async () => await subscribers() === before, 5000), 'gone with the app\'s client')
  t.match(await limiter.consume('c', { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }), { allowed: false, source: 'fail-closed' }, 'its limits follow their failure mode')
  t.ok(messages(log.errors).some((m) => m.endsWith(`Redis at ${hostname}:${port} is not connected (status end)`)), 'the client is told ended, not waiting to be connected', { messages: messages(log.errors) })
})

t.test('GLIDE: a reply error of a kind with no Redis code in the adapter keeps GLIDE\'s name for it (a master demoted to a replica: READONLY)', async (t) => {
  const own = await startRedisServer()
  t.teardown(() => own.stop())
  const glide = await GlideClient.createClient({ addresses: [{ host: own.host, port: own.port }], requestTimeout: 2000 })
  t.teardown(() => glide.close())
  const log = logger()
  const limiter = createLimiter({ redis: glide, prefix: `edges${++prefixes}`, timeout: 2000, logger: log })
  t.teardown(() => limiter.close())
  const policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' } as const
  t.match(await limiter.consume('c', policy), { allowed: true, source: 'store' }, 'decided by Redis while a master')
  // As a failover demotes an old master: a replica (of a master that is not
  // there) keeps its data and answers, read-only.
  await redisCommand(own, ['REPLICAOF', own.host, String(NO_REDIS_PORT)])
  t.match(await limiter.consume('c', policy), { allowed: false, source: 'fail-closed' }, 'then its limits follow their failure mode')
  const logged = messages(log.errors)
  t.ok(logged.some((m) => m.includes(": ReadOnly You can't write against a read only replica.")), 'GLIDE\'s kind, then the server\'s words, without GLIDE\'s prefix', { logged })
  const causes: string[] = []
  for (let err = log.errors.find((e) => e instanceof Error && /read only replica/.test(e.message)); err instanceof Error; err = err.cause) causes.push(err.message)
  t.ok(causes.some((m) => m.startsWith("An error was signalled by the server: - ReadOnly: You can't write")), 'GLIDE\'s own error in its causes', { causes })
})

t.test('GLIDE: a client that shows no configuration is named so, and gets no subscriber: refused and logged once, its limits decided by Redis; a limiter closed at once says nothing', async (t) => {
  const glide = await GlideClient.createClient({ addresses: [address], requestTimeout: 2000 })
  t.teardown(() => glide.close())
  // Standing for a client that keeps its configuration elsewhere than in GLIDE's own \`config\`.
  t.ok(Reflect.deleteProperty(glide, 'config'), 'config removed')
  t.equal(storeTarget(glide), 'a GLIDE client', 'named, since its addresses are not known')
  const before = await subscribers()
  const quiet = logger()
  const closed = createLimiter({ redis: glide, prefix: `edges${++prefixes}`, timeout: 2000, logger: quiet })
  await closed.close()
  const log = logger()
  const limiter = createLimiter({ redis: glide, prefix: `edges${++prefixes}`, timeout: 2000, logger: log })
  t.teardown(() => limiter.close())
  t.ok(await until(() => warnings(log.lines) > 0, 5000), 'refused')
  t.match(messages(log.errors), ['this GLIDE client does not show the configuration it was created with'], 'saying why')
  await sleep(400) // tried again after 50, 100 and 200 ms
  t.equal(warnings(log.lines), 1, 'logged once')
  t.equal(await subscribers(), before, 'no subscriber client made')
  t.match(await limiter.consume('c', { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }), { allowed: true, source: 'store' }, 'decided by Redis')
  t.same(quiet.lines, [], 'the limiter closed at once logged nothing')
})

t.test('a node-redis client that maps integers to strings: the replies are read as numbers, one decision or a batch', async (t) => {
  const node = createClient({ url: server.url })
  node.on('error', () => {})
  await node.connect()
  t.teardown(() => node.destroy())
  const strings = node.withTypeMapping({ [RESP_TYPES.NUMBER]: String })
  t.equal(await strings.sendCommand(['EVAL', 'return 5', '0']), '5', 'the client hands integers over as strings')
  const limiter = createLimiter({ redis: strings, prefix: `edges${++prefixes}`, timeout: 2000, logger: logger() })
  t.teardown(() => limiter.close())
  const policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' } as const
  t.match(await limiter.consume('one', policy), { allowed: true, remaining: 4, source: 'store' }, 'alone')
  const both = await Promise.all([limiter.consume('a', policy), limiter.consume('a', policy), limiter.consume('b', { ...policy, cost: 5 })])
  t.same(both.map((d) => [d.source, d.remaining]), [['store', 4], ['store', 3], ['store', 0]], 'a batch of three')
  t.match(await limiter.peek('a', { ...policy, maxWaitMs: 100 }), { allowed: true, remaining: 3, source: 'store' }, 'the reservations\' script')
  const reserved = await limiter.reserve('r', policy, 2)
  t.match(reserved.decision, { allowed: true, remaining: 3, source: 'store' }, 'a reserve')
  await limiter.settle(reserved, 1)
  t.match(await limiter.peek('r', policy), { remaining: 4 }, 'and its settlement')
})

t.test('node-redis: a call lost with its connection is the client failing, not an answer of Redis: the breaker counts it', async (t) => {
  const own = await startRedisServer()
  t.teardown(() => own.stop())
  const node = createClient({ url: own.url, socket: { reconnectStrategy: false } })
  node.on('error', () => {})
  await node.connect()
  t.teardown(() => { try { node.destroy() } catch {} })
  const limiter = createLimiter({ redis: node, prefix: `edges${++prefixes}`, timeout: 5000, breaker: { failures: 1, cooldownMs: 60_000 }, logger: logger(), keySecret: 'lost-call-edge-test-secret' })
  t.teardown(() => limiter.close())
  await limiter.ready
  const policy = { bucket: 'b', capacity: 5, refillPerSecond: 1, failureMode: 'closed' } as const
  own.pause()
  const pending = limiter.consume('c', policy)
  await sleep(100) // sent, and waiting on the frozen server
  await own.kill()
  const started = performance.now()
  t.match(await pending, { allowed: false, source: 'fail-closed' }, 'the call in flight fails with its connection')
  t.ok(performance.now() - started < 4000, 'when the connection is lost, not at the deadline')
  t.not(limiter.state, 'healthy', 'counted as the store failing: the breaker (1 failure) is open')
})
