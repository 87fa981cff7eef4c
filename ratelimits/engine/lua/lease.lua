-- Leases: a process takes up to `want` units of a fixed_window or sliding_window limit
-- at once and spends them locally; unspent units come back here. The units are charged
-- to the algorithm's own window count (field `field` of <base key>:<window>, as
-- fixed_window.lua and sliding_window.lua write it), so leased and unleased requests of one policy share one
-- count, and a unit is charged before it is spent.
--
-- ARGV: now_us ('' = the server's TIME), then per key LEASE_PER values at the offsets
-- LEASE_*: algorithm, limit, period_us, cost, want (0 = only give back), back_window
-- ('' = nothing to give back), back_units, field, back_epoch, and a calendar window's
-- three boundaries (µs; 0 when none), as a decision carries them. KEYS: one base key per
-- limit, then the window hashes the call may touch (`keynames.reached_keys`).
-- Per key, first the give-back: back_units return to window back_window only while it is
-- still the current window (a window that ended keeps its count: its requests are over,
-- and a sliding window's previous count must not shrink under the next one's estimate),
-- and never below zero. Then the grant: min(want, what the window has left) units, at
-- least `cost` or none.
--
-- fixed_window: the window has L - n units left; a grant is good until the window ends.
-- A calendar window (a day, a week, a month of a time zone) is the one holding the
-- server's time among the two the call carries, keyed by its start in seconds, as
-- fixed_window.lua keys it: leased or not, a request counts in the same window.
-- sliding_window: the estimate of the period ending now is prev * (P - elapsed) / P +
-- cur, and a request passes while estimate + cost <= L. A grant of g units is charged to
-- cur at once, so estimate + g <= L at the grant; as the window runs on, prev's weight
-- only shrinks, so spending those units at any later moment of the SAME window keeps the
-- estimate at or under L, exactly as if each had been charged when spent. Once the window
-- ends, cur becomes the previous window and counts only in part: a unit charged before
-- that but spent after it would be undercounted, so a grant ends with its window (never
-- at the estimate's "reset", which lies a period later).
--
-- Resets (want = LEASE_RESET, an admin's or the CLI's reset of the client): the units
-- other processes hold cannot be called back, and they will be spent. So the reset keeps
-- in the count what leases may still spend, and voids what it cannot keep track of. Each
-- client's window records what it granted in the last two lease periods (field
-- <field>:l of the window's hash: "b:n:p:e", n units granted in period b = now //
-- LEASE_US, p in period b - 1, e the window's epoch). A lease lasts at most LEASE_US, so
-- the leases that may still spend at a reset were granted in this period or the one
-- before: the count becomes min(count, what they were granted), the previous window's
-- count goes (its leases ended with it), and the epoch moves on. A give-back must name
-- the epoch its grant was made in: units leased before a reset come back to nothing (the
-- reset already left them out, or counted them as spent).
--
-- Returns {now_us, then per key LEASE_FIELDS: granted, window, remaining (units the
-- window has left after the grant), reset_after (µs, as the algorithm reports it),
-- retry_after (µs until `cost` units could be granted; 0 when granted), ends_after (µs
-- until the window ends: the grant's last moment), returned (units given back), epoch
-- (of the window, for a give-back of the grant)}.
local function record_of(k, lf)
  local raw = redis.call('HGET', k, lf)
  if not raw then return nil end
  local b, n, p, e = string.match(raw, '^(%-?%d+):(%d+):(%d+):(%d+)$')
  return {tonumber(b), tonumber(n), tonumber(p), tonumber(e)}
end

local function store_record(k, lf, r)
  redis.call('HSET', k, lf, string.format('%d:%d:%d:%d', r[1], r[2], r[3], r[4]))
end

-- Units granted in the lease periods whose leases may still run at period b.
local function live(r, b)
  if r[1] >= b then return r[2] + r[3] end
  if r[1] == b - 1 then return r[2] end
  return 0
end

-- Record a grant of g units in lease period b (the record may lag behind b; a grant
-- timed before the record's period, on a clock behind another's, counts in its period).
local function granting(k, lf, r, b, g)
  r = r or {b, 0, 0, 0}
  if r[1] == b or r[1] > b then
    r[2] = r[2] + g
  elseif r[1] == b - 1 then
    r[1], r[2], r[3] = b, g, r[2]
  else
    r[1], r[2], r[3] = b, g, 0
  end
  store_record(k, lf, r)
  return r
end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * US + tonumber(t[2])
end
local out = {now}
for i = 1, (#ARGV - 1) / LEASE_PER do
  local o = 1 + (i - 1) * LEASE_PER
  local algorithm = ARGV[o + LEASE_ALGORITHM]
  local L = tonumber(ARGV[o + LEASE_LIMIT])
  local P = tonumber(ARGV[o + LEASE_PERIOD_US])
  local c = tonumber(ARGV[o + LEASE_COST])
  local want = tonumber(ARGV[o + LEASE_WANT])
  local back_window = tonumber(ARGV[o + LEASE_BACK_WINDOW])
  local back = tonumber(ARGV[o + LEASE_BACK_UNITS]) or 0
  local f = ARGV[o + LEASE_FIELD]
  local back_epoch = tonumber(ARGV[o + LEASE_BACK_EPOCH])
  if algorithm ~= 'fixed_window' and algorithm ~= 'sliding_window' then
    error('a lease needs fixed_window or sliding_window, not ' .. tostring(algorithm))
  end
  local win, elapsed, ends
  local edge = ARGV[o + LEASE_CAL1]
  if edge ~= '0' then  -- a calendar window: the one holding the server's time
    edge = tonumber(edge)
    local first, last = tonumber(ARGV[o + LEASE_CAL0]), edge
    if now >= edge then first, last = edge, tonumber(ARGV[o + LEASE_CAL2]) end
    win, elapsed, ends = first / US, now - first, last - now
  else
    win = math.floor(now / P)
    elapsed = now - win * P
    ends = P - elapsed
  end
  local k = window_key(KEYS[i], win)
  local cur = tonumber(redis.call('HGET', k, f)) or 0
  local lf = f .. ':l'
  local record = record_of(k, lf)
  local epoch = record and record[4] or 0
  local period = math.floor(now / LEASE_US)
  if want == LEASE_RESET then
    local prev = window_key(KEYS[i], win - 1)
    redis.call('HDEL', prev, f, lf)
    if record then
      local kept = math.min(cur, live(record, period))
      if kept > 0 then redis.call('HSET', k, f, kept) else redis.call('HDEL', k, f) end
      cur = kept
      epoch = epoch + 1
      record[4] = epoch
      store_record(k, lf, record)
    else  -- nothing leased in this window: nothing can be spent from it any more
      redis.call('HDEL', k, f)
      cur = 0
    end
    want = 0
  end
  local returned = 0
  if back > 0 and back_window == win and back_epoch == epoch and cur > 0 then
    returned = math.min(back, cur)
    cur = cur - returned
    redis.call('HINCRBY', k, f, -returned)  -- the hash keeps its expiry
  end
  local granted, remaining, reset, retry = 0, 0, 0, 0
  if algorithm == 'fixed_window' then
    local left = L - cur
    reset = ends
    if want > 0 and left >= c then
      granted = math.min(want, left)
      if redis.call('HINCRBY', k, f, granted) == granted then
        redis.call('PEXPIRE', k, ttl_ms(reset))
      end
      record = granting(k, lf, record, period, granted)
    elseif want > 0 then
      retry = reset
    end
    remaining = floor0(left - granted)
  else
    local prev = tonumber(redis.call('HGET', window_key(KEYS[i], win - 1), f)) or 0
    local est = prev * (P - elapsed) / P + cur
    -- floor(L - est + TOKEN_EPS) >= c exactly when est + c <= L + TOKEN_EPS: the check
    -- of sliding_window.lua
    local left = math.floor(L - est + TOKEN_EPS)
    if want > 0 and left >= c then
      granted = math.min(want, left)
      if redis.call('HINCRBY', k, f, granted) == granted then
        redis.call('PEXPIRE', k, ttl_ms(2 * P - elapsed))
      end
      record = granting(k, lf, record, period, granted)
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
  out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6], out[j + 7],
    out[j + 8] = granted, win, remaining, reset, retry, ends, returned, epoch
end
return out
