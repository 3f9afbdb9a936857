// The clients are known by their shape: tollgate imports none of their
// packages (each is an optional peer), so a client's fields, options and
// errors are read as unknown values and checked where they are used.

/** `value[name]` of any value, as unknown: a value that is no object is boxed (null and undefined read as `{}`). */
export function prop (value: unknown, name: string): unknown {
  return Reflect.get(Object(value), name)
}
