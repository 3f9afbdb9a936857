// A TCP proxy in the test process that makes a Redis look slow or flaky:
// client <-> proxy (127.0.0.1:<port>) <-> Redis.

import { connect, createServer, type Socket } from 'node:net'

export interface RedisProxy {
  readonly host: string
  readonly port: number
  /** `redis://127.0.0.1:<port>` */
  readonly url: string
  /** Delay every chunk from Redis to the client by this many ms (order is kept). 0 = off. */
  delayMs: number
  /** Close every new connection as soon as it is accepted. */
  refuse: boolean
  /** Open client connections right now. */
  readonly connections: number
  /**
   * Keep accepting connections and forwarding commands, but throw away every
   * reply: Redis may well have executed a command whose reply never arrives.
   */
  blackhole(): void
  /** Reset (RST) every open client connection and its Redis connection, mid-stream. */
  dropConnections(): void
  /**
   * Back to a transparent proxy. Connections that lost replies to the
   * blackhole are out of step with their client and are reset.
   */
  reset(): void
  /** Stop listening and destroy every connection. Idempotent. */
  close(): Promise<void>
}

export type ProxyTarget = string | { host?: string, port: number }

interface Pair {
  client: Socket
  upstream: Socket
  /** replies waiting for their delay, oldest first */
  queue: Array<{ due: number, chunk: Buffer }>
  timer: NodeJS.Timeout | undefined
  lastDue: number
  lostReplies: boolean
}

function parseTarget (target: ProxyTarget): { host: string, port: number } {
  if (typeof target !== 'string') return { host: target.host ?? '127.0.0.1', port: target.port }
  const url = new URL(target)
  return { host: url.hostname, port: url.port === '' ? 6379 : Number(url.port) }
}

/** Start a proxy on a free loopback port in front of `target` (a redis:// URL or host/port). */
export async function startProxy (target: ProxyTarget): Promise<RedisProxy> {
  const upstreamAddress = parseTarget(target)
  const pairs = new Set<Pair>()
  let blackholed = false

  const destroyPair = (pair: Pair, abrupt: boolean): void => {
    clearTimeout(pair.timer)
    pair.queue.length = 0
    pairs.delete(pair)
    for (const socket of [pair.client, pair.upstream]) {
      if (socket.destroyed) continue
      // RST looks like a crashed peer or a broken network; FIN like an orderly close.
      if (abrupt && socket.readyState === 'open') socket.resetAndDestroy()
      else socket.destroy()
    }
  }

  const pump = (pair: Pair): void => {
    pair.timer = undefined
    const now = Date.now()
    while (pair.queue.length > 0) {
      const head = pair.queue[0]
      if (head === undefined) break
      if (head.due > now) {
        pair.timer = setTimeout(() => pump(pair), head.due - now)
        return
      }
      pair.queue.shift()
      pair.client.write(head.chunk)
    }
  }

  const onReply = (pair: Pair, chunk: Buffer): void => {
    if (blackholed) {
      pair.lostReplies = true
      return
    }
    if (proxy.delayMs <= 0 && pair.queue.length === 0) {
      pair.client.write(chunk)
      return
    }
    // Never let a later chunk overtake an earlier one, even if delayMs shrinks.
    const due = Math.max(Date.now() + Math.max(0, proxy.delayMs), pair.lastDue)
    pair.lastDue = due
    pair.queue.push({ due, chunk })
    if (pair.timer === undefined) pump(pair)
  }

  const server = createServer(client => {
    if (proxy.refuse) {
      client.on('error', () => {})
      client.resetAndDestroy()
      return
    }
    const upstream = connect(upstreamAddress)
    const pair: Pair = { client, upstream, queue: [], timer: undefined, lastDue: 0, lostReplies: false }
    pairs.add(pair)
    client.setNoDelay(true)
    upstream.setNoDelay(true)
    client.on('data', chunk => { if (!upstream.destroyed) upstream.write(chunk) })
    upstream.on('data', (chunk: Buffer) => onReply(pair, chunk))
    // Any failure on either side takes the whole pair down, like a real hop would.
    client.on('error', () => destroyPair(pair, true))
    upstream.on('error', () => destroyPair(pair, true))
    client.on('close', () => destroyPair(pair, false))
    upstream.on('close', () => destroyPair(pair, false))
  })

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      server.off('error', reject)
      resolve()
    })
  })
  const address = server.address()
  const port = typeof address === 'object' && address !== null ? address.port : 0
  let closing: Promise<void> | undefined

  const proxy: RedisProxy = {
    host: '127.0.0.1',
    port,
    url: `redis://127.0.0.1:${port}`,
    delayMs: 0,
    refuse: false,
    get connections () { return pairs.size },
    blackhole () {
      blackholed = true
    },
    dropConnections () {
      for (const pair of [...pairs]) destroyPair(pair, true)
    },
    reset () {
      blackholed = false
      proxy.delayMs = 0
      proxy.refuse = false
      for (const pair of [...pairs]) {
        if (pair.lostReplies) destroyPair(pair, true)
      }
    },
    close () {
      closing ??= new Promise<void>(resolve => {
        server.close(() => resolve())
        for (const pair of [...pairs]) destroyPair(pair, false)
      })
      return closing
    }
  }
  return proxy
}
