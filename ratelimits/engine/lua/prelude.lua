-- Shared helpers. Every quantity of time is an integer number of microseconds held in
-- a double, exactly as the Python backend computes it, so both reach the same decisions.
--
-- Each algorithm file holds two bodies, after the markers --[[check]] and --[[commit]].
-- The loader (redis_backend.batch_source) places them as branches of the check() and
-- commit() dispatchers, so a call builds two closures rather than one per algorithm.
-- check(key, now, L, P, B, c) returns {allowed, remaining, reset_after, retry_after,
-- delay, state...} and never writes (pruning expired entries aside); commit(..., r,
-- token) writes, only when the whole request is admitted and this limit admitted it.

-- Float time (T = P/L) drifts by fractions of a microsecond at epoch magnitudes; a
-- request this close to its turn is on time (EPS: µs, TOKEN_EPS: units).
local EPS, TOKEN_EPS = 1, 1e-9
-- Per-policy counters live a day and an hour; offender lists two hours, at most
-- OFFENDERS members each (keys.py holds the same figures).
local STATS_TTL, OFFENDERS_TTL, OFFENDERS = 90000, 7200, 100

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
  local v = math.floor(x + 1e-3)
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

local function offend(key, who)
  -- Space-Saving top-k: a full list gives the newcomer the evicted minimum plus one, so a
  -- client refused often enough always enters, and memory stays bounded.
  if redis.call('ZSCORE', key, who) then
    redis.call('ZINCRBY', key, 1, who)
    return
  end
  local floor = 0
  if redis.call('ZCARD', key) >= OFFENDERS then
    floor = tonumber(redis.call('ZPOPMIN', key)[2])
  end
  redis.call('ZADD', key, floor + 1, who)
  redis.call('EXPIRE', key, OFFENDERS_TTL, 'NX')
end
