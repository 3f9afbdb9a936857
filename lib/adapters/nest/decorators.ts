// `@RateLimit()` and `@SkipRateLimit()`: a controller's or a handler's
// limit, kept as Nest metadata (`SetMetadata`), so that plain JavaScript
// applies them as functions: `RateLimit(policy)(proto, name, descriptor)`,
// `RateLimit(policy)(Controller)`.
//
// Precedence. A handler's own decorator replaces its controller's (the two
// are not merged): a skipped controller's handler with its own
// `@RateLimit` is limited, and a handler's `@SkipRateLimit()` opts it out
// of its controller's limit. Either is merged over the module's options as
// a Fastify route's `config.rateLimit` is (lib/adapters/nest/guard.ts).

import { SetMetadata, type CustomDecorator } from '@nestjs/common'
import { Reflector } from '@nestjs/core'
import { optionError } from '../../core/errors.js'
import { isRecord } from '../../core/options.js'
import type { NestPolicy } from './types.js'

/** The metadata key of a controller's or a handler's limit. */
export const RATE_LIMIT = 'tollgate:rateLimit'

/**
 * Limits a controller (each of its handlers) or one handler: a policy
 * merged over the module's options, several (all must pass), or false for
 * none. The value is checked at once; the policy itself at start-up.
 */
export function RateLimit (policy: NestPolicy | readonly NestPolicy[] | false): CustomDecorator<typeof RATE_LIMIT> {
  const fits = policy === false || (isRecord(policy) && !Array.isArray(policy)) || (Array.isArray(policy) && policy.length > 0)
  if (!fits) throw optionError('@RateLimit()', policy, 'a policy, a non-empty array of policies, or false')
  return SetMetadata(RATE_LIMIT, policy)
}

/** Opts a controller or a handler out: `@RateLimit(false)`. */
export function SkipRateLimit (): CustomDecorator<typeof RATE_LIMIT> {
  return RateLimit(false)
}

const reflector = new Reflector()

/** A handler's limit as declared: its own, else its controller's; undefined when neither says. */
export function declared (handler: Function, controller: Function): unknown {
  const own: unknown = reflector.get(RATE_LIMIT, handler)
  return own !== undefined ? own : reflector.get(RATE_LIMIT, controller)
}
