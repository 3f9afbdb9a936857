-- tollgate token lease: take a batch of tokens from one bucket in one
-- atomic step, optionally giving back the unspent rest of an earlier lease
-- first. Same encoding as token-bucket.lua: the key holds one integer, the
-- microsecond of Redis's clock at which the bucket is full again
-- (tokens = capacity - max(0, full - now) / T, T = 1e6 / refillPerSecond).
--
-- KEYS[1]   the bucket key
-- ARGV[1]   capacity, tokens (> 0)
-- ARGV[2]   refill, tokens per second (> 0)
-- ARGV[3]   least to take, tokens: the request's cost; 0 takes nothing
--           (a pure give-back)
-- ARGV[4]   most to take, tokens (>= ARGV[3]): the lease size
-- ARGV[5]   tokens given back before taking (>= 0): the usable unspent part
--           of an earlier lease of this caller
-- ARGV[6]   the full-at time, microseconds of Redis's clock, that the call
--           which took that earlier lease left in the key (its reply's
--           [2] + [4]); 0 when nothing is given back
-- ARGV[7]   '1': a peek, deciding as this call would and writing nothing;
--           [3] and [4] are then the bucket after the give-back, before
--           any take (what a consume finds). Absent or '0': the call.
--
-- Returns:
--   [1]  tokens taken, as a string: 0 when the bucket cannot afford the
--        least amount (then nothing is taken), else between least and most
--        (the most that is available, in whole tokens, but never below least)
--   [2]  Redis's clock, microseconds
--   [3]  tokens left in the bucket after this call, as a string
--   [4]  microseconds until the bucket is full again
--   [5]  microseconds until `least` tokens are available; 0 when taken
--   [6]  tokens actually given back, as a string: ARGV[5], less what would
--        overfill the bucket; 0 when the give-back was refused (below)
--
-- Why TIME: as in token-bucket.lua, the clock is Redis's own, so no app
-- server can pass in a clock of its own.
--
-- Why a give-back names its lease: tokens given back are accepted only
-- while the key still holds exactly the full-at time the lease's own call
-- left, that is, while no call has taken from the bucket since (a take
-- always moves the full-at time later, and a give-back never moves it
-- back past where it was before the giver's take, see lib/lease.ts). A
-- lease taken later by another app server bounds its own tokens by the
-- bucket it saw; tokens of an older lease arriving in the bucket after it
-- would let the fleet exceed capacity + refill x w in some window (the
-- proof is in lib/lease.ts). A refused give-back costs under-admission
-- only: those tokens come back by refill.
-- Giving back moves the full-at time back by the tokens, never past now (a
-- bucket holds at most capacity).
--
-- Why the clamp on what is read: a bucket is never further than capacity
-- tokens from full, so busy is at most capacity x T. A larger value means
-- Redis's clock stepped back (an NTP correction, a failover to a replica
-- whose clock is behind); read as it is, it would lock the client out for
-- the size of the step. Clamped, a step costs at most one window
-- (capacity / refill), as in token-bucket.lua.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local capacity = tonumber(ARGV[1])
local step = 1000000 / ARGV[2]
local least = tonumber(ARGV[3])
local most = tonumber(ARGV[4])
local back = tonumber(ARGV[5])
local from = tonumber(ARGV[6])
local peek = ARGV[7] == '1'

-- The key is read, and checked, before anything is written, as
-- token-bucket.lua reads its keys (read its header): a key of another type,
-- or a string that Lua does not read as a whole number below 1e17, fails
-- the call with a WRONGTYPE error naming it, and nothing is written.
local held = redis.pcall('GET', KEYS[1])
local stored = tonumber(held)
if held and not (stored and stored >= 0 and stored < 1e17 and stored % 1 == 0) then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. redis.call('TYPE', KEYS[1]).ok .. ' that is not a tollgate bucket (a whole number of microseconds below 1e17); nothing was written')
end

-- As in token-bucket.lua, all arithmetic is relative to now.
local busy = (stored or now) - now
if busy < 0 then busy = 0 end
if busy > capacity * step then busy = capacity * step end
local given = 0
if back > 0 and stored == from then
  given = math.min(back, busy / step)
  busy = math.max(0, math.ceil(busy - back * step))
end

local taken = 0
local wait = 0
if least > 0 then
  local over = busy + least * step - capacity * step
  if over <= 0 then
    taken = math.max(least, math.min(most, math.floor(capacity - busy / step)))
    if not peek then busy = math.ceil(busy + taken * step) end
  else
    wait = math.ceil(over)
  end
end

if not peek and (taken > 0 or given > 0) then
  if busy > 0 then
    redis.call('PSETEX', KEYS[1], math.ceil(busy / 1000) + 1, now + busy)
  elseif stored ~= nil then
    redis.call('DEL', KEYS[1])
  end
end

return { tostring(taken), now, tostring(capacity - busy / step), busy, wait, tostring(given) }
