// One listener on the app's client for any number of tollgate's own. Every
// limiter on a client asks to hear of its 'ready' (the start-up wait) and
// its end (the subscriber follows it): an app with a limiter per route
// would otherwise put one listener per limiter on its client, and past
// ten, Node prints a MaxListenersExceededWarning. The client adapter is one
// per client object (lib/store/clients/index.ts), so each event gets one
// listener, attached while someone listens and removed after the last.

/** `attach` puts `call` on the client and returns its removal. */
export function fanOut (attach: (call: () => void) => () => void): (listener: () => void) => () => void {
  const listeners = new Set<{ listener: () => void }>()
  // Set with the first listener, before any removal can be called.
  let detach: () => void
  const call = (): void => {
    for (const entry of [...listeners]) entry.listener()
  }
  return (listener) => {
    // An entry of its own: the same function added twice is called twice, as the client would.
    const entry = { listener }
    if (listeners.size === 0) detach = attach(call)
    listeners.add(entry)
    return () => {
      if (listeners.delete(entry) && listeners.size === 0) detach()
    }
  }
}
