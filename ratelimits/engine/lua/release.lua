-- Free the concurrency slots of requests that finished, on a Redis Cluster: one call per
-- hash slot, like the decision's. ARGV: per key, how many members it frees, then them.
local o = 1
for i = 1, #KEYS do
  local n = tonumber(ARGV[o])
  if n > 0 then
    redis.call('ZREM', KEYS[i], unpack(ARGV, o + 1, o + n))
  end
  o = o + 1 + n
end
return 1
