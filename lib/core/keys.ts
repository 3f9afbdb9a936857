import { createHash, createHmac, type KeyObject } from 'node:crypto'
import { isIPv6 } from 'node:net'

const SAFE_ID = /^[A-Za-z0-9._:-]{1,64}$/
/** A UTF-16 code unit of a surrogate pair, standing alone. */
const LONE_SURROGATE = /\p{Cs}/u
/** Never a byte of UTF-8: marks the hash input of an id that UTF-8 cannot encode. */
const NOT_UTF8 = Buffer.of(0xff)

/**
 * The client part of a key, after its hash tag (see hashTag), readable for
 * an operator: ids of up to 64 bytes from [A-Za-z0-9._:-] are kept as they are; any
 * other id (longer, binary, with braces, newlines, spaces, empty) becomes
 * '#' and 26 base64url characters of its SHA-256. '#' never appears in a
 * kept id, so a hashed id cannot collide with a kept one, and no input can
 * open a hash tag of its own or make the key long.
 *
 * Why two encodings: the hash must see distinct ids as distinct bytes.
 * UTF-8 does for every well-formed string, and it is what earlier versions
 * hashed, so their keys (and a fleet mid-upgrade) stay the same. A lone
 * surrogate has no UTF-8 form: encoding it gives U+FFFD, so "bob\ud800"
 * would share a bucket with "bob\ufffd". Such an id is hashed as its UTF-16
 * code units instead, behind a 0xff byte that UTF-8 never holds, so the two
 * kinds of input never meet.
 */
export function clientId (id: string): string {
  if (SAFE_ID.test(id)) return id
  const hash = createHash('sha256')
  if (LONE_SURROGATE.test(id)) hash.update(NOT_UTF8).update(id, 'utf16le')
  else hash.update(id, 'utf8')
  return '#' + hash.digest('base64url').slice(0, 26)
}

/** Characters of a hash tag: 48 bits of an HMAC, against the 14 bits of a Cluster slot. */
export const TAG_LENGTH = 8

/**
 * The hash tag of a client, from its client part (`clientId`): the first
 * characters of an HMAC-SHA256 of it under the fleet's secret
 * (lib/core/key-secret.ts), in base64url. The slot is the CRC16 of the tag,
 * so whoever does not know the secret cannot tell which ids share a slot,
 * nor choose ids that do. The tag only places the key: the client part
 * after it keeps distinct ids apart, whatever two tags have in common.
 * The limiter passes its secret as a KeyObject, made once: from a Buffer,
 * createHmac makes a new one every call, which cost more than the rest of
 * a decision's own work in Node 24 (about 11 µs against 1.6).
 */
export function hashTag (secret: Buffer | KeyObject, id: string): string {
  return createHmac('sha256', secret).update(id).digest('base64url').slice(0, TAG_LENGTH)
}

/**
 * An IP address as a client identity: IPv4-mapped IPv6 (in any notation)
 * becomes plain IPv4,
 * other IPv6 addresses are reduced to their first `subnet` bits, written as
 * eight hex groups, so one host cannot rotate through the addresses of its
 * own /64 to get fresh buckets.
 */
export function ipIdentity (ip: string, subnet: number): string {
  if (!ip.includes(':')) return ip
  const lower = ip.toLowerCase()
  if (lower.startsWith('::ffff:') && lower.includes('.')) return lower.slice(7)
  if (!isIPv6(lower)) return ip
  const groups = expandIPv6(lower)
  const high = groups[6]
  const low = groups[7]
  // isIPv6 held: the eight groups are there.
  if (groups[5] === 0xffff && groups.slice(0, 5).every((g) => g === 0) && high !== undefined && low !== undefined) {
    return `${high >> 8}.${high & 0xff}.${low >> 8}.${low & 0xff}`
  }
  const out: string[] = []
  for (let i = 0; i < 8; i++) {
    const group = groups[i]
    if (group !== undefined) {
      const keep = Math.max(0, Math.min(16, subnet - 16 * i))
      const mask = keep === 0 ? 0 : (0xffff << (16 - keep)) & 0xffff
      out.push((group & mask).toString(16))
    }
  }
  return out.join(':')
}

function expandIPv6 (ip: string): number[] {
  let text = ip
  const zone = text.indexOf('%')
  if (zone !== -1) text = text.slice(0, zone)
  // A trailing dotted IPv4 part stands for the last two groups.
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text)
  if (dotted !== null) {
    const high = (Number(dotted[1]) << 8) | Number(dotted[2])
    const low = (Number(dotted[3]) << 8) | Number(dotted[4])
    text = text.slice(0, dotted.index) + high.toString(16) + ':' + low.toString(16)
  }
  const [head = '', tail] = text.split('::')
  const left = head === '' ? [] : head.split(':')
  const right = tail === undefined || tail === '' ? [] : tail.split(':')
  const missing = 8 - left.length - right.length
  const all = tail === undefined ? left : [...left, ...new Array<string>(missing).fill('0'), ...right]
  return all.map((g) => parseInt(g, 16))
}
