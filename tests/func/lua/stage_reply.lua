-- The configured reply of one stage: -D stage=rcpt -D expect=r (the reply code letter:
-- c a r t d y).  For expect=y at eom, -D code= -D esc= -D text= give the SMTP reply that
-- must come with it.  The configuration lists only that stage, so miltertest skips every
-- other stage (declined in negotiation) on the way there.
dofile(luadir .. "/common.lua")

run(function()
  check(STAGE_BITS[stage] ~= nil or stage == "eom", "-D stage=" .. tostring(stage) .. " known")
  local want = string.byte(expect)
  local conn = open_and_negotiate()

  if stage ~= "eom" then
    check(answers(conn, stage), stage .. " negotiated with a reply")
  end

  if stage == "connect" then
    must(mt.conninfo(conn, "client.example.net", "192.0.2.7"), "mt.conninfo")
  elseif stage == "helo" then
    must(mt.helo(conn, "client.example.net"), "mt.helo")
  elseif stage == "mail" then
    must(mt.mailfrom(conn, "<sender@example.net>"), "mt.mailfrom")
  elseif stage == "rcpt" then
    -- miltertest fills in the earlier steps the filter did not decline
    must(mt.rcptto(conn, "<rcpt@example.org>"), "mt.rcptto")
  elseif stage == "data" then
    must(mt.data(conn), "mt.data")
  elseif stage == "header" then
    must(mt.header(conn, "Subject", "hello"), "mt.header")
  elseif stage == "eoh" then
    must(mt.eoh(conn), "mt.eoh")
  elseif stage == "body" then
    must(mt.bodystring(conn, "Hello.\r\n"), "mt.bodystring")
  elseif stage == "unknown" then
    must(mt.unknown(conn, "XFROB"), "mt.unknown")
  elseif stage == "eom" then
    must(mt.eom(conn), "mt.eom")
  end
  expect_reply(conn, want, stage)

  if stage == "eom" and expect == "y" then
    check(mt.eom_check(conn, MT_SMTPREPLY, code, esc, text),
          "SMTP reply at end of message is '" .. code .. " " .. esc .. " " .. text .. "'")
  end

  -- After a reply that ends the connection (reject at CONNECT, 421...) the filter may
  -- already have closed; a QUIT written then would only raise SIGPIPE here.
  if want == SMFIR_CONTINUE then
    mt.disconnect(conn)
  end
end)
