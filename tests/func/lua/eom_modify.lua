-- Modifications at end of message, twice on one connection.  The expected values are
-- those of the `modify` block test_miltertest.py configures; -D quarantine=REASON and
-- -D add_header_value=VALUE let a test expect something else (to prove the checks fail),
-- -D delete_header=NAME also expects that header deleted (CHGHEADER with an empty value).
-- The configuration must negotiate MAIL and RCPT: only an explicit mt.mailfrom makes
-- miltertest forget the previous message's modifications.
dofile(luadir .. "/common.lua")

run(function()
  local conn = open_and_negotiate()
  for _, name in ipairs({ "ADDHDRS", "CHGHDRS", "ADDRCPT", "ADDRCPT_PAR", "DELRCPT",
                          "CHGFROM", "CHGBODY", "QUARANTINE" }) do
    check(mt.test_action(conn, _G["SMFIF_" .. name]), "action SMFIF_" .. name .. " requested")
  end

  local function message(n)
    must(mt.mailfrom(conn, "<sender@example.net>"), "mt.mailfrom")
    must(mt.rcptto(conn, "<c@example.org>"), "mt.rcptto")
    must(mt.eom(conn), "mt.eom")
    local r = mt.getreply(conn)
    check(r == SMFIR_ACCEPT or r == SMFIR_CONTINUE,
          "message " .. n .. " accepted (" .. reply_name(r) .. ")")
    check(mt.eom_check(conn, MT_HDRADD, "X-Sluice", add_header_value or "yes"),
          "header X-Sluice added")
    check(mt.eom_check(conn, MT_HDRADD, "X-Second", "two"), "header X-Second added")
    check(mt.getheader(conn, "X-Sluice", 0) == (add_header_value or "yes"),
          "mt.getheader(X-Sluice)")
    check(mt.eom_check(conn, MT_HDRINSERT, "X-First", "1", 0), "header X-First inserted at 0")
    check(mt.eom_check(conn, MT_HDRCHANGE, "Subject", "new"), "header Subject changed")
    if delete_header ~= nil then
      check(mt.eom_check(conn, MT_HDRDELETE, delete_header), "header " .. delete_header .. " deleted")
    end
    check(mt.eom_check(conn, MT_RCPTADD, "<a@example.org>"), "recipient <a@example.org> added")
    check(mt.eom_check(conn, MT_RCPTDELETE, "<c@example.org>"), "recipient <c@example.org> deleted")
    check(mt.eom_check(conn, MT_BODYCHANGE, "Replaced body.\r\n"), "body replaced")
    check(mt.eom_check(conn, MT_QUARANTINE, quarantine or "held by sluice"), "quarantined")
    check(not mt.eom_check(conn, MT_SMTPREPLY, "550", "5.7.1", "x"), "no SMTP reply")
    must(mt.abort(conn), "mt.abort")
  end

  message(1)
  message(2)
  mt.disconnect(conn)
end)
