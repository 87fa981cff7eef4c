-- The least a GCRA decision can cost in Redis: server time, one GET, one SET with a TTL.
-- Baseline for bench/capacity.py; not used by the app.
-- KEYS[1]: the client's key. ARGV: limit, period_us, burst, cost.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local T = tonumber(ARGV[2]) / tonumber(ARGV[1])
local burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new = tat + cost * T
if new - burst * T > now then
  return 0
end
local ttl = math.ceil((new - now) / 1000)
if ttl < 1 then ttl = 1 end
redis.call('SET', KEYS[1], string.format('%.17g', new), 'PX', ttl)
return 1
