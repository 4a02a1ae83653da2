"""What an operator watches: `sluice stats`, `sluice top`, `sluice decisions`, and the
key=value lines of the log (decision ... and delivery ...).

One sluiced serves a milter, a policy service, an intake with its queue and a route to a
smarthost (peers/smarthost.py), with two rules: a tempfail limit of 2 messages an hour per
recipient domain, and a warn rule on the sender that never fires.  Traffic is real: milter
packets (peers/milter_wire.py), Postfix policy requests on the policy socket, SMTP to the intake
(smtplib), and the relay's deliveries to the smarthost.
"""

import json
import re
import smtplib
import socket
import subprocess
import time

import pytest

from peers import milter_wire as w
from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_policy import policy_exchange

HOST = "relay.sluice.test"
RULES = """
limit "per-domain" { stage = "rcpt"; key = "rcpt_domain"; count = "messages"; rate = ["2/1h"]; }
limit "per-sender" { stage = "mail"; key = "sender"; rate = ["1000/1h"]; action = "warn"; }
"""


def observe_config(intake_port, smarthost_port):
    return f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "@DIR@";
log {{ target = "stderr"; level = "info"; }}
control {{
  listen = "unix:@DIR@/control.sock";
}}
milter {{
  listen = "unix:@DIR@/milter.sock";
}}
policy {{
  listen = "unix:@DIR@/policy.sock";
}}
intake {{
  listen = "inet:127.0.0.1:{intake_port}";
  hostname = "{HOST}";
}}
queue {{ dir = "@DIR@/queue"; }}
relay {{
  retry {{ min = 1s; max = 2s; }}
  suspend {{ min = 1s; max = 2s; }}
}}
route "isp" {{
  domains = ["*"];
  smarthost = "[127.0.0.1]:{smarthost_port}";
  tls = "none";
  rate = ["100/1s"];
}}
{RULES}
"""


@pytest.fixture
def node(sluiced, smarthost):
    """Factory: node(**smarthost kwargs) -> (sluiced, smarthost, intake port)."""
    require_binary(SLUICE, "SLUICE")

    def factory(**sh_kwargs):
        sh = smarthost(**sh_kwargs)
        port = free_port()
        return sluiced(observe_config(port, sh.port)), sh, port

    return factory


def milter_message(s, rcpt, qid):
    """One session with one whole message to rcpt (a message aborted would give its count
    back); the MTA's queue id comes as macro i with MAIL, as Postfix sends it.  Returns
    the RCPT reply."""
    with w.MilterClient(s.milter_socket) as c:
        c.negotiate()
        c.connect(host="client.example.net", address="192.0.2.7")
        c.helo("client.example.net")
        c.macro(w.MAIL, "i", qid)
        out = c.message("<sender@example.net>", [f"<{rcpt}>"])
        c.quit()
        return out["rcpt"][0]


def policy_request(s, rcpt, qid):
    """One Postfix policy request at RCPT; returns the action line."""
    req = ("request=smtpd_access_policy\nprotocol_state=RCPT\nprotocol_name=ESMTP\n"
           "client_address=198.51.100.9\nclient_name=mx.client.test\n"
           "helo_name=helo with space.test\nsender=from@client.test\n"
           f"recipient={rcpt}\nqueue_id={qid}\ninstance={qid}.1\n\n")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(f"{s.dir}/policy.sock")
        return policy_exchange(sock, req).strip()


def queue_message(port, rcpts, sender="list@example.org"):
    """One message through the intake; returns its queue id."""
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as c:
        msg = (f"From: <{sender}>\r\nTo: <list@example.org>\r\nSubject: observe\r\n"
               f"Message-ID: <{time.time()}@example.org>\r\n\r\nHello.\r\n")
        c.ehlo("client.sluice.test")
        c.mail(sender)
        for r in rcpts:
            code, _ = c.rcpt(r)
            assert code == 250, (r, code)
        code, text = c.data(msg.encode())
        assert code == 250, text
        m = re.search(rb"queued as (\S+)", text)
        assert m, text
        return m.group(1).decode()


def refuse_traffic(s):
    """Three messages to one domain through the milter (the third refused) and three
    requests to another through the policy service (the third refused)."""
    replies = [milter_message(s, "rcpt@limited.example", f"MQ{i}") for i in range(3)]
    assert [r[0] for r in replies[:2]] == [w.CONTINUE, w.CONTINUE], replies
    assert replies[2][0] == w.REPLYCODE and replies[2][1].startswith(b"451"), replies
    actions = [policy_request(s, "user@policy.example", f"PQ{i}") for i in range(3)]
    assert actions[:2] == ["action=DUNNO", "action=DUNNO"], actions
    assert actions[2].startswith("action=451 4.7.1"), actions


# ---------------------------------------------------------------------------------------
# decision lines

def test_one_decision_line_per_refused_transaction(node):
    s, _, _ = node()
    refuse_traffic(s)
    lines = s.log.findall(r"^.* decision .*$")
    assert len(lines) == 2, "\n".join(lines) or s.log.tail(30)
    milter, policy = lines
    assert re.search(r'notice: sid=\w+ svc=milter peer=\S+ decision rule=per-domain '
                     r'action=tempfail key="limited\.example" count=2 limit=2/1h stage=rcpt '
                     r'retry=\d+s client=192\.0\.2\.7 helo="client\.example\.net" '
                     r'from=<sender@example\.net> rcpt=<rcpt@limited\.example> qid=MQ2$',
                     milter), milter
    assert re.search(r'notice: sid=\w+ svc=policy peer=\S+ decision rule=per-domain '
                     r'action=tempfail key="policy\.example" count=2 limit=2/1h stage=rcpt '
                     r'retry=\d+s client=198\.51\.100\.9 helo="helo with space\.test" '
                     r'from=<from@client\.test> rcpt=<user@policy\.example> qid=PQ2$',
                     policy), policy
    # the rule that never fired wrote nothing, and nothing else speaks of a limit
    assert not s.log.search(r"rule=per-sender"), s.log.tail(20)


def test_decision_line_quotes_and_cuts_peer_strings(node):
    s, _, _ = node()
    for i in range(3):
        with w.MilterClient(s.milter_socket) as c:
            c.negotiate()
            c.connect(host="client.example.net", address="192.0.2.8")
            c.helo('evil" helo=forged \x01' + "h" * 300)
            c.macro(w.MAIL, "i", "Q 1")
            c.message("<sender@example.net>", ["<rcpt@quoted.example>"])
            c.quit()
    line = s.log.wait_for(r"^.* decision rule=per-domain .*$", timeout=5).group(0)
    assert 'helo="evil\\" helo=forged \\x01hhh' in line, line
    assert re.search(r'h\.\.\." from=', line), f"the HELO name is not cut: {line}"
    assert len(line) < 1000, line
    # a value with a space is quoted, so that the line still splits on spaces
    assert line.endswith(' qid="Q 1"'), line


# ---------------------------------------------------------------------------------------
# sluice stats, decisions, top

def test_stats_shows_services_in_columns_and_json(node):
    s, _, _ = node()
    refuse_traffic(s)
    wait_until(lambda: s.stats()["milter"]["sessions_current"] == 0, 10, "milter sessions end")
    out = s.cli("stats").stdout
    header = out.splitlines()[0].split()
    assert header[:4] == ["service", "connections", "now", "peak"], out
    rows = {l.split()[0]: l.split() for l in out.splitlines()[1:6] if l.strip()}
    assert rows["milter"][1] == "3" and rows["policy"][1] == "3", out
    # duration and work tables: a row per service for the interval and since start
    assert re.search(r"^session duration \(s\)\s+sessions\s+min\s+mean\s+max\s+std-dev$",
                     out, re.M), out
    assert re.search(r"^work time \(ms\)\s+sessions", out, re.M), out
    m = re.search(r"^milter\s+so far \d+ s\s+3\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                  out, re.M)
    assert m, out
    lo, mean, hi, sd = map(float, m.groups())
    assert 0 <= lo <= mean <= hi < 10 and sd >= 0, out
    assert re.search(r"^\s+since start\s+3\s", out, re.M), out
    assert all(len(l) <= 80 for l in out.splitlines()), out
    assert re.search(r"^queue: 0 messages", out, re.M), out
    assert re.search(r"^relay: ", out, re.M), out

    st = s.stats()
    assert st["milter"]["connections"] == 3 and st["policy"]["connections"] == 3, st
    assert st["milter"]["last_interval_complete"] is False
    assert st["milter"]["last_interval"]["connections"] == 3
    assert st["milter"]["last_interval"]["duration"]["count"] == 3

    # --reset ends the interval: it is logged, and becomes the last complete one
    s.cli("stats", "--reset")
    s.log.wait_for(r"stats svc=milter interval=\d+s connections=3 ", timeout=5)
    milter_message(s, "other@else.example", "MQ9")
    wait_until(lambda: s.stats()["milter"]["interval"]["sessions"] == 1, 10, "session end")
    st = s.stats()["milter"]
    assert st["last_interval_complete"] is True
    assert st["last_interval"]["connections"] == 3 and st["interval"]["connections"] == 1, st
    assert st["connections"] == 4
    assert re.search(r"^milter\s+last \d+ s\s+3\s", s.cli("stats").stdout, re.M)


def test_decisions_counts_per_rule(node):
    s, _, _ = node()
    refuse_traffic(s)
    rules = {r["rule"]: r for r in json.loads(s.cli("decisions", "--json").stdout)["rules"]}
    assert rules["per-domain"] == {"rule": "per-domain", "stage": "rcpt",
                                   "action": "tempfail", "passed": 4, "over": 2}, rules
    # the warn rule runs at MAIL for the milter (3 messages) and for each policy request
    assert rules["per-sender"]["over"] == 0 and rules["per-sender"]["passed"] >= 3, rules
    text = s.cli("decisions").stdout
    assert re.search(r"^per-domain\s+rcpt\s+tempfail\s+4\s+2$", text, re.M), text
    # `sluice test` explains without counting
    s.cli("test", "--rcpt", "x@limited.example")
    again = json.loads(s.cli("decisions", "--json").stdout)["rules"]
    assert {r["rule"]: r for r in again}["per-domain"]["passed"] == 4


def test_top_batch_frames(node, sluice_cli):
    # a smarthost that defers every recipient: the message stays queued in its lane
    s, sh, port = node(rcpt_tempfail_p=1.0)
    refuse_traffic(s)
    queue_message(port, ["a@dest.example"])
    wait_until(lambda: s.stats()["relay"]["deferred"] >= 1, 20, "a deferral")
    res = subprocess.run([sluice_cli, "-s", s.control_socket, "top", "-b", "2", "-n", "1"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "\033" not in out, "batch mode wrote terminal control"
    frames = out.split("\nsluice top ")
    assert len(frames) == 2 and out.startswith("sluice top "), out
    first, second = frames
    for f in frames:
        # peaks: a session may still be closing when the next one opens
        assert re.search(r"^sessions  now/peak  milter 0/\d  policy 0/\d  intake 0/1  "
                         r"control 1/1$", f, re.M), f
        assert re.search(r"^queue\s+1 messages \(0 held\), 1 recipients to do", f, re.M), f
        assert re.search(r"^isp\s+\d+/100/1s\s+next \S+\s+conns \d/\d\s+waiting 1\s+"
                         r"sent/def/fail 0/\d+/0$", f, re.M), f
        assert len(f.splitlines()) <= 24 and all(len(l) <= 80 for l in f.splitlines()), f
    # the first frame has no rate yet; the second has them, from the counters' difference
    assert re.search(r"^per-domain\s+rcpt\s+tempfail\s+-\s+2$", first, re.M), first
    assert re.search(r"^per-domain\s+rcpt\s+tempfail\s+0\.0\s+2$", second, re.M), second
    assert re.search(r"^per-domain\s+rcpt\s+pass\s+0\.0\s+4$", second, re.M), second
    assert re.search(r"^relay\s+sent -/s  deferred -/s  failed -/s  total 0/\d+/0  susp 0$",
                     first, re.M), first
    assert re.search(r"^relay\s+sent 0\.0/s  deferred [\d.]+/s  failed 0\.0/s  total 0/\d+/0",
                     second, re.M), second
    # the keys nearest their limits: both domains are full
    assert re.search(r"^100\.0%\s+per-domain\s+limited\.example\s+2/2/1h", second, re.M), second
    assert re.search(r"^100\.0%\s+per-domain\s+policy\.example\s+2/2/1h", second, re.M), second

    bad = subprocess.run([sluice_cli, "-s", s.control_socket, "top", "-n", "0"],
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode == 2 and "-n" in bad.stderr, bad


def test_top_quits_when_the_daemon_goes_away(node, sluice_cli):
    s, _, _ = node()
    p = subprocess.Popen([sluice_cli, "-s", s.control_socket, "top", "-b", "1000", "-n", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    s.stop()
    out, err = p.communicate(timeout=20)
    assert p.returncode == 1, (p.returncode, err)
    assert "sluice top" in out and "closed the connection" in err, err


# ---------------------------------------------------------------------------------------
# delivery lines

def test_delivery_lines_sent(node):
    s, sh, port = node()
    qid = queue_message(port, ["one@dest.example", "two@dest.example"])
    assert s.log.wait_for(rf"svc=intake peer=\S+ queued qid={qid} from=<list@example\.org> "
                          r"nrcpt=2 size=\d+ client=\[127\.0\.0\.1\]$", timeout=5)
    wait_until(lambda: s.stats()["relay"]["delivered"] == 2, 20, "both delivered")
    lines = s.log.findall(r"^.* delivery .*$")
    assert len(lines) == 2, "\n".join(lines)
    for rcpt, line in zip(sorted(["one@dest.example", "two@dest.example"]), sorted(lines)):
        assert re.search(rf"info: relay: delivery qid={qid} rcpt=<{re.escape(rcpt)}> lane=isp "
                         rf"relay=\S*\[127\.0\.0\.1\]:{sh.port} status=sent dsn=2\.\d\.\d "
                         r'reply="250 [^"]*" delay=\d+\.\ds attempts=1$', line), line


def test_delivery_lines_deferred(node):
    s, sh, port = node(rcpt_tempfail_p=1.0)
    qid = queue_message(port, ["later@dest.example"])
    line = s.log.wait_for(r"^.* delivery .*$", timeout=20).group(0)
    assert re.search(rf"relay: delivery qid={qid} rcpt=<later@dest\.example> lane=isp "
                     rf"relay=\S*\[127\.0\.0\.1\]:{sh.port} status=deferred dsn=4\.3\.0 "
                     r'reply="451 4\.3\.0 [^"]*" delay=\d+\.\ds attempts=1$', line), line
    assert not s.log.search(r"status=sent"), s.log.tail(20)


def test_stats_interval_tick_ends_the_interval(sluiced):
    """With stats_interval, each tick ends an interval: `last` becomes that interval (about
    the configured length) while the counts go on in the one in progress."""
    from conftest import milter_config
    s = sluiced(milter_config(stats_interval="1s"))
    with w.MilterClient(s.milter_socket) as c:
        c.negotiate()
        c.quit()
    wait_until(lambda: s.stats()["milter"]["last_interval_complete"], 5, "an interval to end")
    wait_until(lambda: s.stats()["milter"]["last_interval"]["connections"] == 0, 5,
               "an interval without the session")
    st = s.stats()["milter"]
    assert 0.5 < st["last_interval"]["seconds"] < 3, st
    assert st["connections"] == 1 and st["since_start"]["connections"] == 1, st
    out = s.cli("stats").stdout
    assert re.search(r"^milter\s+last \d s\s+0\s+-", out, re.M), out
