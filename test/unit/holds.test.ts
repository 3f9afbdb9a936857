// What a request holds after its decision (lib/http/holds.ts): each hold
// runs once, in order, when the request ends; a failing one is reported
// and the others still run. And the Node response's end, told once.

import { once } from 'node:events'
import { createServer, request, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import { ended, hold, holding, whenEnded, type End, type EndKind } from '../../lib/http/holds.js'

t.test('nothing held: no list, and ending it runs nothing', async (t) => {
  const request = {}
  t.equal(holding(request), false)
  const failed: unknown[] = []
  await ended(request, { how: 'finished', response: undefined }, (err) => { failed.push(err) })
  t.same(failed, [])
})

t.test('each hold runs once, in the order attached, with the end; a second end runs none', async (t) => {
  const request = {}
  const runs: string[] = []
  const response = { status: 200 }
  hold(request, (end: End) => { runs.push(`a ${end.how} ${end.response === response}`) })
  hold(request, async (end: End) => {
    await new Promise((resolve) => setTimeout(resolve, 10))
    runs.push(`b ${end.how}`)
  })
  hold(request, (end: End) => { runs.push(`c ${end.how}`) })
  t.equal(holding(request), true)
  await ended(request, { how: 'gone', response }, () => { runs.push('failed') })
  t.same(runs, ['a gone true', 'b gone', 'c gone'], 'in order, each awaited')
  t.equal(holding(request), false, 'the list is taken off the request')
  await ended(request, { how: 'finished', response }, () => { runs.push('failed') })
  t.same(runs, ['a gone true', 'b gone', 'c gone'], 'never twice')
})

t.test('a hold that throws or rejects is reported; the others still run', async (t) => {
  const request = {}
  const runs: string[] = []
  const failed: unknown[] = []
  hold(request, () => { throw new Error('thrown') })
  hold(request, async () => { throw new Error('rejected') })
  hold(request, () => { runs.push('last') })
  await ended(request, { how: 'finished', response: undefined }, (err) => { failed.push(err) })
  t.same(failed.map((e) => (e as Error).message), ['thrown', 'rejected'])
  t.same(runs, ['last'])
})

/** A server whose responses are handed to `take`; `ends` collects what whenEnded told. */
async function server (t: Test, take: (res: ServerResponse) => void): Promise<AddressInfo> {
  const s = createServer((_req, res) => { take(res) })
  s.listen(0, '127.0.0.1')
  await once(s, 'listening')
  t.teardown(() => new Promise<void>((resolve) => { s.closeAllConnections(); s.close(() => resolve()) }))
  return s.address() as AddressInfo
}

t.test('a Node response: finished once sent, gone when closed first, at once when either is so already', async (t) => {
  const ends: string[] = []
  const tell = (name: string) => (how: EndKind): void => { ends.push(`${name} ${how}`) }
  const at = await server(t, (res) => {
    const path = res.req.url ?? ''
    if (path === '/sent') {
      whenEnded(res, tell('sent'))
      res.end('ok', () => { whenEnded(res, tell('after')) })
    }
    if (path === '/left') {
      whenEnded(res, tell('left'))
      res.once('close', () => { whenEnded(res, tell('closed')) })
    }
  })
  await new Promise<void>((resolve) => { request({ host: at.address, port: at.port, path: '/sent' }, (res) => { res.resume(); res.on('end', resolve) }).end() })
  const left = request({ host: at.address, port: at.port, path: '/left' })
  left.on('error', () => {})
  left.end()
  await new Promise((resolve) => setTimeout(resolve, 100))
  left.destroy()
  await new Promise((resolve) => setTimeout(resolve, 100))
  // Each told once (res.end's callback may run before the 'finish' event).
  t.same([...ends].sort(), ['after finished', 'closed gone', 'left gone', 'sent finished'])
})
