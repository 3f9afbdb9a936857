// Policies (lib/core/policy.ts) and a route's limit (lib/http/route.ts),
// parsed without Redis: the fields a policy keeps, the checks only
// together can fail, the route's merge over the adapter's options, its
// bucket names and route-wide settings, and the programmatic policies.

import t from 'tap'
import { checkPolicies, costBound, maxCost, parsePolicy, unsettled } from '../../lib/core/policy.js'
import { MAX_WINDOW_US } from '../../lib/core/options.js'
import { EXTENDED, STORE_FIELDS, checkCombination } from '../../lib/core/policy-fields.js'
import { checkDefaults, compileRoute, programmaticPolicies, routeName, type Defaults } from '../../lib/http/route.js'
import { headerPairs } from '../../lib/http/headers.js'
import type { Decision, Policy } from '../../lib/core/types.js'
import { isOptionError, thrown } from './helpers/option-error.js'

const good = { bucket: 'b', capacity: 10, refillPerSecond: 2, failureMode: 'open' }

t.test('parsePolicy keeps only the fields set, as a new object', async (t) => {
  const input = { ...good, cost: undefined, shadow: false }
  const policy = parsePolicy(input)
  t.same(policy, { bucket: 'b', capacity: 10, refillPerSecond: 2, failureMode: 'open', shadow: false })
  t.notOk('cost' in policy, 'no key holds undefined')
  t.not(policy, input, 'a new object')
  const full = parsePolicy({
    ...good, failureMode: 'local', cost: 2, local: { capacity: 1, refillPerSecond: 1 }, timeout: 50, lease: { tokens: 5, maxAgeMs: 10 }, lockout: { after: 1, withinMs: 10, forMs: 10 }, maxWaitMs: 100
  })
  t.same(Object.keys(full).sort(), ['bucket', 'capacity', 'cost', 'failureMode', 'lease', 'local', 'lockout', 'maxWaitMs', 'refillPerSecond', 'timeout'])
})

t.test('parsePolicy: what only fields together can get wrong', async (t) => {
  const cases: Array<[string, unknown, { name: string, got?: string, expect?: string | RegExp }]> = [
    ['not an object', 'b', { name: 'policy', got: '"b"', expect: 'a policy object' }],
    ['no bucket', { ...good, bucket: undefined }, { name: 'policy.bucket', got: 'undefined', expect: 'set' }],
    ['no capacity', { ...good, capacity: undefined }, { name: 'policy.capacity', got: 'undefined', expect: 'set' }],
    ['cost over capacity', { ...good, cost: 10.5 }, { name: 'policy.cost', got: '10.5', expect: 'at most capacity (10)' }],
    ["'local' without local", { ...good, failureMode: 'local' }, { name: 'policy.local', got: 'undefined', expect: "with failureMode 'local'" }],
    ['lease over capacity', { ...good, lease: { tokens: 11, maxAgeMs: 1 } }, { name: 'policy.lease.tokens', got: '11', expect: 'at most capacity (10)' }],
    ['maxWaitMs with shadow', { ...good, shadow: true, maxWaitMs: 5 }, { name: 'policy.maxWaitMs', got: '5', expect: 'unset with `shadow: true`' }],
    ['maxWaitMs past 2^52 µs with the window', { ...good, capacity: 4503599627, refillPerSecond: 1, maxWaitMs: 1000 },
      { name: 'policy.maxWaitMs', got: '1000', expect: 'at most 2^52 µs less the time an empty bucket takes to fill' }],
    ['windowMs (express-rate-limit)', { ...good, windowMs: 1000 }, { name: 'policy.windowMs', expect: 'rate-limiter-flexible|express-rate-limit' }]
  ]
  for (const [label, input, want] of cases) {
    const err = thrown(() => parsePolicy(input))
    if (label.startsWith('windowMs')) {
      t.match((err as Error).message, /unknown option `policy\.windowMs`: that is an option of express-rate-limit/, label)
      continue
    }
    isOptionError(t, err, want, label)
  }
  t.throws(() => parsePolicy({ ...good, capacity: undefined }, 'route.', 'fastify', 'a finite number > 0 (set it on the plugin)'),
    { message: 'tollgate: `route.capacity` must be a finite number > 0 (set it on the plugin), got undefined' }, 'the caller says where a missing size is set')
  t.doesNotThrow(() => parsePolicy({ ...good, capacity: 4503599626, refillPerSecond: 1, maxWaitMs: 1000 }), 'the last window a wait of 1 s fits with')
  t.doesNotThrow(() => parsePolicy({ ...good, capacity: 4503599627.370496, refillPerSecond: 1 }), 'a window of exactly 2^52 µs')
  t.throws(() => parsePolicy({ ...good, capacity: 4503599627.3705, refillPerSecond: 1 }), { message: /`policy\.refillPerSecond` must be at least capacity/ }, 'just past it')
})

t.test('a shadow policy may cost more than its capacity, up to 2^52 µs of refill', async (t) => {
  const shadow = parsePolicy({ ...good, shadow: true, cost: 50 })
  t.equal(shadow.cost, 50)
  t.equal(maxCost(shadow), MAX_WINDOW_US / 1e6 * 2)
  t.equal(costBound(shadow), `${MAX_WINDOW_US / 1e6 * 2} (2^52 µs of refill, on a shadow policy)`)
  t.equal(maxCost(parsePolicy(good)), 10)
  t.equal(costBound(parsePolicy(good)), 'capacity (10)')
  t.throws(() => parsePolicy({ ...good, shadow: true, cost: 1e10 }), { message: /`policy\.cost` must be at most 9007199254\.740992 \(2\^52 µs of refill/ })
})

t.test('unsettled and checkPolicies: what reservations and lists refuse', async (t) => {
  const plain = parsePolicy(good)
  t.doesNotThrow(() => { unsettled(plain, 'p.') })
  t.doesNotThrow(() => { unsettled({ ...plain, shadow: false }, 'p.') }, 'shadow: false is no shadow')
  isOptionError(t, thrown(() => { unsettled({ ...plain, shadow: true }, 'p.') }), { name: 'p.shadow', got: 'true', expect: 'unset to reserve and settle' }, 'shadow')
  isOptionError(t, thrown(() => { unsettled({ ...plain, maxWaitMs: 5 }, 'p.') }), { name: 'p.maxWaitMs', got: '5' }, 'maxWaitMs')
  t.doesNotThrow(() => { checkPolicies([{ ...plain, lockout: { after: 1, withinMs: 1, forMs: 1 } }]) }, 'one policy may have a lockout')
  isOptionError(t, thrown(() => { checkPolicies([plain, { ...plain, maxWaitMs: 5 }]) }), { name: 'policy[1].maxWaitMs', got: '5', expect: 'unset in an array of policies' }, 'a list')
})

t.test('routeName: method and pattern, never the URL; HEAD is GET; methods sorted once', async (t) => {
  t.equal(routeName('GET', '/users/:id'), 'GET /users/:id')
  t.equal(routeName('HEAD', '/users/:id'), 'GET /users/:id', 'HEAD spends from GET\'s bucket')
  t.equal(routeName(['POST', 'GET'], '/multi'), 'GET,POST /multi')
  t.equal(routeName(['GET', 'HEAD', 'POST'], '/multi'), 'GET,POST /multi', 'HEAD folded into GET, once')
})

const defaults: Defaults = { capacity: 5, refillPerSecond: 1, failureMode: 'open' }

t.test('compileRoute: the route\'s policy merged over the adapter\'s options, its bucket the route\'s name', async (t) => {
  const plain = compileRoute('GET /x', undefined, defaults)
  t.same(plain.policies, [{ bucket: 'GET /x', capacity: 5, refillPerSecond: 1, failureMode: 'open' }], 'no config: the defaults, under the route\'s name')
  t.equal(plain.headers, 'draft-6', 'draft-6 by default')
  t.equal(plain.tiers, undefined)
  t.equal(plain.key, undefined)

  const own = compileRoute('GET /x', { capacity: 2, cost: 2, headers: 'legacy' }, { ...defaults, bucket: 'shared' })
  t.same(own.policies, [{ bucket: 'shared', capacity: 2, refillPerSecond: 1, failureMode: 'open', cost: 2 }], 'the adapter\'s bucket names the route\'s, its fields over the defaults')
  t.equal(own.headers, 'legacy')

  const list = compileRoute('GET /x', [{ capacity: 2 }, { capacity: 100, refillPerSecond: 0.01 }, { bucket: 'day', capacity: 9 }], { ...defaults, lease: { tokens: 2, maxAgeMs: 5 } })
  t.same(list.policies.map((p) => p.bucket), ['GET /x', 'GET /x#1', 'day'], 'the second and later policies are numbered unless named')
  t.same(list.policies.map((p) => p.lease), [undefined, undefined, undefined], 'a default lease is dropped on a list (leases serve single-policy routes)')

  const cost = (): number => 2
  const fns = compileRoute<unknown>('GET /x', [{ bucket: 'a', cost }, { bucket: 'b' }], defaults)
  t.equal(fns.costFns[0], cost, 'a cost function is kept for the request')
  t.equal(fns.costFns[1], undefined)
  t.notOk('cost' in (fns.policies[0] as Policy), 'and is not the core\'s cost')

  const key = (): string => 'k'
  const wide = compileRoute<unknown>('GET /x', [{ bucket: 'a', key }, { bucket: 'b' }], defaults)
  t.equal(wide.key, key, 'a route-wide setting set on one policy holds for the route')
  t.equal(compileRoute<unknown>('GET /x', [{ bucket: 'a' }], { ...defaults, key }).key, key, 'or from the adapter\'s options')
  t.throws(() => compileRoute('GET /x', [{ bucket: 'a', key }, { bucket: 'b', key: () => 'other' }], defaults), { message: /`config\.rateLimit of GET \/x: key` must be the same in every policy/ })
  t.doesNotThrow(() => compileRoute('GET /x', [{ bucket: 'a', key }, { bucket: 'b', key }], defaults), 'the same function twice is the same setting')
})

t.test('compileRoute: shadow policies never show in the headers', async (t) => {
  const denial: Decision = { allowed: true, limit: 9, remaining: 3, resetMs: 1000, retryAfterMs: 0, source: 'store', bucket: 'seen' }
  const mixed = compileRoute('GET /x', [{ bucket: 'seen', capacity: 9 }, { bucket: 'trial', capacity: 100, shadow: true }], { ...defaults, headers: 'draft-10' })
  t.same(headerPairs(mixed.headers, { ...denial, policies: [denial] }, mixed.policyHeaders)[0], ['ratelimit-policy', '"seen";q=9;w=9'], 'only the enforced one is listed')
  const shadowOnly = compileRoute('GET /x', { shadow: true }, defaults)
  t.equal(shadowOnly.headers, false, 'a route of shadow policies only sends no headers')
})

t.test('checkDefaults: the adapter\'s own options that can be checked before any route', async (t) => {
  isOptionError(t, thrown(() => { checkDefaults({ capacity: 3, cost: 4 }, '') }), { name: 'cost', got: '4', expect: 'at most capacity (3)' }, 'cost')
  t.doesNotThrow(() => { checkDefaults({ capacity: 3, cost: 4, shadow: true }, '') }, 'a shadow default may cost more')
  isOptionError(t, thrown(() => { checkDefaults({ capacity: 3, lease: { tokens: 4, maxAgeMs: 1 } }, '') }), { name: 'lease.tokens', got: '4' }, 'lease')
  isOptionError(t, thrown(() => { checkDefaults({ failureMode: 'local' }, 'o.') }), { name: 'o.local', got: 'undefined' }, 'local')
  t.doesNotThrow(() => { checkDefaults({ cost: 4 }, '') }, 'no capacity yet: the route will tell')
})

t.test('programmatic policies: merged over the defaults once per object; route settings refused', async (t) => {
  const programmatic = programmaticPolicies({ ...defaults, cost: 2, headers: 'legacy', key: () => 'k' }, 'fastify')
  const policy = { bucket: 'b', capacity: 8 }
  const core = programmatic(policy)
  t.same(core, { bucket: 'b', capacity: 8, refillPerSecond: 1, failureMode: 'open', cost: 2 }, 'the core\'s fields only, over the defaults')
  t.equal(programmatic(policy), core, 'kept per policy object')
  isOptionError(t, thrown(() => programmatic({ bucket: 'b', key: () => 'x' } as never)), { name: 'policy.key', expect: 'unset: it is a route setting' }, 'key')
  isOptionError(t, thrown(() => programmatic({ bucket: 'b', headers: 'draft-6' } as never)), { name: 'policy.headers', got: '"draft-6"' }, 'headers')
  isOptionError(t, thrown(() => programmatic({ bucket: 'b', cost: (() => 2) as never })), { name: 'policy.cost', got: 'a function', expect: 'a number (pass a computed cost as the third argument)' }, 'a cost function')
  isOptionError(t, thrown(() => programmatic('b' as never)), { name: 'policy', got: '"b"' }, 'not an object')
  t.match((thrown(() => programmatic({ bucket: 'b', limit: () => false } as never)) as Error).message, 'unknown option `policy.limit`', 'plans are a route\'s')
  t.match((thrown(() => programmatic({ bucket: 'b', capcity: 1 } as never)) as Error).message, 'did you mean `policy.capacity`?', 'a misspelt name is caught before the merge')
  isOptionError(t, thrown(() => programmaticPolicies({ refillPerSecond: 1, failureMode: 'open' }, 'fastify')({ bucket: 'b' })),
    { name: 'policy.capacity', got: 'undefined', expect: 'set it on the plugin or the route' }, 'no capacity anywhere')
})

t.test('the policy table (lib/core/policy-fields.ts): the store\'s fields, the extended path, one rule per refusal', async (t) => {
  t.same(STORE_FIELDS, ['bucket', 'capacity', 'refillPerSecond', 'cost'], 'what a BucketSpec carries (its key names the bucket)')
  t.same(EXTENDED, ['shadow', 'lockout', 'maxWaitMs'], 'the fields that take the extended decision path')
  const lockout = { after: 1, withinMs: 1000, forMs: 1000 }
  isOptionError(t, thrown(() => { checkCombination({ lockout }, ['list'], 'p[1].') }), { name: 'p[1].lockout', expect: 'unset in an array of policies' }, 'a list refuses a lockout')
  isOptionError(t, thrown(() => { checkCombination({ shadow: true, lease: { tokens: 1, maxAgeMs: 1 } }, ['reserve'], 'policy.') }), { name: 'policy.lease', expect: 'unset to reserve' }, 'a reservation names the first refused field, in the table\'s order')
  t.doesNotThrow(() => { checkCombination({ shadow: false, lockout }, [], '') }, 'no use, no refusal')
  t.doesNotThrow(() => { checkCombination({ shadow: false }, ['settle'], '') }, 'a boolean counts only when true')
})
