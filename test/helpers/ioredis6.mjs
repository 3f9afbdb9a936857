// `node --import ./test/helpers/ioredis6.mjs`: every `import ... from 'ioredis'`
// of the process (tests and helpers; lib/ imports ioredis's types only) loads
// ioredis 6 (the `ioredis6` npm alias) instead, so a test file written for
// ioredis 5 runs unchanged against ioredis 6. Used by `npm run test:ioredis6`.
import { register } from 'node:module'

register('data:text/javascript,' + encodeURIComponent(`
export async function resolve (specifier, context, next) {
  const to = specifier === 'ioredis' || specifier.startsWith('ioredis/') ? 'ioredis6' + specifier.slice(7) : specifier
  return next(to, context)
}
`), import.meta.url)
