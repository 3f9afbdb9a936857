// The Nest side of test/helpers/express-late.ts: Nest apps on the platform
// NEST_PLATFORM ('express' or 'fastify') in a process of its own, under
// Node's default unhandled-rejection behaviour, whose requests a timeout
// middleware answers (503 after TIMEOUT_MS, on the Node response) while
// tollgate's guard still waits for its decision. Started by
// test/adapter-lifecycle.test.ts; REDIS_URL and TOLLGATE_PREFIX come from
// the environment; prints `port <n>` once it listens.
//
// One module is one limiter, so each limit is an app of its own, both
// served by one HTTP server of the process (by path):
//
//   /wait   capacity 1 at 5/s with maxWaitMs: the second request waits 200 ms
//   /slow   Redis made slow by a proxy (test/helpers/late-stores.ts) inside a 2 s
//           deadline, capacity 1: the first is allowed late, the second denied late
//   /stats  how many requests reached each handler

import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { INestApplication } from '@nestjs/common'
import { TollgateModule, type NestOptions } from '../../lib/nest.js'
import { lateStores, serveLate } from './late-stores.js'
import { controller, nestApp, type Platform, type TestRequest } from './nest.js'

const TIMEOUT_MS = 30
const url = process.env.REDIS_URL as string
const prefix = process.env.TOLLGATE_PREFIX as string
const platform = process.env.NEST_PLATFORM as Platform

const handled: Record<string, number> = {}
const ok = (req: TestRequest): string => {
  const route = req.url.split('/')[1] as string
  handled[route] = (handled[route] ?? 0) + 1
  return JSON.stringify({ ok: true })
}

function timeout (_req: IncomingMessage, res: ServerResponse, next: () => void): void {
  const timer = setTimeout(() => { res.statusCode = 503; res.end('timed out') }, TIMEOUT_MS)
  res.on('close', () => { clearTimeout(timer) })
  next()
}

type Serve = (req: IncomingMessage, res: ServerResponse) => void

/** A Nest app of one limit and route, initialised, and how the process's server hands it a request. */
async function served (options: NestOptions, path: string, maxWaitMs?: number): Promise<{ app: INestApplication, serve: Serve }> {
  const routes = [{ path, policy: { bucket: path, ...(maxWaitMs === undefined ? {} : { maxWaitMs }) }, answer: ok }]
  const app = await nestApp(platform, TollgateModule.forRoot({ ...options, global: false }), [controller('', routes)])
  app.use(timeout)
  await app.init()
  const instance: unknown = app.getHttpAdapter().getInstance()
  if (typeof instance === 'function') return { app, serve: instance as Serve }
  // Fastify: its routing, once ready.
  const fastify = instance as { ready (): Promise<void>, routing: Serve }
  await fastify.ready()
  return { app, serve: (req, res) => { fastify.routing(req, res) } }
}

const stores = await lateStores(url, prefix)
const { wait, slow, slowDown } = stores
const waitApp = await served(wait, '/wait', 2000)
const slowApp = await served(slow, '/slow')
slowDown()

const server = createServer((req, res) => {
  if (req.url === '/stats') return res.end(JSON.stringify({ handled }))
  const { serve } = req.url?.startsWith('/slow') === true ? slowApp : waitApp
  serve(req, res)
})
serveLate(server, stores, () => Promise.all([waitApp.app.close(), slowApp.app.close()]))
