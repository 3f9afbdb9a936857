// The Hono side of test/helpers/express-late.ts: a Hono app on
// @hono/node-server in a process of its own, under Node's default
// unhandled-rejection behaviour, whose requests Hono's timeout middleware
// answers (503 after TIMEOUT_MS) while tollgate still waits for its
// decision. Started by test/adapter-lifecycle.test.ts; REDIS_URL and
// TOLLGATE_PREFIX come from the environment; prints `port <n>` once it
// listens.
//
//   /wait   capacity 1 at 5/s with maxWaitMs: the second request waits 200 ms
//   /slow   Redis made slow by a proxy (test/helpers/late-stores.ts) inside a 2 s
//           deadline, capacity 1: the first is allowed late, the second denied late
//   /stats  how many requests reached each handler

import type { Server } from 'node:http'
import { createAdaptorServer } from '@hono/node-server'
import { Hono, type Context } from 'hono'
import { HTTPException } from 'hono/http-exception'
import { timeout } from 'hono/timeout'
import { rateLimit, type RateLimitEnv } from '../../lib/hono.js'
import { lateStores, serveLate } from './late-stores.js'

const TIMEOUT_MS = 30
const url = process.env.REDIS_URL as string
const prefix = process.env.TOLLGATE_PREFIX as string

const handled: Record<string, number> = {}
const ok = (c: Context): Response => {
  const route = c.req.path.split('/')[1] as string
  handled[route] = (handled[route] ?? 0) + 1
  return c.json({ ok: true })
}

const stores = await lateStores(url, prefix)
const { wait, slow: slowOptions, slowDown } = stores
const limit = rateLimit(wait)
const slow = rateLimit(slowOptions)
await Promise.all([limit.ready, slow.ready])
slowDown()

const app = new Hono<RateLimitEnv>()
const timedOut = timeout(TIMEOUT_MS, () => new HTTPException(503, { message: 'timed out' }))
app.get('/wait', timedOut, limit({ bucket: 'wait', maxWaitMs: 2000 }), ok)
app.get('/slow', timedOut, slow({ bucket: 'slow' }), ok)
app.get('/stats', (c) => c.json({ handled }))
serveLate(createAdaptorServer({ fetch: app.fetch }) as Server, stores, () => Promise.all([limit.close(), slow.close()]))
