-- What batch.lua and slot.lua share, after the check and commit dispatchers: the time,
-- the check of every limit, and the charge of each.

-- The time to decide at, in µs: ARGV[1], or the server's clock when it is ''.
local function decision_now(argv)
  local now = tonumber(argv[1])
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * US + tonumber(t[2])
  end
  return now
end

-- A client a lockout holds (its lock, at <key>:x<field>, says until when, in µs): refused
-- until then, whatever its count says. r is its check.
local function locked(key, now, r)
  local til = tonumber(redis.call('GET', key))
  if til and til > now then
    local left = til - now
    local out = {0, 0, math.max(r[3], left), left, 0}
    out.locked = true
    return out
  end
  return r
end

-- A figure most limits leave at 0 (warm-up, wait): read without parsing it, as parsing a
-- number is among the dearest steps of a call.
local function figure(s)
  if s == '0' then return 0 end
  return tonumber(s)
end

-- Check every limit of the call, writing nothing: each check's answer, 1 when every
-- enforced limit admits (a shadow limit never refuses, nor does a refund), else 0, and
-- each limit's figures {L, P, B, c, cal}, parsed once for its charge.
local function check_all(keys, argv, now)
  local checks, figures, admitted = {}, {}, 1
  for i = 1, #keys do
    local o = HEAD + (i - 1) * PER_LIMIT
    local L, P, B = tonumber(argv[o + ARG_LIMIT]), tonumber(argv[o + ARG_PERIOD_US]),
      tonumber(argv[o + ARG_BURST])
    local c, W, mw = tonumber(argv[o + ARG_COST]), figure(argv[o + ARG_WARMUP_US]),
      figure(argv[o + ARG_WAIT_US])
    local cal, edge = nil, argv[o + ARG_CAL1]
    if edge ~= '0' then  -- a calendar window: the one holding the server's time
      edge = tonumber(edge)
      if now >= edge then
        cal = {edge, tonumber(argv[o + ARG_CAL2])}
      else
        cal = {tonumber(argv[o + ARG_CAL0]), edge}
      end
    end
    local f, r = argv[o + ARG_FIELD], nil
    if argv[o + ARG_STAGE] == STAGE_REFUND then
      r = {1, 0, 0, 0, 0}  -- a reservation taken back is not checked, and refuses nothing
    else
      r = check(argv[o + ARG_ALGORITHM], keys[i], f, now, L, P, B, c, mw, cal)
      if W > 0 then r = warm_check(keys[i], now, L, P, B, c, W, mw, r) end
      if argv[o + ARG_LOCKOUT_US] ~= '0' then r = locked(keys[i] .. ':x' .. f, now, r) end
      if r[1] == 0 and argv[o + ARG_SHADOW] == '0' then admitted = 0 end
    end
    checks[i], figures[i] = r, {L, P, B, c, cal}
  end
  return checks, admitted, figures
end

-- Take back the c units a reservation charged at `now` (the reservation's own time): from
-- the window it counted in (a plain sum: exact whatever was counted since), from the log
-- (units of that time), from a bucket whose refill time is still the reservation's (else
-- another request refilled it since, and the cap may have absorbed them: the charge
-- stays, under-admitting, never over), or from a GCRA arrival time (the caller takes
-- back only while the units cannot have been released meanwhile, see settling.py).
local function unreserve(alg, key, f, now, fig)
  local L, P, B, c, cal = fig[1], fig[2], fig[3], fig[4], fig[5]
  if alg == 'fixed_window' or alg == 'sliding_window' then
    local win = math.floor(now / P)
    if cal then win = cal[1] / US end
    local k = window_key(key, win)
    if (tonumber(redis.call('HGET', k, f)) or 0) >= c then redis.call('HINCRBY', k, f, -c) end
  elseif alg == 'sliding_log' then
    local names = redis.call('ZRANGEBYSCORE', key, now, now, 'LIMIT', 0, c)
    if #names > 0 then redis.call('ZREM', key, unpack(names)) end
  elseif alg == 'token_bucket' then
    local s = redis.call('HMGET', key, 't', 'ts')
    if s[1] and tonumber(s[2]) == now then
      redis.call('HSET', key, 't', math.min(B, tonumber(s[1]) + c))
    end
  elseif alg == 'gcra' then
    local tat = tonumber(redis.call('GET', key))
    if tat then
      tat = tat - c * P / L
      if tat <= now then redis.call('DEL', key) else redis.call('SET', key, tat, 'KEEPTTL') end
    end
  end
end

-- Charge limit i (its check's answer r, its figures fig) when the call is admitted and
-- the limit admits; returns the counter's field for it, and whether it wrote: a
-- (admitted and charged, a reservation too), o (admitted but not charged: another limit
-- refused the call; or a reservation taken back), w (a shadow limit's would-be refusal)
-- or r (refused: its lockout, if it has one, starts).
local function charge(keys, argv, i, now, r, admitted, token, fig)
  local o = HEAD + (i - 1) * PER_LIMIT
  local c = fig[4]
  if argv[o + ARG_STAGE] == STAGE_REFUND then
    unreserve(argv[o + ARG_ALGORITHM], keys[i], argv[o + ARG_FIELD], now, fig)
    return 'o', false
  end
  if r[1] == 1 and admitted == 1 then
    commit(argv[o + ARG_ALGORITHM], keys[i], argv[o + ARG_FIELD], now, fig[1], fig[2], fig[3],
      c, r, token)
    if r.wn then warm_commit(keys[i], r) end
    return 'a', true
  elseif r[1] == 1 then
    r[2] = r[2] + c  -- not charged: the units it would have taken are still there
    return 'o', false
  elseif argv[o + ARG_SHADOW] == '1' then
    return 'w', false
  end
  local lockout = figure(argv[o + ARG_LOCKOUT_US])
  if lockout > 0 and not r.locked then
    redis.call('SET', keys[i] .. ':x' .. argv[o + ARG_FIELD], now + lockout, 'PX',
      ttl_ms(lockout))
    r[3], r[4] = math.max(r[3], lockout), math.max(r[4], lockout)
  end
  return 'r', false
end
