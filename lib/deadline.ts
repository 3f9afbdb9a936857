import { StoreError } from './errors.js'

interface Waiting {
  at: number
  ms: number
  reject: (err: StoreError) => void
  settled: boolean
}

/**
 * Deadlines for store calls without a timer per call. Calls of one
 * timeout length expire in the order they start, so each length keeps a
 * FIFO; one timer, armed for the earliest pending deadline, rejects what
 * has expired and skips what has settled. Under load most calls settle
 * long before their deadline and cost a push and a flag, not a Timeout
 * object and its clearTimeout.
 */
export class Deadlines {
  readonly #queues = new Map<number, { items: Waiting[], head: number }>()
  #timer: NodeJS.Timeout | undefined
  #armedAt = Infinity

  /** Settles like `promise`, or rejects with a StoreError after `ms`; a later settlement is ignored. */
  wrap<T> (promise: Promise<T>, ms: number): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const waiting: Waiting = { at: performance.now() + ms, ms, reject, settled: false }
      let queue = this.#queues.get(ms)
      if (queue === undefined) this.#queues.set(ms, queue = { items: [], head: 0 })
      queue.items.push(waiting)
      if (waiting.at < this.#armedAt) this.#arm(waiting.at)
      promise.then(
        (value) => { waiting.settled = true; resolve(value) },
        (err: unknown) => { waiting.settled = true; reject(err) }
      )
    })
  }

  #arm (at: number): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer)
    this.#armedAt = at
    this.#timer = setTimeout(this.#expire, Math.max(0, at - performance.now()))
  }

  readonly #expire = (): void => {
    this.#timer = undefined
    this.#armedAt = Infinity
    const now = performance.now()
    let next = Infinity
    for (const [ms, queue] of this.#queues) {
      const { items } = queue
      while (queue.head < items.length) {
        const waiting = items[queue.head] as Waiting
        if (!waiting.settled) {
          if (waiting.at > now) break
          waiting.settled = true
          waiting.reject(new StoreError('TOLLGATE_STORE_TIMEOUT', `store gave no answer within ${waiting.ms} ms`))
        }
        queue.head++
      }
      if (queue.head === items.length) {
        this.#queues.delete(ms)
      } else {
        if (queue.head > 1024) {
          items.splice(0, queue.head)
          queue.head = 0
        }
        next = Math.min(next, (items[queue.head] as Waiting).at)
      }
    }
    if (next !== Infinity) this.#arm(next)
  }
}
