-- Two aligned counts per client (field f of its shard's window hashes, as in
-- fixed_window.lua); the previous window counts in proportion to its overlap with the
-- sliding period ending now.
--[[check]]
local win = math.floor(now / P)
local elapsed = now - win * P
local k = window_key(key, win)
local cur = tonumber(redis.call('HGET', k, f)) or 0
local prev = tonumber(redis.call('HGET', window_key(key, win - 1), f)) or 0
local est = prev * (P - elapsed) / P + cur
if est + c <= L + TOKEN_EPS then
  return {1, floor0(L - est - c), 2 * P - elapsed, 0, 0, k, elapsed}
end
local retry = sliding_retry(L, P, c, prev, cur, elapsed)
local reset = P - elapsed
if cur > 0 then reset = 2 * P - elapsed end
return {0, floor0(L - est), reset, retry, 0}
--[[commit]]
-- kept until the next window has ended: it counts there as the previous one
if redis.call('HINCRBY', r[6], f, c) == c then
  redis.call('PEXPIRE', r[6], ttl_ms(2 * P - r[7]))
end
--[[refund]]
-- s1: the window hash the charge counted in (a plain sum: exact whatever came since)
if redis.call('HEXISTS', s1, f) == 1 then redis.call('HINCRBY', s1, f, -c) end
