-- Tokens refill at L per P up to B; a request takes `cost` tokens.
--[[check]]
local s = redis.call('HMGET', key, 't', 'ts')
local tokens, ts = B, now
if s[1] then
  tokens, ts = tonumber(s[1]), tonumber(s[2])
  if now > ts then
    tokens = math.min(B, tokens + (now - ts) * L / P)
    ts = now
  end
end
if tokens + TOKEN_EPS + mw * L / P >= c then
  -- with a max_wait (mw) the tokens may go below zero: a turn reserved ahead
  local after = tokens - c
  local delay = 0
  if tokens + TOKEN_EPS < c then delay = math.ceil((c - tokens) * P / L) end
  return {1, floor0(after), math.ceil((B - after) * P / L), 0, delay, after, ts}
end
return {0, floor0(tokens), math.ceil((B - tokens) * P / L),
        math.ceil((c - tokens) * P / L - mw), 0}
--[[commit]]
redis.call('HSET', key, 't', num_arg(r[6]), 'ts', num_arg(r[7]))
redis.call('PEXPIRE', key, ttl_ms(r[3]))
--[[refund]]
-- s1, s2: the tokens and time the charge stored. Only while the bucket still holds them
-- is adding the tokens back exact; once another request refilled it in between, the cap
-- may already have absorbed them, so the charge stays (under-admission, never over).
-- Compared as numbers: the server wrote them as text in its own way (Redis 7 with
-- %.17g, Valkey 8 the shortest text that reads back the same), not as fmt did.
local s = redis.call('HMGET', key, 't', 'ts')
if s[1] and tonumber(s[1]) == tonumber(s1) and tonumber(s[2]) == tonumber(s2) then
  redis.call('HSET', key, 't', math.min(B, tonumber(s1) + c))
end
