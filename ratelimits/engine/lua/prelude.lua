-- Shared helpers. Every quantity of time is an integer number of microseconds held in
-- a double, exactly as the Python backend computes it, so both reach the same decisions.
--
-- Each algorithm file holds two bodies, after the markers --[[check]] and --[[commit]].
-- The loader (scripts.batch_source) makes them the functions functions_of(algorithm)
-- returns, and a call's plan holds its limits' (check_all.lua).
-- check(key, f, now, L, P, B, c, mw, cal) returns {allowed, remaining, reset_after,
-- retry_after, delay, state...} and never writes (pruning expired entries aside);
-- commit(key, f, now, L, P, B, c, r, token) writes, only when the whole request is
-- admitted and this limit admitted it.
-- mw is the limit's max_wait in µs: the algorithms that reserve a future turn admit a
-- request whose turn comes within it, with that delay.

-- The constants (US, EPS, TOKEN_EPS, FLOOR_EPS, STATS_TTL, OFFENDERS_TTL, OFFENDERS,
-- CONCURRENCY_RETRY), the plan's layout and the window algorithms (WINDOWED) are
-- generated above this file from ratelimits/engine/constants.py and contract.py.

-- A number handed to redis.call as it is, not as a string, is written by Redis itself with
-- %.17g: exact, and cheaper than formatting it here. fmt is for a number that becomes
-- part of a key or a reply.
local function fmt(x)
  -- %.17g round-trips any double, so stored floats read back bit for bit.
  return string.format('%.17g', x)
end

-- A number as an argument of redis.call, written as Redis would write it (%.17g) for
-- less: a whole number below 1e17 (a time in µs, most counts) is the same text with %d,
-- which costs half as much. Other numbers go as they are.
local function num_arg(x)
  if x % 1 == 0 and x < 1e17 and x > -1e17 then return string.format('%d', x) end
  return x
end

-- The hash of window number w under key: `<key>:<w>`, as keynames.windows names it. A
-- window number is a whole number (of periods, or a calendar window's start in seconds),
-- which %d writes as fmt would, for a fraction of its cost.
local function window_key(key, w)
  return string.format('%s:%d', key, w)
end

-- A TTL of `us` microseconds as the argument of PX or PEXPIRE: whole milliseconds, at
-- least 1 (written with %d, see num_arg).
local function ttl_ms(us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return string.format('%d', ms)
end

local function floor0(x)
  -- counts derived from float time (T = P/L) land a hair below whole numbers
  local v = math.floor(x + FLOOR_EPS)
  if v < 0 then v = 0 end
  return v
end

-- When a sliding window admits a request of cost c that it refuses now (µs from now, at
-- least 1): while this window's count leaves room, once the previous window's weighted
-- share has shrunk enough; else in the next window, where this one's count is weighted.
local function sliding_retry(L, P, c, prev, cur, elapsed)
  local retry
  if cur + c <= L then
    retry = math.ceil(P - (L - cur - c) * P / prev - elapsed)
  else
    retry = math.ceil(P - elapsed + P - (L - c) * P / cur)
  end
  if retry < 1 then retry = 1 end
  return retry
end

local function add_members(key, score, token, cost)
  score = num_arg(score)  -- written once for all the members
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

-- Warm-up (token_bucket, gcra), the twin of algorithms.warm_check: a gate on top of the
-- algorithm's own check, with its state at <key>:w: n, the earliest time the next unit
-- may pass, and w, the warm-up still to go (µs, 0..W). A cold client is paced without
-- burst at an interval falling from 3T to T as it is used for W; idleness cools it
-- again, fully after C = max(B, 1) T. r is the algorithm's check, changed in place.
local function warm_check(key, now, L, P, B, c, W, mw, r)
  local T = P / L
  local C = math.max(B, 1) * T
  local s = redis.call('HMGET', key .. ':w', 'n', 'w')
  local n, w = now, W
  if s[1] then n, w = tonumber(s[1]), tonumber(s[2]) end
  if n < now then
    w = math.min(W, w + (now - n) * W / C)
    n = now
  end
  local delay, n2, w2 = 0, 0, 0
  if w > 0 then
    local gap = T * (1 + 2 * w / W)
    if now + EPS + mw < n then  -- paced: the gate refuses
      local horizon = math.ceil(n - now + (W - w) * C / W)
      return {0, 0, math.max(r[3], horizon), math.max(r[4], math.ceil(n - now - mw)), 0}
    end
    delay = math.ceil(n - now)
    n2 = n + c * gap
    w2 = math.max(0, w - c * gap)
  else
    n2 = n + c * T
  end
  local horizon = math.ceil(n2 - now + (W - w2) * C / W)
  if r[1] == 0 then
    return {0, r[2], math.max(r[3], horizon), r[4], 0}
  end
  if w2 > 0 then r[2] = 0 end
  r[3] = math.max(r[3], horizon)
  r[5] = math.max(r[5], delay)
  r.wn, r.ww = n2, w2
  return r
end

local function warm_commit(key, r)
  redis.call('HSET', key .. ':w', 'n', num_arg(r.wn), 'w', num_arg(r.ww))
  redis.call('PEXPIRE', key .. ':w', ttl_ms(r[3]))
end
