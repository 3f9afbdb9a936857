// The public types never import a Redis client package: each is an
// optional peer, and a declaration file that imports a package which is not
// installed fails to compile without skipLibCheck. RedisClient therefore
// names, per client family, only members that family's clients all have
// (test/ioredis-majors.test.ts and test/types/ check it against each).
//
// StoreClient is the other side: what tollgate sends, whatever the client.
// One adapter per family (lib/store/clients/) turns the user's object into
// one; the rest of tollgate sees nothing else of the client.

/** An ioredis (5 or 6) or iovalkey `Redis` or `Cluster`. */
export interface IoredisClient {
  readonly status: string
  readonly isCluster: boolean
  connect (): Promise<void>
  on (event: 'ready', listener: () => void): unknown
  off (event: 'ready', listener: () => void): unknown
}

/** A node-redis (4, 5 or 6) client: `createClient()` or `createCluster()` (node-redis 5's Cluster has no `isReady`). */
export interface NodeRedisClient {
  readonly isOpen: boolean
  readonly isReady?: boolean
  sendCommand: (...args: never[]) => unknown
  duplicate: (...args: never[]) => unknown
}

/** A @valkey/valkey-glide `GlideClient` or `GlideClusterClient`. */
export interface ValkeyGlideClient {
  customCommand: (...args: never[]) => unknown
  invokeScript: (...args: never[]) => unknown
  close: (...args: never[]) => unknown
}

/**
 * The client of a shared store: an ioredis or iovalkey `Redis` or `Cluster`,
 * a node-redis `createClient()` or `createCluster()`, or a GLIDE
 * `GlideClient` or `GlideClusterClient`. tollgate never closes it.
 */
export type RedisClient = IoredisClient | NodeRedisClient | ValkeyGlideClient

/**
 * Where a client stands: 'ready'; 'wait' when nobody asked it to connect
 * yet; 'end' once closed for good; else the client's own word for being on
 * its way (ioredis's 'connecting', 'reconnecting', ...).
 */
export type ClientStatus = 'ready' | 'wait' | 'end' | (string & Record<never, never>)

/** A subscription's connection, as StoreClient.subscribe opens it: nothing is told after `close()` or after `ended`. */
export interface SubscriberEvents {
  /** A message on the channel. */
  message (text: string): void
  /** SUBSCRIBE succeeded. */
  subscribed (): void
  /** SUBSCRIBE failed (the connection is then closed, and `ended` follows). */
  refused (err: unknown): void
  /** The connection is gone, for good: once, whatever the cause, unless closed by `close()`. */
  ended (): void
}

/**
 * Everything tollgate sends to Redis and reads of its client. A script
 * call's `args` are its keys, then its arguments; on a Cluster it is routed
 * by its first key's slot (every key of a call shares one hash tag). Replies
 * come in RESP2's shapes: integers as numbers, arrays as arrays.
 */
export interface StoreClient {
  /** The client family, for messages: 'ioredis', 'node-redis', 'glide'. */
  readonly family: string
  /** Where the client connects, for log lines: `host:port`, `unix:<path>`, seed nodes. Never a password. */
  readonly target: string
  readonly status: ClientStatus
  /** A Redis Cluster client: each script call must hold keys of one slot. */
  readonly cluster: boolean
  /** Asks a client nobody connected (status 'wait') to connect. Never throws. */
  connect (): void
  /** Calls `listener` whenever the client turns ready; returns its removal. */
  onReady (listener: () => void): () => void
  /** Calls `listener` once the client has ended for good (closed by the app); returns its removal. */
  onEnd (listener: () => void): () => void
  /** EVALSHA. */
  evalsha (sha: string, numKeys: number, args: ReadonlyArray<string | number>): Promise<unknown>
  /** EVAL, after a NOSCRIPT (which also loads the script on that node). */
  eval (lua: string, numKeys: number, args: ReadonlyArray<string | number>): Promise<unknown>
  /** True for the client's form of a NOSCRIPT reply error. */
  isNoScript (err: unknown): boolean
  /** SCRIPT LOAD of each script on every master; never rejects. */
  loadScripts (scripts: readonly string[]): Promise<void>
  /** DEL of keys of one slot. */
  del (keys: readonly string[]): Promise<unknown>
  publish (channel: string, message: string): Promise<unknown>
  /**
   * SUBSCRIBE `channel` on a connection of its own (a Cluster: to one of
   * its nodes), that never reconnects: a new subscription is a new call.
   */
  subscribe (channel: string, name: string, events: SubscriberEvents): { close (): void }
  /** Refreshes a Cluster's slot map (after a failover); nothing for one node. */
  refresh (): void
}
