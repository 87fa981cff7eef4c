-- Entry point: check every limit, then charge only if every enforced limit admits.
-- The argument layout is generated from contract.py: ARGV holds HEAD values (now_us,
-- '' = server time; token; version key, '' = none; stats prefix, '' = no counters), then
-- PER_LIMIT values per limit at the offsets ARG_*; KEYS holds one base key per limit.
-- The script does not count: the engine tallies every decision in process (see
-- engine/tally.py), and now and then a call carries those counts after the limits,
-- CARRY values each: 'c', policy, minute, field, n for a counter; 'o', policy, hour,
-- who, n for an offender.
-- Returns {version, admitted, now_us, then per limit: allowed, remaining, reset_after,
-- retry_after, delay, outcome (the counter's field: a, r, w or o)}.
local now = decision_now(ARGV)
local token, version_key, stats = ARGV[2], ARGV[3], ARGV[4]
local n = #KEYS
local checks, admitted, figures = check_all(KEYS, ARGV, now)
local version = 0
if version_key ~= '' then version = tonumber(redis.call('GET', version_key)) or 0 end
-- Room for one limit's answers from the start (a reply ends at its first nil), so the
-- reply of the usual call never grows.
local out = {version, admitted, now, nil, nil, nil, nil, nil, nil}
for i = 1, n do
  local r = checks[i]
  local field = charge(KEYS, ARGV, i, now, r, admitted, token, figures[i])
  local j = 6 * i - 3
  out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6] =
    r[1], r[2], r[3], r[4], r[5], field
end
if stats ~= '' then
  for o = HEAD + n * PER_LIMIT + 1, #ARGV, CARRY do
    local name, at, what, k = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], tonumber(ARGV[o + 4])
    if ARGV[o] == 'c' then
      local sk = stats .. name .. ':' .. at
      if redis.call('HINCRBY', sk, what, k) == k then redis.call('EXPIRE', sk, STATS_TTL) end
    else
      offend(stats .. name .. ':h' .. at, what, k)
    end
  end
end
return out
