// Keys as a limiter names them (docs/reference/keys.md): `<prefix>:{<tag>}<client
// part>:<bucket>`, the tag an HMAC of the client part under the fleet's key
// secret. Tests name a key to write a foreign value into it, to find its
// master, or to list what an app wrote.

import type { Redis, Cluster } from 'ioredis'
import { clientId, hashTag } from '../../lib/core/keys.js'

/** Where a fleet without `keySecret` keeps its random secret (lua/key-secret.lua). */
export function secretKey (prefix: string): string {
  return `${prefix}:{keys}:secret`
}

/** True for the keys of the key secret itself (`<prefix>:{keys}:secret` and `:check`), which are no bucket's. */
export function isSecretKey (key: string, prefix: string): boolean {
  return key.startsWith(`${prefix}:{keys}:`)
}

/** The key of `bucket` for `client` (as the app passes it: an IP, a user name) under `secret`. */
export function keyUnder (secret: string, prefix: string, client: string, bucket: string): string {
  const id = clientId(client)
  return `${prefix}:{${hashTag(Buffer.from(secret, 'utf8'), id)}}${id}:${bucket}`
}

/** The fleet's random secret under `prefix`, once a limiter created it (its start-up, or its first call). */
export async function fleetSecret (redis: Redis | Cluster, prefix: string): Promise<string> {
  const secret = await redis.get(secretKey(prefix))
  if (secret === null) throw new Error(`no key secret at ${secretKey(prefix)} yet`)
  return secret
}

/** The key of `bucket` for `client` in the fleet under `prefix` (see fleetSecret). */
export async function fleetKey (redis: Redis | Cluster, prefix: string, client: string, bucket: string): Promise<string> {
  return keyUnder(await fleetSecret(redis, prefix), prefix, client, bucket)
}

/**
 * The fleet's key for a key written the readable way, `<prefix>:{<client>}:<bucket>`
 * (the client as the app passes it), with any `!lockout` or `!settle` suffix kept.
 */
export async function fleetKeyOf (redis: Redis | Cluster, readableKey: string): Promise<string> {
  const open = readableKey.indexOf(':{')
  const close = readableKey.indexOf('}:', open)
  const prefix = readableKey.slice(0, open)
  return await fleetKey(redis, prefix, readableKey.slice(open + 2, close), readableKey.slice(close + 2))
}

/**
 * A listed key as `<prefix>:{<client part>}:<rest>`, the client part in the
 * braces, once its tag is checked against `secret`: what a test reads is
 * which client and bucket a key is for. A key whose tag is not the keyed
 * digest of its client part stays as it is (and fails the comparison).
 */
export function readable (key: string, secret: string | undefined, prefix: string): string {
  const head = `${prefix}:{`
  if (secret === undefined || !key.startsWith(head)) return key
  const close = key.indexOf('}', head.length)
  const tag = key.slice(head.length, close)
  const rest = key.slice(close + 1)
  // The client part is a kept id ([A-Za-z0-9._:-], maybe with colons) or `#` and a digest:
  // try each colon as its end, from the first; the tag tells which one is right.
  for (let end = rest.indexOf(':'); end !== -1; end = rest.indexOf(':', end + 1)) {
    const id = rest.slice(0, end)
    if (hashTag(Buffer.from(secret, 'utf8'), id) === tag) return `${prefix}:{${id}}${rest.slice(end)}`
  }
  return key
}
