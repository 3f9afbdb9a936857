// A Redis that cannot run the scripts (EVALSHA or EVAL renamed away,
// scripting refused to the user by an ACL, a Valkey without its Lua
// engine) answers every call with an error: it is up, but it decides
// nothing. It is treated as a store that is down: its failure modes apply,
// the breaker opens, the start-up says so once at error level naming the
// cause, and the outage summary covers it, never a line per request.
//
// Real redis-server processes, started with `--rename-command` arguments
// or given an ACL user without @scripting; lines counted as pino writes
// them. The deadline is 1000 ms, far above any scheduling noise: the
// errors here are answers, not timeouts.

import diagnostics from 'node:diagnostics_channel'
import Fastify from 'fastify'
import { Redis, type RedisOptions } from 'ioredis'
import t, { type Test } from 'tap'
import tollgate from '../lib/index.js'
import { RedisStore } from '../lib/store/redis-store.js'
import { captureLogs, uniquePrefix } from './helpers/app.js'
import { redisCommand, redisUrl, startRedisServer } from './helpers/redis.js'

const REQUESTS = 30

async function server (t: Test, args: string[]): Promise<{ url: string, port: number }> {
  const started = await startRedisServer({ args })
  t.teardown(() => started.stop())
  return started
}

/** The breaker's changes while `t` runs. */
function breakerStates (t: Test): string[] {
  const states: string[] = []
  const listener = (message: unknown): void => { states.push((message as { state: string }).state) }
  diagnostics.subscribe('tollgate:breaker', listener)
  t.teardown(() => diagnostics.unsubscribe('tollgate:breaker', listener))
  return states
}

/** REQUESTS requests to a Fastify app on `redis` with failureMode 'open'; what it logged and answered. */
async function run (t: Test, redis: Redis) {
  const logs = captureLogs()
  const app = Fastify({ logger: { level: 'info', stream: logs.stream } })
  t.teardown(() => app.close())
  const states = breakerStates(t)
  await app.register(tollgate, { redis, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.001, failureMode: 'open', timeout: 1000 })
  app.get('/', async () => 'ok')
  await app.ready()
  const atStart = logs.lines.filter((l) => (l.level as number) >= 40)
  const sources = new Map<string, number>()
  for (let i = 0; i < REQUESTS; i++) {
    const res = await app.inject('/')
    const source = res.statusCode === 200 && res.headers['ratelimit-limit'] === undefined ? 'fail-open' : String(res.statusCode)
    sources.set(source, (sources.get(source) ?? 0) + 1)
  }
  return { atStart, all: logs.lines.filter((l) => (l.level as number) >= 40), errors: logs.lines.filter((l) => l.level === 50), sources, states, limiter: app.tollgate.limiter }
}

function client (t: Test, url: string, options: RedisOptions = {}): Redis {
  const redis = new Redis(url, { ...options, maxRetriesPerRequest: 1 })
  t.teardown(() => redis.disconnect())
  return redis
}

function checkDown (t: Test, result: Awaited<ReturnType<typeof run>>, cause: RegExp): void {
  t.equal(result.atStart.length, 1, 'one line at start-up')
  t.match(result.atStart[0], { level: 50, msg: /^rate limit store cannot run tollgate's scripts \(/ }, 'at error level')
  t.match(String(result.atStart[0]?.msg), cause, 'naming the cause')
  t.match(String(result.atStart[0]?.msg), /limits follow their failure modes/)
  t.same(Object.fromEntries(result.sources), { 'fail-open': REQUESTS }, `all ${REQUESTS} requests follow failureMode 'open'`)
  t.equal(result.all.length, 1, `and nothing more is logged for ${REQUESTS} requests (the summary comes after 30 s)`)
  t.equal(result.errors.length, 1, 'one error line in all')
  t.equal(result.states[0], 'open', 'the breaker opens')
  t.equal(result.limiter.state, 'failing')
}

t.test('EVALSHA renamed away', async (t) => {
  const { url } = await server(t, ['--rename-command', 'EVALSHA', ''])
  const result = await run(t, client(t, url))
  checkDown(t, result, /ERR unknown command 'evalsha'/)
})

t.test('EVAL, EVALSHA and SCRIPT renamed away', async (t) => {
  const { url } = await server(t, ['--rename-command', 'EVALSHA', '', '--rename-command', 'EVAL', '', '--rename-command', 'SCRIPT', ''])
  const result = await run(t, client(t, url))
  checkDown(t, result, /ERR unknown command 'evalsha'/)
})

t.test('an ACL user denied @scripting', async (t) => {
  const { url, port } = await server(t, [])
  await redisCommand({ port }, ['ACL', 'SETUSER', 'app', 'on', '>app-password', '~*', '&*', '+@all', '-@scripting'])
  const result = await run(t, client(t, url, { username: 'app', password: 'app-password' }))
  checkDown(t, result, /NOPERM .*'(?:script\|load|evalsha)'/)
  t.notMatch(JSON.stringify(result.all), /app-password/, 'never the password')
})

t.test('scripting refused after start-up: one error line when it starts, then the breaker', async (t) => {
  const { url, port } = await server(t, [])
  await redisCommand({ port }, ['ACL', 'SETUSER', 'app', 'on', '>pw', '~*', '&*', '+@all'])
  const logs = captureLogs()
  const app = Fastify({ logger: { level: 'info', stream: logs.stream } })
  t.teardown(() => app.close())
  const states = breakerStates(t)
  await app.register(tollgate, { redis: client(t, url, { username: 'app', password: 'pw' }), prefix: uniquePrefix(), capacity: 100, refillPerSecond: 1, failureMode: 'open', timeout: 1000 })
  app.get('/', async () => 'ok')
  t.equal((await app.inject('/')).headers['ratelimit-remaining'], '99', 'decided by Redis')
  await redisCommand({ port }, ['ACL', 'SETUSER', 'app', '-@scripting'])
  const limited: unknown[] = []
  for (let i = 0; i < REQUESTS; i++) limited.push((await app.inject('/')).headers['ratelimit-limit'])
  t.same([...new Set(limited)], [undefined], "every request follows failureMode 'open'")
  const loud = logs.lines.filter((l) => (l.level as number) >= 40)
  t.same(loud.map((l) => [l.level, String(l.msg).replace(/\(.*\)/, '(…)')]), [
    [50, "rate limit store cannot run tollgate's scripts (…): scripting is renamed, refused to this user by an ACL, or the server has no Lua engine; limits follow their failure modes until it can"]
  ], `one line for ${REQUESTS} requests`)
  t.equal(states[0], 'open', 'the breaker opens')
})

t.test('a warm-up that fails for another reason is left to the failure modes', async (t) => {
  const redis = new Redis(await redisUrl(t))
  t.teardown(() => redis.quit())
  const key = `${uniquePrefix()}:warm`
  await redis.hset(key, 'not', 'a bucket')
  t.teardown(() => redis.del(key))
  t.equal(await new RedisStore(redis).warm(key), undefined, 'WRONGTYPE: Redis runs the scripts')
  const idle = new Redis(await redisUrl(t), { lazyConnect: true, enableOfflineQueue: false })
  t.teardown(() => idle.disconnect())
  t.equal(await new RedisStore(idle).warm(key), undefined, 'not connected yet: nothing is known of the scripts')
  const { url } = await server(t, ['--rename-command', 'EVALSHA', ''])
  const refused = await new RedisStore(client(t, url)).warm(key)
  t.match(refused, { code: 'TOLLGATE_STORE_ERROR', message: /^store call failed: ERR unknown command 'evalsha'/ })
})
