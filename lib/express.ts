// The Express entry (`tollgate/express`): the middleware and its public types.
// The middleware itself is lib/adapters/express/middleware.ts.
export * from './adapters/express/middleware.js'
