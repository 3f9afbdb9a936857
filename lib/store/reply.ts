// The scripts' replies, read as the scripts write them (each script's
// header gives its reply). A client hands a reply over as `unknown`; these
// readers check each value they take. A number may come as a string: the
// scripts send fractions with `tostring`, and a client may map integers to
// strings (node-redis's `withTypeMapping`). Any other shape (a script of
// another version under the same name, a client that changed the reply
// beyond that) fails its call as a script error would, instead of
// becoming NaN in a decision.

import { StoreError } from './errors.js'

/** The error of a reply of another shape than `script` gives. */
export function unexpectedReply (script: string, reply: unknown): StoreError {
  let shown: string
  try {
    shown = JSON.stringify(reply) ?? String(reply)
  } catch {
    shown = String(reply)
  }
  return new StoreError('TOLLGATE_STORE_ERROR', `${script} replied ${shown.slice(0, 200)}, which is not the reply it gives`)
}

/** A number, or the number a string writes; undefined for anything else. */
function numeric (value: unknown): number | undefined {
  if (typeof value === 'number') return value
  if (typeof value !== 'string' || value === '') return undefined
  const number = Number(value)
  return Number.isNaN(number) ? undefined : number
}

/** A reply that is one number. */
export function numberOf (reply: unknown, script: string): number {
  const number = numeric(reply)
  if (number === undefined) throw unexpectedReply(script, reply)
  return number
}

/** The number at `i` of an array reply. */
export function numberAt (reply: unknown, i: number, script: string): number {
  const number = numeric(Array.isArray(reply) ? reply[i] : undefined)
  if (number === undefined) throw unexpectedReply(script, reply)
  return number
}

/** True for an array reply of at least `n` numbers. */
export function isNumbers (reply: unknown, n: number): boolean {
  if (!Array.isArray(reply) || reply.length < n) return false
  for (let i = 0; i < n; i++) if (numeric(reply[i]) === undefined) return false
  return true
}

/** How many values an array reply holds. */
export function lengthOf (reply: unknown, script: string): number {
  if (!Array.isArray(reply)) throw unexpectedReply(script, reply)
  return reply.length
}
