// What a reset or a refund costs the denial cache (lib/core/denial-cache.ts),
// counted rather than timed: every server hears every reset of the fleet
// (a login limit resets on each successful login, docs/guides/login.md), so
// the work one reset does must not grow with the cached denials of other
// buckets (SPEC 10: cost per request at the cap within 2x of below it).
//
// What is counted: the steps of every Map and Set iterator while the call
// runs, the walk a scan of the cache's entries takes (a cache of 10 000
// entries scanned is 10 000 steps or more). The denials of the reset bucket
// itself are found through an index and may be walked: a handful here.
// On the in-process clock; no Redis.

import t from 'tap'
import { DenialCache } from '../../lib/core/denial-cache.js'
import type { Decision } from '../../lib/core/types.js'
import type { BucketSpec } from '../../lib/store/store.js'

const spec = (key: string): BucketSpec => ({ key, capacity: 1, refillPerSecond: 1 / 3600, cost: 1 })
const denied: Decision = { allowed: false, limit: 1, remaining: 0, resetMs: 3_600_000, retryAfterMs: 3_600_000, source: 'store', bucket: 'login' }

let now = 1000
const clock = (): number => now

/** Steps taken by Map and Set iterators (keys, values, entries, for-of, Array.from) while `fn` runs. */
function iteratorSteps (fn: () => void): number {
  const prototypes = [Object.getPrototypeOf(new Map().keys()), Object.getPrototypeOf(new Set().values())] as Array<{ next: () => unknown }>
  const originals = prototypes.map((p) => p.next)
  let steps = 0
  prototypes.forEach((p, i) => {
    const next = originals[i] as () => unknown
    p.next = function (this: unknown) { steps++; return next.call(this) }
  })
  try {
    fn()
  } finally {
    prototypes.forEach((p, i) => { p.next = originals[i] as () => unknown })
  }
  return steps
}

/** A cache holding `others` denials of other clients, and three that involve `key`: alone, first of two, last of two. */
function filled (others: number, key: string): DenialCache {
  const cache = new DenialCache(20_000, 60_000, clock)
  for (let i = 0; i < others; i++) cache.set(`other${i}`, [spec(`other${i}`)], denied, now)
  cache.set(key, [spec(key)], denied, now)
  cache.set(`${key}\nx`, [spec(key), spec('x')], denied, now)
  cache.set(`y\n${key}`, [spec('y'), spec(key)], denied, now)
  now += 1
  return cache
}

function cached (cache: DenialCache, keys: readonly string[]): boolean {
  return cache.get(keys.join('\n'), keys.map(spec)) !== undefined
}

t.test('the iterator count sees a scan of the cache', async (t) => {
  const map = new Map(Array.from({ length: 100 }, (_, i) => [i, i]))
  t.ok(iteratorSteps(() => { for (const key of map.keys()) if (key < 0) break }) >= 100, 'a walk over 100 keys counts 100 steps')
  t.equal(iteratorSteps(() => { map.get(5) }), 0, 'a lookup counts none')
})

t.test('a reset walks the denials of its bucket only: as many steps with 10 000 other denials as with 64', async (t) => {
  const steps: number[] = []
  for (const others of [64, 10_000]) {
    const cache = filled(others, 'k')
    steps.push(iteratorSteps(() => { cache.reset('k', now) }))
    t.same([cached(cache, ['k']), cached(cache, ['k', 'x']), cached(cache, ['y', 'k'])], [false, false, false], `${others} others: every denial that involves k is gone`)
    t.ok(cached(cache, ['other0']) && cached(cache, [`other${others - 1}`]), 'the others stay')
    t.equal(cache.size, others, 'and only they remain')
  }
  t.ok((steps[0] as number) <= 10, `at most a few steps (the denials of k), got ${steps[0]}`)
  t.equal(steps[1], steps[0], `${steps[1]} steps with 10 000 other denials, ${steps[0]} with 64`)
})

t.test('a refund walks the denials of its buckets only, and drops every one that involves them', async (t) => {
  const steps: number[] = []
  for (const others of [64, 10_000]) {
    const cache = filled(others, 'k')
    cache.set('z\nq', [spec('z'), spec('q')], denied, now)
    steps.push(iteratorSteps(() => { cache.refunded(['k', 'q'], now) }))
    t.same([cached(cache, ['k']), cached(cache, ['k', 'x']), cached(cache, ['y', 'k']), cached(cache, ['z', 'q'])], [false, false, false, false],
      `${others} others: the denials of each refunded bucket, alone or with others, are gone`)
    t.equal(cache.size, others, 'the others stay')
  }
  t.ok((steps[0] as number) <= 10, `at most a few steps, got ${steps[0]}`)
  t.equal(steps[1], steps[0], `${steps[1]} steps with 10 000 other denials, ${steps[0]} with 64`)
})

t.test('the index follows the cap: an evicted or expired denial leaves nothing for a reset to walk', async (t) => {
  const cache = new DenialCache(2, 60_000, clock)
  cache.set('a\nb', [spec('a'), spec('b')], denied, now)
  cache.set('c', [spec('c')], denied, now)
  cache.set('d', [spec('d')], denied, now)
  t.equal(cache.size, 2, 'at the cap, the oldest (a, b) went')
  t.equal(iteratorSteps(() => { cache.reset('a', now) }), 0, 'a reset of a finds nothing to walk')
  t.equal(iteratorSteps(() => { cache.reset('b', now) }), 0, 'nor one of b')
  t.ok(cached(cache, ['c']) && cached(cache, ['d']), 'the kept denials answer')

  const short = new DenialCache(10, 50, clock)
  short.set('e', [spec('e')], denied, now)
  now += 50
  t.notOk(cached(short, ['e']), 'past maxAgeMs the denial is dropped when asked for')
  t.equal(iteratorSteps(() => { short.reset('e', now) }), 0, 'and out of the index')
})

t.test('the same id set again with other buckets (names may hold a newline): indexed by its buckets of now', async (t) => {
  const cache = new DenialCache(10, 60_000, clock)
  cache.set('a\nb', [spec('a\nb')], denied, now)
  cache.set('a\nb', [spec('a'), spec('b')], denied, now)
  cache.reset('a\nb', now)
  t.ok(cached(cache, ['a', 'b']), 'a reset of the bucket named "a\\nb" leaves the denial of a and b')
  cache.reset('b', now)
  t.notOk(cached(cache, ['a', 'b']), 'a reset of b drops it')
})

t.test('two policies on one bucket: the key twice in one denial', async (t) => {
  const cache = new DenialCache(10, 60_000, clock)
  cache.set('k\nk', [spec('k'), spec('k')], denied, now)
  now += 1
  cache.reset('k', now)
  t.equal(cache.size, 0, 'a reset drops it')
  cache.set('k\nk', [spec('k'), spec('k')], denied, now + 1)
  cache.set('k', [spec('k')], denied, now + 1)
  now += 2
  cache.reset('k', now)
  t.equal(cache.size, 0, 'and it with the single-policy one')
  cache.set('k\nk', [spec('k'), spec('k')], denied, now + 1)
  t.ok(cached(cache, ['k', 'k']), 'cached again (a call sent after the reset)')
  cache.distrust(now + 2)
  t.equal(cache.size, 0, 'distrust() drops everything')
  t.equal(iteratorSteps(() => { cache.reset('k', now + 3) }), 0, 'index included')
})
