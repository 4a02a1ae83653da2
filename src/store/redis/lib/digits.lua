-- digits.lua -- (included) a decimal argument checked before it is used.
--
-- The including script sets SCRIPT (its file name, for errors) and DIGITS_MAX (the most
-- digits it accepts: 20 for ns times, which reach 2^64; 18 for the lease scripts' ms).

-- s when it is a decimal integer of at most DIGITS_MAX digits; an error otherwise.
local function digits(s, what)
	if type(s) ~= 'string' or not string.find(s, '^%d+$') or #s > DIGITS_MAX then
		error(SCRIPT .. ': ' .. what .. ' is not a decimal integer: ' .. tostring(s))
	end
	return s
end
