// Two middlewares on one bucket, whatever the middleware adapter.
//
// Once per request. A middleware mounted twice on one request's way
// (`app.use(limit)` and `app.use('/api', limit)`; one router mounted at two
// nested paths), or two `rateLimit()` instances with the same options on one
// bucket, would charge the request twice: a capacity of 4 would admit 2
// requests. So a request remembers the limits decided for it, by what makes
// them one limit in Redis (the key prefix, each policy's bucket, capacity
// and rate, and the `key` function), and a limit met again is not charged
// again: the request passes it with the decision it already has.
//
// One policy per bucket across instances. Each `rateLimit()` instance
// refuses a second policy on a bucket it knows (lib/http/registry.ts). Two
// instances cannot refuse each other (two apps of one process may use one
// name for their own buckets), so the second instance to put another
// capacity or rate on a bucket name another live instance uses (same
// prefix) logs one warning naming both; `limit.close()` withdraws an
// instance's names. The table holds at most MAX_OWNED names.

import type { Logger } from '../core/types.js'
import type { RouteLimit } from './route.js'

/** Bucket names the cross-instance table holds at most; past it, new names are not checked. */
export const MAX_OWNED = 10_000

const decided = new WeakMap<object, Set<string>>()
const signatures = new WeakMap<object, string>()
const functionIds = new WeakMap<object, number>()
let nextFunctionId = 0

/**
 * True the first time a request meets this limit (by its signature: see the
 * top of this file), false when it was already decided for the request.
 */
export function firstTime (request: object, limit: RouteLimit<never>, prefix: string): boolean {
  let signature = signatures.get(limit)
  if (signature === undefined) {
    signature = `${prefix}\n${limit.key === undefined ? '' : functionId(limit.key)}\n${limit.policies.map((p) => `${p.bucket}\n${p.capacity}\n${p.refillPerSecond}`).join('\n')}`
    signatures.set(limit, signature)
  }
  let seen = decided.get(request)
  if (seen === undefined) {
    seen = new Set()
    decided.set(request, seen)
  }
  if (seen.has(signature)) return false
  seen.add(signature)
  return true
}

function functionId (fn: object): number {
  let id = functionIds.get(fn)
  if (id === undefined) {
    id = nextFunctionId++
    functionIds.set(fn, id)
  }
  return id
}

interface Owned { owner: object, capacity: number, refillPerSecond: number, where: string, warned: boolean }

const owned = new Map<string, Owned[]>()

/** The cross-instance check of one instance: `claim` each compiled limit, `release` on close. */
export function bucketOwner (prefix: string, log: Logger): { claim: (limit: RouteLimit<never>) => void, release: () => void } {
  const owner = {}
  const mine = new Map<string, Owned[]>()
  function claim (limit: RouteLimit<never>): void {
    for (const p of limit.policies) {
      const name = `${prefix}\n${p.bucket}`
      let owners = owned.get(name)
      if (owners === undefined) {
        if (owned.size >= MAX_OWNED) continue
        owners = []
        owned.set(name, owners)
      }
      if (owners.some((o) => o.owner === owner)) continue
      const other = owners.find((o) => o.capacity !== p.capacity || o.refillPerSecond !== p.refillPerSecond)
      if (other !== undefined && !other.warned) {
        other.warned = true
        log.warn({ bucket: p.bucket }, `tollgate: two rateLimit() instances put different policies on the bucket "${p.bucket}": ${other.where} gives it capacity ${other.capacity} and refillPerSecond ${other.refillPerSecond}, ${limit.name} ${p.capacity} and ${p.refillPerSecond}, and both spend from it; give one of them another \`bucket\``)
      }
      owners.push({ owner, capacity: p.capacity, refillPerSecond: p.refillPerSecond, where: limit.name, warned: other !== undefined })
      mine.set(name, owners)
    }
  }
  function release (): void {
    // Each list is changed in place, and dropped from the table once empty.
    for (const [name, owners] of mine) {
      owners.splice(owners.findIndex((o) => o.owner === owner), 1)
      if (owners.length === 0) owned.delete(name)
    }
    mine.clear()
  }
  return { claim, release }
}
