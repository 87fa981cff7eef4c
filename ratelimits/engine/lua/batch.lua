-- Entry point: check every limit, then charge only if every enforced limit admits.
-- The argument layout is generated from contract.py: ARGV[1] is the call's plan (its
-- limits' figures, the version key, the counters' prefix: parsed once, see begin), then
-- the call's own values (its time, its token, each window limit's field) where the plan
-- says; KEYS holds one base key per limit, then every other key the call may touch
-- (window hashes, warm-up and lockout states, the version key, the carried counts' keys),
-- as a strict server runs only a script that touches no key it was not given: the
-- limits are counted by the plan.
-- The script does not count: the engine tallies every decision in process (see
-- engine/tally.py), and now and then a call carries those counts after the call's
-- values, CARRY values each: 'c', policy, minute, field, n for a counter; 'o', policy,
-- hour, who, n for an offender.
-- Returns {version, admitted, now_us, then per limit: remaining, reset_after, wait (its
-- retry_after when it refused, else its delay), outcome (the counter's field: a or o when
-- it admitted, r or w)}. The version goes back as Redis stored it (text): the engine
-- reads the number, and the script parses none.
local plan, now, token = begin(ARGV)
local n = #plan
local checks, admitted = check_all(KEYS, ARGV, now, plan)
local version = 0
if plan.version_key ~= '' then version = redis.call('GET', plan.version_key) or 0 end
-- Room for one limit's answers from the start (a reply ends at its first nil), so the
-- reply of the usual call never grows.
local out = {version, admitted, now, nil, nil, nil, nil}
for i = 1, n do
  local r = checks[i]
  local field = charge(KEYS, ARGV, i, now, r, admitted, token, plan[i])
  local j = 4 * i - 1
  local wait = r[4]
  if r[1] == 1 then wait = r[5] end
  out[j + 1], out[j + 2], out[j + 3], out[j + 4] = r[2], r[3], wait, field
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
