// The public types never import ioredis: it is an optional peer, and a
// declaration file that imports a package which is not installed fails to
// compile without skipLibCheck. RedisClient therefore names only the members
// tollgate uses, which ioredis 5's and 6's Redis and Cluster both have
// (test/ioredis-majors.test.ts checks it against both).

/** An ioredis `Redis` or `Cluster` client, ioredis 5 or 6. tollgate never closes it. */
export interface RedisClient {
  readonly status: string
  readonly isCluster: boolean
  connect (): Promise<void>
  on (event: 'ready', listener: () => void): unknown
  off (event: 'ready', listener: () => void): unknown
}
