-- lease.lua -- (included) the leases of the concurrency slots: one hash per class,
--   c:NODE  the slots NODE holds
--   e:NODE  NODE's lease expiry, ms since the epoch; NODE counts while now <= e:NODE
-- Needs digits.lua.

-- now in ms: arg, or the server's TIME when arg is ""
local function lease_now(arg)
	if arg == '' then
		local t = redis.call('TIME')
		return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	end
	return tonumber(digits(arg, 'now'))
end

-- Drop the nodes of hash key whose lease ran out at now (and counts that belong to no
-- lease); return the slots the other live nodes hold (all of them when except is nil).
local function live_slots(key, now, except)
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
		elseif c > 0 and who ~= except then
			used = used + c
		end
	end
	return used
end
