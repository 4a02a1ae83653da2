-- slide.lua -- an exact sliding window shared by the nodes: never more than N sends in
-- any window of length W (the outbound relay lanes).
--
-- The twin of src/store/slide.c, with the same rule to the nanosecond (slide.h gives the
-- argument that it never admits N + 1 within W):
--   a send is remembered as s = ceil(now / 1000) us -- sorted-set scores are doubles,
--   exact below 2^53, which microseconds since the epoch are and nanoseconds are not;
--   w = ceil(W / 1000) us; a remembered send still counts at now iff s + w > floor(now /
--   1000), so it leaves at (s + w) * 1000 ns, never before t + W (its true time t <=
--   s * 1000), and at exactly t + W when t and W are whole microseconds;
--   a send is admitted iff fewer than N count; otherwise wait_ns is the exact time until
--   the (count - N + 1)-th oldest leaves (the oldest, unless N was lowered), and "never"
--   (2^64 - 1) when N is 0.
--
-- KEYS[1]: the sorted set of sends (member: the caller's id, unique per send; score: s).
-- ARGV: mode ("take" | "peek"), now (decimal ns; "" for the server's TIME), N, W (ns),
--   the member id (take).
-- Reply: { 1, "0", count after } when admitted, { 0, wait_ns, count } when not.
--
-- Invariants: take forgets the sends that no longer count before it counts, and adds
-- one only below N, so the set never holds more members than the largest N it was
-- given; it expires W (rounded up to ms) plus a second after its newest send, by when
-- none of them counts (a send leaves at most 2 us after W).  Peek writes nothing.
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

local function split_ns(s)
	local n = #s
	if n > 9 then
		return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
	end
	return 0, tonumber(s)
end

local key = KEYS[1]
local mode = ARGV[1]
if mode ~= 'take' and mode ~= 'peek' then
	error('slide.lua: mode is neither take nor peek: ' .. tostring(mode))
end
local now_s, now_n
if ARGV[2] == '' then
	local t = redis.call('TIME')
	now_s, now_n = tonumber(t[1]), tonumber(t[2]) * 1000
else
	now_s, now_n = split_ns(digits(ARGV[2], 'now'))
end
local limit = tonumber(digits(ARGV[3], 'N'))
local w_s, w_n = split_ns(digits(ARGV[4], 'W'))

local sub_us = now_n % 1000                         -- now's ns past its microsecond
local now_floor = now_s * 1e6 + (now_n - sub_us) / 1000
local now_ceil = now_floor + (sub_us > 0 and 1 or 0)
local w_us = w_s * 1e6 + math.ceil(w_n / 1000)      -- w_n < 1e9: exact
-- a send with s <= gone no longer counts
local gone = string.format('%.0f', now_floor - w_us)

local count
if mode == 'take' then
	redis.call('ZREMRANGEBYSCORE', key, '-inf', gone)
	count = redis.call('ZCARD', key)
else
	count = redis.call('ZCOUNT', key, '(' .. gone, '+inf')
end

if count < limit then
	if mode == 'take' then
		local id = ARGV[5]
		if not id or id == '' then
			error('slide.lua: take needs a member id')
		end
		redis.call('ZADD', key, string.format('%.0f', now_ceil), id)
		redis.call('PEXPIRE', key, string.format('%.0f', w_s * 1000 + math.ceil(w_n / 1e6) + 1000))
		count = count + 1
	end
	return { 1, '0', count }
end
if limit == 0 then
	return { 0, '18446744073709551615', count }
end

-- the (count - N)-th (from 0) of the sends that count; take removed the others already
local idx = count - limit
local r
if mode == 'take' then
	r = redis.call('ZRANGE', key, idx, idx, 'WITHSCORES')
else
	r = redis.call('ZRANGEBYSCORE', key, '(' .. gone, '+inf', 'WITHSCORES', 'LIMIT', idx, 1)
end
local leaves = tonumber(r[2]) + w_us
return { 0, string.format('%.0f', (leaves - now_floor) * 1000 - sub_us), count }
