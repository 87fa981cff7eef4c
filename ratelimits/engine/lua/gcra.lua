-- Generic cell rate algorithm: one theoretical arrival time per key; a request may
-- arrive up to B emission intervals early.
--[[check]]
local T = P / L
local tat = tonumber(redis.call('GET', key)) or now
if tat < now then tat = now end
local new = tat + c * T
local allow_at = new - B * T
if now + EPS + mw >= allow_at then  -- a max_wait (mw): a turn reserved ahead
  local delay = 0
  if now + EPS < allow_at then delay = math.ceil(allow_at - now) end
  return {1, floor0((now - allow_at) / T), math.ceil(new - now), 0, delay, new}
end
return {0, floor0((B * T - (tat - now)) / T), math.ceil(tat - now),
        math.ceil(allow_at - now - mw), 0}
--[[commit]]
redis.call('SET', key, num_arg(r[6]), 'PX', ttl_ms(r[3]))
--[[refund]]
-- s1: the TAT the charge stored. Only while it is still the stored one is moving it back
-- by c*T exact (see tat_refund in the prelude).
tat_refund(key, now, L, P, c, s1)
