-- Uniform outflow of one unit per P/L. The state is the time the queue drains. A request
-- is admitted, with a delay until its turn, when at most B units wait ahead of it.
--[[check]]
local T = P / L
local tat = tonumber(redis.call('GET', key)) or now
if tat < now then tat = now end
local wait = tat - now
if wait <= B * T + mw + EPS then  -- a max_wait (mw) lengthens the queue by that time
  local after = tat + c * T
  return {1, floor0((B * T - (after - now)) / T + 1), math.ceil(after - now), 0,
          math.ceil(wait), after}
end
return {0, 0, math.ceil(wait), math.ceil(wait - B * T - mw), 0}
--[[commit]]
redis.call('SET', key, num_arg(r[6]), 'PX', ttl_ms(r[3]))
--[[refund]]
tat_refund(key, now, L, P, c, s1)
