// What a log line says of a value a function of the app computed from a
// request, or threw: its type and a short preview, never the value, and
// never longer than PREVIEW_CHARS (lib/core/errors.ts).

import t from 'tap'
import { PREVIEW_CHARS, clip, preview, thrownPreview } from '../../lib/core/errors.js'

t.test('preview: the type and a short preview of any value', async (t) => {
  const cases: Array<[string, unknown, string]> = [
    ['a short string', 'ann', '"ann"'],
    ['the empty string', '', '""'],
    ['a long string', 'k'.repeat(5000), `a string of 5000 characters ("${'k'.repeat(40)}")`],
    ['a number', 42, '42'],
    ['undefined', undefined, 'undefined'],
    ['null', null, 'null'],
    ['a bigint', 10n ** 200n, `${'1' + '0'.repeat(PREVIEW_CHARS - 4)}...`],
    ['a function', () => 'x', 'a function'],
    ['an array', [1, 2, 3], 'an array of 3 items'],
    ['an object', { id: 1, passwordHash: 'secret' }, 'an object (keys: id, passwordHash)'],
    ['an empty object', {}, 'an object (keys: none)'],
    ['a symbol', Symbol('s'), 'Symbol(s)']
  ]
  for (const [label, value, expected] of cases) t.equal(preview(value), expected, label)
})

t.test('preview: an object is read no further than its first keys, and never by value', async (t) => {
  const wide = Object.fromEntries(Array.from({ length: 100_000 }, (_, i) => [`field${i}`, `secret${i}`]))
  const shown = preview(wide)
  t.ok(shown.length <= PREVIEW_CHARS, `${shown.length} characters`)
  t.match(shown, /^an object \(keys: field0, field1, .*, \.\.\.\)$/)
  t.notMatch(shown, 'secret')
  const long = preview({ ['n'.repeat(1000)]: 1 })
  t.equal(long, `an object (keys: ${'n'.repeat(17)}...)`, 'a long name is cut')
  const trap = new Proxy({}, { ownKeys () { throw new Error('no keys') } })
  t.equal(preview(trap), 'an object (keys: ...)', "a Proxy's trap that throws")
})

t.test('thrownPreview: the error, cut short, and the frame where it was thrown', async (t) => {
  const err = new TypeError("Cannot read properties of undefined (reading 'user')")
  t.match(thrownPreview(err), /^TypeError: Cannot read properties of undefined \(reading 'user'\) \(at .*preview\.test\.ts:\d+:\d+\)?\)$/)
  t.equal(thrownPreview({ message: 'm'.repeat(1000) }), `${'m'.repeat(117)}...`, 'no name, no stack; the message cut')
  t.equal(thrownPreview({ name: 'E', message: 'x', stack: `E: x\n    at ${'f'.repeat(300)} (file.js:1:2)` }), `E: x (...${'f'.repeat(PREVIEW_CHARS - 3 - 14)} (file.js:1:2))`, 'a long frame keeps its end')
  t.equal(thrownPreview({ name: 'E', message: 'x', stack: 'no frames' }), 'E: x')
  t.equal(thrownPreview('a string'), '"a string"', 'a value that is no error: previewed')
  t.equal(thrownPreview({ password: 'p' }), 'an object (keys: password)')
})

t.test('clip', async (t) => {
  t.equal(clip('abc', 5), 'abc')
  t.equal(clip('abcdef', 5), 'ab...')
})
