// Batched decisions on a Redis Cluster, without HTTP: a turn's decisions
// are grouped by slot (one script call covers one slot), so how much a
// Cluster batches depends on how many of a turn's clients share a slot.
// Starts one redis-server and a local Cluster of 3 masters (redis-server
// and redis-cli from PATH), then, for 64 and for 10,000 clients with 32
// decisions in flight, measures Node CPU per decision and script calls per
// decision (EVALSHA + EVAL over every node's INFO commandstats) of:
// tollgate batched and with `batch: false`, each on the one Redis and on the
// Cluster, and @fastify/rate-limit's Redis store (store.incr) on each. The
// contenders take turns round by round; medians of the rounds.
//
//   npm run build && node bench/cluster.mjs
//
// Environment: ROUNDS (default 5), CALLS (decisions per round, 20000),
// IN_FLIGHT (32).

import { execFile } from 'node:child_process'
import { createRequire } from 'node:module'
import { setTimeout as sleep } from 'node:timers/promises'
import { Cluster, Redis } from 'ioredis'
import { createLimiter } from 'tollgate'
import { startRedis } from './redis.mjs'
import { commandStats, statsDelta } from './stats.mjs'

const require = createRequire(import.meta.url)
const RateLimitRedisStore = require('@fastify/rate-limit/store/RedisStore.js')

const ROUNDS = Number(process.env.ROUNDS ?? 5)
const CALLS = Number(process.env.CALLS ?? 20_000)
const IN_FLIGHT = Number(process.env.IN_FLIGHT ?? 32)

const single = await startRedis()
const nodes = await Promise.all([1, 2, 3].map(() => startRedis(['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf'])))
const servers = [single, ...nodes]
try {
  await new Promise((resolve, reject) => {
    execFile('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `${n.host}:${n.port}`), '--cluster-replicas', '0', '--cluster-yes'],
      { timeout: 30_000 }, (err, stdout, stderr) => err === null ? resolve() : reject(new Error(`redis-cli --cluster create failed: ${stderr || stdout}`)))
  })
  const admins = nodes.map((n) => new Redis({ host: n.host, port: n.port }))
  for (const admin of admins) {
    while (!(await admin.cluster('INFO')).includes('cluster_state:ok')) await sleep(50)
  }
  const singleAdmin = new Redis({ host: single.host, port: single.port })
  const redis = new Redis({ host: single.host, port: single.port })
  const cluster = new Cluster(nodes.map((n) => ({ host: n.host, port: n.port })))
  await new Promise((resolve) => cluster.once('ready', resolve))
  const version = /redis_version:(\S+)/.exec(await singleAdmin.info('server'))?.[1] ?? 'unknown'

  const policy = { bucket: 'bench', capacity: 1e12, refillPerSecond: 1e6, failureMode: 'open' }
  const contenders = []
  for (const [where, client, admin] of [['one Redis', redis, [singleAdmin]], ['Cluster of 3', cluster, admins]]) {
    for (const [how, options] of [['batched', {}], ['batch: false', { batch: false }]]) {
      const limiter = createLimiter({ redis: client, prefix: `bench-cluster-${contenders.length}`, timeout: 1000, denialCache: false, ...options })
      await limiter.ready
      contenders.push({ label: `tollgate ${how}, ${where}`, admin, decide: (id) => limiter.consume(id, policy).then((d) => d.source) })
    }
    const frl = new RateLimitRedisStore(false, false, client, `bench-frl-${contenders.length}-`)
    contenders.push({
      label: `@fastify/rate-limit Redis store, ${where}`,
      admin,
      decide: (id) => new Promise((resolve, reject) => {
        frl.incr(id, (err) => { err === null ? resolve('store') : reject(err) }, 60_000, 1e12)
      })
    })
  }

  const stats = async (admin) => await Promise.all(admin.map((a) => commandStats(a)))
  async function round (c, clients, calls) {
    let next = 0
    const sources = {}
    const worker = async () => {
      while (next < calls) {
        const source = await c.decide(`c${next++ % clients}`)
        sources[source] = (sources[source] ?? 0) + 1
      }
    }
    const before = await stats(c.admin)
    const cpu = process.cpuUsage()
    await Promise.all(Array.from({ length: IN_FLIGHT }, worker))
    const used = process.cpuUsage(cpu)
    const after = await stats(c.admin)
    const scriptCalls = before.reduce((n, b, i) => n + statsDelta(b, after[i]).scriptCalls, 0)
    return { cpu: (used.user + used.system) / calls, calls: scriptCalls / calls, sources }
  }
  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b)
    const mid = Math.floor(s.length / 2)
    return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2
  }

  const out = [`Redis ${version}, Node ${process.version}; ${ROUNDS} rounds, contenders interleaved; ${CALLS} decisions per round, ${IN_FLIGHT} in flight, every decision allowed.`, '']
  out.push('| clients | contender | Node CPU µs/decision | script calls/decision | sources |', '| ---: | --- | ---: | ---: | --- |')
  for (const clients of [64, 10_000]) {
    for (const c of contenders) await round(c, clients, 2000) // warm-up
    const results = contenders.map(() => [])
    for (let r = 0; r < ROUNDS; r++) {
      const order = contenders.map((_, i) => i)
      if (r % 2 === 1) order.reverse()
      for (const i of order) results[i].push(await round(contenders[i], clients, CALLS))
    }
    contenders.forEach((c, i) => {
      const sources = {}
      for (const x of results[i]) for (const [k, v] of Object.entries(x.sources)) sources[k] = (sources[k] ?? 0) + v
      out.push(`| ${clients} | ${c.label} | ${median(results[i].map((x) => x.cpu)).toFixed(2)} | ${median(results[i].map((x) => x.calls)).toFixed(3)} | ${JSON.stringify(sources)} |`)
    })
  }
  process.stdout.write(out.join('\n') + '\n')
  redis.disconnect()
  cluster.disconnect()
  singleAdmin.disconnect()
  for (const a of admins) a.disconnect()
} finally {
  await Promise.all(servers.map((s) => s.stop()))
}
