// Keys (README "Keys in Redis") without Redis: the client part of a key
// (lib/core/keys.ts), IPv6 subnets, and, through Fastify on the in-process
// store, the bucket of a route pattern, the identity of a request (read on
// the 'tollgate:decision' channel) and X-Forwarded-For.

import { createHash } from 'node:crypto'
import diagnostics from 'node:diagnostics_channel'
import t from 'tap'
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify'
import tollgate, { type TollgateOptions } from '../../lib/index.js'
import { clientId, hashTag, ipIdentity } from '../../lib/core/keys.js'
import { Engine } from '../../lib/core/engine.js'
import { wire } from '../../lib/core/limiter.js'
import type { DecisionMessage } from '../../lib/core/types.js'
import { FakeTime } from './helpers/fake-time.js'
import { FailingStore, UNIT_KEY_SECRET, engineOver } from './helpers/failing-store.js'
import { keyUnder } from '../helpers/keys.js'
import type { Test } from './helpers/option-error.js'

t.test('clientId: safe ids kept, every other id hashed into 26 base64url characters', async (t) => {
  for (const safe of ['user-42', 'a.b_c:d-e', 'A'.repeat(64), '10.0.0.1', '2001:db8:0:0:0:0:0:0']) t.equal(clientId(safe), safe, safe)
  const hostile = ['x'.repeat(10_000), 'a'.repeat(65), 'nul\u0000byte', '{x}', '}{', 'a}b{c', 'line\nbreak', 'crlf\r\n', '   ', ' padded ', 'ünïcödé', '#not-a-hash', '']
  const parts = hostile.map(clientId)
  for (const [i, part] of parts.entries()) t.match(part, /^#[A-Za-z0-9_-]{26}$/, `${JSON.stringify(hostile[i]?.slice(0, 12))} hashed`)
  t.equal(new Set(parts).size, hostile.length, 'no two collide')
  t.equal(clientId('{x}'), clientId('{x}'), 'stable')
  const utf8 = (id: string): string => '#' + createHash('sha256').update(Buffer.from(id, 'utf8')).digest('base64url').slice(0, 26)
  for (const id of ['{x}', 'ünïcödé', '\ud83d\ude00 emoji pair', '\ufffd', 'x'.repeat(100)]) t.equal(clientId(id), utf8(id), `well-formed ids hash as their UTF-8 (${JSON.stringify(id).slice(0, 16)})`)
})

t.test('clientId: lone surrogates are not U+FFFD, nor each other', async (t) => {
  t.not(clientId('bob\ud800'), clientId('bob\ufffd'))
  t.not(clientId('bob\udc00'), clientId('bob\ufffd'))
  t.not(clientId('bob\ud800'), clientId('bob\udc00'))
  t.not(clientId('\udc00\ud800'), clientId('\ud800\udc00'), 'a reversed pair is not the pair')
  t.match(clientId('bob\ud800'), /^#[A-Za-z0-9_-]{26}$/)
  // Short random strings of few code units, many differing only by a lone surrogate, a pair or U+FFFD.
  const units = ['a', '{', '#', '\ufffd', '\ud800', '\udbff', '\udc00', '\udfff', '\ud83d', '\ude00', '\u00e9', '\u0000']
  let seed = 20260101
  const random = (): number => { seed = (seed * 1103515245 + 12345) % 2 ** 31; return seed / 2 ** 31 }
  const byPart = new Map<string, string>()
  const clashes: string[] = []
  for (let i = 0; i < 20_000; i++) {
    let id = ''
    const length = Math.floor(random() * 6)
    for (let j = 0; j < length; j++) id += units[Math.floor(random() * units.length)] as string
    const part = clientId(id)
    const seen = byPart.get(part)
    if (seen === undefined) byPart.set(part, id)
    else if (seen !== id) clashes.push(`${JSON.stringify(seen)} and ${JSON.stringify(id)}`)
  }
  t.ok(byPart.size > 2000, `enough distinct ids (${byPart.size})`)
  t.same(clashes.slice(0, 5), [], `no two distinct ids share a client part (${clashes.length} clashes)`)
})

t.test('ipIdentity: IPv4 as it is, IPv4-mapped as IPv4, IPv6 cut to its subnet', async (t) => {
  const cases: Array<[string, number, string]> = [
    ['192.0.2.1', 56, '192.0.2.1'],
    ['::ffff:192.0.2.1', 56, '192.0.2.1'],
    ['::FFFF:192.0.2.1', 56, '192.0.2.1'],
    ['::ffff:c000:201', 56, '192.0.2.1'],
    ['0:0:0:0:0:ffff:192.0.2.1', 56, '192.0.2.1'],
    ['::', 56, '0:0:0:0:0:0:0:0'],
    ['::1', 128, '0:0:0:0:0:0:0:1'],
    ['::1', 56, '0:0:0:0:0:0:0:0'],
    ['2001:db8::', 56, '2001:db8:0:0:0:0:0:0'],
    ['2001:0db8:0000:0000:0000:0000:0000:0001', 128, '2001:db8:0:0:0:0:0:1'],
    ['2001:db8:abcd:12ff:1:2:3:4', 56, '2001:db8:abcd:1200:0:0:0:0'],
    ['2001:db8:abcd:12ff:1:2:3:4', 60, '2001:db8:abcd:12f0:0:0:0:0'],
    ['2001:db8:abcd:12ff:1:2:3:4', 64, '2001:db8:abcd:12ff:0:0:0:0'],
    ['2001:DB8:ABCD:12FF:1:2:3:4', 64, '2001:db8:abcd:12ff:0:0:0:0'],
    ['2001:db8:abcd:12ff:1:2:3:4', 128, '2001:db8:abcd:12ff:1:2:3:4'],
    ['ffff::', 1, '8000:0:0:0:0:0:0:0'],
    ['7fff::', 1, '0:0:0:0:0:0:0:0'],
    ['fe80::1%eth0', 128, 'fe80:0:0:0:0:0:0:1'],
    ['fe80::1%2', 64, 'fe80:0:0:0:0:0:0:0'],
    ['64:ff9b::192.0.2.33', 128, '64:ff9b:0:0:0:0:c000:221'],
    ['::192.0.2.33', 128, '0:0:0:0:0:0:c000:221'],
    ['1:2:3:4:5:6:1.2.3.4', 128, '1:2:3:4:5:6:102:304'],
    ['not:an:ip', 56, 'not:an:ip'],
    ['unknown', 56, 'unknown']
  ]
  for (const [ip, subnet, expected] of cases) t.equal(ipIdentity(ip, subnet), expected, `${ip}/${subnet}`)
  t.equal(ipIdentity('2001:db8::1', 64), ipIdentity('2001:db8::ffff:1', 64), 'one /64, one identity')
  t.not(ipIdentity('::ffff:c000:201', 56), ipIdentity('::ffff:c000:202', 56), 'two IPv4 clients are not one /56')
})

t.test('a bucket key: prefix, the keyed hash tag, the client part, the bucket', async (t) => {
  const time = new FakeTime()
  const { engine } = engineOver(new FailingStore(time), time)
  t.teardown(() => engine.close())
  t.ok(engine instanceof Engine)
  const [spec] = engine.specsOf('{evil}', [{ bucket: 'GET /users/:id', capacity: 3, refillPerSecond: 1, failureMode: 'open', cost: 2 }], undefined)
  t.same(spec, { key: keyUnder(UNIT_KEY_SECRET, 'tollgate', '{evil}', 'GET /users/:id'), capacity: 3, refillPerSecond: 1, cost: 2 })
  t.match(spec?.key, /^tollgate:\{[A-Za-z0-9_-]{8}\}#[A-Za-z0-9_-]{26}:GET \/users\/:id$/)
  const key = engine.keyOf(`{${hashTag(Buffer.from(UNIT_KEY_SECRET), clientId('x'.repeat(500)))}}${clientId('x'.repeat(500))}`, 'b')
  t.equal(engine.specsOf('x'.repeat(500), [{ bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open' }], undefined)[0]?.key, key)
  t.equal(key.split('{').length, 2, 'exactly one {')
  t.equal(key.split('}').length, 2, 'exactly one }')
  t.ok(Buffer.byteLength(key) < 64, 'short')
})

t.test('a client\'s part of its keys, kept once named, is the one named afresh, past the cache\'s cap and for ids too long to keep', async (t) => {
  const time = new FakeTime()
  const { engine } = engineOver(new FailingStore(time), time)
  t.teardown(() => engine.close())
  const policy = { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open' } as const
  const keyOf = (id: string): string | undefined => engine.specsOf(id, [policy], undefined)[0]?.key
  const ids = ['alice', 'x'.repeat(64), 'y'.repeat(65), '{evil}', 'bob\ud800']
  for (const id of ids) t.equal(keyOf(id), keyUnder(UNIT_KEY_SECRET, 'tollgate', id, 'b'), `${JSON.stringify(id.slice(0, 8))}: first`)
  for (const id of ids) t.equal(keyOf(id), keyUnder(UNIT_KEY_SECRET, 'tollgate', id, 'b'), `${JSON.stringify(id.slice(0, 8))}: again`)
  // 10 001 other clients push the first ones out of a cache of 10 000.
  for (let i = 0; i <= 10_000; i++) keyOf(`c${i}`)
  for (const id of ids) t.equal(keyOf(id), keyUnder(UNIT_KEY_SECRET, 'tollgate', id, 'b'), `${JSON.stringify(id.slice(0, 8))}: after the cap`)
  t.equal(keyOf('c10000'), keyUnder(UNIT_KEY_SECRET, 'tollgate', 'c10000', 'b'), 'a client still kept')
})

t.test('a partition key (draft-11 pk): 12 bytes, one per client under the fleet\'s secret; a server that has not read the secret yet gives its own', async (t) => {
  const time = new FakeTime()
  const fleet = [engineOver(new FailingStore(time), time).parts, engineOver(new FailingStore(time), time).parts]
  const [a, b] = fleet.map((parts) => parts.names.partition('alice').toString('base64'))
  t.equal(a, b, 'two servers of one fleet (one keySecret) give alice one pk')
  t.equal(Buffer.from(a ?? '', 'base64').length, 12)
  t.not(fleet[0]?.names.partition('bob').toString('base64'), a, 'bob another')
  t.not(fleet[0]?.names.partition('{x}alice').toString('base64'), a, 'an id in braces another')
  // No keySecret, and a store that never answered: the fleet's secret is unknown.
  const silent = { warn () {}, info () {}, error () {} }
  const unread = [wire({ logger: silent }, time, new FailingStore(time)), wire({ logger: silent }, time, new FailingStore(time))]
  t.notOk(unread[0]?.names.known, 'the secret is not read')
  const provisional = unread.map((parts) => parts.names.partition('alice').toString('base64'))
  t.equal(Buffer.from(provisional[0] ?? '', 'base64').length, 12)
  t.not(provisional[0], provisional[1], 'before the secret is read, each server has its own (as its keys are never sent)')
  t.not(provisional[0], a)
})

t.test('hashTag: 8 base64url characters of an HMAC, stable under one secret, another under another', async (t) => {
  const [one, two] = [Buffer.from('first secret, 16+ chars'), Buffer.from('second secret, 16+ chars')]
  t.match(hashTag(one, 'alice'), /^[A-Za-z0-9_-]{8}$/)
  t.equal(hashTag(one, 'alice'), hashTag(Buffer.from('first secret, 16+ chars'), 'alice'), 'stable: every server of a fleet computes it alike')
  t.not(hashTag(one, 'alice'), hashTag(two, 'alice'), 'another secret, another tag')
  t.not(hashTag(one, 'alice'), hashTag(one, 'bob'))
})

/** A Fastify app on the in-process store, and the identities its decisions were made for. */
async function appWith (t: Test, plugin: Partial<TollgateOptions>, routes: (app: FastifyInstance) => void, fastify: FastifyServerOptions = {}): Promise<{ app: FastifyInstance, seen: string[] }> {
  const seen: string[] = []
  const listener = (message: unknown): void => { seen.push((message as DecisionMessage).key) }
  diagnostics.subscribe('tollgate:decision', listener)
  t.teardown(() => diagnostics.unsubscribe('tollgate:decision', listener))
  const app = Fastify(fastify)
  await app.register(tollgate, { failureMode: 'open', capacity: 3, refillPerSecond: 0.001, warnings: false, ...plugin })
  routes(app)
  await app.ready()
  t.teardown(() => app.close())
  return { app, seen }
}

t.test('the bucket is the route pattern, never the raw URL; a bucket name joins routes', async (t) => {
  const { app } = await appWith(t, {}, (app) => {
    app.get('/users/:id', async () => 'user')
    app.get('/orders/:id', async () => 'order')
    app.route({ method: ['POST', 'GET'], url: '/multi', handler: async () => 'x' })
    app.get('/a/:x', { config: { rateLimit: { bucket: 'reads' } } }, async () => 'a')
    app.get('/b', { config: { rateLimit: { bucket: 'reads' } } }, async () => 'b')
  })
  const remaining = async (url: string, method: 'GET' | 'POST' | 'HEAD' = 'GET'): Promise<string | undefined> => (await app.inject({ url, method })).headers['ratelimit-remaining'] as string | undefined
  t.equal(await remaining('/users/1'), '2')
  t.equal(await remaining('/users/2'), '1', '/users/2 spends from the same bucket')
  t.equal(await remaining('/users/3?x=1'), '0', 'so does a query string')
  t.equal((await app.inject('/users/4')).statusCode, 429)
  t.equal(await remaining('/orders/1'), '2', 'another route has its own bucket')
  t.equal(await remaining('/multi'), '2')
  t.equal(await remaining('/multi', 'POST'), '1', 'one bucket for the methods of one route')
  t.equal(await remaining('/multi', 'HEAD'), '0', 'and HEAD spends from it too')
  t.equal(await remaining('/a/1'), '2')
  t.equal(await remaining('/b'), '1', 'routes naming one bucket share it')
})

t.test('IPv6 clients are their /56 by default, their /64 with ipv6Subnet: 64; IPv4-mapped is IPv4', async (t) => {
  const { app, seen } = await appWith(t, { capacity: 10 }, (app) => { app.get('/x', async () => 'x') })
  const from = async (remoteAddress: string): Promise<string | undefined> => (await app.inject({ url: '/x', remoteAddress })).headers['ratelimit-remaining'] as string | undefined
  t.equal(await from('2001:db8:abcd:1200::1'), '9')
  t.equal(await from('2001:db8:abcd:12ff:ffff:ffff:ffff:ffff'), '8', 'same /56')
  t.equal(await from('2001:DB8:ABCD:1234::99'), '7', 'same /56, upper case')
  t.equal(await from('2001:db8:abcd:1300::1'), '9', 'next /56')
  t.equal(await from('10.1.2.3'), '9')
  t.equal(await from('::ffff:10.1.2.3'), '8', 'IPv4-mapped is the same client')
  t.same([...new Set(seen)], ['2001:db8:abcd:1200:0:0:0:0', '2001:db8:abcd:1300:0:0:0:0', '10.1.2.3'])

  const { app: app64, seen: seen64 } = await appWith(t, { capacity: 10, ipv6Subnet: 64 }, (app) => { app.get('/x', async () => 'x') })
  const from64 = async (remoteAddress: string): Promise<string | undefined> => (await app64.inject({ url: '/x', remoteAddress })).headers['ratelimit-remaining'] as string | undefined
  t.equal(await from64('2001:db8:abcd:1200::1'), '9')
  t.equal(await from64('2001:db8:abcd:1200:ffff::2'), '8', 'same /64')
  t.equal(await from64('2001:db8:abcd:12ff::1'), '9', 'same /56, another /64')
  t.same([...new Set(seen64)], ['2001:db8:abcd:1200:0:0:0:0', '2001:db8:abcd:12ff:0:0:0:0'])
})

t.test('X-Forwarded-For: ignored without trustProxy, used with it', async (t) => {
  const { app, seen } = await appWith(t, { capacity: 2 }, (app) => { app.get('/x', async () => 'x') })
  for (const spoof of ['1.1.1.1', '2.2.2.2']) await app.inject({ url: '/x', headers: { 'x-forwarded-for': spoof } })
  t.equal((await app.inject({ url: '/x', headers: { 'x-forwarded-for': '3.3.3.3' } })).statusCode, 429, 'a fresh spoofed address buys no fresh bucket')
  t.same([...new Set(seen)], ['127.0.0.1'])

  const { app: trusted, seen: seenTrusted } = await appWith(t, { capacity: 2 }, (app) => { app.get('/x', async () => 'x') }, { trustProxy: true })
  await trusted.inject({ url: '/x', headers: { 'x-forwarded-for': '203.0.113.7' } })
  await trusted.inject({ url: '/x', headers: { 'x-forwarded-for': '198.51.100.1, 203.0.113.7' } })
  await trusted.inject({ url: '/x', headers: { 'x-forwarded-for': '2001:db8:1:2::5' } })
  t.same(seenTrusted, ['203.0.113.7', '198.51.100.1', '2001:db8:1:0:0:0:0:0'], 'request.ip from the header, IPv6 reduced to its /56')
})

t.test('hostile ids from `key` are never an error, and each keeps a bucket of its own', async (t) => {
  const ids = ['x'.repeat(10_000), '{x}', '}{', 'line\nbreak', 'bob\ud800', 'bob\ufffd', 'user-42']
  const { app } = await appWith(t, { capacity: 1, key: (request) => ids[Number((request.query as { i: string }).i)] as string }, (app) => { app.get('/x', async () => 'x') })
  const statuses: number[] = []
  for (let i = 0; i < ids.length; i++) statuses.push((await app.inject(`/x?i=${i}`)).statusCode)
  t.same(statuses, ids.map(() => 200), 'each id spends its own single token')
  t.equal((await app.inject('/x?i=1')).statusCode, 429, 'the same hostile id finds its bucket again')
})
