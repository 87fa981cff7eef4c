-- wrk: every request from one of 1,000 clients, named in X-Forwarded-For (the bench's
-- settings trust 127.0.0.1 as the proxy), so per-IP policies and DRF's throttles see many
-- clients, as on a site behind a load balancer.
local clients = 1000

request = function()
  local n = math.random(0, clients - 1)
  local ip = "10.1." .. math.floor(n / 250) .. "." .. (n % 250 + 1)
  return wrk.format("GET", nil, {["X-Forwarded-For"] = ip, ["Accept"] = "application/json"})
end
