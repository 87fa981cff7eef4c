-- Keep the slots of requests still running: per key, drop the slots already expired
-- (reclaimed: they must not come back), push the expiry of the named ones still held
-- (XX: a released slot stays gone; GT: never shortened), and keep the key alive as long.
-- ARGV: now_us ('' = server time), then per key: period_us, member count, members.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local o = 2
for i = 1, #KEYS do
  local key, period, n = KEYS[i], tonumber(ARGV[o]), tonumber(ARGV[o + 1])
  local score = fmt(now + period)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  local args = {}
  for j = 1, n do
    args[#args + 1] = score
    args[#args + 1] = ARGV[o + 1 + j]
  end
  if redis.call('ZADD', key, 'XX', 'GT', 'CH', unpack(args)) > 0 then
    redis.call('PEXPIRE', key, ttl_ms(period), 'GT')
  end
  o = o + 2 + n
end
return 1
