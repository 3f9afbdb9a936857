// The secret behind every key's hash tag (lib/core/keys.ts hashTag), and
// where it comes from (docs/reference/keys.md):
//
// - `keySecret`, when set: the same on every server of the fleet, like any
//   other shared secret of its configuration. Keys are named at once, with
//   no call to Redis; start-up writes a digest of it to Redis (SET NX) and
//   reports, with an error line, a server whose digest differs.
// - Else, with `redis`: a random secret that the first server of the fleet
//   creates in Redis (SET NX, no expiry) and every other one reads, at
//   start-up (`limiter.ready`, the adapters' start-up wait) or before its
//   first decision. Until it is read, nothing is sent to Redis: the guard
//   holds every call (lib/core/guard.ts hold), so decisions follow their
//   failure modes and the in-process fallback keeps working.
// - Without `redis`: a random secret of this process; slots mean nothing
//   in-process, and no other server shares its buckets.
//
// Why not a digest without a secret: anyone who reads this code could then
// compute which ids share a slot, and send all their load to one master.

import { randomBytes, createHmac, createSecretKey, type KeyObject } from 'node:crypto'
import { LruMap } from 'toad-cache'
import { StoreError } from './errors.js'
import type { Guard } from './guard.js'
import { clientId, hashTag } from './keys.js'
import type { Logger } from './types.js'
import { script } from '../store/script.js'
import type { RemoteStore } from '../store/store.js'

/**
 * lua/key-secret.lua: sent as EVAL, since it runs once per start-up, so
 * its text is not kept loaded on every master.
 */
const KEY_SECRET = script('key-secret.lua', { loaded: false })

/** What sets a partition key's HMAC input apart from a hash tag's: a NUL never starts a client part. */
const PARTITION_LABEL = '\0tollgate partition key\0'
/** 96 bits: no two clients of a fleet meet by chance, and the value stays short. */
const PARTITION_BYTES = 12

/** How long start-up gives Redis to answer the secret's read (within the adapters' own start-up bound). */
export const WARM_TIMEOUT_MS = 1000

/**
 * Client parts kept once named, by client key (see KeyNames.clientPart):
 * the HMAC of a hash tag is most of what naming a key costs, and a client
 * asks again and again. Only keys of up to PART_KEY_MAX characters are
 * kept, so the cache stays near 3 MB whatever the clients send (measured
 * full on Node 24: 3.1 MB with ids of 64 characters, 2.6 MB with IPv4
 * addresses).
 */
const PARTS_MAX = 10_000
const PART_KEY_MAX = 64

/** What reading the secret needs of a limiter with `redis`. */
export interface SecretSource {
  readonly store: RemoteStore
  readonly guard: Guard
  readonly logger: Logger
}

export class KeyNames {
  readonly #prefix: string
  readonly #option: Buffer | undefined
  readonly #source: SecretSource | undefined
  /** The fleet's secret, as hashTag takes it (made once); undefined until read from Redis. */
  #secret: KeyObject | undefined
  /** Names keys while the fleet's secret is unknown: they are never sent to Redis (the guard holds). */
  readonly #provisional = createSecretKey(randomBytes(32))
  /** Client parts named under the fleet's secret (never the provisional one), least recently used dropped first. */
  readonly #parts = new LruMap<string>(PARTS_MAX)
  #loading: Promise<void> | undefined

  constructor (prefix: string, keySecret: string | undefined, source: SecretSource | undefined) {
    this.#prefix = prefix
    this.#option = keySecret === undefined ? undefined : Buffer.from(keySecret, 'utf8')
    this.#source = source
    const secret = this.#option ?? (source === undefined ? randomBytes(32) : undefined)
    this.#secret = secret === undefined ? undefined : createSecretKey(secret)
    if (this.#secret === undefined) source?.guard.hold(new StoreError('TOLLGATE_STORE_DOWN', 'the fleet\'s key secret was not read from Redis yet'))
  }

  /** Whether keys are named as the rest of the fleet names them. */
  get known (): boolean {
    return this.#secret !== undefined
  }

  /** `{<tag>}<client part>`: what stands between the prefix and the bucket in each key of this client. */
  clientPart (clientKey: string): string {
    const secret = this.#secret
    const kept = clientKey.length <= PART_KEY_MAX && secret !== undefined
    if (kept) {
      const part = this.#parts.get(clientKey)
      if (part !== undefined) return part
    }
    const id = clientId(clientKey)
    const part = `{${hashTag(secret ?? this.#provisional, id)}}${id}`
    if (kept) this.#parts.set(clientKey, part)
    return part
  }

  /**
   * The partition key of a client, for draft-11's `pk`: 12 bytes of an
   * HMAC-SHA256 of its id (clientId) under the fleet's secret, separated by
   * a label from the hash tag's input, so every server of the fleet sends a
   * client the same value, and the value tells nothing of the key (an
   * address, an API key), nor of its hash tag and so its Cluster slot.
   */
  partition (clientKey: string): Buffer {
    return createHmac('sha256', this.#secret ?? this.#provisional).update(PARTITION_LABEL).update(clientId(clientKey)).digest().subarray(0, PARTITION_BYTES)
  }

  /** The key of one bucket of a client, from its `clientPart`. */
  keyOf (part: string, bucket: string): string {
    return `${this.#prefix}:${part}:${bucket}`
  }

  /**
   * Reads the fleet's secret (creating it if it is missing), or checks
   * `keySecret` against the fleet's, through the guard's deadline and
   * breaker: at start-up, and before a call while the secret is unknown.
   * One read at a time. Never rejects: a failure is the guard's to count
   * and log.
   */
  load (timeoutMs: number): Promise<void> {
    const source = this.#source
    if (source === undefined) return Promise.resolve()
    this.#loading ??= this.#read(source, timeoutMs).finally(() => { this.#loading = undefined })
    return this.#loading
  }

  async #read ({ store, guard, logger }: SecretSource, timeoutMs: number): Promise<void> {
    const option = this.#option
    const [secretKey, checkKey] = [`${this.#prefix}:{keys}:secret`, `${this.#prefix}:{keys}:check`]
    const mine = option === undefined ? randomBytes(32).toString('base64url') : digest(option)
    let reply: unknown
    try {
      // Writes `mine` to the random secret (1) or to the keySecret digest (2) where that key is missing.
      reply = await guard.run(async () => await store.run(KEY_SECRET, [secretKey, checkKey], [option === undefined ? 1 : 2, mine]), timeoutMs, [], true)
    } catch {
      return
    }
    // The script replies with two values, each a string or nil.
    const [secret, check] = [reply].flat().map(text)
    if (option !== undefined) {
      if (check !== mine) logger.error({ key: checkKey }, `keySecret differs from the one another server of this fleet set (its digest is at ${checkKey}): the two name keys differently, so their buckets are split`)
      if (secret !== undefined) logger.error({ key: secretKey }, `servers of this fleet without keySecret use the random secret at ${secretKey}; this one sets keySecret: their buckets are split until every server sets the same keySecret`)
      return
    }
    if (check !== undefined) logger.error({ key: checkKey }, `another server of this fleet sets keySecret (its digest is at ${checkKey}); this one does not: their buckets are split until every server sets the same keySecret`)
    // The script sets the secret where it is missing, so it replies one.
    if (secret !== undefined) {
      this.#secret = createSecretKey(Buffer.from(secret, 'utf8'))
      this.#parts.clear()
    }
    guard.hold(undefined)
  }
}

/** What the check key holds for a keySecret: a digest that does not give the secret away. */
function digest (secret: Buffer): string {
  return createHmac('sha256', secret).update('tollgate key secret check').digest('base64url').slice(0, 22)
}

/** A reply's string (a client may give a Buffer), or undefined for nil. */
function text (value: unknown): string | undefined {
  return value === null || value === undefined ? undefined : String(value)
}
