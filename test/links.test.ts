// The documentation's relative links (README.md and every page under docs/):
// each names a file that exists, and each `#anchor` the slug of a heading
// of the page it points into, as GitHub makes them (test/helpers/links.ts).
// A page moved or a heading renamed fails here, not in a reader's browser.

import { readFileSync, readdirSync } from 'node:fs'
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import t from 'tap'
import { anchors, deadLinks, relativeLinks, slug } from './helpers/links.js'
import { ROOT, docFiles } from './helpers/readme.js'

t.test('every relative link and anchor of the documentation holds', async (t) => {
  const files = docFiles()
  t.ok(files.length > 20 && files.includes('README.md') && files.some((f) => f.startsWith('docs/guides/')) && files.some((f) => f.startsWith('docs/reference/')) && files.some((f) => f.startsWith('docs/design/')),
    `${files.length} pages: the README, guides, reference and design`)
  const links = files.reduce((n, file) => n + relativeLinks(readFileSync(join(ROOT, file), 'utf8')).length, 0)
  t.ok(links > 100, `${links} relative links`)
  t.same(files.flatMap((file) => deadLinks(ROOT, file)), [])
})

t.test('slugs as GitHub makes them', async (t) => {
  t.equal(slug('Express: `tollgate/express`'), 'express-tollgateexpress')
  t.equal(slug('Fewer round trips: denial cache and leases'), 'fewer-round-trips-denial-cache-and-leases')
  t.equal(slug('How it maps onto Express\'s'), 'how-it-maps-onto-expresss')
  t.equal(slug('Migrating from @fastify/rate-limit'), 'migrating-from-fastifyrate-limit')
  t.equal(slug('A curl session (Hono)'), 'a-curl-session-hono')
  t.equal(slug('Programmatic checks: `app.tollgate`'), 'programmatic-checks-apptollgate')
  t.equal(slug('See [the API](api.md) and *more*'), 'see-the-api-and-more')
  t.equal(slug('snake_case and 1.5'), 'snake_case-and-15')
  t.same(anchors('# A\n## Usage\n```sh\n# not a heading\n```\n## Usage\n### Usage\n## B ##'), ['a', 'usage', 'usage-1', 'usage-2', 'b'])
})

t.test('a dead file, a dead anchor and a link out of the repository are each reported with their line', async (t) => {
  const root = await mkdtemp(join(tmpdir(), 'tollgate-links-'))
  t.teardown(() => rm(root, { recursive: true, force: true }))
  const page = async (path: string, text: string): Promise<void> => {
    await mkdir(dirname(join(root, path)), { recursive: true })
    await writeFile(join(root, path), text)
  }
  await page('lib/a.ts', 'export {}\n')
  await page('docs/guides/b.md', '# B\n\n## Twice\n\n## Twice\n')
  await page('README.md', [
    '# Top', '',
    '[fine](docs/guides/b.md#twice-1), [here](#top), [a file](lib/a.ts), [a folder](docs/), [web](https://example.com/x#y)',
    '[gone](docs/guides/c.md)',
    '[no anchor](docs/guides/b.md#twice-2) and [not here](#bottom)',
    '`[in code](nowhere.md)`',
    '```md', '[in a block](nowhere.md)', '```',
    '[up](../outside.md) [line](lib/a.ts#L1)', '',
    '[ref]: docs/guides/missing.md'
  ].join('\n'))
  t.same(deadLinks(root, 'README.md'), [
    'README.md:4: docs/guides/c.md: no such file',
    'README.md:5: docs/guides/b.md#twice-2: no heading of docs/guides/b.md has the anchor #twice-2',
    'README.md:5: #bottom: no heading of README.md has the anchor #bottom',
    'README.md:10: ../outside.md: outside the repository',
    'README.md:10: lib/a.ts#L1: an anchor into a file that is not a .md page',
    'README.md:12: docs/guides/missing.md: no such file'
  ])
  t.same(deadLinks(root, 'docs/guides/b.md'), [], 'a page without links')
})

// Some of tollgate's messages send the reader to "X" in its README (a
// migration table, the proxy settings): the README must have a link whose
// text begins with X, to the page that holds it.
t.test("what tollgate's messages point to in its README is a link there", async (t) => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const pointers = new Set<string>()
  const walk = (dir: string): void => {
    for (const entry of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
      const path = join(dir, entry.name)
      if (entry.isDirectory()) walk(path)
      else if (entry.name.endsWith('.ts')) {
        for (const m of readFileSync(join(ROOT, path), 'utf8').matchAll(/see \\?"([^"\\]+)\\?" in tollgate\\?'s README/g)) pointers.add(m[1] as string)
      }
    }
  }
  walk('lib')
  const texts = [...pointers].flatMap((p) => p.includes('${library}') ? ['@fastify/rate-limit', 'express-rate-limit', 'rate-limiter-flexible', '@nestjs/throttler'].map((l) => p.replace('${library}', l)) : [p])
  t.ok(texts.includes('Behind a proxy') && texts.includes('Migrating from express-rate-limit'), `${texts.length} pointers: ${texts.join('; ')}`)
  const escape = (s: string): string => s.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')
  for (const text of texts) t.match(readme, new RegExp(`\\[${escape(text)}[^\\]]*\\]\\(docs/`), `README: a link "${text}…" into docs/`)
})
