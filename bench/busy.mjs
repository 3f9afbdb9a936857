// The app server's own work per request, from the CPU profiles of a run
// (BENCH_CPU_PROF=<dir>): the time the profiler found the main thread
// running (every sample but `(idle)`, the thread waiting in the event
// loop's poll), divided by the window's requests. Against the process CPU
// time of the report, this leaves out what the kernel charges the process
// for going to sleep and waking up, which on a virtual machine grows with
// every idle period (bench/wake.mjs measures it) and so with how often a
// configuration leaves the app server waiting, not with what it runs.
// Medians over rounds; added over the bare framework; the ratio to the
// incumbent of the same framework.
//
//   BENCH_CPU_PROF=/tmp/prof npm run bench:headline
//   node bench/busy.mjs /tmp/prof

import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { FRAMEWORKS, median } from './report.mjs'

const dir = process.argv[2]
if (dir === undefined) {
  process.stderr.write('usage: node bench/busy.mjs <dir of .cpuprofile files, from BENCH_CPU_PROF>\n')
  process.exit(2)
}

/** µs per request the main thread ran (not idle) in one profile. */
function busyPerRequest (file) {
  const profile = JSON.parse(readFileSync(file, 'utf8'))
  const idle = new Set(profile.nodes.filter((n) => n.callFrame.functionName === '(idle)').map((n) => n.id))
  let busy = 0
  // Each sample stands for the time since the one before it, as
  // bench/profile.mjs counts it.
  for (let i = 0; i < profile.samples.length; i++) {
    if (!idle.has(profile.samples[i])) busy += profile.timeDeltas[i] ?? 0
  }
  return busy / profile.benchRequests
}

const cells = new Map()
for (const name of readdirSync(dir)) {
  const match = /^(.+)-(W\d+(?:-\d+)?)-r\d+-\d+\.cpuprofile$/.exec(name)
  if (match === null) continue
  const [, config, workload] = match
  const key = `${workload.replace('-', '/')}\t${config}`
  cells.set(key, [...(cells.get(key) ?? []), busyPerRequest(join(dir, name))])
}
const busy = (workload, config) => {
  const rounds = cells.get(`${workload}\t${config}`)
  return rounds === undefined ? undefined : median(rounds)
}

const workloads = [...new Set([...cells.keys()].map((key) => key.split('\t')[0]))].sort((a, b) => a.localeCompare(b, 'en', { numeric: true }))

console.log('Main-thread busy time per request, µs (median over rounds); added over bare; ratio to the incumbent\'s added.\n')
console.log('| workload | configuration | busy µs/req | added µs/req | ratio |')
console.log('| --- | --- | ---: | ---: | ---: |')
for (const workload of workloads) {
  for (const { bare, peer: incumbent, exact, single } of FRAMEWORKS) {
    const base = busy(workload, bare)
    if (base === undefined) continue
    const theirs = busy(workload, incumbent)
    for (const config of [bare, incumbent, exact, single]) {
      const value = busy(workload, config)
      if (value === undefined) continue
      const added = config === bare ? undefined : value - base
      const ratio = added !== undefined && theirs !== undefined && config !== incumbent ? `${(added / (theirs - base)).toFixed(2)}×` : ''
      console.log(`| ${workload} | ${config} | ${value.toFixed(1)} | ${added === undefined ? '' : added.toFixed(1)} | ${ratio} |`)
    }
  }
}
