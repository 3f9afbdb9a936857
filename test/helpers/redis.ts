// Real Redis processes for tests: the shared Redis (`redisUrl`), throwaway
// `redis-server` processes with crash controls (`startRedisServer`), and a tiny
// RESP client (`redisCommand`) for probing servers without ioredis's reconnects.

import { spawn, type ChildProcess } from 'node:child_process'
import { accessSync, constants, existsSync, rmSync } from 'node:fs'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { connect, createServer, Socket } from 'node:net'
import { homedir, setPriority, tmpdir, userInfo } from 'node:os'
import { delimiter, join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'

const HOST = '127.0.0.1'
const START_TIMEOUT_MS = 15_000
const STOP_GRACE_MS = 1_000
const DOCKER_PROBE_TIMEOUT_MS = 5_000

/** Anything with tap's `t.teardown()`: a tap Test, or the root `t`. */
export interface TeardownTarget {
  teardown(fn: () => unknown): void
}

export interface RedisServer {
  readonly host: string
  readonly port: number
  /** `redis://127.0.0.1:<port>` */
  readonly url: string
  /** pid of the current (or last) redis-server process */
  readonly pid: number
  /** the server's private temp dir (`--dir`), removed by stop() */
  readonly dir: string
  readonly running: boolean
  readonly paused: boolean
  /** SIGSTOP: connections are still accepted by the kernel, nothing is answered. */
  pause(): void
  /** SIGCONT; a no-op when the process is not running. */
  resume(): void
  /** SIGKILL, resolves once the process has exited. The dir is kept for restart(). */
  kill(): Promise<void>
  /** Start again on the same port and dir (killing first if still running); resolves once it answers. */
  restart(): Promise<void>
  /** Resume if paused, SIGTERM (SIGKILL after a grace period), remove the dir. Idempotent. */
  stop(): Promise<void>
}

export interface StartRedisServerOptions {
  /** fixed port; default: a free loopback port */
  port?: number
  /** extra redis-server arguments, e.g. ['--maxmemory', '10mb'] */
  args?: string[]
}

// ---------------------------------------------------------------- binaries

const binaries = new Map<string, string>()

/** Absolute path of an executable on PATH, or a clear error saying how to get it. */
export function findBinary (name: string): string {
  const path = process.env.PATH ?? ''
  const key = `${path}\0${name}`
  const cached = binaries.get(key)
  if (cached !== undefined) return cached
  for (const dir of path.split(delimiter)) {
    if (dir === '') continue
    const candidate = join(dir, name)
    try {
      accessSync(candidate, constants.X_OK)
      binaries.set(key, candidate)
      return candidate
    } catch {
      // not here, keep looking
    }
  }
  throw new Error(
    `\`${name}\` was not found on PATH. Tests need a real Redis: install it ` +
    '(Debian/Ubuntu: `apt-get install -y redis-server redis-tools`), ' +
    'or set REDIS_URL to an existing Redis for the non-cluster tests.'
  )
}

// ---------------------------------------------------------------- ports

async function portIsFree (port: number): Promise<boolean> {
  return await new Promise(resolve => {
    const srv = createServer()
    srv.unref()
    srv.once('error', () => resolve(false))
    srv.listen(port, HOST, () => srv.close(() => resolve(true)))
  })
}

/**
 * A loopback port that was free a moment ago. With `clusterBus`, port + 10000
 * (Redis Cluster's bus port) is free and in range as well. Another process can
 * still take it before we bind, so callers retry on EADDRINUSE.
 */
export async function freePort (opts: { clusterBus?: boolean } = {}): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = await new Promise<number>((resolve, reject) => {
      const srv = createServer()
      srv.unref()
      srv.once('error', reject)
      srv.listen(0, HOST, () => {
        const address = srv.address()
        const found = typeof address === 'object' && address !== null ? address.port : 0
        srv.close(() => resolve(found))
      })
    })
    if (opts.clusterBus !== true) return port
    if (port + 10_000 <= 65_535 && await portIsFree(port + 10_000)) return port
  }
  throw new Error('could not find a free port pair for a cluster node')
}

/**
 * A loopback port where no Redis is, for the tests of a Redis that is not
 * there. Not one from freePort(): a port a test leaves unused there is free
 * for another test file's redis-server a moment later, and a client that
 * retries (or connects lazily) then reaches that server and decides on it.
 * Port 1 is below the range the OS hands out for port 0, where every server
 * of the suite listens (and its cluster bus port, 10 000 above), and is not
 * a service of this machine's.
 */
export const NO_REDIS_PORT = 1

// ---------------------------------------------------------------- RESP

export type RespValue = string | number | null | RespError | RespValue[]

/** An error reply (`-ERR ...`) from Redis. */
export class RespError extends Error {
  override name = 'RespError'
}

interface Parsed { value: RespValue, next: number }

function parseReply (buf: Buffer, pos: number): Parsed | undefined {
  const eol = buf.indexOf('\r\n', pos)
  if (eol === -1) return undefined
  const type = buf.toString('latin1', pos, pos + 1)
  const line = buf.toString('utf8', pos + 1, eol)
  const after = eol + 2
  switch (type) {
    case '+': return { value: line, next: after }
    case '-': return { value: new RespError(line), next: after }
    case ':': return { value: Number(line), next: after }
    case '$': {
      const len = Number(line)
      if (len < 0) return { value: null, next: after }
      if (buf.length < after + len + 2) return undefined
      return { value: buf.toString('utf8', after, after + len), next: after + len + 2 }
    }
    case '*': {
      const count = Number(line)
      if (count < 0) return { value: null, next: after }
      const items: RespValue[] = []
      let next = after
      for (let i = 0; i < count; i++) {
        const item = parseReply(buf, next)
        if (item === undefined) return undefined
        items.push(item.value)
        next = item.next
      }
      return { value: items, next }
    }
    default:
      throw new Error(`unexpected RESP reply type ${JSON.stringify(type)}`)
  }
}

function encodeCommand (args: ReadonlyArray<string | number>): string {
  let out = `*${args.length}\r\n`
  for (const arg of args) {
    const s = String(arg)
    out += `$${Buffer.byteLength(s)}\r\n${s}\r\n`
  }
  return out
}

/**
 * Send one command on a fresh connection and return the reply. Rejects with a
 * RespError on an error reply, and with a timeout error when nothing complete
 * arrives in `timeoutMs` (e.g. the server is paused).
 */
export async function redisCommand (
  target: { host?: string, port: number },
  args: ReadonlyArray<string | number>,
  opts: { timeoutMs?: number } = {}
): Promise<RespValue> {
  const timeoutMs = opts.timeoutMs ?? 2_000
  const host = target.host ?? HOST
  return await new Promise<RespValue>((resolve, reject) => {
    let buf = Buffer.alloc(0)
    let settled = false
    const socket = connect({ host, port: target.port })
    const finish = (err: Error | undefined, value?: RespValue): void => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      socket.destroy()
      if (err !== undefined) reject(err)
      else resolve(value ?? null)
    }
    const timer = setTimeout(() => {
      finish(new Error(`${host}:${target.port} did not answer ${String(args[0])} within ${timeoutMs} ms`))
    }, timeoutMs)
    socket.once('connect', () => socket.write(encodeCommand(args)))
    socket.on('data', chunk => {
      buf = Buffer.concat([buf, chunk])
      let parsed: Parsed | undefined
      try {
        parsed = parseReply(buf, 0)
      } catch (err) {
        finish(err instanceof Error ? err : new Error(String(err)))
        return
      }
      if (parsed === undefined) return
      if (parsed.value instanceof RespError) finish(parsed.value)
      else finish(undefined, parsed.value)
    })
    socket.once('error', err => finish(err))
    socket.once('close', () => finish(new Error(`${host}:${target.port} closed the connection before replying`)))
  })
}

/** One `field:value` line of an INFO / CLUSTER INFO reply. */
export function infoField (info: RespValue, field: string): string | undefined {
  if (typeof info !== 'string') return undefined
  for (const line of info.split('\r\n')) {
    if (line.startsWith(`${field}:`)) return line.slice(field.length + 1)
  }
  return undefined
}

// ---------------------------------------------------------------- processes

interface Proc {
  child: ChildProcess
  pid: number
  /** resolves when the process is gone (exit or spawn error) */
  exited: Promise<void>
  done: boolean
  watchdog: ChildProcess
  stderr: string
}

const live = new Set<LocalRedisServer>()
let exitHookInstalled = false

function installExitHook (): void {
  if (exitHookInstalled) return
  exitHookInstalled = true
  // Synchronous last resort for servers a test did not stop. The per-process
  // watchdog (below) covers deaths by signal, where 'exit' never fires.
  process.on('exit', () => {
    for (const server of live) server.destroySync()
  })
}

function unrefStream (stream: unknown): void {
  if (stream instanceof Socket) stream.unref()
}

function signal (pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig)
  } catch {
    // already gone
  }
}

function spawnProc (bin: string, args: string[], dir: string): Proc {
  const child = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] })
  const pid = child.pid
  if (pid === undefined) {
    child.on('error', () => {})
    throw new Error(`could not spawn ${bin}`)
  }
  // In production Redis has a host of its own and never waits for a core
  // behind the app. Here it shares 2 cores with three test files, their
  // apps and their compilers, and a call that missed its 10 ms deadline
  // only because Redis was not scheduled failed a test that was not about
  // deadlines. Where this process may (as root, as in CI), Redis runs at a
  // higher scheduling priority; elsewhere at the default. A paused
  // (SIGSTOP) or killed Redis, the fault tests' way, is unchanged by it.
  try {
    setPriority(pid, -10)
  } catch {
    // not permitted: the default priority
  }
  // `sh` blocks on a pipe only this process writes to. When this process dies
  // for any reason (even SIGKILL or a tap timeout), the pipe closes, `read`
  // returns and the redis-server is killed (and its dir removed), so nothing
  // outlives the test.
  const script = 'read _ ; kill -9 "$1" 2>/dev/null ; rm -rf "$2"'
  const watchdog = spawn('sh', ['-c', script, 'redis-watchdog', String(pid), dir], {
    stdio: ['pipe', 'ignore', 'ignore']
  })
  watchdog.on('error', () => {})
  watchdog.stdin?.on('error', () => {})
  const proc: Proc = { child, pid, exited: Promise.resolve(), done: false, watchdog, stderr: '' }
  proc.exited = new Promise<void>(resolve => {
    const gone = (): void => {
      proc.done = true
      watchdog.kill('SIGKILL')
      resolve()
    }
    child.once('exit', gone)
    child.once('error', gone)
  })
  child.stderr?.on('data', (chunk: Buffer) => {
    proc.stderr = (proc.stderr + chunk.toString()).slice(-4_000)
  })
  // A forgotten server must not keep the test process alive; the exit hook kills it.
  child.unref()
  unrefStream(child.stderr)
  watchdog.unref()
  unrefStream(watchdog.stdin)
  return proc
}

/**
 * Await a child's exit with a ref'd timer running: the children are unref'd, so
 * without it Node could see an empty event loop and exit mid-await.
 */
async function awaitExit (proc: Proc): Promise<void> {
  const keepalive = setInterval(() => {}, 1_000)
  try {
    await proc.exited
  } finally {
    clearInterval(keepalive)
  }
}

/** Resolves true if `promise` settles within `ms`, false otherwise; leaves no timer behind. */
async function within (promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const expired = new Promise<boolean>(resolve => { timer = setTimeout(() => resolve(false), ms) })
  try {
    return await Promise.race([promise.then(() => true), expired])
  } finally {
    clearTimeout(timer)
  }
}

class StartError extends Error {
  override name = 'RedisServerStartError'
  readonly addressInUse: boolean
  constructor (message: string, addressInUse: boolean) {
    super(message)
    this.addressInUse = addressInUse
  }
}

class LocalRedisServer implements RedisServer {
  readonly host = HOST
  #proc: Proc | undefined
  #paused = false
  #stopping: Promise<void> | undefined

  readonly port: number
  readonly dir: string
  private readonly bin: string
  private readonly extraArgs: string[]

  constructor (port: number, dir: string, bin: string, extraArgs: string[]) {
    this.port = port
    this.dir = dir
    this.bin = bin
    this.extraArgs = extraArgs
  }

  get url (): string { return `redis://${HOST}:${this.port}` }
  get pid (): number { return this.#proc?.pid ?? -1 }
  get running (): boolean { return this.#proc !== undefined && !this.#proc.done }
  get paused (): boolean { return this.#paused && this.running }
  get logFile (): string { return join(this.dir, 'redis.log') }

  async launch (): Promise<void> {
    this.#assertUsable()
    installExitHook()
    live.add(this)
    const args = [
      '--port', String(this.port),
      '--bind', HOST,
      '--dir', this.dir,
      '--save', '',
      '--appendonly', 'no',
      '--logfile', this.logFile,
      ...this.extraArgs
    ]
    const proc = spawnProc(this.bin, args, this.dir)
    this.#proc = proc
    this.#paused = false
    const deadline = Date.now() + START_TIMEOUT_MS
    for (;;) {
      if (proc.done) throw await this.#startError(proc, 'exited during startup')
      try {
        // INFO rather than PING: the reply must come from our process, not from
        // some other server that grabbed the port first.
        const info = await redisCommand({ port: this.port }, ['INFO', 'server'], { timeoutMs: 1_000 })
        if (infoField(info, 'process_id') === String(proc.pid)) return
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) {
        signal(proc.pid, 'SIGKILL')
        await awaitExit(proc)
        throw await this.#startError(proc, `did not answer within ${START_TIMEOUT_MS} ms`)
      }
      await sleep(15)
    }
  }

  async #startError (proc: Proc, what: string): Promise<StartError> {
    const log = await readFile(this.logFile, 'utf8').catch(() => '')
    const tail = log.split('\n').slice(-15).join('\n')
    const inUse = /address already in use/i.test(log.slice(-2_000) + proc.stderr)
    return new StartError(
      `redis-server on port ${this.port} ${what} (exit code ${String(proc.child.exitCode)}, ` +
      `signal ${String(proc.child.signalCode)}).\nstderr: ${proc.stderr.trim()}\nlog tail:\n${tail}`,
      inUse
    )
  }

  #assertUsable (): void {
    if (this.#stopping !== undefined) throw new Error(`redis-server on port ${this.port} was stopped`)
  }

  #runningProc (): Proc {
    this.#assertUsable()
    const proc = this.#proc
    if (proc === undefined || proc.done) throw new Error(`redis-server on port ${this.port} is not running`)
    return proc
  }

  pause (): void {
    signal(this.#runningProc().pid, 'SIGSTOP')
    this.#paused = true
  }

  resume (): void {
    const proc = this.#proc
    if (proc !== undefined && !proc.done) signal(proc.pid, 'SIGCONT')
    this.#paused = false
  }

  async kill (): Promise<void> {
    const proc = this.#proc
    if (proc === undefined || proc.done) return
    signal(proc.pid, 'SIGKILL')
    await awaitExit(proc)
    this.#paused = false
  }

  async restart (): Promise<void> {
    this.#assertUsable()
    await this.kill()
    // The port was ours a moment ago; tolerate a brief EADDRINUSE window.
    for (let attempt = 1; ; attempt++) {
      try {
        await this.launch()
        return
      } catch (err) {
        if (!(err instanceof StartError && err.addressInUse) || attempt >= 20) throw err
        await sleep(100)
      }
    }
  }

  stop (): Promise<void> {
    this.#stopping ??= this.#stop()
    return this.#stopping
  }

  async #stop (): Promise<void> {
    const proc = this.#proc
    if (proc !== undefined && !proc.done) {
      if (this.#paused) signal(proc.pid, 'SIGCONT')
      this.#paused = false
      signal(proc.pid, 'SIGTERM')
      if (!await within(proc.exited, STOP_GRACE_MS)) {
        signal(proc.pid, 'SIGKILL')
        await awaitExit(proc)
      }
    }
    this.#paused = false
    live.delete(this)
    await rm(this.dir, { recursive: true, force: true })
  }

  /** Drop a server that never started, keeping its dir for the next attempt. */
  forget (): void {
    live.delete(this)
  }

  /** Used by the process 'exit' hook: no async work possible there. */
  destroySync (): void {
    const proc = this.#proc
    if (proc !== undefined && !proc.done) signal(proc.pid, 'SIGKILL')
    try {
      rmSync(this.dir, { recursive: true, force: true })
    } catch {
      // best effort
    }
  }
}

/**
 * Spawn a `redis-server` from PATH on a free loopback port (or `opts.port`) in a
 * fresh temp dir, with persistence off, and resolve once it answers.
 */
export async function startRedisServer (opts: StartRedisServerOptions = {}): Promise<RedisServer> {
  const bin = findBinary('redis-server')
  const args = opts.args ?? []
  const clusterBus = args.includes('--cluster-enabled')
  const dir = await mkdtemp(join(tmpdir(), 'tollgate-redis-'))
  for (let attempt = 1; ; attempt++) {
    const port = opts.port ?? await freePort({ clusterBus })
    const server = new LocalRedisServer(port, dir, bin, args)
    try {
      await server.launch()
      return server
    } catch (err) {
      await server.kill()
      server.forget()
      const retry = opts.port === undefined && err instanceof StartError && err.addressInUse && attempt < 5
      if (!retry) {
        await rm(dir, { recursive: true, force: true })
        throw err
      }
    }
  }
}

// ---------------------------------------------------------------- shared Redis

let dockerAnswer: Promise<boolean> | undefined

function mayHaveDocker (): boolean {
  if (process.platform === 'win32') return true
  if (process.env.DOCKER_HOST !== undefined) return true
  if (Object.keys(process.env).some(k => k.startsWith('TESTCONTAINERS_'))) return true
  const home = homedir()
  const candidates = [
    join(home, '.testcontainers.properties'),
    '/var/run/docker.sock',
    join(home, '.docker', 'run', 'docker.sock'),
    join(home, '.docker', 'desktop', 'docker.sock'),
    join('/run', 'user', String(userInfo().uid), 'docker.sock')
  ]
  const xdg = process.env.XDG_RUNTIME_DIR
  if (xdg !== undefined) candidates.push(join(xdg, 'docker.sock'))
  return candidates.some(p => existsSync(p))
}

async function probeDocker (): Promise<boolean> {
  // Without any of the sockets or settings testcontainers looks for, it cannot
  // find an engine either: skip loading it (saves ~0.5 s per test file).
  if (!mayHaveDocker()) return false
  try {
    const { getContainerRuntimeClient } = await import('testcontainers')
    const probe = getContainerRuntimeClient().then(() => true, () => false)
    let answered = false
    const ok = await within(probe.then(v => { answered = v }), DOCKER_PROBE_TIMEOUT_MS)
    return ok && answered
  } catch {
    return false
  }
}

/** Whether a Docker engine answers; asked once per process, bounded by a timeout. */
export function dockerAvailable (): Promise<boolean> {
  dockerAnswer ??= probeDocker()
  return dockerAnswer
}

interface SharedRedis { url: string, stop: () => Promise<void> }

let shared: Promise<SharedRedis> | undefined
let sharedUsers = 0

async function startShared (): Promise<SharedRedis> {
  if (await dockerAvailable()) {
    const { GenericContainer, Wait } = await import('testcontainers')
    const container = await new GenericContainer('redis:7')
      .withCommand(['redis-server', '--save', '', '--appendonly', 'no'])
      .withExposedPorts(6379)
      .withWaitStrategy(Wait.forLogMessage('Ready to accept connections'))
      .start()
    return {
      url: `redis://${container.getHost()}:${container.getMappedPort(6379)}`,
      stop: async () => { await container.stop() }
    }
  }
  const server = await startRedisServer()
  return { url: server.url, stop: async () => { await server.stop() } }
}

async function releaseShared (): Promise<void> {
  sharedUsers--
  const current = shared
  if (sharedUsers > 0 || current === undefined) return
  shared = undefined
  const redis = await current.catch(() => undefined)
  await redis?.stop()
}

/**
 * URL of the Redis for ordinary tests: REDIS_URL when set; otherwise a redis:7
 * container when a Docker engine answers; otherwise a redis-server from PATH.
 * One instance per test process, shared by every caller and stopped after the
 * last caller's test ends, so call it from the root `t` (before declaring
 * subtests) or from each subtest. Test files run in parallel against it:
 * use unique keys, never FLUSHALL.
 */
export async function redisUrl (t: TeardownTarget): Promise<string> {
  const fromEnv = process.env.REDIS_URL
  if (fromEnv !== undefined && fromEnv !== '') return fromEnv
  sharedUsers++
  t.teardown(releaseShared)
  shared ??= startShared()
  return (await shared).url
}
