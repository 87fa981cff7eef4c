-- Redis Cluster: give back what slot.lua charged, because another slot of the same
-- request refused it. ARGV: now_us (the charge's time, as slot.lua returned it), token,
-- then per key: algorithm, limit, period_us, burst, cost, s1, s2 (what the charge wrote),
-- field (the client's field of a window algorithm). KEYS: one base key per charged
-- limit, then the window hashes (s1) their charges wrote in.
local now, token = tonumber(ARGV[1]), ARGV[2]
local o = 2
for i = 1, (#ARGV - REFUND_HEAD) / REFUND_PER do
  refund(ARGV[o + 1], KEYS[i], ARGV[o + 8], now, tonumber(ARGV[o + 2]),
    tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5]), token, ARGV[o + 6],
    ARGV[o + 7])
  o = o + 8
end
return 1
