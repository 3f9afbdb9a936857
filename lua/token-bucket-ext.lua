-- tollgate token bucket of one policy, with reservations and a lockout.
--
-- Why a script of its own: lua/token-bucket.lua is the hot path of every
-- limit and stays as cheap as it is; only policies with `maxWaitMs` or
-- `lockout` send their calls here, and only they pay for what follows.
--
-- The bucket is the one of lua/token-bucket.lua (read its header): one
-- integer, the full-at time F in microseconds of Redis's clock, with the
-- same arguments computed the same way, and the same rounding.
--
-- Reservations: a consume that may wait (mode '2') is allowed when its
-- cost is affordable within `maxWait` microseconds: it spends at once,
-- which moves F past the one-window horizon by up to maxWait, and returns
-- how long the caller must wait before it uses the tokens. Every later
-- call sees the bucket that far in debt, so waiters are served in the
-- order of their calls and the bucket is never spent faster than it
-- refills: the tokens of a reservation are used at the time they would
-- have been there. The clock-step clamp of lua/token-bucket.lua reads any
-- F more than one window ahead as a step back of the clock; here the
-- horizon is the reach, window + maxWait (ARGV[5]), which is what this
-- policy can legitimately write, so reservations survive it, and a step
-- back still costs at most one reach. Every call of a policy with
-- `maxWaitMs` is sent here with its reach, including peeks and consumes
-- that may not wait (the process's waiters are full): a call with a
-- shorter horizon would clamp the reservations away. Policies that share
-- a bucket must therefore share `maxWaitMs` (see README).
--
-- Lockouts: KEYS[2] counts the bucket's denials (consumes only); after
-- `after` of them within `withinMs` of the first, the client is blocked
-- for `forMs`: every call is denied until then, and says how long is left.
-- KEYS[2] holds one of:
--     "-S.n"  n > 0 denials counted in the current period, the first at S,
--             microseconds of Redis's clock; the period ends at
--             S + withinMs * 1000, and the key a millisecond after it
--     -U < 0  blocked until U, microseconds of Redis's clock; the key
--             expires one millisecond after U
--     n > 0   a count written by an earlier version, whose period ended
--             when the key expired (PX withinMs at its first denial): read
--             as n denials, the first at now - (withinMs - the key's PTTL),
--             and written in the form above by the next denial counted
-- Anything else in either key (another type, "nan", a longer number) fails
-- the call before anything is written, as in lua/token-bucket.lua.
-- Periods and blocks are measured on stored times, never on expiries: an
-- expiry follows Redis's wall clock, so after a step back of an hour a
-- count ran on for an hour more (denials spaced past withinMs kept
-- counting and locked the client out). Both are clamped as the bucket is:
-- a period read as starting after now, and a block read as more than forMs
-- away, mean the clock stepped back; they are read (and, on a consume,
-- written back) as starting now and as forMs from now. So a step back
-- costs at most one counting period (the denials counted before it and
-- those of the period that starts at the next consume count together) or
-- one block; a step forward ends them early. Denials during a block are
-- not counted; a block or period that has ended but whose key has not yet
-- expired reads as no denial counted. Nothing clears a lockout but its end
-- or a reset (which deletes both keys).
-- Why "-S.n": it is a number to Lua's arithmetic (about -S), so a server of
-- an earlier version, which knows only the two integer forms, reads it as
-- a block that has ended (no denial counted) rather than failing its call
-- during a rolling upgrade; this script tells it from a block by its dot.
--
-- KEYS[1]   bucket key
-- KEYS[2]   lockout key (the bucket key plus '!lockout'; unused without a lockout)
-- ARGV[1]   mode: '0' peek (decide, write nothing), '1' consume, '2' consume
--           that may wait up to reach - window microseconds
-- ARGV[2]   window: capacity * T microseconds, T = 1e6 / refillPerSecond
-- ARGV[3]   need: cost * T microseconds (> 0, <= window; above it only
--           for a shadow policy's cost above its capacity, at most 2^52:
--           never affordable, a denial, as in lua/token-bucket.lua)
-- ARGV[4]   move: cost * 1e6 / refillPerSecond microseconds
-- ARGV[5]   reach: window + maxWaitMs * 1000 microseconds (window without
--           `maxWaitMs`): the most F is ever written ahead of now
-- ARGV[6]   after: denials that start a lockout (0: no lockout)
-- ARGV[7]   withinMs: the counting period, whole milliseconds
-- ARGV[8]   for: the block, microseconds (forMs * 1000, an integer)
--
-- Returns two integers { value, extra }:
--   value >= 0   allowed; value is the microseconds until the bucket is
--                full again (after spending, on a consume: more than the
--                window when the call reserved); extra is the microseconds
--                to wait before using the tokens (0: now)
--   value < 0    denied, nothing spent; -value is the microseconds until a
--                retry can be allowed: until the cost is affordable, or
--                until the block ends; extra is 1 when the denial is a
--                lockout's (blocked, or this denial started the block)
--
-- Limits: lib accepts maxWaitMs <= 3 600 000 and forMs <= 31 536 000 000
-- (a year), and a window of at most 2^52 microseconds less the reach's
-- wait, so every stored time stays an integer below 2^53 until 2112.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local mode = ARGV[1]
local window = ARGV[2] + 0
local reach = ARGV[5] + 0
local after = ARGV[6] + 0
local count = 0

local within = ARGV[7] * 1000
local since = now

-- Both keys are read, and checked, before anything is written, as
-- lua/token-bucket.lua reads its keys (read its header): a key that holds
-- what this script does not write there fails the call with a WRONGTYPE
-- error naming it, and nothing is written.
local function refused (key, what)
  return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. redis.call('TYPE', key).ok .. ' that is not a tollgate ' .. what .. '; nothing was written')
end

-- The lockout key's parts: "-S.n" as first and n, an integer as whole.
local lock = false
local first, n, whole
if after > 0 then
  lock = redis.pcall('GET', KEYS[2])
  if lock then
    if type(lock) == 'string' then
      first, n = string.match(lock, '^%-(%d+)%.(%d+)$')
      if not first then
        whole = string.match(lock, '^%-?(%d+)$')
      end
    end
    if not (first and #first <= 17 and #n <= 17 or whole and #whole <= 17) then
      return refused(KEYS[2], 'lockout count (-<first>.<count>, -<until> or <count>, at most 17 digits each)')
    end
  end
end
local held = redis.pcall('GET', KEYS[1])
local full = now
if held then
  full = tonumber(held)
  if not (full and full >= 0 and full < 1e17 and full % 1 == 0) then
    return refused(KEYS[1], 'bucket (a whole number of microseconds below 1e17)')
  end
end

if lock then
  if first then
    count = n + 0
    since = first + 0
  else
    lock = lock + 0
    if lock > 0 then
      count = lock
      since = now - within + redis.call('PTTL', KEYS[2]) * 1000
    else
      local left = -lock - now
      if left > 0 then
        local most = ARGV[8] + 0
        if left > most then
          left = most
          if mode ~= '0' then
            redis.call('PSETEX', KEYS[2], math.ceil(most / 1000) + 1, -(now + most))
          end
        end
        return { -math.ceil(left), 1 }
      end
    end
  end
  if since > now then
    since = now
    if mode ~= '0' then
      redis.call('PSETEX', KEYS[2], ARGV[7] + 1, string.format('-%d.%d', now, count))
    end
  elseif now - since >= within then
    count = 0
    since = now
  end
end

local busy = full - now
if busy < 0 then
  busy = 0
elseif busy > reach then
  busy = reach
  if mode ~= '0' then
    redis.call('PSETEX', KEYS[1], math.ceil(busy / 1000) + 1, now + math.ceil(busy))
  end
end

local over = busy + ARGV[3] - window
local slack = 0
if mode == '2' then
  slack = reach - window
end
if over > slack then
  if after > 0 and mode ~= '0' then
    count = count + 1
    if count >= after then
      local most = ARGV[8] + 0
      redis.call('PSETEX', KEYS[2], math.ceil(most / 1000) + 1, -(now + most))
      return { -most, 1 }
    end
    redis.call('PSETEX', KEYS[2], math.ceil((since + within - now) / 1000) + 1, string.format('-%d.%d', since, count))
  end
  return { -math.ceil(over), 0 }
end

local delay = 0
if over > 0 then
  delay = math.ceil(over)
end
if mode ~= '0' then
  busy = math.ceil(busy + ARGV[4])
  redis.call('PSETEX', KEYS[1], math.ceil(busy / 1000) + 1, now + busy)
end
return { busy, delay }
