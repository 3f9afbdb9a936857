// `TollgateModule`: the limiter of one Nest app, as a dynamic module. Its
// options are checked when Nest builds the module (a coded TypeError, as
// every adapter's); its guard (APP_GUARD) checks every route: with
// `global: true` (the default) a route without `@RateLimit` is limited by
// the module's own policy, with `global: false` only decorated routes are.
// Every route's limit is compiled when the app starts (onApplicationBootstrap),
// so a policy that cannot be compiled, or a route of a global module whose
// options are no complete policy, fails the start-up, naming it.
//
// `TollgateService` is the programmatic API (consume, peek, reserve,
// settle, reset, limiter) over the module's options, injectable
// anywhere (the module is global). The start-up wait (lib/http/setup.ts)
// is part of the app's start. At `app.close()`, before Nest closes the HTTP
// server, every wait ends at once (answered as denied, 429) and answers say
// `Connection: close`; the limiter closes, never the app's Redis client.

import { Module, type CanActivate, type DynamicModule, type ExecutionContext, type InjectionToken, type ModuleMetadata, type OptionalFactoryDependency } from '@nestjs/common'
import { APP_GUARD, DiscoveryModule, DiscoveryService, MetadataScanner } from '@nestjs/core'
import { isBoolean, outageSummaryMs, warnings } from '../../core/options.js'
import type { Programmatic, ProgrammaticApi } from '../../http/instance.js'
import { middlewareInstance } from '../../http/middleware.js'
import { middlewareDialect, registry } from '../../http/registry.js'
import { POLICY_CHECKS } from '../../http/route.js'
import { LOGGER_CHECK, STORE_CHECKS } from '../../http/setup.js'
import { declared } from './decorators.js'
import { HOOKS, ROUTES, identity, nestContext, type NestArgs, type NestContext, type PlatformResponse } from './hooks.js'
import type { NestOptions, NestProgrammaticPolicy } from './types.js'

/** The token of the module's options, for a provider that reads them. */
export const TOLLGATE_OPTIONS = 'tollgate:options'

const OPTION_CHECKS = { ...POLICY_CHECKS, ...STORE_CHECKS, global: isBoolean, logger: LOGGER_CHECK, warnings, outageSummaryMs }

/** `forRootAsync()`: the options from a factory of the app's providers. */
export interface NestAsyncOptions extends Pick<ModuleMetadata, 'imports'> {
  useFactory (...args: never[]): NestOptions | Promise<NestOptions>
  inject?: Array<InjectionToken | OptionalFactoryDependency> | undefined
}

/** A handler's check: what HOOKS' `pass`, `drop` and `send` give, a boolean or a promise of one; null when it has no limit. */
type HandlerCheck = ((ctx: NestContext) => boolean | Promise<boolean>) | null
/** One instance's limit function: `limit(policy)` is the middleware of a handler (lib/http/middleware.ts). */
type Limit = Programmatic<NestProgrammaticPolicy> & ((config?: unknown) => HandlerCheck)

/** The programmatic API (consume, peek, reserve, settle, reset, acquire, limiter) over the module's options. */
export interface TollgateService extends ProgrammaticApi<NestProgrammaticPolicy> {}

/** The programmatic API and the guard of one app. */
export class TollgateService implements CanActivate {
  readonly #limit: Limit
  readonly #global: boolean
  readonly #checks = new WeakMap<Function, HandlerCheck>()
  readonly #discovery: DiscoveryService

  constructor (options: NestOptions, discovery: DiscoveryService) {
    const limit = middlewareInstance<NestContext['req'], NestContext, null, boolean, never, NestArgs, NestProgrammaticPolicy>(options, {
      adapter: 'nest',
      checks: OPTION_CHECKS,
      identity,
      limits: (defaults, _log, claim) => registry(defaults, ROUTES, middlewareDialect('nest'), claim),
      hooks: HOOKS
    })
    // `limit(policy)` makes a middleware of HOOKS, whose `wrap` calls it with one context.
    this.#limit = limit as Limit
    this.#global = options.global ?? true
    this.#discovery = discovery
    const { limiter, consume, peek, reserve, settle, reset, acquire } = limit
    Object.assign(this, { limiter, consume, peek, reserve, settle, reset, acquire })
  }

  /** The guard: a request of an HTTP route, checked by its handler's limit. */
  canActivate (context: ExecutionContext): boolean | Promise<boolean> {
    if (context.getType() !== 'http') return true
    const check = this.#checkOf(context.getHandler(), context.getClass())
    if (check === null) return true
    const http = context.switchToHttp()
    return check(nestContext(http.getRequest(), http.getResponse<PlatformResponse>()))
  }

  /** A handler's check, compiled once: its limit as declared, merged over the options; null when it has none. */
  #checkOf (handler: Function, controller: Function): HandlerCheck {
    let check = this.#checks.get(handler)
    if (check === undefined) {
      const config = declared(handler, controller)
      check = config === false || (config === undefined && !this.#global) ? null : this.#limit(config)
      this.#checks.set(handler, check)
    }
    return check
  }

  /** Compiles every route's limit (a mistake fails the start-up), then waits for the store (bounded). */
  async onApplicationBootstrap (): Promise<void> {
    const scanner = new MetadataScanner()
    for (const wrapper of this.#discovery.getControllers()) {
      // A controller's wrapper holds its class; the scanner names the methods of its prototype.
      const controller = wrapper.metatype as Function
      const proto = controller.prototype as Record<string, Function>
      for (const name of scanner.getAllMethodNames(proto)) {
        const handler = proto[name] as Function
        // A route handler carries the path its @Get, @Post... declared; other methods are the class's own.
        if (Reflect.getMetadata('path', handler) !== undefined) this.#checkOf(handler, controller)
      }
    }
    await this.#limit.ready
  }

  /** Ends every wait (429) before Nest closes the server, and closes the limiter. */
  async beforeApplicationShutdown (): Promise<void> {
    await this.#limit.close()
  }
}

/** The module: `TollgateModule.forRoot(options)` or `forRootAsync({ imports, inject, useFactory })`. */
export class TollgateModule {
  static forRoot (options: NestOptions): DynamicModule {
    return TollgateModule.forRootAsync({ useFactory: () => options })
  }

  static forRootAsync (options: NestAsyncOptions): DynamicModule {
    return {
      module: TollgateModule,
      global: true,
      imports: [...(options.imports ?? []), DiscoveryModule],
      providers: [
        { provide: TOLLGATE_OPTIONS, useFactory: options.useFactory, inject: options.inject ?? [] },
        { provide: TollgateService, useFactory: (given: NestOptions, discovery: DiscoveryService) => new TollgateService(given, discovery), inject: [TOLLGATE_OPTIONS, DiscoveryService] },
        { provide: APP_GUARD, useExisting: TollgateService }
      ],
      exports: [TollgateService, TOLLGATE_OPTIONS]
    }
  }
}
Module({})(TollgateModule)
