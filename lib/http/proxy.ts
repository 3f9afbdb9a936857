// Which proxies to believe, for a framework that has no setting of its own
// (Hono): the client of a request is the socket's peer, or, when that peer
// is a trusted proxy, the address it appended to X-Forwarded-For, and so on
// from the right over every trusted hop (docs/guides/proxies.md).
//
// The setting takes the values of Express's 'trust proxy', with its
// meaning, so that one table of set-ups serves both: `false` (no proxy,
// the default), `true` (every hop: a client then picks its own address),
// a hop count, addresses and subnets (a comma-separated string or an
// array, with the names 'loopback', 'linklocal' and 'uniquelocal'), or a
// function `(address, hop) => boolean`. The walk over X-Forwarded-For and
// the address matching are @fastify/proxy-addr's, the module Express's and
// Fastify's own settings are compiled with.

import proxyaddr from '@fastify/proxy-addr'
import { messageOf, optionError } from '../core/errors.js'
import { PROBE_HOPS, trustsEveryHop } from './setup.js'

/** The `trustProxy` option: Express's 'trust proxy' values. */
export type TrustProxy = boolean | number | string | readonly string[] | ((address: string | undefined, hop: number) => boolean)

/** A compiled setting: whether the address at hop `hop` (0: the socket's peer) is a trusted proxy. */
export type Trust = (address: string | undefined, hop: number) => boolean

/** `trustProxy`: checked by compiling it (a bad address or subnet is named). */
export function trustProxyOption (value: unknown, name: string): void {
  compileTrust(value, name)
}

/**
 * The trust function of a setting, or undefined for no proxy at all (the
 * client is then the socket's peer, and X-Forwarded-For is never read).
 */
export function compileTrust (value: unknown, name = 'trustProxy'): Trust | undefined {
  const expected = "false, true, a hop count (an integer >= 0), addresses or subnets (a string, comma-separated, or an array of them; 'loopback', 'linklocal', 'uniquelocal'), or a function (address, hop) => boolean"
  if (value === false || value === undefined || value === 0) return undefined
  if (value === true) return () => true
  // The app's function and proxy-addr's compiled one are taken at the
  // signature the option declares; proxy-addr's types omit the undefined
  // address of a socket without one, which it handles.
  if (typeof value === 'function') return value as Trust
  if (typeof value === 'number') {
    if (!Number.isInteger(value) || value < 0) throw optionError(name, value, expected)
    return (_address, hop) => hop < value
  }
  const list = typeof value === 'string' ? value.split(',').map((s) => s.trim()) : value
  if (!Array.isArray(list) || list.length === 0 || !list.every((s) => typeof s === 'string' && s !== '')) throw optionError(name, value, expected)
  try {
    return proxyaddr.compile(list) as Trust
  } catch (err) {
    throw optionError(name, value, `${expected}: ${messageOf(err)}`)
  }
}

/** Whether a compiled setting trusts every address at every hop (a client then picks its own address). */
export function trustsAll (trust: Trust): boolean {
  return trustsEveryHop(() => PROBE_HOPS.every((address, hop) => trust(address, hop)))
}

/**
 * The client's address: the socket's peer, or the rightmost address of
 * X-Forwarded-For past the trusted hops. Undefined without a socket address
 * that no trusted hop replaces.
 */
export function clientAddress (socket: string | undefined, forwardedFor: string | undefined, trust: Trust): string | undefined {
  if (forwardedFor === undefined) return socket
  // proxy-addr reads only these two fields of the IncomingMessage its types ask for.
  const request = { socket: { remoteAddress: socket }, headers: { 'x-forwarded-for': forwardedFor } }
  return proxyaddr(request as never, trust as (addr: string, i: number) => boolean)
}
