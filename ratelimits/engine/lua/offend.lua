-- Redis Cluster: add a process's tallied refusals to one policy-hour's offenders.
-- KEYS: the offenders sorted set, its error hash (<set>:e, one hash tag). ARGV: who,
-- count pairs, each added as offend() in prelude.lua adds one call's refusals.
for i = 1, #ARGV, 2 do
  offend(KEYS[1], ARGV[i], tonumber(ARGV[i + 1]))
end
return 1
