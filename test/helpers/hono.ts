// Hono apps for the tests: served by @hono/node-server on a free port (or
// a Unix socket), with the plain HTTP client of test/helpers/express.ts's
// shape, so that the requests arrive over a real socket, as in production.

import { once } from 'node:events'
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createAdaptorServer } from '@hono/node-server'
import type { Test } from 'tap'
import { httpGet, type Answer } from './express.js'

/** What serving needs of a Hono app. */
export interface HonoApp { fetch: Parameters<typeof createAdaptorServer>[0]['fetch'] }

export type Get = (url: string, headers?: Record<string, string>, method?: string) => Promise<Answer>

/** Serves `app` on a free port (or a Unix socket path) until the end of `t`. */
export async function serveHono (t: Test, app: HonoApp, path?: string): Promise<{ get: Get, server: Server, port: number }> {
  const server = createAdaptorServer({ fetch: app.fetch }) as Server
  if (path === undefined) server.listen(0, '127.0.0.1')
  else server.listen(path)
  await once(server, 'listening')
  t.teardown(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()) }))
  const where = path === undefined ? { host: '127.0.0.1', port: (server.address() as AddressInfo).port } : { socketPath: path }
  const get: Get = httpGet(where)
  return { get, server, port: path === undefined ? (server.address() as AddressInfo).port : 0 }
}

/** Listens and returns the client only. */
export async function listenHono (t: Test, app: HonoApp, path?: string): Promise<Get> {
  return (await serveHono(t, app, path)).get
}
