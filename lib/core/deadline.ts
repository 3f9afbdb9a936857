import { realTime, type Time, type TimerHandle } from './clock.js'
import { StoreError } from './errors.js'

/**
 * Deadlines for store calls without a timer per call.
 *
 * Calls of one timeout length expire in the order they start, so each
 * length keeps a FIFO; one timer, armed for the earliest deadline, finds
 * what has expired. The FIFO is a doubly linked list: a call that settles
 * unlinks itself and drops its callback at once, so memory holds the calls
 * in flight, not the calls of the last `timeout` ms, and a settled call's
 * promise and reply are garbage as soon as its caller is done with them.
 *
 * A missed deadline is confirmed one turn of the event loop later. Node
 * runs expired timers before it reads the sockets that became readable
 * meanwhile, so when the app's own work holds the loop past a deadline,
 * the timer fires while Redis's reply already sits unread in the socket.
 * The timer therefore only marks the call; a setImmediate, which runs
 * after the poll phase has read those sockets, rejects the calls still
 * unanswered. A reply that arrived in time wins: what counts is Redis's
 * lateness, not the app's.
 *
 * The timer is the limiter's Time's (lib/core/clock.ts), not kept alive: a
 * pending deadline never keeps the process alive, and on a test's fake
 * Time it fires when the test moves the clock.
 */
export class Deadlines {
  readonly #time: Time
  readonly #queues = new Map<number, Queue>()
  #timer: TimerHandle | undefined
  #armedAt = Infinity
  /** Expired calls awaiting confirmation after the next poll phase. */
  #due: Entry[] = []

  constructor (time: Time = realTime) {
    this.#time = time
  }

  /**
   * Starts the deadline of one call: unless `settle` is called first,
   * `expire` runs once `ms` have passed (and the loop has read its sockets).
   */
  start (ms: number, expire: (err: StoreError) => void): Deadline {
    const startedAt = this.#time.now()
    let queue = this.#queues.get(ms)
    if (queue === undefined) this.#queues.set(ms, queue = { ms, head: undefined, tail: undefined })
    const entry = new Entry(startedAt, ms, queue, expire)
    const tail = queue.tail
    if (tail === undefined) {
      queue.head = entry
    } else {
      tail.next = entry
      entry.prev = tail
    }
    queue.tail = entry
    if (startedAt + ms < this.#armedAt) this.#arm(startedAt + ms)
    return entry
  }

  /** Ends a call's deadline: true if it was still running, false if it had expired (ignore the late result). */
  settle (deadline: Deadline): boolean {
    // Every Deadline is an Entry, made by start().
    if (!(deadline instanceof Entry) || deadline.expire === undefined) return false
    deadline.expire = undefined
    if (deadline.queue !== undefined) unlink(deadline, deadline.queue)
    return true
  }

  /** Settles like `promise`, or rejects with a StoreError after `ms`; a later settlement is ignored. */
  wrap<T> (promise: Promise<T>, ms: number): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const deadline = this.start(ms, reject)
      promise.then(
        (value) => { if (this.settle(deadline)) resolve(value) },
        (err: unknown) => { if (this.settle(deadline)) reject(err) }
      )
    })
  }

  #arm (at: number): void {
    this.#time.clear(this.#timer)
    this.#armedAt = at
    this.#timer = this.#time.set(this.#expire, Math.max(0, at - this.#time.now()), false)
  }

  readonly #expire = (): void => {
    this.#timer = undefined
    this.#armedAt = Infinity
    const now = this.#time.now()
    let next = Infinity
    for (const queue of this.#queues.values()) {
      let entry = queue.head
      while (entry !== undefined && entry.startedAt + entry.ms <= now) {
        unlink(entry, queue)
        this.#due.push(entry)
        entry = queue.head
      }
      if (entry === undefined) this.#queues.delete(queue.ms)
      else next = Math.min(next, entry.startedAt + entry.ms)
    }
    if (this.#due.length > 0) setImmediate(this.#confirm)
    if (next !== Infinity) this.#arm(next)
  }

  readonly #confirm = (): void => {
    const due = this.#due
    this.#due = []
    for (const entry of due) {
      const expire = entry.expire
      if (expire === undefined) continue
      entry.expire = undefined
      expire(new StoreError('TOLLGATE_STORE_TIMEOUT', `store gave no answer within ${entry.ms} ms`))
    }
  }
}

/** A running deadline, as `start` returns it. */
export interface Deadline {
  /** Clock time at which the call started, ms. */
  readonly startedAt: number
}

interface Queue {
  readonly ms: number
  head: Entry | undefined
  tail: Entry | undefined
}

class Entry implements Deadline {
  readonly startedAt: number
  readonly ms: number
  /** The FIFO holding the entry; undefined once expired (then it waits in `due`). */
  queue: Queue | undefined
  /** Undefined once settled or expired. */
  expire: ((err: StoreError) => void) | undefined
  prev: Entry | undefined = undefined
  next: Entry | undefined = undefined
  constructor (startedAt: number, ms: number, queue: Queue | undefined, expire: ((err: StoreError) => void) | undefined) {
    this.startedAt = startedAt
    this.ms = ms
    this.queue = queue
    this.expire = expire
  }
}

function unlink (entry: Entry, queue: Queue): void {
  const { prev, next } = entry
  if (prev === undefined) queue.head = next
  else prev.next = next
  if (next === undefined) queue.tail = prev
  else next.prev = prev
  entry.prev = entry.next = entry.queue = undefined
}
