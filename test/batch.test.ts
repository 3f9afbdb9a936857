// The store's batches (lib/store/redis-store.ts): the plain decisions asked
// in one turn of the event loop go to Redis as one call of
// lua/token-bucket-batch.lua (at most `batch.maxDecisions` each), decided
// in the order they were asked; a decision alone goes as one call of
// lua/token-bucket.lua. Counted with INFO commandstats on a Redis of the
// test's own. Then the failures: a batch Redis refused for its content
// (a key of another type) is decided again one decision a call, so only
// the faulty one fails; a batch the server refuses as a whole (OOM) fails
// each of its decisions, which fall back; a client that went away before
// the end of the turn fails them at once. The deadline of a batched
// decision counts from the batch being sent, not from the ask: a turn the
// app itself keeps busy is no lateness of Redis. Last, a race across two
// processes whose batches interleave in Redis: exactly the capacity passes.

import { spawn } from 'node:child_process'
import { once } from 'node:events'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import { createClient } from 'redis'
import t from 'tap'
import tollgate, { createLimiter, type Decision, type Logger, type Policy } from '../lib/index.js'
import { DEFAULT_BATCH_MAX, RedisStore, TOKEN_BUCKET, TOKEN_BUCKET_BATCH } from '../lib/store/redis-store.js'
import { uniquePrefix } from './helpers/app.js'
import { faultClient, ownServer } from './helpers/load.js'
import { scriptCalls } from './helpers/model.js'
import { fleetKey } from './helpers/keys.js'

const server = await ownServer(t)
const admin = new Redis(server.url)
t.teardown(() => admin.disconnect())

async function client (t: { teardown(fn: () => unknown): void }): Promise<Redis> {
  const redis = faultClient(t, server.url)
  await redis.ping()
  return redis
}

/** Script calls so far, from INFO commandstats, with both scripts loaded first (a NOSCRIPT would count twice). */
async function calls (): Promise<number> {
  for (const script of [TOKEN_BUCKET, TOKEN_BUCKET_BATCH]) await admin.script('LOAD', script.lua)
  return await scriptCalls(admin)
}

function logger (): { logger: Logger, lines: Array<{ level: string, msg: string }> } {
  const lines: Array<{ level: string, msg: string }> = []
  const at = (level: string) => (_obj: object, msg: string): void => { lines.push({ level, msg }) }
  return { logger: { warn: at('warn'), info: at('info'), error: at('error') }, lines }
}

const POLICY: Policy = { bucket: 'b', capacity: 50, refillPerSecond: 1e-6, failureMode: 'closed' }
// The deadline of the limiters whose tests count calls and read decisions,
// not deadlines: a loaded run can keep Redis from answering within the
// default 10 ms, and a decision that fell back would fail them for nothing.
const SLACK_MS = 1000

t.test('the decisions of one turn are one call, in the order asked; a decision alone is one call too', async (t) => {
  const redis = await client(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), denialCache: false, timeout: SLACK_MS })
  await limiter.consume('warm', POLICY)
  let before = await calls()
  const decisions = await Promise.all(Array.from({ length: 60 }, () => limiter.consume('c', POLICY)))
  t.equal(await calls() - before, 1, '60 decisions of one turn: one call')
  t.same(decisions.map((d) => d.allowed), Array.from({ length: 60 }, (_, i) => i < 50), 'the first 50 asked pass, the 10 after them do not')
  t.same(decisions.slice(0, 50).map((d) => d.remaining), Array.from({ length: 50 }, (_, i) => 49 - i), 'each sees the spend of those before it')
  t.same(new Set(decisions.map((d) => d.source)), new Set(['store']))

  before = await calls()
  const one = await limiter.consume('d', POLICY)
  t.equal(await calls() - before, 1, 'a decision alone: one call')
  t.match(one, { allowed: true, remaining: 49, source: 'store' })

  before = await calls()
  const mixed = await Promise.all([
    limiter.consume('e', [POLICY, { ...POLICY, bucket: 'b2', capacity: 2 }]),
    limiter.peek('e', POLICY),
    limiter.consume('e', { ...POLICY, bucket: 'b2', capacity: 2 }, 2),
    limiter.consume('f', POLICY, 50)
  ])
  t.equal(await calls() - before, 1, 'several policies, peeks and costs: one call')
  t.match(mixed, [{ allowed: true, remaining: 1 }, { allowed: true, remaining: 49 }, { allowed: false, remaining: 1 }, { allowed: true, remaining: 0 }])
  await limiter.close()
})

t.test('batches hold at most maxDecisions; several go out in one turn', async (t) => {
  const redis = await client(t)
  t.equal(DEFAULT_BATCH_MAX, 64)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), denialCache: false, batch: {}, timeout: SLACK_MS })
  await limiter.consume('warm', POLICY)
  let before = await calls()
  await Promise.all(Array.from({ length: 129 }, (_, i) => limiter.consume(`c${i % 7}`, POLICY)))
  t.equal(await calls() - before, 3, '129 decisions at the default 64: 64, 64 and one alone')
  await limiter.close()

  const small = createLimiter({ redis, prefix: uniquePrefix(), denialCache: false, batch: { maxDecisions: 10 }, timeout: SLACK_MS })
  await small.consume('warm', POLICY)
  before = await calls()
  const decisions = await Promise.all(Array.from({ length: 100 }, () => small.consume('c', POLICY)))
  t.equal(await calls() - before, 10, '100 decisions at 10 a call')
  t.equal(decisions.filter((d) => d.allowed).length, 50, 'exactly the capacity passes, across the calls')
  t.same(decisions.map((d) => d.allowed), Array.from({ length: 100 }, (_, i) => i < 50), 'in the order asked')
  await small.close()
})

t.test('batch: false sends each decision in a call of its own', async (t) => {
  const redis = await client(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), denialCache: false, batch: false, timeout: SLACK_MS })
  await limiter.consume('warm', POLICY)
  const before = await calls()
  const decisions = await Promise.all(Array.from({ length: 20 }, () => limiter.consume('c', POLICY)))
  t.equal(await calls() - before, 20, '20 calls')
  t.equal(decisions.filter((d) => d.allowed).length, 20)
  await limiter.close()
})

t.test('NOSCRIPT on a batch: one EVAL of its source, which loads it', async (t) => {
  const redis = await client(t)
  // A deadline far above the default's 10 ms: the EVAL compiles the script, and what is tested is the recovery.
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), denialCache: false, timeout: 1000 })
  await admin.script('FLUSH')
  const decisions = await Promise.all(Array.from({ length: 5 }, () => limiter.consume('c', POLICY)))
  t.same(decisions.map((d) => [d.allowed, d.remaining, d.source]), [[true, 49, 'store'], [true, 48, 'store'], [true, 47, 'store'], [true, 46, 'store'], [true, 45, 'store']])
  const before = await calls()
  await Promise.all(Array.from({ length: 5 }, () => limiter.consume('c', POLICY)))
  t.equal(await calls() - before, 1, 'loaded: the next batch is one EVALSHA')
  await limiter.close()
})

t.test('a batch refused for its content is decided again one decision a call: only the faulty one fails', async (t) => {
  const redis = await client(t)
  const prefix = uniquePrefix()
  const logs = logger()
  const limiter = createLimiter({ redis, prefix, denialCache: false, logger: logs.logger, timeout: SLACK_MS })
  await limiter.ready
  await admin.hset(await fleetKey(admin, prefix, 'bad', 'b'), 'field', '1')
  const before = await calls()
  const decisions = await Promise.all(['a', 'bad', 'a', 'c'].map((id) => limiter.consume(id, POLICY)))
  t.same(decisions.map((d) => [d.allowed, d.source, d.remaining]), [[true, 'store', 49], [false, 'fail-closed', 0], [true, 'store', 48], [true, 'store', 49]],
    'the others decided by Redis, in order; the faulty one falls back')
  t.equal(await calls() - before, 5, 'the batch, then each alone')
  t.same(logs.lines.filter((l) => l.level !== 'info'), [{ level: 'error', msg: 'rate limit key holds a value of the wrong type' }], 'one error line, for the faulty key')
  t.equal(limiter.state, 'healthy', 'Redis answered: the store is not failing')
  await limiter.close()
})

t.test('a batch the server refuses as a whole fails each decision, which falls back, and writes nothing', async (t) => {
  const redis = await client(t)
  const prefix = uniquePrefix()
  const limiter = createLimiter({ redis, prefix, denialCache: false, breaker: { failures: 100, cooldownMs: 1000 }, timeout: SLACK_MS })
  await limiter.consume('warm', POLICY)
  await admin.config('SET', 'maxmemory', '1')
  t.teardown(() => admin.config('SET', 'maxmemory', '0'))
  const open = { ...POLICY, failureMode: 'open' } as const
  const decisions = await Promise.all([limiter.consume('a', POLICY), limiter.consume('a', open), limiter.consume('b', POLICY)])
  t.same(decisions.map((d) => [d.allowed, d.source]), [[false, 'fail-closed'], [true, 'fail-open'], [false, 'fail-closed']])
  await admin.config('SET', 'maxmemory', '0')
  t.same(await admin.keys(`${prefix}:{*}a:*`), [], 'nothing was spent')
  const after = await Promise.all([limiter.consume('a', POLICY), limiter.consume('a', POLICY)])
  t.same(after.map((d) => [d.remaining, d.source]), [[49, 'store'], [48, 'store']], 'once served again, the bucket is whole')
  await limiter.close()
})

t.test('a client gone before the end of the turn fails the decisions at once', async (t) => {
  // node-redis's destroy() ends the client at once (ioredis's disconnect() only when the socket closes).
  const redis = createClient({ url: server.url })
  redis.on('error', () => {})
  await redis.connect()
  const store = new RedisStore(redis)
  const spec = { key: `${uniquePrefix()}:{c}:b`, capacity: 5, refillPerSecond: 1, cost: 1 }
  let sent = 0
  const asked = [store.decide([spec], true, () => { sent++ }), store.decide([spec], true)]
  redis.destroy()
  for (const call of asked) await t.rejects(call, { code: 'TOLLGATE_STORE_DOWN' })
  t.equal(sent, 0, 'nothing was sent')
})

t.test('a decision without a sent hook is batched too (the guard\'s run path)', async (t) => {
  const redis = await client(t)
  const store = new RedisStore(redis, { batch: { maxDecisions: 2 } })
  const spec = { key: `${uniquePrefix()}:{c}:b`, capacity: 5, refillPerSecond: 1, cost: 1 }
  const replies = await Promise.all([store.decide([spec], true), store.decide([spec], true), store.decide([spec], false)])
  t.same(replies.map((r) => r.allowed), [true, true, true])
  t.same(replies.map((r) => Math.round(r.buckets[0]?.remaining ?? NaN)), [4, 3, 3])
  const single = new RedisStore(redis, { batch: false })
  t.match(await single.decide([spec], true), { allowed: true }, 'and one call each without batching')
})

t.test('the deadline counts from the batch being sent: a turn the app keeps busy is not Redis being late', async (t) => {
  const redis = await client(t)
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 20, denialCache: false })
  await limiter.ready // both scripts loaded: no NOSCRIPT round trip inside a 20 ms deadline
  await limiter.consume('warm', POLICY)
  for (let round = 0; round < 5; round++) {
    const asked: Array<Promise<Decision>> = []
    for (let i = 0; i < 10; i++) asked.push(limiter.consume(`c${i}`, POLICY))
    // The rest of this turn takes three deadlines: the batch leaves after it.
    const until = performance.now() + 60
    while (performance.now() < until) { /* the app's own work */ }
    const decisions = await Promise.all(asked)
    t.same(new Set(decisions.map((d) => d.source)), new Set(['store']), `round ${round + 1}: every decision is Redis's`)
  }
  await limiter.close()
})

t.test('batch option: false or { maxDecisions } from 2 to 1024, checked with a coded error', async (t) => {
  const bad: Array<[unknown, RegExp]> = [
    [true, /`batch` must be false or an object \{ maxDecisions \}, got true/],
    [64, /`batch` must be false or an object \{ maxDecisions \}, got 64/],
    [{ maxDecisions: 1 }, /`batch\.maxDecisions` must be an integer from 2 to 1024, got 1/],
    [{ maxDecisions: 1025 }, /`batch\.maxDecisions` must be an integer from 2 to 1024, got 1025/],
    [{ maxDecisions: 2.5 }, /`batch\.maxDecisions` must be an integer from 2 to 1024, got 2\.5/],
    [{ maxDecisions: '64' }, /`batch\.maxDecisions` must be an integer from 2 to 1024, got "64"/],
    [{ max: 64 }, /unknown option `batch\.max`/]
  ]
  for (const [value, message] of bad) {
    t.throws(() => createLimiter({ batch: value as false }), { name: 'TypeError', code: 'TOLLGATE_INVALID_OPTION', message }, JSON.stringify(value))
  }
  const app = Fastify()
  await t.rejects(async () => { await app.register(tollgate, { capacity: 1, refillPerSecond: 1, failureMode: 'open', batch: { maxDecisions: 0 } }).ready() },
    { code: 'TOLLGATE_INVALID_OPTION', message: /`batch\.maxDecisions` must be an integer from 2 to 1024, got 0/ }, 'checked as a store option of the adapters')
  t.ok(createLimiter({ batch: { maxDecisions: 2 } }) !== undefined && createLimiter({ batch: { maxDecisions: 1024 } }) !== undefined && createLimiter({ batch: false }) !== undefined, 'the bounds and false are taken')
})

t.test('two processes, 200 decisions each on one bucket of 50, their batches interleaved in Redis: exactly 50 pass', async (t) => {
  const prefix = uniquePrefix()
  const racer = new URL('./helpers/batch-racer.ts', import.meta.url).pathname
  const children = [0, 1].map(() => spawn(process.execPath, [...process.execArgv, racer], {
    env: { ...process.env, REDIS_URL: server.url, TOLLGATE_PREFIX: prefix, TOLLGATE_COUNT: '200', TOLLGATE_ROUNDS: '4' },
    stdio: ['pipe', 'pipe', 'inherit']
  }))
  t.teardown(() => { for (const child of children) child.kill('SIGKILL') })
  const outputs = children.map((child) => {
    let text = ''
    child.stdout.on('data', (chunk: Buffer) => { text += chunk.toString() })
    return { read: () => text }
  })
  // Both ready, then both go at once.
  while (!outputs.every((o) => o.read().includes('ready'))) await new Promise((resolve) => setTimeout(resolve, 20))
  for (const child of children) child.stdin.write('go\n')
  await Promise.all(children.map((child) => once(child, 'exit')))
  const results = outputs.map((o) => JSON.parse(o.read().split('\n')[1] as string) as { allowed: number, fellBack: number })
  t.same(results.map((r) => r.fellBack), [0, 0], 'every decision was Redis\'s')
  t.equal(results[0]!.allowed + results[1]!.allowed, 50, `exactly 50 pass (${results[0]!.allowed} + ${results[1]!.allowed})`)
})
