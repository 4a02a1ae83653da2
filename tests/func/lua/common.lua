-- Helpers shared by the miltertest scripts (loaded with dofile(luadir .. "/common.lua")).
-- Every script gets -D socket=unix:/path and -D luadir=/path/to/tests/func/lua.

-- NO bit (skip) and NR bit (no reply) of each stage
STAGE_BITS = {
  connect = { SMFIP_NOCONNECT, SMFIP_NR_CONN },
  helo    = { SMFIP_NOHELO,    SMFIP_NR_HELO },
  mail    = { SMFIP_NOMAIL,    SMFIP_NR_MAIL },
  rcpt    = { SMFIP_NORCPT,    SMFIP_NR_RCPT },
  data    = { SMFIP_NODATA,    SMFIP_NR_DATA },
  header  = { SMFIP_NOHDRS,    SMFIP_NR_HDR },
  eoh     = { SMFIP_NOEOH,     SMFIP_NR_EOH },
  body    = { SMFIP_NOBODY,    SMFIP_NR_BODY },
  unknown = { SMFIP_NOUNKNOWN, SMFIP_NR_UNKN },
}
STAGES = { "connect", "helo", "mail", "rcpt", "data", "header", "eoh", "body", "unknown" }

REPLY_NAMES = {
  [SMFIR_CONTINUE] = "continue", [SMFIR_ACCEPT] = "accept", [SMFIR_REJECT] = "reject",
  [SMFIR_TEMPFAIL] = "tempfail", [SMFIR_DISCARD] = "discard",
  [SMFIR_REPLYCODE] = "replycode", [SMFIR_SKIP] = "skip",
}

function reply_name(r)
  return REPLY_NAMES[r] or string.format("0x%02x (%q)", r, string.char(r))
end

-- fail the script (miltertest then exits non-zero) unless ok
function check(ok, what)
  if not ok then
    error("CHECK FAILED: " .. what, 2)
  end
  mt.echo("ok - " .. what)
end

-- a library call must return nil (its error string otherwise)
function must(err, what)
  if err ~= nil then
    error("CALL FAILED: " .. what .. ": " .. tostring(err), 2)
  end
end

function expect_reply(conn, want, what)
  local got = mt.getreply(conn)
  check(got == want, what .. ": reply " .. reply_name(got) .. ", expected " .. reply_name(want))
end

-- the stage was negotiated with a reply (no NO bit, no NR bit)
function answers(conn, stage)
  local bits = STAGE_BITS[stage]
  return not mt.test_option(conn, bits[1]) and not mt.test_option(conn, bits[2])
end

function open_and_negotiate()
  check(socket ~= nil, "-D socket=... given")
  local conn = mt.connect(socket, 40, 0.25)
  check(conn ~= nil, "connected to " .. socket)
  -- what Postfix offers: version 6, every action, every protocol bit
  must(mt.negotiate(conn, nil, nil, nil), "mt.negotiate")
  return conn
end

function split(s)
  local t = {}
  if s == nil then return t end
  for w in string.gmatch(s, "[^,%s]+") do t[w] = true end
  return t
end

-- Run a script body; print any error (miltertest does not always show it) and fail.
function run(body)
  local ok, err = pcall(body)
  if not ok then
    mt.echo("SCRIPT ERROR: " .. tostring(err))
    error(err, 0)
  end
end
