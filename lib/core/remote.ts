// What only a remote store needs, held together: present when the limiter
// has `redis`, absent for the in-process store (which decides
// synchronously, with nothing to fail). The decision paths (lib/core/
// engine.ts) and the settlements (lib/core/settle.ts) branch once on it.

import type { DenialCache } from './denial-cache.js'
import type { Guard } from './guard.js'
import type { Invalidations } from './invalidation.js'
import type { RemoteStore } from '../store/store.js'

export interface Remote {
  /** What the core calls on the store (lib/store/store.ts RemoteStore): a RedisStore, or a test's. */
  readonly store: RemoteStore
  /** The deadline and the breaker of every call to `store`. */
  readonly guard: Guard
  /** Cached denials; undefined with `denialCache: false`. */
  readonly denials: DenialCache | undefined
  /** The fleet's resets and refunds; undefined without a denial cache (nothing local to keep honest). */
  readonly changes: Invalidations | undefined
}
