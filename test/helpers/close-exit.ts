// A process that makes one decision with a long deadline, closes the
// limiter and its client, and should then exit: started by
// test/deadline.test.ts, which times the gap between the "closed" line on
// stdout and the exit. REDIS_URL, TOLLGATE_PREFIX and TOLLGATE_TIMEOUT come from the
// environment.

import { Redis } from 'ioredis'
import { createLimiter } from '../../lib/index.js'

const redis = new Redis(process.env.REDIS_URL as string)
await redis.ping()
const limiter = createLimiter({ redis, prefix: process.env.TOLLGATE_PREFIX as string, timeout: Number(process.env.TOLLGATE_TIMEOUT) })
const decision = await limiter.consume('exit', { bucket: 'exit', capacity: 10, refillPerSecond: 1, failureMode: 'closed' })
await limiter.close()
await redis.quit()
process.stdout.write(`closed ${decision.source}\n`)
