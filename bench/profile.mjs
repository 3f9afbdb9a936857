// Summarises a V8 .cpuprofile (from `BENCH_CPU_PROF=<dir> npm run bench`):
// the functions with the most self time, over everything and in the files
// under one directory of this checkout (dist/ by default), with their
// inclusive time; in µs per request too when the profile carries the
// window's request count (`benchRequests`).
//
//   node bench/profile.mjs <file.cpuprofile> [top=20] [dir=dist/]

import { readFileSync } from 'node:fs'

const [file, topText = '20', dir = 'dist/'] = process.argv.slice(2)
if (file === undefined) {
  process.stderr.write('usage: node bench/profile.mjs <file.cpuprofile> [top] [dir]\n')
  process.exit(2)
}
const top = Number(topText)
const profile = JSON.parse(readFileSync(file, 'utf8'))

const byId = new Map(profile.nodes.map((n) => [n.id, n]))
const parent = new Map()
for (const n of profile.nodes) for (const child of n.children ?? []) parent.set(child, n.id)

const mine = `file://${process.cwd()}/${dir}`
const ownFiles = new Set()
const name = (n) => {
  const { functionName, url, lineNumber } = n.callFrame
  const where = url === '' ? '' : ` ${url.replace(`file://${process.cwd()}/`, '').replace(/^file:\/\//, '')}:${lineNumber + 1}`
  const label = `${functionName || '(anonymous)'}${where}`
  if (url.startsWith(mine)) ownFiles.add(label)
  return label
}

const self = new Map()
const inclusive = new Map()
let total = 0
for (let i = 0; i < profile.samples.length; i++) {
  const dt = profile.timeDeltas[i] ?? 0
  total += dt
  let id = profile.samples[i]
  const leaf = name(byId.get(id))
  self.set(leaf, (self.get(leaf) ?? 0) + dt)
  const seen = new Set()
  while (id !== undefined) {
    const label = name(byId.get(id))
    if (!seen.has(label)) {
      seen.add(label)
      inclusive.set(label, (inclusive.get(label) ?? 0) + dt)
    }
    id = parent.get(id)
  }
}

const requests = profile.benchRequests
const pct = (us) => (100 * us / total).toFixed(1).padStart(5) + '%'
const perRequest = (us) => requests === undefined ? '' : (us / requests).toFixed(2).padStart(7)
const print = (title, filter) => {
  const heads = requests === undefined ? '  self   incl.' : '  self   incl. self µs/req incl. µs/req'
  process.stdout.write(`\n${title}\n${heads}  function\n`)
  const rows = [...self.entries()].filter(([label]) => filter(label)).sort((a, b) => b[1] - a[1]).slice(0, top)
  for (const [label, us] of rows) {
    const all = inclusive.get(label)
    const cells = requests === undefined ? `${pct(us)} ${pct(all)}` : `${pct(us)} ${pct(all)}     ${perRequest(us)}      ${perRequest(all)}`
    process.stdout.write(`${cells}  ${label}\n`)
  }
}

process.stdout.write(`${file}: ${(total / 1000).toFixed(0)} ms sampled` +
  `${requests === undefined ? '' : `, ${requests} requests, ${perRequest(total - (self.get('(idle)') ?? 0)).trim()} µs/request not idle`}\n`)
print(`top ${top} by self time`, () => true)
print(`top ${top} by self time in ${dir}`, (label) => ownFiles.has(label))
