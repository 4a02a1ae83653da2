-- ov_read.lua -- every run-time per-key limit with the version they are at, read at once.
--
-- KEYS[1]: the limits hash, PREFIX "{ov}"; KEYS[2]: its version, PREFIX "{ov}:v".
-- Reply: { VERSION (a decimal string, "0" before any change), { FIELD, VALUE, ... } }.

return { redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1]) }
