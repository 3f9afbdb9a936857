// What a client is shown of a decision, apart from the headers' syntax
// (lib/http/headers.ts).
import type { Decision, Policy } from '../core/types.js'

/**
 * What the rate-limit headers show of a decision: shadow policies never
 * show (a client is not told of a limit that does not hold); the top level
 * is already the binding enforced policy's. Without several policies, or
 * without shadow ones among them, the decision itself.
 */
export function shownDecision (decision: Decision, list: readonly Policy[]): Decision {
  const all = decision.policies
  if (all === undefined || !list.some((p) => p.shadow === true)) return decision
  return { ...decision, policies: all.filter((_, i) => list[i]?.shadow !== true) }
}
