// How a refusal from inside the scripts is recognised and what its log line
// tells the operator to do (lib/store/errors.ts), on Redis's own wordings:
// 7.0's "can't run this command" and "can't access", 7.2's NOPERM naming the
// command, READONLY from a replica, EVAL_RO's read-only scripts. The real
// servers' answers are in test/acl.test.ts.

import { readdirSync, readFileSync } from 'node:fs'
import t from 'tap'
import { commandRefused, refusalFix, scriptsRefused, SCRIPT_COMMANDS } from '../../lib/store/errors.js'

const SCRIPT = ' script: 3a2373c733770691edb679a8f9bea359ff5f7031, on @user_script:87.'

t.test('commandRefused: every refusal from inside a script, nothing else', async (t) => {
  for (const message of [
    `ERR The user executing the script can't run this command or subcommand${SCRIPT}`,
    `ERR The user executing the script can't access at least one of the keys mentioned in the command arguments${SCRIPT}`,
    `NOPERM User app has no permissions to run the 'time' command${SCRIPT}`,
    'NOPERM this user has no permissions to access one of the keys used as arguments',
    `READONLY You can't write against a read only replica.${SCRIPT}`,
    `ERR Write commands are not allowed from read-only scripts.${SCRIPT}`
  ]) t.equal(commandRefused(new Error(message)), true, message)
  for (const message of ['WRONGTYPE Operation against a key holding the wrong kind of value', 'ERR value is not an integer or out of range', 'LOADING Redis is loading the dataset in memory']) {
    t.equal(commandRefused(new Error(message)), false, message)
  }
  t.equal(commandRefused('NOPERM'), false, 'not an error')
  t.equal(scriptsRefused(new Error(`ERR The user executing the script can't run this command or subcommand${SCRIPT}`)), false, 'the scripts themselves run')
})

t.test('refusalFix: the commands found refused, the one Redis names, or all the scripts run', async (t) => {
  const old = `ERR The user executing the script can't run this command or subcommand${SCRIPT}`
  t.equal(refusalFix(old, ['TIME', 'PSETEX']), "grant +time +psetex to tollgate's Redis user (ACL SETUSER <user> +time +psetex)")
  t.equal(refusalFix(`NOPERM User app has no permissions to run the 'time' command${SCRIPT}`, []), "grant +time to tollgate's Redis user (ACL SETUSER <user> +time)", "7.2 names the command")
  t.equal(refusalFix(old, []), "grant +time +get +type +pttl +psetex +set +del +zadd +zcard +zscore +zrangebyscore +zremrangebyscore +zrem +pexpire to tollgate's Redis user (ACL SETUSER <user> +time +get +type +pttl +psetex +set +del +zadd +zcard +zscore +zrangebyscore +zremrangebyscore +zrem +pexpire)", 'before 7.2 it does not')
  t.equal(refusalFix('NOPERM this user has no permissions to access one of the keys used as arguments', []), "grant this Redis user the keys under tollgate's prefix (~<prefix>:*)")
  t.equal(refusalFix(`READONLY You can't write against a read only replica.${SCRIPT}`, ['PSETEX', 'DEL']), 'the scripts write their buckets, so point the client at a writable primary')
  t.equal(refusalFix(`ERR Write commands are not allowed from read-only scripts.${SCRIPT}`, []), 'the scripts write their buckets, so point the client at a writable primary')
})

t.test('lua/probe.lua tries every command the scripts run, and SCRIPT_COMMANDS names them', async (t) => {
  const dir = new URL('../../lua/', import.meta.url)
  const used = new Set<string>()
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.lua') && f !== 'probe.lua')) {
    for (const m of readFileSync(new URL(file, dir), 'utf8').matchAll(/redis\.p?call\('([A-Z]+)'/g)) used.add(m[1] as string)
  }
  const probe = readFileSync(new URL('probe.lua', dir), 'utf8')
  const tried = new Set([...probe.matchAll(/try\('([A-Z]+)'/g)].map((m) => m[1] as string))
  t.same([...tried].sort(), [...used].sort(), 'the probe tries each command the scripts run')
  t.same([...SCRIPT_COMMANDS].sort(), [...used].sort())
})
