// Keys in Redis (docs/reference/keys.md): buckets per route pattern, shared buckets,
// hostile client ids hashed into a safe hash tag, IPv6 subnets, and the
// client IP following Fastify's trustProxy only. lib/core/keys.ts is unit-tested
// at the end. Replay the random part: TOLLGATE_SEED=<seed printed below>.

import { createHash, randomInt } from 'node:crypto'
import t from 'tap'
import { clientId, ipIdentity } from '../lib/core/keys.js'
import { buildApp } from './helpers/app.js'
import { randomSource } from './helpers/model.js'
import { redisUrl } from './helpers/redis.js'

await redisUrl(t)

const seed = process.env.TOLLGATE_SEED === undefined ? randomInt(2 ** 31) : Number(process.env.TOLLGATE_SEED)
t.comment(`seed ${seed} (replay with TOLLGATE_SEED=${seed})`)

const IP = '127.0.0.1'

/** The client part of a key: what sits between the first `{` and the first `}`. */
function tagOf (key: string): string {
  return key.slice(key.indexOf('{') + 1, key.indexOf('}'))
}

t.test('the bucket is the route pattern, never the raw URL', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 3, refillPerSecond: 0.01 },
    routes: (app) => {
      app.get('/users/:id', async () => 'user')
      app.get('/orders/:id', async () => 'order')
    }
  })
  t.equal((await app.inject('/users/1')).headers['ratelimit-remaining'], '2')
  t.equal((await app.inject('/users/2')).headers['ratelimit-remaining'], '1', '/users/2 spends from the same bucket')
  t.equal((await app.inject('/users/3?x=1')).headers['ratelimit-remaining'], '0', 'so does a query string')
  t.equal((await app.inject('/users/4')).statusCode, 429)
  t.equal((await app.inject('/orders/1')).headers['ratelimit-remaining'], '2', 'another route has its own bucket')
  t.same(await keys(), [`${prefix}:{${IP}}:GET /orders/:id`, `${prefix}:{${IP}}:GET /users/:id`])
})

t.test('a route with several methods has one bucket', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 3, refillPerSecond: 0.01 },
    routes: (app) => { app.route({ method: ['POST', 'GET'], url: '/multi', handler: async () => 'x' }) }
  })
  await app.inject('/multi')
  await app.inject({ method: 'POST', url: '/multi' })
  t.same(await keys(), [`${prefix}:{${IP}}:GET,POST /multi`], 'methods sorted and joined')
})

t.test('the HEAD route of a multi-method route spends from that route\'s bucket', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 3, refillPerSecond: 0.01 },
    routes: (app) => { app.route({ method: ['GET', 'POST'], url: '/multi', handler: async () => 'x' }) }
  })
  await app.inject('/multi')
  await app.inject({ method: 'HEAD', url: '/multi' })
  t.same(await keys(), [`${prefix}:{${IP}}:GET,POST /multi`], 'one bucket for GET, POST and HEAD')
})

t.test('bucket joins routes', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 2, refillPerSecond: 0.01 },
    routes: (app) => {
      app.get('/a/:x', { config: { rateLimit: { bucket: 'reads' } } }, async () => 'a')
      app.get('/b', { config: { rateLimit: { bucket: 'reads' } } }, async () => 'b')
    }
  })
  await app.inject('/a/1')
  await app.inject('/b')
  t.equal((await app.inject('/a/2')).statusCode, 429)
  t.same(await keys(), [`${prefix}:{${IP}}:reads`])
})

t.test('hostile client ids are hashed; safe ones kept', async (t) => {
  const hostile = [
    'x'.repeat(10_000),
    'a'.repeat(65),
    'nul\u0000byte',
    '\u0000\u0001\u0002\u00ff\ufffd',
    '{x}',
    '}{',
    'a}b{c',
    'line\nbreak',
    'crlf\r\n',
    '   ',
    ' padded ',
    'space inside',
    'ünïcödé',
    '#not-a-hash'
  ]
  const safe = ['user-42', 'a.b_c:d-e', 'A'.repeat(64), '10.0.0.1', '2001:db8:0:0:0:0:0:0']
  const ids = [...hostile, ...safe]
  const { app, keys, prefix } = await buildApp(t, {
    plugin: {
      capacity: 5,
      refillPerSecond: 0.01,
      key: (request) => ids[Number((request.query as { i: string }).i)] as string
    },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  for (let i = 0; i < ids.length; i++) {
    const res = await app.inject(`/x?i=${i}`)
    t.equal(res.statusCode, 200, `id ${i} is never an error`)
  }
  const written = await keys()
  t.equal(written.length, ids.length, 'every id has a bucket of its own: no two collide')
  for (const key of written) {
    t.ok(Buffer.byteLength(key) < 128, `key is short (${Buffer.byteLength(key)} bytes)`)
    t.equal(key.split('{').length - 1, 1, 'exactly one {')
    t.equal(key.split('}').length - 1, 1, 'exactly one }')
    t.match(key, /^[\x21-\x7e ]+$/, 'printable ASCII only')
    t.ok(key.startsWith(`${prefix}:{`) && key.endsWith('}:GET /x'))
  }
  const tags = written.map(tagOf)
  for (const id of safe) t.ok(tags.includes(id), `safe id ${JSON.stringify(id)} kept as it is`)
  t.equal(tags.filter((tag) => tag.startsWith('#')).length, hostile.length, 'hostile ids replaced by a hash')
  t.notOk(tags.includes('#not-a-hash'), 'an id that looks like a hash is hashed too')

  // The hashed id is stable: the same hostile id finds its bucket again.
  const again = await app.inject(`/x?i=${ids.indexOf('{x}')}`)
  t.equal(again.headers['ratelimit-remaining'], '3')
  t.equal((await keys()).length, ids.length)
})

t.test('ids that differ only by a lone surrogate have buckets of their own', async (t) => {
  // UTF-8 cannot encode a lone surrogate; encoded, it reads as U+FFFD.
  const ids = ['bob\ud800', 'bob\ufffd', 'bob\udc00', 'bob', '\ud800', '\ufffd', '\udc00\ud800', '\ud800\udc00']
  const { app, keys } = await buildApp(t, {
    plugin: {
      capacity: 1,
      refillPerSecond: 0.01,
      key: (request) => ids[Number((request.query as { i: string }).i)] as string
    },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  const statuses: number[] = []
  for (let i = 0; i < ids.length; i++) statuses.push((await app.inject(`/x?i=${i}`)).statusCode)
  t.same(statuses, ids.map(() => 200), 'each id spends its own single token: none is locked out by another')
  t.equal((await keys()).length, ids.length, 'one key per id')
  t.equal((await app.inject('/x?i=0')).statusCode, 429, 'and the same id again finds its own, empty bucket')
})

t.test('IPv6 clients are keyed by their /56 by default', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 10, refillPerSecond: 0.01 },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  const from = (remoteAddress: string) => app.inject({ url: '/x', remoteAddress })
  t.equal((await from('2001:db8:abcd:1200::1')).headers['ratelimit-remaining'], '9')
  t.equal((await from('2001:db8:abcd:12ff:ffff:ffff:ffff:ffff')).headers['ratelimit-remaining'], '8', 'same /56')
  t.equal((await from('2001:DB8:ABCD:1234::99')).headers['ratelimit-remaining'], '7', 'same /56, upper case')
  t.equal((await from('2001:db8:abcd:1300::1')).headers['ratelimit-remaining'], '9', 'next /56: a bucket of its own')
  t.same(await keys(), [
    `${prefix}:{2001:db8:abcd:1200:0:0:0:0}:GET /x`,
    `${prefix}:{2001:db8:abcd:1300:0:0:0:0}:GET /x`
  ])
})

t.test('ipv6Subnet: 64', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 10, refillPerSecond: 0.01, ipv6Subnet: 64 },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  const from = (remoteAddress: string) => app.inject({ url: '/x', remoteAddress })
  t.equal((await from('2001:db8:abcd:1200::1')).headers['ratelimit-remaining'], '9')
  t.equal((await from('2001:db8:abcd:1200:ffff::2')).headers['ratelimit-remaining'], '8', 'same /64')
  t.equal((await from('2001:db8:abcd:12ff::1')).headers['ratelimit-remaining'], '9', 'same /56 but another /64')
  t.same(await keys(), [
    `${prefix}:{2001:db8:abcd:1200:0:0:0:0}:GET /x`,
    `${prefix}:{2001:db8:abcd:12ff:0:0:0:0}:GET /x`
  ])
})

t.test('IPv4-mapped IPv6 is IPv4', async (t) => {
  const { app, keys, prefix } = await buildApp(t, {
    plugin: { capacity: 10, refillPerSecond: 0.01 },
    routes: (app) => { app.get('/x', async () => 'x') }
  })
  const from = (remoteAddress: string) => app.inject({ url: '/x', remoteAddress })
  t.equal((await from('10.1.2.3')).headers['ratelimit-remaining'], '9')
  t.equal((await from('::ffff:10.1.2.3')).headers['ratelimit-remaining'], '8', 'same client')
  t.equal((await from('::ffff:10.1.2.4')).headers['ratelimit-remaining'], '9', 'another IPv4 client, not one /56 for all')
  t.same(await keys(), [`${prefix}:{10.1.2.3}:GET /x`, `${prefix}:{10.1.2.4}:GET /x`])
})

t.test('X-Forwarded-For', async (t) => {
  t.test('ignored without trustProxy', async (t) => {
    const { app, keys, prefix } = await buildApp(t, {
      plugin: { capacity: 2, refillPerSecond: 0.01 },
      routes: (app) => { app.get('/x', async () => 'x') }
    })
    for (const spoof of ['1.1.1.1', '2.2.2.2']) {
      await app.inject({ url: '/x', headers: { 'x-forwarded-for': spoof } })
    }
    const third = await app.inject({ url: '/x', headers: { 'x-forwarded-for': '3.3.3.3' } })
    t.equal(third.statusCode, 429, 'a fresh spoofed address buys no fresh bucket')
    t.same(await keys(), [`${prefix}:{${IP}}:GET /x`])
  })

  t.test('used with trustProxy: true', async (t) => {
    const { app, keys, prefix } = await buildApp(t, {
      fastify: { trustProxy: true },
      plugin: { capacity: 2, refillPerSecond: 0.01 },
      routes: (app) => { app.get('/x', async () => 'x') }
    })
    await app.inject({ url: '/x', headers: { 'x-forwarded-for': '203.0.113.7' } })
    await app.inject({ url: '/x', headers: { 'x-forwarded-for': '198.51.100.1, 203.0.113.7' } })
    await app.inject({ url: '/x', headers: { 'x-forwarded-for': '2001:db8:1:2::5' } })
    // trustProxy: true trusts every hop, so request.ip is the leftmost entry.
    t.same(await keys(), [
      `${prefix}:{198.51.100.1}:GET /x`,
      `${prefix}:{2001:db8:1:0:0:0:0:0}:GET /x`,
      `${prefix}:{203.0.113.7}:GET /x`
    ], 'request.ip from the header, IPv6 reduced to its /56')
  })
})

t.test('lib/core/keys.ts', async (t) => {
  t.test('clientId', async (t) => {
    t.equal(clientId('user-42'), 'user-42')
    t.equal(clientId('A'.repeat(64)), 'A'.repeat(64))
    const long = clientId('A'.repeat(65))
    t.match(long, /^#[A-Za-z0-9_-]{26}$/)
    t.not(clientId('{x}'), clientId('{y}'))
    t.equal(clientId('{x}'), clientId('{x}'), 'stable')
    t.match(clientId(''), /^#/, 'an empty id is hashed, not kept')
    t.match(clientId('\n'), /^#/)
  })

  t.test('clientId: lone surrogates', async (t) => {
    t.not(clientId('bob\ud800'), clientId('bob\ufffd'), 'a lone high surrogate is not U+FFFD')
    t.not(clientId('bob\udc00'), clientId('bob\ufffd'), 'a lone low surrogate is not U+FFFD')
    t.not(clientId('bob\ud800'), clientId('bob\udc00'), 'nor are the two alike')
    t.not(clientId('\udc00\ud800'), clientId('\ud800\udc00'), 'a reversed pair is not the pair')
    t.equal(clientId('bob\ud800'), clientId('bob\ud800'), 'stable')
    t.match(clientId('bob\ud800'), /^#[A-Za-z0-9_-]{26}$/, 'and of the same form')
    // Well-formed ids hash as their UTF-8 bytes, as before: existing keys stay.
    const utf8 = (id: string): string => '#' + createHash('sha256').update(Buffer.from(id, 'utf8')).digest('base64url').slice(0, 26)
    for (const id of ['{x}', 'ünïcödé', '\ud83d\ude00 emoji pair', '\ufffd', 'x'.repeat(100)]) {
      t.equal(clientId(id), utf8(id), `unchanged for ${JSON.stringify(id).slice(0, 20)}`)
    }
  })

  t.test('clientId: distinct ids give distinct client parts (random strings with surrogates)', async (t) => {
    // Few code units, short strings: many ids repeat, and many differ only
    // by a lone surrogate, a pair or U+FFFD, the cases an encoding can merge.
    const units = ['a', '{', '#', '\ufffd', '\ud800', '\udbff', '\udc00', '\udfff', '\ud83d', '\ude00', '\u00e9', '\u0000']
    const random = randomSource(seed)
    const byPart = new Map<string, string>()
    const clashes: string[] = []
    const ids = new Set<string>()
    for (let i = 0; i < 20_000; i++) {
      let id = ''
      const length = Math.floor(random() * 6)
      for (let j = 0; j < length; j++) id += units[Math.floor(random() * units.length)] as string
      ids.add(id)
      const part = clientId(id)
      const seen = byPart.get(part)
      if (seen === undefined) {
        byPart.set(part, id)
      } else if (seen !== id) {
        clashes.push(`${JSON.stringify(seen)} and ${JSON.stringify(id)}`)
      }
    }
    t.comment(`${ids.size} distinct ids, ${byPart.size} distinct client parts`)
    t.same(clashes.slice(0, 5), [], `no two distinct ids share a client part (${clashes.length} clashes)`)
    t.ok(ids.size > 5000, `enough distinct ids (${ids.size})`)
  })

  t.test('ipIdentity', async (t) => {
    const cases: Array<[string, number, string, string]> = [
      ['192.0.2.1', 56, '192.0.2.1', 'IPv4 as it is'],
      ['::ffff:192.0.2.1', 56, '192.0.2.1', 'IPv4-mapped'],
      ['::FFFF:192.0.2.1', 56, '192.0.2.1', 'IPv4-mapped, upper case'],
      ['::', 56, '0:0:0:0:0:0:0:0', 'the unspecified address'],
      ['::', 128, '0:0:0:0:0:0:0:0', 'the unspecified address, /128'],
      ['::1', 128, '0:0:0:0:0:0:0:1', 'loopback, /128'],
      ['::1', 56, '0:0:0:0:0:0:0:0', 'loopback, /56'],
      ['2001:db8::', 56, '2001:db8:0:0:0:0:0:0', 'trailing ::'],
      ['2001:0db8:0000:0000:0000:0000:0000:0001', 128, '2001:db8:0:0:0:0:0:1', 'full form'],
      ['2001:db8:abcd:12ff:1:2:3:4', 56, '2001:db8:abcd:1200:0:0:0:0', '/56 keeps 8 bits of the 4th group'],
      ['2001:db8:abcd:12ff:1:2:3:4', 60, '2001:db8:abcd:12f0:0:0:0:0', '/60 keeps 12 bits'],
      ['2001:db8:abcd:12ff:1:2:3:4', 64, '2001:db8:abcd:12ff:0:0:0:0', '/64'],
      ['2001:db8:abcd:12ff:1:2:3:4', 128, '2001:db8:abcd:12ff:1:2:3:4', '/128 keeps everything'],
      ['ffff::', 1, '8000:0:0:0:0:0:0:0', '/1 keeps the top bit'],
      ['7fff::', 1, '0:0:0:0:0:0:0:0', '/1 drops the rest'],
      ['fe80::1%eth0', 128, 'fe80:0:0:0:0:0:0:1', 'zone id dropped'],
      ['fe80::1%2', 64, 'fe80:0:0:0:0:0:0:0', 'numeric zone id dropped'],
      ['64:ff9b::192.0.2.33', 128, '64:ff9b:0:0:0:0:c000:221', 'dotted tail (NAT64)'],
      ['64:ff9b::192.0.2.33%eth0', 128, '64:ff9b:0:0:0:0:c000:221', 'dotted tail and a zone id'],
      ['::192.0.2.33', 128, '0:0:0:0:0:0:c000:221', 'dotted tail after ::'],
      ['1:2:3:4:5:6:1.2.3.4', 128, '1:2:3:4:5:6:102:304', 'dotted tail without ::'],
      ['not:an:ip', 56, 'not:an:ip', 'not an address: left for clientId to hash'],
      ['unknown', 56, 'unknown', 'no colon at all']
    ]
    for (const [ip, subnet, expected, what] of cases) {
      t.equal(ipIdentity(ip, subnet), expected, `${what}: ${ip}/${subnet}`)
    }
    t.equal(ipIdentity('fe80::1%eth0', 64), ipIdentity('fe80::1%eth1', 64), 'zones do not split a client')
  })

  t.test('IPv4-mapped IPv6 in any notation is IPv4', async (t) => {
    t.equal(ipIdentity('::ffff:c000:201', 56), '192.0.2.1', 'hex form')
    t.equal(ipIdentity('0:0:0:0:0:ffff:192.0.2.1', 56), '192.0.2.1', 'uncompressed form')
    t.not(ipIdentity('::ffff:c000:201', 56), ipIdentity('::ffff:c000:202', 56), 'two IPv4 clients are not one /56')
  })
})
