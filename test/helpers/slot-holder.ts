// A process that takes concurrency slots and never gives them back: the
// server that dies holding them (test/concurrency.test.ts kills it with
// SIGKILL). Its settings come in TOLLGATE_HOLDER (JSON); it prints `held`
// once its slots are taken, and renews them until it is killed.

import { Redis } from 'ioredis'
import { createLimiter } from '../../lib/index.js'

const { url, prefix, bucket, max, leaseMs, count } = JSON.parse(process.env.TOLLGATE_HOLDER ?? '{}') as {
  url: string, prefix: string, bucket: string, max: number, leaseMs: number, count: number
}
const limiter = createLimiter({ redis: new Redis(url), prefix, timeout: 1000 })
await limiter.ready
let held = 0
for (let i = 0; i < count; i++) {
  const { decision } = await limiter.acquire('client', { bucket, concurrency: { max, leaseMs }, failureMode: 'closed' })
  if (decision.allowed) held++
}
process.stdout.write(`held ${held}\n`)
setInterval(() => {}, 60_000)
