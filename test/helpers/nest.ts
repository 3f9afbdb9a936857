// Nest apps for the tests, on either platform, with the decorators applied
// as functions (tests run with Node's type stripping, which has no
// decorator transform): one controller of the given routes, each with its
// own `@RateLimit` when it names a policy, the app's TollgateModule, and
// optionally exception filters. Nest's own logger is off.

import 'reflect-metadata'
import { Catch, Controller, Get, Header, Module, Post, Req, type ArgumentsHost, type DynamicModule, type ExceptionFilter, type INestApplication } from '@nestjs/common'
import { NestFactory } from '@nestjs/core'
import { FastifyAdapter } from '@nestjs/platform-fastify'
import { RateLimit, RateLimitException, type NestPolicy, type NestRequest } from '../../lib/nest.js'

export type Platform = 'express' | 'fastify'
export const PLATFORMS: readonly Platform[] = ['express', 'fastify']

/** The platform's request as a handler reads it: its own fields and the decision. */
export type TestRequest = NestRequest & { url: string }

export interface NestRoute {
  path: string
  method?: 'get' | 'post'
  /** The handler's `@RateLimit` argument; none when undefined. */
  policy?: NestPolicy | NestPolicy[] | false | undefined
  /** What the handler returns (sent as JSON text). */
  answer (req: TestRequest): unknown
}

const JSON_TYPE = 'application/json; charset=utf-8'

/** Applies a method decorator to `proto[name]` as a decorator build would. */
export function onMethod (proto: object, name: string, ...decorators: MethodDecorator[]): void {
  for (const decorate of decorators) decorate(proto, name, Object.getOwnPropertyDescriptor(proto, name) as PropertyDescriptor)
}

/** A controller class at `prefix` with the given routes; `policy`: the controller's own `@RateLimit`. */
export function controller (prefix: string, routes: readonly NestRoute[], policy?: NestPolicy | false): new () => object {
  class Routes {}
  const proto = Routes.prototype
  routes.forEach((route, i) => {
    const name = `route${i}`
    Object.defineProperty(proto, name, { value: async (req: TestRequest) => await route.answer(req), writable: true, configurable: true })
    onMethod(proto, name, (route.method === 'post' ? Post : Get)(route.path), Header('content-type', JSON_TYPE), ...(route.policy === undefined ? [] : [RateLimit(route.policy)]))
    Req()(proto, name, 0)
  })
  Controller(prefix)(Routes)
  if (policy !== undefined) RateLimit(policy)(Routes)
  return Routes
}

/** A filter of RateLimitException: `send(res, status, body)` answers with the platform's response. */
export function rateLimitFilter (answer: (exception: RateLimitException) => object): ExceptionFilter {
  class Filter implements ExceptionFilter {
    catch (exception: RateLimitException, host: ArgumentsHost): void {
      const res = host.switchToHttp().getResponse<{ status (code: number): { send (body: unknown): void } }>()
      res.status(exception.getStatus()).send(JSON.stringify(answer(exception)))
    }
  }
  Catch(RateLimitException)(Filter)
  return new Filter()
}

/** A Nest app of `tollgate` (the TollgateModule) and `controllers`, not yet listening. */
export async function nestApp (platform: Platform, tollgate: DynamicModule, controllers: Array<new (...args: never[]) => object>, filters: ExceptionFilter[] = []): Promise<INestApplication> {
  class AppModule {}
  Module({ imports: [tollgate], controllers })(AppModule)
  const app = platform === 'fastify'
    ? await NestFactory.create(AppModule, new FastifyAdapter(), { logger: false, abortOnError: false })
    : await NestFactory.create(AppModule, { logger: false, abortOnError: false })
  if (filters.length > 0) app.useGlobalFilters(...filters)
  return app
}
