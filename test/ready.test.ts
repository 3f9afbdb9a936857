// createLimiter's `ready`: the warm-up the adapters run before they serve
// (every script loaded, one peek), for an app that uses the core alone. On
// real redis-server processes: one that runs the scripts, one that has
// EVALSHA renamed away.

import { Redis } from 'ioredis'
import t from 'tap'
import { createLimiter } from '../lib/index.js'
import { LEASE, PROBE, SETTLE, TOKEN_BUCKET, TOKEN_BUCKET_BATCH, TOKEN_BUCKET_EXT } from '../lib/store/redis-store.js'
import { uniquePrefix } from './helpers/app.js'
import { startRedisServer } from './helpers/redis.js'

const SCRIPTS = [TOKEN_BUCKET, TOKEN_BUCKET_BATCH, LEASE, SETTLE, TOKEN_BUCKET_EXT, PROBE]

t.test('ready loads every script, once however often it is read, and leaves the limiter healthy', async (t) => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url)
  t.teardown(() => { redis.disconnect() })
  await redis.script('FLUSH')
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000 })
  t.teardown(() => limiter.close())
  t.same(await redis.script('EXISTS', ...SCRIPTS.map((s) => s.sha)), [0, 0, 0, 0, 0, 0], 'nothing loaded before ready is read')
  t.equal(limiter.ready, limiter.ready, 'one warm-up')
  await limiter.ready
  t.same(await redis.script('EXISTS', ...SCRIPTS.map((s) => s.sha)), [1, 1, 1, 1, 1, 1], 'every script loaded')
  t.equal(limiter.state, 'healthy')
  t.match(await limiter.consume('c', { bucket: 'b', capacity: 2, refillPerSecond: 1, failureMode: 'closed' }), { allowed: true, source: 'store' })
})

t.test('on a Redis that cannot run the scripts, ready resolves and the limiter is failing', async (t) => {
  const server = await startRedisServer({ args: ['--rename-command', 'EVALSHA', ''] })
  t.teardown(() => server.stop())
  const redis = new Redis(server.url)
  t.teardown(() => { redis.disconnect() })
  const lines: string[] = []
  const logger = { warn: (_o: object, msg: string) => { lines.push(msg) }, info () {}, error: (_o: object, msg: string) => { lines.push(msg) } }
  const limiter = createLimiter({ redis, prefix: uniquePrefix(), timeout: 1000, logger })
  t.teardown(() => limiter.close())
  await limiter.ready
  t.equal(limiter.state, 'failing', 'said at once, before any decision')
  t.ok(lines.length > 0, `and logged: ${JSON.stringify(lines)}`)
})

t.test('without redis, ready is resolved at once', async (t) => {
  const limiter = createLimiter()
  t.teardown(() => limiter.close())
  await limiter.ready
  t.equal(limiter.state, 'healthy')
})
