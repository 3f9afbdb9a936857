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
-- Refunds never give tokens twice. A refund may give back only what the
-- bucket would hold had the reservation been charged its actual cost from
-- the start. Picture busy (F - now) as a stack of layers, one per spend,
-- each put on top when it runs, as thick as its cost's refill; refill eats
-- the stack from the bottom. A reservation's difference (reserved - actual)
-- is the top of its layer: the bucket still holds it while that top is
-- above now, and at most as much of it as the top's height. With t_j the
-- time of reserve j, need_j its cost's refill and F_j the full-at time it
-- left, that top is at least
--     line_j = max(F_j - now - (refunds since t_j), t_j + need_j - now)
-- above now: a layer sinks by refill and by the refunds of the layers below
-- it (the first term subtracts every refund since, those of the layers
-- above it too: the bound is low, never high), and nothing but refill eats
-- into the layer itself (the second term). The clamps cut the stack from
-- the top, above one window, where no reservation's layer lies unless the
-- clock stepped back (a reserve leaves its top at most a window ahead). So
-- a refund is cut to max(0, line_j), and never takes busy below 0. Without
-- the cut, a reservation held past a refill was refunded onto a bucket that
-- had refilled and been spent again: four app servers admitted 27 of
-- settled cost in 500 ms on a bucket of 10 at 20/s (bound 20).
--
-- The count: KEYS[2i] keeps, per bucket, an epoch of refunds
--     "E C L"   three integers: the epoch started at E (microseconds of
--               Redis's clock), C microseconds of refund have been counted
--               in it, L is the time of its last write
-- and a reserve's reply carries, per bucket, its epoch E, its mark
-- M = (F_j - E) + C_j (its full-at time on the epoch's clock, which advances
-- with time and with every refund: V = (now - E) + C) and its floor
-- t_j + need_j, so line_j = max(M - V, floor - now). A settlement cuts the
-- refund to 0 when its epoch is no longer the bucket's. The epoch ends
--   - a window after its last write (now >= L + window): every reservation
--     of it has then F_j <= t_j + window <= L + window, so line_j <= 0; a
--     reserve then starts a new one (E = now, C = 0);
--   - when the clock stepped back below its last write (now < L): then
--     the lines would read more time as still to refill than is, so the
--     reservations made before the step refund nothing;
--   - when V passes 2^51 (every integer stays exact: M < 2^51 + window);
--   - on a reset, which deletes the key.
-- A bucket key or a refund key that holds anything else (another type,
-- "nan", a longer number) fails the call before anything is written, as
-- in lua/token-bucket.lua (read its header).
-- The key expires a window and a millisecond after each write, so it is
-- there at least until L + window; decisions read L, never the expiry. A
-- step forward of the clock only lowers the lines (less is refunded), and
-- a step back that leaves now above L reads as that much less time passed,
-- as it does for the buckets.
--
-- Time, rounding and speed as in lua/token-bucket.lua (read its header):
-- arithmetic relative to now, each written F rounded up to a whole
-- microsecond, intervals sent by the app already in microseconds; counted
-- refunds are rounded up, so they only lower the lines.
--
-- KEYS[2i-1]   bucket key of policy i (one client's hash tag)
-- KEYS[2i]     its refund key: the bucket key plus '!settle'
-- ARGV[1]      mode: '1' reserve, '2' settle
-- mode '1', reserve (the consume of lua/token-bucket.lua, debt-aware):
--   ARGV[3i-1] window of policy i: capacity * T, microseconds
--   ARGV[3i]   need of policy i: cost * T, microseconds (> 0, <= window)
--   ARGV[3i+1] move of policy i: cost * 1e6 / refillPerSecond, microseconds
-- mode '2', settle (what the reserve replied, sent back):
--   ARGV[5i-3] window of policy i: capacity * T, microseconds
--   ARGV[5i-2] change of policy i: (actual - reserved) * 1e6 /
--              refillPerSecond, microseconds; < 0 a refund, > 0 a charge
--   ARGV[5i-1] the reserve's epoch of bucket i
--   ARGV[5i]   the reserve's mark of bucket i
--   ARGV[5i+1] the reserve's floor of bucket i
--
-- Returns a table:
--   reserve: one integer per policy, in KEYS order, as lua/token-bucket.lua:
--            >= 0 the microseconds until full (after spending when every
--            policy could afford its cost; more than the window while in
--            debt), < 0 minus the microseconds until it can afford (nothing
--            was spent on any bucket); when every policy could afford, then
--            per policy i, at 3i-2, 3i-1 and 3i after those: its epoch, its
--            mark and its floor (truncated to whole microseconds, so never
--            above t_j + need_j)
--   settle:  one integer per policy: the microseconds until full after the
--            settlement (0: full; more than the window: in debt)
--
-- Why TIME, why PX: as in lua/token-bucket.lua. A settlement that leaves
-- a bucket full deletes its key (a full bucket and a missing key are the
-- same thing); its refund key stays until its epoch ends.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local n = #KEYS / 2
local out = {}
-- Epochs end before their clock passes 2^51 microseconds.
local EPOCH_LIMIT = 2251799813685248

-- The error of a key that holds what this script does not write there.
local function refused (key, what)
  return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. redis.call('TYPE', key).ok .. ' that is not a tollgate ' .. what .. '; nothing was written')
end

-- Every key is read, and checked, before anything is written, as
-- lua/token-bucket.lua reads its keys (read its header): held[i], the
-- full-at time of bucket i (now: none); counts[i], its refund key's
-- three integers (nil: none). Anything else fails the call, naming the key.
local held = {}
local counts = {}
for i = 1, n do
  local key = KEYS[2 * i - 1]
  local value = redis.pcall('GET', key)
  held[i] = now
  if value then
    held[i] = tonumber(value)
    if not (held[i] and held[i] >= 0 and held[i] < 1e17 and held[i] % 1 == 0) then
      return refused(key, 'bucket (a whole number of microseconds below 1e17)')
    end
  end
  local count = redis.pcall('GET', KEYS[2 * i])
  if count then
    local e, c, last
    if type(count) == 'string' then
      e, c, last = string.match(count, '^(%d+) (%d+) (%d+)$')
    end
    if not (e and #e <= 17 and #c <= 17 and #last <= 17) then
      return refused(KEYS[2 * i], 'refund count (three whole numbers, at most 17 digits each)')
    end
    counts[i] = { e + 0, c + 0, last + 0 }
  end
end

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
  local busy = held[i] - now
  if busy < 0 then
    return 0, false
  end
  if busy > limit then
    return limit, true
  end
  return busy, false
end

-- The epoch in force on bucket i: its start and its count, or nil.
local function epochOf (i, window)
  local count = counts[i]
  if count == nil then
    return nil
  end
  local e, c, last = count[1], count[2], count[3]
  if now < last or now >= last + window or now - e + c > EPOCH_LIMIT then
    return nil
  end
  return e, c
end

local function keep (i, window, e, c)
  redis.call('PSETEX', KEYS[2 * i], math.ceil(window / 1000) + 1, string.format('%d %d %d', e, c, now))
end

if ARGV[1] == '2' then
  for i = 1, n do
    local a = 5 * i - 3
    local window = ARGV[a] + 0
    local change = ARGV[a + 1] + 0
    local limit = 2 * window
    local busy = busyOf(i, limit)
    if change < 0 then
      local e, c = epochOf(i, window)
      local back = 0
      if e ~= nil and e == ARGV[a + 2] + 0 then
        back = math.min(-change, busy, math.max(ARGV[a + 3] - (now - e + c), ARGV[a + 4] - now))
      end
      if back > 0 then
        out[i] = write(KEYS[2 * i - 1], busy - back)
        keep(i, window, e, c + math.ceil(busy - out[i]))
      else
        out[i] = write(KEYS[2 * i - 1], busy)
      end
    else
      busy = busy + change
      if busy > limit then
        busy = limit
      end
      out[i] = write(KEYS[2 * i - 1], busy)
    end
  end
  return out
end

local allowed = true
for i = 1, n do
  local a = 3 * i - 1
  local window = ARGV[a] + 0
  local busy, stepped = busyOf(i, 2 * window)
  if stepped then
    write(KEYS[2 * i - 1], busy)
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
  for i = 1, n do
    local a = 3 * i - 1
    local window = ARGV[a] + 0
    out[i] = write(KEYS[2 * i - 1], out[i] + ARGV[a + 2])
    local e, c = epochOf(i, window)
    if e == nil then
      e, c = now, 0
    end
    keep(i, window, e, c)
    out[n + 3 * i - 2] = e
    out[n + 3 * i - 1] = now - e + c + out[i]
    out[n + 3 * i] = now + ARGV[a + 1]
  end
end

return out
