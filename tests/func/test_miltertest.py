"""sluiced against miltertest (OpenDKIM's independent milter client, scripted in Lua).

Each test configures sluiced, runs one script from lua/ with `miltertest -s SCRIPT
-D socket=unix:... -D luadir=...`, and requires exit status 0.  The last tests run the same
scripts against a configuration that does not match what they check, and require them to
fail: the checks in the scripts are real.
"""

import shutil
import subprocess

import pytest

from conftest import HERE, all_stages, milter_config, modify_all

LUA = HERE / "lua"
MILTERTEST = shutil.which("miltertest") or "/usr/bin/miltertest"



@pytest.fixture(autouse=True)
def _need_miltertest():
    if not shutil.which(MILTERTEST):
        pytest.skip("miltertest is not installed")


def miltertest(script, daemon, **defines):
    cmd = [MILTERTEST, "-s", str(LUA / script), "-D", f"socket=unix:{daemon.milter_socket}",
           "-D", f"luadir={LUA}"]
    for name, value in defines.items():
        cmd += ["-D", f"{name}={value}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    res.transcript = (f"$ {' '.join(cmd)}\n--- stdout ---\n{res.stdout}--- stderr ---\n"
                      f"{res.stderr}--- sluiced log ---\n{daemon.log.tail(20)}")
    return res


def passes(script, daemon, **defines):
    res = miltertest(script, daemon, **defines)
    assert res.returncode == 0, res.transcript
    return res


def fails(script, daemon, **defines):
    res = miltertest(script, daemon, **defines)
    assert res.returncode != 0, "the script passed although it should not:\n" + res.transcript
    assert "CHECK FAILED" in res.stdout + res.stderr, res.transcript
    return res


# ---------------------------------------------------------------------------------------
# negotiation

def test_negotiates_no_stage_without_replies(sluiced):
    s = sluiced(milter_config())
    passes("negotiate.lua", s, negotiated="")


def test_negotiates_exactly_the_listed_stages(sluiced):
    s = sluiced(milter_config(reply={"connect": "continue", "rcpt": "reject",
                                     "header": "continue"}))
    passes("negotiate.lua", s, negotiated="connect,rcpt,header")


def test_requests_the_actions_of_its_modifications(sluiced):
    s = sluiced(milter_config(modify=modify_all()))
    passes("negotiate.lua", s, negotiated="",
           actions="ADDHDRS,CHGHDRS,ADDRCPT,ADDRCPT_PAR,DELRCPT,CHGFROM,CHGBODY,QUARANTINE")


# ---------------------------------------------------------------------------------------
# a whole session

def test_every_stage_and_several_messages(sluiced):
    s = sluiced(milter_config(reply=all_stages("continue", eom="accept")))
    passes("session.lua", s)
    st = s.milter_stats()
    assert st["connections"] == 1 and st["protocol_errors"] == 0, st


# ---------------------------------------------------------------------------------------
# the configured reply of each stage

STAGE_REPLIES = [
    # (stage, configured action, reply code letter miltertest must see)
    ("connect", "continue", "c"),
    ("connect", "reject", "r"),
    ("connect", "tempfail", "t"),
    ("connect", "accept", "a"),
    ("helo", "reject", "r"),
    ("helo", "421 4.7.0 Go away", "y"),
    ("mail", "tempfail", "t"),
    ("mail", "discard", "d"),
    ("mail", "accept", "a"),
    ("rcpt", "reject", "r"),
    ("rcpt", "550 5.7.1 No thanks", "y"),
    ("rcpt", "451-4.7.1 first line\n451 4.7.1 second line", "y"),
    ("data", "tempfail", "t"),
    ("header", "discard", "d"),
    ("eoh", "reject", "r"),
    ("body", "accept", "a"),
    ("body", "554 5.7.1 Body refused", "y"),
    ("unknown", "500 5.5.1 Unknown command", "y"),
    ("eom", "reject", "r"),
    ("eom", "tempfail", "t"),
    ("eom", "discard", "d"),
    ("eom", "accept", "a"),
]


@pytest.mark.parametrize("stage,action,code", STAGE_REPLIES,
                         ids=[f"{s}-{a.split()[0]}" for s, a, _ in STAGE_REPLIES])
def test_stage_reply(sluiced, stage, action, code):
    s = sluiced(milter_config(reply={stage: action}))
    passes("stage_reply.lua", s, stage=stage, expect=code)


def test_smtp_reply_text_at_end_of_message(sluiced):
    s = sluiced(milter_config(reply={"eom": "451 4.7.1 Testing"}))
    passes("stage_reply.lua", s, stage="eom", expect="y", code="451", esc="4.7.1",
           text="Testing")


def test_multiline_reply_text_at_end_of_message(sluiced):
    """Lines given with \\n in the configuration go out joined by CRLF, each with its
    code, '-' on all but the last (MILTER-PROTOCOL.md 4.3)."""
    s = sluiced(milter_config(reply={"eom": "550-5.7.1 first line\n550 5.7.1 last line"}))
    # eom_check joins its three arguments with spaces and compares the whole string
    passes("stage_reply.lua", s, stage="eom", expect="y", code="550-5.7.1",
           esc="first line\r\n550", text="5.7.1 last line")


# ---------------------------------------------------------------------------------------
# modifications

# eom_modify.lua starts each message with an explicit MAIL (see the script)
ENVELOPE = {"mail": "continue", "rcpt": "continue"}


def test_modifications_at_end_of_message(sluiced):
    s = sluiced(milter_config(reply=ENVELOPE, modify=modify_all()))
    passes("eom_modify.lua", s)


def test_header_delete_at_end_of_message(sluiced):
    """change_header with an empty value deletes the header (CHGHEADER, empty value)."""
    modify = modify_all()
    modify["change_header"] = ["1 Subject: new", "1 X-Spam:"]
    s = sluiced(milter_config(reply=ENVELOPE, modify=modify))
    passes("eom_modify.lua", s, delete_header="X-Spam")


# ---------------------------------------------------------------------------------------
# the scripts fail when the behaviour is wrong

def test_scripts_detect_a_wrong_reply(sluiced):
    s = sluiced(milter_config(reply={"rcpt": "reject"}))
    fails("stage_reply.lua", s, stage="rcpt", expect="t")
    s2 = sluiced(milter_config(reply={"eom": "451 4.7.1 Testing"}))
    fails("stage_reply.lua", s2, stage="eom", expect="y", code="451", esc="4.7.1",
          text="Something else")


def test_scripts_detect_wrong_negotiation(sluiced):
    s = sluiced(milter_config(reply={"rcpt": "reject"}))
    fails("negotiate.lua", s, negotiated="rcpt,mail")
    fails("negotiate.lua", s, negotiated="", actions="QUARANTINE")


def test_scripts_detect_missing_modifications(sluiced):
    s = sluiced(milter_config(reply=ENVELOPE, modify=modify_all()))
    fails("eom_modify.lua", s, quarantine="another reason")
    fails("eom_modify.lua", s, add_header_value="no")
    plain = sluiced(milter_config(reply=all_stages("continue", eom="accept")))
    fails("eom_modify.lua", plain)
