// Express apps for the tests: listening on a free port (or a Unix socket)
// with a plain HTTP client, and a logger that keeps its lines.

import { once } from 'node:events'
import { request, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Express } from 'express'
import type { Test } from 'tap'
import type { Logger } from '../../lib/core/types.js'

export interface Answer {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: string
}

/** Listens on a free port (or a Unix socket path) and closes at the end of `t`. */
export async function listen (t: Test, app: Express, path?: string): Promise<(url: string, headers?: Record<string, string>, method?: string) => Promise<Answer>> {
  const server: Server = path === undefined ? app.listen(0, '127.0.0.1') : app.listen(path)
  await once(server, 'listening')
  t.teardown(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()) }))
  const where = path === undefined ? { host: '127.0.0.1', port: (server.address() as AddressInfo).port } : { socketPath: path }
  return httpGet(where)
}

/** A plain HTTP client of a host and port (or a Unix socket path), with Node's default agent. */
export function httpGet (where: { host: string, port: number } | { socketPath: string }): (url: string, headers?: Record<string, string>, method?: string) => Promise<Answer> {
  return async (url, headers = {}, method = 'GET') => await new Promise<Answer>((resolve, reject) => {
    const req = request({ ...where, path: url, headers, method }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }))
    })
    req.on('error', reject)
    req.end()
  })
}

/** A logger that keeps what it is given. */
export function memoryLogger (): Logger & { lines: string[] } {
  const lines: string[] = []
  const keep = (_obj: object, msg: string): void => { lines.push(msg) }
  return { lines, warn: keep, info: keep, error: keep }
}

