-- Redis Cluster entry point: the limits of ONE hash slot of a request. Like batch.lua it
-- checks every limit and charges them only if every enforced one admits, but it touches
-- only its declared keys (and their window keys, under the same hash tag): no version, no
-- counters, no offenders (the engine tallies those in process). ARGV as for batch.lua
-- (the version key and stats prefix are ignored).
-- Returns {admitted, now_us, then per limit: allowed, remaining, reset_after,
-- retry_after, delay, outcome, s1, s2}: s1 and s2 are what the charge wrote ('' when
-- nothing), handed back to refund.lua should another slot of the request refuse.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * US + tonumber(t[2])
end
local token = ARGV[2]
local n = #KEYS
local checks, admitted = {}, 1
for i = 1, n do
  local o = HEAD + (i - 1) * PER_LIMIT
  local L, P, B = tonumber(ARGV[o + ARG_LIMIT]), tonumber(ARGV[o + ARG_PERIOD_US]),
    tonumber(ARGV[o + ARG_BURST])
  local c, W, mw = tonumber(ARGV[o + ARG_COST]), tonumber(ARGV[o + ARG_WARMUP_US]),
    tonumber(ARGV[o + ARG_WAIT_US])
  local r = check(ARGV[o + ARG_ALGORITHM], KEYS[i], ARGV[o + ARG_FIELD], now, L, P, B, c, mw)
  if W > 0 then r = warm_check(KEYS[i], now, L, P, B, c, W, mw, r) end
  checks[i] = r
  if r[1] == 0 and ARGV[o + ARG_SHADOW] == '0' then admitted = 0 end
end
local function text(x)
  if x == nil then return '' end
  if type(x) == 'number' then return fmt(x) end
  return x
end
local out = {admitted, now}
for i = 1, n do
  local o = HEAD + (i - 1) * PER_LIMIT
  local r = checks[i]
  local c = tonumber(ARGV[o + ARG_COST])
  local field, s1, s2 = nil, '', ''
  if r[1] == 1 and admitted == 1 then
    commit(ARGV[o + ARG_ALGORITHM], KEYS[i], ARGV[o + ARG_FIELD], now,
      tonumber(ARGV[o + ARG_LIMIT]), tonumber(ARGV[o + ARG_PERIOD_US]),
      tonumber(ARGV[o + ARG_BURST]), c, r, token)
    if r.wn then warm_commit(KEYS[i], r) end
    field, s1, s2 = 'a', text(r[6]), text(r[7])
  elseif r[1] == 1 then
    r[2] = r[2] + c  -- not charged: the units it would have taken are still there
    field = 'o'
  elseif ARGV[o + ARG_SHADOW] == '1' then
    field = 'w'
  else
    field = 'r'
  end
  local j = #out
  out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6], out[j + 7],
    out[j + 8] = r[1], r[2], r[3], r[4], r[5], field, s1, s2
end
return out
