// Every adapter when a request outlives its answer, or the app its
// requests (docs/guides/express.md and hono.md, "Shutdown"; "nothing a
// request, a response's timing or a shutdown does can crash or hang the
// app server"), over the rows of test/helpers/adapters.ts, Express 4
// included, on a real Redis:
//
//   - late decisions: the response was sent (a timeout's 503, an earlier
//     middleware that answered) before tollgate's decision arrived, on
//     every path the row's child app serves (test/helpers/late.ts: the
//     start-up wait, a wait under maxWaitMs, a slow Redis inside the
//     deadline, a route that settles, an async handler that rejects), in a
//     process of its own under Node's default unhandled-rejection
//     behaviour, where an unhandled rejection ends the process;
//   - a client that disconnects while it waits: its handler does not run,
//     and its waiter slot is held to the end of its wait;
//   - shutdown, in each order the row has: every waiting request, on a
//     kept-alive connection, is answered at once, denied, with Retry-After
//     and Connection: close, and the server's close completes without
//     waiting for the client to drop those connections.
//
// Tolerances: the children's timeouts answer at 30 ms, their decisions
// arrive 150-200 ms later (the start-up wait's at its end, which the child
// reports); each check waits SETTLE_MS past that, for a loaded 2-core
// machine. Shutdown is bounded by SHUTDOWN_MS, against waits of WAIT_MS
// that would otherwise hold it.

import { Agent, request } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { sharedRedis, uniquePrefix } from './helpers/app.js'
import { ADAPTERS, EXPRESS4, type AdapterRow } from './helpers/adapters.js'
import { LATE_SCENARIOS, child, startupOver, type Child } from './helpers/late.js'
import { redisUrl } from './helpers/redis.js'

const SETTLE_MS = 600
const WAIT_MS = 10_000
const SHUTDOWN_MS = 1500

const url = await redisUrl(t)

async function lateDecisions (t: Test, late: AdapterRow['late']): Promise<void> {
  const scenarios = LATE_SCENARIOS[late.child] ?? []
  // One process for all of them (a process takes seconds to start on a
  // loaded machine); one that dies is reported and replaced.
  const start = async (): Promise<Child> => await child(t, late.child, { REDIS_URL: url, TOLLGATE_PREFIX: uniquePrefix(), ...late.env })
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
    t.same((stats as { handled?: unknown }).handled, scenario.stats.handled, `${scenario.name}: exactly these handlers ran so far`)
  }
  t.same(died, [], `processes ended by a late decision: ${died.length} of ${scenarios.length}`)
  const { code, stderr } = await c.stop()
  t.equal(code, 0, 'the last one exits by itself on SIGTERM')
  t.notMatch(stderr, /ERR_HTTP_HEADERS_SENT|nhandled/, 'and wrote no error')
}

async function disconnects (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const app = await row.start(t, {
    options: { redis, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 2, failureMode: 'open', timeout: 1000, maxWaiters: 1 },
    routes: [{ path: '/wait/:who', policy: { bucket: 'shared', key: () => 'one', maxWaitMs: 2000 } }]
  })
  t.equal((await ask(app.at, '/wait/first')).status, 200, 'the bucket is empty now')
  // The client goes away 50 ms into a wait of about 500 ms (the next token, at 2/s).
  const gone = request({ ...app.at, path: '/wait/gone' })
  gone.on('error', () => {})
  gone.end()
  await sleep(50)
  gone.destroy()
  const other = await ask(app.at, '/wait/other')
  t.equal(other.status, 429, 'while the gone request\'s wait runs, its slot is taken: the pool of 1 is full, another request does not wait')
  await sleep(600)
  t.same(app.handled, ['/wait/first'], "the gone request's handler did not run")
  const later = await ask(app.at, '/wait/later')
  t.equal(later.status, 200, 'after its wait ended the slot is free again: a request waits for its token')
  t.same(app.handled, ['/wait/first', '/wait/later'])
  t.same(app.logs().filter((l) => l.level === 'error'), [], 'and nothing was logged as an error')
}

async function settlesOnce (t: Test, row: AdapterRow): Promise<void> {
  const redis = await sharedRedis(t)
  const settled: string[] = []
  const app = await row.start(t, {
    options: { redis, prefix: uniquePrefix(), capacity: 2, refillPerSecond: 0.001, failureMode: 'open', timeout: 1000 },
    routes: [
      { path: '/done', policy: { bucket: 'done', key: () => 'one' }, settled: (path) => { settled.push(path) } },
      { path: '/slow', policy: { bucket: 'slow', key: () => 'one' }, settled: (path) => { settled.push(path) }, handlerMs: 300 }
    ]
  })
  t.equal((await ask(app.at, '/done')).status, 200)
  await sleep(200)
  t.same(settled, ['/done'], 'a finished response settles its reservation once')
  t.equal((await app.api.peek('one', { bucket: 'done' })).remaining, 2, 'settled at 0: the reservation is refunded')
  // The client goes away 100 ms into a handler of 300 ms.
  const gone = request({ ...app.at, path: '/slow' })
  gone.on('error', () => {})
  gone.end()
  await sleep(100)
  gone.destroy()
  await sleep(600)
  t.same(settled, ['/done', '/slow'], 'a request whose client left mid-handler settles its reservation once too')
  t.equal((await app.api.peek('one', { bucket: 'slow' })).remaining, 2, 'and it is refunded')
  t.same(app.logs().filter((l) => l.level === 'error'), [], 'nothing was logged as an error')
}

async function shutdown (t: Test, row: AdapterRow, first: string): Promise<void> {
  const redis = await sharedRedis(t)
  const app = await row.start(t, {
    options: { redis, prefix: uniquePrefix(), capacity: 1, refillPerSecond: 0.5, failureMode: 'open', timeout: 1000 },
    routes: [{ path: '/report', policy: { key: () => 'tenant', maxWaitMs: WAIT_MS } }]
  })
  t.equal((await ask(app.at, '/report')).status, 200, 'the bucket is empty now')
  // Three requests on kept-alive connections wait for tokens 2, 4, 6 s away.
  const agent = new Agent({ keepAlive: true })
  t.teardown(() => { agent.destroy() })
  const held = [1, 2, 3].map(async () => await ask(app.at, '/report', agent))
  await sleep(200)
  const started = performance.now()
  const closed = app.shutdown(first)
  const answers = await Promise.all(held)
  const answeredMs = performance.now() - started
  await closed
  const closedMs = performance.now() - started
  t.same(answers.map((a) => [a.status, a.connection]), [[429, 'close'], [429, 'close'], [429, 'close']],
    'the waiting requests are answered as denied, with Connection: close')
  t.ok(answers.every((a) => a.retryAfter !== undefined), 'with Retry-After')
  t.ok(answeredMs < SHUTDOWN_MS, `answered ${answeredMs.toFixed(0)} ms after ${first} (waits of up to ${WAIT_MS} ms; bound ${SHUTDOWN_MS} ms)`)
  // Kept alive, a connection would hold the server's close until the
  // client, or the server's keepAliveTimeout (5 s), dropped it.
  t.ok(closedMs < SHUTDOWN_MS, `the server closed ${closedMs.toFixed(0)} ms after (bound ${SHUTDOWN_MS} ms)`)
}

for (const row of [...ADAPTERS, EXPRESS4]) {
  t.test(row.name, async (t) => {
    t.test('a decision after the response was sent is dropped; the process lives', (t) => lateDecisions(t, row.late))
    t.test('a client that disconnects while it waits: no handler; its waiter slot is held to the end of its wait', (t) => disconnects(t, row))
    t.test('a reservation is settled once: when the response finishes, and when the client leaves mid-handler', (t) => settlesOnce(t, row))
    for (const first of row.shutdowns) {
      t.test(`shutdown, ${first} first: every waiting request is answered at once, and the server closes`, (t) => shutdown(t, row, first))
    }
  })
}

async function ask (at: { host: string, port: number }, path: string, agent?: Agent): Promise<{ status: number, retryAfter: string | undefined, connection: string | undefined }> {
  return await new Promise((resolve, reject) => {
    const req = request({ ...at, path, ...(agent === undefined ? {} : { agent }) }, (res) => {
      res.resume()
      res.on('end', () => resolve({ status: res.statusCode ?? 0, retryAfter: res.headers['retry-after'], connection: res.headers.connection }))
    })
    req.on('error', reject)
    req.end()
  })
}
