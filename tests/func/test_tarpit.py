"""Delay rules (a tarpit) and one Postfix using both the milter and the policy service.

* Through the milter, a delay rule over its limit holds the reply on the session's own
  timer: the MTA gets it `delay` later, while the same sluiced (one worker) answers
  other sessions at once -- no thread waits (law 1).  Driven by peers/milter_wire.py.
* Through the policy service, the same rule answers Postfix `sleep N` (a restriction,
  which Postfix accepts in a policy answer): the real Postfix's reply to RCPT comes N s
  later and the mail is still accepted, with no warning in Postfix's log.
* A Postfix with both smtpd_milters and check_policy_service pointing at one sluiced:
  sluiced warns once that both count each message, and `sluice status` says so.
"""

import re
import shutil
import smtplib
import time

import urllib.request

import pytest

from peers import milter_wire as mw
from conftest import free_port, wait_until
from test_policy import config

FROM = "sender@sluice.test"


def passed(reply):
    """A step's reply lets it go on (or none was awaited: no rule at that stage)."""
    return reply in (mw.NO_REPLY, mw.NOT_SENT) or reply[0] == mw.CONTINUE


def delay_rule(delay, rate="1/1h"):
    """Messages per recipient domain; over the rate, the answer waits `delay`."""
    return ('limit "slow" { stage = "rcpt"; key = "rcpt_domain"; count = "messages"; '
            f'rate = ["{rate}"]; action = "delay"; delay = {delay}; }}')


def need(*tools):
    for tool in tools:
        if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin"):
            pytest.skip(f"{tool} is not installed")


# ---------------------------------------------------------------------------------------
# the milter

def test_milter_delay_holds_the_reply_and_no_thread(sluiced):
    s = sluiced(config(delay_rule("300ms"), workers=1))
    a = mw.MilterClient(s.milter_socket)
    b = mw.MilterClient(s.milter_socket)
    try:
        a.negotiate()
        b.negotiate()
        a.connect(port=40001)
        a.helo()
        # the first message is within 1/1h: answered at once (and delivered, or its
        # count would be given back)
        t0 = time.monotonic()
        assert mw.accepted(a.message(recipients=["<r1@example.org>"]))
        assert time.monotonic() - t0 < 0.2
        # the second is over: its RCPT is answered 300 ms later
        assert passed(a.mail())
        t0 = time.monotonic()
        a.send(mw.RCPT, mw.strs("<r2@example.org>"))
        # meanwhile another session of the same sluiced (one worker) is served at once
        b.connect(port=40002)
        b.helo()
        assert passed(b.mail())
        t1 = time.monotonic()
        assert b.rcpt("<r@other.example>")[0] == mw.CONTINUE
        other = time.monotonic() - t0
        assert time.monotonic() - t1 < 0.25, "another session waited for the delay"
        code, _ = a.read_reply()
        waited = time.monotonic() - t0
        assert code == mw.CONTINUE
        assert waited >= 0.3, f"answered after {waited:.3f}s"
        assert waited < 1.5, f"answered after {waited:.3f}s"
        assert other + 0.02 < waited, \
            f"the other session was served after {other:.3f}s, the delayed one at {waited:.3f}s"
        # the message goes on as usual
        assert passed(a.data())
        mods, code, _ = a.eob()
        assert code in (mw.ACCEPT, mw.CONTINUE), (mods, code)
        a.quit()
        b.quit()
    finally:
        a.close()
        b.close()
    s.log.wait_for(r'decision rule=slow action=delay key="example\.org" count=\d+ '
                   r"limit=1/1h stage=rcpt .*rcpt=<r2@example\.org>")
    s.log.wait_for(r"delay stage=rcpt wait=300ms$")
    assert len(s.log.findall(r"delay stage=rcpt wait=")) == 1, s.log.tail()


def test_milter_delay_yields_to_a_refusal(sluiced):
    """A stricter rule that refuses is answered at once: a refusal is not delayed."""
    s = sluiced(config(delay_rule("2s"),
                       'limit "cap" { stage = "rcpt"; key = "rcpt_domain"; '
                       'rate = ["1/1h"]; }', workers=1))
    with mw.MilterClient(s.milter_socket) as a:
        a.negotiate()
        a.connect(port=40003)
        a.helo()
        assert mw.accepted(a.message(recipients=["<r1@example.org>"]))
        assert passed(a.mail())
        t0 = time.monotonic()
        code, payload = a.rcpt("<r2@example.org>")
        assert code == mw.REPLYCODE and payload.startswith(b"451 4.7.1 "), (code, payload)
        assert time.monotonic() - t0 < 1.0
        a.quit()
    assert not s.log.search(r"delay stage=rcpt wait="), s.log.tail()


def test_milter_hangup_during_a_delay(sluiced):
    """The MTA gives up while a reply is held: the session ends, sluiced goes on."""
    s = sluiced(config(delay_rule("500ms", rate="1/1h"), workers=1))
    with mw.MilterClient(s.milter_socket) as a:
        a.negotiate()
        a.connect(port=40004)
        a.helo()
        assert mw.accepted(a.message(recipients=["<r1@example.org>"]))
        a.mail()
        a.send(mw.RCPT, mw.strs("<r2@example.org>"))
        time.sleep(0.1)
    wait_until(lambda: s.milter_stats()["sessions_current"] == 0, 5, "the session to end")
    with mw.MilterClient(s.milter_socket) as b:
        b.negotiate()
        b.connect(port=40005)
        b.helo()
        assert passed(b.mail())
        assert b.rcpt("<r@other.example>")[0] == mw.CONTINUE
        b.quit()


# ---------------------------------------------------------------------------------------
# the policy service, with the real Postfix

def policy_socket(s):
    return f"{s.dir}/policy.sock"


def rcpt_timed(pf, rcpt):
    """One message over SMTP: (seconds RCPT took, its reply code, the DATA reply)."""
    with smtplib.SMTP(local_hostname="client.sluice.test", timeout=60) as c:
        c.connect("127.0.0.1", pf.port)
        c.ehlo()
        code, text = c.mail(FROM)
        assert code == 250, (code, text)
        t0 = time.monotonic()
        code, text = c.rcpt(rcpt)
        took = time.monotonic() - t0
        data = None
        if code == 250:
            data = c.data(f"From: <{FROM}>\r\nTo: <{rcpt}>\r\nSubject: tarpit\r\n\r\nHi.\r\n")
    return took, code, data


def no_postfix_warning(pf):
    bad = pf.maillog.findall(r"^.*(warning|error|fatal|panic): .*$")
    assert not bad, "Postfix warned:\n" + "\n".join(bad)


def test_policy_service_delay_makes_postfix_sleep(sluiced, postfix):
    need("postfix")
    s = sluiced(config(delay_rule("1s"), milter=False, policy=True, workers=2))
    pf = postfix(smtpd_recipient_restrictions=f"check_policy_service unix:{policy_socket(s)}")
    took, code, data = rcpt_timed(pf, "a@example.net")
    assert code == 250 and took < 0.9, (took, code)
    took, code, data = rcpt_timed(pf, "b@example.net")
    assert code == 250, (took, code)
    assert took >= 1.0, f"RCPT answered after {took:.3f}s"
    assert data and data[0] == 250 and b"queued as" in data[1], data
    s.log.wait_for(r'delay stage=rcpt wait=1000ms answer="sleep 1"')
    qid = re.search(rb"queued as ([0-9A-Za-z]+)", data[1]).group(1).decode()
    pf.wait_delivered(qid)
    no_postfix_warning(pf)


# ---------------------------------------------------------------------------------------
# both protocols on one Postfix

def test_milter_and_policy_service_on_one_postfix_are_detected(sluiced, postfix, sluice_cli):
    need("postfix")
    mport = free_port()
    s = sluiced(config('limit "per-domain" { stage = "rcpt"; key = "rcpt_domain"; '
                       'rate = ["100/1h"]; }',
                       "metrics {", f'  listen = "inet:127.0.0.1:{mport}";', "}",
                       policy=True, workers=2))
    out = s.cli("status").stdout
    assert "double use" not in out, out
    pf = postfix(milter=f"unix:{s.milter_socket}",
                 smtpd_recipient_restrictions=f"check_policy_service unix:{policy_socket(s)}")
    for i in range(2):
        took, code, data = rcpt_timed(pf, f"r{i}@example.net")
        assert code == 250 and data and data[0] == 250, (code, data)
    pattern = (r"^.*warning: .*the milter and the policy service both serve the same SMTP "
               r"sessions: each message is counted by both.*$")
    s.log.wait_for(pattern)
    out = s.cli("status").stdout
    m = re.search(r"^double use: the milter and the policy service see the same SMTP "
                  r"sessions \((\d+) seen\)", out, re.M)
    assert m and int(m.group(1)) == 2, out
    st = s.cli("status", "--json").stdout
    assert '"double_use":2' in st, st
    assert len(s.log.findall(pattern)) == 1, s.log.tail()
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as r:
        page = r.read().decode()
    assert re.search(r"^sluice_double_use_sessions_total 2$", page, re.M), page
    # and each message was indeed counted twice
    out = s.cli("limits", "show", "example.net", "per-domain").stdout
    assert "used 4/100" in out, out


def test_separate_sessions_are_not_double_use(sluiced, postfix):
    """The milter and the policy service serving different Postfix instances: no warning."""
    need("postfix")
    s = sluiced(config('limit "per-domain" { stage = "rcpt"; key = "rcpt_domain"; '
                       'rate = ["100/1h"]; }', policy=True, workers=2))
    pf1 = postfix(milter=f"unix:{s.milter_socket}")
    pf2 = postfix(smtpd_recipient_restrictions=f"check_policy_service unix:{policy_socket(s)}")
    for pf in (pf1, pf2):
        took, code, data = rcpt_timed(pf, "x@example.net")
        assert code == 250 and data and data[0] == 250, (code, data)
    assert "double use" not in s.cli("status").stdout
    assert not s.log.search(r"both serve the same SMTP sessions"), s.log.tail()
