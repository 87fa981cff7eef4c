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

-- Check every limit of the call, writing nothing: each check's answer, and 1 when every
-- enforced limit admits (a shadow limit never refuses), else 0.
local function check_all(keys, argv, now)
  local checks, admitted = {}, 1
  for i = 1, #keys do
    local o = HEAD + (i - 1) * PER_LIMIT
    local L, P, B = tonumber(argv[o + ARG_LIMIT]), tonumber(argv[o + ARG_PERIOD_US]),
      tonumber(argv[o + ARG_BURST])
    local c, W, mw = tonumber(argv[o + ARG_COST]), tonumber(argv[o + ARG_WARMUP_US]),
      tonumber(argv[o + ARG_WAIT_US])
    local r = check(argv[o + ARG_ALGORITHM], keys[i], argv[o + ARG_FIELD], now, L, P, B, c, mw)
    if W > 0 then r = warm_check(keys[i], now, L, P, B, c, W, mw, r) end
    checks[i] = r
    if r[1] == 0 and argv[o + ARG_SHADOW] == '0' then admitted = 0 end
  end
  return checks, admitted
end

-- Charge limit i (its check's answer r) when the call is admitted and the limit admits;
-- returns the counter's field for it: a (charged), o (admitted but not charged: another
-- limit refused the call), w (a shadow limit's would-be refusal) or r (refused).
local function charge(keys, argv, i, now, r, admitted, token)
  local o = HEAD + (i - 1) * PER_LIMIT
  local c = tonumber(argv[o + ARG_COST])
  if r[1] == 1 and admitted == 1 then
    commit(argv[o + ARG_ALGORITHM], keys[i], argv[o + ARG_FIELD], now,
      tonumber(argv[o + ARG_LIMIT]), tonumber(argv[o + ARG_PERIOD_US]),
      tonumber(argv[o + ARG_BURST]), c, r, token)
    if r.wn then warm_commit(keys[i], r) end
    return 'a'
  elseif r[1] == 1 then
    r[2] = r[2] + c  -- not charged: the units it would have taken are still there
    return 'o'
  elseif argv[o + ARG_SHADOW] == '1' then
    return 'w'
  end
  return 'r'
end
