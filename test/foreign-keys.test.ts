// Keys under the prefix that tollgate did not write (SPEC section 7, docs/reference/keys.md):
// a list, a hash or a set, or a string that is no bucket ("nan", "inf",
// "abc", a number longer than any full-at time). On every path that reaches
// Redis (a single policy, several policies, a batch of several clients,
// reserve and settle, a lease, a policy with `maxWaitMs` or a lockout) such
// a key fails the request that reads it, which follows its failure mode
// (here 'closed'; a settlement rejects); the key is left exactly as it was
// (its TYPE, its DUMP and its TTL); the other keys of the call are decided
// exactly once (their tokens are read back from Redis); and one error line
// names the key. The first test goes over the whole table and fails with
// the count of what went wrong: before the scripts checked what they read,
// requests were admitted and foreign keys overwritten with a bucket.

import { Redis } from 'ioredis'
import t from 'tap'
import { createLimiter, type Decision, type Limiter, type Logger, type Policy, type Reservation } from '../lib/index.js'
import { uniquePrefix } from './helpers/app.js'
import { keyUnder } from './helpers/keys.js'
import { redisUrl } from './helpers/redis.js'

const url = await redisUrl(t)
const admin = new Redis(url)
t.teardown(() => { admin.disconnect() })

/** A value another application may have left under the prefix; `plant` writes it at `key` (no TTL). */
interface Foreign {
  name: string
  plant (key: string): Promise<unknown>
}

const text = (value: string): Foreign => ({ name: JSON.stringify(value), plant: (key) => admin.set(key, value) })

const FOREIGN: Foreign[] = [
  { name: 'a list', plant: (key) => admin.rpush(key, 'job-1', 'job-2') },
  { name: 'a hash', plant: (key) => admin.hset(key, 'tokens', '5', 'owner', 'billing') },
  { name: 'a set', plant: (key) => admin.sadd(key, 'm1', 'm2') },
  text('nan'),
  text('inf'),
  text('-inf'),
  text('abc'),
  text('123456789012345678901234567890'),
  text('12.5'),
  text('')
]

const CAPACITY = 10
/** The fleet's key secret, given so that a test names a key before any call (docs/reference/keys.md). */
const SECRET = 'foreign-keys-test-secret'
/** No refill to speak of: the tokens read back are what was spent. */
const REFILL = 1e-6
const policy = (bucket: string): Policy => ({ bucket, capacity: CAPACITY, refillPerSecond: REFILL, failureMode: 'closed' })

interface Line { level: string, obj: Record<string, unknown>, msg: string }

/** One case: a limiter of its own on a prefix of its own, its log lines. */
interface Case {
  limiter: Limiter
  close (): Promise<void>
  lines: Line[]
  /** A bucket key of this case's prefix. */
  key (client: string, bucket: string): string
}

/** What a path did: each decision it asked, whether a settlement was rejected, the tokens each other key of the call must hold after it. */
interface Outcome {
  decisions: Decision[]
  rejected?: boolean
  neighbours: Record<string, number>
}

/**
 * A path into Redis. `foreign` is the key that holds the foreign value,
 * planted before `run`, or by `run` itself with `plant` between a reserve
 * and its settlement (`settles`). The decision at `victim` is the one that
 * reads the foreign key; the others must be the store's.
 */
interface Path {
  name: string
  foreign (c: Case): string
  victim: number
  settles?: true
  run (c: Case, plant: () => Promise<void>): Promise<Outcome>
}

const lockout = { after: 2, withinMs: 60_000, forMs: 60_000 }

/** Reserves 2 on a good bucket, then plants the foreign value, then settles with 0 (a refund of 2). */
async function settleOver (c: Case, plant: () => Promise<void>): Promise<Outcome> {
  const reservation: Reservation = await c.limiter.reserve('victim', policy('b'), 2)
  await plant()
  let rejected = false
  await c.limiter.settle(reservation, 0).catch(() => { rejected = true })
  return { decisions: [reservation.decision], rejected, neighbours: {} }
}

const PATHS: Path[] = [
  {
    name: 'single policy',
    foreign: (c) => c.key('victim', 'b'),
    victim: 0,
    run: async (c) => ({ decisions: [await c.limiter.consume('victim', policy('b'))], neighbours: {} })
  },
  {
    name: 'several policies',
    foreign: (c) => c.key('victim', 'b'),
    victim: 0,
    run: async (c) => ({ decisions: [await c.limiter.consume('victim', [policy('good'), policy('b')])], neighbours: { [c.key('victim', 'good')]: CAPACITY } })
  },
  {
    name: 'batch of several clients',
    foreign: (c) => c.key('victim', 'b'),
    victim: 1,
    run: async (c) => ({
      decisions: await Promise.all([
        c.limiter.consume('alice', policy('b')), c.limiter.consume('victim', policy('b')), c.limiter.consume('bob', [policy('b'), policy('c')]), c.limiter.consume('alice', policy('b'))
      ]),
      neighbours: { [c.key('alice', 'b')]: CAPACITY - 2, [c.key('bob', 'b')]: CAPACITY - 1, [c.key('bob', 'c')]: CAPACITY - 1 }
    })
  },
  {
    name: 'batch, the faulty request with several policies',
    foreign: (c) => c.key('victim', 'b'),
    victim: 1,
    run: async (c) => ({
      decisions: await Promise.all([c.limiter.consume('alice', policy('b')), c.limiter.consume('victim', [policy('good'), policy('b')]), c.limiter.consume('alice', policy('b'))]),
      neighbours: { [c.key('alice', 'b')]: CAPACITY - 2, [c.key('victim', 'good')]: CAPACITY }
    })
  },
  {
    name: 'reserve',
    foreign: (c) => c.key('victim', 'b'),
    victim: 0,
    run: async (c) => ({ decisions: [(await c.limiter.reserve('victim', [policy('good'), policy('b')])).decision], neighbours: { [c.key('victim', 'good')]: CAPACITY } })
  },
  {
    name: 'reserve, foreign refund key',
    foreign: (c) => `${c.key('victim', 'b')}!settle`,
    victim: 0,
    run: async (c) => ({ decisions: [(await c.limiter.reserve('victim', policy('b'))).decision], neighbours: { [c.key('victim', 'b')]: CAPACITY } })
  },
  {
    name: 'settle (a refund)',
    foreign: (c) => c.key('victim', 'b'),
    victim: -1,
    settles: true,
    run: settleOver
  },
  {
    name: 'settle, foreign refund key',
    foreign: (c) => `${c.key('victim', 'b')}!settle`,
    victim: -1,
    settles: true,
    run: async (c, plant) => ({ ...await settleOver(c, plant), neighbours: { [c.key('victim', 'b')]: CAPACITY - 2 } })
  },
  {
    name: 'lease',
    foreign: (c) => c.key('victim', 'b'),
    victim: 0,
    run: async (c) => ({ decisions: [await c.limiter.consume('victim', { ...policy('b'), lease: { tokens: 3, maxAgeMs: 60_000 } })], neighbours: {} })
  },
  {
    name: 'maxWaitMs',
    foreign: (c) => c.key('victim', 'b'),
    victim: 0,
    run: async (c) => ({ decisions: [await c.limiter.consume('victim', { ...policy('b'), maxWaitMs: 1000 })], neighbours: {} })
  },
  {
    name: 'lockout',
    foreign: (c) => c.key('victim', 'b'),
    victim: 0,
    run: async (c) => ({ decisions: [await c.limiter.consume('victim', { ...policy('b'), lockout })], neighbours: {} })
  },
  {
    name: 'lockout, foreign lockout key',
    foreign: (c) => `${c.key('victim', 'b')}!lockout`,
    victim: 0,
    run: async (c) => ({ decisions: [await c.limiter.consume('victim', { ...policy('b'), lockout })], neighbours: { [c.key('victim', 'b')]: CAPACITY } })
  }
]

/** A key as it is: its type, its serialized contents and its TTL ("none" when it is gone). */
async function snapshot (key: string): Promise<string> {
  const [type, dump, pttl] = await Promise.all([admin.type(key), admin.dumpBuffer(key), admin.pttl(key)])
  return `${type} ${dump === null ? '' : dump.toString('hex')} ${pttl}`
}

/** The tokens a bucket key holds now, by Redis's clock (a missing key is a full bucket). */
async function tokens (key: string): Promise<number> {
  const replies = await admin.multi().get(key).time().exec()
  const held = replies?.[0]?.[1] as string | null
  const [s, us] = replies?.[1]?.[1] as [string, string]
  if (held === null) return CAPACITY
  const busy = Math.max(0, Number(held) - (Number(s) * 1e6 + Number(us)))
  return CAPACITY - busy / (1e6 / REFILL)
}

async function newCase (): Promise<Case> {
  const prefix = uniquePrefix()
  const lines: Line[] = []
  const at = (level: string) => (obj: object, msg: string): void => { lines.push({ level, obj: obj as Record<string, unknown>, msg }) }
  const logger: Logger = { warn: at('warn'), info: at('info'), error: at('error') }
  // A generous deadline: a busy machine must not turn a neighbour's decision into a timeout.
  const redis = new Redis(url)
  const limiter = createLimiter({ redis, prefix, logger, denialCache: false, timeout: 2000, keySecret: SECRET })
  await limiter.ready // connected, scripts loaded: every decision below is Redis's to make
  const close = async (): Promise<void> => {
    await limiter.close()
    redis.disconnect()
  }
  return { limiter, close, lines, key: (client, bucket) => keyUnder(SECRET, prefix, client, bucket) }
}

/** What went wrong in one case, each as a short phrase; empty when nothing did. */
async function check (path: Path, foreign: Foreign): Promise<string[]> {
  const c = await newCase()
  try {
    return await wrongs(c, path, foreign)
  } finally {
    await c.close()
  }
}

async function wrongs (c: Case, path: Path, foreign: Foreign): Promise<string[]> {
  const key = path.foreign(c)
  let before = ''
  const plant = async (): Promise<void> => {
    await admin.del(key)
    await foreign.plant(key)
    before = await snapshot(key)
  }
  if (path.settles !== true) await plant()
  const outcome = await path.run(c, plant)
  const wrong: string[] = []
  if (path.settles === true && outcome.rejected !== true) wrong.push('settled')
  const decision = outcome.decisions[path.victim]
  if (decision !== undefined && (decision.allowed || decision.source !== 'fail-closed')) wrong.push(`decided ${decision.allowed ? 'allowed' : 'denied'} by ${decision.source}`)
  for (const [i, other] of outcome.decisions.entries()) if (i !== path.victim && other.source !== 'store') wrong.push(`neighbour ${i} decided by ${other.source}`)
  const after = await snapshot(key)
  if (after !== before) wrong.push(`overwritten (${after.split(' ')[0]})`)
  for (const [neighbour, expected] of Object.entries(outcome.neighbours)) {
    const held = await tokens(neighbour)
    if (Math.abs(held - expected) > 1e-3) wrong.push(`${neighbour.slice(neighbour.indexOf('{'))} holds ${held.toFixed(3)} tokens, not ${expected}`)
  }
  const errors = c.lines.filter((l) => l.level === 'error')
  const naming = errors.filter((l) => String((l.obj.err as Error | undefined)?.message).includes(key))
  if (errors.length !== 1 || naming.length !== 1) wrong.push(`${errors.length} error line(s), ${naming.length} naming the key`)
  return wrong
}

t.test('every path x every foreign value: the request fails, the key is left as it was, the rest is decided once, one line names the key', async (t) => {
  const failures: string[] = []
  const tally = { cases: 0, allowed: 0, decided: 0, overwritten: 0, neighbours: 0, lines: 0 }
  for (const path of PATHS) {
    for (const foreign of FOREIGN) {
      const wrong = await check(path, foreign)
      tally.cases++
      if (wrong.some((w) => w.startsWith('decided allowed') || w === 'settled')) tally.allowed++
      if (wrong.some((w) => w.startsWith('decided') || w === 'settled')) tally.decided++
      if (wrong.some((w) => w.startsWith('overwritten'))) tally.overwritten++
      if (wrong.some((w) => w.includes('tokens, not'))) tally.neighbours++
      if (wrong.some((w) => w.includes('error line'))) tally.lines++
      if (wrong.length > 0) failures.push(`${path.name}, ${foreign.name}: ${wrong.join('; ')}`)
    }
  }
  t.comment(`${tally.cases} cases: ${tally.decided} decided on the foreign value instead of failing (${tally.allowed} of them allowed or settled), ` +
    `${tally.overwritten} foreign keys overwritten or deleted, ${tally.neighbours} with another key of the call charged wrongly, ` +
    `${tally.lines} without exactly one error line naming the key`)
  t.same(failures, [], 'no case went wrong')
})
