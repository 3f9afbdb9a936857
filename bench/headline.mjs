// THE headline run: exact mode against the incumbents, on one app server,
// at 1, 8, 32 and 128 requests in flight (W1): Fastify bare,
// @fastify/rate-limit with its Redis store and tollgate exact, and the
// round trip alone at two lengths of Redis time (round-trip and
// round-trip-slow: what Redis's time alone costs the app's CPU on this
// machine); Express 5 bare, express-rate-limit with rate-limit-redis and
// tollgate/express exact; 3 rounds, configurations alternating. bench/run.mjs with these
// settings (any BENCH_* variable set still wins; see its header), the app
// server pinned to one core, the load generator to another and Redis to a
// third, or on 2 cores with the load generator (bench/pin.mjs), on the Node that runs it: 96 cells of 2 s of warm-up
// and 3 s measured, each with its app server started afresh; it prints how
// long it took. Writes bench/RESULTS-headline.md.
//
//   npm run bench:headline                     Node on PATH (24)
//   npm run build && npx -y node@22 bench/headline.mjs
//                                              the same on Node 22
//   BENCH_ROUNDS=1 BENCH_SECONDS=1 npm run bench:headline   smoke run

const HEADLINE = {
  BENCH_CONFIGS: 'bare,frl-redis,tollgate-exact,round-trip,round-trip-slow,express-bare,erl-redis,express-tollgate-exact',
  BENCH_WORKLOADS: 'W1',
  BENCH_LEVELS: '1,8,32,128',
  BENCH_ROUNDS: '3',
  BENCH_SECONDS: '3',
  // W1 is unpaced: 2 s of warm-up is thousands of requests even at one in
  // flight. With the app server's start and stop (1.2 s a cell in a smoke
  // run), 96 cells come to about 9.5 minutes.
  BENCH_WARMUP: '2',
  BENCH_OUT: new URL('./RESULTS-headline.md', import.meta.url).pathname
}
for (const [name, value] of Object.entries(HEADLINE)) process.env[name] ??= value

await import('./run.mjs')
