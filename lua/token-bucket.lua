-- tollgate token bucket, atomic over one or several buckets of one client.
--
-- Encoding: each bucket is one Redis string holding an integer, its
-- "full-at" time in microseconds of Redis's clock (GCRA's theoretical
-- arrival time). With T = 1e6 / refillPerSecond microseconds per token, a
-- bucket whose full-at time is F holds, at time now,
--     tokens = capacity - max(0, F - now) / T
-- which is exactly the token count of a plain token bucket that refills
-- continuously and is capped at capacity. Spending c tokens moves F to
-- max(F, now) + c * T. A missing key, or F <= now, is a full bucket.
-- All arithmetic is done relative to now (F - now is small), since a
-- double holding a clock near 1.8e15 us is only exact to a quarter of a
-- microsecond. The new F is rounded up to a whole microsecond: each write
-- can take away less than one microsecond of refill, never give any.
--
-- KEYS[i]        bucket key of policy i; all keys share the client's hash tag,
--                so in Redis Cluster the whole call runs on one node
-- ARGV[1]        mode: '1' consume, '0' peek (decide, write nothing)
-- ARGV[3i-1]     capacity of policy i, tokens (> 0, may be fractional)
-- ARGV[3i]       refill of policy i, tokens per second (> 0)
-- ARGV[3i+1]     cost of policy i, tokens (> 0, <= capacity)
--
-- Returns one integer per policy, in KEYS order:
--   >= 0   the bucket can afford its cost; the value is the microseconds
--          until it is full again: after spending when every policy could
--          afford its cost and the mode is consume, else as it is now
--   < 0    the bucket cannot afford its cost; minus the microseconds until
--          it can (nothing was spent on any bucket)
-- The request is allowed when no value is negative. The caller derives the
-- tokens left, fractions kept, as capacity - value / T for a bucket that
-- could afford, and cost - wait / T for one that could not:
-- microseconds are an exact scaled integer for the token count (Redis
-- would truncate a fractional Lua number in a reply).
--
-- Why TIME: the clock is read here, inside the script, so every app server
-- of a fleet uses the same clock; an app server whose clock runs fast gains
-- nothing, because it has no way to pass its own time in. Since Redis 5,
-- scripts replicate their effects, so reading TIME is safe.
--
-- TTL: each written key expires one millisecond after its bucket is full
-- again, rounded up (PX counts whole milliseconds from Redis's millisecond
-- clock, which drops the microseconds of now; the extra millisecond covers
-- them). A full bucket and a missing key are the same thing, so the expiry
-- changes no decision, and Redis holds keys only for clients that spent
-- something recently.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local out = {}
local allowed = true

for i = 1, #KEYS do
  local a = 3 * i - 1
  local step = 1000000 / ARGV[a + 1]
  local busy = (tonumber(redis.call('GET', KEYS[i])) or now) - now
  if busy < 0 then busy = 0 end
  local over = busy + ARGV[a + 2] * step - ARGV[a] * step
  if over > 0 then
    allowed = false
    out[i] = -math.ceil(over)
  else
    out[i] = busy
  end
end

if allowed and ARGV[1] == '1' then
  for i = 1, #KEYS do
    local a = 3 * i - 1
    local busy = math.ceil(out[i] + ARGV[a + 2] * 1000000 / ARGV[a + 1])
    out[i] = busy
    redis.call('PSETEX', KEYS[i], math.ceil(busy / 1000) + 1, now + busy)
  end
end

return out
