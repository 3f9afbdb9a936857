// draft-11 headers on every adapter of test/helpers/adapters.ts (the Fastify
// plugin, tollgate/express on Express 5 and 4, tollgate/hono): the same
// bytes of RateLimit-Policy, RateLimit and Retry-After for a first call, the
// call that empties the bucket and a denial. Capacity 2 at 0.01 token/s
// (w = 200): r=1 then r=0, each with t = ceil(1 / 0.01) = 100, then a denial
// whose wait for one token is just under 100 s (Retry-After and t both 100).
// Then `partitionKey`: every adapter of one fleet (one Redis, one prefix)
// sends a client the same `pk` on every item (a concurrency policy's too),
// a 12-byte sf-binary that differs between clients and between fleets
// (another prefix, another secret), and that carries nothing of the
// client's key.

import { parseList } from 'structured-headers'
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

/** The `pk` of each item of a RateLimit field, base64 (a missing one: undefined). */
function partitionKeys (field: unknown): Array<string | undefined> {
  return parseList(String(field)).map(([, params]) => {
    const pk = params.get('pk')
    return pk instanceof ArrayBuffer ? Buffer.from(pk).toString('base64') : undefined
  })
}

t.test('partitionKey: one pk per client on every adapter of a fleet, another for another client or fleet', async (t) => {
  const redis = await sharedRedis(t)
  const fleet = uniquePrefix()
  const route = { path: '/x', keyHeader: 'x-client', policy: [{ capacity: 100, refillPerSecond: 1 }, { capacity: 1000, refillPerSecond: 1, bucket: 'daily' }, { bucket: 'slots', concurrency: { max: 5 } }] }
  const seen = new Map<string, Set<string | undefined>>()
  for (const row of [...ADAPTERS, EXPRESS4]) {
    const options = { redis, prefix: fleet, headers: 'draft-11' as const, partitionKey: true, failureMode: 'open' as const, timeout: 1000 }
    const { get } = await row.start(t, { options, routes: [route] })
    for (const client of ['alice', 'bob', '10.0.0.1']) {
      const keys = partitionKeys((await get('/x', { 'x-client': client })).headers.ratelimit)
      t.equal(keys.length, 3, `${row.name}: an item per policy, the concurrency one too`)
      t.equal(new Set(keys).size, 1, `${row.name}: ${client}'s items carry one pk`)
      const [pk] = keys
      t.equal(Buffer.from(pk ?? '', 'base64').length, 12, `${row.name}: 12 bytes`)
      t.notMatch(Buffer.from(pk ?? '', 'base64').toString('latin1'), client, 'nothing of the key')
      const set = seen.get(client) ?? new Set()
      seen.set(client, set.add(pk))
    }
  }
  for (const [client, keys] of seen) t.equal(keys.size, 1, `${client}: the same pk on every adapter`)
  const all = [...seen.values()].map((keys) => [...keys][0])
  t.equal(new Set(all).size, all.length, 'every client its own pk')

  const row = EXPRESS4
  const other = await row.start(t, { options: { redis, prefix: uniquePrefix(), headers: 'draft-11', partitionKey: true, failureMode: 'open', timeout: 1000 }, routes: [route] })
  const [elsewhere] = partitionKeys((await other.get('/x', { 'x-client': 'alice' })).headers.ratelimit)
  t.notOk(seen.get('alice')?.has(elsewhere), 'another fleet (another secret) gives alice another pk')
  const plain = await row.start(t, { options: { redis, prefix: fleet, headers: 'draft-11', failureMode: 'open', timeout: 1000 }, routes: [route] })
  t.same(partitionKeys((await plain.get('/x', { 'x-client': 'alice' })).headers.ratelimit), [undefined, undefined, undefined], 'no pk without the option')
})

t.test('partitionKey: a bad value, or a mode without pk, fails at start-up', async (t) => {
  const redis = await sharedRedis(t)
  for (const row of ADAPTERS) {
    const options = { redis, prefix: uniquePrefix(), capacity: 5, refillPerSecond: 1, headers: 'draft-11' as const, failureMode: 'open' as const }
    await t.rejects(row.start(t, { options: { ...options, partitionKey: 'yes' as never }, routes: [] }), { code: 'TOLLGATE_INVALID_OPTION', message: /partitionKey.*"yes"/ }, row.name)
    await t.rejects(row.start(t, { options: { ...options, headers: 'draft-10', partitionKey: true }, routes: [{ path: '/x', policy: {} }] }), { code: 'TOLLGATE_INVALID_OPTION', message: /partitionKey.*'draft-11'.*got true with headers "draft-10"/ }, `${row.name}: draft-10`)
    await t.rejects(row.start(t, { options, routes: [{ path: '/x', policy: { partitionKey: true, headers: 'draft-6' } }] }), { code: 'TOLLGATE_INVALID_OPTION', message: /partitionKey/ }, `${row.name}: a route's draft-6`)
  }
})
