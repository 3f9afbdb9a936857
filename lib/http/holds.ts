// What a request holds after its decision, released once when it ends.
//
// The decision step attaches a hold to the request (`hold`): a reservation
// to settle, or any other per-request resource that must be given back
// however the request ends. The adapter tells the end once (`ended`): the
// response was sent ('finished'), or the client left or the response was
// destroyed before finishing ('gone'). Each hold then runs once, in the
// order they were attached; a hold that throws or rejects is handed to
// `failed` and the others still run, since no answer can carry an error
// any more. A request that holds nothing has no list: the adapter listens
// for the end only when `holding` says so, so such a request costs nothing.

import type { ServerResponse } from 'node:http'

/** How a request ended: its response was sent, or it was not (the client left, the response was destroyed). */
export type EndKind = 'finished' | 'gone'

/** The end of a request, as the adapter tells it: how, and its response (what a `settle` function reads). */
export interface End {
  how: EndKind
  response: unknown
}

/** What a hold does when its request ends. */
export type Release = (end: End) => void | Promise<void>

const kHolds = Symbol('tollgate.holds')

/** A request as it carries its holds: any object, with this module's optional slot (nothing else reads it). */
type Carrier = object & { [kHolds]?: Release[] | undefined }

/** The request property that holds the list, for a framework to declare. */
export const HOLDS = kHolds

/** Attaches a hold to the request, released when `ended` is called for it. */
export function hold (request: object, release: Release): void {
  const carrier: Carrier = request
  const list = carrier[kHolds]
  if (list === undefined) carrier[kHolds] = [release]
  else list.push(release)
}

/** Whether the request holds anything: only then does its adapter listen for its end. */
export function holding (request: object): boolean {
  const carrier: Carrier = request
  return carrier[kHolds] !== undefined
}

/**
 * The request has ended: runs each of its holds once, in order, and
 * resolves when all have; a later call finds none. Never rejects: a
 * failing hold goes to `failed`.
 */
export async function ended (request: object, end: End, failed: (err: unknown) => void): Promise<void> {
  const carrier: Carrier = request
  const list = carrier[kHolds]
  if (list === undefined) return
  carrier[kHolds] = undefined
  for (const release of list) {
    try {
      await release(end)
    } catch (err) {
      failed(err)
    }
  }
}

/**
 * A Node response's end, told once: 'finished' when it has been sent,
 * 'gone' when it closed first (its client left, or it was destroyed); at
 * once when either is so already.
 */
export function whenEnded (res: ServerResponse, then: (how: EndKind) => void): void {
  if (res.writableFinished) return then('finished')
  if (res.destroyed) return then('gone')
  // 'finish' comes before 'close' on a response that was sent.
  const finish = (): void => {
    res.removeListener('close', close)
    then('finished')
  }
  const close = (): void => {
    res.removeListener('finish', finish)
    then('gone')
  }
  res.once('finish', finish)
  res.once('close', close)
}
