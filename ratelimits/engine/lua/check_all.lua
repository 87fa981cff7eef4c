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
-- enforced limit admits (a shadow limit never refuses, nor does one being settled), else
-- 0, and each limit's figures {L, P, B, c}, parsed once for its charge.
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
    local f = argv[o + ARG_FIELD]
    local r = check(argv[o + ARG_ALGORITHM], keys[i], f, now, L, P, B, c, mw, cal)
    if W > 0 then r = warm_check(keys[i], now, L, P, B, c, W, mw, r) end
    if argv[o + ARG_LOCKOUT_US] ~= '0' then r = locked(keys[i] .. ':x' .. f, now, r) end
    checks[i], figures[i] = r, {L, P, B, c}
    if r[1] == 0 and argv[o + ARG_SHADOW] == '0' and argv[o + ARG_STAGE] ~= STAGE_SETTLE then
      admitted = 0
    end
  end
  return checks, admitted, figures
end

-- Charge limit i (its check's answer r, its figures fig) when the call is admitted and
-- the limit admits (a limit being settled: whenever it admits); returns the counter's
-- field for it, and whether it wrote: a (admitted, charged unless its stage is check),
-- c (settled: charged after the response), o (admitted but not charged: another limit
-- refused the call, or a limit being settled had no room), w (a shadow limit's would-be
-- refusal) or r (refused: its lockout, if it has one, starts).
local function charge(keys, argv, i, now, r, admitted, token, fig)
  local o = HEAD + (i - 1) * PER_LIMIT
  local c, stage = fig[4], argv[o + ARG_STAGE]
  if r[1] == 1 and (admitted == 1 or stage == STAGE_SETTLE) then
    if stage == STAGE_CHECK then return 'a', false end
    commit(argv[o + ARG_ALGORITHM], keys[i], argv[o + ARG_FIELD], now, fig[1], fig[2], fig[3],
      c, r, token)
    if r.wn then warm_commit(keys[i], r) end
    if stage == STAGE_SETTLE then return 'c', true end
    return 'a', true
  elseif r[1] == 1 then
    r[2] = r[2] + c  -- not charged: the units it would have taken are still there
    return 'o', false
  elseif stage == STAGE_SETTLE then
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
