// tap coverage map: given a test file path relative to the repo root, return
// the globs of the files its coverage counts for, or null for none.
// Every test counts toward lib/; the test helpers' own self-test, the
// documentation's link check and the check of the sources' shape load no
// library code, so they contribute nothing.
export default function coverageMap (testFile) {
  if (testFile === 'test/helpers.test.ts' || testFile === 'test/links.test.ts' || testFile === 'test/structure.test.ts') return null
  return ['lib/**/*.ts']
}
