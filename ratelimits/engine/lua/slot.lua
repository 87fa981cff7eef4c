-- Redis Cluster entry point: the limits of ONE hash slot of a request. Like batch.lua it
-- checks every limit and charges them only if every enforced one admits, but its keys
-- are its limits' alone (their base keys, then their window hashes, warm-up and lockout
-- states, all under one hash tag): no version, no counters, no offenders (the engine tallies those in process). ARGV as for batch.lua
-- (the plan's version key and counters' prefix are ignored).
-- Returns {admitted, now_us, then per limit: remaining, reset_after, wait, outcome (as
-- batch.lua answers them), s1, s2}: s1 and s2 are what the charge wrote ('' when
-- nothing), handed back to refund.lua should another slot of the request refuse.
local plan, now, token = begin(ARGV)
local n = #plan
local checks, admitted = check_all(KEYS, ARGV, now, plan)
local function text(x)
  if x == nil then return '' end
  if type(x) == 'number' then return fmt(x) end
  return x
end
local out = {admitted, now}
for i = 1, n do
  local r = checks[i]
  local field, wrote = charge(KEYS, ARGV, i, now, r, admitted, token, plan[i])
  local s1, s2 = '', ''
  if wrote then s1, s2 = text(r[6]), text(r[7]) end
  local j = #out
  local wait = r[4]
  if r[1] == 1 then wait = r[5] end
  out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6] =
    r[2], r[3], wait, field, s1, s2
end
return out
