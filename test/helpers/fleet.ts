// A fleet of app servers in separate processes (test/helpers/fleet-server.ts,
// forked with this process's loaders, so they run lib/ from source), and a
// load driver that spreads one client's requests over them.

import { fork } from 'node:child_process'
import { Agent, request, type IncomingHttpHeaders } from 'node:http'
import type { ClusterOptions } from 'ioredis'
import type { TeardownTarget } from './redis.js'

const START_TIMEOUT_MS = 60_000
const STOP_GRACE_MS = 5_000

/** Where one app server finds its Redis. */
export interface StoreConfig {
  /** a single Redis: redis://host:port */
  url?: string
  /** or a Cluster's startup nodes */
  cluster?: Array<{ host: string, port: number }>
  /** Cluster options (JSON only: no functions) */
  clusterOptions?: ClusterOptions
  /** a client family of test/helpers/clients.ts by its label (default: ioredis, with the options above) */
  family?: string
  /** this client runs the deliberately broken script that trusts the app's clock (naive.ts) */
  trustAppClock?: boolean
}

/** What one app server process runs; JSON, passed in its environment. */
export interface FleetServerConfig {
  /** shown in replies and reports */
  name: string
  /**
   * One limited route per store, `GET /<label>/hit`, each with its own
   * client and tollgate instance (so one process can serve a fleet on a
   * single Redis and one on a Cluster, and is started once for both)
   */
  stores: Record<string, StoreConfig>
  prefix: string
  bucket: string
  capacity: number
  refillPerSecond: number
  failureMode: 'open' | 'closed'
  /** store deadline, ms */
  timeout: number
  /** moves Date and performance.now this many ms ahead in the server process */
  clockSkewMs?: number
  /** the app: Fastify with the plugin (default), Express with tollgate/express, Hono with tollgate/hono, or Nest on either platform with tollgate/nest */
  framework?: 'fastify' | 'express' | 'hono' | 'nest-express' | 'nest-fastify'
  /** the plugin's `denialCache` (default: the plugin's default) */
  denialCache?: { maxKeys?: number, maxAgeMs?: number } | false
  /** Fastify only: GET /<label>/locked, on bucket `<bucket>:locked`, with this lockout */
  lockout?: { after: number, withinMs: number, forMs: number }
  /** Fastify only: GET /<label>/leased, on bucket `<bucket>:leased`, with this lease */
  lease?: { tokens: number, maxAgeMs: number }
  /**
   * Fastify only: GET /<label>/slot, on bucket `<bucket>:slots`, with this
   * concurrency limit, and GET /<label>/naive-slot, the same limit taken by
   * test/helpers/naive.ts naiveAcquire (ioredis stores only); both hold
   * `x-hold-ms` and answer `inFlight`, the requests in their handler across
   * the fleet at the moment this one entered (a Redis counter).
   */
  concurrency?: { max: number, leaseMs?: number }
}

export interface Reply {
  status: number
  headers: IncomingHttpHeaders
  body: string
  /** performance.now() in this process when the request was sent and when its answer had arrived */
  sentAt: number
  doneAt: number
}

export interface FleetServer {
  readonly name: string
  readonly pid: number
  readonly port: number
  get (path: string, headers?: Record<string, string>): Promise<Reply>
  /** Asks the process to close its app and client; SIGKILL after a grace period. Idempotent. */
  stop (): Promise<void>
}

/** Forks one app server and resolves once it listens; stopped at the end of `t`. */
export async function startFleetServer (t: TeardownTarget, config: FleetServerConfig): Promise<FleetServer> {
  const child = fork(new URL('./fleet-server.ts', import.meta.url), {
    execArgv: process.execArgv,
    env: { ...process.env, TOLLGATE_FLEET: JSON.stringify(config) },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve()
    else child.once('exit', () => resolve())
  })
  const kill = (): void => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') }
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => {
      kill()
      reject(new Error(`app server ${config.name} did not listen within ${START_TIMEOUT_MS} ms`))
    }, START_TIMEOUT_MS)
    child.once('message', (message) => {
      clearTimeout(timer)
      resolve((message as { port: number }).port)
    })
    child.once('exit', (code, signal) => {
      clearTimeout(timer)
      reject(new Error(`app server ${config.name} exited before listening (code ${String(code)}, signal ${String(signal)})`))
    })
  })
  const agent = new Agent({ keepAlive: true, maxSockets: 16 })
  let stopping: Promise<void> | undefined
  const server: FleetServer = {
    name: config.name,
    pid: child.pid ?? -1,
    port,
    get: (path, headers) => get(agent, port, path, headers),
    stop () {
      stopping ??= (async () => {
        agent.destroy()
        if (child.connected) child.send('stop')
        const timer = setTimeout(kill, STOP_GRACE_MS)
        await exited
        clearTimeout(timer)
      })()
      return stopping
    }
  }
  t.teardown(() => server.stop())
  return server
}

/** Starts `count` app servers in parallel, named `<name>-1` .. `<name>-<count>`. */
export async function startFleet (t: TeardownTarget, count: number, config: FleetServerConfig): Promise<FleetServer[]> {
  return await Promise.all(Array.from({ length: count }, (_, i) =>
    startFleetServer(t, { ...config, name: `${config.name}-${i + 1}` })))
}

function get (agent: Agent, port: number, path: string, headers: Record<string, string> = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const sentAt = performance.now()
    const req = request({ host: '127.0.0.1', port, path, agent, headers }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => resolve({
        status: res.statusCode ?? 0,
        headers: res.headers,
        body: Buffer.concat(chunks).toString(),
        sentAt,
        doneAt: performance.now()
      }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

export interface DriveOptions {
  /** how long new requests are sent, ms */
  ms: number
  /** requests in flight per server at any time (closed loop) */
  concurrency: number
  path: string
  headers?: Record<string, string>
}

export interface ServerTally {
  name: string
  statuses: Record<number, number>
}

export interface DriveResult {
  servers: ServerTally[]
  /** status -> count over all servers */
  statuses: Record<number, number>
  /** first request sent to last answer received, ms */
  elapsedMs: number
  /** the first request's round trip, ms */
  firstLatencyMs: number
  /** the slowest round trip, ms */
  maxLatencyMs: number
  requests: number
}

/**
 * Sends `path` to every server for `ms` milliseconds, `concurrency`
 * requests in flight per server (each worker sends its next request when
 * the previous one is answered), and counts the answers.
 */
export async function drive (servers: readonly FleetServer[], options: DriveOptions): Promise<DriveResult> {
  const tallies: ServerTally[] = servers.map((s) => ({ name: s.name, statuses: {} }))
  const statuses: Record<number, number> = {}
  let first: Reply | undefined
  let lastDone = 0
  let maxLatencyMs = 0
  let requests = 0
  const started = performance.now()
  const end = started + options.ms
  await Promise.all(servers.flatMap((server, index) => Array.from({ length: options.concurrency }, async () => {
    const tally = tallies[index] as ServerTally
    while (performance.now() < end) {
      const reply = await server.get(options.path, options.headers)
      requests++
      if (first === undefined || reply.sentAt < first.sentAt) first = reply
      lastDone = Math.max(lastDone, reply.doneAt)
      maxLatencyMs = Math.max(maxLatencyMs, reply.doneAt - reply.sentAt)
      tally.statuses[reply.status] = (tally.statuses[reply.status] ?? 0) + 1
      statuses[reply.status] = (statuses[reply.status] ?? 0) + 1
    }
  })))
  const opening = first as Reply
  return {
    servers: tallies,
    statuses,
    elapsedMs: lastDone - opening.sentAt,
    firstLatencyMs: opening.doneAt - opening.sentAt,
    maxLatencyMs,
    requests
  }
}
