-- tollgate reserve and settle: charging by outcome, atomic over one or
-- several buckets of one client.
--
-- A request of a route that settles reserves its cost when it arrives
-- (mode '1', exactly the consume of lua/token-bucket.lua), and once its
-- response is known the app sends the difference between the actual cost
-- and the reservation (mode '2'): a refund moves the bucket's full-at time
-- back, an extra charge moves it further ahead. Both are one atomic call,
-- so there is no count-then-uncount gap.
--
-- Encoding: that of lua/token-bucket.lua, one integer per bucket, its
-- full-at time F in microseconds of Redis's clock; with T = 1e6 /
-- refillPerSecond and busy = F - now, the bucket holds capacity - busy / T
-- tokens. Here busy may exceed the window (capacity * T): the bucket is in
-- debt, holding fewer than zero tokens, and a request waits until the debt
-- and its own cost have refilled.
--
-- Debt and the clock-step clamp: lua/token-bucket.lua reads anything more
-- than one window ahead as a clock that stepped back. A settled bucket may
-- legitimately be up to two windows ahead (a debt of at most `capacity`
-- tokens), so this script clamps its reads at two windows instead:
--   - a charge that would take the bucket below -capacity tokens stops
--     there (the rest is forgiven), so a larger gap is still a clock step,
--     which here costs at most two windows;
--   - a refund never takes busy below 0: never past capacity.
-- A bucket in debt that a route without settlement (lua/token-bucket.lua)
-- consumes from reads as empty there, and that route's consume writes it
-- back to one window ahead: the debt beyond empty is forgiven. Routes that
-- share a bucket should agree on whether they settle.
--
-- Time, rounding and speed as in lua/token-bucket.lua (read its header):
-- arithmetic relative to now, each written F rounded up to a whole
-- microsecond, intervals sent by the app already in microseconds.
--
-- KEYS[i]      bucket key of policy i (one client's hash tag)
-- ARGV[1]      mode: '1' reserve, '2' settle
-- mode '1', reserve (the consume of lua/token-bucket.lua, debt-aware):
--   ARGV[3i-1] window of policy i: capacity * T, microseconds
--   ARGV[3i]   need of policy i: cost * T, microseconds (> 0, <= window)
--   ARGV[3i+1] move of policy i: cost * 1e6 / refillPerSecond, microseconds
-- mode '2', settle:
--   ARGV[3i-1] window of policy i: capacity * T, microseconds
--   ARGV[3i]   change of policy i: (actual - reserved) * 1e6 /
--              refillPerSecond, microseconds; < 0 a refund, > 0 a charge
--   ARGV[3i+1] unused ('0'): the same stride in both modes
--
-- Returns one integer per policy, in KEYS order (always a table):
--   reserve: as lua/token-bucket.lua: >= 0 the microseconds until full
--            (after spending when every policy could afford its cost; more
--            than the window while in debt), < 0 minus the microseconds
--            until it can afford (nothing was spent on any bucket)
--   settle:  the microseconds until full after the settlement (0: full;
--            more than the window: in debt)
--
-- Why TIME, why PX: as in lua/token-bucket.lua. A settlement that leaves
-- a bucket full deletes its key (a full bucket and a missing key are the
-- same thing).

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local held = redis.call('MGET', unpack(KEYS))
local out = {}

local function write (key, busy)
  busy = math.ceil(busy)
  if busy <= 0 then
    redis.call('DEL', key)
    return 0
  end
  redis.call('PSETEX', key, math.ceil(busy / 1000) + 1, now + busy)
  return busy
end

local function busyOf (i, limit)
  local busy = (held[i] or now) - now
  if busy < 0 then
    return 0, false
  end
  if busy > limit then
    return limit, true
  end
  return busy, false
end

if ARGV[1] == '2' then
  for i = 1, #KEYS do
    local a = 3 * i - 1
    local limit = 2 * ARGV[a]
    local busy = busyOf(i, limit) + ARGV[a + 1]
    if busy > limit then
      busy = limit
    end
    out[i] = write(KEYS[i], busy)
  end
  return out
end

local allowed = true
for i = 1, #KEYS do
  local a = 3 * i - 1
  local window = ARGV[a] + 0
  local busy, stepped = busyOf(i, 2 * window)
  if stepped then
    write(KEYS[i], busy)
  end
  local over = busy + ARGV[a + 1] - window
  if over > 0 then
    allowed = false
    out[i] = -math.ceil(over)
  else
    out[i] = busy
  end
end

if allowed then
  for i = 1, #KEYS do
    out[i] = write(KEYS[i], out[i] + ARGV[3 * i + 1])
  end
end

return out
