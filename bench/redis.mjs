// A throwaway redis-server for the benchmark: a free loopback port, a private
// temp dir, no persistence. stop() ends it and removes the dir; stopSync() is
// the last resort for exit handlers; a small watchdog ends it if this process
// dies by a signal that leaves no chance to clean up. ownRedis() adds the
// ioredis clients a benchmark opens to it, ended with it.

import { spawn } from 'node:child_process'
import { rmSync } from 'node:fs'
import { mkdtemp } from 'node:fs/promises'
import { connect, createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'

const HOST = '127.0.0.1'
const START_TIMEOUT_MS = 10_000

async function freePort () {
  return await new Promise((resolve, reject) => {
    const srv = createServer()
    srv.once('error', reject)
    srv.listen(0, HOST, () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

/** Whether `port` is free on the loopback address now. */
async function isFree (port) {
  return await new Promise((resolve) => {
    const srv = createServer()
    srv.once('error', () => resolve(false))
    srv.listen(port, HOST, () => srv.close(() => resolve(true)))
  })
}

/** A free port whose cluster bus port (+10000) is free too. */
async function freeClusterPort () {
  for (;;) {
    const port = await freePort()
    if (port + 10_000 <= 65_535 && await isFree(port + 10_000)) return port
  }
}

/** Resolves true once the port answers PING with PONG, false if `child` exits first or time runs out. */
async function waitForPong (port, child) {
  const until = Date.now() + START_TIMEOUT_MS
  while (Date.now() < until && child.exitCode === null && child.signalCode === null) {
    const pong = await new Promise((resolve) => {
      const socket = connect({ host: HOST, port })
      let text = ''
      const done = (ok) => { socket.destroy(); resolve(ok) }
      socket.setTimeout(500, () => done(false))
      socket.once('error', () => done(false))
      socket.once('connect', () => socket.write('PING\r\n'))
      socket.on('data', (chunk) => {
        text += chunk.toString('latin1')
        if (text.includes('\r\n')) done(text.startsWith('+PONG'))
      })
    })
    if (pong) return true
    await sleep(50)
  }
  return false
}

/**
 * Starts redis-server from PATH, with `extra` arguments (with
 * `--cluster-enabled`, on a port whose bus port is free too). Retries on
 * another port if the one picked was taken in the meantime.
 * @param {string[]} [extra]
 * @returns {Promise<{ host: string, port: number, pid: number, stop: () => Promise<void>, stopSync: () => void }>}
 */
export async function startRedis (extra = []) {
  const dir = await mkdtemp(join(tmpdir(), 'tollgate-bench-'))
  let lastError = ''
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = extra.includes('--cluster-enabled') ? await freeClusterPort() : await freePort()
    const child = spawn('redis-server', [
      '--port', String(port), '--bind', HOST, '--dir', dir,
      '--save', '', '--appendonly', 'no', '--daemonize', 'no', '--loglevel', 'warning', ...extra
    ], { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    child.stderr.on('data', (chunk) => { stderr += chunk })
    const spawnFailed = new Promise((resolve) => child.once('error', (err) => resolve(err)))
    const ready = await Promise.race([waitForPong(port, child), spawnFailed])
    if (ready instanceof Error) {
      rmSync(dir, { recursive: true, force: true })
      throw new Error(`could not start redis-server (${ready.message}); install it, e.g. apt-get install -y redis-server`)
    }
    if (ready === true) return running(child, port, dir)
    lastError = stderr.trim()
    child.kill('SIGKILL')
  }
  rmSync(dir, { recursive: true, force: true })
  throw new Error(`redis-server did not start: ${lastError}`)
}

function running (child, port, dir) {
  // Ends redis-server and removes its dir should this process be killed outright.
  const watchdog = spawn('sh', ['-c',
    `while kill -0 ${process.pid} 2>/dev/null; do sleep 1; done; kill -9 ${child.pid} 2>/dev/null; rm -rf '${dir}'`
  ], { detached: true, stdio: 'ignore' })
  watchdog.unref()
  const exited = new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve()
    else child.once('exit', () => resolve())
  })
  let stopped = false
  const finish = () => {
    stopped = true
    try { watchdog.kill('SIGKILL') } catch {}
    rmSync(dir, { recursive: true, force: true })
  }
  return {
    host: HOST,
    port,
    pid: child.pid,
    async stop () {
      if (stopped) return
      child.kill('SIGTERM')
      const timer = setTimeout(() => child.kill('SIGKILL'), 2000)
      await exited
      clearTimeout(timer)
      finish()
    },
    stopSync () {
      if (stopped) return
      try { child.kill('SIGKILL') } catch {}
      finish()
    }
  }
}

/**
 * A redis-server of the benchmark's own, with its URL; connect() opens an
 * ioredis client to it (answering PING), stop() ends every client opened
 * so, then the server.
 */
export async function ownRedis () {
  const server = await startRedis()
  const url = `redis://${server.host}:${server.port}`
  const clients = []
  return {
    url,
    async connect () {
      const redis = new Redis(url)
      await redis.ping()
      clients.push(redis)
      return redis
    },
    async stop () {
      for (const redis of clients) redis.disconnect()
      await server.stop()
    }
  }
}
