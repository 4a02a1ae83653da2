"""doc/ABUSE.md, followed as written, with a private Postfix instance and sluiced.

The guide stops a compromised SASL account: distinct recipients per login with a
penalty box (`block`), a chain of keys scoped with `only { }` for mixed traffic, and
sessions at once per login or per client address.  Each test takes the guide's blocks
(see guide.py) and hooks sluiced into Postfix with doc/POSTFIX.md's own blocks (the
milter, or the policy service on TCP), then sends mail through Postfix with smtplib.

The test client poses as an authenticated user and as other client addresses with
Postfix's XCLIENT command (XCLIENT ADDR=... LOGIN=...; `smtpd_authorized_xclient_hosts =
127.0.0.0/8`): Postfix then treats the session as one from that address, authenticated
as that login (`sasl_method=XCLIENT`), gives the milter the login as `{auth_authen}` and
the policy service as `sasl_username`, and opens a new milter connection for the new
client.  The Postfix instance is a submission server: `permit_sasl_authenticated` in
`smtpd_relay_restrictions`, 192.0.2.0/24 in `mynetworks` (the guide's network of its
own clients), and `example.com` a domain it accepts mail for from anyone (MX traffic).

The only changes made to the guide's blocks are the substitutions listed in each test:
paths and ports, rates, `max` and `block` small enough for a test to reach in
seconds, and once the reply (to show its %{retry}).  A substitution that no longer
applies fails the test (the guide changed: the test must follow).  The `console` blocks
are run command by command (`$ sluice ARGS` is run as `sluice -s CONTROL ARGS`) and what
they print is compared with the guide's text, digits aside.

What Postfix 3.7 does, as the tests assert it: the policy service's 451 comes back as
`451 4.7.1 <RCPT>: Recipient address rejected: TEXT`, the milter's as `451 4.7.1 TEXT`;
a session a milter refuses at CONNECT is still greeted (220) and its EHLO answered
(250), and each MAIL gets the rule's 451 (the log says `milter-reject: CONNECT from`, or
`XCLIENT from` when XCLIENT set the address, then the same for EHLO and MAIL).
"""

import re
import shlex
import shutil
import smtplib
import time
import urllib.request

import pytest

import guide
from conftest import SLUICE, free_port, require_binary, wait_until

GUIDE = "ABUSE.md"

REAL = ("/var/spool/postfix", "/run/sluice", "/var/spool/sluice", "/var/lib/sluice",
        ":10031", ":9187")

HELO = "client.example.org"

# sluiced's own lines (log on stderr, for the fixture), next to the guide's blocks
BASE = """log { target = "stderr"; level = "info"; }
control { listen = "unix:@DIR@/control.sock"; }
"""

# The submission server: what the test's Postfix adds to doc/POSTFIX.md's main.cf lines.
SUBMISSION = {
    "smtpd_authorized_xclient_hosts": "127.0.0.0/8",
    "smtpd_sasl_auth_enable": "yes",
    "smtpd_relay_restrictions":
        "permit_mynetworks, permit_sasl_authenticated, reject_unauth_destination",
    "mynetworks": "127.0.0.0/8 192.0.2.0/24",
    "relay_domains": "example.com",
}


@pytest.fixture(autouse=True)
def _need_tools():
    if not shutil.which("postfix", path="/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip("postfix is not installed")
    require_binary(SLUICE, "SLUICE")


# ---------------------------------------------------------------------------------------
# the guide's blocks, and Postfix hooked up as doc/POSTFIX.md says

def abuse(kind, name, table=()):
    return guide.follow(GUIDE, kind, name, list(table), REAL)


def postfix_block(kind, name, table=()):
    return guide.follow("POSTFIX.md", kind, name, list(table), REAL)


def start(sluiced, postfix, via, *rules, metrics_port=None):
    """Postfix with sluiced as its milter or policy service (doc/POSTFIX.md's blocks),
    sluiced with BASE and the given rule texts: (sluiced, postfix)."""
    blocks = [BASE, *rules]
    if metrics_port is not None:
        blocks.append(abuse("sluice.conf", "metrics", [("9187", str(metrics_port))]))
    if via == "milter":
        pf = postfix(**guide.main_cf(postfix_block("main.cf", "milter")), **SUBMISSION)
        guide.run_sh(postfix_block("sh", "milter-socket",
                                   [("/var/spool/postfix", str(pf.queue_dir))]))
        blocks.append(postfix_block("sluice.conf", "milter",
                                    [("/var/spool/postfix", str(pf.queue_dir))]))
    else:
        port = free_port()
        pf = postfix(**guide.main_cf(postfix_block("main.cf", "policy",
                                                   [("10031", str(port))])), **SUBMISSION)
        blocks.append(postfix_block("sluice.conf", "policy", [("10031", str(port))]))
    s = sluiced("\n".join(blocks))
    return s, pf


# ---------------------------------------------------------------------------------------
# an SMTP client that poses as another client address and login through XCLIENT

class Client:
    def __init__(self, pf, addr, login=None):
        self.smtp = smtplib.SMTP("127.0.0.1", pf.port, timeout=30)
        code, text = self.smtp.ehlo(HELO)
        assert code == 250 and b"XCLIENT" in text, (code, text)
        attrs = f"ADDR={addr}" + (f" LOGIN={login}" if login else "")
        code, text = self.smtp.docmd("XCLIENT", attrs)
        # Postfix answers XCLIENT with a new greeting: the session starts over
        assert code == 220, (code, text)
        self.ehlo = self.smtp.ehlo(HELO)

    def mail(self, sender):
        code, text = self.smtp.mail(sender)
        return code, text.decode()

    def rcpt(self, rcpt):
        code, text = self.smtp.rcpt(rcpt)
        return code, text.decode()

    def data(self):
        code, text = self.smtp.data(b"Subject: abuse test\r\n\r\nHello.\r\n")
        return code, text.decode()

    def close(self):
        try:
            self.smtp.quit()
        except smtplib.SMTPException:
            self.smtp.close()


def refused(reply, text, via, rcpt=None):
    """reply (code, text) is the rule's 451 as Postfix passes it on: as is from the
    milter, inside Postfix's access-restriction form from the policy service."""
    code, got = reply
    prefix = (re.escape(f"<{rcpt}>: Recipient address rejected: ")
              if via == "policy" and rcpt else "")
    assert code == 451 and re.fullmatch(r"4\.7\.1 " + prefix + re.escape(text), got), reply


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def sample(page, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", page, re.M)
    return float(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------
# a. distinct recipients per login (about 3 s each way: Postfix's start is most of it)

@pytest.mark.parametrize("via", ["milter", "policy"])
def test_distinct_per_login(sluiced, postfix, via):
    mport = free_port()
    s, pf = start(sluiced, postfix, via,
                  abuse("sluice.conf", "fan-out", [("100/1h", "3/1h")]), metrics_port=mport)
    text = "Too many new recipients for alice, try again later"

    alice = Client(pf, "203.0.113.9", "alice")
    assert alice.mail("alice@example.org")[0] == 250
    for i in (1, 2, 3):
        assert alice.rcpt(f"r{i}@example.net")[0] == 250, i
    # a recipient already counted costs 0 and passes
    assert alice.rcpt("r1@example.net")[0] == 250
    # the fourth new one is refused, with the rule's reply...
    refused(alice.rcpt("r4@example.net"), text, via, "r4@example.net")
    # ... and the refusal put alice in the penalty box (block = 1h): now even a
    # recipient already counted is refused
    refused(alice.rcpt("r1@example.net"), text, via, "r1@example.net")
    assert alice.data()[0] == 250     # the message to the three goes
    alice.close()

    # another login is not affected, not even for the recipient refused to alice
    bob = Client(pf, "203.0.113.10", "bob")
    assert bob.mail("bob@example.org")[0] == 250
    assert bob.rcpt("r4@example.net")[0] == 250
    assert bob.rcpt("b1@example.net")[0] == 250
    bob.close()

    show = s.cli("limits", "show", "alice", "fan-out").stdout
    assert re.fullmatch(r"fan-out alice: 3/1h used 3/3; BLOCKED \(block = 3600s\), "
                        r"ends in 3[56]\d\ds\n", show), show
    assert s.cli("limits", "show", "bob", "fan-out").stdout == "fan-out bob: 3/1h used 2/3\n"

    # the log: one decision line per refusal, with the login and the recipient
    s.log.wait_for(r' decision rule=fan-out action=tempfail key="alice" count=3 '
                   r'limit=3/1h stage=rcpt retry=\d+s client=203\.0\.113\.9 '
                   rf'helo="{HELO}" from=<alice@example\.org> rcpt=<r4@example\.net> qid=\w+')
    assert len(s.log.findall(r" decision rule=fan-out ")) == 2
    if via == "milter":
        pf.maillog.wait_for(r"milter-reject: RCPT from unknown\[203\.0\.113\.9\]: 451 4\.7\.1 "
                            + re.escape(text) + r"; from=<alice@example\.org> "
                            r"to=<r4@example\.net> .*sasl_username=<alice>")
    else:
        pf.maillog.wait_for(r"reject: RCPT from unknown\[203\.0\.113\.9\]: 451 4\.7\.1 "
                            r"<r4@example\.net>: Recipient address rejected: "
                            + re.escape(text))
    pf.maillog.wait_for(r"client=unknown\[203\.0\.113\.9\], sasl_method=XCLIENT, "
                        r"sasl_username=alice")

    # the metrics the guide tells to alert on, as a scrape shows them
    page = scrape(mport)
    names = set(re.findall(r"\bsluice_[a-z_]+", guide.DOC.joinpath(GUIDE).read_text()))
    assert names
    for name in names:
        assert re.search(rf"^# TYPE {name} ", page, re.M), f"{name} is not on /metrics"
    # passed: r1 r2 r3 r1 (alice), r4 b1 (bob); refused: r4 r1 (alice)
    assert sample(page, "sluice_rule_decisions_total", rule="fan-out",
                  verdict="continue") == 6, page
    assert sample(page, "sluice_rule_decisions_total", rule="fan-out",
                  verdict="tempfail") == 2, page
    assert sample(page, "sluice_rule_near_limit_total", rule="fan-out") is not None, page


# ---------------------------------------------------------------------------------------
# b. the block outlasts the window (about 7 s: the 4 s block, Postfix's start)

def test_block_outlasts_the_window(sluiced, postfix):
    block = 4
    s, pf = start(sluiced, postfix, "milter",
                  abuse("sluice.conf", "fan-out",
                        [("100/1h", "1/2s"), ("block = 1h", f"block = {block}s")]))
    alice = Client(pf, "203.0.113.9", "alice")
    assert alice.mail("alice@example.org")[0] == 250
    assert alice.rcpt("r1@example.net")[0] == 250
    code, _ = alice.rcpt("r2@example.net")
    refused_at = time.monotonic()
    assert code == 451

    # the window has room again after 2 s; the block holds for 4
    time.sleep(2.5)
    show = s.cli("limits", "show", "alice", "fan-out").stdout
    assert re.fullmatch(r"fan-out alice: 1/2s used 0/1; BLOCKED \(block = 4s\), "
                        r"ends in [12]s\n", show), show
    assert alice.rcpt("r3@example.net")[0] == 451
    # refusals during the block do not extend it
    time.sleep(max(0.0, refused_at + block + 0.3 - time.monotonic()))
    assert s.cli("limits", "show", "alice", "fan-out").stdout == \
        "fan-out alice: 1/2s used 0/1\n"
    assert alice.rcpt("r4@example.net")[0] == 250
    alice.close()


def test_block_retry(sluiced, postfix):
    """The refusal that starts a block tells the block's wait, not the window's (20 m
    here): the client is not told to come back while the block still holds.  About 3 s."""
    rate = "3/1h"
    s, pf = start(sluiced, postfix, "milter",
                  abuse("sluice.conf", "fan-out", [("100/1h", rate),
                                                   ("try again later", "try again in %{retry}")]))
    alice = Client(pf, "203.0.113.9", "alice")
    assert alice.mail("alice@example.org")[0] == 250
    for i in range(int(rate.split("/")[0])):
        assert alice.rcpt(f"r{i}@example.net")[0] == 250
    code, text = alice.rcpt("new@example.net")
    alice.close()
    assert code == 451
    line = s.log.wait_for(r" decision rule=fan-out .*").group(0)
    assert "retry=3600s" in line, line
    assert re.fullmatch(r"4\.7\.1 Too many new recipients for alice, try again in 1h\d+m",
                        text), text


# ---------------------------------------------------------------------------------------
# c. the chain of keys, scoped with only { } (about 3 s)

def test_chain_in_own_networks(sluiced, postfix):
    s, pf = start(sluiced, postfix, "policy",
                  abuse("sluice.conf", "fan-out-chain", [("100/1h", "2/1h")]))

    def send(addr, sender, rcpts, login=None):
        c = Client(pf, addr, login)
        assert c.mail(sender)[0] == 250
        replies = [c.rcpt(r) for r in rcpts]
        c.close()
        return replies

    # a host of the network without a login: counted by its sender
    r = send("192.0.2.20", "web@example.org",
             ["n1@example.net", "n2@example.net", "n3@example.net"])
    assert [c for c, _ in r] == [250, 250, 451], r
    assert re.fullmatch(r"4\.7\.1 <n3@example\.net>: Recipient address rejected: Rate limit "
                        r"exceeded for sender:web@example\.org, try again in \w+", r[2][1]), r
    show = s.cli("limits", "show", "sender:web@example.org", "fan-out-chain").stdout
    assert "used 2/2; BLOCKED" in show, show
    # the log writes the key as `sluice limits` takes it
    s.log.wait_for(r' decision rule=fan-out-chain action=tempfail '
                   r'key="sender:web@example\.org" ')

    # a login in the network: counted by the login, whatever its sender
    r = send("192.0.2.21", "web@example.org", ["l1@example.net", "l2@example.net"], "alice")
    assert [c for c, _ in r] == [250, 250], r
    assert s.cli("limits", "show", "sasl_user:alice", "fan-out-chain").stdout.startswith(
        "fan-out-chain sasl_user:alice: 2/1h used 2/2; full")

    # a bounce (the null sender): counted by its client, the chain's last alternative
    r = send("192.0.2.22", "<>", ["d1@example.net"])
    assert [c for c, _ in r] == [250], r
    assert s.cli("limits", "show", "client_ip:192.0.2.22", "fan-out-chain").stdout == \
        "fan-out-chain client_ip:192.0.2.22: 2/1h used 1/2\n"

    # outside the network (mail from the Internet to example.com): the rule does not
    # apply, though the sender is the blocked one
    r = send("198.51.100.7", "web@example.org",
             ["x1@example.com", "x2@example.com", "x3@example.com"])
    assert [c for c, _ in r] == [250, 250, 250], r
    assert len(s.log.findall(r" decision rule=fan-out-chain ")) == 1

    # the block lifted, as the guide says for a key of the chain
    assert s.cli("limits", "reset", "sender:web@example.org", "fan-out-chain").stdout == \
        "fan-out-chain sender:web@example.org: reset\n"
    r = send("192.0.2.20", "web@example.org", ["n3@example.net"])
    assert [c for c, _ in r] == [250], r
    res = s.cli("test", "--client-ip", "198.51.100.7", "--from", "web@example.org",
                "--rcpt", "x4@example.com").stdout
    assert "does not apply (only client_ip: no match)" in res, res


# ---------------------------------------------------------------------------------------
# d. sessions at once, through the milter (about 3 s each)

SESSIONS = {
    # the guide's block, its substitution, a client of the key, a client of another
    # key, the reply, the key
    "login": ("sessions", ("max = 5", "max = 2"),
                 lambda pf, i: Client(pf, f"203.0.113.{10 + i}", "alice"),
                 lambda pf: Client(pf, "203.0.113.50", "bob"),
                 "Too many sessions at once for alice", "alice"),
    "address": ("sessions-per-address", ("max = 10", "max = 2"),
                             lambda pf, i: Client(pf, "192.0.2.10"),
                             lambda pf: Client(pf, "198.51.100.7"),
                             "Too many sessions from 192.0.2.10", "192.0.2.10"),
}


@pytest.mark.parametrize("per", sorted(SESSIONS))
def test_sessions(sluiced, postfix, per):
    name, subst, same, other, text, key = SESSIONS[per]
    s, pf = start(sluiced, postfix, "milter", abuse("sluice.conf", name, [subst]))
    rule = re.search(r'limit "([^"]+)"', abuse("sluice.conf", name, [subst])).group(1)

    def held():
        return s.cli("limits", "show", key, rule).stdout

    # two sessions of the key, kept open (a session takes its slot at its first MAIL
    # for the login, at CONNECT for the address)
    open_ = []
    for i in range(2):
        c = same(pf, i)
        assert c.mail("a@example.org")[0] == 250, i
        open_.append(c)
    assert held() == f"{rule} {key}: 2 of 2 sessions at once (this node's milter sessions)\n"

    # a third is refused: Postfix greets it and answers EHLO, then refuses its MAIL
    # with the rule's reply
    third = same(pf, 2)
    assert third.ehlo[0] == 250, third.ehlo
    refused(third.mail("a@example.org"), text, "milter")
    third.close()
    # ... while another login or address is served
    c = other(pf)
    assert c.mail("b@example.org")[0] == 250
    c.close()

    # one ends: its slot comes back, and a new session of the key is served
    open_.pop(0).close()
    wait_until(lambda: held().startswith(f"{rule} {key}: 1 of 2 "), 10,
               "the ended session's slot to come back")
    c = same(pf, 3)
    assert c.mail("a@example.org")[0] == 250
    c.close()
    for c in open_:
        c.close()

    s.log.wait_for(rf' decision rule={rule} action=tempfail key="{re.escape(key)}" count=2 '
                   r"limit=2 ")
    where = "MAIL" if per == "login" else "XCLIENT"
    pf.maillog.wait_for(rf"milter-reject: {where} from unknown\[[0-9.]+\]: 451 4\.7\.1 "
                        + re.escape(text))
    if per == "address":
        # without XCLIENT, refused at CONNECT: greeted (smtplib checks the 220), EHLO
        # answered, MAIL refused
        plain = [smtplib.SMTP("127.0.0.1", pf.port, timeout=30) for _ in range(3)]
        for c in plain:
            assert c.ehlo(HELO)[0] == 250
        assert [c.mail("a@example.org")[0] for c in plain] == [250, 250, 451]
        for c in plain:
            c.quit()
        pf.maillog.wait_for(r"milter-reject: CONNECT from unknown\[127\.0\.0\.1\]: 451 4\.7\.1 "
                            r"Too many sessions from 127\.0\.0\.1; proto=SMTP")


def test_sessions_policy_skips(sluiced, postfix):
    """The guide: the policy service skips sessions rules (it never learns when a session
    ends).  Three sessions of one login at once, all served.  About 3 s."""
    s, pf = start(sluiced, postfix, "policy",
                  abuse("sluice.conf", "sessions", [("max = 5", "max = 2")]))
    clients = [Client(pf, f"203.0.113.{10 + i}", "alice") for i in range(3)]
    for c in clients:
        assert c.mail("alice@example.org")[0] == 250
        assert c.rcpt("r@example.net")[0] == 250     # a policy request at RCPT
    for c in clients:
        c.close()
    assert not s.log.findall(r" decision rule=sessions-per-login ")
    res = s.cli("test", "--sasl-user", "alice", "--from", "alice@example.org",
                "--rcpt", "r@example.net").stdout
    assert "counted through the milter only" in res, res


# ---------------------------------------------------------------------------------------
# e. "Why was it refused?" and "Letting the user back in", as written (about 4 s)

def run_console(s, text):
    """Run each `$ sluice ...` line of a console block; the output, as the block shows it
    (commands and what they printed), with every number replaced by N."""
    out = []
    for line in text.splitlines():
        if line.startswith("$ "):
            args = shlex.split(line[2:])
            assert args[0] == "sluice", line
            out.append(line)
            out += s.cli(*args[1:]).stdout.splitlines()
    return out


def digits_aside(lines):
    return [re.sub(r"\d+", "N", l) for l in lines]


def test_why_and_reset(sluiced, postfix):
    # the rules exactly as the guide gives them: 100 new recipients, then the block
    s, pf = start(sluiced, postfix, "milter", abuse("sluice.conf", "fan-out"),
                  abuse("sluice.conf", "sessions"))
    alice = Client(pf, "203.0.113.9", "alice")
    assert alice.mail("alice@example.org")[0] == 250
    for i in range(100):
        assert alice.rcpt(f"x{i}@example.net")[0] == 250, i
    assert alice.rcpt("x100@example.net")[0] == 451
    alice.close()
    wait_until(lambda: "0 of 5" in s.cli("limits", "show", "alice",
                                         "sessions-per-login").stdout,
               10, "alice's session to end")

    why = guide.block(GUIDE, "console", "why")
    assert digits_aside(run_console(s, why)) == digits_aside(why.splitlines())

    reset = guide.block(GUIDE, "console", "reset")
    assert digits_aside(run_console(s, reset)) == digits_aside(reset.splitlines())
    # let back in: a new recipient passes
    alice = Client(pf, "203.0.113.9", "alice")
    assert alice.mail("alice@example.org")[0] == 250
    assert alice.rcpt("new@example.net")[0] == 250
    alice.close()
