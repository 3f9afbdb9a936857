// What the benchmark reads from Redis itself: INFO commandstats deltas and
// the memory of bucket keys.

/** INFO commandstats as Map<command, { calls, usec }>. */
export async function commandStats (redis) {
  const text = await redis.info('commandstats')
  const stats = new Map()
  for (const line of text.split('\r\n')) {
    const match = /^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/.exec(line)
    if (match !== null) stats.set(match[1], { calls: Number(match[2]), usec: Number(match[3]) })
  }
  return stats
}

/** CPU time Redis has used so far (all its threads), in microseconds, from INFO cpu. */
export async function redisCpuUs (redis) {
  const text = await redis.info('cpu')
  const field = (name) => Number(new RegExp(`${name}:([\\d.]+)`).exec(text)?.[1] ?? NaN)
  return Math.round((field('used_cpu_sys') + field('used_cpu_user')) * 1e6)
}

/**
 * The commands Redis ran between two snapshots. `info` is left out: the
 * snapshots are INFO calls themselves. Commands a script runs (GET, SET,
 * TIME, INCR ...) are counted by Redis like any other, next to the
 * EVALSHA that ran them.
 */
export function statsDelta (before, after) {
  let calls = 0
  let scriptCalls = 0
  let scriptUsec = 0
  for (const [name, now] of after) {
    if (name === 'info') continue
    const then = before.get(name) ?? { calls: 0, usec: 0 }
    calls += now.calls - then.calls
    if (name === 'evalsha' || name === 'eval') {
      scriptCalls += now.calls - then.calls
      scriptUsec += now.usec - then.usec
    }
  }
  return { calls, scriptCalls, scriptUsec }
}

/**
 * Mean MEMORY USAGE of up to `sample` keys matching `pattern`, and the mean
 * length of their names; usage minus name is what one bucket costs besides
 * its name. (For a string key Redis counts its dict entry, the object and
 * the name's allocation, so keys of a similar length cost the same
 * whatever small integer they hold.)
 */
export async function bucketMemory (redis, pattern, sample = 200) {
  const keys = []
  let cursor = '0'
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000)
    keys.push(...found)
    cursor = next
  } while (cursor !== '0' && keys.length < sample)
  if (keys.length === 0) return undefined
  const chosen = keys.slice(0, sample)
  const pipeline = redis.pipeline()
  for (const key of chosen) pipeline.memory('USAGE', key, 'SAMPLES', 0)
  const replies = await pipeline.exec()
  let usage = 0
  let names = 0
  for (let i = 0; i < chosen.length; i++) {
    const [err, bytes] = replies[i]
    if (err !== null) throw err
    usage += bytes
    names += Buffer.byteLength(chosen[i])
  }
  return { usage: usage / chosen.length, keyLength: names / chosen.length, perBucket: (usage - names) / chosen.length }
}
