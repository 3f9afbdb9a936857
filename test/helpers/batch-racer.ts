// A process that asks TOLLGATE_COUNT consumes of one bucket at once (so
// they go to Redis in batches), once its parent says go on stdin, and
// prints how many were allowed: started by test/batch.test.ts, two at a
// time, whose batches interleave in Redis. REDIS_URL, TOLLGATE_PREFIX,
// TOLLGATE_COUNT and TOLLGATE_ROUNDS come from the environment.

import { once } from 'node:events'
import { Redis } from 'ioredis'
import { createLimiter } from '../../lib/index.js'

const redis = new Redis(process.env.REDIS_URL as string)
await redis.ping()
const limiter = createLimiter({ redis, prefix: process.env.TOLLGATE_PREFIX as string, timeout: 5000, denialCache: false })
const policy = { bucket: 'race', capacity: 50, refillPerSecond: 1e-6, failureMode: 'closed' } as const
const count = Number(process.env.TOLLGATE_COUNT)
const rounds = Number(process.env.TOLLGATE_ROUNDS)
process.stdout.write('ready\n')
await once(process.stdin, 'data')
let allowed = 0
let fellBack = 0
// Several turns of the loop, each asking its share at once: one batch or more per turn.
for (let r = 0; r < rounds; r++) {
  const decisions = await Promise.all(Array.from({ length: count / rounds }, () => limiter.consume('racer', policy)))
  for (const d of decisions) {
    if (d.allowed) allowed++
    if (d.source !== 'store') fellBack++
  }
}
await limiter.close()
await redis.quit()
process.stdout.write(`${JSON.stringify({ allowed, fellBack })}\n`)
process.stdin.destroy()
