// What this machine charges a process for waking up. One process (the
// echo, pinned like the benchmark's app server) answers one byte at a time
// over a Unix socket; the other (pinned like the load generator) sends each
// byte after waiting `gap` µs, spinning, so the echo sleeps that long
// between messages. The echo's CPU per message, for each gap: its work is
// the same at every gap, so what grows with the gap is the cost of going
// to sleep and being woken, which the process's CPU time includes. On a
// virtual machine, a core that went idle is woken through the hypervisor,
// and the longer it slept, the more its waking costs.
//
// bench/run.mjs's CPU per request includes this: at 1 request in flight,
// an app server sleeps twice per request (for the request, for Redis's
// answer), and a configuration whose Redis call takes longer sleeps
// longer, whatever its own code costs. bench/busy.mjs reads the app
// server's own work from its CPU profile instead.
//
//   node bench/wake.mjs            gaps 0,10,30,100,300,1000 µs; 20 000 messages each

import { fork } from 'node:child_process'
import { rmSync } from 'node:fs'
import net from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { APP_CPU, LOAD_CPU, pin, pinning } from './pin.mjs'

const MESSAGES = Number(process.env.BENCH_WAKE_MESSAGES ?? 20_000)
const GAPS = (process.env.BENCH_WAKE_GAPS ?? '0,10,30,100,300,1000').split(',').map(Number)

if (process.argv[2] === 'echo') {
  // The echo: answers each byte; on 'measure' (IPC) reports its CPU over the next `n` bytes.
  const server = net.createServer((socket) => {
    socket.setNoDelay(true)
    let left = 0
    let start
    process.on('message', ({ n }) => {
      left = n
      start = process.cpuUsage()
      process.send({ type: 'armed' })
    })
    socket.on('data', (data) => {
      socket.write(data)
      if (left > 0 && (left -= data.length) <= 0) {
        const cpu = process.cpuUsage(start)
        process.send({ type: 'cpu', us: cpu.user + cpu.system })
      }
    })
  })
  server.listen(process.argv[3], () => { process.send({ type: 'ready' }) })
} else {
  const path = join(tmpdir(), `tollgate-wake-${process.pid}.sock`)
  const cpus = pinning()
  const echo = fork(new URL(import.meta.url).pathname, ['echo', path], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  pin(cpus, echo.pid, APP_CPU)
  pin(cpus, process.pid, LOAD_CPU)
  const next = (type) => new Promise((resolve) => {
    const listener = (message) => {
      if (message.type !== type) return
      echo.off('message', listener)
      resolve(message)
    }
    echo.on('message', listener)
  })
  await next('ready')
  const socket = net.connect(path)
  socket.setNoDelay(true)
  await new Promise((resolve) => socket.once('connect', resolve))
  let answered
  socket.on('data', () => { answered() })
  const one = () => new Promise((resolve) => {
    answered = resolve
    socket.write('x')
  })
  const spin = (us) => {
    const until = performance.now() + us / 1000
    while (performance.now() < until);
  }
  const rows = []
  // A first pass at gap 0 warms both processes up; it is not reported.
  for (const gap of [0, ...GAPS]) {
    echo.send({ n: MESSAGES })
    await next('armed')
    const measured = next('cpu')
    for (let i = 0; i < MESSAGES; i++) {
      spin(gap)
      await one()
    }
    rows.push({ gap, us: (await measured).us / MESSAGES })
  }
  rows.shift()
  socket.destroy()
  echo.kill()
  rmSync(path, { force: true })
  console.log(`Node ${process.version}; the echo ${cpus.on ? `on CPU ${APP_CPU}, the sender on CPU ${LOAD_CPU}` : `and the sender not pinned (${cpus.why})`}; ${MESSAGES} messages per gap.\n`)
  console.log('| gap before each message, µs | echo CPU per message, µs | more than at the smallest gap, µs |')
  console.log('| ---: | ---: | ---: |')
  for (const { gap, us } of rows) console.log(`| ${gap} | ${us.toFixed(1)} | ${(us - rows[0].us).toFixed(1)} |`)
}
