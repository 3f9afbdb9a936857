// The package as a user gets it: `npm pack` (its prepack build included) in
// a copy of the checkout, then the tarball installed into a temporary project
// with fastify@5 and the newest ioredis. There:
// - the install prints no peer-dependency warning;
// - the tarball holds a LICENSE, the README with the docs/ pages it links
//   to, no source maps and no `prepare` script;
// - every code block of the README and of the pages under docs/, and a file
//   using the public API, compile under strict, exactOptionalPropertyTypes
//   and skipLibCheck false, and mistyped policies do not (each marked line
//   fails, and only those);
// - with ioredis removed, the published types still compile;
// - CommonJS `require('tollgate')`, `require('tollgate/express')` and
//   `require('tollgate/hono')` work, and the plugin, the Express middleware
//   and the Hono middleware each decide a request on a real Redis through
//   the installed ioredis (with express@5, hono@4 and @hono/node-server@2
//   installed);
// - a Hono project without fastify or express compiles against
//   tollgate/hono; a Nest project on @nestjs/platform-express without
//   fastify compiles against tollgate/nest;
// - `require('tollgate/nest')` works too, and a Nest 12 app (decorators
//   applied as functions, in plain JavaScript) decides a request on Redis;
//   the consumer project installs Nest 12 (common, core, platform-express)
//   beside the tarball with no peer warning;
// - on each current Node LTS line (22 and 24, whatever Node runs this test:
//   their binaries come from the npm registry's `node` package, through
//   npx), a fresh project installs the tarball with no warning at all (no
//   EBADENGINE, no peer warning) and each adapter decides a request.
// It needs the npm registry the first time; later runs install from the npm
// cache (--prefer-offline). Timings of both are in docs/design/testing.md.

import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { cp, mkdir, mkdtemp, readFile, rename, rm, symlink, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import ts from 'typescript'
import { PRELUDE, ROOT, STRICT_OPTIONS, docFiles, docSnippets } from './helpers/readme.js'
import { redisUrl } from './helpers/redis.js'

const run = promisify(execFile)

// npm pack with its build, an install, and three type-checks of Fastify's
// and ioredis's types: tens of seconds on a loaded machine, over 240 s in all
// beside two other test files on 2 loaded cores.
t.setTimeout(480_000)

const MARKER = '// @ts-expect-error'

/** A strict user's use of the public API. */
const USAGE = `import Fastify from 'fastify'
import { Redis } from 'ioredis'
import tollgate, { createLimiter, routePolicy, type Decision, type ProgrammaticPolicy, type RoutePolicy } from 'tollgate'
import express from 'express'
import { rateLimit } from 'tollgate/express'
import { Hono } from 'hono'
import { rateLimit as honoRateLimit, type RateLimitEnv } from 'tollgate/hono'

const app = Fastify()
const redis = new Redis('redis://127.0.0.1:6379', { lazyConnect: true })
await app.register(tollgate, { redis, capacity: 10, refillPerSecond: 1, failureMode: 'open', timeout: undefined })
app.get<{ Params: { id: string } }>('/users/:id', {
  config: { rateLimit: routePolicy<{ Params: { id: string } }>({ key: (request) => request.params.id }) }
}, async (request) => request.params.id)
app.get('/a', { config: { rateLimit: { capacity: 5 } satisfies RoutePolicy } }, async () => 'a')
const login = { bucket: 'login', capacity: 5, failureMode: 'closed' } satisfies ProgrammaticPolicy
const decision: Decision = await app.tollgate.consume('alice', login)
const limiter = createLimiter()
await limiter.close()
const limit = rateLimit({ redis, capacity: 10, refillPerSecond: 1, failureMode: 'open' })
express().get('/x', limit({ capacity: 5 }), (req, res) => { res.json(req.rateLimit?.remaining) })
const honoLimit = honoRateLimit({ redis, capacity: 10, refillPerSecond: 1, failureMode: 'open', trustProxy: 'loopback' })
new Hono<RateLimitEnv>().get('/x', honoLimit({ capacity: 5 }), (c) => c.json({ remaining: c.get('rateLimit')?.remaining }))
export { decision }
`

/** Mistakes the published types must refuse; each marked line is an error. */
const MISTYPED = `import Fastify from 'fastify'
import { Redis } from 'ioredis'
import tollgate, { createLimiter, routePolicy, type Policy, type ProgrammaticPolicy } from 'tollgate'

const app = Fastify()
// @ts-expect-error an option of @fastify/rate-limit
await app.register(tollgate, { max: 5, failureMode: 'open' })
// @ts-expect-error failureMode is required
await app.register(tollgate, { capacity: 5 })
// @ts-expect-error an unknown route option, through routePolicy
app.get('/a', { config: { rateLimit: routePolicy({ max: 5 }) } }, async () => 'a')
// @ts-expect-error not a policy, through routePolicy
app.get('/b', { config: { rateLimit: routePolicy('yes') } }, async () => 'b')
// @ts-expect-error a mistyped field, even in a bare route config
app.get('/c', { config: { rateLimit: { capacity: '5' } } }, async () => 'c')
// @ts-expect-error the route's params have no \`name\`
app.get('/d/:id', { config: { rateLimit: routePolicy<{ Params: { id: string } }>({ key: (request) => request.params.name }) } }, async () => 'd')
// @ts-expect-error a programmatic policy takes no key (the client key is the first argument)
await app.tollgate.consume('alice', { bucket: 'login', key: () => 'x' })
// @ts-expect-error a programmatic cost is a number
await app.tollgate.consume('alice', { bucket: 'login', cost: () => 2 })
// @ts-expect-error not a failure mode
const retry = { bucket: 'login', failureMode: 'retry' } satisfies ProgrammaticPolicy
// @ts-expect-error a core policy needs its failureMode
const partial: Policy = { bucket: 'b', capacity: 1, refillPerSecond: 1 }
// @ts-expect-error nothing of tollgate's is declared on ioredis's client
await new Redis().tollgate_anything()
// @ts-expect-error nor on Fastify's request
app.get('/e', async (request) => request[Symbol.for('tollgate.checked')] === true)
// @ts-expect-error the core limiter's internals are not public
void createLimiter().warm
// @ts-expect-error timeout is a number
createLimiter({ timeout: '10' })
export { retry, partial }
`

/** The published types with ioredis not installed. */
const WITHOUT_IOREDIS = `import Fastify from 'fastify'
import tollgate, { createLimiter, type Decision, type RedisClient } from 'tollgate'

const app = Fastify()
await app.register(tollgate, { capacity: 10, refillPerSecond: 1, failureMode: 'open' })
const limiter = createLimiter()
const decision: Decision = await limiter.consume('k', { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open' })
const client: RedisClient | undefined = undefined
export { decision, client }
`

// An Express project without fastify: everything it needs comes from
// tollgate/express, and none of the files that entry reaches imports fastify;
// the types it imports from \`tollgate\` compile too (the Fastify plugin's
// are then \`any\`), and are the same types.
const EXPRESS_ONLY = `import express from 'express'
import { rateLimit, type Decision, type Policy, type Reservation } from 'tollgate/express'
import type { Decision as RootDecision, Policy as RootPolicy } from 'tollgate'

const limit = rateLimit({ capacity: 10, refillPerSecond: 1, failureMode: 'open' })
const app = express()
app.use(limit)
const policy: Policy = { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open' }
const reservation: Reservation = await limit.reserve('k', { bucket: 'exports' }, 2)
await limit.settle(reservation, 1)
const decision: Decision = await limit.limiter.consume('k', policy)
const rootPolicy: RootPolicy = policy
const rootDecision: RootDecision = decision
const back: Decision = await limit.limiter.consume('k', rootPolicy)
export { app, decision, rootDecision, back }
`

// A Hono project without fastify or express: everything it needs comes
// from tollgate/hono, and none of the files that entry reaches imports
// either.
const HONO_ONLY = `import { Hono } from 'hono'
import { rateLimit, type Decision, type Policy, type RateLimitEnv, type Reservation } from 'tollgate/hono'

const limit = rateLimit({ capacity: 10, refillPerSecond: 1, failureMode: 'open' })
const app = new Hono<RateLimitEnv>()
app.use(limit)
app.get('/x', limit({ capacity: 5 }), (c) => c.json({ remaining: c.get('rateLimit')?.remaining }))
const policy: Policy = { bucket: 'b', capacity: 1, refillPerSecond: 1, failureMode: 'open' }
const reservation: Reservation = await limit.reserve('k', { bucket: 'exports' }, 2)
await limit.settle(reservation, 1)
const decision: Decision = await limit.limiter.consume('k', policy)
export { app, decision }
`

// The smokes prove a decision made by Redis through the installed ioredis:
// their deadline is one a loaded machine does not miss (the default 10 ms
// is, at times, and the limit then fails closed with a 503).

/** Runs the packed plugin with the installed ioredis against a real Redis. */
const SMOKE = `import Fastify from 'fastify'
import { Redis } from 'ioredis'
import tollgate from 'tollgate'

const redis = new Redis(process.env.REDIS_URL)
const app = Fastify()
await app.register(tollgate, { redis, prefix: process.env.PREFIX, capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 2000 })
app.get('/', async (request) => request.rateLimit)
const first = await app.inject('/')
const second = await app.inject('/')
console.log(JSON.stringify({ first: first.statusCode, source: first.json().source, second: second.statusCode }))
await app.close()
await redis.quit()
`

const CJS = `const tollgate = require('tollgate')
if (typeof tollgate.default !== 'function' || typeof tollgate.createLimiter !== 'function' || typeof tollgate.routePolicy !== 'function') {
  throw new Error('require(tollgate) lacks its exports: ' + Object.keys(tollgate).join(', '))
}
const { rateLimit } = require('tollgate/express')
if (typeof rateLimit !== 'function') throw new Error('require(tollgate/express) lacks rateLimit')
if (typeof require('tollgate/hono').rateLimit !== 'function') throw new Error('require(tollgate/hono) lacks rateLimit')
if (typeof require('tollgate/nest').TollgateModule?.forRoot !== 'function') throw new Error('require(tollgate/nest) lacks TollgateModule')
console.log('cjs ok')
`

/** Runs the packed Express middleware with the installed express@5 and ioredis against a real Redis. */
const EXPRESS_SMOKE = `import express from 'express'
import { Redis } from 'ioredis'
import { rateLimit } from 'tollgate/express'

const redis = new Redis(process.env.REDIS_URL)
const limit = rateLimit({ redis, prefix: process.env.PREFIX, capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 2000 })
const app = express()
app.get('/', limit(), (req, res) => { res.json(req.rateLimit) })
const server = app.listen(0, '127.0.0.1', async () => {
  const url = 'http://127.0.0.1:' + server.address().port + '/'
  const first = await fetch(url)
  const second = await fetch(url)
  console.log(JSON.stringify({ first: first.status, source: (await first.json()).source, second: second.status }))
  server.close()
  await limit.close()
  await redis.quit()
})
`
/** Runs the packed Hono middleware with the installed hono@4, @hono/node-server@2 and ioredis against a real Redis. */
const HONO_SMOKE = `import { serve } from '@hono/node-server'
import { Hono } from 'hono'
import { Redis } from 'ioredis'
import { rateLimit } from 'tollgate/hono'

const redis = new Redis(process.env.REDIS_URL)
const limit = rateLimit({ redis, prefix: process.env.PREFIX, capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 2000 })
const app = new Hono()
app.get('/', limit(), (c) => c.json(c.get('rateLimit')))
const server = serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }, async (info) => {
  const url = 'http://127.0.0.1:' + info.port + '/'
  const first = await fetch(url)
  const second = await fetch(url)
  console.log(JSON.stringify({ first: first.status, source: (await first.json()).source, second: second.status }))
  server.close()
  await limit.close()
  await redis.quit()
})
`

/** Runs a packed Nest 12 app (platform-express, decorators as functions) with the installed ioredis against a real Redis. */
const NEST_SMOKE = `import 'reflect-metadata'
import { Controller, Get, Module, Req } from '@nestjs/common'
import { NestFactory } from '@nestjs/core'
import { Redis } from 'ioredis'
import { TollgateModule } from 'tollgate/nest'

const redis = new Redis(process.env.REDIS_URL)
class Items { find (req) { return req.rateLimit } }
Get()(Items.prototype, 'find', Object.getOwnPropertyDescriptor(Items.prototype, 'find'))
Req()(Items.prototype, 'find', 0)
Controller()(Items)
class App {}
Module({
  imports: [TollgateModule.forRoot({ redis, prefix: process.env.PREFIX, capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 2000 })],
  controllers: [Items]
})(App)
const app = await NestFactory.create(App, { logger: false })
await app.listen(0, '127.0.0.1')
const url = (await app.getUrl()) + '/'
const first = await fetch(url)
const second = await fetch(url)
console.log(JSON.stringify({ first: first.status, source: (await first.json()).source, second: second.status }))
await app.close()
await redis.quit()
`

// A Nest project on Express without fastify: tollgate/nest's types name no
// platform's; the decorators as functions, the service and the exception.
const NEST_ONLY = `import { Controller, Get, Module, Req } from '@nestjs/common'
import { NestFactory } from '@nestjs/core'
import { RateLimit, SkipRateLimit, TollgateModule, TollgateService, type Decision, type NestOptions, type RateLimitException } from 'tollgate/nest'

const options: NestOptions = { capacity: 10, refillPerSecond: 1, failureMode: 'open', global: false, key: (req) => String(req.headers['x-user'] ?? req.ip) }
class Items {
  find (req: { rateLimit?: Decision | undefined }): number | undefined { return req.rateLimit?.remaining }
}
const find = Object.getOwnPropertyDescriptor(Items.prototype, 'find') as PropertyDescriptor
Get(':id')(Items.prototype, 'find', find)
RateLimit([{ capacity: 5, refillPerSecond: 1 }, { bucket: 'daily', capacity: 100, refillPerSecond: 100 / 86400 }])(Items.prototype, 'find', find)
Req()(Items.prototype, 'find', 0)
Controller('items')(Items)
SkipRateLimit()(Items)
class App {}
Module({ imports: [TollgateModule.forRoot(options)], controllers: [Items] })(App)
const app = await NestFactory.create(App)
const decision: Decision = await app.get(TollgateService).consume('alice', { bucket: 'login' })
const retry = (e: RateLimitException): number => e.retryAfter
// @ts-expect-error an option of @nestjs/throttler
RateLimit({ ttl: 60000, limit: 10 })
export { decision, retry }
`

/** The Node LTS lines supported and tested (package.json `engines`, the README's "Requirements"). */
const LTS = ['22', '24']

/**
 * The binary of the newest Node `major`.x: the npm registry's `node`
 * package, which npx installs into its cache (node_modules/node/bin/node).
 */
async function nodeBinary (major: string, cwd: string): Promise<string> {
  const env = { ...process.env, npm_config_prefer_offline: 'true' }
  return (await run('npx', ['-y', `node@${major}`, '-p', 'process.execPath'], { cwd, env })).stdout.trim()
}

/** The metrics example (docs/reference/metrics.md) uses these; the versions of the repo's devDependencies. */
const METRICS_PACKAGES = await (async () => {
  const { devDependencies } = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { devDependencies: Record<string, string> }
  return Object.fromEntries(Object.entries(devDependencies).filter(([name]) => name.startsWith('@opentelemetry/')))
})()

/** Nest 12 on Express, for tollgate/nest: the versions of the repo's devDependencies. */
const NEST_PACKAGES = await (async () => {
  const { devDependencies } = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { devDependencies: Record<string, string> }
  return Object.fromEntries(['@nestjs/common', '@nestjs/core', '@nestjs/platform-express', 'reflect-metadata', 'rxjs'].map((name) => [name, devDependencies[name] as string]))
})()

interface Project { dir: string, newest: string, tarball: string, files: string[], installLog: string, seconds: { pack: number, install: number } }

/** Packs a copy of the checkout (so the running suite's dist/ is left alone) and installs it. */
async function setUp (base: string): Promise<Project> {
  const stage = join(base, 'stage')
  await mkdir(stage)
  for (const entry of ['package.json', 'tsconfig.json', 'tsconfig.build.json', 'rollup.config.mjs', 'README.md', 'docs', 'CHANGELOG.md', 'LICENSE', 'lib', 'lua']) {
    if (existsSync(join(ROOT, entry))) await cp(join(ROOT, entry), join(stage, entry), { recursive: true })
  }
  await symlink(join(ROOT, 'node_modules'), join(stage, 'node_modules'), 'dir')
  let started = Date.now()
  const packed = await run('npm', ['pack', '--json', '--pack-destination', base], { cwd: stage, maxBuffer: 16 << 20 })
  const pack = (Date.now() - started) / 1000
  const [info] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('['))) as Array<{ filename: string, files: Array<{ path: string }> }>
  if (info === undefined) throw new Error(`npm pack printed no result: ${packed.stdout}`)

  const dir = join(base, 'consumer')
  await mkdir(join(dir, 'src'), { recursive: true })
  // The newest ioredis, pinned as a project that already has it would.
  // Its declarations (6.1) import redis-errors, which ships no types: under
  // skipLibCheck false every strict project needs @types/redis-errors,
  // tollgate or not (README "Requirements").
  const newest = (await run('npm', ['view', 'ioredis', 'version', '--prefer-offline'], { cwd: dir })).stdout.trim()
  await writeFile(join(dir, 'package.json'), JSON.stringify({
    name: 'consumer',
    private: true,
    type: 'module',
    dependencies: { tollgate: `file:../${info.filename}`, fastify: '^5', express: '^5', '@types/express': '^5', hono: '^4', '@hono/node-server': '^2', ioredis: `^${newest}`, redis: '^6', iovalkey: '^0.4', '@valkey/valkey-glide': '^2', '@types/redis-errors': '^1.2.3', '@types/node': '^22', ...METRICS_PACKAGES, ...NEST_PACKAGES }
  }, null, 2))
  started = Date.now()
  const install = await run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund'], { cwd: dir, maxBuffer: 16 << 20 })
  const seconds = { pack, install: (Date.now() - started) / 1000 }
  return { dir, newest, tarball: join(base, info.filename), files: info.files.map((f) => f.path), installLog: install.stdout + install.stderr, seconds }
}

/** Diagnostics of `files` (name -> text) compiled in the consumer project, by file. */
// hono 4.13's own declarations (its WebSocket helper) name the DOM's
// CloseEvent, which @types/node does not declare as a type: a project that
// checks them (skipLibCheck false) adds "DOM" to `lib`, as README
// "Requirements" says.
function compile (dir: string, files: Record<string, string>): Map<string, ts.Diagnostic[]> {
  const { options } = ts.convertCompilerOptionsFromJson({ ...STRICT_OPTIONS, lib: [...STRICT_OPTIONS.lib, 'DOM'] }, dir)
  const texts = new Map(Object.entries(files).map(([name, text]) => [join(dir, 'src', name), text]))
  const base = ts.createCompilerHost(options)
  const host: ts.CompilerHost = {
    ...base,
    getCurrentDirectory: () => dir,
    fileExists: (name) => texts.has(name) || base.fileExists(name),
    getSourceFile: (name, version, onError, create) => {
      const text = texts.get(name)
      return text === undefined ? base.getSourceFile(name, version, onError, create) : ts.createSourceFile(name, text, version, true)
    }
  }
  const program = ts.createProgram({ rootNames: [...texts.keys()], options, host })
  const byFile = new Map<string, ts.Diagnostic[]>()
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const file = d.file === undefined ? '(global)' : d.file.fileName
    byFile.set(file, [...byFile.get(file) ?? [], d])
  }
  return byFile
}

function describe (d: ts.Diagnostic): string {
  const text = ts.flattenDiagnosticMessageText(d.messageText, '\n')
  if (d.file === undefined || d.start === undefined) return text
  return `${d.file.fileName}:${d.file.getLineAndCharacterOfPosition(d.start).line + 1}: ${text}`
}

const all = (byFile: Map<string, ts.Diagnostic[]>): string[] => [...byFile.values()].flat().map(describe)

const base = await mkdtemp(join(tmpdir(), 'tollgate-package-'))
t.teardown(() => rm(base, { recursive: true, force: true }))
const project = await setUp(base)
t.comment(`npm pack (with its build): ${project.seconds.pack.toFixed(1)} s; npm install: ${project.seconds.install.toFixed(1)} s`)

t.test('the tarball: a LICENSE, the documentation, the built files, no source maps, no prepare script', async (t) => {
  t.ok(project.files.includes('LICENSE'), 'LICENSE')
  t.same(docFiles().filter((f) => !project.files.includes(f)), [], 'the README and every page under docs/ it links to')
  t.ok(project.files.includes('dist/index.js') && project.files.includes('dist/index.d.ts'), 'dist/index.js and .d.ts')
  t.ok(project.files.includes('dist/express.js') && project.files.includes('dist/express.d.ts'), 'dist/express.js and .d.ts')
  t.ok(project.files.includes('dist/hono.js') && project.files.includes('dist/hono.d.ts'), 'dist/hono.js and .d.ts')
  t.ok(project.files.includes('dist/nest.js') && project.files.includes('dist/nest.d.ts'), 'dist/nest.js and .d.ts')
  t.ok(project.files.includes('lua/token-bucket.lua'), 'the scripts')
  t.same(project.files.filter((f) => f.endsWith('.map')), [], 'no source maps (they would point at lib/, which is not shipped)')
  t.same(project.files.filter((f) => f.startsWith('lib/') || f.startsWith('test/')), [], 'no sources or tests')
  t.same(project.files.filter((f) => f.endsWith('.d.ts')).sort(), ['dist/express.d.ts', 'dist/hono.d.ts', 'dist/http.d.ts', 'dist/index.d.ts', 'dist/nest.d.ts', 'dist/types.d.ts'],
    'declarations: one per entry and the types they share (the core\'s, the request layer\'s), none of the internal modules')
  const read = async (name: string): Promise<string> => await readFile(join(project.dir, 'node_modules', 'tollgate', 'dist', `${name}.d.ts`), 'utf8')
  const shared = (await Promise.all(['types', 'http'].map(read))).join('\n')
  t.notMatch(shared, /from '(fastify|express|hono|ioredis)/, 'the shared declarations import no framework and no client')
  const entries = (await Promise.all(['index', 'express', 'hono', 'nest'].map(read))).join('\n')
  t.notMatch(shared + entries, /from '(ioredis|iovalkey|redis|@redis\/[a-z-]+|@valkey\/valkey-glide)'/, 'no declaration imports a Redis client package')
  const exported = [...shared.matchAll(/export (?:type )?\{([^}]*)\}/g)].flatMap((m) => (m[1] as string).split(',').map((name) => name.trim())).filter((name) => name !== '')
  t.ok(exported.length > 10, `${exported.length} shared types`)
  t.same(exported.filter((name) => !new RegExp(`\\b${name}\\b`).test(entries)), [], 'every shared type is one an entry exports or uses')
  t.same(['RedisStore', 'Guard', 'Engine', 'Remote', 'SettleDeps', 'DenialCache'].filter((name) => new RegExp(`\\b(class|interface|type) ${name}\\b`).test(shared + entries)), [], 'no internal class or type is declared')
  const manifest = JSON.parse(await readFile(join(project.dir, 'node_modules', 'tollgate', 'package.json'), 'utf8')) as { scripts?: Record<string, string>, peerDependencies?: Record<string, string> }
  t.equal(manifest.scripts?.prepare, undefined, 'no prepare script runs in users\' installs')
  t.same(Object.keys(manifest.peerDependencies ?? {}).sort(), ['@hono/node-server', '@nestjs/common', '@nestjs/core', '@opentelemetry/api', '@valkey/valkey-glide', 'express', 'fastify', 'hono', 'ioredis', 'iovalkey', 'redis'])
})

t.test('installs next to fastify@5, express@5 and the newest ioredis without a peer warning', async (t) => {
  t.notMatch(project.installLog, /ERESOLVE|peer dep|conflicting peer|invalid peer/i, 'no peer warning', { log: project.installLog })
  const ioredis = JSON.parse(await readFile(join(project.dir, 'node_modules', 'ioredis', 'package.json'), 'utf8')) as { version: string }
  t.equal(ioredis.version, project.newest, `ioredis ${ioredis.version} installed, the newest`)
})

t.test('the documentation and the public API compile under strict settings; mistyped policies do not', async (t) => {
  const snippets = Object.fromEntries(docSnippets().map((s) => [s.name, s.code]))
  const disarmed = MISTYPED.split(MARKER).join('// (disarmed)')
  const byFile = compile(project.dir, { 'readme-prelude.ts': PRELUDE, ...snippets, 'usage.ts': USAGE, 'mistyped.ts': MISTYPED, 'disarmed.ts': disarmed })
  const disarmedFile = join(project.dir, 'src', 'disarmed.ts')
  const failing = byFile.get(disarmedFile) ?? []
  byFile.delete(disarmedFile)
  t.same(all(byFile), [], 'the blocks of the README and docs/, usage.ts, and mistyped.ts with its markers: no diagnostics')

  const marked: number[] = []
  MISTYPED.split('\n').forEach((line, i) => { if (line.startsWith(MARKER)) marked.push(i + 2) })
  const lines = failing.map((d) => (d.file as ts.SourceFile).getLineAndCharacterOfPosition(d.start ?? 0).line + 1)
  t.ok(marked.length >= 14, `${marked.length} mistakes`)
  t.same([...new Set(lines)].sort((a, b) => a - b), marked, 'without the markers, exactly the marked lines fail')
})

t.test('without ioredis installed, the published types compile (skipLibCheck false)', async (t) => {
  const ioredis = join(project.dir, 'node_modules', 'ioredis')
  await rename(ioredis, `${ioredis}.hidden`)
  try {
    t.same(all(compile(project.dir, { 'core.ts': WITHOUT_IOREDIS })), [])
  } finally {
    await rename(`${ioredis}.hidden`, ioredis)
  }
})

t.test('an Express project (or a Nest one on Express) without fastify installed compiles against tollgate/express (tollgate/nest), and its types from tollgate (skipLibCheck false)', async (t) => {
  const fastify = join(project.dir, 'node_modules', 'fastify')
  await rename(fastify, `${fastify}.hidden`)
  try {
    t.same(all(compile(project.dir, { 'express-only.ts': EXPRESS_ONLY, 'nest-only.ts': NEST_ONLY })), [])
    const disarmed = all(compile(project.dir, { 'nest-disarmed.ts': NEST_ONLY.split(MARKER).join('// (disarmed)') }))
    t.equal(disarmed.length, 1, 'without its marker, one diagnostic')
    t.match(disarmed, [/nest-disarmed\.ts:\d+: .*'ttl' does not exist/], "@nestjs/throttler's ttl")
  } finally {
    await rename(`${fastify}.hidden`, fastify)
  }
})

t.test('a Hono project without fastify or express installed compiles against tollgate/hono (skipLibCheck false)', async (t) => {
  const hidden = ['fastify', 'express', '@types/express'].map((name) => join(project.dir, 'node_modules', name))
  for (const dir of hidden) await rename(dir, `${dir}.hidden`)
  try {
    t.same(all(compile(project.dir, { 'hono-only.ts': HONO_ONLY })), [])
  } finally {
    for (const dir of hidden) await rename(`${dir}.hidden`, dir)
  }
})

t.test('require() from CommonJS, and a request decided on Redis through the installed ioredis, on every adapter', async (t) => {
  await writeFile(join(project.dir, 'cjs.cjs'), CJS)
  t.equal((await run('node', ['cjs.cjs'], { cwd: project.dir })).stdout.trim(), 'cjs ok')
  await writeFile(join(project.dir, 'smoke.mjs'), SMOKE)
  const env = { ...process.env, REDIS_URL: await redisUrl(t), PREFIX: `package-${process.pid}-${Date.now()}` }
  const { stdout } = await run('node', ['smoke.mjs'], { cwd: project.dir, env })
  t.same(JSON.parse(stdout), { first: 200, source: 'store', second: 429 })
  await writeFile(join(project.dir, 'express-smoke.mjs'), EXPRESS_SMOKE)
  const viaExpress = await run('node', ['express-smoke.mjs'], { cwd: project.dir, env: { ...env, PREFIX: `${env.PREFIX}-express` } })
  t.same(JSON.parse(viaExpress.stdout), { first: 200, source: 'store', second: 429 }, 'tollgate/express')
  await writeFile(join(project.dir, 'hono-smoke.mjs'), HONO_SMOKE)
  const viaHono = await run('node', ['hono-smoke.mjs'], { cwd: project.dir, env: { ...env, PREFIX: `${env.PREFIX}-hono` } })
  t.same(JSON.parse(viaHono.stdout), { first: 200, source: 'store', second: 429 }, 'tollgate/hono')
  await writeFile(join(project.dir, 'nest-smoke.mjs'), NEST_SMOKE)
  const viaNest = await run('node', ['nest-smoke.mjs'], { cwd: project.dir, env: { ...env, PREFIX: `${env.PREFIX}-nest` } })
  t.same(JSON.parse(viaNest.stdout), { first: 200, source: 'store', second: 429 }, 'tollgate/nest, a Nest 12 app on Express')
})

/**
 * A Fastify and an Express request through the installed package with each
 * Redis client family the project installed, from its own package name
 * (CLIENT: ioredis, redis, iovalkey, glide).
 */
const CLIENT_SMOKE = `import Fastify from 'fastify'
import express from 'express'
import tollgate from 'tollgate'
import { rateLimit } from 'tollgate/express'

const url = process.env.REDIS_URL
async function connect () {
  switch (process.env.CLIENT) {
    case 'ioredis': { const { Redis } = await import('ioredis'); const c = new Redis(url); return { redis: c, end: () => c.quit() } }
    case 'iovalkey': { const { Redis } = await import('iovalkey'); const c = new Redis(url); return { redis: c, end: () => c.quit() } }
    case 'redis': { const { createClient } = await import('redis'); const c = createClient({ url }); await c.connect(); return { redis: c, end: () => c.close() } }
    case 'glide': {
      const { GlideClient } = await import('@valkey/valkey-glide')
      const { hostname, port } = new URL(url)
      const c = await GlideClient.createClient({ addresses: [{ host: hostname, port: Number(port) }], requestTimeout: 2000 })
      return { redis: c, end: () => c.close() }
    }
  }
  throw new Error('no client ' + process.env.CLIENT)
}
const { redis, end } = await connect()
const options = { redis, capacity: 1, refillPerSecond: 0.001, failureMode: 'closed', timeout: 2000 }
const app = Fastify()
await app.register(tollgate, { ...options, prefix: process.env.PREFIX + '-fastify' })
app.get('/', async (request) => request.rateLimit)
const f1 = await app.inject('/')
const f2 = await app.inject('/')
await app.close()
const limit = rateLimit({ ...options, prefix: process.env.PREFIX + '-express' })
const ex = express()
ex.get('/', limit(), (req, res) => { res.json(req.rateLimit) })
const server = ex.listen(0, '127.0.0.1')
await new Promise((resolve) => server.once('listening', resolve))
const at = 'http://127.0.0.1:' + server.address().port + '/'
const e1 = await fetch(at)
const e2 = await fetch(at)
const out = { fastify: [f1.statusCode, f1.json().source, f2.statusCode], express: [e1.status, (await e1.json()).source, e2.status] }
server.close()
await limit.close()
await end()
console.log(JSON.stringify(out))
`

t.test('each Redis client family, installed beside the tarball: a Fastify and an Express request decided on Redis', async (t) => {
  await writeFile(join(project.dir, 'client-smoke.mjs'), CLIENT_SMOKE)
  const url = await redisUrl(t)
  for (const client of ['ioredis', 'redis', 'iovalkey', 'glide']) {
    const env = { ...process.env, REDIS_URL: url, CLIENT: client, PREFIX: `package-${client}-${process.pid}-${Date.now()}` }
    const { stdout } = await run('node', ['client-smoke.mjs'], { cwd: project.dir, env })
    t.same(JSON.parse(stdout.trim().split('\n').pop() ?? ''), { fastify: [200, 'store', 429], express: [200, 'store', 429] }, client)
  }
})

t.test('on Node 22 and 24: a fresh project installs the tarball with no warning, and each adapter decides a request', async (t) => {
  const url = await redisUrl(t)
  for (const major of LTS) {
    const node = await nodeBinary(major, base)
    t.match((await run(node, ['-p', 'process.version'])).stdout, new RegExp(`^v${major}\\.`), `a Node ${major} binary: ${node}`)
    const dir = join(base, `node${major}`)
    await mkdir(dir)
    await writeFile(join(dir, 'package.json'), JSON.stringify({
      name: `node${major}`,
      private: true,
      type: 'module',
      dependencies: { tollgate: `file:${project.tarball}`, fastify: '^5', express: '^5', hono: '^4', '@hono/node-server': '^2', ioredis: `^${project.newest}` }
    }, null, 2))
    // npm runs on the first `node` of PATH: this one, so its engine checks are that Node's.
    const env = { ...process.env, PATH: `${dirname(node)}${delimiter}${process.env.PATH ?? ''}`, REDIS_URL: url }
    const install = await run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund'], { cwd: dir, env, maxBuffer: 16 << 20 })
    const log = install.stdout + install.stderr
    t.notMatch(log, /warn|EBADENGINE|ERESOLVE|peer/i, `Node ${major}: npm install prints no warning`, { log })
    await writeFile(join(dir, 'smoke.mjs'), SMOKE)
    await writeFile(join(dir, 'express-smoke.mjs'), EXPRESS_SMOKE)
    await writeFile(join(dir, 'hono-smoke.mjs'), HONO_SMOKE)
    const prefix = `package-node${major}-${process.pid}-${Date.now()}`
    const fastify = await run(node, ['smoke.mjs'], { cwd: dir, env: { ...env, PREFIX: prefix } })
    t.same(JSON.parse(fastify.stdout), { first: 200, source: 'store', second: 429 }, `Node ${major}: the Fastify plugin`)
    const express = await run(node, ['express-smoke.mjs'], { cwd: dir, env: { ...env, PREFIX: `${prefix}-express` } })
    t.same(JSON.parse(express.stdout), { first: 200, source: 'store', second: 429 }, `Node ${major}: tollgate/express`)
    const hono = await run(node, ['hono-smoke.mjs'], { cwd: dir, env: { ...env, PREFIX: `${prefix}-hono` } })
    t.same(JSON.parse(hono.stdout), { first: 200, source: 'store', second: 429 }, `Node ${major}: tollgate/hono`)
  }
})
