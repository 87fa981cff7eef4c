-- Redis Cluster: add a process's tallied refusals to one policy-hour's offenders.
-- KEYS: the offenders sorted set, its error hash (one hash tag). ARGV: who, count pairs.
-- Weighted Space-Saving, as offend() in prelude.lua one refusal at a time: a newcomer to
-- a full list inherits the evicted minimum as its error, so memory stays bounded.
local key, errors = KEYS[1], KEYS[2]
for i = 1, #ARGV, 2 do
  local who, n = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('ZSCORE', key, who) then
    redis.call('ZINCRBY', key, n, who)
  else
    local floor = 0
    if redis.call('ZCARD', key) >= OFFENDERS then
      local evicted = redis.call('ZPOPMIN', key)
      floor = tonumber(evicted[2])
      redis.call('HDEL', errors, evicted[1])
    end
    redis.call('ZADD', key, floor + n, who)
    redis.call('EXPIRE', key, OFFENDERS_TTL, 'NX')
    if floor > 0 then
      redis.call('HSET', errors, who, floor)
      redis.call('EXPIRE', errors, OFFENDERS_TTL, 'NX')
    end
  end
end
return 1
