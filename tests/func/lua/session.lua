-- Every stage, in the order Postfix sends them, with the macros Postfix sends, and three
-- messages on one connection (ABORT after each, an aborted transaction, ABORT twice).
-- The configuration answers "continue" at every stage and accepts at end of message.
dofile(luadir .. "/common.lua")

run(function()
  local conn = open_and_negotiate()
  for _, stage in ipairs(STAGES) do
    check(answers(conn, stage), stage .. " negotiated with a reply")
  end

  -- CONNECT with the macros Postfix sends by default, plus some it sends on request
  must(mt.macro(conn, SMFIC_CONNECT, "j", "mx.example.org", "{daemon_name}", "mx.example.org",
                "{daemon_addr}", "192.0.2.1", "v", "Postfix 3.7.11",
                "_", "client.example.net [192.0.2.7]", "{client_addr}", "192.0.2.7",
                "{client_name}", "client.example.net"), "connect macros")
  must(mt.conninfo(conn, "client.example.net", "192.0.2.7"), "mt.conninfo")
  expect_reply(conn, SMFIR_CONTINUE, "CONNECT")

  must(mt.macro(conn, SMFIC_HELO, "{tls_version}", "TLSv1.3", "{cipher}", "TLS_AES_256_GCM_SHA384",
                "{cipher_bits}", "256"), "helo macros")
  must(mt.helo(conn, "client.example.net"), "mt.helo")
  expect_reply(conn, SMFIR_CONTINUE, "HELO")

  -- an unknown SMTP command before the first transaction
  must(mt.unknown(conn, "XFROB --verbose"), "mt.unknown")
  expect_reply(conn, SMFIR_CONTINUE, "UNKNOWN")

  local function message(n, rcpts)
    must(mt.macro(conn, SMFIC_MAIL, "{mail_addr}", "sender" .. n .. "@example.net",
                  "{mail_host}", "example.net", "{mail_mailer}", "smtp",
                  "{auth_type}", "PLAIN", "{auth_authen}", "user" .. n), "mail macros")
    must(mt.mailfrom(conn, "<sender" .. n .. "@example.net>", "SIZE=2048", "BODY=8BITMIME"),
         "mt.mailfrom")
    expect_reply(conn, SMFIR_CONTINUE, "MAIL (message " .. n .. ")")
    for i = 1, rcpts do
      local addr = "rcpt" .. i .. "@example.org"
      -- the queue ID appears from the second recipient on, as in Postfix
      if i > 1 then
        must(mt.macro(conn, SMFIC_RCPT, "i", "4Q" .. n .. "X", "{rcpt_addr}", addr,
                      "{rcpt_host}", "example.org", "{rcpt_mailer}", "smtp"), "rcpt macros")
      else
        must(mt.macro(conn, SMFIC_RCPT, "{rcpt_addr}", addr, "{rcpt_host}", "example.org",
                      "{rcpt_mailer}", "smtp"), "rcpt macros")
      end
      must(mt.rcptto(conn, "<" .. addr .. ">", "NOTIFY=SUCCESS,FAILURE", "ORCPT=rfc822;" .. addr),
           "mt.rcptto")
      expect_reply(conn, SMFIR_CONTINUE, "RCPT " .. i .. " (message " .. n .. ")")
    end
    must(mt.data(conn), "mt.data")
    expect_reply(conn, SMFIR_CONTINUE, "DATA (message " .. n .. ")")
    local headers = {
      { "From", "Sender <sender" .. n .. "@example.net>" },
      { "To", "rcpt1@example.org" },
      { "Subject", "message " .. n },
      { "X-Empty", "" },
      { "X-Folded", "first line\n\tsecond line" },
      { "X-8bit", "caf\195\169 \255" },
    }
    for _, h in ipairs(headers) do
      must(mt.header(conn, h[1], h[2]), "mt.header " .. h[1])
      expect_reply(conn, SMFIR_CONTINUE, "HEADER " .. h[1] .. " (message " .. n .. ")")
    end
    must(mt.eoh(conn), "mt.eoh")
    expect_reply(conn, SMFIR_CONTINUE, "EOH (message " .. n .. ")")
    must(mt.bodystring(conn, "Hello,\r\nthis is message " .. n .. ".\r\n"), "mt.bodystring")
    expect_reply(conn, SMFIR_CONTINUE, "BODY (message " .. n .. ")")
    must(mt.bodyrandom(conn, 20000), "mt.bodyrandom")
    expect_reply(conn, SMFIR_CONTINUE, "BODY random (message " .. n .. ")")
    must(mt.eom(conn), "mt.eom")
    local r = mt.getreply(conn)
    check(r == SMFIR_ACCEPT or r == SMFIR_CONTINUE,
          "end of message " .. n .. " accepted (" .. reply_name(r) .. ")")
    -- Postfix ends every transaction with ABORT
    must(mt.abort(conn), "mt.abort")
  end

  message(1, 1)
  message(2, 3)

  -- a transaction the client gives up on after RCPT (RSET), then ABORT twice in a row
  must(mt.mailfrom(conn, "<quitter@example.net>"), "mt.mailfrom (aborted message)")
  expect_reply(conn, SMFIR_CONTINUE, "MAIL (aborted message)")
  must(mt.rcptto(conn, "<rcpt@example.org>"), "mt.rcptto (aborted message)")
  expect_reply(conn, SMFIR_CONTINUE, "RCPT (aborted message)")
  must(mt.abort(conn), "mt.abort")
  must(mt.abort(conn), "mt.abort again")

  -- a second HELO (as after STARTTLS), another unknown command, then a third message
  must(mt.helo(conn, "client.example.net"), "mt.helo (second)")
  expect_reply(conn, SMFIR_CONTINUE, "second HELO")
  must(mt.unknown(conn, "NOOP-ish"), "mt.unknown (second)")
  expect_reply(conn, SMFIR_CONTINUE, "second UNKNOWN")
  message(3, 2)

  mt.disconnect(conn)
end)
