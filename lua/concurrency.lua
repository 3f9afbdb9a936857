-- tollgate concurrency slots, with the rate buckets of the same request:
-- all or nothing, in one call (lib/core/concurrency.ts, SPEC 13).
--
-- Encoding: the slots of one client and bucket are one sorted set; each
-- member is a random request id, its score the end of its lease in
-- milliseconds of Redis's clock. A member whose lease ended is a slot
-- whose server died (a live server renews its slots before their lease
-- ends: lua/concurrency-renew.lua) and is dropped. The key expires one
-- lease after its last write, so Redis holds keys only for clients with a
-- slot, and at most `max` members each. A rate bucket is the one of
-- lua/token-bucket.lua (read its header for the encoding and the clamp).
--
-- Clock steps: no live member is ever scored more than one lease ahead of
-- now. A larger score means Redis's clock stepped back since it was
-- written; it is scored again at now + lease, so a step back keeps a dead
-- server's slot at most one lease. A step forward ends leases sooner: it
-- frees at most what one lease would, the slots of dead servers with them
-- (a live server's renewal re-adds nothing: see the renewal script).
--
-- KEYS[i]      policy i's key: a rate bucket, or a slot set
--              (`<bucket key>!slots`); all share the client's hash tag, so
--              in Redis Cluster the call runs on one node
-- ARGV[1]      the request's id: its member in every slot set
-- then, for policy i, from a = 4i - 2:
-- ARGV[a]      kind: 'r' a rate bucket, 'c' slots; upper case ('R', 'C')
--              for a shadow policy, which never refuses the request and is
--              taken only if the request is allowed and every shadow policy
--              has room (as they would all or nothing among themselves)
-- ARGV[a+1]    rate: window, microseconds (lua/token-bucket.lua's); slots: max
-- ARGV[a+2]    rate: need, microseconds; slots: the lease, milliseconds
-- ARGV[a+3]    rate: move, microseconds; slots: unused (0)
--
-- Returns one integer per policy, in KEYS order:
--   rate   as lua/token-bucket.lua: >= 0 microseconds until full, < 0
--          minus the microseconds until its cost is available
--   slots  >= 0: the slots taken after this call (this one's included
--          when it took one); < 0: minus the slots taken, all of them
--          (this request took none)
-- The request is allowed when no enforced (lower-case) value is negative.
--
-- Why TIME: leases end on one clock for the whole fleet, whatever the app
-- servers' clocks say. Scripts replicate their effects (Redis 5+).

local t = redis.call('TIME')
local nowUs = t[1] * 1000000 + t[2]
local nowMs = math.floor(nowUs / 1000)
local id = ARGV[1]

local out = {}
-- ok[false]: every enforced policy can be taken; ok[true]: every shadow one.
local ok = { [false] = true, [true] = true }
for i = 1, #KEYS do
  local a = 4 * i - 2
  local kind = ARGV[a]
  local shadow = kind == 'R' or kind == 'C'
  local key = KEYS[i]
  if kind == 'c' or kind == 'C' then
    local lease = ARGV[a + 2] + 0
    redis.call('ZREMRANGEBYSCORE', key, '-inf', nowMs)
    local ahead = redis.call('ZRANGEBYSCORE', key, '(' .. (nowMs + lease), '+inf')
    for _, member in ipairs(ahead) do
      redis.call('ZADD', key, 'XX', nowMs + lease, member)
    end
    local taken = redis.call('ZCARD', key)
    if taken >= ARGV[a + 1] + 0 then
      ok[shadow] = false
      out[i] = -taken
    else
      out[i] = taken
    end
  else
    local held = redis.call('GET', key)
    local busy = 0
    if held then busy = math.max(0, tonumber(held) - nowUs) end
    busy = math.min(busy, ARGV[a + 1] + 0)
    local over = busy + ARGV[a + 2] - ARGV[a + 1]
    if over > 0 then
      ok[shadow] = false
      out[i] = -math.ceil(over)
    else
      out[i] = busy
    end
  end
end

-- Takes every policy of one side (enforced or shadow).
local function take (side)
  for i = 1, #KEYS do
    local a = 4 * i - 2
    local kind = ARGV[a]
    if (kind == 'R' or kind == 'C') == side then
      local key = KEYS[i]
      if kind == 'c' or kind == 'C' then
        local lease = ARGV[a + 2] + 0
        redis.call('ZADD', key, nowMs + lease, id)
        redis.call('PEXPIRE', key, lease)
        out[i] = out[i] + 1
      else
        local busy = out[i] + ARGV[a + 3]
        busy = math.ceil(busy)
        redis.call('PSETEX', key, math.ceil(busy / 1000) + 1, nowUs + busy)
        out[i] = busy
      end
    end
  end
end

if ok[false] then
  take(false)
  if ok[true] then take(true) end
end
return out
