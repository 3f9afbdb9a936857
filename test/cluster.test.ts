// tollgate on a real local Redis Cluster (3 masters, no replicas):
// - the race: four app servers, each with its own Cluster client, spend one
//   bucket of 50 concurrently, and exactly 50 requests pass;
// - the clock: an app server whose clock is 3 hours ahead gains nothing;
// - keys: many clients spread over every master, all buckets of one client
//   share one slot, a client id with braces cannot pick its slot, and a
//   route with several policies costs one script call on one node.

import { once } from 'node:events'
import { Agent, request } from 'node:http'
import Fastify, { type FastifyInstance } from 'fastify'
import t from 'tap'
import tollgate, { createLimiter, type Policy } from '../lib/index.js'
import { uniquePrefix } from './helpers/app.js'
import { keysOn, startCluster } from './helpers/cluster.js'
import { startFleetServer } from './helpers/fleet.js'
import { infoField, redisCommand, type RedisServer } from './helpers/redis.js'
import { fleetSecret, isSecretKey, keyUnder } from './helpers/keys.js'

const cluster = await startCluster({ masters: 3 })
t.teardown(() => cluster.stop())
const masters = await cluster.masters()

/** A Cluster client that fails at once instead of queueing while the cluster is not ready. */
function clusterClient (t: { teardown(fn: () => unknown): void }): ReturnType<typeof cluster.client> {
  const client = cluster.client({ enableOfflineQueue: false })
  client.on('error', () => {})
  t.teardown(() => client.disconnect())
  return client
}

/** The same, once connected: createLimiter, unlike the plugin, does not wait for its client. */
async function readyClient (t: { teardown(fn: () => unknown): void }): Promise<ReturnType<typeof cluster.client>> {
  const client = clusterClient(t)
  if (client.status !== 'ready') await once(client, 'ready')
  return client
}

async function keySlot (key: string): Promise<number> {
  return await redisCommand(masters[0] as RedisServer, ['CLUSTER', 'KEYSLOT', key]) as number
}


/** master port -> keys under `prefix` on it */
async function keysByMaster (prefix: string): Promise<Map<number, string[]>> {
  const out = new Map<number, string[]>()
  for (const master of masters) out.set(master.port, (await keysOn(master, `${prefix}:*`)).filter((key) => !isSecretKey(key, prefix)))
  return out
}

async function listen (app: FastifyInstance): Promise<number> {
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  return typeof address === 'object' && address !== null ? address.port : 0
}

function get (agent: Agent, port: number, path: string, headers: Record<string, string> = {}): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, agent, headers }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode ?? 0))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

t.test('race: 400 concurrent requests over 4 app servers with their own Cluster clients, exactly 50 pass', async (t) => {
  const SERVERS = 4
  const REQUESTS = 400
  const CAPACITY = 50
  const prefix = uniquePrefix()
  const servers = await Promise.all(Array.from({ length: SERVERS }, async () => {
    const app = Fastify()
    t.teardown(() => app.close())
    await app.register(tollgate, {
      redis: clusterClient(t),
      prefix,
      capacity: CAPACITY,
      // One token per 11.6 days: none comes back during the test.
      refillPerSecond: 1e-6,
      // Closed, with a deadline far above any reply here: a slow store
      // turns into 503s (under-admission), never into extra 200s, so
      // exactly 50 is the only passing count.
      failureMode: 'closed',
      timeout: 2_000,
      global: false,
      key: () => 'racer'
    })
    app.get('/race', { config: { rateLimit: { bucket: 'race' } } }, async () => 'ok')
    const port = await listen(app)
    // 25 sockets per server: 100 requests in flight at once.
    const agent = new Agent({ keepAlive: true, maxSockets: 25 })
    t.teardown(() => agent.destroy())
    return { port, agent }
  }))

  const statuses: Record<number, number> = {}
  const admittedBy = servers.map(() => 0)
  await Promise.all(Array.from({ length: REQUESTS }, async (_, i) => {
    const index = i % SERVERS
    const server = servers[index] as (typeof servers)[number]
    const status = await get(server.agent, server.port, '/race')
    statuses[status] = (statuses[status] ?? 0) + 1
    if (status === 200) admittedBy[index] = (admittedBy[index] ?? 0) + 1
  }))
  t.comment(`statuses ${JSON.stringify(statuses)}, admitted per server ${admittedBy.join('/')}`)
  t.equal(statuses[200] ?? 0, CAPACITY, 'exactly the capacity is admitted')
  t.equal(statuses[429] ?? 0, REQUESTS - CAPACITY, 'the rest are limited')
  t.equal(statuses[503] ?? 0, 0, 'no store failure (a 503 would be under-admission)')
  t.ok(admittedBy.filter((n) => n > 0).length >= 2, 'admissions came through several servers')
})

t.test('clock: an app server 3 hours ahead gains no tokens', async (t) => {
  const SKEW_MS = 3 * 3600 * 1000
  // One token per 100 s: nothing refills during the test, while a clock 3 h
  // ahead would refill the bucket many times over.
  const shape = { capacity: 5, refillPerSecond: 0.01 }
  const prefix = uniquePrefix()
  const bucket = 'clock'

  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, {
    redis: clusterClient(t),
    prefix,
    ...shape,
    failureMode: 'closed',
    timeout: 2_000,
    global: false,
    key: (request) => String(request.headers['x-client'])
  })
  app.get('/hit', { config: { rateLimit: { bucket } } }, async () => 'ok')
  await app.ready()
  const onTime = async (client: string): Promise<{ status: number, remaining: string | undefined }> => {
    const res = await app.inject({ url: '/hit', headers: { 'x-client': client } })
    return { status: res.statusCode, remaining: res.headers['ratelimit-remaining'] as string | undefined }
  }

  const onCluster = { cluster: cluster.startupNodes, clusterOptions: { enableOfflineQueue: false } }
  // One process 3 h ahead, with two clients: /cluster/hit runs tollgate as
  // it is; /trusting/hit, the control, runs the script variant that takes
  // `now` from the app (helpers/naive.ts).
  const ahead = await startFleetServer(t, {
    name: 'ahead',
    stores: { cluster: onCluster, trusting: { ...onCluster, trustAppClock: true } },
    prefix,
    bucket,
    ...shape,
    failureMode: 'closed',
    timeout: 2_000,
    clockSkewMs: SKEW_MS
  })
  const early = async (route: 'cluster' | 'trusting', client: string): Promise<{ status: number, remaining: string | undefined, retryAfter: number }> => {
    const res = await ahead.get(`/${route}/hit`, { 'x-client': client })
    return { status: res.status, remaining: res.headers['ratelimit-remaining'] as string | undefined, retryAfter: Number(res.headers['retry-after']) }
  }

  const clock = JSON.parse((await ahead.get('/clock')).body) as { now: number }
  const drift = clock.now - Date.now()
  // The request's own round trip is well under a minute.
  t.ok(Math.abs(drift - SKEW_MS) < 60_000, `the server's clock is ${(drift / 3_600_000).toFixed(2)} h ahead`)

  t.test('it cannot refill a bucket others emptied', async (t) => {
    for (let i = 0; i < 5; i++) t.equal((await onTime('client-a')).status, 200, `on-time server: request ${i + 1} passes`)
    t.equal((await onTime('client-a')).status, 429, 'on-time server: the bucket is empty')
    const denied = await early('cluster', 'client-a')
    t.equal(denied.status, 429, 'the server 3 h ahead is denied as well')
    t.equal(denied.remaining, '0', 'and sees no token left')
    // The next token is 100 s away on Redis's clock, less the few seconds
    // this test has run; a clock-trusting script would say 0 or pass.
    t.ok(denied.retryAfter > 60 && denied.retryAfter <= 100, `Retry-After ${denied.retryAfter} s follows Redis's clock`)
  })

  t.test('its spends land on the shared timeline', async (t) => {
    for (const left of ['4', '3', '2']) t.match(await early('cluster', 'client-b'), { status: 200, remaining: left }, `ahead: ${left} left`)
    // Had it written "full again at" on its own clock, the bucket would look
    // empty for 3 hours to every on-time server.
    t.same(await onTime('client-b'), { status: 200, remaining: '1' }, 'on time: 1 left')
    t.same(await onTime('client-b'), { status: 200, remaining: '0' }, 'on time: 0 left')
    t.equal((await onTime('client-b')).status, 429, 'on time: empty')
  })

  t.test('control: a script that trusted the app clock would let it refill', async (t) => {
    for (let i = 0; i < 5; i++) await onTime('client-c')
    t.equal((await onTime('client-c')).status, 429, 'on-time server emptied the bucket')
    t.match(await early('trusting', 'client-c'), { status: 200, remaining: '4' },
      'the clock-trusting variant sees a full bucket: the check above would catch it')
  })
})

t.test('keys of 300 clients spread over every master', async (t) => {
  const prefix = uniquePrefix()
  const limiter = createLimiter({ redis: await readyClient(t), prefix, timeout: 2_000 })
  t.teardown(() => limiter.close())
  // Slow refill: each key lives 1000 s, long past the count below.
  const policy: Policy = { bucket: 'spread', capacity: 10, refillPerSecond: 0.001, failureMode: 'closed' }
  const CLIENTS = 300
  const decisions = await Promise.all(Array.from({ length: CLIENTS }, (_, i) => limiter.consume(`client-${i}`, policy)))
  t.ok(decisions.every((d) => d.allowed && d.source === 'store'), 'every client was decided by the store')

  const byMaster = await keysByMaster(prefix)
  const counts = [...byMaster.values()].map((keys) => keys.length)
  t.comment(`keys per master: ${[...byMaster].map(([port, keys]) => `${port}: ${keys.length}`).join(', ')}`)
  t.equal(counts.reduce((a, b) => a + b, 0), CLIENTS, 'one key per client, all found')
  t.equal(byMaster.size, 3)
  // The split follows the fleet's random key secret: each master's count is
  // Binomial(300, 1/3), mean 100, standard deviation 8.2, so at least 50 is
  // six deviations short; each master holding a real share shows the
  // client, not one shared tag, places the key.
  for (const [port, keys] of byMaster) t.ok(keys.length >= CLIENTS / 6, `master ${port} holds ${keys.length} keys`)
  const slots = new Set(await Promise.all([...byMaster.values()].flat().map(keySlot)))
  t.ok(slots.size > CLIENTS * 0.9, `${slots.size} distinct slots for ${CLIENTS} clients`)
})

t.test('all buckets of one client live in one slot', async (t) => {
  const prefix = uniquePrefix()
  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, {
    redis: clusterClient(t),
    prefix,
    capacity: 10,
    // Slow refills keep the keys alive while the test looks for them.
    refillPerSecond: 0.01,
    failureMode: 'closed',
    timeout: 2_000,
    key: (request) => String(request.headers['x-client'])
  })
  app.get('/multi', {
    config: {
      rateLimit: [
        { bucket: 'burst', capacity: 5, refillPerSecond: 0.01 },
        { bucket: 'hourly', capacity: 100, refillPerSecond: 100 / 3600 },
        { bucket: 'daily', capacity: 1000, refillPerSecond: 1000 / 86_400 }
      ]
    }
  }, async () => 'ok')
  app.get('/other', async () => 'ok')
  await app.ready()

  // 'alice' is kept as it is; 'bob@example.com' holds '@', so it is hashed.
  for (const client of ['alice', 'bob@example.com']) {
    for (const url of ['/multi', '/other']) {
      t.equal((await app.inject({ url, headers: { 'x-client': client } })).statusCode, 200, `${client} ${url}`)
    }
  }
  const byMaster = await keysByMaster(prefix)
  const all = [...byMaster.values()].flat()
  t.equal(all.length, 8, '4 buckets for each of the 2 clients')
  const tags = new Set(all.map((key) => key.slice(key.indexOf('{'), key.indexOf('}') + 1)))
  t.equal(tags.size, 2, 'one hash tag per client')
  for (const tag of tags) {
    const keys = all.filter((key) => key.includes(tag))
    t.equal(keys.length, 4, `${tag}: 3 policies of /multi and the bucket of /other`)
    const holders = [...byMaster].filter(([, onMaster]) => keys.some((key) => onMaster.includes(key)))
    t.equal(holders.length, 1, `${tag}: every key on one master`)
    const slots = new Set(await Promise.all(keys.map(keySlot)))
    t.equal(slots.size, 1, `${tag}: every key in one slot`)
    t.same([...slots], [await keySlot(tag.slice(1, -1))], `${tag}: the slot of the client's hash tag`)
  }
  t.ok(all.some((key) => key.includes('}alice:')), 'a plain id is kept, readable, after its tag')
})

t.test('a client id with braces cannot choose its slot', async (t) => {
  const prefix = uniquePrefix()
  const limiter = createLimiter({ redis: await readyClient(t), prefix, timeout: 2_000 })
  t.teardown(() => limiter.close())
  const policyFor = (i: number): Policy => ({ bucket: `b${i}`, capacity: 10, refillPerSecond: 0.001, failureMode: 'closed' })

  /**
   * The key tollgate wrote for `id`: each id gets its own bucket, so the
   * key is found by its suffix, whatever the client part became.
   */
  async function storedKey (id: string, i: number): Promise<string> {
    const decision = await limiter.consume(id, policyFor(i))
    t.equal(decision.source, 'store', `${JSON.stringify(id)} decided by the store`)
    const found = [...(await keysByMaster(prefix)).values()].flat().filter((key) => key.endsWith(`:b${i}`))
    t.equal(found.length, 1, `one key for ${JSON.stringify(id)}`)
    return found[0] ?? ''
  }

  // id -> the brace content it tries to make Redis hash, were it pasted in the key
  const hostile: Array<[string, string]> = [
    ['x}{evil', 'x'],
    ['{a}', 'a'],
    ['}{victim', 'victim'],
    ['{}', ''],
    ['a{b}c', 'b']
  ]
  for (const [i, [id, content]] of hostile.entries()) {
    const key = await storedKey(id, i)
    t.equal(key.split('{').length, 2, `${JSON.stringify(id)}: one '{' in ${key}`)
    t.equal(key.split('}').length, 2, `${JSON.stringify(id)}: one '}' in ${key}`)
    const slot = await keySlot(key)
    const pasted = await keySlot(`${prefix}:{${id}}:b${i}`)
    t.not(slot, pasted, `${JSON.stringify(id)}: not the slot of the key with the id pasted in`)
    if (content !== '') t.not(slot, await keySlot(content), `${JSON.stringify(id)}: not the slot of '${content}'`)
  }

  // An attacker aiming many ids at one victim's slot.
  const victimSlot = await keySlot('victim')
  const aimed = await Promise.all(Array.from({ length: 16 }, async (_, j) => {
    const i = hostile.length + j
    return await keySlot(await storedKey(`victim}{${j}`, i))
  }))
  t.equal(aimed.filter((slot) => slot === victimSlot).length, 0, 'none of 16 aimed ids lands in the victim\'s slot')
  t.ok(new Set(aimed).size >= 14, `they scatter: ${new Set(aimed).size} distinct slots`)
})

t.test('a route with three policies is one script call on one node', async (t) => {
  const prefix = uniquePrefix()
  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, {
    redis: clusterClient(t),
    prefix,
    capacity: 1000,
    refillPerSecond: 1,
    failureMode: 'closed',
    timeout: 2_000,
    key: () => 'carol'
  })
  app.get('/multi', { config: { rateLimit: [{ bucket: 'one' }, { bucket: 'two' }, { bucket: 'three' }] } }, async () => 'ok')
  await app.ready()

  // The first call loads the script on its node (EVALSHA, NOSCRIPT, EVAL).
  t.equal((await app.inject('/multi')).statusCode, 200, 'warm-up')
  for (const master of masters) await redisCommand(master, ['CONFIG', 'RESETSTAT'])
  const REQUESTS = 20
  for (let i = 0; i < REQUESTS; i++) t.equal((await app.inject('/multi')).statusCode, 200)

  const secret = await fleetSecret(await readyClient(t), prefix)
  const owner = await cluster.masterFor(keyUnder(secret, prefix, 'carol', 'one'))
  for (const master of masters) {
    const stats = await redisCommand(master, ['INFO', 'commandstats'])
    const calls = (name: string): number => Number(/calls=(\d+)/.exec(infoField(stats, `cmdstat_${name}`) ?? '')?.[1] ?? 0)
    const scripts = calls('evalsha') + calls('eval')
    if (master === owner) {
      t.equal(scripts, REQUESTS, `the owner of carol's slot (${master.port}) ran one script per request`)
      t.equal(calls('evalsha'), REQUESTS, 'each by EVALSHA, the script already loaded')
    } else {
      t.equal(scripts, 0, `${master.port} ran no script`)
    }
  }
  t.same((await keysOn(owner, `${prefix}:*`)).filter((key) => !isSecretKey(key, prefix)).sort(), ['one', 'three', 'two'].map((b) => keyUnder(secret, prefix, 'carol', b)),
    'the three buckets are on that node')
})

t.test('resets reach another Cluster client\'s cache: the subscriber is made on one node once the client knows its nodes', async (t) => {
  const prefix = uniquePrefix()
  const channel = `${prefix}:changes`
  const lazy = cluster.client({ enableOfflineQueue: false, lazyConnect: true })
  lazy.on('error', () => {})
  t.teardown(() => lazy.disconnect())
  t.equal(lazy.nodes('all').length, 0, 'a Cluster client not connected yet knows no node')
  const b = createLimiter({ redis: lazy, prefix, timeout: 2000, denialCache: { maxAgeMs: 60_000 } })
  t.teardown(() => b.close())
  await lazy.connect()
  const a = createLimiter({ redis: await readyClient(t), prefix, timeout: 2000 })
  t.teardown(() => a.close())
  /** Subscribers of the channel over every node (NUMSUB counts a node's own). */
  const subscribed = async (): Promise<number> => {
    let count = 0
    for (const node of cluster.nodes) count += ((await redisCommand(node, ['PUBSUB', 'NUMSUB', channel]) as [string, number])[1])
    return count
  }
  const started = performance.now()
  while (await subscribed() < 2 && performance.now() - started < 5000) await new Promise((resolve) => setTimeout(resolve, 10))
  t.equal(await subscribed(), 2, 'each limiter subscribes on one node, b once its client has connected')
  const policy: Policy = { bucket: 'hourly', capacity: 1, refillPerSecond: 1 / 3600, failureMode: 'closed' }
  t.ok((await b.consume('c', policy)).allowed)
  t.match(await b.consume('c', policy), { allowed: false, source: 'store' })
  t.match(await b.consume('c', policy), { allowed: false, source: 'cache' }, 'b caches the denial')
  await a.reset('c', 'hourly')
  let allowed = false
  const reset = performance.now()
  while (!allowed && performance.now() - reset < 1000) {
    // A cached denial answers without I/O: let the loop read the subscriber's socket between tries.
    await new Promise((resolve) => setImmediate(resolve))
    allowed = (await b.consume('c', policy)).allowed
  }
  t.ok(allowed, `b asks Redis after a's reset, published on one node and passed on to the others (${(performance.now() - reset).toFixed(1)} ms)`)
})
