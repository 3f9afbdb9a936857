// The failure modes (README "When Redis fails") without Redis: the limiter's
// engine, wired as createCore wires it, over a store of the Store interface
// that rejects, never answers or answers with a reply error, on a fake
// clock. Each mode's decision, the breaker's cool-down and probe, the
// deadline, the local fallback's own buckets, and reservations.

import diagnostics from 'node:diagnostics_channel'
import t from 'tap'
import { Guard, provesAlive } from '../../lib/core/guard.js'
import { createCore } from '../../lib/core/limiter.js'
import type { NonEmpty } from '../../lib/core/lists.js'
import type { Decision, Policy } from '../../lib/core/types.js'
import { FakeTime, settled } from './helpers/fake-time.js'
import { FailingStore, UNIT_KEY_SECRET, engineOver } from './helpers/failing-store.js'
import { keyUnder } from '../helpers/keys.js'
import { memoryLog, type Test } from './helpers/option-error.js'

const open: Policy = { bucket: 'open', capacity: 5, refillPerSecond: 1, failureMode: 'open' }
const closed: Policy = { bucket: 'closed', capacity: 5, refillPerSecond: 1, failureMode: 'closed' }
const local: Policy = { bucket: 'local', capacity: 100, refillPerSecond: 100, failureMode: 'local', local: { capacity: 2, refillPerSecond: 1 } }

function setup (t: Test, options: Parameters<typeof engineOver>[2] = {}) {
  const time = new FakeTime()
  const store = new FailingStore(time)
  const wired = engineOver(store, time, options)
  t.teardown(() => wired.engine.close())
  const decide = (key: string, list: NonEmpty<Policy>, consume = true): Promise<Decision> => wired.engine.decide(key, list, undefined, consume)
  return { time, store, decide, ...wired }
}

function watch (t: Test, channel: string): unknown[] {
  const seen: unknown[] = []
  const listener = (message: unknown): void => { seen.push(message) }
  diagnostics.subscribe(channel, listener)
  t.teardown(() => diagnostics.unsubscribe(channel, listener))
  return seen
}

t.test('a store that answers decides; each mode only applies when it fails', async (t) => {
  const { store, decide } = setup(t)
  store.behaviour = 'answer'
  t.match(await decide('a', [closed]), { allowed: true, remaining: 4, source: 'store' })
  t.equal(store.calls, 1)
})

t.test('a rejecting store: open allows, closed refuses, local decides in process at its own sizes', async (t) => {
  const { decide, time } = setup(t, { breaker: { failures: 1000, cooldownMs: 1000 } })
  t.same(await decide('a', [open]), { allowed: true, limit: 5, remaining: 0, resetMs: 0, retryAfterMs: 0, source: 'fail-open', bucket: 'open' })
  t.same(await decide('a', [closed]), { allowed: false, limit: 5, remaining: 0, resetMs: 0, retryAfterMs: 1000, source: 'fail-closed', bucket: 'closed' },
    'closed: retry in a second while the breaker is closed')
  t.match(await decide('a', [local]), { allowed: true, limit: 2, remaining: 1, source: 'local', bucket: 'local' }, 'the local sizes, not the shared ones')
  t.match(await decide('a', [local]), { allowed: true, remaining: 0, source: 'local' })
  t.match(await decide('a', [local]), { allowed: false, retryAfterMs: 1000, source: 'local' }, 'the local bucket limits')
  t.match(await decide('b', [local]), { allowed: true, source: 'local' }, 'per client')
  await time.advance(1000)
  t.match(await decide('a', [local]), { allowed: true, source: 'local' }, 'and refills on the injected clock')
  t.match(await decide('a', [local], false), { allowed: false, source: 'local' }, 'a peek falls back too, spending nothing')
})

t.test('several policies: any closed one closes; else the local ones decide; else open', async (t) => {
  const { decide } = setup(t, { breaker: { failures: 1000, cooldownMs: 1000 } })
  const both = await decide('a', [open, closed])
  t.match(both, { allowed: false, source: 'fail-closed', bucket: 'closed' }, 'the closed policy is named')
  t.same(both.policies?.map((d) => [d.bucket, d.allowed]), [['open', false], ['closed', false]])
  t.match(await decide('a', [open, { ...closed, shadow: true }]), { allowed: true, source: 'fail-open' }, 'a shadow policy never closes a request')
  const mixed = await decide('a', [open, local])
  t.match(mixed, { allowed: true, source: 'local', bucket: 'local', limit: 2 }, 'only the local policy decides, in process')
  t.equal(mixed.policies, undefined, 'as the one policy it is')
})

t.test('the breaker: opens after `failures`, skips the store for the cool-down, lets one probe through', async (t) => {
  const { logger, lines } = memoryLog()
  const { decide, store, time, guard } = setup(t, { breaker: { failures: 3, cooldownMs: 5000 }, logger })
  const states = watch(t, 'tollgate:breaker')
  const stores = watch(t, 'tollgate:store')
  for (let i = 0; i < 3; i++) await decide('a', [closed])
  t.equal(store.calls, 3)
  t.same(states, [{ state: 'open', cooldownMs: 5000 }], 'three failures open it')
  t.equal(guard.state, 'failing')
  t.match(stores, [{ state: 'failing' }], 'the store turned failing once')
  const skipped = await decide('a', [closed])
  t.equal(store.calls, 3, 'an open breaker skips the store')
  t.equal(skipped.retryAfterMs, 5000, 'a closed policy says to come back when the breaker will probe')
  await time.advance(2000)
  t.equal((await decide('a', [closed])).retryAfterMs, 3000, 'what is left of the cool-down, on the injected clock')
  t.match(await decide('a', [open]), { source: 'fail-open' })
  t.match(await decide('a', [local]), { source: 'local' })
  t.equal(store.calls, 3)

  await time.advance(2999)
  await decide('a', [open])
  t.equal(store.calls, 3, '1 ms early: still skipped')
  await time.advance(1)
  store.behaviour = 'hang'
  const probe = decide('a', [open])
  t.equal(store.calls, 4, 'at the end of the cool-down one probe goes through')
  t.match(await decide('a', [open]), { source: 'fail-open' }, 'and only one: the next call falls back at once')
  t.equal(store.calls, 4)
  t.same(states.slice(1), [{ state: 'half-open' }])
  store.behaviour = 'answer'
  // The probe never answers: its deadline (10 ms) fails it, and the breaker opens again.
  await time.advance(10)
  await settled()
  t.match(await probe, { source: 'fail-open' }, 'the hung probe answers at its deadline, by its mode')
  t.same(states.slice(2), [{ state: 'open', cooldownMs: 5000 }], 'and opens the breaker for another cool-down')
  await time.advance(5000)
  t.match(await decide('a', [closed]), { source: 'store', allowed: true, remaining: 4 }, 'the next probe reaches the store, which decides')
  t.same(states.slice(3), [{ state: 'half-open' }, { state: 'closed' }])
  t.equal(guard.state, 'healthy')
  t.match(stores.at(-1), { state: 'healthy', decisions: { local: 1, 'fail-open': 4, 'fail-closed': 5 } }, 'the recovery counts the fallbacks by mode')
  t.same(lines.map((l) => `${l.level} ${l.msg}`), ['warn rate limit store failing; limits follow their failure modes', 'info rate limit store recovered'])
  t.same(lines[1]?.obj, { downMs: 10010, decisions: { local: 1, 'fail-open': 4, 'fail-closed': 5 } }, 'the outage lasted 10010 ms of the injected clock')
})

t.test('a store that never answers: the decision comes at the deadline, by its mode', async (t) => {
  const { decide, store, time } = setup(t, { timeout: 5 })
  store.behaviour = 'hang'
  let decision: Decision | undefined
  void decide('a', [{ ...closed, timeout: 20 }]).then((d) => { decision = d })
  await settled()
  t.equal(decision, undefined, 'no answer before the deadline on the injected clock, whatever the real time')
  await time.advance(19)
  await settled()
  t.equal(decision, undefined, '1 ms early: still waiting')
  await time.advance(1)
  await settled()
  t.match(decision, { allowed: false, source: 'fail-closed' }, 'at the policy\'s own deadline (20 ms), closed')
  let open5: Decision | undefined
  void decide('b', [open]).then((d) => { open5 = d })
  await time.advance(5)
  await settled()
  t.match(open5, { allowed: true, source: 'fail-open' }, 'a policy without a timeout has the limiter\'s (5 ms)')
})

t.test('a reply error of a live server fails that call only: the breaker stays closed, the key is logged', async (t) => {
  const { logger, lines } = memoryLog()
  const { decide, store, guard } = setup(t, { breaker: { failures: 2, cooldownMs: 60_000 }, logger })
  store.behaviour = 'reply-error'
  for (let i = 0; i < 5; i++) t.match(await decide('a', [closed]), { source: 'fail-closed' }, `call ${i + 1} follows its mode`)
  t.equal(store.calls, 5, 'every call still reaches the store')
  t.equal(guard.state, 'healthy')
  t.equal(guard.cooldownLeftMs, 0)
  t.equal(lines.length, 5)
  t.match(lines[0], { level: 'error', msg: 'rate limit key holds a value of the wrong type', obj: { keys: [keyUnder(UNIT_KEY_SECRET, 'tollgate', 'a', 'closed')] } })
})

t.test('provesAlive: only a reply error of a server that can serve is a sign of life', async (t) => {
  const reply = (message: string): Error => Object.assign(new Error(message), { name: 'ReplyError' })
  for (const code of ['LOADING', 'BUSY', 'MASTERDOWN', 'CLUSTERDOWN', 'READONLY', 'MISCONF', 'OOM', 'TRYAGAIN', 'NOREPLICAS', 'NOAUTH', 'NOPERM']) {
    t.equal(provesAlive(reply(`${code} the server says no`)), false, code)
  }
  t.equal(provesAlive(reply("ERR unknown command 'evalsha', with args beginning with: ")), false, 'scripts refused')
  t.equal(provesAlive(reply("ERR The user executing the script can't run this command or subcommand script: 3a23, on @user_script:87.")), false, 'a command refused inside a script')
  t.equal(provesAlive(reply('ERR Write commands are not allowed from read-only scripts. script: 3a23, on @user_script:87.')), false, 'a script run read-only')
  t.equal(provesAlive(reply('WRONGTYPE Operation against a key holding the wrong kind of value')), true)
  t.equal(provesAlive(reply('ERR value is not an integer or out of range')), true)
  t.equal(provesAlive(reply('BUSYKEY Target key name already exists.')), true, 'BUSYKEY is not BUSY')
  t.equal(provesAlive(new Error('WRONGTYPE')), false, 'not a reply error: a client-side failure')
})

t.test('the guard: a call that throws is a failure; a late failure after the deadline counts once', async (t) => {
  const time = new FakeTime()
  const store = new FailingStore(time)
  const guard = new Guard(store, { failures: 2, cooldownMs: 1000 }, undefined, time)
  t.teardown(() => { guard.close() })
  await t.rejects(guard.run(() => { throw new Error('boom') }, 1000, []), { code: 'TOLLGATE_STORE_ERROR', message: 'store call failed: boom' })
  t.equal(guard.state, 'failing')
  let late: (err: Error) => void = () => {}
  const call = t.rejects(guard.run(() => new Promise<never>((_resolve, reject) => { late = reject }), 20, []),
    { code: 'TOLLGATE_STORE_TIMEOUT', message: 'store gave no answer within 20 ms' })
  await time.advance(20)
  await call
  t.equal(guard.cooldownLeftMs, 1000, 'the second failure opened the breaker')
  late(new Error('Connection is closed.'))
  await settled()
  t.equal(guard.cooldownLeftMs, 1000, 'the late rejection changes nothing')
  await t.rejects(guard.run(() => Promise.resolve(1), 1000, []), { code: 'TOLLGATE_BREAKER_OPEN' })
  await time.advance(1000)
  t.equal(await guard.run(() => Promise.resolve('up'), 1000, []), 'up', 'the probe after the cool-down')
  t.equal(guard.state, 'healthy')
})

t.test('reservations on a failing store: closed spends nothing, local spends and settles in process', async (t) => {
  const { engine, parts, store } = setup(t, { breaker: { failures: 1000, cooldownMs: 1000 } })
  const refused = await engine.reserve('a', [closed], [3])
  t.match(refused.decision, { allowed: false, source: 'fail-closed' })
  await parts.book.settle(refused, 0)
  t.equal(store.calls, 1, 'a reservation that spent nothing settles nothing')

  const localBig: Policy = { ...local, local: { capacity: 10, refillPerSecond: 0.001 } }
  const held = await engine.reserve('a', [localBig], [8])
  t.match(held.decision, { allowed: true, source: 'local', remaining: 2 })
  await parts.book.settle(held, 3)
  t.equal(store.calls, 2, 'settled in the local bucket, not in the store')
  t.match(await engine.decide('a', [localBig], undefined, false), { source: 'local', remaining: 7 }, 'charged 3 of the 8 reserved, in process')
  await t.rejects(parts.book.settle(held, 0), /each settles once/)
})

t.test('lockouts and waits on a failing store: local decides with its lockout; others by their mode', async (t) => {
  const { engine, store } = setup(t, { breaker: { failures: 1000, cooldownMs: 1000 } })
  const pin: Policy = { bucket: 'pin', capacity: 5, refillPerSecond: 5, failureMode: 'local', local: { capacity: 1, refillPerSecond: 0.001 }, lockout: { after: 1, withinMs: 60_000, forMs: 30_000 } }
  t.match(await engine.decide('u', [pin], undefined, true), { allowed: true, source: 'local', limit: 1 })
  const locked = await engine.decide('u', [pin], undefined, true)
  t.match(locked, { allowed: false, source: 'local', locked: true }, 'the local bucket keeps the lockout')
  t.ok(locked.retryAfterMs > 29_000 && locked.retryAfterMs <= 30_000, `for forMs (${locked.retryAfterMs})`)
  t.match(await engine.decide('u', [{ ...pin, failureMode: 'closed', local: undefined }], undefined, true), { allowed: false, source: 'fail-closed' })
  t.match(await engine.decide('u', [{ ...pin, failureMode: 'open', local: undefined, lockout: undefined, maxWaitMs: 100 }], undefined, true), { allowed: true, source: 'fail-open' })
  t.equal(store.calls, 4, 'each of them asked the store first')
})

t.test('the key secret\'s read, as the half-open probe: its success neither closes the breaker nor blocks the next probe', async (t) => {
  const { store, decide, guard, time } = setup(t, { breaker: { failures: 1, cooldownMs: 1000 } })
  t.match(await decide('a', [closed]), { source: 'fail-closed' }, 'one failure opens the breaker')
  await time.advance(1000)
  store.behaviour = 'answer'
  t.equal(await guard.run(async () => 'secret', 100, [], true), 'secret', 'the read is let through as the probe')
  t.ok(guard.cooldownLeftMs === 0 && guard.state === 'failing', 'the breaker is not closed by it, nor the outage ended')
  t.match(await decide('a', [closed]), { source: 'store' }, 'the next call is the probe, and a decision closes the breaker')
  t.equal(guard.state, 'healthy')
})

t.test('a store no other process shares (no client): denials are cached, with no fleet channel to hear', async (t) => {
  const time = new FakeTime()
  const store = new FailingStore(time)
  store.behaviour = 'answer'
  const { limiter } = createCore({ keySecret: UNIT_KEY_SECRET }, { time, store })
  t.teardown(() => limiter.close())
  const one: Policy = { bucket: 'one', capacity: 1, refillPerSecond: 1, failureMode: 'closed' }
  t.match(await limiter.consume('a', one), { allowed: true, source: 'store' })
  t.match(await limiter.consume('a', one), { allowed: false, source: 'store' })
  t.match(await limiter.consume('a', one), { allowed: false, source: 'cache' }, 'the denial is cached')
  t.equal(store.calls, 2, 'the third call never reached the store')
  await limiter.reset('a', 'one')
  t.match(await limiter.consume('a', one), { allowed: true, source: 'store' }, 'a reset reaches the store, and nothing else')
})
