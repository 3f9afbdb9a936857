-- tollgate token bucket, batched: the decisions of several requests in one
-- call, each exactly as lua/token-bucket.lua decides it (read its header
-- for the encoding, the clock-step clamp, the TTL and the arithmetic),
-- taken in the order they are listed, as if that script ran once per
-- request at one instant of Redis's clock.
--
-- One TIME for the whole call. Each distinct key is read once, before
-- anything is decided, and written at most once, at the end: the requests
-- work on a copy of the buckets held here, so a request sees the spend
-- (and the clamp repair) of every earlier request of the call on the same
-- key, as it would see the writes of earlier calls. The last write of a
-- key is what the single script would have left: its full-at time and its
-- TTL (one millisecond after full, rounded up) are those of the last
-- request that wrote it.
--
-- All or nothing: validate everything, then write everything. Every key
-- is read and checked first, as lua/token-bucket.lua checks it (read its
-- header): a key of another type, or a string that Lua does not read as a
-- whole number below 1e17 ("abc", "nan", "inf", a longer number), fails
-- the call with a WRONGTYPE error naming the key. Then every request is
-- decided on the copy held here; then every value to write is checked (a
-- whole number of microseconds below 1e17: an argument that is not a
-- number would make one NaN, which PSETEX refuses), and only then is
-- anything written. So a call that fails has written nothing, and one
-- that writes, writes every key it decided.
--
-- One bad key among good ones: the whole call fails, having written
-- nothing, and the caller (lib/store/redis-store.ts) decides each of its
-- requests again, alone, with lua/token-bucket.lua. There the requests
-- that read the bad key fail alone, each with the error naming it (their
-- failure mode applies), and every other request is decided, and spent,
-- exactly once: the batch spent nothing before.
--
-- KEYS[k]       the distinct bucket keys of the call, each once; in Redis
--               Cluster, all of one slot
-- ARGV holds the requests one after the other, each:
--   ARGV[p]       mode: '1' consume, '0' peek (decide, write nothing)
--   ARGV[p+1]     m, the number of its policies (>= 1)
--   then, for each policy j = 0 .. m-1, from q = p + 2 + 4j:
--   ARGV[q]       k, the index in KEYS of the policy's bucket key (the keys
--                 of one request are distinct)
--   ARGV[q+1]     window, microseconds (lua/token-bucket.lua's ARGV[3i-1])
--   ARGV[q+2]     need, microseconds (its ARGV[3i])
--   ARGV[q+3]     move, microseconds (its ARGV[3i+1])
--   and the next request starts at p + 2 + 4m.
--
-- Returns one flat array: for each request in order, one integer per
-- policy, each what lua/token-bucket.lua would reply for it (>= 0: the
-- bucket can afford its cost, microseconds until full; < 0: minus the
-- microseconds until it can). A request is allowed when none of its
-- values is negative.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]

-- busy[k]: the full-at time of key k, minus now (may be negative);
-- ttl[k]: the TTL of its pending write, ms, when it has one.
local busy = {}
local ttl = {}
for k = 1, #KEYS do
  local held = redis.pcall('GET', KEYS[k])
  busy[k] = 0
  if held then
    local full = tonumber(held)
    if not (full and full >= 0 and full < 1e17 and full % 1 == 0) then
      return redis.error_reply('WRONGTYPE ' .. KEYS[k] .. ' holds a ' .. redis.call('TYPE', KEYS[k]).ok .. ' that is not a tollgate bucket (a whole number of microseconds below 1e17); nothing was written')
    end
    busy[k] = full - now
  end
end

local out = {}
local o = 0
local p = 1
local last = #ARGV
while p <= last do
  local consume = ARGV[p] == '1'
  local m = ARGV[p + 1] + 0
  local first = o + 1
  local allowed = true
  local q = p + 2
  for j = 1, m do
    local k = ARGV[q] + 0
    local window = ARGV[q + 1] + 0
    local b = busy[k]
    if b < 0 then
      b = 0
    elseif b > window then
      b = window
      if consume then
        busy[k] = math.ceil(b)
        ttl[k] = math.ceil(b / 1000) + 1
      end
    end
    local over = b + ARGV[q + 2] - window
    if over > 0 then
      allowed = false
      out[o + j] = -math.ceil(over)
    else
      out[o + j] = b
    end
    q = q + 4
  end
  if allowed and consume then
    q = p + 2
    for i = first, o + m do
      local k = ARGV[q] + 0
      local b = out[i] + ARGV[q + 3]
      b = b + (-b % 1)
      local ms = b / 1000
      out[i] = b
      busy[k] = b
      ttl[k] = ms + (-ms % 1) + 1
      q = q + 4
    end
  end
  o = o + m
  p = p + 2 + 4 * m
end

for k = 1, #KEYS do
  if ttl[k] and not (busy[k] >= 0 and now + busy[k] < 1e17) then
    return redis.error_reply('ERR tollgate batch: the full-at time computed for ' .. KEYS[k] .. ' is ' .. tostring(now + busy[k]) .. ', not a whole number of microseconds below 1e17 (an argument that is not a number?); nothing was written')
  end
end
for k = 1, #KEYS do
  if ttl[k] then
    redis.call('PSETEX', KEYS[k], ttl[k], now + busy[k])
  end
end

return out
