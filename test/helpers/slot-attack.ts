// Client ids crafted to land in one Cluster slot, as an attacker who reads
// this code would craft them (test/slot-spread.test.ts). Crafting is a
// brute-force search (seconds of CPU), so the ids are kept in
// test/fixtures/slot-attack.json; regenerate it with
// `node --import=./test/helpers/ts-sources.mjs test/helpers/slot-attack.ts > test/fixtures/slot-attack.json`.

import { clientId, hashTag } from '../../lib/core/keys.js'
import { slotOf } from './slot.js'

/** The slot every crafted id aims at. */
export const TARGET_SLOT = 4242

export interface SlotAttack {
  readonly slot: number
  /** Ids whose key landed in `slot` under the earlier layout `<prefix>:{<clientId>}:<bucket>`: kept ids, then hashed ones. */
  readonly oldScheme: string[]
  /** A secret the attacker knows (another deployment's, or a leaked one). */
  readonly knownSecret: string
  /** Ids whose hash tag lands in `slot` under `knownSecret`. */
  readonly keyed: string[]
}

/** The slot of a client's keys under the earlier layout: the CRC16 of its client part. */
export function oldSlot (id: string): number {
  return slotOf(`{${clientId(id)}}`)
}

/** The slot of a client's keys under `secret`: the CRC16 of its hash tag. */
export function keyedSlot (secret: string, id: string): number {
  return slotOf(`{${hashTag(Buffer.from(secret, 'utf8'), clientId(id))}}`)
}

function craft (count: number, name: (n: number) => string, slot: (id: string) => number): string[] {
  const found: string[] = []
  for (let n = 0; found.length < count; n++) if (slot(name(n)) === TARGET_SLOT) found.push(name(n))
  return found
}

export function craftAttack (): SlotAttack {
  const knownSecret = 'a secret the attacker knows'
  return {
    slot: TARGET_SLOT,
    oldScheme: [...craft(150, (n) => `u${n}`, oldSlot), ...craft(50, (n) => `user${n}@example.com`, oldSlot)],
    knownSecret,
    keyed: craft(60, (n) => `k${n}`, (id) => keyedSlot(knownSecret, id))
  }
}

if (import.meta.url === `file://${process.argv[1]}`) process.stdout.write(JSON.stringify(craftAttack(), null, 1) + '\n')
