// A fleet of app servers sharing one limit through Redis.
//
//   npm run demo:fleet                          4 servers, one Redis, 10 s
//   npm run demo:fleet -- --cluster             the same on a local 3-master Redis Cluster
//   npm run demo:fleet -- --servers 6 --seconds 15 --capacity 100 --refill 30 --rate 300
//
// Starts N app servers (examples/fleet/server.js, each its own process with
// Fastify, tollgate and ioredis) and sends one client's requests, at a
// fixed total rate, round-robin over all of them, on loopback only, for a
// bounded time. Prints each second's admissions and denials per server and
// in total against the limit, then a summary, and draws the run to an SVG
// chart in the system's temp dir (fleet-<pid>.svg) unless --svg names the
// file: the committed examples/fleet/fleet.svg changes only when asked
// (--svg examples/fleet/fleet.svg).
//
// Redis: REDIS_URL when set, else a redis-server from PATH started on a free
// port in a temp dir. With --cluster: REDIS_CLUSTER_NODES
// ("host:port,host:port,...") when set, else three redis-server processes
// joined into a cluster with redis-cli. Everything the demo starts is
// stopped at the end and on Ctrl-C.
//
// Options (flag, or environment variable):
//   --servers  SERVERS   app servers to start (default 4)
//   --seconds  SECONDS   how long to send requests (default 10, at most 120)
//   --capacity CAPACITY  the bucket's capacity, tokens (default 50)
//   --refill   REFILL    tokens added per second (default 20)
//   --rate     RATE      requests per second sent, in total (default 200)
//   --cluster            use a Redis Cluster
//   --svg      SVG       where to write the chart (default: a file in the temp dir)
import { execFile, fork, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { accessSync, constants, rmSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { Agent, request } from 'node:http'
import { connect, createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { delimiter, isAbsolute, join, relative, resolve } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

const HERE = fileURLToPath(new URL('.', import.meta.url))
const HOST = '127.0.0.1'
const CLIENT = 'demo-client'
/** Requests waiting for an answer at most; beyond it a due request is skipped and counted. */
const MAX_IN_FLIGHT = 512

// ------------------------------------------------------------------ options

const USAGE = 'usage: node examples/fleet/demo.js [--servers N] [--seconds S] [--capacity C] [--refill R] [--rate Q] [--cluster] [--svg PATH]'
let flags
try {
  flags = parseArgs({
    options: {
      servers: { type: 'string' },
      seconds: { type: 'string' },
      capacity: { type: 'string' },
      refill: { type: 'string' },
      rate: { type: 'string' },
      cluster: { type: 'boolean', default: false },
      svg: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false }
    }
  }).values
} catch (err) {
  console.error(`${err.message}\n${USAGE}`)
  process.exit(2)
}
if (flags.help) {
  console.log(USAGE)
  process.exit(0)
}

function option (name, env, fallback, { integer = false, max = Infinity } = {}) {
  const raw = flags[name] ?? process.env[env]
  const value = raw === undefined ? fallback : Number(raw)
  if (!Number.isFinite(value) || value <= 0 || value > max || (integer && !Number.isInteger(value))) {
    console.error(`--${name} (or ${env}) must be ${integer ? 'an integer' : 'a number'} > 0${max < Infinity ? ` and <= ${max}` : ''}, got ${JSON.stringify(raw)}`)
    process.exit(2)
  }
  return value
}

// npm runs a script in the package's folder; the folder the user ran npm
// from is INIT_CWD. A relative --svg is read from there, and the chart's
// path printed for there.
const USER_DIR = process.env.INIT_CWD ?? process.cwd()

const config = {
  servers: option('servers', 'SERVERS', 4, { integer: true, max: 32 }),
  seconds: option('seconds', 'SECONDS', 10, { integer: true, max: 120 }),
  capacity: option('capacity', 'CAPACITY', 50),
  refill: option('refill', 'REFILL', 20),
  rate: option('rate', 'RATE', 200, { max: 5000 }),
  cluster: flags.cluster,
  svg: resolve(USER_DIR, flags.svg ?? process.env.SVG ?? join(tmpdir(), `tollgate-fleet-${process.pid}.svg`))
}

/** `path` as the user would type it from USER_DIR: relative below it, absolute elsewhere. */
function shownPath (path) {
  const rel = relative(USER_DIR, path)
  return rel === '' || rel.startsWith('..') || isAbsolute(rel) ? path : rel
}

// ------------------------------------------------------------------ cleanup

/** Undo steps, run last-first at the end, on Ctrl-C and on failure. */
const cleanups = []
/** Processes to SIGKILL if this process exits without running the cleanups. */
const lastResort = new Set()
let cleaning

function cleanup () {
  cleaning ??= (async () => {
    while (cleanups.length > 0) {
      try {
        await cleanups.pop()()
      } catch (err) {
        console.error('cleanup step failed:', err.message)
      }
    }
  })()
  return cleaning
}

process.on('exit', () => {
  for (const { child, dir } of lastResort) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true })
  }
})
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    console.log(`\n${signal}: stopping everything the demo started`)
    cleanup().finally(() => process.exit(130))
  })
}

async function stopChild (child, { message, grace = 2000 } = {}) {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = new Promise((resolve) => child.once('exit', resolve))
  if (message !== undefined && child.connected) child.send(message)
  else child.kill('SIGTERM')
  const timer = setTimeout(() => child.kill('SIGKILL'), grace)
  await exited
  clearTimeout(timer)
}

// ------------------------------------------------------------------ Redis

function findBinary (name) {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir === '') continue
    try {
      accessSync(join(dir, name), constants.X_OK)
      return join(dir, name)
    } catch {}
  }
  return undefined
}

function portFree (port) {
  return new Promise((resolve) => {
    const server = createServer()
    server.once('error', () => resolve(false))
    server.listen(port, HOST, () => server.close(() => resolve(true)))
  })
}

/** A free loopback port; with `bus`, port + 10000 (the cluster bus) is free too. */
async function freePort (bus) {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = await new Promise((resolve, reject) => {
      const server = createServer()
      server.once('error', reject)
      server.listen(0, HOST, () => {
        const { port } = server.address()
        server.close(() => resolve(port))
      })
    })
    if (!bus || (port + 10000 <= 65535 && await portFree(port + 10000))) return port
  }
  throw new Error('no free port found')
}

/** One command on a fresh connection; resolves with the raw reply text. */
function command (port, args, timeoutMs = 1000) {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: HOST, port })
    let reply = ''
    const timer = setTimeout(() => { socket.destroy(); reject(new Error('no answer')) }, timeoutMs)
    socket.on('connect', () => socket.write(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join('')}`))
    socket.on('data', (chunk) => {
      reply += chunk
      // Enough for the short replies used here: a line, or a bulk string read whole.
      const bulk = /^\$(\d+)\r\n/.exec(reply)
      if ((bulk === null && reply.endsWith('\r\n')) || (bulk !== null && reply.length >= bulk[0].length + Number(bulk[1]) + 2)) {
        clearTimeout(timer)
        socket.destroy()
        resolve(reply)
      }
    })
    socket.on('error', (err) => { clearTimeout(timer); reject(err) })
  })
}

async function waitUntil (what, check, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await check().catch(() => false)) return
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

async function startRedisServer (bin, args = []) {
  const dir = await mkdtemp(join(tmpdir(), 'tollgate-fleet-'))
  const port = await freePort(args.includes('--cluster-enabled'))
  const child = spawn(bin, ['--port', String(port), '--bind', HOST, '--dir', dir, '--save', '', '--appendonly', 'no', ...args], { stdio: 'ignore' })
  const entry = { child, dir }
  lastResort.add(entry)
  cleanups.push(async () => {
    await stopChild(child)
    await rm(dir, { recursive: true, force: true })
    lastResort.delete(entry)
  })
  await waitUntil(`redis-server on port ${port}`, async () => (await command(port, ['PING'])).startsWith('+PONG'))
  return port
}

/** Where the servers find Redis, and a line saying what it is. */
async function provideRedis () {
  if (config.cluster) {
    if (process.env.REDIS_CLUSTER_NODES) {
      return { env: { REDIS_CLUSTER: process.env.REDIS_CLUSTER_NODES }, label: `Redis Cluster ${process.env.REDIS_CLUSTER_NODES}` }
    }
    const server = findBinary('redis-server')
    const cli = findBinary('redis-cli')
    if (server === undefined || cli === undefined) {
      throw new Error('--cluster needs redis-server and redis-cli on PATH (apt-get install redis-server redis-tools), or REDIS_CLUSTER_NODES')
    }
    const ports = await Promise.all([1, 2, 3].map(() =>
      startRedisServer(server, ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000'])))
    await new Promise((resolve, reject) => {
      execFile(cli, ['--cluster', 'create', ...ports.map((p) => `${HOST}:${p}`), '--cluster-replicas', '0', '--cluster-yes'],
        { timeout: 30000 }, (err, stdout, stderr) => err === null ? resolve() : reject(new Error(`redis-cli --cluster create failed: ${stderr || stdout}`)))
    })
    for (const port of ports) {
      await waitUntil(`cluster_state:ok on ${port}`, async () => (await command(port, ['CLUSTER', 'INFO'])).includes('cluster_state:ok'))
    }
    const nodes = ports.map((p) => `${HOST}:${p}`).join(',')
    return { env: { REDIS_CLUSTER: nodes }, label: `a local Redis Cluster of 3 masters (${nodes}), started by the demo` }
  }
  if (process.env.REDIS_URL) return { env: { REDIS_URL: process.env.REDIS_URL }, label: `Redis at ${process.env.REDIS_URL}` }
  const server = findBinary('redis-server')
  if (server === undefined) {
    throw new Error('set REDIS_URL (e.g. redis://127.0.0.1:6379), or put redis-server on PATH (apt-get install redis-server)')
  }
  const port = await startRedisServer(server)
  return { env: { REDIS_URL: `redis://${HOST}:${port}` }, label: `a local redis-server on port ${port}, started by the demo` }
}

// ------------------------------------------------------------------ app servers

async function startServer (name, env) {
  const child = fork(join(HERE, 'server.js'), {
    env: { ...process.env, ...env, FLEET_NAME: name },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  const entry = { child }
  lastResort.add(entry)
  cleanups.push(async () => {
    await stopChild(child, { message: 'stop' })
    lastResort.delete(entry)
  })
  const port = await new Promise((resolve, reject) => {
    child.once('message', (message) => resolve(message.port))
    child.once('exit', (code) => reject(new Error(`app server ${name} exited (code ${code}) before listening`)))
  })
  const agent = new Agent({ keepAlive: true, maxSockets: 64 })
  cleanups.push(async () => agent.destroy())
  return { name, port, agent }
}

function get (server) {
  return new Promise((resolve) => {
    const req = request({ host: HOST, port: server.port, path: '/api', agent: server.agent, headers: { 'x-client': CLIENT } }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode))
      res.on('error', () => resolve(0))
    })
    req.on('error', () => resolve(0))
    req.end()
  })
}

// ------------------------------------------------------------------ the run

const pad = (value, width) => String(value).padStart(width)

/** The most a second can admit: the whole bucket plus refill in the first, the refill after. */
const secondLimit = (i) => (i === 0 ? config.capacity : 0) + config.refill

function printHeader (servers) {
  console.log(`\n   s  allowed  denied  failed  limit │ ${servers.map((s) => pad(s.name, 13)).join(' ')}`)
  console.log(`${'─'.repeat(37)}┼${'─'.repeat(servers.length * 14)}`)
}

function printSecond (i, second) {
  const sum = (list) => list.reduce((a, b) => a + b, 0)
  const cells = second.allowed.map((a, s) => pad(`${a} / ${second.denied[s]}`, 13))
  console.log(`${pad(i + 1, 4)}  ${pad(sum(second.allowed), 7)}  ${pad(sum(second.denied), 6)}  ${pad(sum(second.failed), 6)}  ${pad(Math.round(secondLimit(i) * 10) / 10, 5)} │ ${cells.join(' ')}`)
}

async function drive (servers) {
  const count = servers.length
  const seconds = Array.from({ length: config.seconds }, () => ({
    allowed: new Array(count).fill(0), denied: new Array(count).fill(0), failed: new Array(count).fill(0)
  }))
  const totalRequests = Math.round(config.rate * config.seconds)
  const pending = new Set()
  let sent = 0
  let skipped = 0
  let printed = 0
  let firstSent
  let lastDone = 0
  const startedAt = performance.now()
  const endAt = startedAt + config.seconds * 1000

  const send = (index) => {
    const server = servers[index]
    const sentAt = performance.now()
    firstSent ??= sentAt
    const p = get(server).then((status) => {
      const doneAt = performance.now()
      lastDone = Math.max(lastDone, doneAt)
      // Counted in the second the answer arrived (late ones in the last second).
      const second = seconds[Math.min(config.seconds - 1, Math.floor((doneAt - startedAt) / 1000))]
      if (status === 200) second.allowed[index]++
      else if (status === 429) second.denied[index]++
      else second.failed[index]++
      pending.delete(p)
    })
    pending.add(p)
  }

  printHeader(servers)
  await new Promise((resolve) => {
    const timer = setInterval(() => {
      const now = performance.now()
      const due = Math.min(totalRequests, Math.floor((Math.min(now, endAt) - startedAt) / 1000 * config.rate))
      for (; sent < due; sent++) {
        if (pending.size >= MAX_IN_FLIGHT) skipped++
        else send(sent % count)
      }
      const complete = Math.min(config.seconds - 1, Math.floor((now - startedAt) / 1000))
      for (; printed < complete; printed++) printSecond(printed, seconds[printed])
      if (now >= endAt) {
        clearInterval(timer)
        resolve()
      }
    }, 5)
  })
  await Promise.all(pending)
  for (; printed < config.seconds; printed++) printSecond(printed, seconds[printed])
  return { seconds, sent: sent - skipped, skipped, elapsedS: (lastDone - firstSent) / 1000 }
}

function summarize (servers, run, storeLabel) {
  const total = (field) => run.seconds.reduce((sum, s) => sum + s[field].reduce((a, b) => a + b, 0), 0)
  const allowed = total('allowed')
  const limit = config.capacity + config.refill * run.elapsedS
  console.log(`\nSummary: ${servers.length} app servers on ${storeLabel}`)
  console.log(`  requests   ${run.sent} sent (${config.rate}/s for ${config.seconds} s, one client, round-robin)${run.skipped > 0 ? `, ${run.skipped} skipped with ${MAX_IN_FLIGHT} already waiting` : ''}`)
  console.log(`  allowed    ${allowed}, denied ${total('denied')}, failed ${total('failed')}`)
  console.log(`  limit      capacity + refill × elapsed = ${config.capacity} + ${config.refill} × ${run.elapsedS.toFixed(2)} s = ${limit.toFixed(1)}`)
  console.log(`  allowed / limit = ${(100 * allowed / limit).toFixed(1)} %`)
  console.log(`  per server ${servers.map((s, i) => `${s.name} ${run.seconds.reduce((sum, sec) => sum + sec.allowed[i], 0)}`).join(', ')}`)
  return { allowed, limit }
}

// ------------------------------------------------------------------ chart

const COLORS = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#ff9da7', '#9c755f', '#e15759', '#bab0ac']

const escape = (text) => String(text).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c])

/** A round tick step giving about `ticks` ticks up to `max`. */
function tickStep (max, ticks) {
  const raw = max / ticks
  const power = 10 ** Math.floor(Math.log10(raw))
  return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= raw)
}

function chart (servers, run, totals, storeLabel) {
  const W = 960
  const H = 760
  const left = 70
  const right = 240
  const plotW = W - left - right
  const n = config.seconds
  const slot = plotW / n
  const out = []
  const text = (x, y, content, attrs = '') => out.push(`<text x="${x}" y="${y}" ${attrs}>${escape(content)}</text>`)

  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="13" fill="#222">`)
  out.push(`<rect width="${W}" height="${H}" fill="#ffffff"/>`)
  text(left, 30, `tollgate: ${servers.length} app servers, one shared limit`, 'font-size="20" font-weight="bold"')
  text(left, 52, `${storeLabel} · capacity ${config.capacity}, refill ${config.refill}/s · ${config.rate} requests/s sent for ${config.seconds} s, one client, round-robin over the servers`, 'font-size="12" fill="#555"')

  // Panel 1: allowed per second, stacked by server, against the limit.
  const top1 = 100
  const h1 = 300
  const perSecond = run.seconds.map((s) => s.allowed.reduce((a, b) => a + b, 0))
  const max1 = Math.max(...perSecond, ...run.seconds.map((_, i) => secondLimit(i))) * 1.12
  const y1 = (v) => top1 + h1 - (v / max1) * h1
  text(left, top1 - 14, 'Allowed requests per second (stacked by server) against the limit', 'font-size="14" font-weight="bold"')
  const step1 = tickStep(max1, 6)
  for (let v = 0; v <= max1; v += step1) {
    out.push(`<line x1="${left}" x2="${left + plotW}" y1="${y1(v)}" y2="${y1(v)}" stroke="#e3e3e3"/>`)
    text(left - 8, y1(v) + 4, v, 'text-anchor="end" fill="#555"')
  }
  run.seconds.forEach((second, i) => {
    const x = left + i * slot + slot * 0.15
    let base = 0
    second.allowed.forEach((count, s) => {
      if (count === 0) return
      out.push(`<rect x="${x.toFixed(1)}" y="${y1(base + count).toFixed(1)}" width="${(slot * 0.7).toFixed(1)}" height="${(y1(base) - y1(base + count)).toFixed(1)}" fill="${COLORS[s % COLORS.length]}" stroke="#fff" stroke-width="0.5"/>`)
      base += count
    })
    text((x + slot * 0.35).toFixed(1), (y1(base) - 6).toFixed(1), base, 'text-anchor="middle" font-size="11" font-weight="bold" stroke="#fff" stroke-width="3" paint-order="stroke"')
    text((x + slot * 0.35).toFixed(1), top1 + h1 + 18, i + 1, 'text-anchor="middle" fill="#555"')
  })
  // The limit: a step line, capacity + refill in the first second, refill after.
  const steps = run.seconds.map((_, i) => `${(left + i * slot).toFixed(1)},${y1(secondLimit(i)).toFixed(1)} ${(left + (i + 1) * slot).toFixed(1)},${y1(secondLimit(i)).toFixed(1)}`)
  out.push(`<polyline points="${steps.join(' ')}" fill="none" stroke="#d62728" stroke-width="2" stroke-dasharray="7 4"/>`)
  out.push(`<line x1="${left}" x2="${left + plotW}" y1="${top1 + h1}" y2="${top1 + h1}" stroke="#888"/>`)
  text(left + plotW / 2, top1 + h1 + 36, 'second of the run', 'text-anchor="middle" fill="#555"')

  // Legend.
  const lx = left + plotW + 24
  text(lx, top1 + 4, 'allowed by', 'font-weight="bold"')
  servers.forEach((server, s) => {
    const y = top1 + 24 + s * 20
    out.push(`<rect x="${lx}" y="${y - 11}" width="14" height="14" fill="${COLORS[s % COLORS.length]}"/>`)
    const own = run.seconds.reduce((sum, sec) => sum + sec.allowed[s], 0)
    text(lx + 22, y, `${server.name} (${own})`)
  })
  const ly = top1 + 24 + servers.length * 20 + 14
  out.push(`<line x1="${lx}" x2="${lx + 30}" y1="${ly}" y2="${ly}" stroke="#d62728" stroke-width="2" stroke-dasharray="7 4"/>`)
  text(lx + 36, ly + 4, 'limit per second')
  text(lx, ly + 22, `1st s: ${config.capacity} + ${config.refill}`, 'font-size="11" fill="#555"')
  text(lx, ly + 38, `then: ${config.refill}/s`, 'font-size="11" fill="#555"')
  text(lx, ly + 54, '(a second may pass it by what', 'font-size="11" fill="#555"')
  text(lx, ly + 68, 'the one before left unspent)', 'font-size="11" fill="#555"')

  // Panel 2: allowed so far against capacity + refill × t.
  const top2 = top1 + h1 + 90
  const h2 = 200
  let cumulative = 0
  const points = [[0, 0], ...perSecond.map((count, i) => [i + 1, (cumulative += count)])]
  const limitAtEnd = config.capacity + config.refill * n
  const max2 = Math.max(limitAtEnd, cumulative) * 1.1
  const x2 = (t) => left + (t / n) * plotW
  const y2 = (v) => top2 + h2 - (v / max2) * h2
  text(left, top2 - 14, 'Allowed so far against capacity + refill × t', 'font-size="14" font-weight="bold"')
  const step2 = tickStep(max2, 4)
  for (let v = 0; v <= max2; v += step2) {
    out.push(`<line x1="${left}" x2="${left + plotW}" y1="${y2(v)}" y2="${y2(v)}" stroke="#e3e3e3"/>`)
    text(left - 8, y2(v) + 4, v, 'text-anchor="end" fill="#555"')
  }
  out.push(`<line x1="${x2(0)}" y1="${y2(config.capacity)}" x2="${x2(n)}" y2="${y2(limitAtEnd)}" stroke="#d62728" stroke-width="2" stroke-dasharray="7 4"/>`)
  out.push(`<polyline points="${points.map(([t, v]) => `${x2(t).toFixed(1)},${y2(v).toFixed(1)}`).join(' ')}" fill="none" stroke="#222" stroke-width="2.5"/>`)
  for (const [t, v] of points.slice(1)) out.push(`<circle cx="${x2(t).toFixed(1)}" cy="${y2(v).toFixed(1)}" r="3.5" fill="#222"/>`)
  out.push(`<line x1="${left}" x2="${left + plotW}" y1="${top2 + h2}" y2="${top2 + h2}" stroke="#888"/>`)
  for (let t = 0; t <= n; t += Math.max(1, Math.round(n / 10))) text(x2(t), top2 + h2 + 18, `${t} s`, 'text-anchor="middle" fill="#555"')
  out.push(`<line x1="${lx}" x2="${lx + 30}" y1="${top2 + 20}" y2="${top2 + 20}" stroke="#222" stroke-width="2.5"/>`)
  text(lx + 36, top2 + 24, 'allowed, all servers')
  out.push(`<line x1="${lx}" x2="${lx + 30}" y1="${top2 + 42}" y2="${top2 + 42}" stroke="#d62728" stroke-width="2" stroke-dasharray="7 4"/>`)
  text(lx + 36, top2 + 46, 'capacity + refill × t:')
  text(lx + 36, top2 + 62, 'the most the fleet may', 'font-size="11" fill="#555"')
  text(lx + 36, top2 + 76, 'admit by time t', 'font-size="11" fill="#555"')

  text(left, H - 20, `In total: ${totals.allowed} allowed, limit ${config.capacity} + ${config.refill} × ${run.elapsedS.toFixed(2)} s = ${totals.limit.toFixed(1)} (${(100 * totals.allowed / totals.limit).toFixed(1)} %), ${run.sent} requests sent.`, 'font-size="13" font-weight="bold"')
  out.push('</svg>')
  return out.join('\n') + '\n'
}

// ------------------------------------------------------------------ main

try {
  const store = await provideRedis()
  const prefix = `fleet-demo-${randomBytes(4).toString('hex')}`
  const env = { ...store.env, FLEET_PREFIX: prefix, FLEET_CAPACITY: String(config.capacity), FLEET_REFILL: String(config.refill) }
  console.log(`Starting ${config.servers} app servers on ${store.label}`)
  const servers = await Promise.all(Array.from({ length: config.servers }, (_, i) => startServer(`server-${i + 1}`, env)))
  console.log(`Listening: ${servers.map((s) => `${s.name} :${s.port}`).join(', ')}`)
  console.log(`Sending ${config.rate} requests/s from one client ('${CLIENT}') round-robin over them for ${config.seconds} s; ` +
    `limit: capacity ${config.capacity}, refill ${config.refill}/s (cells: allowed / denied)`)
  const run = await drive(servers)
  const totals = summarize(servers, run, store.label)
  await writeFile(config.svg, chart(servers, run, totals, config.cluster ? 'Redis Cluster (3 masters)' : 'one Redis'))
  console.log(`  chart      ${shownPath(config.svg)}`)
} catch (err) {
  console.error(`demo failed: ${err.message}`)
  process.exitCode = 1
} finally {
  await cleanup()
}
