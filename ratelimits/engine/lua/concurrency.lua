-- In-flight requests as a sorted set scored by expiry; release() removes them, and an
-- entry a crashed worker never released expires after P.
--[[check]]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local n = redis.call('ZCARD', key)
if n + c <= L then
  return {1, L - n - c, P, 0, 0}
end
-- slots free when requests finish; the hint is the sooner of 1 s and the expiry
local hint = CONCURRENCY_RETRY
if P < hint then hint = P end
return {0, floor0(L - n), P, hint, 0}
--[[commit]]
add_members(key, now + P, token, c)
redis.call('PEXPIRE', key, ttl_ms(P))
--[[refund]]
remove_members(key, token, c)
