// `node --import ./test/helpers/ts-sources.mjs`: run the TypeScript sources of
// lib/ and test/ directly, as the test runner does (.taprc's node-arg). Node
// strips the types itself (Node 24, and 22.18 or later); what it does not do
// is map the `.js` specifiers of NodeNext sources (`../lib/index.js`) to the
// `.ts` files beside them, since no `.js` file exists there. This hook does
// that and nothing else: a `.js` file that exists still wins, and
// packages under node_modules/ are left to Node.
//
// Registered in-thread (module.registerHooks), so no loader thread is started
// per process; processes forked with `process.execArgv` inherit it.
//
// Without coverage (tap's --disable-coverage, which the unit tier uses), the
// process also keeps V8's compiled code of every module it loads in Node's
// compile cache (under the OS temp dir): tap and its plugins load hundreds of
// modules per test file, about a quarter of the unit tier's time. Not with
// coverage: code from the cache changed the branch counts tap reported for
// the same test, and the 100% gate must not depend on what ran before.
import { existsSync } from 'node:fs'
import { enableCompileCache, registerHooks } from 'node:module'

const relative = /^\.\.?\//

registerHooks({
  resolve (specifier, context, nextResolve) {
    const parent = context.parentURL
    if (parent !== undefined && relative.test(specifier) && specifier.endsWith('.js') &&
        parent.startsWith('file:') && !parent.includes('/node_modules/')) {
      const js = new URL(specifier, parent)
      const ts = new URL(specifier.slice(0, -3) + '.ts', parent)
      if (!existsSync(js) && existsSync(ts)) return nextResolve(ts.href, context)
    }
    return nextResolve(specifier, context)
  }
})

if (process.env._TAPJS_PROCESSINFO_COVERAGE_ === '0') enableCompileCache()
