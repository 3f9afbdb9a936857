// Addresses for log lines, whatever the client: never a user name or a password.

import { prop } from './props.js'

/** `host:port`, brackets around an IPv6 host. */
export function hostPort (host: unknown, port: unknown): string {
  const name = typeof host === 'string' && host !== '' ? host : '127.0.0.1'
  return `${name.includes(':') ? `[${name}]` : name}:${typeof port === 'number' || typeof port === 'string' ? port : 6379}`
}

/** A seed node as the clients take it (a port, a URL or `host:port`, an object), without its password. */
export function seedAddress (node: unknown, family: string): string {
  if (typeof node === 'number') return hostPort(undefined, node)
  if (typeof node === 'string') return urlAddress(node, family)
  const url = prop(node, 'url')
  const socket = prop(node, 'socket')
  if (typeof url === 'string') return urlAddress(url, family)
  if (typeof socket === 'object' && socket !== null) return socketAddress(socket)
  return hostPort(prop(node, 'host'), prop(node, 'port'))
}

/** A node-redis `socket` option: a host and port, or a unix socket's path. */
export function socketAddress (socket: unknown): string {
  const path = prop(socket, 'path')
  if (typeof path === 'string' && path !== '') return `unix:${path}`
  return hostPort(prop(socket, 'host'), prop(socket, 'port'))
}

/** `redis://user:password@host:port/db`, `rediss://`, `host:port`: its host and port only. */
export function urlAddress (text: string, family: string): string {
  try {
    const url = new URL(text.includes('://') ? text : `redis://${text}`)
    return hostPort(url.hostname.replace(/^\[|\]$/g, ''), url.port === '' ? undefined : url.port)
  } catch {
    return `an address ${family} could not parse either`
  }
}
