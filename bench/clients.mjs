// CPU per decision and Redis calls per decision of the core limiter, for
// every client family tollgate takes, side by side in one run on one
// throwaway redis-server: rounds of `limiter.consume` calls (CALLS per
// round, CONCURRENCY in flight) through each client, the clients
// interleaved round by round (the order reversed every other round) so
// that a change in the machine's load hits them alike. CPU is
// process.cpuUsage() (user + system) per call, the median over the
// rounds, in µs; it includes the client's own work (GLIDE's native core
// runs in threads of this process, so it is counted too). Redis calls and
// commands are INFO commandstats deltas over the measured rounds (INFO
// itself left out): the calls are the EVALSHA/EVAL round trips, the
// commands add those the script runs (TIME, GET, SET).
//
//   npm run build && node bench/clients.mjs
//
// Environment: ROUNDS (default 8), CALLS (20000), CONCURRENCY (32),
// TIMEOUT (the limiter's deadline, ms, default 1000: every measured
// decision is Redis's; the sources printed show it).

import { readFile } from 'node:fs/promises'
import { GlideClient } from '@valkey/valkey-glide'
import { Redis as IoRedis } from 'ioredis'
import { Redis as Valkey } from 'iovalkey'
import { createClient } from 'redis'
import * as redis4 from 'redis4'
import * as redis5 from 'redis5'
import { createLimiter } from '../dist/index.js'
import { startRedis } from './redis.mjs'
import { commandStats, statsDelta } from './stats.mjs'

const ROUNDS = Number(process.env.ROUNDS ?? 8)
const CALLS = Number(process.env.CALLS ?? 20_000)
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 32)
const TIMEOUT = Number(process.env.TIMEOUT ?? 1000)

const server = await startRedis()
const url = `redis://${server.host}:${server.port}`
const admin = new IoRedis(url)
const policy = { bucket: 'bench', capacity: 1e12, refillPerSecond: 1e6, failureMode: 'open' }

const makers = [
  ['ioredis', async () => { const c = new IoRedis(url); await c.ping(); return { client: c, close: () => c.disconnect() } }],
  ['iovalkey', async () => { const c = new Valkey(url); await c.ping(); return { client: c, close: () => c.disconnect() } }],
  ['node-redis 6 (RESP3)', async () => { const c = createClient({ url, RESP: 3 }); await c.connect(); return { client: c, close: () => c.destroy() } }],
  ['node-redis 6 (RESP2)', async () => { const c = createClient({ url, RESP: 2 }); await c.connect(); return { client: c, close: () => c.destroy() } }],
  ['node-redis 5', async () => { const c = redis5.createClient({ url }); await c.connect(); return { client: c, close: () => c.destroy() } }],
  ['node-redis 4', async () => { const c = redis4.createClient({ url }); await c.connect(); return { client: c, close: () => { c.disconnect().catch(() => {}) } } }],
  ['GLIDE', async () => { const c = await GlideClient.createClient({ addresses: [{ host: server.host, port: server.port }] }); return { client: c, close: () => c.close() } }]
]

const builds = []
for (const [i, [label, make]] of makers.entries()) {
  const made = await make()
  builds.push({ label, made, limiter: createLimiter({ redis: made.client, prefix: `bench-clients-${i}`, timeout: TIMEOUT, denialCache: false }), perCall: [], sources: {}, calls: 0, scriptCalls: 0, decisions: 0 })
}

async function round (build) {
  let next = 0
  const worker = async () => {
    while (next < CALLS) {
      const n = next++
      const decision = await build.limiter.consume(`c${n % 64}`, policy)
      build.sources[decision.source] = (build.sources[decision.source] ?? 0) + 1
    }
  }
  const before = process.cpuUsage()
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  const used = process.cpuUsage(before)
  return (used.user + used.system) / CALLS
}

async function measured (build) {
  const before = await commandStats(admin)
  build.perCall.push(await round(build))
  const delta = statsDelta(before, await commandStats(admin))
  build.calls += delta.calls
  build.scriptCalls += delta.scriptCalls
  build.decisions += CALLS
}

try {
  for (const build of builds) await round(build) // warm-up: JIT, script load, connections
  for (const build of builds) build.sources = {}
  for (let r = 0; r < ROUNDS; r++) {
    for (const build of (r % 2 === 0 ? builds : [...builds].reverse())) await measured(build)
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
  const versions = {
    ioredis: (await import('ioredis/package.json', { with: { type: 'json' } })).default.version,
    iovalkey: (await import('iovalkey/package.json', { with: { type: 'json' } })).default.version,
    redis: (await import('redis/package.json', { with: { type: 'json' } })).default.version,
    redis5: (await import('redis5/package.json', { with: { type: 'json' } })).default.version,
    redis4: (await import('redis4/package.json', { with: { type: 'json' } })).default.version,
    glide: JSON.parse(await readFile(new URL('../node_modules/@valkey/valkey-glide/package.json', import.meta.url), 'utf8')).version
  }
  process.stdout.write(`Node ${process.version}; ${ROUNDS} rounds of ${CALLS} consumes per client, ${CONCURRENCY} in flight; ioredis ${versions.ioredis}, iovalkey ${versions.iovalkey}, redis ${versions.redis}, ${versions.redis5} and ${versions.redis4}, @valkey/valkey-glide ${versions.glide}\n\n`)
  process.stdout.write('| client | app CPU µs per decision (median) | rounds | Redis calls per decision (EVALSHA/EVAL) | Redis commands per decision, the script\'s own included | sources |\n| --- | ---: | --- | ---: | ---: | --- |\n')
  for (const b of builds) {
    process.stdout.write(`| ${b.label} | ${median(b.perCall).toFixed(2)} | ${b.perCall.map((x) => x.toFixed(1)).join(' ')} | ${(b.scriptCalls / b.decisions).toFixed(3)} | ${(b.calls / b.decisions).toFixed(3)} | ${JSON.stringify(b.sources)} |\n`)
  }
} finally {
  for (const b of builds) {
    await b.limiter.close()
    b.made.close()
  }
  admin.disconnect()
  await server.stop()
}
