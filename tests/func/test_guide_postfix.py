"""doc/POSTFIX.md, followed as written, with a private Postfix instance and sluiced.

Each test takes the guide's blocks (see guide.py) for one way of using sluice -- the
milter, the policy service (on TCP, and on a unix socket inside Postfix's queue
directory), the relayhost -- and runs them: main.cf blocks become the private Postfix's
main.cf settings, sluice.conf blocks are sluiced's whole configuration, sh blocks are
run.  Then it checks what an administrator would: the guide's example rule refuses the
51st recipient from one client with its own reply, through Postfix, the mail within the
limit is delivered, Postfix behaves as the guide says when sluiced is down, and mail
handed to the relayhost leaves through the guide's route.

The only changes made to the blocks are the substitutions of table() below: the paths
of a real installation become the test's private ones, the ports become free ports, and
the smarthost's address is the test smarthost's.  A substitution that no longer applies
fails the test (the guide changed; the test must follow).
"""

import json
import re
import shutil

import pytest

import guide
from conftest import SLUICE, free_port, queued_id, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)

GUIDE = "POSTFIX.md"


@pytest.fixture(autouse=True)
def _need_tools():
    for tool in ("swaks", "postfix"):
        if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin"):
            pytest.skip(f"{tool} is not installed")
    require_binary(SLUICE, "SLUICE")


def table(s=False, pf=None, intake_port=None, policy_port=None, sh=None):
    """The substitutions: (text in the guide, text in this test); s: sluiced's paths."""
    t = []
    if pf is not None:
        t.append(("/var/spool/postfix", str(pf.queue_dir)))
    if s:
        t += guide.SLUICED_PATHS
    if intake_port is not None:
        t.append(("10025", str(intake_port)))
    if policy_port is not None:
        t.append(("10031", str(policy_port)))
    if sh is not None:
        t.append(("[192.0.2.25]:25", sh.relayhost))
    return t


REAL = ("/var/spool/postfix", "/run/sluice", "/var/spool/sluice", "/var/lib/sluice",
        ":10025", ":10031", "192.0.2.25")


def follow(kind, name, t):
    return guide.follow(GUIDE, kind, name, t, REAL)


def start_sluiced(sluiced, *blocks, **subst):
    t = table(s=True, **subst)
    return sluiced("\n".join(follow("sluice.conf", b, t) for b in blocks))


def send_recipients(pf, n, domain="example.net"):
    """One message through Postfix to n recipients: (accepted, refused)."""
    return guide.send(pf.port, "sender@example.org",
                      [f"user{i}@{domain}" for i in range(n)],
                      b"Subject: guide\r\n\r\nHello.\r\n")


def check_rule_refuses_the_51st(pf, prefix=""):
    """prefix: what Postfix puts before the rule's text (its access-restriction form
    for a policy service's answer).  The rule lets one more recipient through every
    12 s: the 51 RCPTs of one transaction take far less."""
    accepted, refused = send_recipients(pf, 51)
    assert len(accepted) == 50, refused
    assert list(refused) == ["user50@example.net"], refused
    code, text = refused["user50@example.net"]
    assert code == 451 and re.match(
        r"4\.7\.1 " + re.escape(prefix) +
        r"Too many recipients from 127\.0\.0\.1, try again in [0-9dhms]+$", text), text
    # the 50 within the limit are delivered
    pf.wait_sink_messages(1, timeout=60)
    wait_until(lambda: len(set(re.findall(r"user\d+@example\.net",
                                          "".join(pf.sink_messages())))) == 50,
               60, "50 recipients at the sink")


def stats_service(s, name):
    st = json.loads(s.cli("stats", "--json").stdout)
    found = []

    def walk(v):
        if isinstance(v, dict):
            if name in v and isinstance(v[name], dict) and "connections" in v[name]:
                found.append(v[name])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(st)
    assert found, st
    return found[0]


def test_milter(sluiced, postfix):
    pf = postfix(**guide.main_cf(follow("main.cf", "milter", [])))
    guide.run_sh(follow("sh", "milter-socket", table(pf=pf)))
    s = start_sluiced(sluiced, "rules", "milter", pf=pf)

    check_rule_refuses_the_51st(pf)
    # Postfix used the milter, and said nothing about it
    assert stats_service(s, "milter")["connections"] >= 1
    assert not pf.maillog.search(r"warning: .*[Mm]ilter")
    # refused by sluice's answer, not by a failure
    pf.maillog.wait_for(r"milter-reject: RCPT from .*451 4\.7\.1 Too many recipients")

    # sluiced down: the guide's milter_default_action = accept lets mail through
    assert s.stop() == 0
    mark = pf.maillog.mark()
    res = pf.swaks("--from", "sender@example.org", "--to", "late@example.net")
    assert res.returncode == 0, res.stdout + res.stderr
    pf.wait_delivered(queued_id(res.stdout))
    assert pf.maillog.search(r"warning: connect to Milter service unix:sluice/milter\.sock",
                             after=mark)


@pytest.mark.parametrize("variant", ["policy", "policy-unix"])
def test_policy(sluiced, postfix, variant):
    port = free_port()
    pf = postfix(**guide.main_cf(follow("main.cf", variant, table(policy_port=port))))
    if variant == "policy-unix":
        guide.run_sh(follow("sh", "milter-socket", table(pf=pf)))
    s = start_sluiced(sluiced, "rules", variant, pf=pf, policy_port=port)

    check_rule_refuses_the_51st(pf, "<user50@example.net>: Recipient address rejected: ")
    assert stats_service(s, "policy")["connections"] >= 1
    pf.maillog.wait_for(r"reject: RCPT from .*451 4\.7\.1 <user50@example\.net>: "
                        r"Recipient address rejected: Too many recipients from")

    # sluiced down: default_action=DUNNO lets mail through
    assert s.stop() == 0
    res = pf.swaks("--from", "sender@example.org", "--to", "late@example.net")
    assert res.returncode == 0, res.stdout + res.stderr
    pf.wait_delivered(queued_id(res.stdout))


def test_relayhost(sluiced, postfix, smarthost):  # noqa: F811
    sh = smarthost()
    port = free_port()
    pf = postfix(**guide.main_cf(follow("main.cf", "relayhost", table(intake_port=port))))
    s = start_sluiced(sluiced, "relayhost", intake_port=port, sh=sh)

    res = pf.swaks("--from", "sender@example.org", "--to", "user@example.net",
                   "--h-Subject", "through sluice")
    assert res.returncode == 0, res.stdout + res.stderr
    line = pf.wait_delivered(queued_id(res.stdout))
    # Postfix handed it to the intake, which queued it before answering
    m = re.search(rf"relay=127\.0\.0\.1\[127\.0\.0\.1\]:{port}, .*status=sent "
                  r"\(250 2\.0\.0 Ok: queued as ([0-9A-Z]+)\)", line)
    assert m, line
    # ... and the route delivered it to the smarthost
    msg = sh.wait_accepted(1, timeout=30)[0]
    assert msg.sender == "sender@example.org" and list(msg.rcpts) == ["user@example.net"]
    assert msg.header("Subject") == "through sluice"
    assert f" id {m.group(1)}".encode() in msg.content

    def lane():
        lanes = json.loads(s.cli("lanes", "--json").stdout)
        return [l for l in lanes if l["lane"] == "isp" and l["delivered"] == 1]
    wait_until(lane, 20, "lane isp to count the delivery")
