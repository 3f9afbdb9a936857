import type { FastifyReply } from 'fastify'
import type { Decision } from './types.js'

export type HeaderMode = 'draft-6' | 'draft-10' | 'legacy' | false

/** What the headers need of one policy, fixed per route. */
export interface HeaderPolicy {
  capacity: number
  refillPerSecond: number
  bucket: string
}

/** Seconds until a retry may pass: at least 1. */
export function retrySeconds (retryAfterMs: number): number {
  return Math.max(1, Math.ceil(retryAfterMs / 1000))
}

/** Window of a policy in seconds: the time an empty bucket takes to fill. */
export function windowSeconds (policy: HeaderPolicy): number {
  return Math.ceil(policy.capacity / policy.refillPerSecond)
}

/** A string as an RFC 9651 sf-string: printable ASCII, with `"` and `\` escaped. */
export function sfString (text: string): string {
  return '"' + text.replace(/[^\x20-\x7e]/g, '?').replace(/["\\]/g, '\\$&') + '"'
}

/**
 * The RateLimit-Policy values of one route, computed once at start-up:
 * per bucket for draft-6 (which describes one policy), as one list for
 * draft-10; each for the store's policies and for the local fallback's.
 */
export class PolicyHeaders {
  readonly #single = new Map<string, string>()
  readonly #list: string
  readonly #localList: string

  constructor (policies: readonly HeaderPolicy[], local: readonly HeaderPolicy[]) {
    for (const p of policies) this.#single.set(p.bucket, `${p.capacity};w=${windowSeconds(p)}`)
    for (const p of local) this.#single.set('\0' + p.bucket, `${p.capacity};w=${windowSeconds(p)}`)
    this.#list = draft10List(policies)
    this.#localList = draft10List(local)
  }

  single (decision: Decision): string | undefined {
    return this.#single.get(decision.source === 'local' ? '\0' + decision.bucket : decision.bucket)
  }

  list (decision: Decision): string {
    return decision.source === 'local' ? this.#localList : this.#list
  }
}

function draft10List (policies: readonly HeaderPolicy[]): string {
  return policies.map((p) => `${sfString(p.bucket)};q=${p.capacity};w=${windowSeconds(p)}`).join(', ')
}

/**
 * Sets the rate-limit headers of one decision on a reply. With several
 * policies, draft-6 and legacy describe the binding one (`decision` itself),
 * draft-10 lists every policy. Retry-After goes on every denial, whatever
 * the mode.
 */
export function setHeaders (reply: FastifyReply, mode: HeaderMode, decision: Decision, policies: PolicyHeaders): void {
  if (mode === 'draft-6') {
    reply.header('ratelimit-limit', decision.limit)
    reply.header('ratelimit-remaining', decision.remaining)
    reply.header('ratelimit-reset', Math.ceil(decision.resetMs / 1000))
    reply.header('ratelimit-policy', policies.single(decision))
  } else if (mode === 'draft-10') {
    reply.header('ratelimit-policy', policies.list(decision))
    const all = decision.policies ?? [decision]
    let value = ''
    for (const d of all) {
      const t = d.retryAfterMs > 0 ? retrySeconds(d.retryAfterMs) : Math.ceil(d.resetMs / 1000)
      value += `${value === '' ? '' : ', '}${sfString(d.bucket)};r=${d.remaining};t=${t}`
    }
    reply.header('ratelimit', value)
  } else if (mode === 'legacy') {
    reply.header('x-ratelimit-limit', decision.limit)
    reply.header('x-ratelimit-remaining', decision.remaining)
    reply.header('x-ratelimit-reset', Math.ceil(decision.resetMs / 1000))
  }
  if (!decision.allowed) reply.header('retry-after', retrySeconds(decision.retryAfterMs))
}
