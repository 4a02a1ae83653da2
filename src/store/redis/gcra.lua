-- gcra.lua -- one atomic GCRA decision over a batch of items, for the Redis store.
--
-- The same rules as the memory store (src/store/store.h), so that a rule decides the same
-- way whichever store holds its state; tests/cases/store.cases is run against both.  A
-- script runs alone on the server, so no other decision sees a state between the check
-- and the charge of a batch.
--
-- KEYS: one per (item, window), in item order then window order.
-- ARGV: mode ("check" | "peek"), now, n items; then per item: cost, flags, nwin; then
--   per window: T (the emission interval in ns, ceil(period / count)), burst.
--   flags: 1 = blocking (its refusal refuses the event), 2 = count rejected (charged
--   even when the event is refused).
-- Reply: { pass, then per item: ok, charged, retry_ns (a decimal string), used per window }.
--
-- Times.  now and the stored TATs are decimal strings of ns since the epoch ("" for now:
-- the server's TIME).  They exceed 2^53, past which Lua's doubles round, so they are
-- split into seconds and nanoseconds and all arithmetic is on differences from now.
-- Those are exact below 2^53 ns (104 days): cost*T, burst*T and TAT - now of every
-- limit up to a few months.  XXX: past that the doubles round -- by a few ns at 10^16 ns
-- (one per 366 days, say) -- where the memory store's 128-bit arithmetic stays exact;
-- both saturate a TAT or a retry at 2^64 - 1 ns.
--
-- Invariants: a key holds a TAT only while it is ahead of now (its PX ends one second
-- after the TAT passes, when it says nothing); this script writes a TAT only as
-- max(TAT, now) + cost*T, in a decision that charged (refund.lua only lowers one).

-- Arguments come from sluiced, which formats them; a decision runs this script for every
-- SMTP event, so they are checked with tonumber alone (a pattern match per argument cost
-- as much as the decision itself).
local function num(s, what)
	local v = tonumber(s)
	if not v or v < 0 then
		error('gcra.lua: ' .. what .. ' is not a decimal integer: ' .. tostring(s))
	end
	return v
end

local sub = string.sub

--@include ns.lua

local arg_now = ARGV[2]
if arg_now == '' then
	now_s, now_n = server_now()
else
	local l = #arg_now
	if l > 9 then
		now_s, now_n = num(sub(arg_now, 1, l - 9), 'now'), num(sub(arg_now, l - 8), 'now')
	else
		now_s, now_n = 0, num(arg_now, 'now')
	end
end

-- TAT - now, in ns (a missing key is TAT = now).
local function ahead_of(tat)
	if not tat then
		return 0
	end
	local s, n = split_ns(tat)
	if not s or not n then
		error('gcra.lua: stored TAT is not a decimal integer: ' .. tat)
	end
	return (s - now_s) * 1e9 + (n - now_n)
end

-- A whole double >= 0 in decimal, saturating at 2^64 - 1 as the memory store does
-- ('%d' goes through a C long and is wrong past 2^63; '%.0f' prints a whole double
-- exactly).
local function u64_string(x)
	if x >= 18446744073709551616 then
		return U64_MAX
	end
	return string.format('%.0f', x)
end

local function used_at(rel, t)
	if rel > 0 and t > 0 then
		return div_ceil(rel, t)
	end
	return 0
end

local mode = ARGV[1]
if mode ~= 'check' and mode ~= 'peek' then
	error('gcra.lua: mode is neither check nor peek: ' .. tostring(mode))
end
local n = num(ARGV[3], 'item count')

-- Read and decide every window before anything is written.
local items = {}
local a, k = 4, 1
local pass = true
for i = 1, n do
	local it = {
		cost = num(ARGV[a], 'cost'),
		flags = num(ARGV[a + 1], 'flags'),
		ok = true,
		retry = 0,
		win = {},
	}
	local nwin = num(ARGV[a + 2], 'window count')
	a = a + 3
	local c = it.cost
	if c == 0 then
		c = 1 -- cost 0 asks "is there room at all": checked as 1, charges nothing
	end
	for j = 1, nwin do
		local key = KEYS[k]
		if not key then
			error('gcra.lua: fewer keys than windows')
		end
		local t = num(ARGV[a], 'T')
		local burst = num(ARGV[a + 1], 'burst')
		a, k = a + 2, k + 1
		local ahead = ahead_of(redis.call('GET', key) or nil)
		if ahead < 0 then
			ahead = 0 -- base = max(TAT, now)
		end
		-- conforms iff ahead + c*T <= burst*T; compared as ahead <= (burst - c)*T so
		-- that no product exceeds the burst's
		local retry
		if c <= burst then
			retry = ahead - (burst - c) * t
		else
			retry = ahead + (c - burst) * t
		end
		if retry > 0 then
			it.ok = false
			if retry > it.retry then
				it.retry = retry
			end
		end
		it.win[j] = { key = key, t = t, ahead = ahead }
	end
	if not it.ok and bit.band(it.flags, 1) ~= 0 then
		pass = false
	end
	items[i] = it
end
if KEYS[k] then
	error('gcra.lua: more keys than windows')
end

local reply = { pass and 1 or 0 }
for i = 1, n do
	local it = items[i]
	local charged = mode == 'check' and it.ok and (pass or bit.band(it.flags, 2) ~= 0)
	reply[#reply + 1] = it.ok and 1 or 0
	reply[#reply + 1] = charged and 1 or 0
	reply[#reply + 1] = u64_string(it.retry)
	for j = 1, #it.win do
		local w = it.win[j]
		local rel = w.ahead
		if charged and it.cost > 0 then
			local tat
			tat, rel = tat_string(rel + it.cost * w.t)
			-- the key lives until its TAT has passed, and a second more for the nodes
			-- whose clocks (which give now) run up to a second behind this caller's
			redis.call('SET', w.key, tat, 'PX', string.format('%.0f', div_ceil(rel, 1e6) + 1000))
		end
		reply[#reply + 1] = used_at(rel, w.t)
	end
end
return reply
