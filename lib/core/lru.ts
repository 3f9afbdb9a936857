import { LruMap } from 'toad-cache'

/** The node toad-cache keeps per entry; its `first` is typed `any`. */
interface Node<T> {
  readonly key: string
  readonly value: T
}

/**
 * A size-capped map that drops its least recently used entry first, in
 * O(1), and says what it drops.
 *
 * toad-cache's LruMap (a Map plus a linked list; lib/store/memory-store.ts
 * says why not a plain Map) evicts in silence. A structure that keeps
 * something about its entries elsewhere (the denial cache's index by
 * bucket, the floor of lib/core/marks.ts) must hear of each eviction, or
 * the index outgrows the cap and points at entries that are gone. So the
 * eviction is done here, before LruMap would do it, with the oldest entry
 * in hand.
 */
export class Lru<T> {
  readonly #map: LruMap<T>
  readonly #max: number
  readonly #evicted: (key: string, value: T) => void

  /** `max` >= 1 (LruMap refuses less); `evicted` is called for each entry the cap drops. */
  constructor (max: number, evicted: (key: string, value: T) => void) {
    this.#map = new LruMap<T>(max)
    this.#max = max
    this.#evicted = evicted
  }

  get size (): number {
    return this.#map.size
  }

  /** The value, and the entry becomes the most recently used. */
  get (key: string): T | undefined {
    return this.#map.get(key)
  }

  /** The value, without touching the order. */
  peek (key: string): T | undefined {
    return this.#map.items.get(key)?.value
  }

  /** Sets the value (the most recently used); a new key at the cap drops the least recently used first. */
  set (key: string, value: T): void {
    if (this.#map.size >= this.#max && !this.#map.items.has(key)) {
      // At the cap (>= 1 entry), `first` is the least recently used entry.
      const oldest: Node<T> | undefined = this.#map.first
      this.#map.evict()
      if (oldest !== undefined) this.#evicted(oldest.key, oldest.value)
    }
    this.#map.set(key, value)
  }

  delete (key: string): void {
    this.#map.delete(key)
  }

  clear (): void {
    this.#map.clear()
  }
}
