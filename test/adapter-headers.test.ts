// draft-11 headers on every adapter of test/helpers/adapters.ts (the Fastify
// plugin, tollgate/express on Express 5 and 4, tollgate/hono): the same
// bytes of RateLimit-Policy, RateLimit and Retry-After for a first call, the
// call that empties the bucket and a denial. Capacity 2 at 0.01 token/s
// (w = 200): r=1 then r=0, each with t = ceil(1 / 0.01) = 100, then a denial
// whose wait for one token is just under 100 s (Retry-After and t both 100).

import t from 'tap'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { ADAPTERS, EXPRESS4 } from './helpers/adapters.js'
import type { Answer } from './helpers/express.js'

const RATE = /^(ratelimit|ratelimit-policy|retry-after)$/

function rateHeaders (a: Answer): Record<string, unknown> {
  return Object.fromEntries(Object.entries(a.headers).filter(([name]) => RATE.test(name)).sort())
}

const POLICY = '"GET /x";q=2;w=200'
const EXPECTED = [
  { status: 200, headers: { ratelimit: '"GET /x";r=1;t=100', 'ratelimit-policy': POLICY } },
  { status: 200, headers: { ratelimit: '"GET /x";r=0;t=100', 'ratelimit-policy': POLICY } },
  { status: 429, headers: { ratelimit: '"GET /x";r=0;t=100', 'ratelimit-policy': POLICY, 'retry-after': '100' } }
]

t.test('every adapter sends the same draft-11 bytes', async (t) => {
  const redis = await sharedRedis(t)
  for (const row of [...ADAPTERS, EXPRESS4]) {
    const options = { redis, prefix: uniquePrefix(), headers: 'draft-11' as const, failureMode: 'open' as const, timeout: 1000 }
    const { get } = await row.start(t, { options, routes: [{ path: '/x', policy: { capacity: 2, refillPerSecond: 0.01 } }] })
    for (const [i, expected] of EXPECTED.entries()) {
      const answer = await get('/x')
      t.same({ status: answer.status, headers: rateHeaders(answer) }, expected, `${row.name}: request ${i + 1}`)
    }
  }
})
