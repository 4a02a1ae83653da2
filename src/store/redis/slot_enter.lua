-- slot_enter.lua -- take one concurrency slot of a host class shared by the nodes of a
-- cluster (Sendmail's XLA: at most cap sessions of the class at once, over all nodes).
--
-- A slot is a lease, so that a node that dies without releasing does not hold its slots
-- for ever.  One hash per class:
--   c:NODE  the slots NODE holds
--   e:NODE  NODE's lease expiry, ms since the epoch; NODE counts while now <= e:NODE
-- A node renews its lease (slot_renew.lua) well within lease_ms; every script that reads
-- the hash first drops the nodes whose lease has run out, so their slots come back.
--
-- KEYS[1]: the class hash.  ARGV: node id, cap, lease_ms, now in ms ("" for the server's
-- TIME).
-- Reply: { 1, used after } when a slot was taken, { 0, used } when the class is full.
--
-- Invariants: used (the sum of the live nodes' c:) never exceeds cap through this script;
-- a node holding slots has both fields; the hash lives at least 2 * lease_ms after the
-- last write (an expiry is only ever extended, so a node with a longer lease never loses
-- its slots to one with a shorter).

local SCRIPT, DIGITS_MAX = 'slot_enter.lua', 18
--@include digits.lua
--@include lease.lua

local key, node = KEYS[1], ARGV[1]
if not node or node == '' then
	error('slot_enter.lua: no node id')
end
local cap = tonumber(digits(ARGV[2], 'cap'))
local lease = tonumber(digits(ARGV[3], 'lease_ms'))
if lease == 0 then
	error('slot_enter.lua: lease_ms must be above 0')
end
local now = lease_now(ARGV[4])

-- Drop expired nodes (and slot counts that belong to no lease); sum the rest.
local used = live_slots(key, now)

if used >= cap then
	return { 0, used }
end
redis.call('HINCRBY', key, 'c:' .. node, 1)
redis.call('HSET', key, 'e:' .. node, string.format('%.0f', now + lease))
if redis.call('PTTL', key) < 2 * lease then
	redis.call('PEXPIRE', key, string.format('%.0f', 2 * lease))
end
return { 1, used + 1 }
