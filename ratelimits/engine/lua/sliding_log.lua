-- A sorted set of admitted units scored by time: exact over every interval (now-P, now].
-- Members carry the request's unique token, so units in the same microsecond all count.
--[[check]]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - P)
local n = redis.call('ZCARD', key)
if n + c <= L then
  return {1, L - n - c, P, 0, 0}
end
-- the request fits once the (n + c - L) oldest units have left the period
local oldest = redis.call('ZRANGE', key, n + c - L - 1, n + c - L - 1, 'WITHSCORES')
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local retry = tonumber(oldest[2]) + P - now
return {0, floor0(L - n), tonumber(newest[2]) + P - now, retry, 0}
--[[commit]]
add_members(key, now, token, c)
redis.call('PEXPIRE', key, ttl_ms(P))
--[[refund]]
remove_members(key, token, c)
