import { wholeTokens, type BucketSpec, type LeaseReply } from './store.js'
import type { Decision, Policy } from './types.js'

/** Lease settings of a policy: batch size and the longest a batch is kept. */
export interface LeaseOptions {
  tokens: number
  maxAgeMs: number
}

interface Lease {
  spec: BucketSpec
  /** Unspent tokens of this app server. */
  left: number
  /** performance.now() when the batch was taken. */
  takenAt: number
  /** The bucket's tokens, outside any lease, at that moment. */
  bucketLeft: number
  /** Microseconds until the bucket was full, at that moment. */
  fullInUs: number
}

/**
 * Token leases held by this app server: batches taken from Redis buckets
 * in one atomic call (lua/lease.lua) and spent here without a call. The
 * tokens of a lease were removed from the shared bucket when it was taken,
 * so the fleet can never spend more than the bucket allows; what a lease
 * costs is under-admission: its unspent tokens are out of the bucket until
 * they are given back (with the next call for that bucket once the lease is
 * older than `maxAgeMs` or too small for a request, and on close).
 *
 * With the denial cache on, a client that a lease call denies is denied in
 * this process until a whole batch (`tokens`) could be taken, not just its
 * cost: a flood then costs one call per batch instead of one per token, at
 * the price of turning the client away for up to (tokens - cost) / refill
 * seconds longer than Redis would.
 *
 * Size-capped: past `maxKeys` the oldest lease is dropped and its unspent
 * tokens are lost to the bucket until they refill.
 */
export class LeaseBook {
  readonly #leases = new Map<string, Lease>()
  readonly #maxKeys: number

  constructor (maxKeys: number) {
    this.#maxKeys = maxKeys
  }

  /** Spends `cost` from a fresh enough lease of this bucket; undefined when there is none. */
  spend (policy: Policy, spec: BucketSpec, maxAgeMs: number): Decision | undefined {
    const lease = this.#leases.get(spec.key)
    if (lease === undefined) return undefined
    const age = performance.now() - lease.takenAt
    if (age >= maxAgeMs || lease.left < spec.cost) return undefined
    lease.left -= spec.cost
    return {
      allowed: true,
      limit: policy.capacity,
      remaining: wholeTokens(Math.min(policy.capacity, lease.bucketLeft + lease.left)),
      resetMs: Math.max(0, lease.fullInUs / 1000 - age),
      retryAfterMs: 0,
      source: 'cache',
      bucket: policy.bucket
    }
  }

  /** Takes the lease of a bucket out, for giving its unspent tokens back; 0 when there is none. */
  release (key: string): number {
    const left = this.#leases.get(key)?.left ?? 0
    this.#leases.delete(key)
    return left
  }

  /** Records what a lease call took beyond the request's own cost. */
  add (spec: BucketSpec, reply: LeaseReply): void {
    const extra = reply.taken - spec.cost
    const existing = this.#leases.get(spec.key)
    const lease: Lease = {
      spec,
      left: extra + (existing?.left ?? 0),
      takenAt: performance.now(),
      bucketLeft: reply.bucket.remaining,
      fullInUs: reply.bucket.fullInUs
    }
    this.#leases.delete(spec.key)
    this.#leases.set(spec.key, lease)
    if (this.#leases.size > this.#maxKeys) this.#leases.delete(this.#leases.keys().next().value as string)
  }

  forget (key: string): void {
    this.#leases.delete(key)
  }

  /** Takes every lease out, for giving the unspent tokens back. */
  drain (): Array<[BucketSpec, number]> {
    const out: Array<[BucketSpec, number]> = []
    for (const lease of this.#leases.values()) if (lease.left > 0) out.push([lease.spec, lease.left])
    this.#leases.clear()
    return out
  }
}
