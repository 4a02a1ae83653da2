-- slide.lua -- exact sliding windows shared by the nodes: never more than N sends in any
-- window of length W, for every window of a lane at once (the outbound relay lanes, e.g.
-- 8/1m and 10000/1d).
--
-- The twin of src/store/slide.c, with the same rule to the nanosecond (slide.h gives the
-- argument that it never admits N + 1 within W), applied to each window:
--   a send is remembered as s = ceil(now / 1000) us -- sorted-set scores are doubles,
--   exact below 2^53, which microseconds since the epoch are and nanoseconds are not;
--   w = ceil(W / 1000) us; a remembered send still counts at now iff s + w > floor(now /
--   1000), so it leaves at (s + w) * 1000 ns, never before t + W (its true time t <=
--   s * 1000), and at exactly t + W when t and W are whole microseconds;
--   a window admits iff fewer than N of its sends count; otherwise its wait is the exact
--   time until the (count - N + 1)-th oldest leaves (the oldest, unless N was lowered),
--   and "never" (2^64 - 1) when N is 0.
-- Several windows: a send is admitted iff every window admits it, and a take then adds
-- it to every window's set; when one refuses, nothing is added anywhere and the wait is
-- the largest over the refusing windows -- exact too, since a window's count only falls
-- while nothing is added, so at that time every window admits.  The script runs alone
-- on the server: no node sees a state between the check and the charge (law 4,
-- doc/ARCHITECTURE.md), which is what lets several nodes share one lane.  Decided window
-- by window this would be what slide.c does for a lane with one struct slide per window:
-- peek at every window, then take from each only if all admit.
--
-- KEYS: one sorted set per window (member: the caller's id, unique per send; score: s).
-- ARGV: mode ("take" | "peek"), now (decimal ns; "" for the server's TIME), the member
--   id ("" allowed for peek), then N_1, W_1 (ns), N_2, W_2, ... one pair per key.
-- Reply: { 1, "0", count_1, count_2, ... } when admitted (counts after the take),
--   { 0, wait_ns (a decimal string), count_1, ... } when not; count_i is how many sends
--   count in window i.
--
-- Invariants: take forgets, in every window, the sends that no longer count before it
-- counts, and adds one only when every window is below its N, so a set never holds more
-- members than the largest N it was given; a set expires W (rounded up to ms) plus a
-- second after its newest send, by when none of them counts (a send leaves at most 2 us
-- after W).  Peek writes nothing; a refused take writes nothing but the forgetting.
-- Member ids must be unique: a repeated id moves its send instead of adding one.
-- XXX: after the caller's clock steps back, the expiry (from the latest take) may drop
-- sends the stepped clock still counts; each is then more than W old in real time, the
-- same compromise as slide.h's forgetting, but slide.c, which has no expiry, keeps them.

local function digits(s, what)
	if type(s) ~= 'string' or not string.find(s, '^%d+$') or #s > 20 then
		error('slide.lua: ' .. what .. ' is not a decimal integer: ' .. tostring(s))
	end
	return s
end

-- a decimal of ns into seconds and ns, each exact in a double
local function split_ns(s)
	local n = #s
	if n > 9 then
		return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
	end
	return 0, tonumber(s)
end

local nwin = #KEYS
local mode = ARGV[1]
if mode ~= 'take' and mode ~= 'peek' then
	error('slide.lua: mode is neither take nor peek: ' .. tostring(mode))
end
if nwin == 0 then
	error('slide.lua: no window')
end
if #ARGV < 3 + 2 * nwin then
	error('slide.lua: fewer windows than keys')
end
if #ARGV > 3 + 2 * nwin then
	error('slide.lua: more windows than keys')
end
local id = ARGV[3]
if mode == 'take' and (not id or id == '') then
	error('slide.lua: take needs a member id')
end

local now_s, now_n
if ARGV[2] == '' then
	local t = redis.call('TIME')
	now_s, now_n = tonumber(t[1]), tonumber(t[2]) * 1000
else
	now_s, now_n = split_ns(digits(ARGV[2], 'now'))
end
local sub_us = now_n % 1000                         -- now's ns past its microsecond
local now_floor = now_s * 1e6 + (now_n - sub_us) / 1000
local now_ceil = now_floor + (sub_us > 0 and 1 or 0)

-- every argument is checked before anything is written
local limit, w_us, px, gone = {}, {}, {}, {}
for i = 1, nwin do
	limit[i] = tonumber(digits(ARGV[2 + 2 * i], 'N'))
	local w_s, w_n = split_ns(digits(ARGV[3 + 2 * i], 'W'))
	w_us[i] = w_s * 1e6 + math.ceil(w_n / 1000)     -- w_n < 1e9: exact
	px[i] = string.format('%.0f', w_s * 1000 + math.ceil(w_n / 1e6) + 1000)
	-- a send with s <= gone no longer counts
	gone[i] = string.format('%.0f', now_floor - w_us[i])
end

local count, admit = {}, true
for i = 1, nwin do
	if mode == 'take' then
		redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', gone[i])
		count[i] = redis.call('ZCARD', KEYS[i])
	else
		count[i] = redis.call('ZCOUNT', KEYS[i], '(' .. gone[i], '+inf')
	end
	if count[i] >= limit[i] then
		admit = false
	end
end

local reply = { admit and 1 or 0, '0' }
if admit then
	if mode == 'take' then
		local score = string.format('%.0f', now_ceil)
		for i = 1, nwin do
			redis.call('ZADD', KEYS[i], score, id)
			redis.call('PEXPIRE', KEYS[i], px[i])
			count[i] = count[i] + 1
		end
	end
	for i = 1, nwin do
		reply[2 + i] = count[i]
	end
	return reply
end

-- The wait: the latest time, over the refusing windows, at which the (count - N)-th
-- (from 0) of the sends that count leaves.  In whole us from now_floor: d >= 1 (the send
-- counts, so it leaves after now_floor), and wait_ns = d * 1000 - sub_us, written out in
-- digits so that it stays exact past 2^53 ns.
local never, d_max = false, 0
for i = 1, nwin do
	if count[i] >= limit[i] then
		if limit[i] == 0 then
			never = true
		else
			local idx = count[i] - limit[i]
			local r
			if mode == 'take' then        -- take removed the others already
				r = redis.call('ZRANGE', KEYS[i], idx, idx, 'WITHSCORES')
			else
				r = redis.call('ZRANGEBYSCORE', KEYS[i], '(' .. gone[i], '+inf',
					       'WITHSCORES', 'LIMIT', idx, 1)
			end
			local d = tonumber(r[2]) + w_us[i] - now_floor
			if d > d_max then
				d_max = d
			end
		end
	end
	reply[2 + i] = count[i]
end
if never then
	reply[2] = '18446744073709551615'
elseif sub_us == 0 then
	reply[2] = string.format('%.0f000', d_max)
elseif d_max > 1 then
	reply[2] = string.format('%.0f%03d', d_max - 1, 1000 - sub_us)
else
	reply[2] = string.format('%d', 1000 - sub_us)
end
return reply
