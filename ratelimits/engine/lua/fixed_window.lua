-- One counter per aligned window; the window number is part of the key, so an explicit
-- clock (tests, replay) never reads a stale window.
--[[check]]
local win = math.floor(now / P)
local k = key .. ':' .. fmt(win)
local n = tonumber(redis.call('GET', k)) or 0
local reset = (win + 1) * P - now
if n + c <= L then
  return {1, L - n - c, reset, 0, 0, k}
end
return {0, floor0(L - n), reset, reset, 0, k}
--[[commit]]
redis.call('INCRBY', r[6], c)
redis.call('PEXPIRE', r[6], ttl_ms(r[3]))
--[[refund]]
-- s1: the window key the charge counted in; a counter is a plain sum, so taking the
-- units back is exact whatever was counted since
if redis.call('EXISTS', s1) == 1 then redis.call('DECRBY', s1, c) end
