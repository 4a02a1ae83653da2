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

local function digits(s, what)
	if type(s) ~= 'string' or not string.find(s, '^%d+$') or #s > 20 then
		error('refund.lua: ' .. what .. ' is not a decimal integer: ' .. tostring(s))
	end
	return s
end

local function split_ns(s)
	local n = #s
	if n > 9 then
		return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
	end
	return 0, tonumber(s)
end

local now_s, now_n
if ARGV[1] == '' then
	local t = redis.call('TIME')
	now_s, now_n = tonumber(t[1]), tonumber(t[2]) * 1000
else
	now_s, now_n = split_ns(digits(ARGV[1], 'now'))
end

local function div_ceil(a, b)
	local q = math.floor(a / b)
	local r = a - q * b
	while r < 0 do
		q, r = q - 1, r + b
	end
	while r >= b do
		q, r = q + 1, r - b
	end
	if r > 0 then
		q = q + 1
	end
	return q
end

-- now + rel for 0 < rel, below the TAT it came from (so below 2^64 ns)
local function tat_string(rel)
	local r = math.fmod(rel, 1e9)
	local q = math.floor((rel - r) / 1e9 + 0.5)
	local s, n = now_s + q, now_n + r
	if n >= 1e9 then
		s, n = s + 1, n - 1e9
	end
	if s == 0 then
		return string.format('%d', n)
	end
	return string.format('%.0f%09d', s, n)
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
