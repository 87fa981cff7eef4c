-- One count per client and aligned window. The window number is part of the key, so an
-- explicit clock (tests, replay) never reads a stale window; the client is field f of
-- its shard's hash for the window (see keynames.base_key), which expires with the window.
-- A calendar window (cal: its start and end, µs) is keyed by its start in seconds.
--[[check]]
local win, reset
if cal then
  win = cal[1] / US
  reset = cal[2] - now
else
  win = math.floor(now / P)
  reset = (win + 1) * P - now
end
local k = window_key(key, win)
local n = tonumber(redis.call('HGET', k, f)) or 0
if n + c <= L then
  return {1, L - n - c, reset, 0, 0, k}
end
return {0, floor0(L - n), reset, reset, 0, k}
--[[commit]]
-- the hash's expiry is the window's end, whoever sets it: set by each new field
if redis.call('HINCRBY', r[6], f, c) == c then redis.call('PEXPIRE', r[6], ttl_ms(r[3])) end
--[[refund]]
-- s1: the window hash the charge counted in; a count is a plain sum, so taking the
-- units back is exact whatever was counted since
if redis.call('HEXISTS', s1, f) == 1 then redis.call('HINCRBY', s1, f, -c) end
