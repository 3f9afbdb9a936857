// The readers of the scripts' replies (lib/store/reply.ts) and the answer
// of a batch from its reply (lib/store/redis-store.ts answerBatch): each
// value is checked as it is taken, numbers may come as strings, and a
// reply of another shape is a store error naming the script and what it
// replied. No Redis: the replies are values.

import t from 'tap'
import { isNumbers, lengthOf, numberAt, numberOf, unexpectedReply } from '../../lib/store/reply.js'
import { answerAlone, answerBatch, type Pending } from '../../lib/store/redis-store.js'
import type { StoreReply } from '../../lib/store/store.js'

const bad = { code: 'TOLLGATE_STORE_ERROR', message: /^lua\/x\.lua replied .*, which is not the reply it gives$/ }

t.test('numbers, one or in an array; a string that writes one counts', async (t) => {
  t.equal(numberOf(-12, 'lua/x.lua'), -12)
  t.equal(numberOf('-12', 'lua/x.lua'), -12, 'an integer a client maps to a string')
  t.throws(() => numberOf(null, 'lua/x.lua'), bad)
  t.throws(() => numberOf('', 'lua/x.lua'), bad, 'an empty string is not 0')
  t.throws(() => numberOf('lots', 'lua/x.lua'), bad, 'nor is a word NaN')
  t.equal(numberAt([1, -2, 3], 1, 'lua/x.lua'), -2)
  t.equal(numberAt(['2.5', 3], 0, 'lua/x.lua'), 2.5, 'a fraction sent with tostring')
  t.throws(() => numberAt([1], 1, 'lua/x.lua'), bad, 'past the end')
  t.throws(() => numberAt([[1]], 0, 'lua/x.lua'), bad, 'an array in the array')
  t.throws(() => numberAt(7, 0, 'lua/x.lua'), bad, 'not an array')
  t.throws(() => numberAt({ 0: 1 }, 0, 'lua/x.lua'), bad, 'an object is no array')
})

t.test('a whole array of numbers, and a length', async (t) => {
  t.equal(isNumbers([1, '2', 3], 3), true)
  t.equal(isNumbers([1, 2, 3, 'extra'], 3), true, 'what follows the n read is not looked at')
  t.equal(isNumbers([1, 2], 3), false, 'too short')
  t.equal(isNumbers([1, null, 3], 3), false, 'a null among them')
  t.equal(isNumbers('1,2,3', 3), false, 'not an array')
  t.equal(lengthOf([1, 2], 'lua/x.lua'), 2)
  t.throws(() => lengthOf('12', 'lua/x.lua'), bad)
})

t.test('the error shows what was replied, cut short, whatever it is', async (t) => {
  t.match(unexpectedReply('lua/x.lua', ['1', null]).message, 'replied ["1",null],')
  t.match(unexpectedReply('lua/x.lua', undefined).message, 'replied undefined,', 'JSON has no text for undefined')
  t.match(unexpectedReply('lua/x.lua', [10n]).message, 'replied 10,', 'nor for a BigInt, which it refuses')
  t.equal(unexpectedReply('lua/x.lua', 'y'.repeat(1000)).message.length, 'lua/x.lua replied '.length + 200 + ', which is not the reply it gives'.length)
})

t.test('a batch is answered from its flat reply, or failed whole', async (t) => {
  const spec = (key: string) => ({ key, capacity: 10, refillPerSecond: 1, cost: 1 })
  const made = (): { pending: Pending[], out: Array<StoreReply | Error> } => {
    const out: Array<StoreReply | Error> = []
    const pending: Pending[] = [[spec('a')], [spec('b'), spec('c')]].map((specs) => ({
      specs, consume: true, sent: undefined, resolve: (reply) => { out.push(reply) }, reject: (err) => { out.push(err as Error) }
    }))
    return { pending, out }
  }
  const good = made()
  answerBatch(good.pending, 3, [1_000_000, '2000000', -500_000])
  t.match(good.out, [
    { allowed: true, buckets: [{ remaining: 9, fullInUs: 1_000_000, waitUs: 0 }] },
    { allowed: false, buckets: [{ remaining: 8, fullInUs: 2_000_000, waitUs: 0 }, { waitUs: 500_000 }] }
  ], 'each decision its own buckets, in order')
  const short = made()
  answerBatch(short.pending, 3, [1_000_000, 2_000_000])
  t.equal(short.out.length, 2)
  t.ok(short.out.every((o) => o instanceof Error && /^lua\/token-bucket-batch\.lua replied \[1000000,2000000\]/.test(o.message)), 'a reply one number short fails both, none answered from it')
})

t.test('a decision sent alone is answered from its reply, or failed by a reply of another shape', async (t) => {
  const spec = (key: string) => ({ key, capacity: 10, refillPerSecond: 1, cost: 1 })
  const run = (specs: Pending['specs'], reply: unknown): StoreReply | Error | undefined => {
    let out: StoreReply | Error | undefined
    answerAlone({ specs, consume: true, sent: undefined, resolve: (r) => { out = r }, reject: (err) => { out = err as Error } }, reply)
    return out
  }
  t.match(run([spec('a')], '1000000'), { allowed: true, buckets: [{ remaining: 9, fullInUs: 1_000_000, waitUs: 0 }] }, 'one bucket: a bare integer')
  t.match(run([spec('a'), spec('b')], [1_000_000, -500_000]), { allowed: false, buckets: [{ remaining: 9 }, { waitUs: 500_000 }] }, 'two: one integer each')
  t.match((run([spec('a')], [1, 2]) as Error).message, /^lua\/token-bucket\.lua replied \[1,2\]/, 'an array where one integer was due: failed, not read as NaN')
  t.match((run([spec('a'), spec('b')], [1]) as Error).message, /^lua\/token-bucket\.lua replied \[1\]/, 'one number short: failed')
})
