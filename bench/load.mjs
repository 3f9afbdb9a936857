// Load generation with autocannon: one instance per app server, all at once.
// Latency percentiles and status counts are taken from every response
// (429s included: under a flood most answers are denials, and their latency
// is the one that matters), at autocannon's sub-millisecond timing rather
// than its whole-millisecond histogram.

import autocannon from 'autocannon'

/**
 * @param {object} opts
 * @param {number[]} opts.ports app servers, one autocannon instance each
 * @param {string} [opts.path] default /w
 * @param {number} opts.seconds
 * @param {number} opts.connections per instance
 * @param {number} [opts.rate] requests per second per instance (paced by autocannon); unpaced when absent
 * @param {string} [opts.client] fixed x-client-id
 * @param {number} [opts.clients] cycle x-client-id through c0..c<clients-1> instead
 */
export async function load ({ ports, path = '/w', seconds, connections, rate, client, clients }) {
  const latencies = []
  const statuses = {}
  let errors = 0
  const started = performance.now()
  const runs = ports.map((port) => {
    const options = {
      url: `http://127.0.0.1:${port}${path}`,
      connections: rate === undefined ? connections : Math.min(connections, rate),
      duration: seconds,
      pipelining: 1
    }
    if (rate !== undefined) {
      options.overallRate = rate
      // autocannon's coordinated-omission correction would assume 1 ms between
      // requests (it passes 1/rate to a histogram counting in ms); we record
      // raw latencies ourselves anyway.
      options.ignoreCoordinatedOmission = true
    }
    if (clients !== undefined) {
      let next = 0
      options.requests = [{
        method: 'GET',
        setupRequest: (request) => ({ ...request, headers: { 'x-client-id': `c${next++ % clients}` } })
      }]
    } else if (client !== undefined) {
      options.headers = { 'x-client-id': client }
    }
    const instance = autocannon(options)
    instance.on('response', (_client, statusCode, _bytes, ms) => {
      latencies.push(ms)
      statuses[statusCode] = (statuses[statusCode] ?? 0) + 1
    })
    return new Promise((resolve, reject) => {
      instance.once('done', (result) => {
        errors += result.errors + result.timeouts
        resolve()
      })
      instance.once('error', reject)
    })
  })
  await Promise.all(runs)
  const elapsedS = (performance.now() - started) / 1000
  latencies.sort((a, b) => a - b)
  return {
    responses: latencies.length,
    rps: latencies.length / elapsedS,
    p50: percentile(latencies, 0.5),
    p99: percentile(latencies, 0.99),
    statuses,
    errors
  }
}

function percentile (sorted, q) {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]
}
