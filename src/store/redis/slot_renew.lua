-- slot_renew.lua -- renew a node's leases on its concurrency slots, from a timer (see
-- slot_enter.lua for the hash: c:NODE slots held, e:NODE lease expiry in ms).
--
-- The node states how many slots it holds in each class, from its own counters, which
-- are the truth for its own sessions: the renewal also repairs a count that a lost
-- release or a dropped lease left wrong.
--
-- KEYS: the class hashes.  ARGV: node id, lease_ms, now in ms ("" for the server's TIME),
--   then one count per key.
-- Reply: per key, the slots the live nodes hold after the renewal.
--
-- Invariants: as slot_enter.lua -- expired nodes are dropped before anything is summed; a
-- node with no slots keeps no fields; a hash's expiry is only ever extended.

local function digits(s, what)
	if type(s) ~= 'string' or not string.find(s, '^%d+$') or #s > 18 then
		error('slot_renew.lua: ' .. what .. ' is not a decimal integer: ' .. tostring(s))
	end
	return tonumber(s)
end

local node = ARGV[1]
if not node or node == '' then
	error('slot_renew.lua: no node id')
end
local lease = digits(ARGV[2], 'lease_ms')
if lease == 0 then
	error('slot_renew.lua: lease_ms must be above 0')
end
local now
if ARGV[3] == '' then
	local t = redis.call('TIME')
	now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
	now = digits(ARGV[3], 'now')
end
if #ARGV ~= 3 + #KEYS then
	error('slot_renew.lua: one count per key expected')
end

-- Drop the nodes whose lease ran out (and counts that belong to no lease); return the
-- slots the other live nodes hold.
local function others(key)
	local h = redis.call('HGETALL', key)
	local counts, expiry = {}, {}
	for j = 1, #h, 2 do
		local f, v = h[j], tonumber(h[j + 1]) or 0
		local kind, who = string.sub(f, 1, 2), string.sub(f, 3)
		if kind == 'c:' then
			counts[who] = v
		elseif kind == 'e:' then
			expiry[who] = v
		end
	end
	local used = 0
	for who, e in pairs(expiry) do
		if e < now then
			redis.call('HDEL', key, 'c:' .. who, 'e:' .. who)
			counts[who] = nil
		end
	end
	for who, c in pairs(counts) do
		if not expiry[who] then
			redis.call('HDEL', key, 'c:' .. who)
		elseif c > 0 and who ~= node then
			used = used + c
		end
	end
	return used
end

local reply = {}
for i = 1, #KEYS do
	local key = KEYS[i]
	local count = digits(ARGV[3 + i], 'count')
	local used = others(key)
	if count > 0 then
		redis.call('HSET', key, 'c:' .. node, string.format('%.0f', count),
			'e:' .. node, string.format('%.0f', now + lease))
		if redis.call('PTTL', key) < 2 * lease then
			redis.call('PEXPIRE', key, string.format('%.0f', 2 * lease))
		end
	else
		redis.call('HDEL', key, 'c:' .. node, 'e:' .. node)
	end
	reply[i] = used + count
end
return reply
