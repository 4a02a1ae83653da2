-- slot_release.lua -- give back one concurrency slot of a host class (see slot_enter.lua
-- for the hash: c:NODE slots held, e:NODE lease expiry).
--
-- KEYS[1]: the class hash.  ARGV[1]: node id.
-- Reply: the node's count after.
--
-- Invariant: a count never goes below 0.  A node whose lease ran out was dropped with its
-- slots, so a late release finds no count and changes nothing; it never writes a field,
-- which would otherwise bring back a node without a lease.

local key, node = KEYS[1], ARGV[1]
if not node or node == '' then
	error('slot_release.lua: no node id')
end
local field = 'c:' .. node
local c = tonumber(redis.call('HGET', key, field) or '0') or 0
if c <= 0 then
	return 0
end
return redis.call('HINCRBY', key, field, -1)
