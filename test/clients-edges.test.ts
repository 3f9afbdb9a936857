// The client adapters' paths that the per-family tests do not reach, on a
// real Redis: a subscription the server refuses (an ACL without channels)
// on node-redis and GLIDE; a GLIDE client the app closes (GLIDE tells of no
// close: tollgate looks once a second), or passes already closed; a limiter
// closed while its GLIDE subscriber is still being made.

import { setTimeout as sleep } from 'node:timers/promises'
import { GlideClient } from '@valkey/valkey-glide'
import { Redis } from 'ioredis'
import { createClient } from 'redis'
import t from 'tap'
import { SUBSCRIBER_NAME } from '../lib/core/invalidation.js'
import { rateLimit } from '../lib/express.js'
import { createLimiter, type Logger } from '../lib/index.js'
import { startRedisServer } from './helpers/redis.js'

const server = await startRedisServer()
t.teardown(() => server.stop())
const admin = new Redis(server.url)
t.teardown(() => { admin.disconnect() })
const { hostname, port } = new URL(server.url)
const address = { host: hostname, port: Number(port) }

function logger (): Logger & { lines: string[] } {
  const lines: string[] = []
  return {
    lines,
    warn: (_o, msg) => { lines.push(msg) },
    info: (_o, msg) => { lines.push(msg) },
    error: (_o, msg) => { lines.push(msg) }
  }
}

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
