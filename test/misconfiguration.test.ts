// The usual mistakes of a new user must be loud: a proxy Fastify does not
// trust, a Redis that is not there at start-up, @fastify/rate-limit's option
// names, several bad options at once, the plugin registered twice, route
// settings in a programmatic policy.

import { Writable } from 'node:stream'
import Fastify, { type FastifyServerOptions } from 'fastify'
import { Redis } from 'ioredis'
import t from 'tap'
import tollgate, { routePolicy, type TollgateOptions } from '../lib/index.js'
import { NO_REDIS_PORT, redisUrl } from './helpers/redis.js'

interface Logged { level: number, msg: string, header?: string }

/** A Fastify app whose warnings are collected. */
function appWithLog (options: FastifyServerOptions = {}): { app: ReturnType<typeof Fastify>, warnings: Logged[] } {
  const warnings: Logged[] = []
  const stream = new Writable({
    write (chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split('\n')) {
        if (line === '') continue
        const entry = JSON.parse(line) as Logged
        if (entry.level >= 40) warnings.push(entry)
      }
      done()
    }
  })
  const app = Fastify({ ...options, logger: { level: 'warn', stream } })
  return { app, warnings }
}

const proxyWarnings = (warnings: Logged[]): Logged[] => warnings.filter((w) => w.msg.includes('does not trust proxies'))

async function caught (fn: () => Promise<unknown>): Promise<Error & { code?: string, errors?: Error[] }> {
  try {
    await fn()
  } catch (err) {
    return err as Error
  }
  throw new Error('did not throw')
}

t.test('behind a proxy Fastify does not trust: one warning naming the fix', async (t) => {
  const redis = new Redis(await redisUrl(t))
  t.teardown(() => redis.quit())
  const { app, warnings } = appWithLog()
  t.teardown(() => app.close())
  await app.register(tollgate, { redis, prefix: `misconf-${process.pid}`, capacity: 100, refillPerSecond: 100, failureMode: 'open' })
  app.get('/', async () => 'ok')

  await app.inject('/')
  t.same(proxyWarnings(warnings), [], 'no forwarding header: no warning')
  for (let i = 0; i < 3; i++) await app.inject({ url: '/', headers: { 'x-forwarded-for': `203.0.113.${i}` } })
  const found = proxyWarnings(warnings)
  t.equal(found.length, 1, 'one warning for three requests')
  t.equal(found[0]?.header, 'X-Forwarded-For')
  t.match(found[0]?.msg, /`trustProxy`/, 'names the fix')
  t.match(found[0]?.msg, /warnings: \{ proxy: false \}/, 'and how to silence it')
})

t.test('the Forwarded header is noticed too; trustProxy, a key or warnings silence it', async (t) => {
  const cases: Array<[string, FastifyServerOptions, Partial<TollgateOptions>, number]> = [
    ['Forwarded', {}, {}, 1],
    ['trustProxy', { trustProxy: true }, {}, 0],
    ['a key function', {}, { key: () => 'k' }, 0],
    ['warnings: { proxy: false }', {}, { warnings: { proxy: false } }, 0],
    ['warnings: { proxy: true }', {}, { warnings: { proxy: true } }, 1],
    ['warnings: false', {}, { warnings: false }, 0]
  ]
  for (const [label, serverOptions, options, expected] of cases) {
    const { app, warnings } = appWithLog(serverOptions)
    await app.register(tollgate, { capacity: 100, refillPerSecond: 100, failureMode: 'open', ...options })
    app.get('/', async () => 'ok')
    await app.inject({ url: '/', headers: { forwarded: 'for=203.0.113.7' } })
    t.equal(proxyWarnings(warnings).length, expected, label)
    if (expected === 1) t.equal(proxyWarnings(warnings)[0]?.header, 'Forwarded')
    await app.close()
  }
  const err = await caught(async () => await Fastify().register(tollgate, { failureMode: 'open', warnings: { proxi: false } as never }))
  t.match(err.message, /unknown option `warnings\.proxi`; did you mean `warnings\.proxy`\?/)
  const notObject = await caught(async () => await Fastify().register(tollgate, { failureMode: 'open', warnings: 'off' as never }))
  t.match(notObject.message, /`warnings` must be false or an object \{ proxy, trustProxy \}, got "off"/)
})

t.test('a Redis that is not ready at start-up: one warning after the bounded wait', async (t) => {
  const port = NO_REDIS_PORT
  const redis = new Redis({ port, host: '127.0.0.1', lazyConnect: true, retryStrategy: () => 1000, maxRetriesPerRequest: 0 })
  redis.on('error', () => {})
  t.teardown(() => redis.disconnect())
  const { app, warnings } = appWithLog()
  t.teardown(() => app.close())
  const started = Date.now()
  await app.register(tollgate, { redis, capacity: 1, refillPerSecond: 1, failureMode: 'open' })
  await app.ready()
  const waited = Date.now() - started
  // The wait is 2 s; a loaded machine adds scheduling noise, never less.
  t.ok(waited >= 1900, `registration waited ${waited} ms`)
  const found = warnings.filter((w) => w.msg.includes('is not ready'))
  t.equal(found.length, 1, 'one warning')
  t.match(found[0]?.msg, `Redis at 127.0.0.1:${port} is not ready after 2000 ms`, 'naming the address')
  t.match(found[0]?.msg, /failure modes/)
  t.match(found[0]?.msg, /'error' listener/)
  t.match(found[0], { redis: `127.0.0.1:${port}`, err: { code: 'TOLLGATE_STORE_DOWN', message: /\(status (?:connecting|reconnecting)\)$/ } }, 'with the client\'s status')
})

t.test("@fastify/rate-limit's options point to the migration table; every bad option is reported at once", async (t) => {
  const migrating = await caught(async () => await Fastify().register(tollgate, { max: 100, timeWindow: 60_000, failureMode: 'open' } as never))
  t.equal(migrating.code, 'TOLLGATE_INVALID_OPTION')
  t.type(migrating, TypeError)
  t.match(migrating.message, /^tollgate: 2 invalid options:\n/)
  t.match(migrating.message, /unknown option `max`: that is an option of @fastify\/rate-limit; use `capacity` \(the burst\) and `refillPerSecond`/)
  t.match(migrating.message, /unknown option `timeWindow`: .*"Migrating from @fastify\/rate-limit"/)
  t.equal(migrating.errors?.length, 2, 'each one in `errors`')

  const several = await caught(async () => await Fastify().register(tollgate, { capacity: 0, refillPerSecond: '1', local: { capacity: -1 } } as never))
  t.same(several.errors?.map((e) => e.message.replace(/ must be .*| got .*/, '')), [
    'tollgate: `capacity`',
    'tollgate: `refillPerSecond`',
    'tollgate: `local.capacity`',
    'tollgate: `local.refillPerSecond`',
    'tollgate: `failureMode`'
  ], 'every problem, nested ones and the missing failureMode included')
  t.ok(several.errors?.every((e) => (e as Error & { code?: string }).code === 'TOLLGATE_INVALID_OPTION'))

  const app = Fastify()
  await app.register(tollgate, { capacity: 1, refillPerSecond: 1, failureMode: 'open' })
  const route = await caught(async () => {
    app.get('/x', { config: { rateLimit: { max: 5 } } }, async () => 'x')
    await app.ready()
  })
  t.match(route.message, /unknown option `config\.rateLimit of GET \/x: max`: that is an option of @fastify\/rate-limit/)

  const one = await caught(async () => await Fastify().register(tollgate, { failureMode: 'open', keyGenerator: () => 'k' } as never))
  t.notOk(one.errors, 'a single problem is thrown as it is')
  t.match(one.message, /^tollgate: unknown option `keyGenerator`: .*use `key`/)

  const typo = await caught(async () => await Fastify().register(tollgate, { failureMode: 'open', capcity: 1 } as never))
  t.match(typo.message, /did you mean `capacity`\?$/, 'a typo still gets its hint')

  const getter = { failureMode: 'open', capacity: 0, get refillPerSecond (): number { throw new Error('boom') } } as const
  const thrown = await caught(async () => await Fastify().register(tollgate, getter))
  t.equal(thrown.message, 'boom', 'an error that is not about an option is passed on as it is')
})

t.test('registered twice in one context, or again in a child: a clear error', async (t) => {
  const options: TollgateOptions = { capacity: 1, refillPerSecond: 1, failureMode: 'open' }
  const twice = Fastify()
  await twice.register(tollgate, options)
  const again = await caught(async () => await twice.register(tollgate, options))
  t.equal(again.code, 'TOLLGATE_ALREADY_REGISTERED')
  t.match(again.message, /already registered in this encapsulation context or in a parent of it: register it once/)

  const nested = Fastify()
  await nested.register(tollgate, options)
  const child = await caught(async () => await nested.register(async (scope) => { await scope.register(tollgate, options) }))
  t.equal(child.code, 'TOLLGATE_ALREADY_REGISTERED')

  const siblings = Fastify()
  for (const [url, capacity] of [['/a', 1], ['/b', 5]] as const) {
    await siblings.register(async (scope) => {
      await scope.register(tollgate, { ...options, capacity })
      scope.get(url, async () => url)
    })
  }
  t.equal((await siblings.inject('/a')).headers['ratelimit-limit'], '1', 'sibling contexts each have their own')
  t.equal((await siblings.inject('/b')).headers['ratelimit-limit'], '5')
  await Promise.all([twice.close(), nested.close(), siblings.close()])
})

t.test('a programmatic policy refuses route settings', async (t) => {
  const app = Fastify()
  t.teardown(() => app.close())
  await app.register(tollgate, { capacity: 5, refillPerSecond: 1, failureMode: 'open' })
  for (const [name, value] of [['key', () => 'x'], ['hook', 'preHandler'], ['headers', false], ['allow', () => true]] as const) {
    const err = await caught(async () => await app.tollgate.consume('alice', { bucket: 'login', [name]: value } as never))
    t.equal(err.code, 'TOLLGATE_INVALID_OPTION', name)
    t.match(err.message, new RegExp(`^tollgate: \`policy\\.${name}\` must be unset: it is a route setting`), name)
  }
})

t.test('routePolicy returns its argument', async (t) => {
  const one = { capacity: 2 }
  const many = [{ capacity: 1 }, { capacity: 2, bucket: 'b' }]
  t.equal(routePolicy(one), one)
  t.equal(routePolicy(many), many)
  t.equal(routePolicy(false), false)
})
