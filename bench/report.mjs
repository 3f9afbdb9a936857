// The markdown report of a benchmark run: medians over rounds, the tables,
// and the lines that set the figures against the issue's targets.

const NA = 'n/a'

function median (values) {
  const sorted = values.filter((v) => v !== undefined && !Number.isNaN(v)).sort((a, b) => a - b)
  if (sorted.length === 0) return undefined
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2
}

function fixed (value, digits) {
  return value === undefined ? NA : value.toFixed(digits)
}

/** ' [min to max within single rounds]' of per-round ratios, or '' with fewer than two. */
function roundRange (ratios) {
  const finite = ratios.filter((r) => Number.isFinite(r))
  return finite.length < 2 ? '' : ` [${Math.min(...finite).toFixed(2)} to ${Math.max(...finite).toFixed(2)} within single rounds]`
}

function verdict (value, target) {
  if (value === undefined) return NA
  return value <= target ? 'meets' : 'misses'
}

export function report (run) {
  const { settings, configs, workloads, results, lua, scripts, machine } = run
  const cells = (w, c) => results[w]?.[c]
  const ran = (w, c) => Array.isArray(cells(w, c))
  const med = (w, c, pick) => ran(w, c) ? median(cells(w, c).map(pick)) : undefined

  const out = []
  out.push('# tollgate benchmark', '')
  out.push(`- Machine: ${machine.nproc} CPUs, ${machine.cpu}; Node ${machine.node}; Redis ${machine.redis}`)
  out.push(`- Date: ${run.date}`)
  out.push(`- Command: \`${run.command}\``)
  out.push(`- Settings: ${settings.rounds} round(s) of every cell, configurations alternating within each round; ` +
    `${settings.seconds} s measured after ${settings.warmup} s of warm-up per cell; medians over rounds ` +
    `(over-admission: the largest over rounds). The run took ${run.minutes.toFixed(1)} min.`)
  out.push(`- Load generator, app servers and Redis share this machine; 127.0.0.1 only. ` +
    `Load average (1 min) at start ${machine.loadStart.toFixed(2)}, at end ${machine.loadEnd.toFixed(2)} (the benchmark's own processes included; other work on the machine shows above that).`)
  out.push(`- tollgate options in this build: \`denialCache\` ${run.features.denialCache ? 'yes' : 'no'}, \`lease\` ${run.features.lease ? 'yes' : 'no'}` +
    ' (cells needing a missing one read n/a; without `denialCache` the exact configuration runs without it, which is exact by construction).')
  out.push('')

  out.push('## Configurations and workloads', '')
  for (const c of configs) out.push(`- **${c.id}**: ${c.label}`)
  out.push(`- tollgate runs with \`failureMode: 'open'\` and \`timeout: ${run.tollgateTimeoutMs}\` so that every measured decision comes ` +
    'from Redis; decisions from a fallback are counted and listed under Notes. @fastify/rate-limit gets the same limit as a ' +
    `fixed window (\`max\` = capacity per capacity / refillPerSecond seconds); its in-process store gets \`cache: ${run.frlLocalCache}\` so ` +
    'that it keeps every W1 client.')
  for (const w of workloads) {
    let pace = w.rate === undefined ? `unpaced, ${w.connections} connections` : `paced at ${w.rate} req/s in all, ${w.connections} connections per server`
    if (w.cpuRate !== undefined) {
      pace += `; its CPU and Redis figures come from a second window of ${settings.seconds / 2} s paced at ${w.cpuRate} req/s ` +
        'for every configuration (per-request CPU at saturation depends on the rate each configuration happens to reach)'
    }
    const lease = w.lease === undefined ? '' : `; tollgate leases \`${JSON.stringify(w.lease)}\` in the local-caches configuration`
    out.push(`- **${w.id}**: ${w.label}: ${w.servers} app server(s), capacity ${w.policy.capacity}, ` +
      `refill ${w.policy.refillPerSecond}/s, ${pace}${lease}`)
  }
  out.push('')

  out.push('## Results', '')
  out.push('| workload | configuration | req/s | p50 ms | p99 ms | 2xx % | Node CPU µs/req | Redis calls/req | Redis cmds/req incl. in-script | Redis µs/call | Redis keys |')
  out.push('| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
  for (const w of workloads) {
    for (const c of configs) {
      const unavailable = cells(w.id, c.id)?.unavailable
      if (unavailable !== undefined || !ran(w.id, c.id)) {
        out.push(`| ${w.id} | ${c.id} | ${NA} | ${NA} | ${NA} | ${NA} | ${NA} | ${NA} | ${NA} | ${NA} | ${NA} |`)
        continue
      }
      const m = (pick) => med(w.id, c.id, pick)
      out.push(`| ${w.id} | ${c.id} | ${fixed(m((x) => x.rps), 0)} | ${fixed(m((x) => x.p50), 2)} | ${fixed(m((x) => x.p99), 2)} | ` +
        `${fixed(m((x) => x.okPct), 1)} | ${fixed(m((x) => x.cpuUsPerReq), 1)} | ${fixed(m((x) => x.callsPerReq), 3)} | ` +
        `${fixed(m((x) => x.statCallsPerReq), 3)} | ${fixed(m((x) => x.usPerCall), 2)} | ${fixed(m((x) => x.keys), 0)} |`)
    }
  }
  out.push('')
  out.push('- Node CPU µs/req: user + system CPU of the app server process(es) over the measured window, divided by the requests they received in it.')
  out.push('- Redis calls/req: commands the app servers sent to Redis (round trips; a script call is one), counted at their ioredis client.')
  out.push('- Redis cmds/req incl. in-script: the sum of `calls` over INFO commandstats (all commands but INFO), which also counts every ' +
    'command a script runs inside Redis (TIME, GET, SET, INCR, ...).')
  out.push('- Redis µs/call: `usec` / `calls` of EVALSHA and EVAL in INFO commandstats: Redis time per script call (wall clock inside Redis).')
  out.push('- Redis keys: DBSIZE as the load stops: the buckets Redis holds (each key expires when its bucket is full again, or at the end of its window).')
  out.push('')

  const w3 = workloads.find((w) => w.id === 'W3')
  if (w3 !== undefined) {
    const probe = w3.probe
    out.push('## W3: admissions over 4 app servers', '')
    out.push('Per round, for one new client: bound = capacity + refill x (time of its last admitted request - start of its load); ' +
      'over-admitted = admitted - bound when positive (the largest over rounds). The hot client runs at 95% of its limit, where ' +
      'no limiter can exceed the bound; the flood client' +
      (probe === undefined ? '' : ` (capacity ${probe.policy.capacity}, refill ${probe.policy.refillPerSecond}/s, same pace and leases, ` +
        `${probe.seconds} s right after the hot client)`) +
      ' is where a fleet spending more than its bucket would show.', '')
    out.push('| configuration | hot: admitted | hot: bound | hot: over-admitted | hot: denied | flood: responses | flood: admitted | flood: bound | flood: over-admitted |')
    out.push('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
    for (const c of configs) {
      if (!ran('W3', c.id)) {
        out.push(`| ${c.id} |${` ${NA} |`.repeat(8)}`)
        continue
      }
      const list = cells('W3', c.id)
      const m = (pick) => fixed(median(list.map(pick)), 0)
      const worst = (pick) => c.id.endsWith('bare') || c.id === 'round-trip' ? 'n/a (no limit)' : String(Math.max(...list.map(pick)))
      const flood = list[0].probe === undefined
        ? ` ${NA} | ${NA} | ${NA} | ${NA} |`
        : ` ${m((x) => x.probe.responses)} | ${m((x) => x.probe.allowed)} | ${m((x) => x.probe.bound)} | ${worst((x) => x.probe.over)} |`
      out.push(`| ${c.id} | ${m((x) => x.admission.allowed)} | ${m((x) => x.admission.bound)} | ${worst((x) => x.admission.over)} | ` +
        `${m((x) => x.admission.denied)} |${flood}`)
    }
    out.push('')
  }

  out.push('## The scripts alone', '')
  out.push(`${settings.luaCalls} pipelined decisions per round over 1,000 buckets (keys named as in the Fastify runs), all allowed, ` +
    'from one client. Redis µs/call: `usec` / `calls` of EVALSHA (wall clock inside Redis, so it grows whenever Redis is ' +
    'descheduled mid-call on a busy machine); Redis CPU µs/call: used_cpu_user + used_cpu_sys of INFO cpu over the calls ' +
    '(the whole server: reading, parsing and answering the pipelined calls included); bytes per bucket: MEMORY USAGE of a key ' +
    'minus the length of its name (mean of 200 keys), next to the MEMORY USAGE and name length it comes from: a string key ' +
    'holding a small integer costs Redis the same whatever the integer, so this figure falls as names grow. Medians over rounds.', '')
  out.push('| script | Redis µs/call | Redis CPU µs/call | bytes/bucket | MEMORY USAGE | key name bytes |')
  out.push('| --- | ---: | ---: | ---: | ---: | ---: |')
  const alone = (name, pick) => median(lua[name].map(pick))
  for (const s of scripts) {
    out.push(`| ${s.label} | ${fixed(alone(s.name, (x) => x.usPerCall), 2)} | ${fixed(alone(s.name, (x) => x.cpuUsPerCall), 2)} | ` +
      `${fixed(alone(s.name, (x) => x.memory?.perBucket), 1)} | ${fixed(alone(s.name, (x) => x.memory?.usage), 1)} | ` +
      `${fixed(alone(s.name, (x) => x.memory?.keyLength), 1)} |`)
  }
  out.push('')

  out.push('## Against the targets', '')
  const cpu = (w, c) => med(w, c, (x) => x.cpuUsPerReq)
  const added = (w, c, peer) => {
    const base = cpu(w, 'bare')
    const mine = cpu(w, c)
    const theirs = cpu(w, peer)
    if (base === undefined || mine === undefined || theirs === undefined) return undefined
    return (mine - base) / (theirs - base)
  }
  // The same ratio within each round (configurations alternate within a
  // round, so its cells ran minutes apart at most): its range is the spread.
  const spread = (w, c, peer) => {
    if (!ran(w, 'bare') || !ran(w, c) || !ran(w, peer)) return ''
    const bare = cells(w, 'bare')
    return roundRange(cells(w, c).map((x, i) => (x.cpuUsPerReq - bare[i].cpuUsPerReq) / (cells(w, peer)[i].cpuUsPerReq - bare[i].cpuUsPerReq)))
  }
  for (const w of workloads) {
    const exact = added(w.id, 'tollgate-exact', 'frl-redis')
    const cached = added(w.id, 'tollgate-cached', 'frl-redis')
    out.push(`- ${w.id}: Node CPU per request added over bare Fastify, tollgate / @fastify/rate-limit Redis store: ` +
      `exact ${fixed(exact, 2)}${spread(w.id, 'tollgate-exact', 'frl-redis')} (${verdict(exact, 0.8)}), ` +
      `local caches ${fixed(cached, 2)}${spread(w.id, 'tollgate-cached', 'frl-redis')} (${verdict(cached, 0.8)}); target <= 0.8`)
  }
  const micros = (value) => value === undefined ? NA : `${value.toFixed(1)} µs`
  for (const w of workloads) {
    if (!ran(w.id, 'round-trip')) continue
    const over = (c) => { const base = cpu(w.id, 'bare'); const mine = cpu(w.id, c); return base === undefined || mine === undefined ? undefined : mine - base }
    const floor = over('round-trip')
    const peer = over('frl-redis')
    const exact = over('tollgate-exact')
    const above = (x) => x === undefined || floor === undefined ? NA : `${(x - floor).toFixed(1)} µs`
    out.push(`- ${w.id}: the floor, one Redis round trip per request and nothing else, adds ${micros(floor)} over bare Fastify ` +
      `(${fixed(floor === undefined || peer === undefined ? undefined : floor / peer, 2)} of @fastify/rate-limit's Redis store); ` +
      `above that floor, @fastify/rate-limit adds ${above(peer)} and tollgate exact ${above(exact)}`)
  }
  const addedOver = (w, c, bare) => {
    const base = cpu(w, bare)
    const mine = cpu(w, c)
    return base === undefined || mine === undefined ? undefined : mine - base
  }
  for (const w of workloads) {
    if (!ran(w.id, 'express-bare')) continue
    const erl = addedOver(w.id, 'erl-redis', 'express-bare')
    const exact = addedOver(w.id, 'express-tollgate-exact', 'express-bare')
    const cached = addedOver(w.id, 'express-tollgate-cached', 'express-bare')
    const ratio = (mine) => mine === undefined || erl === undefined ? undefined : mine / erl
    out.push(`- ${w.id} on Express: Node CPU per request added over bare Express: express-rate-limit + rate-limit-redis ${micros(erl)}, ` +
      `tollgate/express exact ${micros(exact)} (ratio ${fixed(ratio(exact), 2)}, ${verdict(ratio(exact), 1)}; target <= 1), ` +
      `with local caches ${micros(cached)} (ratio ${fixed(ratio(cached), 2)})`)
  }
  for (const w of workloads) {
    if (!ran(w.id, 'hono-bare')) continue
    const hrl = addedOver(w.id, 'hrl-redis', 'hono-bare')
    const exact = addedOver(w.id, 'hono-tollgate-exact', 'hono-bare')
    const ratio = exact === undefined || hrl === undefined ? undefined : exact / hrl
    out.push(`- ${w.id} on Hono: Node CPU per request added over bare Hono: hono-rate-limiter with its Redis store ${micros(hrl)}, ` +
      `tollgate/hono exact ${micros(exact)} (ratio ${fixed(ratio, 2)})`)
  }
  if (workloads.some((w) => w.id === 'W2')) {
    const calls = med('W2', 'tollgate-cached', (x) => x.callsPerReq)
    const stat = med('W2', 'tollgate-cached', (x) => x.statCallsPerReq)
    const vsLocal = added('W2', 'tollgate-cached', 'frl-local')
    const allowed = med('W2', 'tollgate-cached', (x) => x.okPct)
    out.push(`- W2 flood, tollgate with local caches: ${fixed(calls, 3)} Redis calls/req (${verdict(calls, 0.02)}; target <= 0.02; ` +
      `${fixed(stat, 3)} with in-script commands; ${fixed(allowed, 1)}% of requests were admitted, each needing a script call without a lease). ` +
      `Added CPU/req over bare vs @fastify/rate-limit in-process: ${fixed(vsLocal, 2)}`)
  }
  if (w3 !== undefined) {
    const calls = med('W3', 'tollgate-cached', (x) => x.callsPerReq)
    const stat = med('W3', 'tollgate-cached', (x) => x.statCallsPerReq)
    const over = (c, phase) => ran('W3', c) && cells('W3', c)[0][phase] !== undefined
      ? String(Math.max(...cells('W3', c).map((x) => x[phase].over)))
      : NA
    out.push(`- W3 hot client with leases: ${fixed(calls, 3)} Redis calls/req (${verdict(calls, 0.05)}; target <= 0.05; ` +
      `${fixed(stat, 3)} with in-script commands); over-admitted (must be 0): with leases ${over('tollgate-cached', 'admission')} ` +
      `(hot), ${over('tollgate-cached', 'probe')} (flood); exact mode ${over('tollgate-exact', 'admission')} (hot), ` +
      `${over('tollgate-exact', 'probe')} (flood)`)
  }
  const us = med('W1', 'tollgate-exact', (x) => x.usPerCall)
  const usAlone = alone('tollgate', (x) => x.usPerCall)
  const usSeed = alone('seed', (x) => x.usPerCall)
  // Absolute µs depend on the machine; the target is the ratio below.
  out.push(`- Redis µs per decision, tollgate script: ${fixed(us, 2)} in W1 exact mode, ` +
    `${fixed(usAlone, 2)} alone (CPU ${fixed(alone('tollgate', (x) => x.cpuUsPerCall), 2)}); ` +
    `design note script alone ${fixed(usSeed, 2)} (CPU ${fixed(alone('seed', (x) => x.cpuUsPerCall), 2)})`)
  const seedRatio = usAlone === undefined || usSeed === undefined ? undefined : usAlone / usSeed
  const seedSpread = roundRange((lua.tollgate ?? []).map((x, i) => x.usPerCall / lua.seed?.[i]?.usPerCall))
  out.push(`- Redis time of tollgate's script / the design note script's, same Redis, same run: ${fixed(seedRatio, 2)}${seedSpread} ` +
    `(${verdict(seedRatio, 0.65)}; target <= 0.65)`)
  const bytes = alone('tollgate', (x) => x.memory?.perBucket)
  const bytesSeed = alone('seed', (x) => x.memory?.perBucket)
  out.push(`- Bytes per bucket, tollgate: ${fixed(bytes, 1)} (${verdict(bytes, 48)}); design note script ${fixed(bytesSeed, 1)}; ` +
    `@fastify/rate-limit Redis store ${fixed(alone('frl', (x) => x.memory?.perBucket), 1)} (its key names are longer); target <= 48`)
  out.push('')

  const notes = []
  for (const w of workloads) {
    for (const c of configs) {
      const entry = cells(w.id, c.id)
      if (entry?.unavailable !== undefined) notes.push(`${w.id} ${c.id}: n/a, ${entry.unavailable}`)
      if (!Array.isArray(entry)) continue
      const fallbacks = sum(entry.map((x) => x.fallbacks))
      if (fallbacks > 0) notes.push(`${w.id} ${c.id}: ${fallbacks} decisions did not come from Redis (fallback) over all rounds`)
      const errors = sum(entry.map((x) => x.errors))
      if (errors > 0) notes.push(`${w.id} ${c.id}: ${errors} connection errors or timeouts at the load generator`)
      const odd = {}
      for (const x of entry) {
        for (const [code, n] of Object.entries(x.statuses)) if (code !== '200' && code !== '429') odd[code] = (odd[code] ?? 0) + n
      }
      for (const [code, n] of Object.entries(odd)) notes.push(`${w.id} ${c.id}: ${n} responses with status ${code}`)
      if (w.cpuRate !== undefined) {
        const slow = entry.filter((x) => x.windowRps < 0.95 * w.cpuRate).map((x) => x.windowRps.toFixed(0))
        if (slow.length > 0) notes.push(`${w.id} ${c.id}: the paced CPU window reached only ${slow.join(', ')} req/s of ${w.cpuRate}`)
      }
      const denied = sum(entry.map((x) => x.statuses[429] ?? 0))
      if (w.underLimit && denied > 0) {
        notes.push(`${w.id} ${c.id}: ${denied} requests denied (429) over all rounds although every client stayed under its limit`)
      }
    }
  }
  out.push('## Notes', '')
  if (notes.length === 0) {
    out.push('- None: every response was 200 or 429, no denial under the limit, no connection errors, no fallback decisions.')
  }
  for (const n of notes) out.push(`- ${n}`)
  out.push('')
  return out.join('\n')
}

function sum (values) {
  return values.reduce((a, b) => a + b, 0)
}
