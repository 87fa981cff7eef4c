-- Bump the policy version: INCR, except that a missing key (a store flushed, or restarted
-- without its data) starts from the clock in microseconds, not from 0. A process
-- reloads its policies when the version differs from its snapshot's: a counter that
-- restarted at 0 would hand out again numbers processes still hold, and they would miss
-- the edits those numbers now announce. The clock has moved on since the lost numbers
-- were handed out (one per edit, each far more than a microsecond apart), so the new ones
-- are above them all. KEYS: the version key. ARGV[1], when given: the caller's time (µs),
-- for a server that refuses TIME in scripts; else the server's clock. Returns the new
-- version.
if redis.call('EXISTS', KEYS[1]) == 0 then
  local now = ARGV[1]
  if not now then
    local t = redis.call('TIME')
    now = t[1] .. string.format('%06d', tonumber(t[2]))
  end
  redis.call('SET', KEYS[1], now)
end
return redis.call('INCR', KEYS[1])
