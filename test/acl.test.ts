// A Redis that runs the scripts but refuses a command inside them: an ACL
// user without TIME (a least-privilege user granted @read @write
// @scripting, TIME being only in @fast; or +@all -time), a read-only
// scripting user (+@read +@scripting: no TIME, no PSETEX, no DEL), keys
// outside the user's patterns, or a read-only replica (READONLY on the
// first write). Every decision fails there, so the store is down for the
// limiter (docs/guides/failure-modes.md): one start-up line names what is
// refused and the fix, the breaker opens, the state says 'failing', and
// 150 requests log nothing more. Read as a live Redis's answer instead, the
// first three logged one line per request (150) and stayed 'healthy'.
//
// Real redis-server processes and real ACL users, through the core and
// through the Fastify plugin. The deadline is 1000 ms, far above any
// scheduling noise: the errors here are answers, not timeouts.

import Fastify from 'fastify'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import tollgate, { createLimiter } from '../lib/index.js'
import type { Logger } from '../lib/core/types.js'
import { captureLogs, uniquePrefix } from './helpers/app.js'
import { redisCommand, startRedisServer } from './helpers/redis.js'

const REQUESTS = 150
const POLICY = { bucket: 'acl', capacity: 1000, refillPerSecond: 1, failureMode: 'open' } as const

interface Case {
  name: string
  /** The ACL user's rules; undefined: the default user on a read-only replica. */
  rules?: string[]
  /** What the start-up line must say. */
  says: RegExp
}

/** Every key and channel: the cases below differ in their commands only. */
const ANYWHERE = ['~*', '&*']

const CASES: Case[] = [
  { name: 'least privilege: +@read +@write +@scripting (TIME is only in @fast)', rules: [...ANYWHERE, '+@read', '+@write', '+@scripting'], says: /\(TIME refused; .*\): grant \+time to/ },
  { name: '+@all -time', rules: [...ANYWHERE, '+@all', '-time'], says: /\(TIME refused; .*\): grant \+time to/ },
  { name: 'read-only scripting: +@read +@scripting', rules: [...ANYWHERE, '+@read', '+@scripting'], says: /\(TIME, PSETEX, SET, DEL, ZADD, PEXPIRE, ZREMRANGEBYSCORE, ZREM refused; .*\): grant \+time \+psetex \+set \+del \+zadd \+pexpire \+zremrangebyscore \+zrem to/ },
  { name: 'keys outside the ACL: +@all ~other:*', rules: ['~other:*', '&*', '+@all'], says: /\(NOPERM .*keys.*\): grant this Redis user the keys under tollgate's prefix/ },
  { name: 'a read-only replica', says: /\(PSETEX, SET, DEL, ZADD, PEXPIRE, ZREMRANGEBYSCORE, ZREM refused; READONLY .*\): the scripts write their buckets, so point the client at a writable primary/ }
]

/** A subscriber without @pubsub is told of once, on its own (lib/core/invalidation.ts); it is not the store's line. */
const SUBSCRIBE = /could not subscribe/

const servers = new Map<string, { url: string, port: number }>()

/** One server of each kind for the whole file, stopped at its end. */
async function server (name: string, args: string[] = []): Promise<{ url: string, port: number }> {
  const known = servers.get(name)
  if (known !== undefined) return known
  const started = await startRedisServer({ args })
  t.teardown(() => started.stop())
  servers.set(name, started)
  return started
}

/** An ioredis client for `c`: its own ACL user on the primary, or the replica's default user. */
async function clientFor (t: Test, c: Case): Promise<Redis> {
  const primary = await server('primary')
  let redis: Redis
  if (c.rules === undefined) {
    const replica = await server('replica', ['--replicaof', '127.0.0.1', String(primary.port)])
    redis = new Redis(replica.url, { maxRetriesPerRequest: 1 })
  } else {
    const user = `u${uniquePrefix().slice(2)}`
    await redisCommand({ port: primary.port }, ['ACL', 'SETUSER', user, 'on', '>pw', ...c.rules])
    redis = new Redis(primary.url, { username: user, password: 'pw', maxRetriesPerRequest: 1 })
  }
  t.teardown(() => redis.disconnect())
  return redis
}

interface Line { level: number, msg: string }

function keeper (): Logger & { lines: Line[] } {
  const lines: Line[] = []
  const at = (level: number) => (_obj: object, msg: string): void => { lines.push({ level, msg }) }
  return { lines, info: at(30), warn: at(40), error: at(50) }
}

function checkLines (t: Test, c: Case, atStart: readonly Line[], all: readonly Line[]): void {
  const own = all.filter((l) => !SUBSCRIBE.test(l.msg))
  t.equal(own.length, 1, `one line for ${REQUESTS} requests`)
  const first = atStart.filter((l) => !SUBSCRIBE.test(l.msg))
  t.equal(first.length, 1, 'logged at start-up')
  t.match(first[0], { level: 50, msg: /^rate limit store refuses commands inside tollgate's scripts/ }, 'at error level')
  t.match(first[0]?.msg, c.says, 'naming what is refused and the fix')
  t.match(first[0]?.msg, /limits follow their failure modes/)
  t.ok(all.length <= 2, `at most the subscriber's line besides (${all.length} in all)`)
}

t.test('through the core', async (root) => {
  for (const c of CASES) {
    await root.test(c.name, async (t) => {
      const logger = keeper()
      const limiter = createLimiter({ redis: await clientFor(t, c), prefix: uniquePrefix(), timeout: 1000, logger })
      t.teardown(() => limiter.close())
      await limiter.ready
      const atStart = [...logger.lines]
      const sources = new Set<string>()
      // In bursts of 10, which the store sends as batches (lua/token-bucket-batch.lua).
      for (let i = 0; i < REQUESTS; i += 10) {
        const burst = await Promise.all(Array.from({ length: 10 }, async (_, j) => await limiter.consume(`client${j}`, POLICY)))
        for (const decision of burst) sources.add(decision.source)
      }
      t.same([...sources], ['fail-open'], `all ${REQUESTS} decisions follow failureMode 'open'`)
      t.equal(limiter.state, 'failing', "the state is not 'healthy'")
      checkLines(t, c, atStart, logger.lines)
    })
  }
})

t.test('through the Fastify plugin', async (root) => {
  for (const c of CASES) {
    await root.test(c.name, async (t) => {
      const logs = captureLogs()
      const app = Fastify({ logger: { level: 'info', stream: logs.stream } })
      t.teardown(() => app.close())
      await app.register(tollgate, { redis: await clientFor(t, c), prefix: uniquePrefix(), ...POLICY, timeout: 1000 })
      app.get('/', async () => 'ok')
      await app.ready()
      const loud = (): Line[] => logs.lines.filter((l) => (l.level as number) >= 40).map((l) => ({ level: l.level as number, msg: String(l.msg) }))
      const atStart = loud()
      const limited = new Set<unknown>()
      for (let i = 0; i < REQUESTS; i++) {
        const res = await app.inject('/')
        limited.add(`${res.statusCode} ${String(res.headers['ratelimit-limit'])}`)
      }
      t.same([...limited], ['200 undefined'], `all ${REQUESTS} requests follow failureMode 'open'`)
      t.equal(app.tollgate.limiter.state, 'failing', "the state is not 'healthy'")
      checkLines(t, c, atStart, loud())
    })
  }
})

t.test('a command refused after start-up: one error line naming the fix, the breaker opens, and it recovers', async (t) => {
  const primary = await server('primary')
  const user = `u${uniquePrefix().slice(2)}`
  await redisCommand({ port: primary.port }, ['ACL', 'SETUSER', user, 'on', '>pw', ...ANYWHERE, '+@all'])
  const redis = new Redis(primary.url, { username: user, password: 'pw', maxRetriesPerRequest: 1 })
  t.teardown(() => redis.disconnect())
  const logger = keeper()
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000, logger, breaker: { failures: 5, cooldownMs: 200 } })
  t.teardown(() => limiter.close())
  await limiter.ready
  t.equal((await limiter.consume('client', POLICY)).source, 'store', 'decided by Redis')
  await redisCommand({ port: primary.port }, ['ACL', 'SETUSER', user, '-time'])
  const sources = new Set<string>()
  for (let i = 0; i < REQUESTS; i++) sources.add((await limiter.consume('client', POLICY)).source)
  t.same([...sources], ['fail-open'], `all ${REQUESTS} decisions follow failureMode 'open'`)
  t.equal(limiter.state, 'failing')
  t.same(logger.lines.map((l) => l.level), [50], `one line for ${REQUESTS} requests`)
  // Redis before 7.2 does not name the command: the line names every one the scripts run.
  t.match(logger.lines[0]?.msg, /^rate limit store refuses commands inside tollgate's scripts \((?:ERR|NOPERM) .*\): grant .*\+time.* to tollgate's Redis user/)
  await redisCommand({ port: primary.port }, ['ACL', 'SETUSER', user, '+time'])
  let source = ''
  const until = performance.now() + 5000
  while (source !== 'store' && performance.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    source = (await limiter.consume('client', POLICY)).source
  }
  t.equal(source, 'store', 'the breaker lets a probe through once the cool-down is over, and Redis decides again')
  t.equal(limiter.state, 'healthy')
  t.match(logger.lines.map((l) => l.msg), [/refuses commands/, /^rate limit store recovered/])
})
