-- tollgate token bucket, atomic over one or several buckets of one client.
--
-- Encoding: each bucket is one Redis string holding an integer, its
-- "full-at" time in microseconds of Redis's clock (GCRA's theoretical
-- arrival time). With T = 1e6 / refillPerSecond microseconds per token, a
-- bucket whose full-at time is F holds, at time now,
--     tokens = capacity - min(max(0, F - now), capacity * T) / T
-- which is exactly the token count of a plain token bucket that refills
-- continuously and is capped at capacity. Spending c tokens moves F to
-- max(F, now) + c * T. A missing key, or F <= now, is a full bucket.
-- All arithmetic is done relative to now (F - now is small), since a
-- double holding a clock near 1.8e15 us is only exact to a quarter of a
-- microsecond. The new F is rounded up to a whole microsecond: each write
-- can take away less than one microsecond of refill, never give any.
--
-- Clock steps: F - now is read as at most capacity * T, an empty bucket.
-- This script never writes F more than that (plus its rounding) ahead of
-- its clock, so a larger gap means Redis's clock stepped back since the
-- write (an NTP correction, a failover to a replica whose clock is behind):
-- without the clamp, a step back of an hour would lock every client out
-- for an hour. A consume also writes the clamped value back (F = now plus
-- the window, rounded up), whatever it decides, so the bucket refills from
-- there: a step back costs at most one window (capacity /
-- refillPerSecond). A peek writes nothing; the next consume repairs. A
-- step forward makes buckets full sooner, which admits at most one
-- window's worth more.
--
-- The app sends the intervals of each bucket already in microseconds, as
-- doubles in JavaScript's shortest exact notation, so the script reads back
-- the very numbers the app computed (lib's MemoryStore computes the same
-- expressions, so both round alike) and multiplies nothing:
--
-- KEYS[i]      bucket key of policy i; all keys share the client's hash tag,
--              so in Redis Cluster the whole call runs on one node
-- ARGV[1]      mode: '1' consume, '0' peek (decide, write nothing)
-- ARGV[3i-1]   window of policy i: capacity * T, the microseconds an empty
--              bucket takes to fill, with T = 1e6 / refillPerSecond
-- ARGV[3i]     need of policy i: cost * T, the microseconds of refill its
--              cost is worth (> 0, <= window; above it only for a shadow
--              policy's cost above its capacity, at most 2^52: never
--              affordable, so the reply is < 0, minus the time until full
--              plus need - window)
-- ARGV[3i+1]   move of policy i: cost * 1e6 / refillPerSecond, how far
--              spending moves F (the need, rounded as lib has always
--              rounded the spend)
--
-- Limits: lib accepts only policies whose window is at most 2^52 us
-- (about 142 years), so until 2112 (when now passes 2^52 us) every F, now
-- plus at most a window, is an integer below 2^53: exact in a double, and
-- printed whole by Redis (%.17g) when passed to PSETEX.
--
-- Returns, for one policy, one integer; for several, one integer per
-- policy, in KEYS order (an integer reply saves Redis building a table):
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
--
-- Keys that are no bucket: every key is read, and checked, before
-- anything is written. A key of another type (a list, a hash, a set, ...)
-- or a string that Lua does not read as a whole number from 0 to below
-- 1e17 ("abc", "", "nan", "inf", "-1", "1.5", 1e17 or more; arithmetic
-- alone reads most of these as a number, decides on it or clamps it as a
-- clock step, and the write replaces the key) fails the call with a
-- WRONGTYPE error that names the key, and nothing is written: the request
-- follows its failure mode and the key stays as it was. Each key is read
-- with GET (MGET would read a key of another type as missing, a full
-- bucket, and PSETEX would replace it), through redis.pcall, so that the
-- error can name the key. Every full-at time the scripts write is a whole
-- number below 1e17 (below 2^53 here, a little more in lua/settle.lua's
-- debt).
--
-- Speed: one policy, the common case, takes a path of its own (no loop, no
-- table); ARGV strings are converted by arithmetic, once each, without a
-- call to tonumber (the stored value takes one: that is its check). On
-- the allowed path, x + (-x % 1) is
-- math.ceil(x) for x >= 0 without a function call, and exact: Lua's
-- -x % 1 is -x - floor(-x), computed exactly, so the sum is the integer
-- ceil(x) itself (for 0 < x < 1, 1 - x rounds to within 2^-54 of itself
-- and the sum rounds to 1).

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]

-- The error of a key that holds what no tollgate script writes there.
local function refused (key)
  return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. redis.call('TYPE', key).ok .. ' that is not a tollgate bucket (a whole number of microseconds below 1e17); nothing was written')
end

if #KEYS == 1 then
  local key = KEYS[1]
  local window = ARGV[2] + 0
  local held = redis.pcall('GET', key)
  local full = now
  if held then
    full = tonumber(held)
    if not (full and full >= 0 and full < 1e17 and full % 1 == 0) then
      return refused(key)
    end
  end
  local busy = full - now
  if busy < 0 then
    busy = 0
  elseif busy > window then
    busy = window
    if ARGV[1] == '1' then
      redis.call('PSETEX', key, math.ceil(busy / 1000) + 1, now + math.ceil(busy))
    end
  end
  local over = busy + ARGV[3] - window
  if over > 0 then
    return -math.ceil(over)
  end
  if ARGV[1] == '1' then
    busy = busy + ARGV[4]
    busy = busy + (-busy % 1)
    local ms = busy / 1000
    redis.call('PSETEX', key, ms + (-ms % 1) + 1, now + busy)
  end
  return busy
end

-- held[i]: the full-at time key i holds (now for a missing key).
local held = {}
for i = 1, #KEYS do
  local value = redis.pcall('GET', KEYS[i])
  local full = now
  if value then
    full = tonumber(value)
    if not (full and full >= 0 and full < 1e17 and full % 1 == 0) then
      return refused(KEYS[i])
    end
  end
  held[i] = full
end

local out = {}
local allowed = true
for i = 1, #KEYS do
  local a = 3 * i - 1
  local window = ARGV[a] + 0
  local busy = held[i] - now
  if busy < 0 then
    busy = 0
  elseif busy > window then
    busy = window
    if ARGV[1] == '1' then
      redis.call('PSETEX', KEYS[i], math.ceil(busy / 1000) + 1, now + math.ceil(busy))
    end
  end
  local over = busy + ARGV[a + 1] - window
  if over > 0 then
    allowed = false
    out[i] = -math.ceil(over)
  else
    out[i] = busy
  end
end

if allowed and ARGV[1] == '1' then
  for i = 1, #KEYS do
    local busy = out[i] + ARGV[3 * i + 1]
    busy = busy + (-busy % 1)
    local ms = busy / 1000
    out[i] = busy
    redis.call('PSETEX', KEYS[i], ms + (-ms % 1) + 1, now + busy)
  end
end

return out
