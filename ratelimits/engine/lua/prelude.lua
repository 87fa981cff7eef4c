-- Shared helpers. Every quantity of time is an integer number of microseconds held in
-- a double, exactly as the Python backend computes it, so both reach the same decisions.
--
-- Each algorithm file holds two bodies, after the markers --[[check]] and --[[commit]].
-- The loader (contract.batch_source) places them as branches of the check() and
-- commit() dispatchers, so a call builds two closures rather than one per algorithm.
-- check(key, now, L, P, B, c) returns {allowed, remaining, reset_after, retry_after,
-- delay, state...} and never writes (pruning expired entries aside); commit(..., r,
-- token) writes, only when the whole request is admitted and this limit admitted it.

-- The constants (US, EPS, TOKEN_EPS, FLOOR_EPS, STATS_TTL, OFFENDERS_TTL, OFFENDERS,
-- CONCURRENCY_RETRY) and the argument offsets are generated above this file from
-- ratelimits/engine/constants.py and contract.py.

local function fmt(x)
  -- %.17g round-trips any double, so stored floats read back bit for bit.
  return string.format('%.17g', x)
end

local function ttl_ms(us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

local function floor0(x)
  -- counts derived from float time (T = P/L) land a hair below whole numbers
  local v = math.floor(x + FLOOR_EPS)
  if v < 0 then v = 0 end
  return v
end

local function add_members(key, score, token, cost)
  local args = {}
  for i = 1, cost do
    args[#args + 1] = score
    args[#args + 1] = token .. ':' .. i
    if #args >= 200 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('ZADD', key, unpack(args)) end
end

local function offend(key, who, n)
  -- Space-Saving top-k, weighted: a full list gives the newcomer the evicted minimum plus
  -- its refusals, so a client refused often enough always enters, and memory stays
  -- bounded. The inherited floor is the newcomer's error, kept in the hash <key>:e:
  -- count - error is a count the client certainly earned, which rotating keys cannot
  -- inflate.
  if redis.call('ZSCORE', key, who) then
    redis.call('ZINCRBY', key, n, who)
    return
  end
  local floor = 0
  local errors = key .. ':e'
  if redis.call('ZCARD', key) >= OFFENDERS then
    local evicted = redis.call('ZPOPMIN', key)
    floor = tonumber(evicted[2])
    redis.call('HDEL', errors, evicted[1])
  end
  redis.call('ZADD', key, floor + n, who)
  redis.call('EXPIRE', key, OFFENDERS_TTL, 'NX')
  if floor > 0 then
    redis.call('HSET', errors, who, floor)
    redis.call('EXPIRE', errors, OFFENDERS_TTL, 'NX')
  end
end
