// The `concurrency` field of a policy (SPEC 13) and the `local` field that
// serves it: how many requests of one client may be in flight at once, and
// for how long a slot whose server died still counts.
//
// Bounds. `max` is a whole number of requests, from 1 to MAX_SLOTS: Redis
// keeps one sorted-set member per slot, so `max` bounds the memory of one
// client's key (SPEC 13). `leaseMs` is whole milliseconds from MIN_LEASE_MS:
// a held slot is renewed a third of a lease before it ends
// (lib/core/concurrency.ts), so a shorter lease would spend a Redis call per
// slot every few hundred milliseconds, and a renewal late by a loaded event
// loop could lose a slot that is still in use; MAX_LEASE_MS (a day) bounds
// how long a dead server's slots stay taken.

import { optionError } from './errors.js'
import { isRecord, localPolicy, parseFields } from './options.js'
import type { ConcurrencyLimit, LocalPolicy } from './types.js'

/** Most slots a concurrency policy may hold per client. */
export const MAX_SLOTS = 100_000
/** Shortest lease of a slot, ms. */
export const MIN_LEASE_MS = 1000
/** Longest lease of a slot, ms: a day. */
export const MAX_LEASE_MS = 86_400_000
/** The lease of a slot whose policy names none, ms. */
export const DEFAULT_LEASE_MS = 60_000

function wholeIn (low: number, high: number, unit: string) {
  return (value: unknown, name: string): number => {
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < low || value > high) {
      throw optionError(name, value, `an integer from ${low} to ${high}${unit}`)
    }
    return value
  }
}

const CONCURRENCY_CHECKS = { max: wholeIn(1, MAX_SLOTS, ''), leaseMs: wholeIn(MIN_LEASE_MS, MAX_LEASE_MS, ' (ms)') }

/** `concurrency: { max, leaseMs? }`. */
export function concurrencyLimit (value: unknown, name: string): ConcurrencyLimit {
  if (!isRecord(value)) throw optionError(name, value, 'an object { max, leaseMs? }')
  return parseFields(value, CONCURRENCY_CHECKS, name + '.', { max: 'an integer from 1 to ' + MAX_SLOTS })
}

/**
 * `local`: `{ capacity, refillPerSecond }` for a rate policy, `{ max }`
 * (an in-process semaphore of that size) for a concurrency policy. Which
 * one a policy needs is checked with the policy's other fields
 * (lib/core/policy-fields.ts checkRequired). A semaphore carries its size
 * as its capacity and rate too, so the fallback paths read numbers.
 */
export function localLimit (value: unknown, name: string): LocalPolicy {
  if (!isRecord(value) || !Object.hasOwn(value, 'max')) return localPolicy(value, name)
  // A semaphore parsed once (a route's fields, parsed again once merged into
  // a policy) carries its size as capacity and rate: it parses to itself.
  const { capacity, refillPerSecond, ...own } = value
  const input = capacity === value.max && refillPerSecond === value.max ? own : value
  const { max } = parseFields(input, { max: CONCURRENCY_CHECKS.max }, name + '.', { max: 'an integer from 1 to ' + MAX_SLOTS })
  return { capacity: max, refillPerSecond: max, max }
}
