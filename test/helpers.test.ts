// Proves the test helpers against real processes: they are what every other
// test trusts to make Redis slow, dead or clustered.
//
// Timing tolerance: timeouts used to detect "no answer" are 300 ms; a live
// local Redis answers in well under that even on a loaded 2-core machine, and
// a paused or blackholed one never answers, so these checks do not depend on
// speed. The one duration check (proxy delay) only has a hard lower bound
// (timers never fire early) and a loose upper bound of 20x the delay.

import { once } from 'node:events'
import { existsSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import t from 'tap'
import { startCluster } from './helpers/cluster.js'
import { startProxy } from './helpers/proxy.js'
import {
  dockerAvailable,
  infoField,
  redisCommand,
  redisUrl,
  startRedisServer,
  type TeardownTarget
} from './helpers/redis.js'

const NO_ANSWER_MS = 300

function alive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

function client (t: TeardownTarget, url: string, opts: { commandTimeout?: number } = {}): Redis {
  const redis = new Redis(url, { commandTimeout: opts.commandTimeout ?? NO_ANSWER_MS, lazyConnect: false })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  return redis
}

/** Raw socket to the proxy, so a reset or refusal is seen exactly as it happens. */
async function rawConnect (port: number): Promise<Socket> {
  const socket = connect({ host: '127.0.0.1', port })
  socket.on('error', () => {})
  await once(socket, 'connect')
  return socket
}

async function waitFor (what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!await check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(50)
  }
}

t.test('redisUrl gives a Redis that answers PING, shared within the process', async t => {
  const url = await redisUrl(t)
  t.match(url, /^redis:\/\//)
  t.equal(await redisUrl(t), url, 'second caller gets the same Redis')
  t.equal(await client(t, url).ping(), 'PONG')
  t.type(await dockerAvailable(), 'boolean')
})

t.test('redisUrl prefers REDIS_URL', async t => {
  const saved = process.env.REDIS_URL
  t.teardown(() => {
    if (saved === undefined) delete process.env.REDIS_URL
    else process.env.REDIS_URL = saved
  })
  process.env.REDIS_URL = 'redis://example.invalid:1234'
  t.equal(await redisUrl(t), 'redis://example.invalid:1234')
})

t.test('a missing redis-server binary is a clear error', async t => {
  const saved = process.env.PATH
  t.teardown(() => { process.env.PATH = saved })
  process.env.PATH = '/nonexistent'
  await t.rejects(startRedisServer(), /`redis-server` was not found on PATH/)
})

t.test('startRedisServer: pause stops answers, resume brings them back', async t => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  t.equal(server.url, `redis://127.0.0.1:${server.port}`)
  const info = await redisCommand(server, ['INFO', 'server'])
  t.equal(infoField(info, 'process_id'), String(server.pid), 'the server is our process')

  const redis = client(t, server.url)
  t.equal(await redis.ping(), 'PONG')
  server.pause()
  t.equal(server.paused, true)
  await t.rejects(redis.ping(), /timed out/i, 'a paused server does not answer')
  server.resume()
  t.equal(await redis.ping(), 'PONG', 'answers again after resume')
})

t.test('startRedisServer: kill, then restart on the same port', async t => {
  const server = await startRedisServer({ args: ['--maxmemory', '10mb'] })
  t.teardown(() => server.stop())
  const { port, pid } = server
  const before = await redisCommand(server, ['CONFIG', 'GET', 'maxmemory'])
  t.same(before, ['maxmemory', String(10 * 1024 * 1024)], 'extra args are applied')

  await server.kill()
  t.equal(server.running, false)
  t.equal(alive(pid), false, 'process is gone')
  await t.rejects(redisCommand(server, ['PING']), /ECONNREFUSED/, 'nothing listens after kill')

  await server.restart()
  t.equal(server.port, port, 'same port')
  t.not(server.pid, pid, 'new process')
  t.equal(await client(t, server.url).ping(), 'PONG', 'a fresh client gets answers')
  t.same(await redisCommand(server, ['CONFIG', 'GET', 'maxmemory']), before, 'same args after restart')
})

t.test('startRedisServer: stop() on a paused server leaves nothing behind', async t => {
  const server = await startRedisServer()
  const { pid, dir } = server
  server.pause()
  await Promise.all([server.stop(), server.stop()])
  await server.stop()
  t.equal(alive(pid), false, 'process is gone')
  t.equal(existsSync(dir), false, 'temp dir is removed')
  t.throws(() => server.pause(), /stopped/)
  await t.rejects(server.restart(), /stopped/)
})

t.test('proxy', async t => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const proxy = await startProxy(server.url)
  t.teardown(() => proxy.close())

  t.test('is transparent by default', async t => {
    const redis = client(t, proxy.url)
    t.equal(await redis.ping(), 'PONG')
    t.equal(proxy.connections, 1)
  })

  t.test('delays replies by about delayMs, in order', async t => {
    const redis = client(t, proxy.url, { commandTimeout: 10_000 })
    await redis.ping()
    const delayMs = 250
    proxy.delayMs = delayMs
    t.teardown(() => proxy.reset())
    const start = performance.now()
    t.equal(await redis.ping(), 'PONG')
    const elapsed = performance.now() - start
    // Lower bound is hard (a 2 ms allowance for timer rounding); the upper
    // bound only has to tell "delayed" from "lost", so it is 20x.
    t.ok(elapsed >= delayMs - 2, `took ${elapsed.toFixed(0)} ms, at least ${delayMs}`)
    t.ok(elapsed < delayMs * 20, `took ${elapsed.toFixed(0)} ms, far from forever`)

    const key = `helpers:proxy:order:${process.pid}`
    const pipeline = redis.pipeline().del(key)
    for (let i = 0; i < 20; i++) pipeline.incr(key)
    const results = await pipeline.exec()
    t.same(results?.slice(1).map(([, value]) => value), Array.from({ length: 20 }, (_, i) => i + 1))
    await redis.del(key)
  })

  t.test('blackhole loses replies but not commands; reset recovers', async t => {
    const redis = client(t, proxy.url)
    await redis.ping()
    const key = `helpers:proxy:blackhole:${process.pid}`
    proxy.blackhole()
    await t.rejects(redis.set(key, 'written'), /timed out/i, 'the reply never arrives')
    await t.rejects(client(t, proxy.url).ping(), /timed out/i, 'new connections get no replies either')
    proxy.reset()
    t.equal(await client(t, proxy.url).get(key), 'written', 'the command itself reached Redis')
    t.equal(await client(t, server.url).del(key), 1)
  })

  t.test('dropConnections resets open connections mid-stream', async t => {
    const socket = await rawConnect(proxy.port)
    socket.write('PING\r\n')
    const [pong] = await once(socket, 'data')
    t.equal(String(pong), '+PONG\r\n')
    const closed = new Promise<boolean>(resolve => socket.once('close', resolve))
    const errored = new Promise<Error>(resolve => socket.once('error', resolve))
    proxy.dropConnections()
    t.equal(await closed, true, 'the client sees an error, not an orderly close')
    t.match(await errored, { code: 'ECONNRESET' })
    t.equal(proxy.connections, 0)
    t.equal(await client(t, proxy.url).ping(), 'PONG', 'new connections work')
  })

  t.test('refuse closes new connections at once', async t => {
    proxy.refuse = true
    t.teardown(() => proxy.reset())
    // Depending on when the reset lands, the client sees it as a failed
    // connect or as a connection closed right away; never as a reply.
    const socket = connect({ host: '127.0.0.1', port: proxy.port })
    socket.on('error', () => {})
    const received: Buffer[] = []
    socket.on('data', chunk => received.push(chunk))
    socket.write('PING\r\n')
    await new Promise(resolve => socket.once('close', resolve))
    t.same(received, [], 'no reply')
    await t.rejects(redisCommand(proxy, ['PING']))
    proxy.reset()
    t.equal(await redisCommand(proxy, ['PING']), 'PONG')
  })

  t.test('close is idempotent and stops listening', async t => {
    const other = await startProxy({ port: server.port })
    await Promise.all([other.close(), other.close()])
    await t.rejects(redisCommand(other, ['PING']), /ECONNREFUSED/)
  })
})

t.test('startCluster: 3 masters serving every slot, usable from ioredis', async t => {
  const cluster = await startCluster()
  t.teardown(() => cluster.stop())
  t.equal(cluster.nodes.length, 3)
  for (const node of cluster.nodes) {
    const info = await redisCommand(node, ['CLUSTER', 'INFO'])
    t.equal(infoField(info, 'cluster_state'), 'ok', `${node.port} cluster_state`)
    t.equal(infoField(info, 'cluster_slots_assigned'), '16384', `${node.port} slots assigned`)
  }
  t.same((await cluster.masters()).map(n => n.port).sort(), cluster.nodes.map(n => n.port).sort())

  // Keys on different masters, so the client really follows the slot map.
  const keysByMaster = new Map<number, string>()
  for (let i = 0; keysByMaster.size < 3 && i < 100; i++) {
    const key = `helpers:cluster:${i}`
    const master = await cluster.masterFor(key)
    if (!keysByMaster.has(master.port)) keysByMaster.set(master.port, key)
  }
  t.equal(keysByMaster.size, 3, 'found a key for every master')
  const redis = cluster.client()
  for (const [port, key] of keysByMaster) {
    t.equal(await redis.set(key, String(port)), 'OK')
    t.equal(await redis.get(key), String(port))
    t.equal(await redisCommand({ port }, ['GET', key]), String(port), 'stored on the expected master')
  }

  const pids = cluster.nodes.map(n => n.pid)
  const dirs = cluster.nodes.map(n => n.dir)
  await cluster.stop()
  await cluster.stop()
  t.same(pids.filter(alive), [], 'every node process is gone')
  t.same(dirs.filter(dir => existsSync(dir)), [], 'every node dir is removed')
})

t.test('startCluster with replicas: a paused master is replaced', async t => {
  const cluster = await startCluster({ masters: 3, replicasPerMaster: 1, nodeTimeoutMs: 1_000 })
  t.teardown(() => cluster.stop())
  t.equal(cluster.nodes.length, 6)
  const key = `helpers:failover:${process.pid}`
  const redis = cluster.client()
  // Replication is asynchronous: WAIT, on the connection that wrote, until
  // the replica has the write, or a failover may rightly lose it.
  const replies = await redis.pipeline().set(key, 'kept').call('wait', '1', '5000').exec()
  t.same(replies, [[null, 'OK'], [null, 1]], 'written, and the replica has it')

  const victim = await cluster.masterFor(key)
  victim.pause()
  // Failover needs node timeout (1 s) plus an election; 20 s leaves room for a busy machine.
  await waitFor('a replica to take over', async () => {
    const masters = await cluster.masters()
    return masters.length === 3 && !masters.includes(victim)
  }, 20_000)
  t.not((await cluster.masterFor(key)).port, victim.port, 'key is served by the promoted replica')
  victim.resume()
  await cluster.waitHealthy()
  t.equal(await redis.get(key), 'kept', 'the client follows the failover')

  const pids = cluster.nodes.map(n => n.pid)
  await cluster.stop()
  t.same(pids.filter(alive), [], 'every node process is gone')
})
