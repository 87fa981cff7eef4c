-- What batch.lua and slot.lua share, after the algorithms' functions: the plan and
-- the time, the check of every limit, and the charge of each.

-- The plans of recent calls, parsed (see begin). A library loaded by FUNCTION LOAD keeps
-- this table from one call to the next, so a plan is parsed once and a call costs a table
-- lookup (the plan, a string argument, arrives interned: its lookup hashes nothing more);
-- run by EVALSHA, the script builds it anew, and parses the plan of each call.
local plans, planned = {}, 0

-- A text of the plan written as its length, ':' and itself, at `at`: the text and where
-- the plan goes on.
local function text_at(s, at)
  local colon = string.find(s, ':', at, true)
  local stop = colon + tonumber(string.sub(s, at, colon - 1))
  return string.sub(s, colon + 1, stop), stop + 1
end

-- A figure of a plan: most are 0 (no warm-up, wait, lockout, calendar), taken without
-- parsing, as parsing a number is among the dearest steps of a call run by EVALSHA, which
-- parses its plan each time.
local function figure(x)
  if x == '0' then return 0 end
  return tonumber(x)
end

-- The plan `s` (see contract.py) as a table: version_key, stats, now_at and token_at (the
-- ARGV index of the call's time and token, nil when the call sends none), carry_at (where
-- the carried counts start) and per limit i a spec: alg, its check and commit functions,
-- L, P, B, c, W (warm-up), mw (max wait), lockout (µs), shadow and refund (booleans),
-- field_at (the ARGV index of the client's field, window algorithms only) and, for a
-- calendar window, edge (the boundary between the two windows the call carries), before
-- and after (each a window {start, end}).
local function parse_plan(s)
  local p, o = {}, 2
  if string.sub(s, 1, 1) == '1' then p.now_at, o = o, o + 1 end
  if string.sub(s, 2, 2) == '1' then p.token_at, o = o, o + 1 end
  local at
  p.version_key, at = text_at(s, 3)
  p.stats, at = text_at(s, at)
  local i = 0
  while at <= #s do
    -- v: where the spec starts and ends, then its values (at the offsets SPEC_*)
    local v = {string.find(s, SPEC_PATTERN, at)}
    local alg, field_at = v[SPEC_ALGORITHM], nil
    local check, commit = functions_of(alg)
    if WINDOWED[alg] then field_at, o = o, o + 1 end
    local spec = {alg = alg, check = check, commit = commit, field_at = field_at,
      L = tonumber(v[SPEC_LIMIT]), P = tonumber(v[SPEC_PERIOD_US]),
      B = figure(v[SPEC_BURST]), c = figure(v[SPEC_COST]),
      W = figure(v[SPEC_WARMUP_US]), mw = figure(v[SPEC_WAIT_US]),
      lockout = figure(v[SPEC_LOCKOUT_US]), shadow = v[SPEC_SHADOW] == '1',
      refund = v[SPEC_STAGE] == STAGE_REFUND}
    local edge = figure(v[SPEC_CAL1])
    if edge ~= 0 then
      spec.edge, spec.before, spec.after =
        edge, {tonumber(v[SPEC_CAL0]), edge}, {edge, tonumber(v[SPEC_CAL2])}
    end
    i, at = i + 1, v[2] + 1
    p[i] = spec
  end
  p.carry_at = o
  return p
end

-- The call's plan, its time (µs: its own, or the server's clock when it sends none) and
-- its token ('' when it sends none): what batch.lua and slot.lua start with, in one
-- function, as each call of a Lua function costs about a tenth of a GET.
local function begin(argv)
  local s = argv[1]
  local plan = plans[s]
  if not plan then
    plan = parse_plan(s)
    if planned >= PLANS_KEPT then plans, planned = {}, 0 end
    plans[s], planned = plan, planned + 1
  end
  local now, at = nil, plan.now_at
  if at then
    now = tonumber(argv[at])
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * US + tonumber(t[2])
  end
  at = plan.token_at
  if at then return plan, now, argv[at] end
  return plan, now, ''
end

-- A calendar window's limit: the window, of the two its call carries, that holds `now`
-- (nil for any other limit).
local function window_of(spec, now)
  local edge = spec.edge
  if not edge then return nil end
  if now >= edge then return spec.after end
  return spec.before
end

-- A client a lockout holds (its lock, at <key>:x<field>, says until when, in µs): refused
-- until then, whatever its count says. r is its check.
local function locked(key, now, r)
  local til = tonumber(redis.call('GET', key))
  if til and til > now then
    local left = til - now
    local out = {0, 0, math.max(r[3], left), left, 0}
    out.locked = true
    return out
  end
  return r
end

-- The checks' answers of a call, kept for its charges: one table that each call of a
-- library fills again (EVALSHA: one per call), as an allocation is among the dearer
-- steps of a call. Entries past the call's limits are left over from others: unread.
local checks = {}

-- Check every limit of the call, writing nothing: each check's answer, and 1 when every
-- enforced limit admits (a shadow limit never refuses, nor does a refund), else 0.
local function check_all(keys, argv, now, plan)
  local admitted = 1
  for i = 1, #plan do
    local s = plan[i]
    local r
    if s.refund then
      r = {1, 0, 0, 0, 0}  -- a reservation taken back is not checked, and refuses nothing
    else
      -- the client's field in its shard's hashes ('' for a key of its own), and
      -- window_of() written out: a call of a Lua function costs more than its work
      local f, cal, at, edge = '', nil, s.field_at, s.edge
      if at then f = argv[at] end
      if edge then
        if now >= edge then cal = s.after else cal = s.before end
      end
      r = s.check(keys[i], f, now, s.L, s.P, s.B, s.c, s.mw, cal)
      if s.W > 0 then r = warm_check(keys[i], now, s.L, s.P, s.B, s.c, s.W, s.mw, r) end
      if s.lockout > 0 then r = locked(keys[i] .. ':x' .. f, now, r) end
      if r[1] == 0 and not s.shadow then admitted = 0 end
    end
    checks[i] = r
  end
  return checks, admitted
end

-- Take back the c units a reservation charged at `now` (the reservation's own time): from
-- the window it counted in (a plain sum: exact whatever was counted since), from the log
-- (units of that time), from a bucket whose refill time is still the reservation's (else
-- another request refilled it since, and the cap may have absorbed them: the charge
-- stays, under-admitting, never over), or from a GCRA arrival time (the caller takes
-- back only while the units cannot have been released meanwhile, see settling.py).
local function unreserve(key, f, now, spec)
  local alg, L, P, B, c = spec.alg, spec.L, spec.P, spec.B, spec.c
  if alg == 'fixed_window' or alg == 'sliding_window' then
    local win, cal = math.floor(now / P), window_of(spec, now)
    if cal then win = cal[1] / US end
    local k = window_key(key, win)
    if (tonumber(redis.call('HGET', k, f)) or 0) >= c then redis.call('HINCRBY', k, f, -c) end
  elseif alg == 'sliding_log' then
    local names = redis.call('ZRANGEBYSCORE', key, now, now, 'LIMIT', 0, c)
    if #names > 0 then redis.call('ZREM', key, unpack(names)) end
  elseif alg == 'token_bucket' then
    local s = redis.call('HMGET', key, 't', 'ts')
    if s[1] and tonumber(s[2]) == now then
      redis.call('HSET', key, 't', math.min(B, tonumber(s[1]) + c))
    end
  elseif alg == 'gcra' then
    local tat = tonumber(redis.call('GET', key))
    if tat then
      tat = tat - c * P / L
      if tat <= now then redis.call('DEL', key) else redis.call('SET', key, tat, 'KEEPTTL') end
    end
  end
end

-- Charge limit i (its check's answer r, its spec s) when the call is admitted and the
-- limit admits; returns the counter's field for it, and whether it wrote: a (admitted
-- and charged, a reservation too), o (admitted but not charged: another limit refused
-- the call; or a reservation taken back), w (a shadow limit's would-be refusal) or r
-- (refused: its lockout, if it has one, starts).
local function charge(keys, argv, i, now, r, admitted, token, s)
  local c, f, at = s.c, '', s.field_at
  if at then f = argv[at] end  -- the client's field, as check_all reads it
  if s.refund then
    unreserve(keys[i], f, now, s)
    return 'o', false
  end
  if r[1] == 1 and admitted == 1 then
    s.commit(keys[i], f, now, s.L, s.P, s.B, c, r, token)
    if r.wn then warm_commit(keys[i], r) end
    return 'a', true
  elseif r[1] == 1 then
    r[2] = r[2] + c  -- not charged: the units it would have taken are still there
    return 'o', false
  elseif s.shadow then
    return 'w', false
  end
  local lockout = s.lockout
  if lockout > 0 and not r.locked then
    redis.call('SET', keys[i] .. ':x' .. f, num_arg(now + lockout), 'PX',
      ttl_ms(lockout))
    r[3], r[4] = math.max(r[3], lockout), math.max(r[4], lockout)
  end
  return 'r', false
end
