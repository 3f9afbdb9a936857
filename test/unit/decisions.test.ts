// The decision builders and the failure modes (lib/core/decisions.ts):
// pure functions, written once for consume and for reserve.

import t from 'tap'
import { closedRetryMs, failed, fallbackOf, shadowed, summarize, timeoutOf } from '../../lib/core/decisions.js'
import type { Policy } from '../../lib/core/types.js'
import type { BucketSpec } from '../../lib/store/store.js'

const a: Policy = { bucket: 'a', capacity: 10, refillPerSecond: 1, failureMode: 'open' }
const b: Policy = { bucket: 'b', capacity: 3, refillPerSecond: 1, failureMode: 'local', local: { capacity: 1, refillPerSecond: 0.5 } }
const c: Policy = { bucket: 'c', capacity: 5, refillPerSecond: 1, failureMode: 'closed', timeout: 5 }
const spec = (key: string, cost = 1): BucketSpec => ({ key, capacity: 0, refillPerSecond: 0, cost })

t.test('summarize: one policy is its own decision, in whole tokens and ms', async (t) => {
  const d = summarize([a], { allowed: true, buckets: [{ remaining: 6.9, fullInUs: 3_100_000, waitUs: 0 }] }, 'store')
  t.same(d, { allowed: true, limit: 10, remaining: 6, resetMs: 3100, retryAfterMs: 0, source: 'store', bucket: 'a' })
})

t.test('summarize: of several, the binding policy (fewest left when allowed, longest wait when denied)', async (t) => {
  const allowed = summarize([a, b], { allowed: true, buckets: [{ remaining: 4, fullInUs: 0, waitUs: 0 }, { remaining: 1, fullInUs: 0, waitUs: 0 }] }, 'store')
  t.equal(allowed.bucket, 'b')
  t.equal(allowed.policies?.length, 2)
  const denied = summarize([a, b], { allowed: false, buckets: [{ remaining: 0, fullInUs: 0, waitUs: 2_000_000 }, { remaining: 0, fullInUs: 0, waitUs: 500_000 }] }, 'store')
  t.match(denied, { allowed: false, bucket: 'a', retryAfterMs: 2000 })
  const oneShort = summarize([a, b], { allowed: false, buckets: [{ remaining: 4, fullInUs: 0, waitUs: 0 }, { remaining: 0, fullInUs: 0, waitUs: 700_000 }] }, 'store')
  t.equal(oneShort.allowed, false, 'all-or-nothing: the list is denied when one policy is')
  t.same(oneShort.policies?.map((d) => d.allowed), [true, false])
})

t.test('the failure modes: closed wins, else local at the local sizes, else open', async (t) => {
  t.same(fallbackOf([a, b, c], [spec('ka'), spec('kb'), spec('kc')]), { mode: 'fail-closed' })
  t.same(fallbackOf([a], [spec('ka')]), { mode: 'fail-open' })
  const local = fallbackOf([a, b], [spec('ka', 2), spec('kb', 3)])
  t.equal(local.mode, 'local')
  if (local.mode !== 'local') return
  t.same(local.specs, [{ key: 'kb', capacity: 1, refillPerSecond: 0.5, cost: 3 }], 'only the local policies, same keys, local sizes, same cost')
  t.match(local.list, [{ bucket: 'b', capacity: 1, refillPerSecond: 0.5 }])
  t.same(fallbackOf([{ ...c, shadow: true }], [spec('kc')]), { mode: 'fail-open' }, 'a shadow policy never closes a request')
  t.same(fallbackOf([{ ...b, local: undefined }], [spec('kb')]), { mode: 'fail-open' }, 'local without local sizes fails open')
})

t.test('failed: open allows with nothing left; closed names the closed policy', async (t) => {
  t.match(failed([a], 'fail-open', 0), { allowed: true, remaining: 0, source: 'fail-open', bucket: 'a' })
  const closed = failed([a, c], 'fail-closed', closedRetryMs(250))
  t.match(closed, { allowed: false, bucket: 'c', retryAfterMs: 1000, source: 'fail-closed' })
  t.equal(closed.policies?.length, 2)
  t.equal(closedRetryMs(4200), 4200, 'the breaker\'s rest when longer than a second')
})

t.test('shadowed: a denial passes, flagged, with what the limit would have said', async (t) => {
  const denied = summarize([a, b], { allowed: false, buckets: [{ remaining: 4, fullInUs: 0, waitUs: 0 }, { remaining: 0, fullInUs: 0, waitUs: 700_000 }] }, 'store')
  const out = shadowed(denied)
  t.match(out, { allowed: true, shadow: true, retryAfterMs: 700 })
  t.same(out.policies?.map((d) => [d.allowed, d.shadow]), [[true, undefined], [true, true]])
  const allowed = failed([a], 'fail-open', 0)
  t.equal(shadowed(allowed), allowed, 'an allowed decision is unchanged')
})

t.test('timeoutOf: the tightest deadline of the list', async (t) => {
  t.equal(timeoutOf([a, b], 10), 10)
  t.equal(timeoutOf([a, c], 10), 5)
})
