// CPU pinning for the benchmarks: on a machine with 2 cores or more and
// `taskset` (util-linux), the app server(s) run on one core and the load
// generator on another, and Redis on a third when there is one (else with
// the load generator), so that the app's CPU figures are not taken while
// it fights its own load for a core, and the scheduler does not move it
// mid-window. A process's affinity is inherited by what it starts: pin
// this process to the load generator's core before starting Redis, then
// Redis to its own core (redisCpu), and each app server to the app's core
// as it starts.
//
// BENCH_PIN=off turns it off; without taskset or with one core, nothing is
// pinned, and `describe()` says so in the report.

import { execFileSync } from 'node:child_process'
import { availableParallelism } from 'node:os'

/** The app's core and the load generator's (and Redis's, on 2 cores). */
export const APP_CPU = 0
export const LOAD_CPU = 1

/** Redis's core: one of its own on a machine with 3 cores or more, else the load generator's. */
export function redisCpu () {
  return availableParallelism() >= 3 ? 2 : LOAD_CPU
}

function hasTaskset () {
  try {
    execFileSync('taskset', ['--version'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}

/** Whether pinning is on, and why not when it is not. */
export function pinning () {
  if (process.env.BENCH_PIN === 'off') return { on: false, why: 'BENCH_PIN=off' }
  if (availableParallelism() < 2) return { on: false, why: 'one core only' }
  if (!hasTaskset()) return { on: false, why: 'no taskset on PATH' }
  return { on: true }
}

/** Pins every thread of process `pid` to `cpu` (nothing when pinning is off). */
export function pin (state, pid, cpu) {
  if (!state.on) return
  execFileSync('taskset', ['-a', '-p', '-c', String(cpu), String(pid)], { stdio: 'ignore' })
}

/** One line for the report: which process runs on which core (`redis`, when given, placed by redisCpu). */
export function describe (state, app, rest, redis) {
  if (!state.on) return `not pinned (${state.why}): the processes share every core as the scheduler places them`
  if (redis === undefined) return `pinned with taskset: ${app} on CPU ${APP_CPU}; ${rest} on CPU ${LOAD_CPU}`
  if (redisCpu() === LOAD_CPU) return `pinned with taskset: ${app} on CPU ${APP_CPU}; ${rest} and ${redis} on CPU ${LOAD_CPU}`
  return `pinned with taskset: ${app} on CPU ${APP_CPU}; ${rest} on CPU ${LOAD_CPU}; ${redis} on CPU ${redisCpu()}`
}
