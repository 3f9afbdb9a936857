// Fastify apps with the tollgate plugin on the shared test Redis. Every app
// gets its own key prefix, so tests (and test files running in parallel)
// never share a bucket, and `keys()` lists exactly what one app wrote.

import { randomBytes } from 'node:crypto'
import { Writable } from 'node:stream'
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify'
import { Redis } from 'ioredis'
import tollgate, { type TollgateOptions } from '../../lib/index.js'
import { isSecretKey, readable, secretKey } from './keys.js'
import { redisUrl, type TeardownTarget } from './redis.js'

/** A prefix no other app uses: `t-<16 hex>`, valid for the `prefix` option. */
export function uniquePrefix (): string {
  return `t-${randomBytes(8).toString('hex')}`
}

/**
 * A new ioredis client on the shared test Redis, connected, and quit at the
 * end of `t` (unless the test already closed it).
 */
export async function sharedRedis (t: TeardownTarget): Promise<Redis> {
  const url = await redisUrl(t)
  const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  await redis.connect()
  t.teardown(async () => {
    if (redis.status !== 'end') await redis.quit().catch(() => redis.disconnect())
  })
  return redis
}

/**
 * Every bucket key under `prefix`, sorted, written `<prefix>:{<client part>}:<bucket>`
 * once its hash tag is checked against the fleet's key secret (test/helpers/keys.ts
 * readable); the secret's own key is left out. SCAN, never KEYS, so it is safe on a
 * shared Redis.
 */
export async function keysUnder (redis: Redis, prefix: string): Promise<string[]> {
  const found: string[] = []
  let cursor = '0'
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000)
    cursor = next
    found.push(...batch)
  } while (cursor !== '0')
  const secret = await redis.get(secretKey(prefix)) ?? undefined
  return found.filter((key) => !isSecretKey(key, prefix)).map((key) => readable(key, secret, prefix)).sort()
}

/** Log lines of an app, parsed from pino's JSON output. */
export interface LogCapture {
  readonly stream: Writable
  readonly lines: Array<Record<string, unknown>>
  /** Lines whose `msg` contains `text`. */
  find (text: string): Array<Record<string, unknown>>
}

export function captureLogs (): LogCapture {
  const lines: Array<Record<string, unknown>> = []
  let pending = ''
  const stream = new Writable({
    write (chunk: Buffer, _encoding, done) {
      pending += chunk.toString()
      let eol = pending.indexOf('\n')
      while (eol !== -1) {
        const line = pending.slice(0, eol)
        pending = pending.slice(eol + 1)
        if (line.trim() !== '') lines.push(JSON.parse(line) as Record<string, unknown>)
        eol = pending.indexOf('\n')
      }
      done()
    }
  })
  return {
    stream,
    lines,
    find: (text) => lines.filter((l) => typeof l.msg === 'string' && l.msg.includes(text))
  }
}

export interface BuildOptions {
  /**
   * Plugin options. `redis` defaults to a fresh client on the shared Redis
   * (pass `redis: undefined` explicitly for the in-process store), `prefix`
   * to a unique one, `failureMode` to 'closed' (a store failure in a test
   * then shows as a 503, never as a silent pass), `timeout` to 1000 ms: the
   * product's 10 ms default is about production latency, and a loaded test
   * machine (or the first EVAL of the script) can miss it; tests about
   * deadlines set their own.
   */
  plugin?: Partial<TollgateOptions>
  /** Fastify server options (logger, trustProxy, ...). */
  fastify?: FastifyServerOptions
  /** Declares routes once the plugin is registered. */
  routes?: (app: FastifyInstance) => void
}

export interface TestApp {
  app: FastifyInstance
  /** The client the plugin uses (undefined with the in-process store). */
  redis: Redis | undefined
  /** A client to inspect the shared Redis, the plugin's own when it has one. */
  inspect: Redis
  prefix: string
  /** Keys this app wrote, sorted. */
  keys (): Promise<string[]>
}

/**
 * A ready Fastify app with the plugin registered, closed at the end of `t`.
 * The Redis client is closed by the helper after the app, never by the plugin.
 */
export async function buildApp (t: TeardownTarget, options: BuildOptions = {}): Promise<TestApp> {
  const given = options.plugin ?? {}
  const prefix = given.prefix ?? uniquePrefix()
  let redis: Redis | undefined
  if ('redis' in given) {
    redis = given.redis as Redis | undefined
  } else {
    redis = await sharedRedis(t)
  }
  const inspect = redis ?? await sharedRedis(t)
  const app = Fastify(options.fastify ?? {})
  t.teardown(() => app.close())
  const plugin: TollgateOptions = { failureMode: 'closed', timeout: 1000, ...given, prefix }
  if (redis !== undefined) plugin.redis = redis
  else delete plugin.redis
  await app.register(tollgate, plugin)
  options.routes?.(app)
  await app.ready()
  return { app, redis, inspect, prefix, keys: () => keysUnder(inspect, prefix) }
}
