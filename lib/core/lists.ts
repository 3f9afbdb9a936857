// Lists that are never empty, typed so. A decision is asked for one policy
// or more (createLimiter and route compilation refuse an empty list), with
// one bucket per policy, in order: typing those lists as non-empty lets the
// decision paths read their first entry without a cast and keeps the
// "never empty" promise where it is made, at the edge.

/** A list with a first entry. */
export type NonEmpty<T> = readonly [T, ...T[]]

/** Whether `list` has a first entry (narrows it to NonEmpty). */
export function isNonEmpty<T> (list: readonly T[]): list is NonEmpty<T> {
  return list.length > 0
}

/** `list.map(fn)`, still non-empty. */
export function mapNonEmpty<T, U> (list: NonEmpty<T>, fn: (item: T, index: number) => U): NonEmpty<U> {
  const [first, ...rest] = list
  return [fn(first, 0), ...rest.map((item, i) => fn(item, i + 1))]
}
