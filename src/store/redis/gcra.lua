-- gcra.lua -- atomic GCRA decisions for the Redis store: one or several decisions, each
-- over a batch of items, in one script call.
--
-- The same rules as the memory store (src/store/store.h), so that a rule decides the same
-- way whichever store holds its state; tests/cases/store.cases is run against both.  A
-- script runs alone on the server, so no other decision sees a state between the check
-- and the charge of a batch; the decisions of one call are taken in order, each seeing
-- what the ones before it charged.
--
-- KEYS: per item, over every decision of the call in order: the item's (rule, key), which
--   holds the TATs of all its windows, in the windows' order, separated by spaces; for a
--   distinct item (flag 4) then its values' sorted set (member "J:VALUE", score the
--   expiry in ms of VALUE in window J).
-- ARGV: now, D (the number of decisions); then per decision: mode ("check" | "peek"),
--   n items; then per item: cost, flags, nwin, [VALUE if flag 4], [block_ns if flag 8];
--   then per window: T (the emission interval in ns, ceil(period / count)), burst, and
--   with flag 4 the window's period in ms.
--   flags: 1 = blocking (its refusal refuses the decision), 2 = count rejected (charged
--   even when the decision is refused), 4 = distinct (a window that remembers VALUE
--   costs 0 and is not checked), 8 = block: the key's value may end with one more time
--   after its windows' TATs, when its block ends; while that is ahead the item is over;
--   a check that finds it over with no block running starts one of block_ns.
-- Reply: per decision { pass, then per item: ok, charged, retry_ns (a decimal string),
--   used per window, with flag 4 known (1: VALUE is remembered in every window), with
--   flag 8 blocked (1: a block was running) }, all decisions one after the other in one
--   flat array.
--
-- Cost on the server: TIME and one MGET for the whole call, then one SET per key
-- charged; a call of many decisions pays the script's own overhead once.
--
-- Times.  now and the stored TATs are decimal strings of ns since the epoch ("" for now:
-- the server's TIME).  They exceed 2^53, past which Lua's doubles round, so they are
-- split into seconds and nanoseconds and all arithmetic is on differences from now.
-- Those are exact below 2^53 ns (104 days): cost*T, burst*T and TAT - now of every
-- limit up to a few months.  XXX: past that the doubles round -- by a few ns at 10^16 ns
-- (one per 366 days, say) -- where the memory store's 128-bit arithmetic stays exact;
-- both saturate a TAT or a retry at 2^64 - 1 ns.
--
-- Invariants: a key holds TATs only while one of them is ahead of now (its PX ends one
-- second after the last passes, when it says nothing); this script writes a TAT only as
-- max(TAT, now) + cost*T, in a decision that charged, or raises one to a block's end
-- (refund.lua only lowers one).  A values' set holds no member past its score for long:
-- every write first drops the expired ones, and the set expires with its last member.

-- Arguments come from sluiced, which formats them; a decision runs this script for every
-- SMTP event, so they are checked with tonumber alone (a pattern match per argument cost
-- as much as the decision itself).
local function num(s, what)
	local v = s and tonumber(s)
	if not v or v < 0 then
		error('gcra.lua: ' .. what .. ' is not a decimal integer: ' .. tostring(s))
	end
	return v
end

local sub = string.sub

--@include ns.lua

local arg_now = ARGV[1]
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

-- TAT - now, in ns (a missing TAT is TAT = now).
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

-- The values of every key, read once; a key's entry follows the writes of this call.
local cur = {}
if #KEYS > 0 then
	local got = redis.call('MGET', unpack(KEYS))
	for i = 1, #KEYS do
		cur[KEYS[i]] = got[i]
	end
end

-- Every argument is read and checked before anything is written: a script that fails
-- half-way keeps what it wrote.
local D = num(ARGV[2], 'decision count')
local dmode, dn = {}, {}
local icost, iflags, inwin, ivalue, iblock, ikey = {}, {}, {}, {}, {}, {}
local wt, wburst, wperiod = {}, {}, {}
local a, ni, nw, nk = 3, 0, 0, 0
for d = 1, D do
	local mode = ARGV[a]
	if mode ~= 'check' and mode ~= 'peek' then
		error('gcra.lua: mode is neither check nor peek: ' .. tostring(mode))
	end
	local n = num(ARGV[a + 1], 'item count')
	dmode[d], dn[d] = mode, n
	a = a + 2
	for i = 1, n do
		ni = ni + 1
		local flags = num(ARGV[a + 1], 'flags')
		icost[ni], iflags[ni] = num(ARGV[a], 'cost'), flags
		local nwin = num(ARGV[a + 2], 'window count')
		inwin[ni] = nwin
		a = a + 3
		nk = nk + 1
		ikey[ni] = nk
		local distinct = bit.band(flags, 4) ~= 0
		if distinct then
			local v = ARGV[a]
			if not v or v == '' then
				error('gcra.lua: a distinct item without a value')
			end
			ivalue[ni] = v
			nk = nk + 1
			a = a + 1
		end
		if bit.band(flags, 8) ~= 0 then
			iblock[ni] = num(ARGV[a], 'block')
			a = a + 1
		end
		for j = 1, nwin do
			nw = nw + 1
			wt[nw], wburst[nw] = num(ARGV[a], 'T'), num(ARGV[a + 1], 'burst')
			a = a + 2
			if distinct then
				wperiod[nw] = num(ARGV[a], 'period')
				a = a + 1
			end
		end
	end
end
if ARGV[a] then
	error('gcra.lua: more arguments than windows')
end
if nk > #KEYS then
	error('gcra.lua: fewer keys than items')
elseif nk < #KEYS then
	error('gcra.lua: more keys than items')
end
local now_ms = now_s * 1000 + math.floor(now_n / 1e6)

local reply, nr = {}, 0
local dirty, dirty_keys, ndirty = {}, {}, 0  -- keys charged: the longest TAT - now of each
local k, w = 1, 1
-- per item of the decision at hand: ok, retry, its windows' TAT - now (flat, reused)
local iok, iretry, wahead, wcost, iknown, iblocked = {}, {}, {}, {}, {}, {}
for d = 1, D do
	local n, first_item, first_win = dn[d], k, w
	-- Read and decide every window of the decision before anything is written.
	local pass = true
	for x = first_item, first_item + n - 1 do
		local cost, nwin = icost[x], inwin[x]
		local c = cost
		if c == 0 then
			c = 1 -- cost 0 asks "is there room at all": checked as 1, charges nothing
		end
		local v = cur[KEYS[ikey[x]]]
		local pos = 1
		local ok, worst = true, 0
		iblocked[x] = false
		local value = ivalue[x]
		if value then
			iknown[x] = true
		end
		for j = 1, nwin do
			local t, burst = wt[w], wburst[w]
			-- a window that remembers the value costs nothing and is not checked
			local remembered = false
			if value then
				local sc = redis.call('ZSCORE', KEYS[ikey[x] + 1], j .. ':' .. value)
				remembered = sc and tonumber(sc) > now_ms
				if not remembered then
					iknown[x] = false
				end
			end
			wcost[w] = remembered and 0 or cost
			local ahead = 0
			if v then
				local tat
				if nwin == 1 and not string.find(v, ' ', 1, true) then
					tat, pos = v, #v + 1
				else
					local e = string.find(v, ' ', pos, true)
					if e then
						tat, pos = sub(v, pos, e - 1), e + 1
					elseif pos <= #v then
						tat, pos = sub(v, pos), #v + 1
					end
				end
				if tat then
					ahead = ahead_of(tat)
					if ahead < 0 then
						ahead = 0 -- base = max(TAT, now)
					end
				end
			end
			-- conforms iff ahead + c*T <= burst*T; compared as ahead <= (burst - c)*T
			-- so that no product exceeds the burst's
			local retry
			if remembered then
				retry = 0
			elseif c <= burst then
				retry = ahead - (burst - c) * t
			else
				retry = ahead + (c - burst) * t
			end
			if retry > 0 then
				ok = false
				if retry > worst then
					worst = retry
				end
			end
			wahead[w] = ahead
			w = w + 1
		end
		-- a block's end follows the windows' TATs: while it is ahead, the item is over
		if iblock[x] and v and pos <= #v then
			local left = ahead_of(sub(v, pos))
			if left > 0 then
				iblocked[x] = true
				ok = false
				if left > worst then
					worst = left
				end
			end
		end
		iok[x], iretry[x] = ok, worst
		if not ok and bit.band(iflags[x], 1) ~= 0 then
			pass = false
		end
	end
	nr = nr + 1
	reply[nr] = pass and 1 or 0
	local mode = dmode[d]
	w = first_win
	for x = first_item, first_item + n - 1 do
		local ok, cost = iok[x], icost[x]
		local charged = mode == 'check' and ok and (pass or bit.band(iflags[x], 2) ~= 0)
		-- a block starts when a check finds the item over and no block running; the
		-- refusal that starts it says how long it lasts
		local block = mode == 'check' and not ok and iblock[x] and not iblocked[x] and
			iblock[x] or nil
		local retry = iretry[x]
		if block and block > retry then
			retry = block
		end
		reply[nr + 1] = ok and 1 or 0
		reply[nr + 2] = charged and 1 or 0
		reply[nr + 3] = ok and '0' or u64_string(retry)
		nr = nr + 3
		local value = ivalue[x]
		local remember = value and mode == 'check' and ok and
			(charged or (pass and iknown[x]))
		local write = block or (charged and cost > 0)
		local v, longest = nil, 0
		local vkey = value and KEYS[ikey[x] + 1]
		if remember then
			redis.call('ZREMRANGEBYSCORE', vkey, '-inf', now_ms)
		end
		local vlongest = 0
		for j = 1, inwin[x] do
			local t, rel = wt[w], wahead[w]
			if write then
				-- a block leaves the windows as they are (rel: max(TAT, now) - now)
				local tat
				tat, rel = tat_string(block and rel or rel + wcost[w] * t)
				v = v and (v .. ' ' .. tat) or tat
				if rel > longest then
					longest = rel
				end
			end
			if remember then
				local p = wperiod[w]
				redis.call('ZADD', vkey, string.format('%.0f', now_ms + p), j .. ':' .. value)
				if p > vlongest then
					vlongest = p
				end
			end
			w = w + 1
			nr = nr + 1
			reply[nr] = (rel > 0 and t > 0) and div_ceil(rel, t) or 0
		end
		if value then
			nr = nr + 1
			reply[nr] = iknown[x] and 1 or 0
		end
		if iblock[x] then
			nr = nr + 1
			reply[nr] = iblocked[x] and 1 or 0
		end
		if block then
			local tat, rel = tat_string(block)
			v = v .. ' ' .. tat
			if rel > longest then
				longest = rel
			end
		end
		if remember and redis.call('PTTL', vkey) < vlongest + 1000 then
			redis.call('PEXPIRE', vkey, string.format('%.0f', vlongest + 1000))
		end
		if write then
			local key = KEYS[ikey[x]]
			cur[key] = v
			if not dirty[key] then
				ndirty = ndirty + 1
				dirty_keys[ndirty] = key
			end
			dirty[key] = longest
		end
	end
	k = first_item + n
end
-- Each key charged is written once, with what the last decision left in it: a hot key
-- (a domain) charged by many decisions of the call costs one SET.  It lives until its
-- last TAT has passed, and a second more for the nodes whose clocks (which give now) run
-- up to a second behind this caller's.
for i = 1, ndirty do
	local key = dirty_keys[i]
	redis.call('SET', key, cur[key], 'PX', div_ceil(dirty[key], 1e6) + 1000)
end
return reply
