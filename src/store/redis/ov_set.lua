-- ov_set.lua -- set one run-time per-key limit (sluice limits set), seen by every node.
--
-- KEYS[1]: the limits hash, PREFIX "{ov}"; KEYS[2]: its version, PREFIX "{ov}:v" (one
-- hash tag: one slot on a cluster).  ARGV[1]: the field, the (rule, key)'s key_hash in 16
-- hex digits; ARGV[2]: the value, "1 UNTIL_NS WINDOWS RULE KEY" (store_redis_ov.c);
-- ARGV[3]: the most entries the hash may hold.
-- Reply: the version after the change.  An error "FULL ..." when a new field would pass
-- the bound (nothing changed).
--
-- Invariant: the hash and its version change together, so a node that reads the version
-- and then the hash in one script (ov_read.lua) never keeps a table older than the
-- version it saw.

local h, v = KEYS[1], KEYS[2]
local field, value, max = ARGV[1], ARGV[2], tonumber(ARGV[3])
if not field or #field ~= 16 or not value or value == '' or not max then
	error('ov_set.lua: bad arguments')
end
if redis.call('HEXISTS', h, field) == 0 and redis.call('HLEN', h) >= max then
	return redis.error_reply('FULL the table of run-time limits holds ' .. max .. ' entries')
end
redis.call('HSET', h, field, value)
return redis.call('INCR', v)
