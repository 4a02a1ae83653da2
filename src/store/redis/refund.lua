-- refund.lua -- give back what a decision charged (a later stage refused the message, say).
--
-- The memory store's refund (src/store/store.h): per window TAT -= cost*T, never below
-- now -- a refund cancels a charge, it never grants credit beyond an idle key.  The caller
-- passes only the items the decision charged.
--
-- KEYS: one per item: the item's (rule, key), holding the TATs of its windows separated
--   by spaces (gcra.lua).
-- ARGV: now ("" for the server's TIME), n items; then per item: cost, nwin; then per
--   window: T (ns).
-- Reply: the number of windows changed.
--
-- Times are decimal ns strings handled as (seconds, nanoseconds), arithmetic on
-- differences from now, as in gcra.lua (exact below 2^53 ns).  Invariant kept: a key holds
-- TATs only while one is ahead of now; one whose every TAT would fall to now or below is
-- deleted, and one that stays gets the PX gcra.lua gives (its last TAT - now, rounded up
-- to ms, plus 1 s).

local SCRIPT, DIGITS_MAX = 'refund.lua', 20
--@include digits.lua
--@include ns.lua

if ARGV[1] == '' then
	now_s, now_n = server_now()
else
	now_s, now_n = split_ns(digits(ARGV[1], 'now'))
end

local n = tonumber(digits(ARGV[2], 'item count'))
local a, changed = 3, 0
for i = 1, n do
	local key = KEYS[i]
	if not key then
		error('refund.lua: fewer keys than items')
	end
	local cost = tonumber(digits(ARGV[a], 'cost'))
	local nwin = tonumber(digits(ARGV[a + 1], 'window count'))
	a = a + 2
	local v = redis.call('GET', key)
	local next_tat = v and string.gmatch(v, '%S+')
	local tats, longest, any = {}, 0, false
	for j = 1, nwin do
		local t = tonumber(digits(ARGV[a], 'T'))
		a = a + 1
		local tat = next_tat and next_tat()
		local rel = 0
		if tat then
			local s, ns = split_ns(digits(tat, 'stored TAT'))
			rel = (s - now_s) * 1e9 + (ns - now_n)
		end
		-- cost 0 charged nothing, and a TAT at or before now owes nothing
		if rel > 0 and cost > 0 then
			rel = rel - cost * t
			changed = changed + 1
			any = true
		end
		if rel < 0 then
			rel = 0
		end
		tats[j], rel = tat_string(rel)
		if rel > longest then
			longest = rel
		end
	end
	-- a block's end after the windows (gcra.lua) stays while it is ahead
	local block = next_tat and next_tat()
	if block then
		local s, ns = split_ns(digits(block, 'stored block'))
		local rel = (s - now_s) * 1e9 + (ns - now_n)
		if rel > 0 then
			tats[nwin + 1] = block
			if rel > longest then
				longest = rel
			end
		end
	end
	if any then
		if longest <= 0 then
			redis.call('DEL', key)
		else
			redis.call('SET', key, table.concat(tats, ' '), 'PX',
				string.format('%.0f', div_ceil(longest, 1e6) + 1000))
		end
	end
end
if KEYS[n + 1] then
	error('refund.lua: more keys than items')
end
return changed
