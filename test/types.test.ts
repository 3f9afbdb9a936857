// The public types: the fixtures in test/types/ compiled with the project's
// own compiler options. valid-usage.ts must compile clean; invalid-usage.ts
// compiles clean only because each wrong line carries `@ts-expect-error`
// (an unused marker is an error, so a line that stopped failing is caught),
// and with the markers disarmed exactly the marked lines must fail.

import { fileURLToPath } from 'node:url'
import { dirname, join, resolve } from 'node:path'
import t from 'tap'
import ts from 'typescript'

// Type-checking Fastify's types takes seconds to tens of seconds on a busy
// machine: more than tap's default 30 s per file must not fail the test.
t.setTimeout(180_000)

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const VALID = join(root, 'test', 'types', 'valid-usage.ts')
const INVALID = join(root, 'test', 'types', 'invalid-usage.ts')
const MARKER = '// @ts-expect-error'

function compilerOptions (): ts.CompilerOptions {
  const configPath = join(root, 'tsconfig.json')
  const read = ts.readConfigFile(configPath, (path) => ts.sys.readFile(path))
  if (read.error !== undefined) throw new Error(ts.flattenDiagnosticMessageText(read.error.messageText, '\n'))
  const parsed = ts.parseJsonConfigFileContent(read.config, ts.sys, root, undefined, configPath)
  return { ...parsed.options, noEmit: true }
}

/** 1-based line numbers of the lines that follow a marker. */
function markedLines (text: string): number[] {
  const out: number[] = []
  text.split('\n').forEach((line, i) => {
    if (line.trim().startsWith(MARKER)) out.push(i + 2)
  })
  return out
}

function describe (d: ts.Diagnostic): string {
  const text = ts.flattenDiagnosticMessageText(d.messageText, '\n')
  if (d.file === undefined || d.start === undefined) return text
  const { line } = d.file.getLineAndCharacterOfPosition(d.start)
  return `${d.file.fileName}:${line + 1}: ${text}`
}

// Variants of the fixtures, compiled as files next to them (so their imports
// resolve the same way) that exist only in memory:
// - DISARMED: invalid-usage.ts with its markers turned into plain comments,
//   same line count;
// - MARKED: valid-usage.ts with a marker put on a line that compiles, to show
//   the compiler reports an unused marker (which the first check relies on).
const DISARMED = join(root, 'test', 'types', 'invalid-usage.disarmed.ts')
const MARKED = join(root, 'test', 'types', 'valid-usage.marked.ts')
const invalidText = ts.sys.readFile(INVALID) ?? ''
const validText = ts.sys.readFile(VALID) ?? ''
const MARK_TARGET = "  app.get('/health', { config: { rateLimit: false } }, async () => 'ok')"
const virtual = new Map<string, string>([
  [DISARMED, invalidText.split(MARKER).join('// (disarmed)')],
  [MARKED, validText.replace(MARK_TARGET, `  ${MARKER}\n${MARK_TARGET}`)]
])

/**
 * One program for every check: type-checking Fastify's and ioredis's types
 * is most of the cost (seconds), so it is paid once.
 */
function compile (): Map<string, ts.Diagnostic[]> {
  const options = compilerOptions()
  const base = ts.createCompilerHost(options)
  const host: ts.CompilerHost = {
    ...base,
    getSourceFile: (fileName, languageVersion, onError, shouldCreate) => {
      const text = virtual.get(resolve(fileName))
      if (text !== undefined) return ts.createSourceFile(fileName, text, languageVersion, true)
      return base.getSourceFile(fileName, languageVersion, onError, shouldCreate)
    }
  }
  const program = ts.createProgram({ rootNames: [VALID, INVALID, DISARMED, MARKED], options, host })
  const byFile = new Map<string, ts.Diagnostic[]>()
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const file = d.file === undefined ? '(global)' : resolve(d.file.fileName)
    byFile.set(file, [...byFile.get(file) ?? [], d])
  }
  return byFile
}

const diagnostics = compile()
const of = (file: string): ts.Diagnostic[] => diagnostics.get(file) ?? []

t.test('no diagnostics outside the fixtures', async (t) => {
  const others = [...diagnostics].filter(([file]) => ![VALID, INVALID, DISARMED, MARKED].includes(file))
  t.same(others.flatMap(([, list]) => list.map(describe)), [])
})

t.test('both fixtures compile clean (the invalid one thanks to its markers)', async (t) => {
  t.same(of(VALID).map(describe), [], 'valid-usage.ts')
  t.same(of(INVALID).map(describe), [], 'invalid-usage.ts')
})

t.test('with the markers disarmed, exactly the marked lines fail', async (t) => {
  const marked = markedLines(invalidText)
  t.ok(marked.length >= 20, `${marked.length} marked lines`)
  const lines = of(DISARMED).map((d) => (d.file as ts.SourceFile).getLineAndCharacterOfPosition(d.start ?? 0).line + 1)
  t.same([...new Set(lines)].sort((a, b) => a - b), marked, 'errors on every marked line and nowhere else')
  t.equal(lines.length, marked.length, 'one error per marked line')
})

t.test('a marker on a line that compiles is caught', async (t) => {
  t.ok(validText.includes(MARK_TARGET), 'valid-usage.ts still has the line this check marks')
  t.same(of(MARKED).map((d) => d.code), [2578], "TS2578: Unused '@ts-expect-error' directive")
})
