-- Which processes are live: each one beats now and then, and reads back how many beat
-- within the TTL. KEYS[1]: the sorted set of processes scored by their last beat
-- (seconds). ARGV: the process's member, the TTL (seconds), the time ('' = the server's
-- TIME, so processes with skewed clocks agree). Returns the number of live processes.
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('EXPIRE', KEYS[1], math.ceil(ttl))
return redis.call('ZCARD', KEYS[1])
