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
import type { Programmatic } from '../../http/instance.js'
import { middlewareInstance } from '../../http/middleware.js'
import { middlewareDialect, registry } from '../../http/registry.js'
import { POLICY_CHECKS } from '../../http/route.js'
import { LOGGER_CHECK, STORE_CHECKS } from '../../http/setup.js'
import type { Decision, Limiter, Reservation } from '../../core/types.js'
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

/** One instance's limit function: `limit(policy)` is the middleware of a handler (lib/http/middleware.ts). */
type Limit = Programmatic<NestProgrammaticPolicy> & ((config?: unknown) => unknown)
type HandlerCheck = ((ctx: NestContext) => unknown) | null

/** The programmatic API and the guard of one app. */
export class TollgateService implements CanActivate {
  readonly limiter: Limiter
  readonly consume: (clientKey: string, policy: NestProgrammaticPolicy, cost?: number) => Promise<Decision>
  readonly peek: (clientKey: string, policy: NestProgrammaticPolicy) => Promise<Decision>
  readonly reserve: (clientKey: string, policy: NestProgrammaticPolicy, cost?: number) => Promise<Reservation>
  readonly settle: (reservation: Reservation, actual: number) => Promise<void>
  readonly reset: (clientKey: string, bucket: string) => Promise<void>
  readonly #limit: Limit
  readonly #global: boolean
  readonly #checks = new WeakMap<Function, HandlerCheck>()
  readonly #discovery: DiscoveryService

  constructor (options: NestOptions, discovery: DiscoveryService) {
    this.#limit = middlewareInstance<NestContext['req'], NestContext, null, boolean, never, NestArgs, NestProgrammaticPolicy>(options, {
      adapter: 'nest',
      checks: OPTION_CHECKS,
      identity,
      limits: (defaults, _log, claim) => registry(defaults, ROUTES, middlewareDialect('nest'), claim),
      hooks: HOOKS
    })
    this.#global = options.global ?? true
    this.#discovery = discovery
    const limit = this.#limit
    this.limiter = limit.limiter
    this.consume = limit.consume
    this.peek = limit.peek
    this.reserve = limit.reserve
    this.settle = limit.settle
    this.reset = limit.reset
  }

  /** The guard: a request of an HTTP route, checked by its handler's limit. */
  canActivate (context: ExecutionContext): boolean | Promise<boolean> {
    if (context.getType() !== 'http') return true
    const check = this.#checkOf(context.getHandler(), context.getClass())
    if (check === null) return true
    const http = context.switchToHttp()
    // The middleware of HOOKS returns what `pass`, `drop` and `send` return: a boolean, or a promise of one.
    return check(nestContext(http.getRequest(), http.getResponse<PlatformResponse>())) as boolean | Promise<boolean>
  }

  /** A handler's check, compiled once: its limit as declared, merged over the options; null when it has none. */
  #checkOf (handler: Function, controller: Function): HandlerCheck {
    let check = this.#checks.get(handler)
    if (check === undefined) {
      const config = declared(handler, controller)
      check = config === false || (config === undefined && !this.#global) ? null : this.#limit(config) as HandlerCheck
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
