-- Helpers of the refund bodies (Redis Cluster only: placed after prelude.lua in the
-- refund script, never in the batch script).

local function remove_members(key, token, cost)
  local names = {}
  for i = 1, cost do
    names[#names + 1] = token .. ':' .. i
    if #names >= 200 then
      redis.call('ZREM', key, unpack(names))
      names = {}
    end
  end
  if #names > 0 then redis.call('ZREM', key, unpack(names)) end
end

local function tat_refund(key, now, L, P, c, written)
  -- A later request may have found the TAT in the past and restarted it from its own
  -- time; moving such a TAT back would give away capacity this request never took. So
  -- the TAT moves back only while it is still the one this charge wrote, and never below
  -- now (a TAT in the past is an idle key).
  -- (compared as numbers: see the token bucket's refund)
  local stored = redis.call('GET', key)
  if not stored or tonumber(stored) ~= tonumber(written) then return end
  local tat = tonumber(written) - c * P / L
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, tat, 'KEEPTTL')
  end
end
