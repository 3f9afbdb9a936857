// Apps whose requests tollgate decides after their response was sent, each
// in a process of its own under Node's default unhandled-rejection
// behaviour (one ends the process): the children of test/helpers/
// (express-late.ts, hono-late.ts, fastify-late.ts, nest-late.ts), the scenarios each one serves, and
// the client that drives them. Used by test/adapter-lifecycle.test.ts over
// the rows of test/helpers/adapters.ts that name a child.

import { spawn } from 'node:child_process'
import { request } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'

export interface Child {
  ask (path: string): Promise<{ status: number, body: string }>
  /** What its /stats says; undefined when it no longer answers. */
  stats (): Promise<unknown>
  /** SIGTERM; its exit code and stderr. */
  stop (): Promise<{ code: number | null, stderr: string }>
}

export interface LateScenario {
  name: string
  /** Asked in order, one at a time. */
  paths: string[]
  /** Needs a process started less than 2 s ago, and waits for its start-up wait to end. */
  startup?: true
  /** What the app answered (its own timeout, or its handler). */
  answers: Array<{ status: number, body: string }>
  /**
   * What /stats says once the late decisions are in; its `handled`, the
   * handlers run so far in the process, exactly: none for an answered request.
   */
  stats: { handled: Record<string, number>, [field: string]: unknown }
}

const timedOut = { status: 503, body: 'timed out' }
const passed = { status: 200, body: '{"ok":true}' }

/** Per child: what it serves, in the order it is run (the start-up wait first: it needs a fresh process). */
export const LATE_SCENARIOS: Record<string, LateScenario[]> = {
  'express-late.ts': [
    { name: 'the start-up wait ends after the response was sent', paths: ['/startup'], startup: true, answers: [timedOut], stats: { handled: {}, errors: [] } },
    { name: 'a wait under maxWaitMs ends after the timeout answered', paths: ['/wait', '/wait'], answers: [passed, timedOut], stats: { handled: { wait: 1 }, errors: [] } },
    { name: 'a slow Redis (inside the deadline) decides after the timeout: allowed, then denied', paths: ['/slow', '/slow'], answers: [timedOut, timedOut], stats: { handled: { wait: 1 }, errors: [] } },
    { name: 'a route that settles, reserved after the timeout: settled once the response is finished', paths: ['/settle'], answers: [timedOut], stats: { handled: { wait: 1 }, errors: [], settleRemaining: 5 } },
    { name: 'an earlier middleware answered and called next()', paths: ['/early'], answers: [{ status: 200, body: '{"early":true}' }], stats: { handled: { wait: 1 }, errors: [] } },
    { name: 'an async handler that rejects: its error goes to next(err)', paths: ['/handler', '/handler'], answers: [passed, { status: 500, body: '{"message":"the handler failed"}' }], stats: { handled: { wait: 1, handler: 1 }, errors: ['the handler failed'] } }
  ],
  'hono-late.ts': [
    { name: 'a wait under maxWaitMs ends after the timeout middleware answered', paths: ['/wait', '/wait'], answers: [passed, timedOut], stats: { handled: { wait: 1 } } },
    { name: 'a slow Redis (inside the deadline) decides after the timeout middleware answered: allowed, then denied', paths: ['/slow', '/slow'], answers: [timedOut, timedOut], stats: { handled: { wait: 1 } } }
  ],
  'nest-late.ts': [
    { name: 'a wait under maxWaitMs ends after the timeout middleware answered', paths: ['/wait', '/wait'], answers: [passed, timedOut], stats: { handled: { wait: 1 } } },
    { name: 'a slow Redis (inside the deadline) decides after the timeout middleware answered: allowed, then denied', paths: ['/slow', '/slow'], answers: [timedOut, timedOut], stats: { handled: { wait: 1 } } }
  ],
  'fastify-late.ts': [
    { name: 'a wait under maxWaitMs ends after an app hook answered', paths: ['/wait', '/wait'], answers: [passed, timedOut], stats: { handled: { wait: 1 } } },
    { name: 'a slow Redis (inside the deadline) decides after the app hook answered: allowed, then denied', paths: ['/slow', '/slow'], answers: [timedOut, timedOut], stats: { handled: { wait: 1 } } },
    { name: 'a route declared before the plugin (its gate hooks): a wait ends after the app hook answered', paths: ['/gate', '/gate'], answers: [passed, timedOut], stats: { handled: { wait: 1, gate: 1 } } }
  ]
}

/** Starts test/helpers/<file> in its own process; killed at the end of `t`. */
export async function child (t: Test, file: string, env: Record<string, string>): Promise<Child> {
  const proc = spawn(process.execPath, [...process.execArgv, new URL(`./${file}`, import.meta.url).pathname], {
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
  const ask = askOf(port)
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

/** A client of the child's port: a process that died answers status 0 with the error. */
function askOf (port: number): Child['ask'] {
  return async (path) => await new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      let body = ''
      res.on('data', (chunk: Buffer) => { body += chunk.toString() })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on('error', (err) => resolve({ status: 0, body: err.message }))
    req.end()
  })
}

/** Until the child's start-up wait (2 s from when it started) is over, or it died. */
export async function startupOver (c: Child): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const stats = await c.stats() as { startupOver?: boolean } | undefined
    if (stats === undefined || stats.startupOver === true) return
    await sleep(50)
  }
  throw new Error('the start-up wait was not over after 10 s')
}
