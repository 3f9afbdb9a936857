// Promises about the code's shape, checked from the sources with
// TypeScript's own parser (nothing of lib/ is loaded):
//
// - lib/ asserts types at most MAX_CASTS times (`x as T`, `<T>x`; `as
//   const` is no assertion): types say what a value is, a cast only claims
//   it, and a claim nothing checks is where a change of shape goes unseen.
// - No test wires a double through `as unknown as`: a fake store, client or
//   framework object implements the interface it stands for, so a change of
//   the interface breaks the test's build instead of passing it by.
//
// The counter is shown able to fail on a made-up source first.

import { readFileSync, readdirSync } from 'node:fs'
import { join, relative } from 'node:path'
import t from 'tap'
import ts from 'typescript'
import { ROOT } from './helpers/readme.js'

/** The most type assertions lib/ may hold (101 when this was first counted, 31 after). */
const MAX_CASTS = 45

function sources (dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return sources(path)
    return entry.name.endsWith('.ts') ? [path] : []
  })
}

/** The type assertions of one source, `as const` excepted; `doubled`: those of the form `as unknown as T`. */
function assertions (name: string, text: string): { casts: number, doubled: number } {
  const file = ts.createSourceFile(name, text, ts.ScriptTarget.Latest, true)
  let casts = 0
  let doubled = 0
  const visit = (node: ts.Node): void => {
    if ((ts.isAsExpression(node) || ts.isTypeAssertionExpression(node)) && node.type.getText(file) !== 'const') {
      casts++
      const inner = node.expression
      if (ts.isAsExpression(inner) && inner.type.kind === ts.SyntaxKind.UnknownKeyword) doubled++
    }
    ts.forEachChild(node, visit)
  }
  visit(file)
  return { casts, doubled }
}

t.test('assertions are counted as the compiler parses them', async (t) => {
  const sample = 'const a = x as Policy\nconst b = <Policy>y\nconst c = [1] as const\nconst d = z as unknown as Store\n// w as Comment\nconst e = "q as R"'
  t.same(assertions('sample.ts', sample), { casts: 4, doubled: 1 }, 'as, angle brackets and a double cast; not as const, comments or strings')
})

t.test(`lib/ holds at most ${MAX_CASTS} type assertions`, async (t) => {
  const per = sources(join(ROOT, 'lib')).map((path) => ({ path: relative(ROOT, path), ...assertions(path, readFileSync(path, 'utf8')) }))
  const total = per.reduce((n, f) => n + f.casts, 0)
  const most = per.filter((f) => f.casts > 0).sort((a, b) => b.casts - a.casts).slice(0, 5).map((f) => `${f.path} ${f.casts}`)
  t.comment(`${total} type assertions in lib/; most in ${most.join(', ')}`)
  t.ok(per.length > 50, `${per.length} sources read`)
  t.ok(total <= MAX_CASTS, `${total} <= ${MAX_CASTS}`)
  t.same(per.filter((f) => f.doubled > 0).map((f) => f.path), [], 'no `as unknown as` in lib/')
})

t.test('no test wires a double through `as unknown as`', async (t) => {
  const files = sources(join(ROOT, 'test')).filter((path) => !path.endsWith('structure.test.ts'))
  const doubled = files.map((path) => ({ path: relative(ROOT, path), ...assertions(path, readFileSync(path, 'utf8')) })).filter((f) => f.doubled > 0)
  t.ok(files.length > 100, `${files.length} test sources read`)
  t.same(doubled.map((f) => `${f.path}: ${f.doubled}`), [])
})
