// The code blocks of the README and of every page under docs/, as
// test/readme.test.ts and test/package.test.ts compile (and run) them.
//
// Every fenced block tagged ts, typescript, js, javascript or mjs is a
// snippet; other tags (sh, none) are not code. A block is compiled as a
// module of its own (`export {}` is appended), so snippets never see each
// other's names; the names a fragment may use without defining them (`app`,
// route handlers such as `search`) are declared by PRELUDE below. An HTML
// comment on the line before the fence changes what is done with a block:
//
//   <!-- snippet: skip -->                      not compiled (pseudo-code)
//   <!-- snippet: run -->                       a whole program: compiled, then
//                                               run against a real Redis
//                                               (REDIS_URL), must exit 0 by itself
//   <!-- snippet: run; prints: allowed: true --> the same, and its output must
//                                               contain the text after `prints:`
//                                               (several `; prints:` allowed)

import { readFileSync, readdirSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..')
export const README = join(ROOT, 'README.md')

/** The documentation, as paths from the root: README.md, then every .md file under docs/, sorted. */
export function docFiles (): string[] {
  const found: string[] = []
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name)
      if (entry.isDirectory()) walk(path)
      else if (entry.name.endsWith('.md')) found.push(relative(ROOT, path).split('\\').join('/'))
    }
  }
  walk(join(ROOT, 'docs'))
  return ['README.md', ...found.sort()]
}

/** The snippets of every documentation file. */
export function docSnippets (): Snippet[] {
  return docFiles().flatMap((file) => readmeSnippets(readFileSync(join(ROOT, file), 'utf8'), file))
}

const LANGS = new Map([['ts', 'ts'], ['typescript', 'ts'], ['js', 'js'], ['javascript', 'js'], ['mjs', 'js']])

export interface Snippet {
  /** The documentation file it is in, from the root (`README.md`, `docs/guides/login.md`). */
  file: string
  /** 1-based line of the opening fence in that file. */
  line: number
  /** Source file name for the snippet: `readme-<line>.ts` for the README, `docs-guides-login-<line>.ts`, or `.js`. */
  name: string
  lang: 'ts' | 'js'
  code: string
  mode: 'compile' | 'run'
  /** With mode 'run': texts its output must contain. */
  prints: string[]
  /** The nearest heading above the block, for messages. */
  section: string
}

/** Names the README's fragments use without defining them. */
export const PRELUDE = `import type { FastifyInstance, RouteHandlerMethod } from 'fastify'
import 'tollgate'

declare global {
  /** A Fastify app, with tollgate registered where a fragment sets route limits. */
  const app: FastifyInstance
  /** Route handlers the fragments name. */
  const search: RouteHandlerMethod
  const pay: RouteHandlerMethod
  const health: RouteHandlerMethod
  const report: RouteHandlerMethod
  /** A metrics counter, as prom-client's. */
  const deniedCounter: { inc (labels: Record<string, string>): void }
}
export {}
`

/** The snippets of one documentation file's text. */
export function readmeSnippets (text = readFileSync(README, 'utf8'), file = 'README.md'): Snippet[] {
  const base = file === 'README.md' ? 'readme' : file.replace(/\.md$/, '').replace(/[^A-Za-z0-9]+/g, '-')
  const lines = text.split('\n')
  const out: Snippet[] = []
  let section = '(top)'
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] as string
    const heading = /^#{1,6}\s+(.*)$/.exec(line)
    if (heading !== null) section = heading[1] as string
    const open = /^(\s*)(`{3,})\s*([\w-]*)\s*$/.exec(line)
    if (open === null) continue
    const [, indent = '', fence = '```', tag = ''] = open
    const end = lines.findIndex((l, j) => j > i && l.trim() === fence)
    if (end === -1) throw new Error(`${file}:${i + 1}: unclosed code block`)
    const body = lines.slice(i + 1, end).map((l) => l.startsWith(indent) ? l.slice(indent.length) : l.trimStart())
    const lang = LANGS.get(tag.toLowerCase())
    const marker = markerBefore(lines, i, file)
    if (lang !== undefined && marker.mode !== 'skip') {
      const snippet: Snippet = {
        file,
        line: i + 1,
        name: `${base}-${i + 1}.${lang}`,
        lang: lang as 'ts' | 'js',
        code: body.join('\n') + '\nexport {}\n',
        mode: marker.mode,
        prints: marker.prints,
        section
      }
      out.push(snippet)
    }
    i = end
  }
  return out
}

function markerBefore (lines: string[], fence: number, file: string): { mode: 'compile' | 'run' | 'skip', prints: string[] } {
  let j = fence - 1
  while (j >= 0 && (lines[j] as string).trim() === '') j--
  const comment = /^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$/.exec(lines[j] ?? '')
  if (comment === null) return { mode: 'compile', prints: [] }
  const [mode = '', ...rest] = (comment[1] as string).split(';').map((s) => s.trim())
  if (mode !== 'run' && mode !== 'skip') throw new Error(`${file}:${j + 1}: unknown snippet marker "${mode}" (skip or run)`)
  const prints = rest.filter((r) => r.startsWith('prints:')).map((r) => r.slice('prints:'.length).trim())
  return { mode, prints }
}

/** Compiler options of a strict user project, as the README promises to compile under. */
export const STRICT_OPTIONS = {
  target: 'ES2022',
  module: 'NodeNext',
  moduleResolution: 'NodeNext',
  lib: ['ES2023'],
  types: ['node'],
  strict: true,
  exactOptionalPropertyTypes: true,
  noUncheckedIndexedAccess: true,
  noImplicitOverride: true,
  skipLibCheck: false,
  allowJs: true,
  checkJs: true,
  noEmit: true
} as const
