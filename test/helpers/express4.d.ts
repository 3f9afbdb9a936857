// Express 4, installed under the alias `express4` for the tests that run
// against both majors; its API is typed here as Express 5's (the part the
// tests use is the same).
declare module 'express4' {
  import express from 'express'
  export default express
}
