-- Option negotiation: exactly the stages named in -D negotiated="a,b" are requested
-- (no SMFIP_NO* bit), every other stage is declined, and every requested stage is
-- answered (no SMFIP_NR_* bit) because the configuration gives it a reply.
-- -D actions="ADDHDRS,QUARANTINE,..." names SMFIF_* bits that must be requested.
dofile(luadir .. "/common.lua")

run(function()
  local conn = open_and_negotiate()
  local want = split(negotiated)

  for _, stage in ipairs(STAGES) do
    local skipped = mt.test_option(conn, STAGE_BITS[stage][1])
    if want[stage] then
      check(not skipped, stage .. " is negotiated")
      check(not mt.test_option(conn, STAGE_BITS[stage][2]), stage .. " is answered (no NR bit)")
    else
      check(skipped, stage .. " is declined with its SMFIP_NO* bit")
    end
  end

  for name in pairs(split(actions)) do
    local bit = _G["SMFIF_" .. name]
    check(bit ~= nil, "SMFIF_" .. name .. " known to miltertest")
    check(mt.test_action(conn, bit), "action SMFIF_" .. name .. " requested")
  end

  mt.disconnect(conn)
end)
