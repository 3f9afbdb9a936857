// The breaker of lib/core/guard.ts on its own: its timing on a fake monotonic
// clock (no sleeps), its indifference to the wall clock, and which errors
// count as Redis failing. Store calls go to the shared test Redis; a
// failing call is one whose promise rejects the way a lost connection does.

import diagnostics from 'node:diagnostics_channel'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { realTime } from '../lib/core/clock.js'
import { Guard } from '../lib/core/guard.js'
import { RedisStore } from '../lib/store/redis-store.js'
import type { BucketSpec } from '../lib/store/store.js'
import type { Logger } from '../lib/core/types.js'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import type { TeardownTarget } from './helpers/redis.js'

interface Line { level: 'warn' | 'info' | 'error', obj: Record<string, unknown>, msg: string }

function logger (): { logger: Logger, lines: Line[] } {
  const lines: Line[] = []
  const at = (level: Line['level']) => (obj: object, msg: string): void => { lines.push({ level, obj: obj as Record<string, unknown>, msg }) }
  return { lines, logger: { warn: at('warn'), info: at('info'), error: at('error') } }
}

function watchBreaker (t: TeardownTarget): string[] {
  const states: string[] = []
  const listener = (message: unknown): void => { states.push((message as { state: string }).state) }
  diagnostics.subscribe('tollgate:breaker', listener)
  t.teardown(() => diagnostics.unsubscribe('tollgate:breaker', listener))
  return states
}

function spec (): BucketSpec {
  return { key: `${uniquePrefix()}:{c}:b`, capacity: 10, refillPerSecond: 1, cost: 1 }
}

/** A call that fails the way a dropped connection does. */
const lost = (): Promise<never> => Promise.reject(new Error('Connection is closed.'))

t.test('cool-down, probe and recovery follow the injected clock', async (t) => {
  const redis = await sharedRedis(t)
  let now = 5000
  const { logger: log, lines } = logger()
  const guard = new Guard(new RedisStore(redis), { failures: 3, cooldownMs: 1000 }, log, { ...realTime, now: () => now })
  const states = watchBreaker(t)
  const specs = [spec()]
  let pings = 0
  const ping = (): Promise<string> => { pings++; return redis.ping() }

  for (let i = 0; i < 3; i++) await t.rejects(guard.run(lost, 1000, specs), { code: 'TOLLGATE_STORE_ERROR' })
  t.same(states, ['open'], 'three failures open the breaker')
  t.equal(guard.state, 'failing')
  t.equal(guard.cooldownLeftMs, 1000)
  guard.fellBack('fail-open')
  guard.fellBack('local')

  now += 999
  await t.rejects(guard.run(ping, 1000, specs), { code: 'TOLLGATE_BREAKER_OPEN' }, '1 ms before the end of the cool-down: skipped')
  t.equal(guard.decide(specs, true, 1000, () => 'store', () => 'fallback') instanceof Promise, true)
  t.equal(await guard.decide(specs, true, 1000, () => 'store', () => 'fallback'), 'fallback', 'a decision falls back at once')
  t.equal(pings, 0, 'nothing reached Redis')
  t.equal(guard.cooldownLeftMs, 1)

  now += 1
  let failProbe: (err: Error) => void = () => {}
  const probe = guard.run(() => new Promise<never>((_resolve, reject) => { failProbe = reject }), 1000, specs)
  t.same(states, ['open', 'half-open'], 'at the end of the cool-down one probe goes through')
  await t.rejects(guard.run(ping, 1000, specs), { code: 'TOLLGATE_BREAKER_OPEN' }, 'only one: the next call is skipped')
  failProbe(new Error('Connection is closed.'))
  await t.rejects(probe, { code: 'TOLLGATE_STORE_ERROR' })
  t.same(states, ['open', 'half-open', 'open'], 'the failed probe opens it again')
  t.equal(guard.cooldownLeftMs, 1000, 'for a whole cool-down from the probe\'s failure')

  now += 1000
  t.equal(await guard.run(ping, 1000, specs), 'PONG', 'the next probe reaches Redis')
  t.same(states, ['open', 'half-open', 'open', 'half-open', 'closed'], 'and closes the breaker')
  t.equal(guard.state, 'healthy')
  t.equal(guard.cooldownLeftMs, 0)
  t.same(lines.map((l) => `${l.level} ${l.msg}`), [
    'warn rate limit store failing; limits follow their failure modes',
    'info rate limit store recovered'
  ])
  t.same(lines[1]?.obj, { downMs: 2000, decisions: { local: 1, 'fail-open': 1, 'fail-closed': 0 } }, 'the outage lasted 2000 ms of the clock')
})

t.test('deadlines follow the injected clock too', async (t) => {
  const redis = await sharedRedis(t)
  let now = 0
  const guard = new Guard(new RedisStore(redis), { failures: 5, cooldownMs: 1000 }, undefined, { ...realTime, now: () => now })
  // Redis is alive and keeps the process running; the call never settles.
  const alive = setInterval(() => {}, 1000)
  t.teardown(() => clearInterval(alive))
  let expired = false
  let lateFailure: (err: Error) => void = () => {}
  const call = guard.run(() => new Promise<never>((_resolve, reject) => { lateFailure = reject }), 20, [spec()])
  call.catch(() => { expired = true })
  await sleep(60)
  t.notOk(expired, 'three times the deadline in real time, none on the clock: still waiting')
  now = 20
  await t.rejects(call, { code: 'TOLLGATE_STORE_TIMEOUT', message: 'store gave no answer within 20 ms' }, 'expires once the clock says so')
  lateFailure(new Error('Connection is closed.'))
  await sleep(10)
  t.equal(guard.state, 'failing', 'a late failure changes nothing: the timeout already counted')
})

t.test('a step of the wall clock neither prolongs nor cuts a cool-down', async (t) => {
  const redis = await sharedRedis(t)
  const guard = new Guard(new RedisStore(redis), { failures: 1, cooldownMs: 100 }, undefined)
  const specs = [spec()]
  const realNow = Date.now
  t.teardown(() => { Date.now = realNow })

  await t.rejects(guard.run(lost, 1000, specs), { code: 'TOLLGATE_STORE_ERROR' })
  Date.now = () => realNow() - 3_600_000
  await sleep(150)
  t.equal(await guard.run(() => redis.ping(), 1000, specs), 'PONG', 'wall clock stepped back 1 h: the probe still comes after 100 ms')
  t.equal(guard.state, 'healthy')

  Date.now = realNow
  await t.rejects(guard.run(lost, 1000, specs), { code: 'TOLLGATE_STORE_ERROR' })
  Date.now = () => realNow() + 3_600_000
  await t.rejects(guard.run(() => redis.ping(), 1000, specs), { code: 'TOLLGATE_BREAKER_OPEN' }, 'wall clock stepped forward 1 h: still open')
})

t.test('a call that throws instead of rejecting is a store failure', async (t) => {
  const redis = await sharedRedis(t)
  const guard = new Guard(new RedisStore(redis), { failures: 1, cooldownMs: 1000 }, undefined)
  await t.rejects(guard.run(() => { throw new Error('boom') }, 1000, [spec()]), { code: 'TOLLGATE_STORE_ERROR', message: 'store call failed: boom' })
  t.equal(guard.state, 'failing')
})

t.test('a script error on one route does not open the breaker for another', async (t) => {
  const redis = await sharedRedis(t)
  const store = new RedisStore(redis)
  const { logger: log, lines } = logger()
  // The defaults: five failures open the breaker.
  const guard = new Guard(store, { failures: 5, cooldownMs: 60_000 }, log)
  const states = watchBreaker(t)
  // A cost the script cannot compute with: Redis runs the script, which fails.
  const bad: BucketSpec = { ...spec(), cost: 'many' as never }
  const good = [spec()]
  for (let i = 0; i < 7; i++) {
    await t.rejects(guard.run(() => store.decide([bad], true), 1000, [bad]), { code: 'TOLLGATE_STORE_ERROR', message: /script/ }, `bad call ${i + 1} fails`)
  }
  const reply = await guard.run(() => store.decide(good, true), 1000, good)
  t.equal(reply.allowed && Math.floor(reply.buckets[0]?.remaining ?? -1), 9, 'a \'closed\' route\'s next call is decided by Redis')
  t.same(states, [], 'the breaker never opened')
  t.equal(guard.state, 'healthy')
  t.equal(lines.length, 7, 'one line per refused call')
  t.same(lines.filter((l) => l.level !== 'error' || l.msg !== 'rate limit store refused the call'), [], 'at error level')
  t.same(lines[0]?.obj.keys, [bad.key], 'with the keys')

  // The same through decide(): the call falls back, the breaker stays closed.
  for (let i = 0; i < 7; i++) t.equal(await guard.decide([bad], true, 1000, () => 'store', () => 'fallback'), 'fallback')
  t.equal(await guard.decide(good, true, 1000, (r) => Math.floor(r.buckets[0]?.remaining ?? -1), () => -1), 8, 'and Redis keeps deciding the good route')
  t.same(states, [])
})

t.test("a resharding's refusals (TRYAGAIN, ASK, MOVED) fail the call alone, unlogged, and never open the breaker", async (t) => {
  const redis = await sharedRedis(t)
  const specs = [spec()]
  const reply = (message: string) => () => redis.eval('return redis.error_reply(ARGV[1])', 0, message)
  const states = watchBreaker(t)
  for (const message of ['TRYAGAIN Multiple keys request during rehashing of slot', 'ASK 3999 127.0.0.1:6381', 'MOVED 3999 127.0.0.1:6381']) {
    const { logger: log, lines } = logger()
    const guard = new Guard(new RedisStore(redis), { failures: 1, cooldownMs: 60_000 }, log)
    for (let i = 0; i < 3; i++) await t.rejects(guard.run(reply(message), 1000, specs), { code: 'TOLLGATE_STORE_ERROR' })
    t.equal(guard.state, 'healthy', `${message.split(' ')[0] ?? ''}: the store is not failing`)
    t.same(lines, [], 'nothing logged')
    t.equal(await guard.decide(specs, false, 1000, () => 'store', () => 'fallback'), 'store', 'the next call reaches Redis')
  }
  t.same(states, [], 'the breaker never opened')
})

t.test('reply errors that mean Redis cannot serve count as failures', async (t) => {
  const redis = await sharedRedis(t)
  const specs = [spec()]
  const reply = (message: string) => () => redis.eval('return redis.error_reply(ARGV[1])', 0, message)
  for (const code of ['LOADING', 'BUSY', 'MASTERDOWN', 'CLUSTERDOWN', 'READONLY', 'MISCONF', 'OOM', 'NOREPLICAS', 'NOAUTH', 'NOPERM']) {
    const guard = new Guard(new RedisStore(redis), { failures: 1, cooldownMs: 60_000 }, undefined)
    await t.rejects(guard.run(reply(`${code} the server says no`), 1000, specs), { code: 'TOLLGATE_STORE_ERROR' })
    t.equal(guard.state, 'failing', `${code}: the store is failing`)
  }
  // A server that cannot run the scripts at all (renamed, refused by an
  // ACL, no Lua engine, as Valkey without its Lua module answers) is up but
  // decides nothing: failing too.
  for (const message of ["ERR unknown command 'evalsha', with args beginning with: ", "NOPERM User app has no permissions to run the 'evalsha' command", "ERR Could not find scripting engine 'lua'"]) {
    const guard = new Guard(new RedisStore(redis), { failures: 1, cooldownMs: 60_000 }, undefined)
    await t.rejects(guard.run(reply(message), 1000, specs), { code: 'TOLLGATE_STORE_ERROR' })
    t.equal(guard.state, 'failing', `${message}: the store is failing`)
  }
  for (const message of ['ERR value is not an integer or out of range', 'WRONGTYPE Operation against a key holding the wrong kind of value', 'BUSYKEY Target key name already exists.']) {
    const guard = new Guard(new RedisStore(redis), { failures: 1, cooldownMs: 60_000 }, undefined)
    await t.rejects(guard.run(reply(message), 1000, specs), { code: 'TOLLGATE_STORE_ERROR' })
    t.equal(guard.state, 'healthy', `${message.split(' ')[0] ?? ''}: only that call failed`)
  }
})
