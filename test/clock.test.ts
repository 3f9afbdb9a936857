// An app server whose clock runs 3 hours ahead gains no tokens: the script
// reads Redis TIME, and the app never sends a timestamp. Two app servers
// (Fastify + tollgate, each with its own clients) share one Redis: one in
// this process, one in a child process (this same file, started with
// TOLLGATE_CLOCK_CHILD=1) whose Date and performance clocks a preload module
// shifts by +3 h.
//
// Each server has two routes: /real runs lib as it is; /trusting runs the
// same plugin with a variant of the script that takes `now` from the app
// server (test/helpers/naive.ts). The variant fails the scenario that the
// real script passes, which shows the scenario catches a script that trusts
// the app's clock.

import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import Fastify, { type FastifyInstance } from 'fastify'
import { Redis } from 'ioredis'
import tollgate from '../lib/index.js'
import { LUA, uniqueTag } from './helpers/model.js'
import { trustAppClock } from './helpers/naive.js'

const SHIFT_MS = 3 * 3600 * 1000
const CAPACITY = 5
/**
 * One token per 100 s: none comes back during the test in real time, while
 * a clock 3 h ahead would mean 108 tokens, far more than a full bucket.
 */
const REFILL = 0.01

/** Shifts Date (now() and new Date()) and performance.timeOrigin by TOLLGATE_CLOCK_SHIFT_MS. */
const PRELOAD = `
const shift = Number(process.env.TOLLGATE_CLOCK_SHIFT_MS)
const RealDate = Date
class ShiftedDate extends RealDate {
  constructor (...args) { if (args.length === 0) super(RealDate.now() + shift); else super(...args) }
  static now () { return RealDate.now() + shift }
}
globalThis.Date = ShiftedDate
const origin = performance.timeOrigin + shift
Object.defineProperty(performance, 'timeOrigin', { value: origin, configurable: true })
`

interface AppServer {
  app: FastifyInstance
  port: number
  close: () => Promise<void>
}

/** One app server: /real (tollgate as it is), /trusting (the clock-trusting script), /clock. */
async function startAppServer (url: string): Promise<AppServer> {
  const real = new Redis(url)
  const trusting = new Redis(url)
  trustAppClock(trusting, LUA)
  const app = Fastify()
  const policy = {
    capacity: CAPACITY,
    refillPerSecond: REFILL,
    // Closed with a generous deadline: a slow store shows as a 503, never as an extra 200.
    failureMode: 'closed',
    timeout: 2000,
    // Every request is decided by the script, none by the in-process cache of denials.
    denialCache: false,
    global: false,
    key: (request: { headers: Record<string, unknown> }) => String(request.headers['x-client'])
  } as const
  await app.register(async (scope) => {
    await scope.register(tollgate, { ...policy, redis: real, prefix: 'test-clock-real' })
    scope.get('/real', { config: { rateLimit: { bucket: 'clock' } } }, async () => 'ok')
  })
  await app.register(async (scope) => {
    await scope.register(tollgate, { ...policy, redis: trusting, prefix: 'test-clock-trusting' })
    scope.get('/trusting', { config: { rateLimit: { bucket: 'clock' } } }, async () => 'ok')
  })
  app.get('/clock', async () => ({ date: Date.now(), performance: performance.timeOrigin + performance.now() }))
  await app.listen({ port: 0, host: '127.0.0.1' })
  const address = app.server.address()
  const port = typeof address === 'object' && address !== null ? address.port : 0
  return {
    app,
    port,
    close: async () => {
      await app.close()
      real.disconnect()
      trusting.disconnect()
    }
  }
}

if (process.env.TOLLGATE_CLOCK_CHILD === '1') {
  // The fast-clock app server: report the port, serve until the parent
  // closes our stdin (or dies).
  const server = await startAppServer(process.env.TOLLGATE_CLOCK_REDIS ?? '')
  process.stdout.write(`${JSON.stringify({ port: server.port })}\n`)
  process.stdin.resume()
  process.stdin.on('close', () => { server.close().then(() => process.exit(0), () => process.exit(1)) })
} else {
  await runTests()
}

/** The fast-clock app server in a child process; resolves with its port once it listens. */
function startFastServer (url: string): Promise<{ child: ChildProcess, port: number }> {
  const preload = `data:text/javascript,${encodeURIComponent(PRELOAD)}`
  const child = spawn(process.execPath, [...process.execArgv, '--import', preload, fileURLToPath(import.meta.url)], {
    env: {
      ...process.env,
      TOLLGATE_CLOCK_CHILD: '1',
      TOLLGATE_CLOCK_REDIS: url,
      TOLLGATE_CLOCK_SHIFT_MS: String(SHIFT_MS)
    },
    stdio: ['pipe', 'pipe', 'inherit']
  })
  return new Promise((resolve, reject) => {
    let out = ''
    const timer = setTimeout(() => fail(new Error(`the fast-clock app server did not start within 30 s; stdout: ${out}`)), 30_000)
    function fail (err: Error): void {
      clearTimeout(timer)
      child.kill('SIGKILL')
      reject(err)
    }
    child.once('error', fail)
    child.once('exit', (code, signal) => fail(new Error(`the fast-clock app server exited (${code ?? signal}); stdout: ${out}`)))
    child.stdout?.on('data', (chunk: Buffer) => {
      out += chunk.toString()
      const line = out.split('\n').find((l) => l.startsWith('{'))
      if (line === undefined) return
      clearTimeout(timer)
      child.removeAllListeners('exit')
      resolve({ child, port: (JSON.parse(line) as { port: number }).port })
    })
  })
}

async function runTests (): Promise<void> {
  const { default: t } = await import('tap')
  const { redisUrl } = await import('./helpers/redis.js')
  const url = await redisUrl(t)
  const started = Date.now()
  const [normal, fast] = await Promise.all([startAppServer(url), startFastServer(url)])
  t.comment(`both app servers up in ${Date.now() - started} ms`)
  t.teardown(async () => {
    fast.child.stdin?.end()
    const exited = new Promise((resolve) => fast.child.once('exit', resolve))
    const timer = setTimeout(() => fast.child.kill('SIGKILL'), 5_000)
    await exited
    clearTimeout(timer)
    await normal.close()
  })

  async function hit (port: number, path: string, client: string): Promise<{ status: number, remaining: string | null, reset: string | null }> {
    const res = await fetch(`http://127.0.0.1:${port}${path}`, { headers: { 'x-client': client } })
    await res.arrayBuffer()
    return { status: res.status, remaining: res.headers.get('ratelimit-remaining'), reset: res.headers.get('ratelimit-reset') }
  }

  t.test('the child app server really runs 3 h ahead', async (t) => {
    const res = await fetch(`http://127.0.0.1:${fast.port}/clock`)
    const clock = await res.json() as { date: number, performance: number }
    // A minute of slack for the time the request takes on a busy machine.
    t.ok(Math.abs(clock.date - Date.now() - SHIFT_MS) < 60_000, `Date.now() ahead by ${clock.date - Date.now()} ms`)
    t.ok(Math.abs(clock.performance - (performance.timeOrigin + performance.now()) - SHIFT_MS) < 60_000,
      'performance.timeOrigin + now() ahead by 3 h as well')
  })

  t.test('a bucket emptied through the normal server stays empty through the fast one', async (t) => {
    const client = uniqueTag('clock-empty')
    for (let i = 1; i <= CAPACITY; i++) {
      t.equal((await hit(normal.port, '/real', client)).status, 200, `normal server, request ${i}: allowed`)
    }
    const last = await hit(normal.port, '/real', client)
    t.equal(last.status, 429, 'normal server: empty')
    for (let i = 1; i <= 3; i++) {
      const res = await hit(fast.port, '/real', client)
      t.equal(res.status, 429, `fast server, request ${i}: still denied`)
      t.equal(res.remaining, '0', 'and sees no token')
      // Both see the same time until full (Redis's clock): a fast clock would make it ~0 here.
      t.ok(Math.abs(Number(res.reset) - Number(last.reset)) <= 1, `reset ${res.reset} s, as on the normal server (${last.reset} s)`)
    }
    t.equal((await hit(normal.port, '/real', client)).status, 429, 'the fast server changed nothing for the normal one')
  })

  t.test('both servers count one bucket the same way', async (t) => {
    const client = uniqueTag('clock-share')
    t.equal((await hit(fast.port, '/real', client)).remaining, '4', 'fast server spends first')
    t.equal((await hit(normal.port, '/real', client)).remaining, '3', 'the normal server sees it, no more, no less')
    t.equal((await hit(fast.port, '/real', client)).remaining, '2')
  })

  t.test('a script that takes the app clock fails the same scenario', async (t) => {
    const client = uniqueTag('clock-trusting')
    for (let i = 1; i <= CAPACITY; i++) {
      t.equal((await hit(normal.port, '/trusting', client)).status, 200, `normal server, request ${i}: allowed`)
    }
    t.equal((await hit(normal.port, '/trusting', client)).status, 429, 'normal server: empty')
    let extra = 0
    for (let i = 1; i <= CAPACITY; i++) {
      if ((await hit(fast.port, '/trusting', client)).status === 200) extra++
    }
    t.equal(extra, CAPACITY, `the fast server over-admits: a whole new bucket (${extra} more)`)

    // And the other way round: a write by the fast server dates the bucket
    // 3 h into the future, so the normal server denies a client it has never seen spend.
    const other = uniqueTag('clock-lockout')
    t.equal((await hit(fast.port, '/trusting', other)).status, 200, 'fast server spends one token')
    t.equal((await hit(normal.port, '/trusting', other)).status, 429, 'the normal server is locked out for hours')
  })
}
