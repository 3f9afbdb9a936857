// Where an Express route is declared: its mount path and route pattern,
// never the URL's spelling of them.
//
// Why not `req.baseUrl`. It is the mount path as this request matched it:
// Express matches mount paths case-insensitively (`/API` reaches
// `app.use('/api', ...)`) and fills their parameters with the client's
// values (`/orgs/acme` for `/orgs/:org`), so a name built from it lets a
// client pick its bucket name: a bucket per spelling, and names without end.
// Express hands a middleware `req.route` (the route object, whose `path` is
// the declared pattern) but not the mount path it was declared under. So
// the mount path is read where Express keeps it:
//
//   - a router's layers: each `app.use(path, router)` or
//     `router.use(path, router)` is a Layer in the parent router's `stack`,
//     whose `handle` is the child router. Express 5 (router 2.x) keeps the
//     declared path on the layer (`rawPath`: a string, a RegExp, or a
//     flattened array). Express 4 keeps only the compiled `regexp` and its
//     `keys` (its `path` and `params` are the last request's values): the
//     declared string is rebuilt from the regexp source and the keys, and
//     kept only if Express 4's own Layer compiles it back to the same regexp
//     (else the regexp itself names it). Either way it is the declaration.
//   - a sub-app mounted with `app.use(path, subApp)`: Express wraps it in a
//     closure, but sets `subApp.mountpath` (the declared path) and
//     `subApp.parent`, and `req.app` is the sub-app while its routes run.
//
// So a route's pattern is found once, by walking `req.app`'s routers to the
// layer that holds `req.route` (prefixed with the sub-app's mount paths up
// to the top app), and kept per route object (and app): every later request
// of the route reads it from a WeakMap. A route reachable at several
// places (a mount path array, a router mounted twice) is one declaration,
// one bucket, named by every path it is declared at, joined with ','
// (as a route with a path array is). A route the walk cannot find (a router
// called from a function, a sub-app mounted with `router.use`) is named by
// its sub-apps' mount paths and its own pattern, and `hidden` is told once.
//
// A middleware mounted outside a route (`app.use('/api', limit)`) is found
// the same way, by the layers whose handle it is: its mount paths.

/** A route pattern, found once per route object and app: `/api/users/:id`. */
export class RoutePatterns {
  readonly #found = new WeakMap<object, WeakMap<object, string>>()
  readonly #hidden: (pattern: string) => void
  readonly #mounts = new WeakMap<object, Route>()

  /** `hidden` is called (once per route) for a route no router walk reaches. */
  constructor (hidden: (pattern: string) => void) {
    this.#hidden = hidden
  }

  /** The declared mount path and route pattern of `route` in `app` (`req.app`, undefined for a router used without an app). */
  of (app: unknown, route: Route): string {
    const key = isApp(app) ? app : NO_APP
    let byRoute = this.#found.get(key)
    if (byRoute === undefined) {
      byRoute = new WeakMap()
      this.#found.set(key, byRoute)
    }
    let pattern = byRoute.get(route)
    if (pattern === undefined) {
      pattern = this.#find(app, route)
      byRoute.set(route, pattern)
    }
    return pattern
  }

  /** The declared mount paths of `handle`, a middleware used outside a route in `app`, each with `/*` (`/api/*`; `/*` on the root). */
  mounts (app: unknown, handle: object): string[] {
    let mount = this.#mounts.get(handle)
    if (mount === undefined) {
      mount = { handle }
      this.#mounts.set(handle, mount)
    }
    return this.of(app, mount).split(',')
  }

  #find (app: unknown, route: Route): string {
    const found: string[] = []
    if (isApp(app)) walk(appLayers(app), route, [''], found, new Set())
    if (found.length === 0) {
      const pattern = join(product(appPrefixes(app), route.handle === undefined ? texts(route.path) : ['/*']))
      this.#hidden(pattern)
      return pattern
    }
    return join(product(appPrefixes(app), found))
  }
}

/**
 * What Express keeps of a route, as its middleware sees it. Express types
 * none of its routers, layers and apps either: they are read one property at
 * a time (`read`, `listAt`), each checked where it is used, so a shape
 * Express 4 and 5 do not share is told apart at run time, not assumed.
 */
export interface Route { path?: unknown, stack?: unknown, handle?: object }

/** The key of routes found without an app (a router used outside of one). */
const NO_APP = {}

/** A property of one of Express's objects; undefined off anything but an object. */
function read (value: unknown, name: string): unknown {
  return value instanceof Object ? Reflect.get(value, name) : undefined
}

/** The objects of an array property (a router's or a route's `stack`, a layer's `keys`); none where there is no array. */
function listAt (value: unknown, name: string): readonly object[] {
  const found = read(value, name)
  return Array.isArray(found) ? found.filter((item): item is object => item instanceof Object) : []
}

/**
 * Collects in `found` the patterns of the layers of `stack` (and of the
 * routers below) that hold `route` (or, for `{ handle }`, that mount that
 * middleware outside a route); `at` are the mount paths so far. A router
 * met again below itself is not followed.
 */
function walk (stack: readonly object[], route: Route, at: readonly string[], found: string[], seen: Set<unknown>): void {
  for (const layer of stack) {
    const held = read(layer, 'route')
    if (held === route) {
      found.push(...product(at, texts(route.path)))
      continue
    }
    const handle = read(layer, 'handle')
    if (held === undefined && route.handle !== undefined && handle === route.handle) {
      found.push(...product(product(at, mountTexts(mountPath(layer))), ['/*']))
      continue
    }
    // A router given as a route's handler (`app.get('/x', router)`) matches
    // below the route's own mount: its routes are at `at`, not under the
    // route's pattern.
    const handles = held === undefined ? [handle] : listAt(held, 'stack').map((l) => read(l, 'handle'))
    for (const child of handles) {
      // A router is a handle with layers (an empty one holds nothing to find).
      const layers = listAt(child, 'stack')
      if (layers.length === 0 || seen.has(child)) continue
      seen.add(child)
      walk(layers, route, held === undefined ? product(at, mountTexts(mountPath(layer))) : at, found, seen)
      seen.delete(child)
    }
  }
}

/** The mount paths of a sub-app up to the top app (`app.use(path, subApp)` keeps them). */
function appPrefixes (app: unknown): string[] {
  const parent = read(app, 'parent')
  if (!isApp(app) || !isApp(parent)) return ['']
  return product(appPrefixes(parent), mountTexts(read(app, 'mountpath')))
}

function isApp (value: unknown): value is object {
  return typeof read(value, 'set') === 'function'
}

/**
 * The layers of an app's own router: Express 5 `app.router`, Express 4
 * `app._router` (there as soon as a route is; its `app.router` throws).
 */
function appLayers (app: object): readonly object[] {
  return listAt('_router' in app ? app._router : read(app, 'router'), 'stack')
}

/** The path a layer of `router.use()` was declared with (see the top of this file). */
function mountPath (layer: object): unknown {
  if ('rawPath' in layer) return layer.rawPath
  const regexp = read(layer, 'regexp')
  // Neither Express 5's layer nor Express 4's: named by what it holds.
  if (!(regexp instanceof RegExp)) return regexp
  if (read(regexp, 'fast_slash') === true) return '/'
  return express4Path(layer, regexp) ?? regexp
}

/**
 * The declared path of an Express 4 mount layer, rebuilt from its regexp
 * (path-to-regexp 0.1's output: `^`, the path, `\/?(?=\/|$)`; an array's
 * entries joined with `|`) and keys; undefined unless Express 4's own Layer
 * (the layer's constructor) compiles it back to the very same regexp.
 */
function express4Path (layer: object, regexp: RegExp): string | string[] | undefined {
  const keys = listAt(layer, 'keys').map((key) => String(read(key, 'name')))
  let k = 0
  const paths: string[] = []
  for (const part of regexp.source.split(/\|(?=\^)/)) {
    const body = /^\^(.*)\\\/\?\(\?=\\\/\|\$\)$/.exec(part)?.[1]
    if (body === undefined) return undefined
    let path = ''
    for (const token of body.matchAll(/\(\?:\\([/.])\(\[\^\/(?:\\\.)?\]\+\?\)\)(\?)?|\(\.\*\)|\\([/.])|\\.|[^\\]/g)) {
      if (token[1] !== undefined) path += `${token[1]}:${String(keys[k++])}${token[2] ?? ''}`
      else if (token[0] === '(.*)') { path += '*'; k++ } else path += token[3] ?? token[0]
    }
    paths.push(path)
  }
  const candidate = paths.length === 1 ? String(paths[0]) : paths
  try {
    const compiled = read(Reflect.construct(layer.constructor, [candidate, { sensitive: !regexp.flags.includes('i'), strict: false, end: false }, Function.prototype]), 'regexp')
    return compiled instanceof RegExp && compiled.source === regexp.source && compiled.flags === regexp.flags ? candidate : undefined
  } catch {
    return undefined
  }
}

/** A declared path as the texts it stands for: a RegExp as written, an array as each of its entries. */
function texts (path: unknown): string[] {
  if (Array.isArray(path)) return path.flatMap(texts)
  return [String(path)]
}

/** A mount path's texts, without the trailing slashes Express does not count (`/` mounts nothing). */
function mountTexts (path: unknown): string[] {
  if (Array.isArray(path)) return path.flatMap(mountTexts)
  return [typeof path === 'string' ? path.replace(/\/+$/, '') : String(path)]
}

function product (heads: readonly string[], tails: readonly string[]): string[] {
  return heads.flatMap((head) => tails.map((tail) => head + tail))
}

function join (patterns: readonly string[]): string {
  return [...new Set(patterns)].join(',')
}
