/** One bucket of one decision. */
export interface BucketSpec {
  key: string
  capacity: number
  refillPerSecond: number
  cost: number
}

/** A bucket after a decision. */
export interface BucketState {
  /** Tokens left, fractions kept. */
  remaining: number
  /** Microseconds until the bucket is full again. */
  fullInUs: number
  /** 0 when this bucket could afford its cost, else microseconds until it can. */
  waitUs: number
}

export interface StoreReply {
  /** True when every bucket could afford its cost (and, when consuming, all were spent). */
  allowed: boolean
  /** The store's clock at the decision, microseconds. */
  nowUs: number
  buckets: BucketState[]
}

/**
 * Decides one or several buckets of one client at once, all or nothing:
 * either every bucket can afford its cost and (when `consume`) all are spent,
 * or none is touched.
 */
export interface Store {
  decide (specs: readonly BucketSpec[], consume: boolean): Promise<StoreReply>
  reset (key: string): Promise<void>
}

/** A batch of tokens taken from one bucket. */
export interface LeaseReply {
  /** Tokens taken: 0 when the bucket could not afford the least amount. */
  taken: number
  nowUs: number
  bucket: BucketState
}

/** A store that can lend tokens in batches (see lua/lease.lua). */
export interface LeaseStore {
  lease (spec: BucketSpec, most: number, giveBack: number): Promise<LeaseReply>
}
