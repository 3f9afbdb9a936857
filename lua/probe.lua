-- tollgate's start-up probe: which of the commands the other scripts run
-- does this server refuse inside a script?
--
-- A Redis can run scripts and still refuse a command inside them: an ACL
-- user granted @read @write @scripting but not TIME (which is only in
-- @fast), or +@all -time; a read-only scripting user (no PSETEX, no DEL);
-- a read-only replica (READONLY on the first write). Every decision then
-- fails, and before Redis 7.2 the error does not name the command. This
-- script runs each command once under redis.pcall, which returns the
-- refusal instead of aborting, so start-up can name every refused command
-- and its fix in one line (lib/store/redis-store.ts warm, after its peek).
--
-- KEYS[1]  a key of no bucket (`<prefix>:warm`): read; then, only when it
--          does not exist (so the probe never overwrites anything), written
--          with a 1 ms TTL (PSETEX as the buckets are, SET NX as the key
--          secret is) and deleted, then made a sorted set as the slots are
--          (1 ms TTL) and emptied: nothing is left behind.
-- ARGV     none.
--
-- Returns a flat array: for each command that failed, its name, then the
-- error Redis gave (the caller decides which errors are refusals). An empty
-- array: every command ran.
--
-- It must try every command lua/*.lua runs (test/unit/refusals.test.ts checks).

local key = KEYS[1]
local failed = {}
local function try (...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err ~= nil then
    failed[#failed + 1] = (...)
    failed[#failed + 1] = reply.err
  end
  return reply
end

try('TIME')
try('GET', key)
try('TYPE', key)
try('ZCARD', key)
try('ZSCORE', key, 'probe')
try('ZRANGEBYSCORE', key, 0, 0)
if try('PTTL', key) == -2 then
  try('PSETEX', key, 1, 0)
  try('SET', key, 0, 'PX', 1, 'NX')
  try('DEL', key)
  -- The slot commands (lua/concurrency*.lua) on a sorted set that expires
  -- in 1 ms before its one member is removed: nothing is left behind.
  try('ZADD', key, 0, 'probe')
  try('PEXPIRE', key, 1)
  try('ZREMRANGEBYSCORE', key, 0, 0)
  try('ZREM', key, 'probe')
end
return failed
