-- tollgate concurrency slots: renews the leases of slots this server holds
-- (lib/core/concurrency.ts), before they end, so a request that runs longer
-- than a lease keeps its slot.
--
-- Only a member that is still there, its lease not ended, is scored again. A slot that was
-- released, or whose lease ended (dropped by lua/concurrency.lua, or taken
-- back after a step of the clock), is never added back: its request would
-- then count twice, once in the slot another request took meanwhile.
--
-- KEYS[1]   a slot set, `<bucket key>!slots`
-- ARGV[1]   the lease, milliseconds
-- ARGV[2..] the ids of the slots to renew
--
-- Returns the number of slots renewed. Why TIME: as lua/concurrency.lua.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = ARGV[1] + 0
local renewed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 then redis.call('PEXPIRE', KEYS[1], lease) end
return renewed
