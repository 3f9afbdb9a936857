// The published declarations: one file per entry of package.json `exports`,
// plus the types the entries share, bundled from what tsc emits into
// dist/.types (which the build then removes), so dist/ shows the public API
// and nothing of lib/'s internal modules.
//
// fastify is an optional peer: an Express project need not install it, yet
// may import a type from `tollgate`. A declaration file that imports a
// package which is not installed fails to compile under skipLibCheck false,
// so each line of the bundle that names 'fastify' is preceded by a
// @ts-ignore: without fastify, those types are `any`; with it, the comment
// has nothing to ignore. (test/package.test.ts compiles both projects.)
import { dts } from 'rollup-plugin-dts'

const OPTIONAL = /(from|module) 'fastify'/

function optionalFastify () {
  return {
    name: 'optional-fastify',
    renderChunk (code) {
      return code.split('\n').map((line) => OPTIONAL.test(line)
        ? `// @ts-ignore fastify is an optional peer dependency\n${line}`
        : line).join('\n')
    }
  }
}

/** The shared declarations by wing: the core's types, and what the middleware adapters share. */
function chunkOf (id) {
  if (/\/\.types\/(core|store)\//.test(id)) return 'types'
  if (/\/\.types\/http\//.test(id)) return 'http'
  return undefined
}

export default {
  input: { index: 'dist/.types/index.d.ts', express: 'dist/.types/express.d.ts', hono: 'dist/.types/hono.d.ts', nest: 'dist/.types/nest.d.ts' },
  output: { dir: 'dist', format: 'es', entryFileNames: '[name].d.ts', chunkFileNames: '[name].d.ts', manualChunks: chunkOf, minifyInternalExports: false },
  plugins: [dts(), optionalFastify()]
}
