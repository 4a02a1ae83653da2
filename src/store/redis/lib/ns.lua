-- ns.lua -- (included) times in ns since the epoch, as decimal strings, for the GCRA and
-- sliding-window scripts.
--
-- They exceed 2^53, past which Lua's doubles round, so a time is held as (seconds,
-- nanoseconds), each exact in a double, and arithmetic is on differences from now.
-- now_s, now_n: the script's now, which it sets (split_ns, server_now) before it calls
-- tat_string.

local now_s, now_n

-- a decimal of ns into seconds and ns, each exact in a double (nil for what is no number)
local function split_ns(s)
	local n = #s
	if n > 9 then
		return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
	end
	return 0, tonumber(s)
end

-- the server's clock (TIME) as seconds and ns
local function server_now()
	local t = redis.call('TIME')
	return tonumber(t[1]), tonumber(t[2]) * 1000
end

-- The largest time, "never": 2^64 - 1 ns (the year 2554).
local U64_MAX = '18446744073709551615'

-- now + rel as a decimal ns string, and the rel it holds, for rel >= 0 whole, saturating
-- at U64_MAX.  fmod is exact; the quotient is rounded to the integer it must be.
local function tat_string(rel)
	local r = math.fmod(rel, 1e9)
	local q = math.floor((rel - r) / 1e9 + 0.5)
	local s, n = now_s + q, now_n + r
	if n >= 1e9 then
		s, n = s + 1, n - 1e9
	end
	if s > 18446744073 or (s == 18446744073 and n > 709551615) then
		return U64_MAX, (18446744073 - now_s) * 1e9 + (709551615 - now_n)
	end
	if s == 0 then
		return string.format('%d', n), rel
	end
	return string.format('%.0f%09d', s, n), rel
end

-- ceil(a / b) for whole a >= 0, b > 0, exact below 2^53 (a plain a / b may round across
-- an integer).
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
