// A real local Redis Cluster: redis-server processes from PATH joined with
// `redis-cli --cluster create`. Every node is a RedisServer, so tests can pause,
// kill and restart single nodes (restart keeps the node's identity: nodes.conf
// lives in the node's own dir).

import { execFile } from 'node:child_process'
import { setTimeout as sleep } from 'node:timers/promises'
import { Cluster, type ClusterOptions } from 'ioredis'
import {
  findBinary,
  infoField,
  redisCommand,
  startRedisServer,
  type RedisServer,
  type RespValue
} from './redis.js'

const SLOTS = 16_384

export interface StartClusterOptions {
  /** default 3, the minimum `redis-cli --cluster create` accepts */
  masters?: number
  /** default 0 */
  replicasPerMaster?: number
  /**
   * cluster-node-timeout in ms, default 2000: short enough for failover tests
   * (a replica takes over roughly 1-3 s after this), long enough that a busy
   * 2-core CI machine does not trigger spurious failovers.
   */
  nodeTimeoutMs?: number
  /** extra redis-server arguments for every node */
  args?: string[]
}

export interface ClusterNodeInfo {
  id: string
  host: string
  port: number
  /** e.g. ['master'], ['slave'], ['master', 'fail?']; without 'myself' */
  flags: string[]
  /** this line describes the node that answered */
  myself: boolean
  /** id of the master, for replicas */
  masterId: string | undefined
  /** inclusive [first, last] slot ranges */
  slots: Array<[number, number]>
  linkConnected: boolean
}

export interface RedisCluster {
  /** every node, masters and replicas, in creation order */
  readonly nodes: RedisServer[]
  /** for `new Cluster(startupNodes)` */
  readonly startupNodes: Array<{ host: string, port: number }>
  /** CLUSTER NODES as seen by the first node that answers (paused and dead nodes are skipped). */
  clusterNodes(): Promise<ClusterNodeInfo[]>
  /** The nodes that are masters serving slots right now (not marked failed). */
  masters(): Promise<RedisServer[]>
  /** The master currently serving `key`'s slot. */
  masterFor(key: string): Promise<RedisServer>
  /** The replicas of `master`, as CLUSTER NODES lists them now (failed ones left out). */
  replicasOf(master: RedisServer): Promise<RedisServer[]>
  /**
   * Wait until every replica connected to `master` has acknowledged the
   * master's whole replication stream (INFO replication offsets equal, and
   * above 0). A master that has written nothing since the cluster started
   * never passes: until a replica's first acknowledgement the master keeps
   * the stream in its own memory, and equal offsets of 0 would not show
   * that it flows. Write to it first. Rejects after `timeoutMs` (default 10 s).
   */
  waitReplicated(master: RedisServer, timeoutMs?: number): Promise<void>
  /**
   * Wait until every running, unpaused node reports cluster_state:ok with all
   * slots served, e.g. after a failover. Rejects after `timeoutMs` (default 30 s).
   */
  waitHealthy(timeoutMs?: number): Promise<void>
  /** An ioredis Cluster client for this cluster; disconnected by stop() if still open. */
  client(options?: ClusterOptions): Cluster
  /** Disconnect clients made by client(), stop every node. Idempotent. */
  stop(): Promise<void>
}

function parseSlots (fields: string[]): Array<[number, number]> {
  const slots: Array<[number, number]> = []
  for (const field of fields) {
    if (field.startsWith('[')) continue // migrating/importing markers
    const [first, last] = field.split('-')
    if (first === undefined) continue
    slots.push([Number(first), Number(last ?? first)])
  }
  return slots
}

/** Parse a CLUSTER NODES reply. */
export function parseClusterNodes (reply: RespValue): ClusterNodeInfo[] {
  if (typeof reply !== 'string') throw new Error(`unexpected CLUSTER NODES reply: ${JSON.stringify(reply)}`)
  const nodes: ClusterNodeInfo[] = []
  for (const line of reply.split('\n')) {
    const [id, address, flags, master, , , , link, ...slots] = line.trim().split(' ')
    if (id === undefined || id === '' || address === undefined || flags === undefined) continue
    const hostPort = address.split('@')[0] ?? ''
    const colon = hostPort.lastIndexOf(':')
    nodes.push({
      id,
      host: hostPort.slice(0, colon),
      port: Number(hostPort.slice(colon + 1)),
      flags: flags.split(',').filter(f => f !== 'myself'),
      myself: flags.split(',').includes('myself'),
      masterId: master === undefined || master === '-' ? undefined : master,
      slots: parseSlots(slots),
      linkConnected: link === 'connected'
    })
  }
  return nodes
}

async function redisCliCreate (nodes: RedisServer[], replicas: number): Promise<void> {
  const cli = findBinary('redis-cli')
  const args = [
    '--cluster', 'create',
    ...nodes.map(n => `${n.host}:${n.port}`),
    '--cluster-replicas', String(replicas),
    '--cluster-yes'
  ]
  await new Promise<void>((resolve, reject) => {
    execFile(cli, args, { timeout: 60_000 }, (err, stdout, stderr) => {
      if (err === null) resolve()
      else reject(new Error(`redis-cli ${args.join(' ')} failed: ${err.message}\n${stdout}\n${stderr}`))
    })
  })
}

class LocalCluster implements RedisCluster {
  readonly nodes: RedisServer[]
  readonly startupNodes: Array<{ host: string, port: number }>
  readonly #clients = new Set<Cluster>()
  #stopping: Promise<void> | undefined

  constructor (nodes: RedisServer[]) {
    this.nodes = nodes
    this.startupNodes = nodes.map(n => ({ host: n.host, port: n.port }))
  }

  #reachable (): RedisServer[] {
    return this.nodes.filter(n => n.running && !n.paused)
  }

  async #ask (args: string[]): Promise<RespValue> {
    let last: unknown = new Error('no running, unpaused cluster node to ask')
    for (const node of this.#reachable()) {
      try {
        return await redisCommand(node, args, { timeoutMs: 1_000 })
      } catch (err) {
        last = err
      }
    }
    throw last
  }

  #handle (info: ClusterNodeInfo): RedisServer | undefined {
    return this.nodes.find(n => n.port === info.port)
  }

  async clusterNodes (): Promise<ClusterNodeInfo[]> {
    return parseClusterNodes(await this.#ask(['CLUSTER', 'NODES']))
  }

  async masters (): Promise<RedisServer[]> {
    const infos = await this.clusterNodes()
    const servers: RedisServer[] = []
    for (const info of infos) {
      if (!info.flags.includes('master') || info.flags.includes('fail') || info.slots.length === 0) continue
      const server = this.#handle(info)
      if (server !== undefined) servers.push(server)
    }
    return servers
  }

  async masterFor (key: string): Promise<RedisServer> {
    const slot = await this.#ask(['CLUSTER', 'KEYSLOT', key])
    if (typeof slot !== 'number') throw new Error(`unexpected CLUSTER KEYSLOT reply: ${JSON.stringify(slot)}`)
    const infos = await this.clusterNodes()
    const owner = infos.find(info =>
      info.flags.includes('master') && !info.flags.includes('fail') &&
      info.slots.some(([first, last]) => slot >= first && slot <= last))
    const server = owner === undefined ? undefined : this.#handle(owner)
    if (server === undefined) throw new Error(`no master serves slot ${slot} (key ${JSON.stringify(key)})`)
    return server
  }

  async replicasOf (master: RedisServer): Promise<RedisServer[]> {
    const infos = await this.clusterNodes()
    const self = infos.find(info => info.port === master.port)
    if (self === undefined) throw new Error(`${master.port} is not in CLUSTER NODES`)
    return infos
      .filter(info => info.masterId === self.id && !info.flags.includes('fail'))
      .flatMap(info => this.#handle(info) ?? [])
  }

  async waitReplicated (master: RedisServer, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const info = await redisCommand(master, ['INFO', 'replication'], { timeoutMs: 1_000 })
      const offset = infoField(info, 'master_repl_offset')
      const replicas = Number(infoField(info, 'connected_slaves'))
      // slaveN:ip=...,port=...,state=online,offset=...,lag=...
      const behind = Array.from({ length: replicas }, (_, i) => infoField(info, `slave${i}`) ?? '')
        .filter(line => !line.includes('state=online') || !line.includes(`offset=${String(offset)},`))
      if (replicas > 0 && behind.length === 0 && Number(offset) > 0) return
      if (Date.now() > deadline) {
        throw new Error(`replicas of ${master.port} not caught up after ${timeoutMs} ms: ` +
          `offset ${String(offset)}, ${replicas} connected, behind: ${behind.join(' ')}`)
      }
      await sleep(20)
    }
  }

  /** Why the cluster is not healthy yet, or undefined when it is. */
  async #unhealthy (requireAllKnown: boolean): Promise<string | undefined> {
    const nodes = this.#reachable()
    if (nodes.length === 0) return 'no running, unpaused node'
    for (const node of nodes) {
      let info: RespValue
      try {
        info = await redisCommand(node, ['CLUSTER', 'INFO'], { timeoutMs: 1_000 })
      } catch (err) {
        return `${node.port}: ${err instanceof Error ? err.message : String(err)}`
      }
      const state = infoField(info, 'cluster_state')
      const ok = Number(infoField(info, 'cluster_slots_ok'))
      const known = Number(infoField(info, 'cluster_known_nodes'))
      if (state !== 'ok') return `${node.port}: cluster_state:${String(state)}`
      if (ok !== SLOTS) return `${node.port}: cluster_slots_ok:${ok}`
      if (requireAllKnown && known !== this.nodes.length) return `${node.port}: knows ${known}/${this.nodes.length} nodes`
      const replication = await redisCommand(node, ['INFO', 'replication'], { timeoutMs: 1_000 })
      if (infoField(replication, 'role') === 'slave' && infoField(replication, 'master_link_status') !== 'up') {
        return `${node.port}: replica link to master not up`
      }
    }
    // Every node must see the same masters serving the same slots, see each
    // reachable node in the role that node claims for itself, and not flag a
    // reachable node as failing (a resumed old master, say).
    const views = new Map<number, ClusterNodeInfo[]>()
    const roles = new Map<number, string>()
    const role = (info: ClusterNodeInfo): string =>
      info.flags.includes('slave') ? `replica of ${String(info.masterId)}` : 'master'
    for (const node of nodes) {
      const view = parseClusterNodes(await redisCommand(node, ['CLUSTER', 'NODES'], { timeoutMs: 1_000 }))
      views.set(node.port, view)
      const self = view.find(info => info.myself)
      if (self !== undefined) roles.set(node.port, role(self))
    }
    let agreed: string | undefined
    for (const [port, view] of views) {
      const misread = view.find(info => roles.has(info.port) && roles.get(info.port) !== role(info))
      if (misread !== undefined) {
        return `${port} sees ${misread.port} as ${role(misread)}, it says ${String(roles.get(misread.port))}`
      }
      const suspect = view.find(info =>
        (info.flags.includes('fail') || info.flags.includes('fail?')) &&
        roles.has(info.port))
      if (suspect !== undefined) return `${port} flags ${suspect.port} as ${suspect.flags.join(',')}`
      const owners = view
        .filter(info => info.flags.includes('master') && !info.flags.includes('fail') && info.slots.length > 0)
        .map(info => `${info.port}=${JSON.stringify(info.slots)}`)
        .sort()
        .join(' ')
      agreed ??= owners
      if (owners !== agreed) return `nodes disagree on slot owners: ${agreed} vs ${owners}`
    }
    return undefined
  }

  async #waitHealthy (timeoutMs: number, requireAllKnown: boolean): Promise<void> {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const reason = await this.#unhealthy(requireAllKnown)
      if (reason === undefined) return
      if (Date.now() > deadline) throw new Error(`cluster not healthy after ${timeoutMs} ms: ${reason}`)
      await sleep(50)
    }
  }

  async waitHealthy (timeoutMs = 30_000): Promise<void> {
    await this.#waitHealthy(timeoutMs, false)
  }

  async waitCreated (timeoutMs: number): Promise<void> {
    await this.#waitHealthy(timeoutMs, true)
  }

  client (options: ClusterOptions = {}): Cluster {
    // No natMap needed: nodes bind and announce 127.0.0.1, which is exactly
    // what this process connects to. (With Docker-networked nodes the announced
    // addresses would be unreachable and ioredis would need a natMap.)
    const client = new Cluster(this.startupNodes, options)
    this.#clients.add(client)
    client.once('end', () => this.#clients.delete(client))
    return client
  }

  stop (): Promise<void> {
    this.#stopping ??= (async () => {
      for (const client of this.#clients) client.disconnect()
      this.#clients.clear()
      await Promise.all(this.nodes.map(n => n.stop()))
    })()
    return this.#stopping
  }
}

/**
 * Start a fresh local cluster (masters * (1 + replicasPerMaster) nodes) and
 * resolve once every node reports cluster_state:ok, knows every other node and
 * every replica is in sync with its master.
 */
export async function startCluster (opts: StartClusterOptions = {}): Promise<RedisCluster> {
  const masters = opts.masters ?? 3
  const replicas = opts.replicasPerMaster ?? 0
  const nodeTimeoutMs = opts.nodeTimeoutMs ?? 2_000
  if (!Number.isInteger(masters) || masters < 3) {
    throw new TypeError(`masters must be an integer >= 3 (redis-cli --cluster create needs 3), got ${masters}`)
  }
  if (!Number.isInteger(replicas) || replicas < 0) {
    throw new TypeError(`replicasPerMaster must be an integer >= 0, got ${replicas}`)
  }
  findBinary('redis-cli') // fail fast, before starting anything
  const args = [
    '--cluster-enabled', 'yes',
    '--cluster-config-file', 'nodes.conf',
    '--cluster-node-timeout', String(nodeTimeoutMs),
    // let a replica take over however long its master has been unreachable
    '--cluster-replica-validity-factor', '0',
    // replicas sync at once instead of waiting 5 s for more replicas to join
    '--repl-diskless-sync-delay', '0',
    ...(opts.args ?? [])
  ]
  const started = await Promise.allSettled(
    Array.from({ length: masters * (1 + replicas) }, async () => await startRedisServer({ args })))
  const nodes = started.flatMap(r => r.status === 'fulfilled' ? [r.value] : [])
  const cluster = new LocalCluster(nodes)
  try {
    const failed = started.find(r => r.status === 'rejected')
    if (failed !== undefined) throw failed.reason
    await redisCliCreate(nodes, replicas)
    await cluster.waitCreated(30_000)
    return cluster
  } catch (err) {
    await cluster.stop()
    throw err
  }
}

/** Keys on one master matching `pattern`, by SCAN. */
export async function keysOn (node: RedisServer, pattern: string): Promise<string[]> {
  const found: string[] = []
  let cursor = '0'
  do {
    const [next, batch] = await redisCommand(node, ['SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000]) as [string, string[]]
    cursor = next
    found.push(...batch)
  } while (cursor !== '0')
  return found
}
