-- Entry point: check every limit, then charge only if every enforced limit admits.
-- The argument layout is generated from contract.py: ARGV[1] is the call's plan (its
-- limits' figures, the version key, the counters' prefix: parsed once, see plan_of), then
-- the call's own values (its time, its token, each window limit's field) where the plan
-- says; KEYS holds one base key per limit.
-- The script does not count: the engine tallies every decision in process (see
-- engine/tally.py), and now and then a call carries those counts after the call's
-- values, CARRY values each: 'c', policy, minute, field, n for a counter; 'o', policy,
-- hour, who, n for an offender.
-- Returns {version, admitted, now_us, then per limit: allowed, remaining, reset_after,
-- retry_after, delay, outcome (the counter's field: a, r, w or o)}. The version goes back
-- as Redis stored it (text): the engine reads the number, and the script parses none.
local plan = plan_of(ARGV[1])
local now = decision_now(ARGV, plan)
local token = plan.token_at and ARGV[plan.token_at] or ''
local n = #KEYS
local checks, admitted = check_all(KEYS, ARGV, now, plan)
local version = 0
if plan.version_key ~= '' then version = redis.call('GET', plan.version_key) or 0 end
-- Room for one limit's answers from the start (a reply ends at its first nil), so the
-- reply of the usual call never grows.
local out = {version, admitted, now, nil, nil, nil, nil, nil, nil}
for i = 1, n do
  local r = checks[i]
  local field = charge(KEYS, ARGV, i, now, r, admitted, token, plan[i])
  local j = 6 * i - 3
  out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6] =
    r[1], r[2], r[3], r[4], r[5], field
end
local stats = plan.stats
if stats ~= '' then
  for o = plan.carry_at, #ARGV, CARRY do
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
