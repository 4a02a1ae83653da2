-- refund.lua -- give back what a decision charged (a later stage refused the message, say).
--
-- The memory store's refund (src/store/store.h): per window TAT -= cost*T, never below
-- now -- a refund cancels a charge, it never grants credit beyond an idle key.  The caller
-- passes only the items the decision charged.
--
-- KEYS: one per (item, window), in item order then window order.
-- ARGV: now ("" for the server's TIME), n items; then per item: cost, nwin; then per
--   window: T (ns).
-- Reply: the number of keys changed.
--
-- Times are decimal ns strings handled as (seconds, nanoseconds), arithmetic on
-- differences from now, as in gcra.lua (exact below 2^53 ns).  Invariant kept: a key holds
-- a TAT only while it is ahead of now; one that would fall to now or below is deleted,
-- and one that stays gets the PX gcra.lua gives (TAT - now, rounded up to ms, plus 1 s).

local SCRIPT, DIGITS_MAX = 'refund.lua', 20
--@include digits.lua
--@include ns.lua

if ARGV[1] == '' then
	now_s, now_n = server_now()
else
	now_s, now_n = split_ns(digits(ARGV[1], 'now'))
end

local n = tonumber(digits(ARGV[2], 'item count'))
local a, k, changed = 3, 1, 0
for i = 1, n do
	local cost = tonumber(digits(ARGV[a], 'cost'))
	local nwin = tonumber(digits(ARGV[a + 1], 'window count'))
	a = a + 2
	for j = 1, nwin do
		local key = KEYS[k]
		if not key then
			error('refund.lua: fewer keys than windows')
		end
		local t = tonumber(digits(ARGV[a], 'T'))
		a, k = a + 1, k + 1
		local tat = redis.call('GET', key)
		-- cost 0 charged nothing, and a TAT at or before now owes nothing
		if tat and cost > 0 then
			local s, ns = split_ns(digits(tat, 'stored TAT'))
			local rel = (s - now_s) * 1e9 + (ns - now_n)
			if rel > 0 then
				rel = rel - cost * t
				if rel <= 0 then
					redis.call('DEL', key)
				else
					redis.call('SET', key, tat_string(rel), 'PX',
						string.format('%.0f', div_ceil(rel, 1e6) + 1000))
				end
				changed = changed + 1
			end
		end
	end
end
if KEYS[k] then
	error('refund.lua: more keys than windows')
end
return changed
