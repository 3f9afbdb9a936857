// Which routes are limited, whatever the order of declaration (docs/guides/fastify.md,
// "Which routes are limited": no route of an app with `global: true` is unlimited in silence), and
// 404s: a flood of unknown URLs spends from one bucket per client, never one
// per URL.

import t from 'tap'
import Fastify, { type FastifyInstance, type FastifyServerOptions, type LightMyRequestResponse } from 'fastify'
import tollgate, { type TollgateOptions } from '../lib/index.js'
import { captureLogs, keysUnder, sharedRedis, uniquePrefix } from './helpers/app.js'
import { redisUrl } from './helpers/redis.js'

await redisUrl(t)

type TapTest = Parameters<Parameters<typeof t.test>[0]>[0]

const IP = '127.0.0.1'

interface Setup {
  app: FastifyInstance
  /** Plugin options on the shared Redis, with a prefix of their own. */
  options: TollgateOptions
  prefix: string
  keys (): Promise<string[]>
}

/** An app not yet registered with the plugin: each test declares in its own order. */
async function setup (t: TapTest, plugin: Partial<TollgateOptions> = {}, fastify: FastifyServerOptions = {}): Promise<Setup> {
  const redis = await sharedRedis(t)
  const prefix = uniquePrefix()
  const app = Fastify(fastify)
  t.teardown(() => app.close())
  const options: TollgateOptions = { redis, prefix, failureMode: 'closed', timeout: 1000, capacity: 2, refillPerSecond: 0.01, ...plugin }
  return { app, options, prefix, keys: async () => await keysUnder(redis, prefix) }
}

/** Status codes of `n` GET requests to `url`. */
async function statuses (app: FastifyInstance, url: string, n: number, method: 'GET' | 'HEAD' = 'GET'): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < n; i++) out.push((await app.inject({ method, url })).statusCode)
  return out
}

function limitHeaders (res: LightMyRequestResponse): string[] {
  return Object.keys(res.headers).filter((h) => /ratelimit|retry-after/.test(h))
}

const ok = async (): Promise<string> => 'ok'

t.test('routes of a plugin registered before tollgate are limited', async (t) => {
  const { app, options, prefix, keys } = await setup(t)
  await app.register(async (child) => {
    child.get('/early', ok)
    child.get('/early/health', { config: { rateLimit: false } }, ok)
    await child.register(async (grandchild) => { grandchild.get('/deep', ok) })
  })
  await app.register(tollgate, options)
  app.get('/late', ok)
  await app.ready()

  t.same(await statuses(app, '/early', 3), [200, 200, 429], 'capacity 2: the third is denied')
  t.same(await statuses(app, '/deep', 3), [200, 200, 429], 'a grandchild created before tollgate too')
  t.same(await statuses(app, '/late', 3), [200, 200, 429])
  const health = await app.inject('/early/health')
  t.equal(health.statusCode, 200)
  t.same(limitHeaders(health), [], 'rateLimit: false stays deliberate')
  t.same(await statuses(app, '/early/health', 4), [200, 200, 200, 200])
  t.same(await keys(), [`${prefix}:{${IP}}:GET /deep`, `${prefix}:{${IP}}:GET /early`, `${prefix}:{${IP}}:GET /late`])
})

t.test('a route declared before `await app.register(tollgate)` is limited', async (t) => {
  const { app, options, prefix, keys } = await setup(t)
  app.get('/before', ok)
  app.get('/before/:id', { config: { rateLimit: { capacity: 1 } } }, ok)
  await app.register(tollgate, options)
  await app.ready()

  const first = await app.inject('/before')
  t.equal(first.statusCode, 200)
  t.equal(first.headers['ratelimit-remaining'], '1', 'headers as on any limited route')
  t.equal(first.headers['ratelimit-limit'], '2')
  t.same(await statuses(app, '/before', 2), [200, 429])
  t.same(await statuses(app, '/before/1', 1), [200])
  t.same(await statuses(app, '/before/2', 1), [429], 'its config.rateLimit applies; one bucket for the pattern')
  t.same(await keys(), [`${prefix}:{${IP}}:GET /before`, `${prefix}:{${IP}}:GET /before/:id`])
})

t.test('routes declared after `app.register(tollgate)` without await are limited', async (t) => {
  const { app, options, prefix, keys } = await setup(t)
  void app.register(tollgate, options)
  app.get('/page', ok)
  app.get('/free', { config: { rateLimit: false } }, ok)
  app.route({ method: ['GET', 'POST'], url: '/both', handler: ok })
  await app.ready()

  t.equal((await app.inject('/page')).headers['ratelimit-remaining'], '1')
  const head = await app.inject({ method: 'HEAD', url: '/page' })
  t.equal(head.statusCode, 200)
  t.equal(head.headers['ratelimit-remaining'], '0', 'HEAD spends from the GET bucket')
  t.same(await statuses(app, '/page', 1, 'HEAD'), [429])
  t.same(await statuses(app, '/free', 4), [200, 200, 200, 200], 'rateLimit: false stays deliberate')
  t.equal((await app.inject({ method: 'POST', url: '/both' })).statusCode, 200)
  t.equal((await app.inject('/both')).statusCode, 200)
  t.same(await statuses(app, '/both', 1, 'HEAD'), [429], 'GET, POST and HEAD share one bucket')
  t.same(await keys(), [`${prefix}:{${IP}}:GET /page`, `${prefix}:{${IP}}:GET,POST /both`])
})

t.test('global: false still limits only configured routes, whatever the order', async (t) => {
  const { app, options, prefix, keys } = await setup(t, { global: false })
  await app.register(async (child) => {
    child.get('/plain', ok)
    child.get('/configured', { config: { rateLimit: {} } }, ok)
  })
  await app.register(tollgate, options)
  app.get('/late', ok)
  await app.ready()

  const plain = await app.inject('/plain')
  t.same(limitHeaders(plain), [])
  t.same(await statuses(app, '/plain', 3), [200, 200, 200])
  t.same(await statuses(app, '/late', 3), [200, 200, 200])
  t.same(await statuses(app, '/configured', 3), [200, 200, 429])
  t.same(await keys(), [`${prefix}:{${IP}}:GET /configured`])
})

t.test("hook 'preHandler' on a route declared before tollgate: key reads the body", async (t) => {
  const { app, options, prefix, keys } = await setup(t)
  app.post('/vote', {
    config: { rateLimit: { hook: 'preHandler', capacity: 1, key: (request) => (request.body as { user: string }).user } }
  }, ok)
  await app.register(tollgate, options)
  await app.ready()
  const vote = async (user: string): Promise<number> => (await app.inject({ method: 'POST', url: '/vote', payload: { user } })).statusCode
  t.equal(await vote('alice'), 200)
  t.equal(await vote('alice'), 429)
  t.equal(await vote('bob'), 200, 'another body, another client')
  t.same(await keys(), [`${prefix}:{alice}:POST /vote`, `${prefix}:{bob}:POST /vote`])
})

t.test('a bad config.rateLimit on a route declared before tollgate is a 500 naming it, on every request', async (t) => {
  const { app, options, keys } = await setup(t)
  app.get('/bad', { config: { rateLimit: { capacity: -1 } } }, ok)
  await app.register(tollgate, options)
  await app.ready()
  for (let i = 0; i < 2; i++) {
    const res = await app.inject('/bad')
    t.equal(res.statusCode, 500)
    t.match(res.json(), { code: 'TOLLGATE_INVALID_OPTION', message: /config\.rateLimit of GET \/bad: capacity/ })
  }
  t.same(await keys(), [])
})

t.test('routes declared after `await app.register(tollgate)` keep their check after the app\'s own hooks', async (t) => {
  // The usual order: an auth hook added after tollgate still runs before the
  // check, so `key` can read what it set.
  // The user the auth hook found, per request, as an auth plugin keeps it.
  const users = new WeakMap<object, string>()
  const { app, options, prefix, keys } = await setup(t, {
    key: (request) => {
      const user = users.get(request)
      if (user === undefined) throw new Error('no user: the auth hook has not run')
      return user
    }
  })
  await app.register(tollgate, options)
  app.addHook('onRequest', async (request) => { users.set(request, 'carol') })
  app.get('/me', ok)
  await app.ready()
  t.same(await statuses(app, '/me', 3), [200, 200, 429])
  t.same(await keys(), [`${prefix}:{carol}:GET /me`])
})

t.test('registered inside a plugin: that plugin\'s routes, and its 404s only with its own handler', async (t) => {
  for (const own of [false, true]) {
    const { app, options, prefix, keys } = await setup(t, { capacity: 1 })
    await app.register(async (api) => {
      api.get('/early', ok)
      await api.register(tollgate, options)
      if (own) api.setNotFoundHandler(async (_request, reply) => await reply.code(404).send('api'))
    }, { prefix: '/api' })
    app.get('/root', ok)
    await app.ready()
    t.same(await statuses(app, '/api/early', 2), [200, 429])
    t.same(await statuses(app, '/root', 2), [200, 200], 'a route of the parent is out of scope')
    t.same(await statuses(app, '/nope', 2), [404, 404], 'so are its 404s')
    t.same(await statuses(app, '/api/nope', 2), own ? [404, 429] : [404, 404], own ? 'own 404 handler' : 'the parent\'s 404 handler')
    t.same(await keys(), [...(own ? [`${prefix}:{${IP}}:404`] : []), `${prefix}:{${IP}}:GET /api/early`])
  }
})

t.test('404s', async (t) => {
  const unknown = (i: number): string => `/nope/${i}?q=${i}`

  t.test('global: true limits a flood of distinct unknown URLs in one bucket per client', async (t) => {
    const { app, options, prefix, keys } = await setup(t, { capacity: 3 })
    await app.register(tollgate, options)
    await app.ready()
    const codes: number[] = []
    for (let i = 0; i < 10; i++) codes.push((await app.inject(unknown(i))).statusCode)
    t.same(codes, [404, 404, 404, 429, 429, 429, 429, 429, 429, 429])
    const res = await app.inject({ method: 'POST', url: '/other' })
    t.equal(res.statusCode, 429, 'every method shares the 404 bucket')
    t.equal(res.headers['retry-after'], '100', 'one token at 0.01/s')
    t.same(await keys(), [`${prefix}:{${IP}}:404`], 'one key, never the raw URL')
  })

  t.test('notFound: a policy of its own, merged over the plugin options', async (t) => {
    const { app, options, prefix, keys } = await setup(t, { capacity: 10, notFound: { capacity: 1, headers: 'legacy' } })
    await app.register(tollgate, options)
    app.get('/known', ok)
    await app.ready()
    const first = await app.inject(unknown(1))
    t.equal(first.statusCode, 404)
    t.equal(first.headers['x-ratelimit-limit'], '1')
    t.equal((await app.inject(unknown(2))).statusCode, 429)
    t.equal((await app.inject('/known')).headers['ratelimit-limit'], '10', 'routes keep the plugin options')
    t.same(await keys(), [`${prefix}:{${IP}}:404`, `${prefix}:{${IP}}:GET /known`])
  })

  t.test('notFound: bucket names it; a plugin-wide bucket is shared by 404s', async (t) => {
    const named = await setup(t, { notFound: { bucket: 'unknown-urls' } })
    await named.app.register(tollgate, named.options)
    await named.app.ready()
    await named.app.inject(unknown(1))
    t.same(await named.keys(), [`${named.prefix}:{${IP}}:unknown-urls`])

    const shared = await setup(t, { bucket: 'site' })
    await shared.app.register(tollgate, shared.options)
    shared.app.get('/known', ok)
    await shared.app.ready()
    t.same([(await shared.app.inject('/known')).statusCode, (await shared.app.inject(unknown(1))).statusCode, (await shared.app.inject('/known')).statusCode], [200, 404, 429])
    t.same(await shared.keys(), [`${shared.prefix}:{${IP}}:site`])
  })

  t.test('notFound: false leaves 404s unlimited; global: false does by default', async (t) => {
    for (const plugin of [{ notFound: false }, { global: false }] as const) {
      const { app, options, keys } = await setup(t, plugin)
      await app.register(tollgate, options)
      await app.ready()
      const res = await app.inject(unknown(0))
      t.same(limitHeaders(res), [], JSON.stringify(plugin))
      t.same(await statuses(app, unknown(1), 4), [404, 404, 404, 404], JSON.stringify(plugin))
      t.same(await keys(), [])
    }
  })

  t.test('global: true, no capacity on the plugin: 404s unlimited, and a warning says so', async (t) => {
    for (const notFound of [undefined, false] as const) {
      const logs = captureLogs()
      const { app, options } = await setup(t, { capacity: undefined, refillPerSecond: undefined, notFound }, { logger: { level: 'warn', stream: logs.stream } })
      await app.register(tollgate, options)
      app.get('/own', { config: { rateLimit: { capacity: 1, refillPerSecond: 1 } } }, ok)
      await app.ready()
      t.same(await statuses(app, unknown(1), 3), [404, 404, 404])
      t.same(await statuses(app, '/own', 2), [200, 429])
      const warnings = logs.find('404s are not limited')
      if (notFound === undefined) {
        t.equal(warnings.length, 1)
        t.match(warnings[0]?.msg, /set `notFound: \{ capacity, refillPerSecond \}`, or `notFound: false`/)
      } else {
        t.same(warnings, [], 'notFound: false says it: no warning')
      }
    }
    const err = await (async () => {
      const { app, options } = await setup(t, { capacity: undefined, notFound: true })
      await app.register(tollgate, options)
    })().catch((err: unknown) => err) as TypeError
    t.match(err.message, 'tollgate: `notFound.capacity` must be a finite number > 0', 'notFound: true needs a complete policy')
  })

  t.test('global: false with notFound: true limits 404s with the plugin options', async (t) => {
    const { app, options, keys, prefix } = await setup(t, { global: false, notFound: true })
    await app.register(tollgate, options)
    app.get('/free', ok)
    await app.ready()
    t.same(await statuses(app, unknown(1), 3), [404, 404, 429])
    t.same(await statuses(app, '/free', 3), [200, 200, 200])
    t.same(await keys(), [`${prefix}:{${IP}}:404`])
  })

  t.test("the app's own not-found handler is limited too, before or after tollgate", async (t) => {
    for (const first of [true, false]) {
      const { app, options } = await setup(t)
      const handler = { preHandler: async () => {} }
      if (first) app.setNotFoundHandler(handler, async (_request, reply) => await reply.code(404).send('custom'))
      await app.register(tollgate, options)
      if (!first) app.setNotFoundHandler(handler, async (_request, reply) => await reply.code(404).send('custom'))
      await app.ready()
      const res = await app.inject(unknown(1))
      t.equal(res.payload, 'custom')
      t.equal(res.headers['ratelimit-remaining'], '1')
      t.same(await statuses(app, unknown(2), 2), [404, 429], first ? 'handler set before' : 'handler set after')
    }
  })

  t.test('reply.callNotFound() from a limited route spends once', async (t) => {
    const { app, options, keys, prefix } = await setup(t, { capacity: 3 })
    await app.register(tollgate, options)
    app.get('/maybe', async (_request, reply) => { reply.callNotFound() })
    await app.ready()
    const res = await app.inject('/maybe')
    t.equal(res.statusCode, 404)
    t.equal(res.headers['ratelimit-remaining'], '2', 'the route spent one token')
    t.same(await keys(), [`${prefix}:{${IP}}:GET /maybe`], 'and the 404 bucket none')
  })
})

t.test('notFound is validated like every option', async (t) => {
  const register = async (notFound: unknown): Promise<unknown> => {
    const app = Fastify()
    try {
      await app.register(tollgate, { failureMode: 'open', capacity: 1, refillPerSecond: 1, redis: undefined, notFound } as never)
      await app.ready()
      return undefined
    } catch (err) {
      return err
    } finally {
      await app.close()
    }
  }
  const cases: Array<[unknown, RegExp]> = [
    ['yes', /^tollgate: `notFound` must be true, false, a policy object or a non-empty array of policies, got "yes"$/],
    [[], /^tollgate: `notFound` must be true, false, a policy object or a non-empty array of policies, got an array$/],
    [{ capacity: 0 }, /^tollgate: `notFound\.capacity` must be a finite number > 0, got 0$/],
    [{ capcity: 1 }, /^tollgate: unknown option `notFound\.capcity`; did you mean `notFound\.capacity`\?$/],
    [[{ capacity: 1 }, 7], /^tollgate: `notFound\[1\]` must be a policy object, got 7$/]
  ]
  for (const [value, message] of cases) {
    const err = await register(value) as TypeError & { code?: string }
    t.type(err, TypeError, JSON.stringify(value))
    t.equal(err.code, 'TOLLGATE_INVALID_OPTION')
    t.match(err.message, message)
  }
  const typo = Fastify()
  t.teardown(() => typo.close())
  await t.rejects(async () => { await typo.register(tollgate, { failureMode: 'open', notfound: false } as never) }, {
    code: 'TOLLGATE_INVALID_OPTION',
    message: 'tollgate: unknown option `notfound`; did you mean `notFound`?'
  })
})
