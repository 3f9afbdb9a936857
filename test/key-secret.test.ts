// The key secret (lib/core/key-secret.ts, docs/reference/keys.md): every
// server of a fleet names a client's keys alike, with or without
// `keySecret`; a server whose secret differs says so at start-up; and
// until the fleet's secret is read, calls follow their failure modes
// (the in-process fallback included), never spending from a bucket no other
// server sees.

import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { createLimiter, type Limiter, type LimiterOptions, type Logger, type Policy } from '../lib/index.js'
import { clientId } from '../lib/core/keys.js'
import { keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { fleetKey, keyUnder, secretKey } from './helpers/keys.js'
import { freePort, redisUrl, startRedisServer } from './helpers/redis.js'

await redisUrl(t)

const login: Policy = { bucket: 'login', capacity: 3, refillPerSecond: 0.001, failureMode: 'closed' }
const SECRET = 'sixteen or more characters'

interface Lines extends Logger {
  readonly lines: Array<{ level: string, msg: string }>
}

function lines (): Lines {
  const lines: Array<{ level: string, msg: string }> = []
  const at = (level: string) => (_obj: object, msg: string): void => { lines.push({ level, msg }) }
  return { lines, warn: at('warn'), info: at('info'), error: at('error') }
}

/** A limiter on its own client of the shared test Redis, closed after `t`. */
async function limiter (t: Test, options: LimiterOptions): Promise<Limiter> {
  const made = createLimiter({ redis: await sharedRedis(t), timeout: 1000, ...options })
  t.teardown(() => made.close())
  return made
}

t.test('without keySecret, two limiters on one Redis share one random secret, so every bucket', async (t) => {
  const prefix = uniquePrefix()
  const [logA, logB] = [lines(), lines()]
  const a = await limiter(t, { prefix, logger: logA })
  const b = await limiter(t, { prefix, logger: logB })
  // No `ready`: the first calls read (here: create) the secret, one read for both.
  const first = await Promise.all([a.consume('alice', login), a.consume('x}{evil', login)])
  t.same(first.map((d) => [d.source, d.remaining]), [['store', 2], ['store', 2]])
  t.match((await b.consume('alice', login)), { source: 'store', remaining: 1 }, 'B spends from the bucket A spent from')
  t.match((await b.consume('x}{evil', login)), { source: 'store', remaining: 1 }, 'a hostile id too')
  const admin = await sharedRedis(t)
  t.match(await admin.get(secretKey(prefix)), /^[A-Za-z0-9_-]{43}$/, 'a random secret of 32 bytes, in base64url')
  t.equal(await admin.ttl(secretKey(prefix)), -1, 'which never expires')
  const key = await fleetKey(admin, prefix, 'alice', 'login')
  t.match(key, new RegExp(`^${prefix}:\\{[A-Za-z0-9_-]{8}\\}alice:login$`), 'the key: prefix, tag, the id kept, bucket')
  t.equal(await admin.exists(key), 1)
  t.same(await keysUnder(admin, prefix), [`${prefix}:{${clientId('x}{evil')}}:login`, `${prefix}:{alice}:login`], 'and nothing else')
  t.same([logA.lines, logB.lines], [[], []], 'A created it and B read it, quietly')
  await b.reset('alice', 'login')
  t.match(await a.consume('alice', login), { source: 'store', remaining: 2 }, 'a reset on B reaches the bucket A uses')
})

t.test('keySecret: keys named without Redis, alike on every server that sets it; a server that differs is reported at start-up', async (t) => {
  const prefix = uniquePrefix()
  const logs = [lines(), lines(), lines(), lines()]
  const a = await limiter(t, { prefix, keySecret: SECRET, logger: logs[0] })
  await a.ready
  t.match(await a.consume('alice', login), { source: 'store', remaining: 2 })
  const admin = await sharedRedis(t)
  t.equal(await admin.exists(keyUnder(SECRET, prefix, 'alice', 'login')), 1, 'the key under keySecret')
  t.equal(await admin.exists(secretKey(prefix)), 0, 'no random secret was made')
  const same = await limiter(t, { prefix, keySecret: SECRET, logger: logs[1] })
  await same.ready
  t.match(await same.consume('alice', login), { source: 'store', remaining: 1 }, 'a server with the same keySecret shares the bucket')
  const other = await limiter(t, { prefix, keySecret: `${SECRET}, but another`, logger: logs[2] })
  await other.ready
  const none = await limiter(t, { prefix, logger: logs[3] })
  await none.ready
  t.same([logs[0], logs[1]].map((l) => l?.lines), [[], []], 'the same secret: nothing to say')
  t.match(logs[2]?.lines, [{ level: 'error', msg: /^keySecret differs from the one another server of this fleet set .*their buckets are split/ }])
  t.match(logs[3]?.lines, [{ level: 'error', msg: /^another server of this fleet sets keySecret .*; this one does not: their buckets are split/ }])
  t.equal(logs[3]?.lines.length, 1)
  // Now a random secret exists: a server that sets keySecret hears of the servers without it.
  const late = lines()
  await (await limiter(t, { prefix, keySecret: SECRET, logger: late })).ready
  t.match(late.lines, [{ level: 'error', msg: /^servers of this fleet without keySecret use the random secret at .*their buckets are split until every server sets the same keySecret/ }])
})

t.test('the in-process store names keys without Redis, with keySecret or without', async (t) => {
  for (const options of [{}, { keySecret: SECRET }]) {
    const alone = createLimiter(options)
    t.teardown(() => alone.close())
    await alone.ready
    t.match(await alone.consume('alice', login), { source: 'store', remaining: 2 })
    t.match(await alone.consume('bob', login), { source: 'store', remaining: 2 }, 'another client, another bucket')
    await alone.reset('alice', 'login')
    t.match(await alone.consume('alice', login), { source: 'store', remaining: 2 }, 'reset')
  }
})

t.test('Redis unreachable at start-up, no keySecret: failure modes apply until the secret is read, then Redis decides', async (t) => {
  const port = await freePort()
  const redis = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => 50 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const log = lines()
  const prefix = uniquePrefix()
  const made = createLimiter({ redis, prefix, timeout: 200, logger: log, breaker: { failures: 100, cooldownMs: 10 } })
  t.teardown(() => made.close())
  await made.ready
  const local: Policy = { ...login, bucket: 'local', failureMode: 'local', local: { capacity: 2, refillPerSecond: 0.001 } }
  t.match(await made.consume('alice', { ...login, failureMode: 'open' }), { source: 'fail-open', allowed: true })
  t.match(await made.consume('alice', login), { source: 'fail-closed', allowed: false })
  t.match(await made.consume('alice', local), { source: 'local', allowed: true, remaining: 1 }, 'the in-process fallback decides')
  t.match(await made.consume('alice', local), { source: 'local', allowed: true, remaining: 0 })
  t.match(await made.consume('alice', local), { source: 'local', allowed: false }, 'and keeps its count')
  t.match((await made.reserve('alice', login)).decision, { source: 'fail-closed' }, 'nor does a reservation')
  await t.rejects(made.reset('alice', 'login'), { code: 'TOLLGATE_STORE_DOWN' }, 'a reset cannot reach Redis')
  t.equal(made.state, 'failing')
  t.match(log.lines[0], { level: 'warn', msg: /failing/ }, 'one line says the store fails')

  const server = await startRedisServer({ port })
  t.teardown(() => server.stop())
  let decision = await made.consume('alice', login)
  for (let i = 0; i < 100 && decision.source !== 'store'; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    decision = await made.consume('alice', login)
  }
  t.match(decision, { source: 'store', allowed: true, remaining: 2 }, 'Redis decides once it answers')
  const admin = new Redis(server.url)
  t.teardown(() => admin.disconnect())
  t.equal(await admin.exists(await fleetKey(admin, prefix, 'alice', 'login')), 1, 'under the secret it created')
  t.equal(made.state, 'healthy')
})
