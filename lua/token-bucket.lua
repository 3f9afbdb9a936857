-- tollgate token bucket, atomic over one or several buckets of one client.
--
-- Encoding: each bucket is one Redis string holding an integer, its
-- "full-at" time in microseconds of Redis's clock (GCRA's theoretical
-- arrival time). With T = 1e6 / refillPerSecond microseconds per token, a
-- bucket whose full-at time is F holds, at time now,
--     tokens = capacity - max(0, F - now) / T
-- which is exactly the token count of a plain token bucket that refills
-- continuously and is capped at capacity. Spending c tokens moves F to
-- max(F, now) + c * T. A missing key, or F <= now, is a full bucket. The
-- new F is rounded up to a whole microsecond: rounding can only ever take
-- away less than one microsecond of refill, never give it.
--
-- KEYS[i]        bucket key of policy i; all keys share the client's hash tag,
--                so in Redis Cluster the whole call runs on one node
-- ARGV[1]        mode: '1' consume, '0' peek (decide, write nothing)
-- ARGV[3i-1]     capacity of policy i, tokens (> 0, may be fractional)
-- ARGV[3i]       refill of policy i, tokens per second (> 0)
-- ARGV[3i+1]     cost of policy i, tokens (> 0, <= capacity)
--
-- Returns a flat array:
--   [1]          1 when every policy could afford its cost (and, in consume
--                mode, all of them were spent), else 0 and nothing was spent
--   [2]          Redis's clock at the decision, microseconds
--   then for each policy i, three entries:
--   remaining    tokens left after this decision, as a string (fractions kept);
--                a peek reports the tokens there are, without spending
--   full in      microseconds until this bucket is full again (integer)
--   wait         microseconds until `cost` tokens are available; 0 when this
--                policy could afford it (integer)
--
-- Why TIME: the clock is read here, inside the script, so every app server
-- of a fleet uses the same clock; an app server whose clock runs fast gains
-- nothing, because it has no way to pass its own time in. Since Redis 5,
-- scripts replicate their effects, so reading TIME is safe.
--
-- TTL: each written key expires when its bucket would be full again, rounded
-- up to the next millisecond: that rounding is the margin. A full bucket and
-- a missing key are the same thing, so a key that expires at or after that
-- moment changes no decision, and Redis holds keys only for clients that
-- spent something recently.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local consume = ARGV[1] == '1'
local n = #KEYS

local busy, after, wait, interval = {}, {}, {}, {}
local allowed = 1

for i = 1, n do
  local a = 3 * i - 1
  local capacity = tonumber(ARGV[a])
  local step = 1000000 / tonumber(ARGV[a + 1])
  local full = tonumber(redis.call('GET', KEYS[i]))
  if full == nil or full < now then full = now end
  local spent = full + tonumber(ARGV[a + 2]) * step
  local over = spent - now - capacity * step
  interval[i] = step
  busy[i] = full - now
  after[i] = math.ceil(spent)
  if over > 0 then
    allowed = 0
    wait[i] = math.ceil(over)
  else
    wait[i] = 0
  end
end

local out = { allowed, now }
for i = 1, n do
  local b = busy[i]
  if allowed == 1 and consume then
    b = after[i] - now
    redis.call('SET', KEYS[i], after[i], 'PX', math.ceil(b / 1000))
  end
  out[3 * i] = tostring(tonumber(ARGV[3 * i - 1]) - b / interval[i])
  out[3 * i + 1] = b
  out[3 * i + 2] = wait[i]
end

return out
