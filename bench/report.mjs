// The markdown report of a benchmark run: medians over rounds, the tables,
// and the lines that set the figures against the issue's targets.

const NA = 'n/a'

/** The median of the defined numbers of `values`; undefined when there is none. */
export function median (values) {
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

/** ' [lowest–highest round]' of a figure, or '' with fewer than two rounds. */
function valueRange (values, digits) {
  const finite = values.filter((v) => Number.isFinite(v))
  return finite.length < 2 ? '' : ` [${Math.min(...finite).toFixed(digits)}–${Math.max(...finite).toFixed(digits)}]`
}

/** Per framework: its bare app, its incumbent on Redis, tollgate exact and tollgate with `batch: false`. */
export const FRAMEWORKS = [
  { name: 'Fastify', bare: 'bare', peer: 'frl-redis', peerLabel: '@fastify/rate-limit Redis store', exact: 'tollgate-exact', single: 'tollgate-single' },
  { name: 'Express', bare: 'express-bare', peer: 'erl-redis', peerLabel: 'express-rate-limit + rate-limit-redis', exact: 'express-tollgate-exact', single: 'express-tollgate-single' },
  { name: 'Hono', bare: 'hono-bare', peer: 'hrl-redis', peerLabel: 'hono-rate-limiter Redis store', exact: 'hono-tollgate-exact' }
]

/** The target for tollgate exact / the incumbent, added CPU per request, by workload. */
function cpuTarget (w) {
  if (w.family === 'W1') return w.level === 1 ? 1 : w.level <= 8 ? 0.6 : 0.35
  if (w.id === 'W4') return 0.8
  return undefined
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
  out.push(`- CPUs: ${machine.pinned ?? 'not pinned'}.`)
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
    const pace = w.rate === undefined
      ? `unpaced, ${w.connections} connection(s), so ${w.connections} request(s) in flight; CPU and Redis figures at the rate each configuration reaches`
      : `paced at ${w.rate} req/s in all, ${w.connections} connections per server`
    const lease = w.lease === undefined ? '' : `; tollgate leases \`${JSON.stringify(w.lease)}\` in the local-caches configuration`
    out.push(`- **${w.id}**: ${w.label}: ${w.servers} app server(s), capacity ${w.policy.capacity}, ` +
      `refill ${w.policy.refillPerSecond}/s, ${pace}${lease}`)
  }
  out.push('')

  out.push('## Results', '')
  out.push('| workload | configuration | req/s | p50 ms | p99 ms | 2xx % | Node CPU µs/req | Redis calls/req | Redis cmds/req incl. in-script | Redis µs/call | Redis µs/req | Redis keys |')
  out.push('| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
  for (const w of workloads) {
    for (const c of configs) {
      const unavailable = cells(w.id, c.id)?.unavailable
      if (unavailable !== undefined || !ran(w.id, c.id)) {
        out.push(`| ${w.id} | ${c.id} |${` ${NA} |`.repeat(11)}`)
        continue
      }
      const m = (pick) => med(w.id, c.id, pick)
      out.push(`| ${w.id} | ${c.id} | ${fixed(m((x) => x.rps), 0)} | ${fixed(m((x) => x.p50), 2)} | ${fixed(m((x) => x.p99), 2)} | ` +
        `${fixed(m((x) => x.okPct), 1)} | ${fixed(m((x) => x.cpuUsPerReq), 1)}${valueRange(cells(w.id, c.id).map((x) => x.cpuUsPerReq), 1)} | ${fixed(m((x) => x.callsPerReq), 3)} | ` +
        `${fixed(m((x) => x.statCallsPerReq), 3)} | ${fixed(m((x) => x.usPerCall), 2)} | ${fixed(m((x) => x.redisUsPerReq), 2)} | ${fixed(m((x) => x.keys), 0)} |`)
    }
  }
  out.push('')
  out.push('- Node CPU µs/req: user + system CPU of the app server process(es) over the measured window, divided by the requests they received in it; the median of the rounds, and in brackets the lowest and highest round.')
  out.push('- Redis calls/req: commands the app servers sent to Redis (round trips; a script call is one), counted at their ioredis client.')
  out.push('- Redis cmds/req incl. in-script: the sum of `calls` over INFO commandstats (all commands but INFO), which also counts every ' +
    'command a script runs inside Redis (TIME, GET, SET, INCR, ...).')
  out.push('- Redis µs/call: `usec` / `calls` of EVALSHA and EVAL in INFO commandstats: Redis time per script call (wall clock inside Redis).')
  out.push('- Redis µs/req: the same `usec` divided by the requests: Redis time per decision, whether a call carries one decision or a batch of them.')
  out.push('- Redis keys: DBSIZE as the load stops: the buckets Redis holds (each key expires when its bucket is full again, or at the end of its window).')
  out.push('')

  const cpu = (w, c) => med(w, c, (x) => x.cpuUsPerReq)
  const addedOver = (w, c, bare) => {
    const base = cpu(w, bare)
    const mine = cpu(w, c)
    return base === undefined || mine === undefined ? undefined : mine - base
  }
  // The ratio within each round (configurations alternate within a round,
  // so its cells ran minutes apart at most): its range is the spread.
  const spreadOver = (w, c, peer, bare) => {
    if (!ran(w, bare) || !ran(w, c) || !ran(w, peer)) return ''
    const b = cells(w, bare)
    return roundRange(cells(w, c).map((x, i) => (x.cpuUsPerReq - b[i]?.cpuUsPerReq) / (cells(w, peer)[i]?.cpuUsPerReq - b[i]?.cpuUsPerReq)))
  }
  const ratioOver = (w, c, peer, bare) => {
    const mine = addedOver(w, c, bare)
    const theirs = addedOver(w, peer, bare)
    return mine === undefined || theirs === undefined ? undefined : mine / theirs
  }
  const levels = workloads.filter((w) => w.family === 'W1')
  if (levels.length > 0) {
    out.push('## Requests in flight (W1)', '')
    out.push('Node CPU per request added over the bare framework, in µs, and its ratio to the incumbent\'s ' +
      '(medians over rounds; in brackets, the ratio\'s range within single rounds); then requests per second and p99 latency. ' +
      'Each column keeps that many requests in flight: one connection each, unpaced.', '')
    for (const f of FRAMEWORKS) {
      if (!ran(levels[0].id, f.bare)) continue
      const rows = [f.peer, f.exact, f.single, ...(f.bare === 'bare' ? ['round-trip', 'round-trip-slow'] : [])].filter((c) => c !== undefined && configs.some((x) => x.id === c))
      out.push(`**${f.name}** (bare: ${levels.map((w) => fixed(cpu(w.id, f.bare), 1)).join(' / ')} µs per request)`, '')
      out.push(`| configuration | ${levels.map((w) => `${w.level} in flight`).join(' | ')} |`)
      out.push(`| --- |${' ---: |'.repeat(levels.length)}`)
      for (const c of rows) {
        const cellsText = levels.map((w) => {
          const added = addedOver(w.id, c, f.bare)
          if (added === undefined) return NA
          if (c === f.peer) return `${added.toFixed(1)}`
          return `${added.toFixed(1)} (${fixed(ratioOver(w.id, c, f.peer, f.bare), 2)}×)${spreadOver(w.id, c, f.peer, f.bare)}`
        })
        out.push(`| ${c} | ${cellsText.join(' | ')} |`)
      }
      out.push('')
      out.push(`| req/s · p99 ms | ${levels.map((w) => `${w.level} in flight`).join(' | ')} |`)
      out.push(`| --- |${' ---: |'.repeat(levels.length)}`)
      for (const c of [f.bare, ...rows]) {
        const cellsText = levels.map((w) => ran(w.id, c)
          ? `${fixed(med(w.id, c, (x) => x.rps), 0)} · ${fixed(med(w.id, c, (x) => x.p99), 2)}`
          : NA)
        out.push(`| ${c} | ${cellsText.join(' | ')} |`)
      }
      out.push('')
    }
  }

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
      const worst = (pick) => c.id.endsWith('bare') || c.id.startsWith('round-trip') ? 'n/a (no limit)' : String(Math.max(...list.map(pick)))
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
  out.push('| script | Redis µs/call | Redis µs/decision | Redis CPU µs/call | bytes/bucket | MEMORY USAGE | key name bytes |')
  out.push('| --- | ---: | ---: | ---: | ---: | ---: | ---: |')
  for (const s of scripts) {
    const alone = (name, pick) => median(lua[name].map(pick))
    out.push(`| ${s.label} | ${fixed(alone(s.name, (x) => x.usPerCall), 2)} | ${fixed(alone(s.name, (x) => x.usPerDecision), 2)} | ${fixed(alone(s.name, (x) => x.cpuUsPerCall), 2)} | ` +
      `${fixed(alone(s.name, (x) => x.memory?.perBucket), 1)} | ${fixed(alone(s.name, (x) => x.memory?.usage), 1)} | ` +
      `${fixed(alone(s.name, (x) => x.memory?.keyLength), 1)} |`)
  }
  out.push('')

  out.push('## Against the targets', '')
  const micros = (value) => value === undefined ? NA : `${value.toFixed(1)} µs`
  for (const f of FRAMEWORKS) {
    for (const w of workloads) {
      if (!ran(w.id, f.bare) || !ran(w.id, f.exact) || !ran(w.id, f.peer)) continue
      const ratio = ratioOver(w.id, f.exact, f.peer, f.bare)
      const target = cpuTarget(w)
      const single = ran(w.id, f.single ?? '') ? `; \`batch: false\` ${fixed(ratioOver(w.id, f.single, f.peer, f.bare), 2)}` : ''
      const cached = `${f.exact.replace('-exact', '-cached')}`
      const withCaches = ran(w.id, cached) ? `; local caches ${fixed(ratioOver(w.id, cached, f.peer, f.bare), 2)}` : ''
      out.push(`- ${w.id}, ${f.name}: Node CPU per request added over bare ${f.name}, tollgate exact / ${f.peerLabel}: ` +
        `${fixed(ratio, 2)}${spreadOver(w.id, f.exact, f.peer, f.bare)} (${micros(addedOver(w.id, f.exact, f.bare))} against ${micros(addedOver(w.id, f.peer, f.bare))})` +
        (target === undefined ? '' : `, ${verdict(ratio, target)} the target <= ${target}`) + `${single}${withCaches}`)
    }
  }
  for (const w of workloads) {
    if (!ran(w.id, 'round-trip')) continue
    const floor = addedOver(w.id, 'round-trip', 'bare')
    const peer = addedOver(w.id, 'frl-redis', 'bare')
    const exact = addedOver(w.id, 'tollgate-exact', 'bare')
    const above = (x) => x === undefined || floor === undefined ? NA : `${(x - floor).toFixed(1)} µs`
    out.push(`- ${w.id}: the floor, one Redis round trip per request and nothing else, adds ${micros(floor)} over bare Fastify ` +
      `(${fixed(floor === undefined || peer === undefined ? undefined : floor / peer, 2)} of @fastify/rate-limit's Redis store); ` +
      `above that floor, @fastify/rate-limit adds ${above(peer)} and tollgate exact ${above(exact)}`)
    if (!ran(w.id, 'round-trip-slow')) continue
    const slow = addedOver(w.id, 'round-trip-slow', 'round-trip')
    const longer = (id) => med(w.id, id, (x) => x.usPerCall)
    const redisMore = longer('round-trip-slow') === undefined || longer('round-trip') === undefined ? undefined : longer('round-trip-slow') - longer('round-trip')
    out.push(`- ${w.id}: round-trip-slow, round-trip's app code with its script ${micros(redisMore)} longer in Redis: the app's CPU per request ` +
      `${slow === undefined ? NA : `${slow >= 0 ? '+' : ''}${slow.toFixed(1)} µs`} against round-trip's (this run's noise, and what waiting longer costs the app: bench/wake.mjs)`)
  }
  // p99 of tollgate exact against another configuration of its framework, per workload both ran (target: no worse).
  const p99Against = (f, other, label) => {
    const pairs = workloads.filter((w) => ran(w.id, f.exact) && ran(w.id, other))
    if (pairs.length === 0) return
    const text = pairs.map((w) => {
      const mine = med(w.id, f.exact, (x) => x.p99)
      const theirs = med(w.id, other, (x) => x.p99)
      return `${w.id} ${fixed(mine, 2)} against ${fixed(theirs, 2)} (${verdict(mine / theirs, 1)})`
    })
    out.push(`- ${f.name}: p99 latency in ms, tollgate exact against ${label} (target: no worse): ${text.join('; ')}`)
  }
  for (const f of FRAMEWORKS) p99Against(f, f.peer, f.peerLabel)
  for (const f of FRAMEWORKS) {
    if (f.single !== undefined) p99Against(f, f.single, '`batch: false` (a script call per request, the path before batching)')
  }
  const alone = (name, pick) => lua[name] === undefined ? undefined : median(lua[name].map(pick))
  const usSeed = alone('seed', (x) => x.usPerDecision)
  const usIncr = alone('frl', (x) => x.usPerDecision)
  for (const w of workloads) {
    if (!ran(w.id, 'tollgate-exact') || !ran(w.id, 'frl-redis')) continue
    const mine = med(w.id, 'tollgate-exact', (x) => x.redisUsPerReq)
    const incr = med(w.id, 'frl-redis', (x) => x.redisUsPerReq)
    out.push(`- ${w.id}: Redis µs per decision, tollgate exact ${fixed(mine, 2)} (${fixed(med(w.id, 'tollgate-exact', (x) => x.callsPerReq), 3)} script calls per request) ` +
      `against @fastify/rate-limit's fixed-window INCR script ${fixed(incr, 2)}: ${fixed(mine / incr, 2)}× (${verdict(mine / incr, 1)} the target <= 1); ` +
      `against the design note's script alone ${fixed(mine / usSeed, 2)}× (${verdict(mine / usSeed, 0.65)} the target <= 0.65)`)
  }
  const batched = alone('tollgateBatch', (x) => x.usPerDecision)
  if (batched !== undefined) {
    const seedSpread = roundRange((lua.tollgateBatch ?? []).map((x, i) => x.usPerDecision / lua.seed?.[i]?.usPerDecision))
    out.push(`- The scripts alone, Redis µs per decision: tollgate batched ${fixed(batched, 2)}, one decision a call ${fixed(alone('tollgate', (x) => x.usPerDecision), 2)}, ` +
      `the fixed-window INCR script ${fixed(usIncr, 2)} (batched / INCR ${fixed(batched / usIncr, 2)}, ${verdict(batched / usIncr, 1)} the target <= 1), ` +
      `the design note's script ${fixed(usSeed, 2)} (batched / design note ${fixed(batched / usSeed, 2)}${seedSpread}, ${verdict(batched / usSeed, 0.65)} the target <= 0.65)`)
  }
  if (workloads.some((w) => w.id === 'W2')) {
    const calls = med('W2', 'tollgate-cached', (x) => x.callsPerReq)
    const stat = med('W2', 'tollgate-cached', (x) => x.statCallsPerReq)
    const allowed = med('W2', 'tollgate-cached', (x) => x.okPct)
    out.push(`- W2 flood, tollgate with local caches: ${fixed(calls, 3)} Redis calls/req (${verdict(calls, 0.02)}; target <= 0.02; ` +
      `${fixed(stat, 3)} with in-script commands; ${fixed(allowed, 1)}% of requests were admitted, each needing a script call without a lease). ` +
      `Added CPU/req over bare vs @fastify/rate-limit in-process: ${fixed(ratioOver('W2', 'tollgate-cached', 'frl-local', 'bare'), 2)}`)
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
      if (w.rate !== undefined) {
        const slow = entry.filter((x) => x.rps < 0.95 * w.rate).map((x) => x.rps.toFixed(0))
        if (slow.length > 0) notes.push(`${w.id} ${c.id}: the paced load reached only ${slow.join(', ')} req/s of ${w.rate}`)
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
