-- Leases: a process takes up to `want` units of a fixed_window or sliding_window limit
-- at once and spends them locally; unspent units come back here. The units are charged
-- to the algorithm's own window count (field `field` of <base key>:<window>, as
-- fixed_window.lua and sliding_window.lua write it), so leased and unleased requests of one policy share one
-- count, and a unit is charged before it is spent.
--
-- ARGV: now_us ('' = the server's TIME), then per key LEASE_PER values at the offsets
-- LEASE_*: algorithm, limit, period_us, cost, want (0 = only give back), back_window
-- ('' = nothing to give back), back_units, field. KEYS: one base key per limit.
-- Per key, first the give-back: back_units return to window back_window only while it is
-- still the current window (a window that ended keeps its count: its requests are over,
-- and a sliding window's previous count must not shrink under the next one's estimate),
-- and never below zero. Then the grant: min(want, what the window has left) units, at
-- least `cost` or none.
--
-- fixed_window: the window has L - n units left; a grant is good until the window ends.
-- sliding_window: the estimate of the period ending now is prev * (P - elapsed) / P +
-- cur, and a request passes while estimate + cost <= L. A grant of g units is charged to
-- cur at once, so estimate + g <= L at the grant; as the window runs on, prev's weight
-- only shrinks, so spending those units at any later moment of the SAME window keeps the
-- estimate at or under L, exactly as if each had been charged when spent. Once the window
-- ends, cur becomes the previous window and counts only in part: a unit charged before
-- that but spent after it would be undercounted, so a grant ends with its window (never
-- at the estimate's "reset", which lies a period later).
--
-- Returns {now_us, then per key LEASE_FIELDS: granted, window, remaining (units the
-- window has left after the grant), reset_after (µs, as the algorithm reports it),
-- retry_after (µs until `cost` units could be granted; 0 when granted), ends_after (µs
-- until the window ends: the grant's last moment), returned (units given back)}.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * US + tonumber(t[2])
end
local out = {now}
for i = 1, #KEYS do
  local o = 1 + (i - 1) * LEASE_PER
  local algorithm = ARGV[o + LEASE_ALGORITHM]
  local L = tonumber(ARGV[o + LEASE_LIMIT])
  local P = tonumber(ARGV[o + LEASE_PERIOD_US])
  local c = tonumber(ARGV[o + LEASE_COST])
  local want = tonumber(ARGV[o + LEASE_WANT])
  local back_window = tonumber(ARGV[o + LEASE_BACK_WINDOW])
  local back = tonumber(ARGV[o + LEASE_BACK_UNITS]) or 0
  local f = ARGV[o + LEASE_FIELD]
  if algorithm ~= 'fixed_window' and algorithm ~= 'sliding_window' then
    error('a lease needs fixed_window or sliding_window, not ' .. tostring(algorithm))
  end
  local win = math.floor(now / P)
  local elapsed = now - win * P
  local k = KEYS[i] .. ':' .. fmt(win)
  local cur = tonumber(redis.call('HGET', k, f)) or 0
  local returned = 0
  if back > 0 and back_window == win and cur > 0 then
    returned = math.min(back, cur)
    cur = cur - returned
    redis.call('HINCRBY', k, f, -returned)  -- the hash keeps its expiry
  end
  local granted, remaining, reset, retry = 0, 0, 0, 0
  local ends = P - elapsed
  if algorithm == 'fixed_window' then
    local left = L - cur
    reset = ends
    if want > 0 and left >= c then
      granted = math.min(want, left)
      if redis.call('HINCRBY', k, f, granted) == granted then
        redis.call('PEXPIRE', k, ttl_ms(reset))
      end
    elseif want > 0 then
      retry = reset
    end
    remaining = floor0(left - granted)
  else
    local prev = tonumber(redis.call('HGET', KEYS[i] .. ':' .. fmt(win - 1), f)) or 0
    local est = prev * (P - elapsed) / P + cur
    -- floor(L - est + TOKEN_EPS) >= c exactly when est + c <= L + TOKEN_EPS: the check
    -- of sliding_window.lua
    local left = math.floor(L - est + TOKEN_EPS)
    if want > 0 and left >= c then
      granted = math.min(want, left)
      if redis.call('HINCRBY', k, f, granted) == granted then
        redis.call('PEXPIRE', k, ttl_ms(2 * P - elapsed))
      end
      reset = 2 * P - elapsed
    else
      if want > 0 then
        retry = sliding_retry(L, P, c, prev, cur, elapsed)  -- as sliding_window.lua
      end
      reset = P - elapsed
      if cur > 0 then reset = 2 * P - elapsed end
    end
    remaining = floor0(L - est - granted)
  end
  local j = #out
  out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6], out[j + 7] =
    granted, win, remaining, reset, retry, ends, returned
end
return out
