// `npm run demo:fleet` (examples/fleet/demo.js, built: it runs dist/ as the
// README's examples do): npm runs the script in the package's folder and
// sets INIT_CWD to the folder the user ran npm from; the chart is written
// and named for that folder. One app server for one second on a Redis of
// the test's own.

import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import t from 'tap'
import { startRedisServer } from './helpers/redis.js'

const sh = promisify(execFile)
const ROOT = fileURLToPath(new URL('..', import.meta.url))

t.test('`npm run demo:fleet` writes and names its chart for the folder npm was run from (INIT_CWD), not the package\'s', async (t) => {
  const redis = await startRedisServer()
  t.teardown(() => redis.stop())
  const userDir = await mkdtemp(join(tmpdir(), 'tollgate-demo-'))
  t.teardown(() => rm(userDir, { recursive: true, force: true }))
  // npm runs the script in the package's folder and sets INIT_CWD to the user's.
  const demo = async (...args: string[]): Promise<string> => {
    const { stdout } = await sh(process.execPath, [join(ROOT, 'examples', 'fleet', 'demo.js'), '--servers', '1', '--seconds', '1', ...args], {
      cwd: ROOT, env: { ...process.env, REDIS_URL: redis.url, INIT_CWD: userDir }, timeout: 60_000
    })
    return stdout.split('\n').find((line) => line.trim().startsWith('chart ')) ?? ''
  }
  t.equal(await demo('--svg', 'fleet.svg'), '  chart      fleet.svg', 'a relative --svg: written in the user\'s folder, named from there')
  t.match(readFileSync(join(userDir, 'fleet.svg'), 'utf8'), /^<svg /)
  const line = await demo()
  const path = line.replace(/^\s*chart\s+/, '')
  t.ok(path.startsWith('/') && path.endsWith('.svg'), `the default, in the temp dir, by its absolute path: ${line}`)
  t.match(readFileSync(path, 'utf8'), /^<svg /)
  await rm(path)
})
