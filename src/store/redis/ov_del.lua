-- ov_del.lua -- remove one run-time per-key limit (sluice limits unset, or a node
-- dropping one it found expired).
--
-- KEYS[1]: the limits hash, PREFIX "{ov}"; KEYS[2]: its version, PREFIX "{ov}:v".
-- ARGV[1]: the field (16 hex digits).  ARGV[2], optional: remove it only if its value is
-- still this one (an expired entry, not one set again meanwhile).
-- Reply: 1 removed (the version was incremented), 0 there was none (nothing changed).

local h, v = KEYS[1], KEYS[2]
local field, expect = ARGV[1], ARGV[2]
if not field or #field ~= 16 then
	error('ov_del.lua: bad arguments')
end
if expect and redis.call('HGET', h, field) ~= expect then
	return 0
end
if redis.call('HDEL', h, field) == 0 then
	return 0
end
redis.call('INCR', v)
return 1
