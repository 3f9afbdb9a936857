// Pure parts of the request wing and the core's validation: headers per
// mode, client ids in keys, policy checks with their messages. No Redis.

import t from 'tap'
import { clientId, ipIdentity } from '../../lib/core/keys.js'
import { checkPolicy } from '../../lib/core/policy.js'
import { PolicyHeaders, headerMode, headerPairs } from '../../lib/http/headers.js'
import { logLine } from '../../lib/http/instance.js'
import { StoreError } from '../../lib/store/errors.js'
import { MAX_OWNED, bucketOwner } from '../../lib/http/sharing.js'
import { compileRoute, type RouteLimit } from '../../lib/http/route.js'
import type { Decision } from '../../lib/core/types.js'

const policies = new PolicyHeaders([{ bucket: 'api', capacity: 10, refillPerSecond: 1 }], [{ bucket: 'api', capacity: 2, refillPerSecond: 1 }])
const denial: Decision = { allowed: false, limit: 10, remaining: 0, resetMs: 9500, retryAfterMs: 1200, source: 'store', bucket: 'api' }

t.test('headers: each mode, and Retry-After on every denial (seconds, rounded up)', async (t) => {
  t.same(headerPairs('draft-6', denial, policies), [
    ['ratelimit-limit', 10], ['ratelimit-remaining', 0], ['ratelimit-reset', 10], ['ratelimit-policy', '10;w=10'], ['retry-after', 2]
  ])
  t.same(headerPairs('draft-10', denial, policies), [['ratelimit-policy', '"api";q=10;w=10'], ['ratelimit', '"api";r=0;t=2'], ['retry-after', 2]])
  t.same(headerPairs('legacy', denial, policies).map(([n]) => n), ['x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset', 'retry-after'])
  t.same(headerPairs(false, denial, policies), [['retry-after', 2]])
  t.same(headerPairs('draft-6', { ...denial, source: 'local', limit: 2 }, policies)[3], ['ratelimit-policy', '2;w=2'], 'the local fallback describes its own sizes')
  t.throws(() => { headerMode('draft-8', 'headers') }, /headers/)
})

t.test('keys: safe ids stay readable, hostile ones are hashed into a safe tag', async (t) => {
  t.equal(clientId('alice'), 'alice')
  for (const hostile of ['a}b', '{x}', 'a b', 'x'.repeat(500), 'bob\ud800', 'bob\ufffd']) {
    const id = clientId(hostile)
    t.match(id, /^#[A-Za-z0-9_-]{26}$/, `${JSON.stringify(hostile.slice(0, 12))} is hashed`)
  }
  t.not(clientId('bob\ud800'), clientId('bob\ufffd'), 'a lone surrogate does not share a bucket with U+FFFD')
  t.equal(ipIdentity('::ffff:10.0.0.1', 64), '10.0.0.1')
  t.equal(ipIdentity('2001:db8::1', 64), ipIdentity('2001:db8::ffff:1', 64), 'one /64, one bucket')
})

t.test('policy checks name the field, the value and what is expected', async (t) => {
  const good = { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open' }
  t.doesNotThrow(() => { checkPolicy(good) })
  t.throws(() => { checkPolicy({ ...good, capacity: 0 }) }, /policy\.capacity/)
  t.throws(() => { checkPolicy({ ...good, failureMode: 'sometimes' }) }, /policy\.failureMode/)
  t.throws(() => { checkPolicy({ ...good, timeout: 1e12 }) }, /policy\.timeout/)
  t.throws(() => { checkPolicy({ ...good, windowMs: 1000 }) }, /windowMs/)
  t.throws(() => { checkPolicy('b') }, /policy/)
})

t.test('a route\'s timeout is bounded as the core\'s is, on both adapters\' option tables', async (t) => {
  const { rateLimit } = await import('../../lib/express.js')
  const quiet = { warn () {}, info () {}, error () {} }
  t.throws(() => rateLimit({ capacity: 1, refillPerSecond: 1, failureMode: 'open', timeout: 60_001, logger: quiet }), { code: 'TOLLGATE_INVALID_OPTION', message: /`timeout` must be at most 60000/ })
  const limit = rateLimit({ capacity: 1, refillPerSecond: 1, failureMode: 'open', timeout: 60_000, logger: quiet })
  t.throws(() => limit({ timeout: 1e12 }), { code: 'TOLLGATE_INVALID_OPTION', message: /timeout` must be at most 60000/ })
  await limit.close()
})

t.test('the middleware adapters\' default logger: one line, the message then each field; an error as its message and code, never its stack', async (t) => {
  const err = new StoreError('TOLLGATE_STORE_DOWN', 'Redis at 127.0.0.1:6379 is not connected (status reconnecting)', { cause: new Error('connect ECONNREFUSED') })
  t.equal(logLine({ err, redis: '127.0.0.1:6379' }, 'rate limit store failing'), 'rate limit store failing err="Redis at 127.0.0.1:6379 is not connected (status reconnecting)" code=TOLLGATE_STORE_DOWN redis="127.0.0.1:6379"')
  t.equal(logLine({ err: new TypeError('bad\nkey') }, 'settle failed'), 'settle failed err="bad\\nkey"', 'an error without a code: its message, newlines escaped')
  t.equal(logLine({ downMs: 12, decisions: { 'fail-open': 3 }, last: undefined }, 'recovered'), 'recovered downMs=12 decisions={"fail-open":3} last=undefined')
  t.equal(logLine({}, 'no redis given'), 'no redis given')
})

t.test('buckets of several instances: the table is capped, and close() withdraws an instance\'s names', async (t) => {
  const lines: string[] = []
  const log = { warn: (_o: object, msg: string) => { lines.push(msg) }, info: () => {}, error: () => {} }
  const limit = (bucket: string, capacity: number): RouteLimit<never> => compileRoute(bucket, { bucket, capacity, refillPerSecond: 1, failureMode: 'open' }, {})
  const filler = bucketOwner('cap', log)
  for (let i = 0; i < MAX_OWNED; i++) filler.claim(limit(`b${i}`, 1))
  const a = bucketOwner('cap', log)
  const b = bucketOwner('cap', log)
  a.claim(limit('past-the-cap', 1))
  b.claim(limit('past-the-cap', 2))
  t.same(lines, [], `past ${MAX_OWNED} names, a new name is not checked`)
  filler.release()
  a.claim(limit('b0', 1))
  a.claim(limit('b0', 1))
  b.claim(limit('b0', 2))
  b.claim(limit('b0', 3))
  t.equal(lines.length, 1, 'one warning per bucket name, however many policies follow')
  a.release()
  b.release()
  a.claim(limit('b0', 1))
  t.equal(lines.length, 1, 'released names are free again')
  a.release()
})
