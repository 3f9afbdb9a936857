// tollgate/express when a request outlives its answer (docs/guides/express.md, "Shutdown (Express)":
// "nothing a request, a response's timing or a shutdown does can crash or
// hang the app server"), on Express 5 and Express 4, on a real Redis:
//
//   - late decisions: the response was sent (a timeout middleware's 503, an
//     earlier middleware that answered and called next()) before tollgate's
//     decision arrived, on every path (the start-up wait, a wait under
//     maxWaitMs, a slow Redis inside the deadline, a route that settles, an
//     async handler that rejects). Each is run in a process of its own
//     (test/helpers/express-late.ts) under Node's default unhandled-rejection
//     behaviour, where an unhandled rejection ends the process; and the same
//     for the Fastify plugin (test/helpers/fastify-late.ts);
//   - a client that disconnects while it waits: its handler does not run,
//     and its waiter slot is held to the end of its wait;
//   - shutdown: limit.close() answers every waiting request at once, and
//     server.close() then completes.
//
// Tolerances: the children's timeouts answer at 30 ms, their decisions
// arrive 150-200 ms later (the start-up wait's at its end, which the child
// reports); each check waits SETTLE_MS past that, for a loaded 2-core
// machine. Shutdown is bounded by
// SHUTDOWN_MS, against waits of WAIT_MS that would otherwise hold it.

import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { request, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import express5, { type RequestHandler } from 'express'
import express4 from 'express4'
import t, { type Test } from 'tap'
import { rateLimit } from '../lib/express.js'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { memoryLogger } from './helpers/express.js'
import { redisUrl } from './helpers/redis.js'

const SETTLE_MS = 600
const WAIT_MS = 10_000
const SHUTDOWN_MS = 1500

interface Child {
  ask (path: string): Promise<{ status: number, body: string }>
  /** What its /stats says; undefined when it no longer answers. */
  stats (): Promise<unknown>
  /** SIGTERM; its exit code and stderr. */
  stop (): Promise<{ code: number | null, stderr: string }>
}

/** Starts a helper app (test/helpers/<file>) in its own process. */
async function child (t: Test, file: string, env: Record<string, string>): Promise<Child> {
  const proc = spawn(process.execPath, [...process.execArgv, new URL(`./helpers/${file}`, import.meta.url).pathname], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  const killer = setTimeout(() => proc.kill('SIGKILL'), 100_000)
  t.teardown(() => { clearTimeout(killer); proc.kill('SIGKILL') })
  let stdout = ''
  let stderr = ''
  proc.stderr.on('data', (chunk: Buffer) => { stderr += chunk.toString() })
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)))
  const port = await new Promise<number>((resolve, reject) => {
    proc.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk.toString()
      const m = /port (\d+)/.exec(stdout)
      if (m !== null) resolve(Number(m[1]))
    })
    void exited.then((code) => reject(new Error(`the child exited (${code}) before listening: ${stderr}`)))
  })
  // A process that died answers status 0 with the error.
  const ask = async (path: string): Promise<{ status: number, body: string }> => await new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      let body = ''
      res.on('data', (chunk: Buffer) => { body += chunk.toString() })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on('error', (err) => resolve({ status: 0, body: err.message }))
    req.end()
  })
  return {
    ask,
    stats: async () => {
      const a = await ask('/stats')
      return a.status === 200 ? JSON.parse(a.body) as unknown : undefined
    },
    stop: async () => {
      proc.kill('SIGTERM')
      return { code: await exited, stderr }
    }
  }
}

/** Until the child's start-up wait (2 s from when it started) is over, or it died. */
async function startupOver (c: Child): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const stats = await c.stats() as { startupOver?: boolean } | undefined
    if (stats === undefined || stats.startupOver === true) return
    await sleep(50)
  }
  throw new Error('the start-up wait was not over after 10 s')
}

const url = await redisUrl(t)

for (const major of ['5', '4'] as const) {
  t.test(`Express ${major}: a decision after the response was sent is dropped; the process lives`, async (t) => {
    const timedOut = { status: 503, body: 'timed out' }
    const passed = { status: 200, body: '{"ok":true}' }
    const scenarios: Array<{ name: string, paths: string[], startup?: true, answers: unknown[], stats: Record<string, unknown> }> = [
      { name: 'the start-up wait ends after the response was sent', paths: ['/startup'], startup: true, answers: [timedOut], stats: { handled: {}, errors: [] } },
      { name: 'a wait under maxWaitMs ends after the timeout answered', paths: ['/wait', '/wait'], answers: [passed, timedOut], stats: { handled: { wait: 1 }, errors: [] } },
      { name: 'a slow Redis (inside the deadline) decides after the timeout: allowed, then denied', paths: ['/slow', '/slow'], answers: [timedOut, timedOut], stats: { handled: {}, errors: [] } },
      { name: 'a route that settles, reserved after the timeout: settled once the response is finished', paths: ['/settle'], answers: [timedOut], stats: { handled: {}, errors: [], settleRemaining: 5 } },
      { name: 'an earlier middleware answered and called next()', paths: ['/early'], answers: [{ status: 200, body: '{"early":true}' }], stats: { handled: {}, errors: [] } },
      { name: 'an async handler that rejects: its error goes to next(err)', paths: ['/handler', '/handler'], answers: [passed, { status: 500, body: '{"message":"the handler failed"}' }], stats: { handled: { handler: 1 }, errors: ['the handler failed'] } }
    ]
    // One process for all of them (a process takes seconds to start on a
    // loaded machine); one that dies is reported and replaced. The start-up
    // wait is the first: it needs a process started less than 2 s ago.
    const start = async (): Promise<Child> => await child(t, 'express-late.ts', { REDIS_URL: url, TOLLGATE_PREFIX: uniquePrefix(), EXPRESS_MAJOR: major })
    let c = await start()
    const died: string[] = []
    for (const scenario of scenarios) {
      const answers = []
      for (const path of scenario.paths) answers.push(await c.ask(path))
      t.same(answers, scenario.answers, `${scenario.name}: the answers the app gave`)
      // Past the latest decision: the start-up wait's end, or a decision of a few hundred ms.
      if (scenario.startup === true) await startupOver(c)
      await sleep(SETTLE_MS)
      const stats = await c.stats()
      if (stats === undefined) {
        const { code, stderr } = await c.stop()
        died.push(`${scenario.name} (exit ${code}: ${/Error \[?\w+\]?:? ?[^\n]*/.exec(stderr)?.[0] ?? stderr.slice(0, 200)})`)
        c = await start()
        continue
      }
      t.match(stats, scenario.stats, `${scenario.name}: the process lives; no handler ran for an answered request`)
    }
    t.same(died, [], `processes ended by a late decision: ${died.length} of ${scenarios.length}`)
    const { code, stderr } = await c.stop()
    t.equal(code, 0, 'the last one exits by itself on SIGTERM')
    t.notMatch(stderr, /ERR_HTTP_HEADERS_SENT|nhandled/, 'and wrote no error')
  })
}

t.test('Fastify: a hook whose reply was already sent; the process lives', async (t) => {
  const c = await child(t, 'fastify-late.ts', { REDIS_URL: url, TOLLGATE_PREFIX: uniquePrefix() })
  const got = []
  for (const path of ['/wait', '/wait', '/slow', '/slow', '/gate', '/gate']) got.push((await c.ask(path)).status)
  await sleep(SETTLE_MS)
  t.same(got, [200, 503, 503, 503, 200, 503], 'the app\'s own timeout answered')
  t.match(await c.stats(), { handled: { wait: 1, gate: 1 } }, 'the process lives; no handler ran for an answered request')
  const { code, stderr } = await c.stop()
  t.equal(code, 0, 'and exits by itself on SIGTERM')
  t.notMatch(stderr, /ERR_HTTP_HEADERS_SENT|nhandled/, 'having written no error')
})

for (const [major, express] of [['Express 5', express5], ['Express 4', express4]] as const) {
  t.test(major, async (t) => {
    const redis = await sharedRedis(t)

    t.test('a client that disconnects while it waits: no handler; its waiter slot is held to the end of its wait', async (t) => {
      const limit = rateLimit({ redis, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 2, failureMode: 'open', timeout: 1000, maxWaiters: 1, logger: memoryLogger() })
      t.teardown(() => limit.close())
      const handled: string[] = []
      const app = express()
      app.get('/wait/:who', limit({ bucket: 'shared', key: () => 'one', maxWaitMs: 2000 }), (req, res) => {
        handled.push(String(req.params.who))
        res.json({ who: req.params.who })
      })
      const at = await serve(t, app)
      t.equal((await ask(at, '/wait/first')).status, 200, 'the bucket is empty now')
      // The client goes away 50 ms into a wait of about 500 ms (the next token, at 2/s).
      const gone = request({ ...at, path: '/wait/gone' })
      gone.on('error', () => {})
      gone.end()
      await sleep(50)
      gone.destroy()
      const other = await ask(at, '/wait/other')
      t.equal(other.status, 429, 'while the gone request\'s wait runs, its slot is taken: the pool of 1 is full, another request does not wait')
      await sleep(600)
      t.same(handled, ['first'], 'the gone request\'s handler did not run')
      const later = await ask(at, '/wait/later')
      t.equal(later.status, 200, 'after its wait ended the slot is free again: a request waits for its token')
      t.same(handled, ['first', 'later'])
    })

    for (const first of ['server.close()', 'limit.close()'] as const) {
      t.test(`shutdown, ${first} first: limit.close() answers every waiting request at once, and server.close() completes`, async (t) => {
        const limit = rateLimit({ redis, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.5, failureMode: 'open', timeout: 1000, logger: memoryLogger() })
        const app = express()
        app.get('/report', limit({ key: () => 'tenant', maxWaitMs: WAIT_MS }), ((_req, res) => { res.json({ ok: true }) }) as RequestHandler)
        const server: Server = app.listen(0, '127.0.0.1')
        await once(server, 'listening')
        t.teardown(() => { server.closeAllConnections() })
        const at = { host: '127.0.0.1', port: (server.address() as AddressInfo).port }
        t.equal((await ask(at, '/report')).status, 200, 'the bucket is empty now')
        // Three keep-alive requests (Node's default agent keeps connections alive) wait for tokens 2, 4, 6 s away.
        const held = [1, 2, 3].map(async () => await ask(at, '/report'))
        await sleep(200)
        const started = performance.now()
        const closing = (): Promise<void> => new Promise<void>((resolve) => { server.close(() => { resolve() }) })
        const closed = first === 'server.close()' ? closing() : limit.close().then(closing)
        if (first === 'server.close()') await limit.close()
        const answers = await Promise.all(held)
        const answeredMs = performance.now() - started
        await closed
        const closedMs = performance.now() - started
        t.same(answers.map((a) => [a.status, a.connection]), [[429, 'close'], [429, 'close'], [429, 'close']], 'the waiting requests are answered as denied, and their connections closed')
        t.ok(answers.every((a) => a.retryAfter !== undefined), 'with Retry-After')
        t.ok(answeredMs < SHUTDOWN_MS, `answered ${answeredMs.toFixed(0)} ms after close() (waits of up to ${WAIT_MS} ms; bound ${SHUTDOWN_MS} ms)`)
        t.ok(closedMs < SHUTDOWN_MS, `server.close() done ${closedMs.toFixed(0)} ms after (bound ${SHUTDOWN_MS} ms)`)
      })
    }
  })
}

async function ask (at: { host: string, port: number }, path: string): Promise<{ status: number, retryAfter: string | undefined, connection: string | undefined }> {
  return await new Promise((resolve, reject) => {
    const req = request({ ...at, path }, (res) => {
      res.resume()
      res.on('end', () => resolve({ status: res.statusCode ?? 0, retryAfter: res.headers['retry-after'], connection: res.headers.connection }))
    })
    req.on('error', reject)
    req.end()
  })
}

/** Listens on a free port until the end of `t`. */
async function serve (t: Test, app: ReturnType<typeof express5>): Promise<{ host: string, port: number }> {
  const server = app.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()) }))
  return { host: '127.0.0.1', port: (server.address() as AddressInfo).port }
}
