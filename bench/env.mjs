// The benchmarks' settings from the environment: a number > 0, or a
// comma-separated list; an empty or absent variable is the default.

/** `name` as a number > 0, else `fallback`; anything else stops the run. */
export function envNumber (name, fallback) {
  const text = process.env[name]
  if (text === undefined || text === '') return fallback
  const value = Number(text)
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a number > 0, got ${JSON.stringify(text)}`)
  return value
}

/** `name` as a list of trimmed items; undefined when unset. */
export function envList (name) {
  const text = process.env[name]
  return text === undefined || text === '' ? undefined : text.split(',').map((s) => s.trim())
}
