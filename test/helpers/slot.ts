// Redis Cluster's slot of a key: CRC16 (XMODEM: polynomial 0x1021, initial
// value 0) of its hash tag, modulo 16384. The hash tag is what lies between
// the first '{' and the first '}' after it, when that is not empty; else
// the whole key. Every key of one decision shares the client's hash tag
// (lib/core/keys.ts), so one decision is one slot.

const TABLE = new Uint16Array(256)
for (let i = 0; i < 256; i++) {
  let crc = i << 8
  for (let bit = 0; bit < 8; bit++) crc = (crc & 0x8000) !== 0 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff
  TABLE[i] = crc
}

/** The slot, 0 to 16383, that Redis Cluster stores `key` in. */
export function slotOf (key: string): number {
  const open = key.indexOf('{')
  let tag = key
  if (open !== -1) {
    const close = key.indexOf('}', open + 1)
    if (close > open + 1) tag = key.slice(open + 1, close)
  }
  const bytes = Buffer.from(tag, 'utf8')
  let crc = 0
  // The index is masked to 0..255, the table's length (the `as`).
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ (TABLE[((crc >> 8) ^ byte) & 0xff] as number)
  return crc & 0x3fff
}
