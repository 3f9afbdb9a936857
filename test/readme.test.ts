// The documentation's code, so it cannot drift from the code: every ts/js
// block of README.md and of every page under docs/ is compiled as its own
// module under a strict user's settings (strict, exactOptionalPropertyTypes,
// noUncheckedIndexedAccess, skipLibCheck false) with `tollgate` resolved to
// lib/, and the blocks marked as whole programs are run against a real Redis
// and must exit by themselves. The markers are described in
// test/helpers/readme.ts and in docs/design/testing.md.
// test/package.test.ts compiles the same blocks against the packed package.
// The curl sessions of the Fastify, Express, Hono and Nest guides are replayed
// against the examples (built, from dist/) and must print what the guides
// show. test/links.test.ts checks the documentation's links.

import { execFile, fork, spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { mkdir, rm, writeFile } from 'node:fs/promises'
import { join, relative } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import ts from 'typescript'
import { PRELUDE, ROOT, STRICT_OPTIONS, docFiles, docSnippets, readmeSnippets, type Snippet } from './helpers/readme.js'
import { freePort, redisCommand, startRedisServer } from './helpers/redis.js'

// Type-checking Fastify's and ioredis's types takes seconds on a busy machine:
// 78 s and 75 s for the two checks below, beside the package test and another
// file on 2 loaded cores, where 180 s in all was too little.
t.setTimeout(420_000)

const RUN_TIMEOUT_MS = 20_000
const DIR = join(ROOT, 'test', 'readme')
const PRELUDE_FILE = join(DIR, 'readme-prelude.ts')

function describe (d: ts.Diagnostic, snippets: Map<string, Snippet>): string {
  const text = ts.flattenDiagnosticMessageText(d.messageText, '\n')
  if (d.file === undefined || d.start === undefined) return text
  const { line } = d.file.getLineAndCharacterOfPosition(d.start)
  const snippet = snippets.get(d.file.fileName)
  if (snippet === undefined) return `${relative(ROOT, d.file.fileName)}:${line + 1}: ${text}`
  return `${snippet.file}:${snippet.line + 1 + line} (${snippet.section}): ${text}`
}

/** Diagnostics of the snippet files, compiled in memory next to the tests so packages resolve as in the repo. */
function compileSnippets (snippets: readonly Snippet[]): string[] {
  const converted = ts.convertCompilerOptionsFromJson(STRICT_OPTIONS, ROOT)
  const options: ts.CompilerOptions = { ...converted.options, paths: { tollgate: [join(ROOT, 'lib', 'index.ts')], 'tollgate/express': [join(ROOT, 'lib', 'express.ts')], 'tollgate/hono': [join(ROOT, 'lib', 'hono.ts')] } }
  const files = new Map<string, string>([[PRELUDE_FILE, PRELUDE]])
  const byFile = new Map<string, Snippet>()
  for (const snippet of snippets) {
    const file = join(DIR, snippet.name)
    files.set(file, snippet.code)
    byFile.set(file, snippet)
  }
  const base = ts.createCompilerHost(options)
  const host: ts.CompilerHost = {
    ...base,
    fileExists: (name) => files.has(name) || base.fileExists(name),
    getSourceFile: (name, version, onError, create) => {
      const text = files.get(name)
      if (text !== undefined) return ts.createSourceFile(name, text, version, true)
      return base.getSourceFile(name, version, onError, create)
    }
  }
  const program = ts.createProgram({ rootNames: [...files.keys()], options, host })
  // lib/ is compiled here as source under settings stricter than its own;
  // only the snippets are under test (the packed .d.ts files are checked
  // under these settings by test/package.test.ts).
  return ts.getPreEmitDiagnostics(program)
    .filter((d) => d.file === undefined || files.has(d.file.fileName))
    .map((d) => describe(d, byFile))
}

/** Runs a whole-program snippet from source; resolves with its exit code and output. */
async function runSnippet (snippet: Snippet, url: string): Promise<{ code: number | null, output: string }> {
  const dir = join(ROOT, 'tmp', `readme-run-${process.pid}`)
  await mkdir(dir, { recursive: true })
  const file = join(dir, snippet.name)
  const lib = relative(dir, join(ROOT, 'lib', 'index.js')).split('\\').join('/')
  const express = relative(dir, join(ROOT, 'lib', 'express.js')).split('\\').join('/')
  const hono = relative(dir, join(ROOT, 'lib', 'hono.js')).split('\\').join('/')
  await writeFile(file, snippet.code.replace(/from 'tollgate'/g, `from '${lib}'`).replace(/from 'tollgate\/express'/g, `from '${express}'`).replace(/from 'tollgate\/hono'/g, `from '${hono}'`))
  try {
    return await new Promise((resolve) => {
      const child = fork(file, { execArgv: process.execArgv, env: { ...process.env, REDIS_URL: url }, stdio: 'pipe' })
      let output = ''
      child.stdout?.on('data', (chunk: Buffer) => { output += chunk.toString() })
      child.stderr?.on('data', (chunk: Buffer) => { output += chunk.toString() })
      const timer = setTimeout(() => {
        output += `\n(killed: still running after ${RUN_TIMEOUT_MS} ms)`
        child.kill('SIGKILL')
      }, RUN_TIMEOUT_MS)
      child.on('exit', (code) => {
        clearTimeout(timer)
        resolve({ code, output })
      })
    })
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
}

const snippets = docSnippets()

t.test('the documentation has code to check', async (t) => {
  t.ok(snippets.length >= 30, `${snippets.length} blocks`)
  const files = new Set(snippets.map((s) => s.file))
  t.ok(files.has('README.md'), 'the README\'s quick starts')
  for (const dir of ['docs/guides/', 'docs/reference/']) t.ok([...files].some((f) => f.startsWith(dir)), `pages under ${dir}`)
  // Every page with a ts/js block is read: a page the walk missed would
  // leave its blocks unchecked.
  const fenced = docFiles().filter((f) => /^\s*`{3,}\s*(ts|typescript|js|javascript|mjs)\s*$/m.test(readFileSync(join(ROOT, f), 'utf8')))
  t.same(fenced.filter((f) => !files.has(f)), [], `${fenced.length} pages with code, each with blocks checked`)
  t.equal(new Set(snippets.map((s) => s.name)).size, snippets.length, 'each block compiles as a file of its own')
  const run = snippets.filter((s) => s.mode === 'run')
  t.ok(run.length >= 10, `${run.length} whole programs are run`)
})

t.test('every ts/js block of the documentation compiles under strict settings', async (t) => {
  t.same(compileSnippets(snippets), [])
})

t.test('a mistake in a block is reported with its page and line', async (t) => {
  const code = "import tollgate from 'tollgate'\n\nawait app.register(tollgate, { failureMode: 'opne' })\nexport {}\n"
  const broken: Snippet = { file: 'docs/guides/broken.md', line: 10, name: 'docs-guides-broken-10.ts', lang: 'ts', mode: 'compile', prints: [], section: 'Broken', code }
  const errors = compileSnippets([broken])
  t.equal(errors.length, 1, 'one error', { errors })
  t.match(errors[0], /^docs\/guides\/broken\.md:13 \(Broken\): [\s\S]*"opne"/)
  const inReadme = compileSnippets([{ ...broken, file: 'README.md', name: 'readme-10.ts' }])
  t.match(inReadme[0], /^README\.md:13 \(Broken\): /)
})

t.test('whole programs run against a real Redis and exit by themselves', async (t) => {
  // A private server, emptied before each program, as a reader's would be:
  // two programs of the guides spend from one bucket (the Express and the
  // Hono shutdown, `GET /report` for 127.0.0.1, 1 token refilled in 10 s),
  // and the second, run within 10 s of the first, waited for its token.
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const url = server.url
  for (const snippet of snippets.filter((s) => s.mode === 'run')) {
    await redisCommand(server, ['FLUSHALL'])
    const { code, output } = await runSnippet(snippet, url)
    t.equal(code, 0, `${snippet.file}:${snippet.line} (${snippet.section}) exits 0`, { output })
    for (const text of snippet.prints) t.ok(output.includes(text), `its output contains ${JSON.stringify(text)}`, { output })
  }
})

t.test('markers', async (t) => {
  const text = [
    '# A', '```ts', 'const a = 1', '```',
    '<!-- snippet: skip -->', '```js', 'nonsense(', '```',
    '## B', '<!-- snippet: run; prints: hello; prints: world -->', '', '```typescript', "console.log('hello')", '```',
    '- item', '  ```js', '  const b = 2', '  ```',
    '```sh', 'npm test', '```', '```', 'plain', '```'
  ].join('\n')
  const found = readmeSnippets(text)
  t.same(found.map((s) => [s.file, s.name]), [['README.md', 'readme-2.ts'], ['README.md', 'readme-12.ts'], ['README.md', 'readme-16.js']])
  t.same(readmeSnippets(text, 'docs/guides/a-b.md').map((s) => s.name), ['docs-guides-a-b-2.ts', 'docs-guides-a-b-12.ts', 'docs-guides-a-b-16.js'], 'a page\'s blocks are named after its path')
  t.same(found.map((s) => [s.line, s.lang, s.mode, s.prints, s.section]), [
    [2, 'ts', 'compile', [], 'A'],
    [12, 'ts', 'run', ['hello', 'world'], 'B'],
    [16, 'js', 'compile', [], 'B']
  ])
  t.equal(found[2]?.code, 'const b = 2\nexport {}\n', 'indented blocks lose their indent')
  t.throws(() => readmeSnippets('<!-- snippet: maybe -->\n```ts\nx\n```'), /unknown snippet marker "maybe"/)
  t.throws(() => readmeSnippets('```ts\nx\n'), /^README\.md:1: unclosed code block/)
  t.throws(() => readmeSnippets('\n<!-- snippet: maybe -->\n```ts\nx\n```', 'docs/guides/x.md'), /^docs\/guides\/x\.md:2: unknown snippet marker/)
})

/** A curl session of a guide: its commands, what each printed, and the header lines it cuts to `…`. */
interface Session { commands: string[], printed: string[][], cut: string[], pasted: string[] | undefined }

/** The session under `heading` of the page `file`: its output block (lines `$ command`, then what it printed), and the sh block before it, if any. */
function curlSession (file: string, heading: string, text = readFileSync(join(ROOT, file), 'utf8')): Session {
  const start = text.indexOf(`${heading}\n`)
  if (start === -1) throw new Error(`${file}: no heading ${heading}`)
  const next = text.slice(start + heading.length).search(/\n#{2,3} /)
  const section = text.slice(start, next === -1 ? undefined : start + heading.length + next)
  const blocks = [...section.matchAll(/```(\w*)\n([\s\S]*?)\n```/g)]
  const output = blocks.find((b) => b[1] === '' && (b[2] as string).startsWith('$ '))
  if (output === undefined) throw new Error(`${file}: no session output under ${heading}`)
  const before = section.slice(0, output.index).trimEnd()
  const cut = [...(before.slice(before.lastIndexOf('\n\n')).match(/the (`[\w-]+`(,\s+|\s+and\s+)?)+ lines/)?.[0] ?? '').matchAll(/`([\w-]+)`/g)].map((m) => m[1] as string)
  const commands: string[] = []
  const printed: string[][] = []
  for (const line of (output[2] as string).split('\n')) {
    if (line.startsWith('$ ')) {
      commands.push(line.slice(2))
      printed.push([])
    } else {
      printed[printed.length - 1]?.push(line)
    }
  }
  const sh = blocks.find((b) => b[1] === 'sh' && (b[2] as string).includes('curl'))
  return { commands, printed, cut, pasted: sh === undefined ? undefined : (sh[2] as string).split('\n') }
}

/** What a command printed, as the guide shows it: line ends without \r, each run of cut header lines as one `…`. */
function asShown (stdout: string, cut: readonly string[]): string[] {
  const lines = stdout.replace(/\r\n/g, '\n').replace(/\n$/, '').split('\n')
  const shown: string[] = []
  for (const line of lines) {
    const isCut = cut.some((name) => line.toLowerCase().startsWith(`${name.toLowerCase()}: `))
    if (!isCut) shown.push(line)
    else if (shown[shown.length - 1] !== '…') shown.push('…')
  }
  return stdout === '' ? [] : shown
}

const sh = promisify(execFile)

/** Starts an example on a free port, on the in-process store, waits until it answers, and returns its port and how to stop it. */
async function startExample (file: string): Promise<{ port: number, stop: () => Promise<void> }> {
  const port = await freePort()
  const env: NodeJS.ProcessEnv = { ...process.env, PORT: String(port) }
  delete env.REDIS_URL
  const child = spawn(process.execPath, [join(ROOT, file)], { cwd: ROOT, env, stdio: 'ignore' })
  const exited = new Promise<void>((resolve) => child.once('exit', () => { resolve() }))
  const stop = async (): Promise<void> => {
    child.kill('SIGTERM')
    await exited
  }
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/health`)).ok) return { port, stop }
    } catch {}
    if (i >= 200 || child.exitCode !== null) {
      await stop()
      throw new Error(`${file} did not answer on port ${port}`)
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

// The session's numbers hold while the six requests before its `sleep 3`
// take under 1 s together (curl takes milliseconds; only a machine over a
// hundred times slower fails it), as the Fastify guide says. The examples run on
// the in-process store: on Redis, a reply later than their 10 ms deadline
// (a loaded machine) is decided by their local fallback, whose smaller
// bucket then shows in the headers. That is the failure mode at work, not
// the guide's output; the in-process store decides as the script does
// (test/model.test.ts holds them to one model).
const SESSIONS: Array<[string, string, string]> = [
  ['docs/guides/fastify.md', '## A curl session', 'examples/app.js'],
  ['docs/guides/express.md', '## A curl session (Express)', 'examples/express.js'],
  ['docs/guides/hono.md', '## A curl session (Hono)', 'examples/hono.js'],
  ['docs/guides/nest.md', '## A curl session (Nest)', 'examples/nest.js']
]

t.test('the curl sessions print what the guides show', async (t) => {
  for (const [page, heading, file] of SESSIONS) {
    const session = curlSession(page, heading)
    t.ok(session.commands.length >= 5 && session.cut.length >= 3, `${heading}: ${session.commands.length} commands, cutting ${session.cut.join(', ')}`)
    if (session.pasted !== undefined) t.same(session.pasted, session.commands, `${heading}: the block to paste is the session's`)
    t.ok(session.commands.every((c) => !c.startsWith('curl') || c.startsWith('curl -s')), `${heading}: curl runs with -s`)
    const example = await startExample(file)
    try {
      for (const [i, command] of session.commands.entries()) {
        const { stdout } = await sh('bash', ['-c', command.replaceAll('127.0.0.1:3000', `127.0.0.1:${example.port}`)])
        t.same(asShown(stdout, session.cut), session.printed[i], `${heading}, ${file}: $ ${command}`)
      }
    } finally {
      await example.stop()
    }
  }
})

t.test('a session is read from its section of a guide', async (t) => {
  const text = [
    '## A curl session', 'Paste this:', '```sh', 'curl -si http://127.0.0.1:3000/a', '```', '',
    'What it printed (the `Date` and `Keep-Alive` lines cut to `…`):', '', '```', '$ curl -si http://127.0.0.1:3000/a', 'HTTP/1.1 200 OK', '…', '', 'ok', '```',
    '## Next'
  ].join('\n')
  t.same(curlSession('docs/guides/x.md', '## A curl session', text), {
    commands: ['curl -si http://127.0.0.1:3000/a'],
    printed: [['HTTP/1.1 200 OK', '…', '', 'ok']],
    cut: ['Date', 'Keep-Alive'],
    pasted: ['curl -si http://127.0.0.1:3000/a']
  })
  t.same(asShown('HTTP/1.1 200 OK\r\nDate: x\r\nkeep-alive: y\r\nA: b\r\n\r\nok\n', ['Date', 'Keep-Alive']), ['HTTP/1.1 200 OK', '…', 'A: b', '', 'ok'])
  t.same(asShown('', ['Date']), [], 'a command that prints nothing')
})
