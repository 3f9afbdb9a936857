// Would a `WAIT 1 <ms>` after the script be worth offering for limits that
// fail closed? On a throwaway local Redis Cluster (3 masters, 1 replica
// each) this measures, for the script as tollgate sends it (one EVALSHA on
// the Cluster client) and for the script followed by WAIT in one pipeline
// on the same connection (ioredis sends a pipeline to the node of its keyed
// command, and WAIT counts the acks of that connection's writes):
//
// 1. latency per decision, p50/p99, one decision at a time and with
//    BENCH_WAIT_CONCURRENCY in flight on one client (WAIT blocks the
//    connection it arrives on, so concurrent decisions queue behind it);
// 2. the same with the replica of the slot's master paused: what every
//    decision of that master costs while a replica is gone;
// 3. the loss in the failover scenario of test/failover-loss.test.ts:
//    spend one client's bucket (capacity 5, no refill) with the replica
//    paused and the replication stream backed up past the socket buffers,
//    SIGKILL the master, promote the replica (CLUSTER FAILOVER TAKEOVER),
//    count what a fresh client admits afterwards. A decision whose WAIT
//    reports no replica is counted as a 503 (failure mode 'closed').
//
//   node bench/wait.mjs
//
// Environment:
//   BENCH_WAIT_DECISIONS    decisions per latency cell, healthy cluster (5000)
//   BENCH_WAIT_PAUSED       decisions per latency cell, replica paused (100: each
//                           WAIT may then block its connection for 100 ms)
//   BENCH_WAIT_ROUNDS       rounds, alternating the variants; medians reported (3)
//   BENCH_WAIT_CONCURRENCY  decisions in flight in the concurrent cells (16)
//   BENCH_WAIT_MS           WAIT's timeout in ms (5: half tollgate's default deadline)
//   BENCH_WAIT_CRASHES      crash runs per variant (3)
//
// Nothing here imports tollgate: the script is lua/token-bucket.lua itself,
// sent the way lib/store/redis-store.ts sends it.

import { execFile, spawn } from 'node:child_process'
import { readFileSync, rmSync } from 'node:fs'
import { mkdtemp } from 'node:fs/promises'
import { connect, createServer } from 'node:net'
import { availableParallelism, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { Cluster } from 'ioredis'

const HOST = '127.0.0.1'
const LUA = readFileSync(new URL('../lua/token-bucket.lua', import.meta.url), 'utf8')
const env = (name, fallback) => Number(process.env[name] ?? fallback)
const DECISIONS = env('BENCH_WAIT_DECISIONS', 5000)
const PAUSED_DECISIONS = env('BENCH_WAIT_PAUSED', 100)
const ROUNDS = env('BENCH_WAIT_ROUNDS', 3)
const CONCURRENCY = env('BENCH_WAIT_CONCURRENCY', 16)
const WAIT_MS = env('BENCH_WAIT_MS', 5)
const CRASHES = env('BENCH_WAIT_CRASHES', 3)

// ------------------------------------------------------------ a local cluster

async function freePortPair () {
  for (;;) {
    const port = await new Promise((resolve, reject) => {
      const srv = createServer()
      srv.once('error', reject)
      srv.listen(0, HOST, () => { const { port } = srv.address(); srv.close(() => resolve(port)) })
    })
    if (port + 10_000 > 65_535) continue
    const busFree = await new Promise((resolve) => {
      const srv = createServer()
      srv.once('error', () => resolve(false))
      srv.listen(port + 10_000, HOST, () => srv.close(() => resolve(true)))
    })
    if (busFree) return port
  }
}

/** One command on a fresh connection; rejects on an error reply or after 2 s. */
function command (port, ...args) {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: HOST, port })
    let buf = ''
    const done = (err, value) => { clearTimeout(timer); socket.destroy(); err ? reject(err) : resolve(value) }
    const timer = setTimeout(() => done(new Error(`${port} did not answer ${args[0]}`)), 2_000)
    socket.once('error', (err) => done(err))
    socket.once('connect', () => socket.write(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join('')}`))
    socket.on('data', (chunk) => {
      buf += chunk.toString('latin1')
      const eol = buf.indexOf('\r\n')
      if (eol === -1) return
      const head = buf.slice(0, eol)
      if (head[0] === '-') return done(new Error(head.slice(1)))
      if (head[0] === '+' || head[0] === ':') return done(undefined, head.slice(1))
      if (head[0] === '$') {
        const len = Number(head.slice(1))
        if (len < 0) return done(undefined, null)
        if (Buffer.byteLength(buf, 'latin1') >= eol + 2 + len + 2) done(undefined, Buffer.from(buf, 'latin1').subarray(eol + 2, eol + 2 + len).toString())
      }
    })
  })
}

const field = (info, name) => new RegExp(`^${name}:(.*)$`, 'm').exec(info ?? '')?.[1]?.trim()

class Node {
  constructor (port, dir) { this.port = port; this.dir = dir; this.child = undefined }
  async start () {
    this.child = spawn('redis-server', [
      '--port', String(this.port), '--bind', HOST, '--dir', this.dir, '--save', '', '--appendonly', 'no',
      '--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000',
      '--cluster-replica-validity-factor', '0', '--repl-diskless-sync-delay', '0', '--loglevel', 'warning'
    ], { stdio: 'ignore' })
    const exited = new Promise((resolve) => this.child.once('exit', resolve))
    this.exited = exited
    // Ends the server should this process be killed outright.
    const watchdog = spawn('sh', ['-c', `while kill -0 ${process.pid} 2>/dev/null; do sleep 1; done; kill -9 ${this.child.pid} 2>/dev/null`],
      { detached: true, stdio: 'ignore' })
    watchdog.unref()
    this.watchdog = watchdog
    for (let i = 0; i < 200; i++) {
      if (await command(this.port, 'PING').catch(() => undefined) === 'PONG') return
      await sleep(25)
    }
    throw new Error(`redis-server on ${this.port} did not start`)
  }

  get alive () { return this.child.exitCode === null && this.child.signalCode === null }
  pause () { this.child.kill('SIGSTOP') }
  resume () { this.child.kill('SIGCONT') }
  async kill () { this.child.kill('SIGKILL'); await this.exited }
  async stop () {
    this.resume()
    this.child.kill('SIGKILL')
    await this.exited
    try { this.watchdog.kill('SIGKILL') } catch {}
  }
}

async function startCluster () {
  const nodes = []
  for (let i = 0; i < 6; i++) {
    const node = new Node(await freePortPair(), await mkdtemp(join(tmpdir(), 'tollgate-wait-')))
    await node.start()
    nodes.push(node)
  }
  await new Promise((resolve, reject) => execFile('redis-cli', [
    '--cluster', 'create', ...nodes.map((n) => `${HOST}:${n.port}`), '--cluster-replicas', '1', '--cluster-yes'
  ], { timeout: 60_000 }, (err, stdout, stderr) => err ? reject(new Error(`${err.message}\n${stdout}\n${stderr}`)) : resolve()))
  const cluster = {
    nodes,
    startupNodes: nodes.map((n) => ({ host: HOST, port: n.port })),
    /** [{ node, id, masterId, flags, slots }] as the first answering node sees them */
    async view () {
      for (const node of nodes.filter((n) => n.alive)) {
        const text = await command(node.port, 'CLUSTER', 'NODES').catch(() => undefined)
        if (text === undefined) continue
        return text.trim().split('\n').map((line) => {
          const [id, address, flags, master, , , , , ...slots] = line.split(' ')
          const port = Number(address.split('@')[0].split(':').at(-1))
          return { node: nodes.find((n) => n.port === port), id, masterId: master, flags: flags.split(','), slots }
        })
      }
      throw new Error('no node answers')
    },
    async masterFor (key) {
      const slot = Number(await command(nodes.find((n) => n.alive).port, 'CLUSTER', 'KEYSLOT', key))
      const owner = (await this.view()).find((n) => n.flags.includes('master') && !n.flags.includes('fail') &&
        n.slots.some((range) => { const [a, b = a] = range.split('-').map(Number); return slot >= a && slot <= b }))
      if (owner === undefined) throw new Error(`no master serves ${key} yet`)
      return owner.node
    },
    async replicaOf (master) {
      const view = await this.view()
      const id = view.find((n) => n.node === master).id
      return view.find((n) => n.masterId === id && !n.flags.includes('fail')).node
    },
    async waitHealthy () {
      for (let i = 0; i < 600; i++) {
        let ok = true
        for (const node of nodes) {
          if (!node.alive) continue
          const info = await command(node.port, 'CLUSTER', 'INFO').catch(() => '')
          const repl = await command(node.port, 'INFO', 'replication').catch(() => '')
          if (field(info, 'cluster_state') !== 'ok' || field(info, 'cluster_slots_ok') !== '16384' ||
            (field(repl, 'role') === 'slave' && field(repl, 'master_link_status') !== 'up') ||
            (field(repl, 'role') === 'master' && field(repl, 'connected_slaves') !== '1')) ok = false
        }
        const view = await this.view().catch(() => [])
        if (ok && view.filter((n) => n.flags.includes('fail') || n.flags.includes('fail?')).length === 0) return
        await sleep(50)
      }
      throw new Error('the cluster did not become healthy')
    },
    async stop () {
      await Promise.all(nodes.map((n) => n.stop()))
      for (const n of nodes) rmSync(n.dir, { recursive: true, force: true })
    }
  }
  await cluster.waitHealthy()
  return cluster
}

// ------------------------------------------------------------ the two variants

async function client (cluster) {
  const redis = new Cluster(cluster.startupNodes, {
    enableOfflineQueue: false,
    redisOptions: { connectTimeout: 1_000, commandTimeout: 1_000 }
  })
  redis.on('error', () => {})
  redis.defineCommand('tollgate', { lua: LUA })
  if (redis.status !== 'ready') await new Promise((resolve) => redis.once('ready', resolve))
  return redis
}

const args = (key, capacity, refill) => [1, key, '1', capacity, refill, 1]

/** Outcome of one decision: 'admitted', 'denied' or 'failed' (503 for a closed limit). */
const VARIANTS = {
  async script (redis, key, capacity, refill) {
    const reply = await redis.tollgate(...args(key, capacity, refill))
    return reply[0] < 0 ? 'denied' : 'admitted'
  },
  async 'script+WAIT' (redis, key, capacity, refill) {
    const [[err, reply], [waitErr, acked]] = await redis.pipeline().tollgate(...args(key, capacity, refill)).call('wait', '1', String(WAIT_MS)).exec()
    if (err !== null || waitErr !== null) throw err ?? waitErr
    if (reply[0] < 0) return 'denied'
    // Spent on the master, but no replica has it: the failover could undo
    // it, so a closed limit answers 503 (the token stays spent).
    return acked >= 1 ? 'admitted' : 'failed'
  }
}

// ------------------------------------------------------------ latency

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

async function latency (redis, variant, concurrency, tag, decisions) {
  const decide = VARIANTS[variant]
  const ms = []
  const outcomes = { admitted: 0, denied: 0, failed: 0, error: 0 }
  let next = 0
  const started = performance.now()
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < decisions) {
      const i = next++
      // A big bucket with a fast refill: every decision writes, none is denied.
      const t0 = performance.now()
      try {
        outcomes[await decide(redis, `bench:{${tag}}:${i % 64}`, 1e6, 1e6)]++
      } catch {
        outcomes.error++
      }
      ms.push(performance.now() - t0)
    }
  }))
  const seconds = (performance.now() - started) / 1000
  ms.sort((a, b) => a - b)
  return { p50: quantile(ms, 0.5), p99: quantile(ms, 0.99), perSecond: decisions / seconds, outcomes }
}

async function latencyTable (redis, title, tag, decisions) {
  const rows = []
  for (const concurrency of [1, CONCURRENCY]) {
    const runs = { script: [], 'script+WAIT': [] }
    for (let round = 0; round < ROUNDS; round++) {
      for (const variant of Object.keys(runs)) runs[variant].push(await latency(redis, variant, concurrency, tag, decisions))
    }
    for (const [variant, results] of Object.entries(runs)) {
      const outcomes = results.at(-1).outcomes
      rows.push(`| ${variant} | ${concurrency} | ${median(results.map((r) => r.p50)).toFixed(3)} | ${median(results.map((r) => r.p99)).toFixed(3)} | ` +
        `${median(results.map((r) => r.perSecond)).toFixed(0)} | ${outcomes.admitted}/${outcomes.failed}/${outcomes.error} |`)
    }
  }
  console.log(`\n### ${title}\n`)
  console.log('| variant | in flight | p50 ms | p99 ms | decisions/s | last round: admitted/503/error |')
  console.log('| --- | ---: | ---: | ---: | ---: | --- |')
  for (const row of rows) console.log(row)
}

// ------------------------------------------------------------ loss in a crash

async function crash (cluster, variant, run) {
  const key = `bench:{crash-${variant}-${run}}:pay`
  const master = await cluster.masterFor(key)
  const replica = await cluster.replicaOf(master)
  const before = await client(cluster)
  await before.tollgate(...args(`bench:{crash-${variant}-${run}}:warm`, 1, 1))
  replica.pause()
  // More than the socket buffers can hold (kernel maximums), so what
  // follows waits in the master's memory, out of the replica's reach.
  const max = (file) => Number(readFileSync(file, 'utf8').trim().split(/\s+/).at(-1))
  const mib = Math.ceil((max('/proc/sys/net/ipv4/tcp_rmem') + max('/proc/sys/net/ipv4/tcp_wmem')) / (1 << 20)) + 8
  const chunk = 'x'.repeat(1 << 20)
  for (let i = 0; i < mib; i++) await command(master.port, 'SET', `bench:{crash-${variant}-${run}}:pad${i}`, chunk)
  const first = { admitted: 0, denied: 0, failed: 0 }
  for (let i = 0; i < 6; i++) first[await VARIANTS[variant](before, key, 5, 1e-6)]++
  before.disconnect()
  await master.kill()
  replica.resume()
  await command(replica.port, 'CLUSTER', 'FAILOVER', 'TAKEOVER')
  // Until the promotion reaches the node asked, the slot may have no master.
  while (await cluster.masterFor(key).catch(() => undefined) !== replica) await sleep(50)
  const after = await client(cluster)
  let extra = 0
  while (await VARIANTS.script(after, key, 5, 1e-6) === 'admitted' && extra < 20) extra++
  after.disconnect()
  await master.start()
  await cluster.waitHealthy()
  return { first, extra }
}

// ------------------------------------------------------------ main

const cluster = await startCluster()
process.on('exit', () => { for (const n of cluster.nodes) try { n.child.kill('SIGKILL') } catch {} })
try {
  console.log(`# WAIT after the script: ${new Date().toISOString()}, node ${process.version}, ` +
    `${availableParallelism()} cores, load ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
  console.log(`median of ${ROUNDS} rounds, WAIT 1 ${WAIT_MS}; local cluster 3 masters x 1 replica, hz 10 (the default)`)
  const redis = await client(cluster)
  await redis.tollgate(...args('bench:{healthy}:warm', 1, 1))
  await latencyTable(redis, `Healthy cluster, ${DECISIONS} decisions per cell`, 'healthy', DECISIONS)

  const master = await cluster.masterFor('bench:{paused}:0')
  const replica = await cluster.replicaOf(master)
  replica.pause()
  try {
    await latencyTable(redis, `Replica of the slot's master paused (SIGSTOP), ${PAUSED_DECISIONS} decisions per cell`, 'paused', PAUSED_DECISIONS)
    // An idle master wakes for WAIT's timeout only on its cron tick, 1000 / hz ms.
    await command(master.port, 'CONFIG', 'SET', 'hz', '100')
    await latencyTable(redis, `The same, master at hz 100`, 'paused', PAUSED_DECISIONS)
    await command(master.port, 'CONFIG', 'SET', 'hz', '10')
  } finally {
    replica.resume()
  }
  redis.disconnect()
  await cluster.waitHealthy()

  console.log('\n### Crash with the replica lagging (capacity 5, no refill)\n')
  console.log('| variant | run | before the crash: admitted/denied/503 | admitted again after the failover | total admitted |')
  console.log('| --- | ---: | --- | ---: | ---: |')
  for (let run = 1; run <= CRASHES; run++) {
    for (const variant of Object.keys(VARIANTS)) {
      const { first, extra } = await crash(cluster, variant, run)
      console.log(`| ${variant} | ${run} | ${first.admitted}/${first.denied}/${first.failed} | ${extra} | ${first.admitted + extra} |`)
    }
  }
} finally {
  await cluster.stop()
}
