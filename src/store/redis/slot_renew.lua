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

local SCRIPT, DIGITS_MAX = 'slot_renew.lua', 18
--@include digits.lua
--@include lease.lua

local node = ARGV[1]
if not node or node == '' then
	error('slot_renew.lua: no node id')
end
local lease = tonumber(digits(ARGV[2], 'lease_ms'))
if lease == 0 then
	error('slot_renew.lua: lease_ms must be above 0')
end
local now = lease_now(ARGV[3])
if #ARGV ~= 3 + #KEYS then
	error('slot_renew.lua: one count per key expected')
end

local reply = {}
for i = 1, #KEYS do
	local key = KEYS[i]
	local count = tonumber(digits(ARGV[3 + i], 'count'))
	-- drops the nodes whose lease ran out; the slots the other live nodes hold
	local used = live_slots(key, now, node)
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
