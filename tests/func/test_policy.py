"""Rate limits and host classes as an operator sees them, against a real Postfix.

sluiced answers from one rule set both as Postfix's milter (smtpd_milters) and as its
SMTPD policy service (check_policy_service in smtpd_recipient_restrictions).  Mail is
sent with Python's smtplib to the private Postfix instance, which relays whatever it
accepts to a local smtp-sink; a test checks the SMTP replies the client got, what reached
the sink, Postfix's maillog, sluiced's log and what `sluice` prints.

Windows are chosen so that a result does not depend on timing: where exact counts matter
over several steps the period is an hour (nothing comes back during the test).  The two
"15 messages under 10/1m" tests use the minute window of the examples for its retry hint
in seconds, and check that their 15 messages went out within the 6 s after which one
message's worth comes back.

Postfix's smtpd is not chrooted in the private instance, so check_policy_service takes
the absolute unix: path of sluiced's policy socket (mode 0666 by default).
"""

import re
import shutil
import signal
import smtplib
import socket
import time

import pytest

from conftest import wait_until

FROM = "sender@sluice.test"
DOMAIN = "example.net"
TO = f"rcpt@{DOMAIN}"

RETRY_RE = r"try again in ((?:\d+[dhms])+)\b"


def seconds(duration):
    """Seconds in a retry hint such as "45s", "6m40s", "1h5m"."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([dhms])", duration))


@pytest.fixture(autouse=True)
def _need_tools():
    if not shutil.which("postfix", path="/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip("postfix is not installed")


# ---------------------------------------------------------------------------------------
# configuration

def config(*blocks, milter=True, policy=False, workers=2):
    """A complete sluiced configuration (@DIR@: the instance directory, also state_dir)
    serving the milter and/or the policy service, with the given class/limit blocks."""
    # `listen` on a line of its own: the sluiced fixture waits for what it finds there
    lines = [f"workers = {workers};",
             "stats_interval = 0;",
             'state_dir = "@DIR@";',
             'log { target = "stderr"; level = "info"; }',
             "control {", '  listen = "unix:@DIR@/control.sock";', "}"]
    if milter:
        # Postfix's smtpd runs as `postfix` and must connect
        lines += ["milter {", '  listen = "unix:@DIR@/milter.sock";', '  mode = "0666";', "}"]
    if policy:
        # mode 0666 by default, for the same reason
        lines += ["policy {", '  listen = "unix:@DIR@/policy.sock";', "}"]
    lines += blocks
    return "\n".join(lines) + "\n"


def per_domain(rate):
    """The rule of the examples: messages per recipient domain, tempfail by default
    ("451 4.7.1 Rate limit exceeded for %{key}, try again in %{retry}")."""
    return ('limit "per-domain" { stage = "rcpt"; key = "rcpt_domain"; count = "messages"; '
            f'rate = ["{rate}"]; }}')


LOCAL_CLASS = 'class "local" { hosts = ["127.0.0.0/8", "::1"]; sessions = 3; inbound = 3; }'
DEFAULT_CLASS = 'class "default" { hosts = ["*"]; sessions = 10; inbound = 10; }'


def policy_socket(s):
    return f"{s.dir}/policy.sock"


def with_milter(sluiced, postfix, text):
    s = sluiced(text)
    return s, postfix(milter=f"unix:{s.milter_socket}")


def with_policy(sluiced, postfix, text):
    s = sluiced(text)
    pf = postfix(smtpd_recipient_restrictions=f"check_policy_service unix:{policy_socket(s)}")
    return s, pf


# ---------------------------------------------------------------------------------------
# SMTP client

class Sent:
    """What one SMTP transaction got: replies as (code, text) pairs."""

    def __init__(self):
        self.greeting = None
        self.rcpt = []
        self.data = None
        self.queue_id = None

    @property
    def accepted(self):
        return self.queue_id is not None

    def __repr__(self):
        return f"<Sent rcpt={self.rcpt} data={self.data} qid={self.queue_id}>"


def send(pf, rcpts=(TO,), sender=FROM, subject="sluice test",
         body="Hello from test_policy.\r\n"):
    """One SMTP session to Postfix's smtpd with one message; never raises on a reply."""
    out = Sent()
    if isinstance(rcpts, str):
        rcpts = [rcpts]
    with smtplib.SMTP(local_hostname="client.sluice.test", timeout=30) as c:
        out.greeting = c.connect("127.0.0.1", pf.port)
        c.ehlo()
        code, text = c.mail(sender)
        assert code == 250, f"MAIL FROM: {code} {text!r}"
        for r in rcpts:
            code, text = c.rcpt(r)
            out.rcpt.append((code, text.decode(errors="replace")))
        if any(code == 250 for code, _ in out.rcpt):
            msg = f"From: <{sender}>\r\nTo: <{rcpts[0]}>\r\nSubject: {subject}\r\n\r\n{body}"
            try:
                code, text = c.data(msg)
            except smtplib.SMTPDataError as e:
                code, text = e.smtp_code, e.smtp_error
            out.data = (code, text.decode(errors="replace"))
            m = re.search(r"queued as ([0-9A-Za-z]+)", out.data[1])
            if code == 250 and m:
                out.queue_id = m.group(1)
        else:
            c.rset()
    return out


def send_many(pf, n, rcpt=TO):
    return [send(pf, rcpt, subject=f"message {i}") for i in range(n)]


def split(results):
    accepted = [r for r in results if r.accepted]
    refused = [r for r in results if not r.accepted]
    return accepted, refused


def describe(results, pf, s):
    lines = [repr(r) for r in results]
    return ("\n".join(lines) + f"\n--- Postfix maillog ---\n{pf.maillog.tail(30)}"
            f"\n--- sluiced log ---\n{s.log.tail(20)}")


def wait_all_delivered(pf, results, timeout=60):
    """Every accepted message left Postfix for the sink (status=sent), and nothing else."""
    accepted = [r.queue_id for r in results if r.accepted]
    for qid in accepted:
        pf.wait_delivered(qid, timeout)
    msgs = pf.wait_sink_messages(len(accepted), timeout)
    assert len(msgs) == len(accepted), f"{len(msgs)} messages at the sink, " \
        f"{len(accepted)} accepted"
    sent = set(pf.maillog.findall(r"\b([0-9A-Za-z]+): to=<[^>]*>,.* status=sent"))
    assert sent == set(accepted), (sent, accepted)
    return msgs


def assert_rate_refusal(r):
    """A refusal by the per-domain limit: 451 4.7.1 to RCPT, with the domain and a retry
    hint in seconds; returns the hint."""
    assert len(r.rcpt) == 1 and r.rcpt[0][0] == 451, r
    text = r.rcpt[0][1]
    assert text.startswith("4.7.1 "), r
    assert f"Rate limit exceeded for {DOMAIN}" in text, r
    m = re.search(RETRY_RE, text)
    assert m, f"no retry hint in {text!r}"
    return seconds(m.group(1))


def wait_log_count(log, pattern, count, timeout=10):
    """Wait until `pattern` matches exactly `count` lines of a log (Postfix's postlogd
    writes the maillog a moment after the SMTP reply went out), then check it stays so."""
    try:
        wait_until(lambda: len(log.findall(pattern)) >= count, timeout,
                   f"{count} lines /{pattern}/")
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- {log.path} ---\n{log.tail(30)}") from None
    time.sleep(0.2)
    assert len(log.findall(pattern)) == count, log.tail(30)


def no_milter_trouble(pf):
    bad = pf.maillog.findall(r"^.*warning: .*milter.*$", flags=re.I)
    assert not bad, "Postfix reported milter trouble:\n" + "\n".join(bad)


def no_policy_trouble(pf):
    bad = pf.maillog.findall(r"^.*warning: .*(policy|private/|problem talking).*$", flags=re.I)
    assert not bad, "Postfix reported policy service trouble:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------
# 1, 2: the per-domain rate limit through the milter and through the policy service

def test_milter_rate_limit_per_domain(sluiced, postfix):
    """15 messages to one domain under 10/1m: 10 delivered, 5 refused with 451 4.7.1 and
    a retry hint; Postfix logs the refusals as the milter's."""
    s, pf = with_milter(sluiced, postfix, config(per_domain("10/1m")))
    t0 = time.monotonic()
    results = send_many(pf, 15)
    elapsed = time.monotonic() - t0
    # one message's worth comes back every 6 s: later than that the counts would differ
    assert elapsed < 5.5, f"sending took {elapsed:.1f}s, too slow for a 10/1m check"
    accepted, refused = split(results)
    assert len(accepted) == 10 and len(refused) == 5, describe(results, pf, s)
    assert all(r.accepted for r in results[:10]), describe(results, pf, s)
    hints = [assert_rate_refusal(r) for r in refused]
    assert all(re.search(r"try again in \d+s$", r.rcpt[0][1]) for r in refused), refused
    # the next one comes back 6 s after the first was counted; up to a fifth of jitter
    assert all(1 <= h <= 8 for h in hints), hints
    wait_log_count(pf.maillog, r"^.*milter-reject: RCPT from .*: 451 4\.7\.1 Rate limit "
                   rf"exceeded for {re.escape(DOMAIN)}, try again in \d+s;.*$", 5)
    wait_all_delivered(pf, results)
    lines = s.log.findall(rf'^.*decision rule=per-domain action=tempfail key="{DOMAIN}" '
                          r"count=\d+ limit=10/1m stage=rcpt retry=\d+s client=127\.0\.0\.1 "
                          r'helo="[^"]+" from=<[^>]+> rcpt=<[^>]+>( qid=[0-9A-F]+)?$')
    assert len(lines) == 5, s.log.tail(30)
    no_milter_trouble(pf)


def test_policy_service_rate_limit_per_domain(sluiced, postfix):
    """The same through check_policy_service: Postfix asks sluiced at RCPT and sends its
    451 to the client (as a "Recipient address rejected" reply)."""
    s, pf = with_policy(sluiced, postfix, config(per_domain("10/1m"), milter=False,
                                                 policy=True))
    t0 = time.monotonic()
    results = send_many(pf, 15)
    elapsed = time.monotonic() - t0
    assert elapsed < 5.5, f"sending took {elapsed:.1f}s, too slow for a 10/1m check"
    accepted, refused = split(results)
    assert len(accepted) == 10 and len(refused) == 5, describe(results, pf, s)
    assert all(r.accepted for r in results[:10]), describe(results, pf, s)
    hints = [assert_rate_refusal(r) for r in refused]
    assert all(1 <= h <= 8 for h in hints), hints
    wait_log_count(pf.maillog, r"^.*NOQUEUE: reject: RCPT from .*: 451 4\.7\.1 .*Rate limit "
                   rf"exceeded for {re.escape(DOMAIN)}, try again in \d+s;.*$", 5)
    wait_all_delivered(pf, results)
    assert len(s.log.findall(rf'decision rule=per-domain action=tempfail key="{DOMAIN}" '
                             r"count=\d+ limit=10/1m stage=rcpt .*client=127\.0\.0\.1 "
                             r"helo=.* from=<.*> rcpt=<.*>")) == 5, s.log.tail(30)
    no_policy_trouble(pf)
    st = s.stats()["policy"]
    assert st["connections"] >= 1 and st["protocol_errors"] == 0, st


# ---------------------------------------------------------------------------------------
# 3: host classes

def read_reply(sock, timeout=10):
    """One complete SMTP reply (possibly multi-line) from a raw socket, as text; '' when
    the server closed the connection first."""
    sock.settimeout(timeout)
    data = b""
    while True:
        lines = data.split(b"\r\n")
        for line in lines[:-1]:
            if len(line) >= 4 and line[3:4] == b" ":
                return data.decode(errors="replace")
        chunk = sock.recv(4096)
        if not chunk:
            return data.decode(errors="replace")
        data += chunk


def class_line(s, name):
    res = s.cli("stats")
    m = re.search(rf"^class {re.escape(name)}: (\d+) sessions \(peak (\d+)\).*"
                  r"entered (\d+), refused (\d+)$", res.stdout, re.M)
    assert m, f"no class {name} line in `sluice stats`:\n{res.stdout}"
    return tuple(int(g) for g in m.groups())


def test_class_inbound_limit_under_concurrent_sessions(sluiced, postfix):
    """inbound = 3 for loopback clients: of 10 SMTP sessions held open at once, 3 are
    served and 7 get 421 at the greeting; once they are closed the class is back at 0
    sessions and a new session is served and its mail delivered."""
    s, pf = with_milter(sluiced, postfix, config(LOCAL_CLASS, DEFAULT_CLASS))
    socks = [socket.create_connection(("127.0.0.1", pf.port), timeout=10) for _ in range(10)]
    try:
        greetings = [read_reply(c, timeout=20) for c in socks]
        served, refused = [], []
        for c, g in zip(socks, greetings):
            if g.startswith("220 "):
                c.sendall(b"EHLO client.sluice.test\r\n")
                ehlo = read_reply(c)
                assert ehlo.startswith("250"), ehlo
                served.append(c)
            else:
                refused.append(g)
        assert len(served) == 3 and len(refused) == 7, greetings
        # Postfix answers a milter's 421 at CONNECT with its own 421 text ("Service
        # unavailable - try again later"); sluiced's reply is in Postfix's log
        assert all(g.startswith("421 ") for g in refused), greetings
        # a refused session is closed by Postfix after the 421
        for c, g in zip(socks, greetings):
            if not g.startswith("220 "):
                c.settimeout(10)
                assert c.recv(100) == b"", "Postfix kept a refused session open"
        assert class_line(s, "local")[:2] == (3, 3)
        out = s.cli("test", "--client-ip", "127.0.0.1").stdout
        assert "class local: 3 sessions now, inbound limit 3: a new session would be " \
            "refused (421)" in out, out
        wait_log_count(pf.maillog, r"milter-reject: CONNECT from .*\[127\.0\.0\.1\]: 421 4\.7\.0 "
                       r"Too many sessions from your network \(class local\), try again later",
                       7)
        assert len(s.log.findall(r'decision class=local action=tempfail reply="421 4\.7\.0 '
                                 r'Too many sessions from your network \(class local\), try '
                                 r'again later" stage=connect client=127\.0\.0\.1$')) == 7, \
            s.log.tail(20)
        # the held sessions are still served
        for c in served:
            c.sendall(b"MAIL FROM:<sender@sluice.test>\r\n")
            assert read_reply(c).startswith("250")
            c.sendall(b"RSET\r\n")
            assert read_reply(c).startswith("250")
        for c in served:
            c.sendall(b"QUIT\r\n")
            assert read_reply(c).startswith("221")
    finally:
        for c in socks:
            c.close()

    wait_until(lambda: class_line(s, "local")[0] == 0, 20,
               "class local to be back at 0 sessions")
    used, peak, entered, refused_n = class_line(s, "local")
    assert (used, peak, entered, refused_n) == (0, 3, 3, 7)
    assert class_line(s, "default")[:2] == (0, 0)     # loopback is in the first class
    out = s.cli("test", "--client-ip", "127.0.0.1").stdout
    assert "class local: 0 sessions now, inbound limit 3: a new session would be served" \
        in out, out
    r = send(pf)
    assert r.greeting[0] == 220 and r.accepted, r
    wait_all_delivered(pf, [r])
    no_milter_trouble(pf)


# ---------------------------------------------------------------------------------------
# 4: warn

def test_warn_rule_logs_and_lets_everything_through(sluiced, postfix):
    s, pf = with_milter(sluiced, postfix,
                        config('limit "w" { stage = "rcpt"; key = "rcpt_domain"; '
                               'rate = ["2/1h"]; action = "warn"; }'))
    results = send_many(pf, 6)
    assert all(r.accepted for r in results), describe(results, pf, s)
    assert all(r.rcpt == [(250, r.rcpt[0][1])] for r in results)
    wait_all_delivered(pf, results)
    warned = s.log.findall(rf'^.*warning: .*decision rule=w action=warn key="{DOMAIN}" '
                           r"count=\d+ limit=2/1h stage=rcpt .*$")
    assert len(warned) == 4, s.log.tail(20)
    assert not pf.maillog.search(r"milter-reject"), pf.maillog.tail(20)
    no_milter_trouble(pf)


def test_milter_counts_messages_not_recipients_and_gives_back_abandoned_ones(sluiced,
                                                                            postfix):
    """count = "messages": a message with 3 recipients in one domain counts once; a
    transaction abandoned after RCPT (RSET, QUIT) gives its count back."""
    s, pf = with_milter(sluiced, postfix, config(per_domain("3/1h")))

    def used():
        out = s.cli("limits", "show", DOMAIN).stdout
        m = re.search(r"3/1h used (\d+)/3", out)
        assert m, out
        return int(m.group(1))

    with smtplib.SMTP("127.0.0.1", pf.port, local_hostname="client.sluice.test",
                      timeout=30) as c:
        c.ehlo()
        for _ in range(5):
            assert c.mail(FROM)[0] == 250 and c.rcpt(TO)[0] == 250
            assert c.rset()[0] == 250
        assert c.mail(FROM)[0] == 250 and c.rcpt(TO)[0] == 250
    wait_until(lambda: used() == 0, 10, "the abandoned transactions to be given back")

    r = send(pf, [TO, f"two@{DOMAIN}", f"three@{DOMAIN}"])
    assert r.accepted and [c for c, _ in r.rcpt] == [250, 250, 250], r
    assert used() == 1
    more = send_many(pf, 3)
    assert [x.accepted for x in more] == [True, True, False], describe(more, pf, s)
    assert used() == 3
    wait_all_delivered(pf, [r] + more)
    no_milter_trouble(pf)


# ---------------------------------------------------------------------------------------
# 5: counters survive a restart

def test_restart_keeps_counters(sluiced, postfix):
    s, pf = with_milter(sluiced, postfix, config(per_domain("10/1h")))
    first = send_many(pf, 8)
    assert all(r.accepted for r in first), describe(first, pf, s)
    assert s.stop() == 0, s.log.tail(20)
    snapshot = s.dir / "limits.snapshot"
    assert snapshot.exists() and snapshot.stat().st_size > 0, list(s.dir.iterdir())

    s.start()
    shown = s.cli("limits", "show", DOMAIN).stdout
    assert re.search(rf"^per-domain {re.escape(DOMAIN)}: 10/1h used 8/10$", shown, re.M), shown
    second = send_many(pf, 3)
    assert [r.accepted for r in second] == [True, True, False], describe(second, pf, s)
    hint = assert_rate_refusal(second[2])
    assert 300 <= hint <= 433, second[2]      # 6 min (one message of 10/1h), + jitter
    wait_all_delivered(pf, first + second)
    no_milter_trouble(pf)


# ---------------------------------------------------------------------------------------
# 6: sluice test / limits show / limits reset

def test_sluice_test_explains_without_counting_and_limits_commands(sluiced, postfix):
    s, pf = with_milter(sluiced, postfix, config(per_domain("10/1h")))
    args = ("test", "--client-ip", "127.0.0.1", "--helo", "client.sluice.test",
            "--from", FROM, "--rcpt", TO)

    def used_numbers(text):
        return re.findall(r"used (\d+)/(\d+)", text)

    before = [s.cli(*args).stdout for _ in range(3)]
    for out in before:
        assert "nothing is counted" in out, out
        assert re.search(r"limit per-domain \(key rcpt_domain, count messages, action "
                         rf"tempfail\): key {re.escape(DOMAIN)}: within its limits; "
                         r"10/1h used 0/10", out), out
        assert re.search(r"^result: accept$", out, re.M), out
    assert before[0] == before[1] == before[2]
    assert re.search(r"used 0/10$", s.cli("limits", "show", DOMAIN).stdout, re.M)

    # the three explanations counted nothing: the whole budget is there
    results = send_many(pf, 10)
    assert all(r.accepted for r in results), describe(results, pf, s)

    over = [s.cli(*args).stdout for _ in range(2)]
    for out in over:
        assert re.search(rf"key {re.escape(DOMAIN)}: OVER its limits; 10/1h used 10/10; "
                         r"this event counts 1; room again in \d+s", out), out
        assert re.search(r"verdict: tempfail 451 4\.7\.1 Rate limit exceeded for "
                         rf"{re.escape(DOMAIN)}, try again in", out), out
        assert re.search(r"^result: tempfail$", out, re.M), out
    assert used_numbers(over[0]) == used_numbers(over[1]) == [("10", "10")]
    room = [int(re.search(r"room again in (\d+)s", o).group(1)) for o in over]
    assert 300 <= room[1] <= room[0] <= 360 and room[0] - room[1] <= 1, room

    shown = s.cli("limits", "show", DOMAIN).stdout
    assert re.search(rf"^per-domain {re.escape(DOMAIN)}: 10/1h used 10/10; full, room again "
                     r"in \d+s$", shown, re.M), shown
    top = s.cli("limits", "top").stdout
    assert re.search(rf"100\.0%\s+per-domain\s+{re.escape(DOMAIN)}", top), top
    assert not send(pf).accepted                       # really full

    res = s.cli("limits", "reset", DOMAIN)
    assert re.search(rf"^per-domain {re.escape(DOMAIN)}: reset$", res.stdout, re.M), res.stdout
    assert re.search(r"used 0/10$", s.cli("limits", "show", DOMAIN).stdout, re.M)
    assert "within its limits; 10/1h used 0/10" in s.cli(*args).stdout
    again = send_many(pf, 10)
    assert all(r.accepted for r in again), describe(again, pf, s)
    assert not send(pf).accepted
    wait_all_delivered(pf, results + again)

    # errors an operator can make
    res = s.cli("limits", "show", DOMAIN, "no-such-rule", check=False)
    assert res.returncode == 1 and "no rule named" in res.stdout + res.stderr, res
    no_milter_trouble(pf)


# ---------------------------------------------------------------------------------------
# 7: reload

def test_reload_applies_a_stricter_rate_and_refuses_a_broken_file(sluiced, postfix):
    s, pf = with_milter(sluiced, postfix, config(per_domain("10/1h")))
    before = send_many(pf, 3, rcpt="a@a.example")
    assert all(r.accepted for r in before), describe(before, pf, s)

    s.write_config(config(per_domain("2/1h")))
    mark = s.log.mark()
    res = s.cli("reload")
    assert "reloading" in res.stdout, res.stdout
    s.log.wait_for(r"configuration reloaded from", after=mark)
    assert "(reloaded 1 times)" in s.cli("status").stdout

    after = send_many(pf, 3, rcpt="b@b.example")
    assert [r.accepted for r in after] == [True, True, False], describe(after, pf, s)
    assert "Rate limit exceeded for b.example" in after[2].rcpt[0][1]

    # a broken file: refused with file:line, nothing changes
    good = s.config_text
    broken = config(per_domain("ten/1h"))
    s.write_config(broken)
    line = next(i for i, l in enumerate(s.config_text.splitlines(), 1) if "ten/1h" in l)
    mark = s.log.mark()
    res = s.cli("reload", check=False)
    assert res.returncode != 0, res
    err = res.stdout + res.stderr
    assert f"{s.config}:{line}:" in err and "ten/1h" in err, err
    assert "the running configuration is kept" in err, err
    # SIGHUP (what `sluice reload` and init systems send) keeps the rules as well
    s.signal(signal.SIGHUP)
    m = s.log.wait_for(r"reload failed, keeping the running configuration: (.*)$", after=mark)
    assert f"{s.config}:{line}:" in m.group(1), m.group(0)
    assert "(reloaded 1 times)" in s.cli("status").stdout

    still = send_many(pf, 3, rcpt="c@c.example")     # still 2/1h
    assert [r.accepted for r in still] == [True, True, False], describe(still, pf, s)
    shown = s.cli("limits", "show", "c.example").stdout
    assert "2/1h used 2/2" in shown, shown
    assert s.alive()
    s.write_config(good)
    wait_all_delivered(pf, before + after + still)
    no_milter_trouble(pf)


# ---------------------------------------------------------------------------------------
# 8: a malformed policy request closes that one connection

POLICY_REQUEST = ("request=smtpd_access_policy\nprotocol_state=RCPT\nprotocol_name=ESMTP\n"
                  "client_address=127.0.0.1\nclient_name=localhost\nhelo_name=raw.test\n"
                  "sender=raw@sluice.test\nrecipient=user@raw.example\ninstance={inst}\n\n")


def policy_exchange(sock, request, timeout=10):
    sock.settimeout(timeout)
    sock.sendall(request.encode())
    data = b""
    while not data.endswith(b"\n\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def test_malformed_policy_request_closes_only_that_connection(sluiced, postfix):
    s, pf = with_policy(sluiced, postfix, config(per_domain("10/1h"), milter=False,
                                                 policy=True))
    path = policy_socket(s)
    good = socket.socket(socket.AF_UNIX)
    bad = socket.socket(socket.AF_UNIX)
    try:
        good.connect(path)
        bad.connect(path)
        assert policy_exchange(good, POLICY_REQUEST.format(inst="a1")) == "action=DUNNO\n\n"

        mark = s.log.mark()
        bad.settimeout(10)
        bad.sendall(b"request=smtpd_access_policy\nthis line has no equals sign\n\n")
        try:
            answer = bad.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert answer == b"", f"sluiced answered a malformed request: {answer!r}"
        s.log.wait_for(r"protocol error: .*closing", after=mark)

        # the other connection, and new ones, are still served
        assert policy_exchange(good, POLICY_REQUEST.format(inst="a2")) == "action=DUNNO\n\n"
        with socket.socket(socket.AF_UNIX) as third:
            third.connect(path)
            assert policy_exchange(third, POLICY_REQUEST.format(inst="a3")) == \
                "action=DUNNO\n\n"
    finally:
        good.close()
        bad.close()

    r = send(pf)
    assert r.accepted, r
    wait_all_delivered(pf, [r])
    shown = s.cli("limits", "show", "raw.example").stdout
    assert "10/1h used 3/10" in shown, shown       # the three good requests counted
    st = s.stats()["policy"]
    assert st["protocol_errors"] == 1, st
    assert s.alive()
    no_policy_trouble(pf)


# ---------------------------------------------------------------------------------------
# a rule at end of message, after a rule at RCPT

@pytest.mark.parametrize("via", ["milter", "policy"])
def test_end_of_message_rule_after_rcpt_rule(sluiced, postfix, via):
    """Bytes per sender per hour, refused at end of message, next to the per-domain rule
    at RCPT.  Through the policy service this is the usual Postfix setup: the service is
    asked at RCPT and again at END-OF-MESSAGE (smtpd_end_of_data_restrictions), on one
    connection and with one `instance` per message; the end-of-message rule must run at
    the second request."""
    text = config('limit "bytes" { stage = "eom"; key = "sender"; count = "bytes"; '
                  'rate = ["5k/1h"]; action = "reject"; }',
                  per_domain("10/1h"), milter=via == "milter", policy=via == "policy")
    if via == "milter":
        s, pf = with_milter(sluiced, postfix, text)
    else:
        s = sluiced(text)
        check = f"check_policy_service unix:{policy_socket(s)}"
        pf = postfix(smtpd_recipient_restrictions=check, smtpd_end_of_data_restrictions=check)
    body = "x" * 76 + "\r\n"
    results = []
    for i in range(3):
        results.append(send(pf, subject=f"message {i} " + "y" * 10, body=body * 25))
    # ~2.2 kB each (body + headers + Postfix's Received:): 2 fit in 5000 bytes, 3 do not
    assert [r.accepted for r in results] == [True, True, False], describe(results, pf, s)
    assert all(r.rcpt[0][0] == 250 for r in results), describe(results, pf, s)
    code, text = results[2].data
    assert code == 550 and f"Rate limit exceeded for {FROM}" in text, results[2]
    # smtpd logs "reject: ... 550 5.7.1 ...", cleanup (for the milter) "milter-reject: ...
    # 5.7.1 ..."
    pf.maillog.wait_for(r"reject: END-OF-MESSAGE from .*: (550 )?5\.7\.1 .*Rate limit "
                        rf"exceeded for {re.escape(FROM)}")
    assert s.cli("limits", "show", DOMAIN, "per-domain").stdout.strip().endswith(
        "used 2/10"), "a message refused at end of data is given back to every rule"
    assert s.log.search(rf'decision rule=bytes action=reject key="{re.escape(FROM)}" '
                        r"count=\d+ limit=5000/1h stage=eom"), s.log.tail(20)
    shown = s.cli("limits", "show", FROM, "bytes").stdout
    m = re.search(r"5000/1h used (\d+)/5000", shown)
    assert m and 4000 <= int(m.group(1)) <= 5000, shown   # the refused one was given back
    wait_all_delivered(pf, results)
    no_milter_trouble(pf) if via == "milter" else no_policy_trouble(pf)


def test_milter_client_ip_rule_without_classes(sluiced, postfix):
    """A rule at RCPT keyed on the client's address, with no class and no connect rule:
    sluiced must still ask Postfix for CONNECT (without a reply) to know the client."""
    s, pf = with_milter(sluiced, postfix, config(
        'limit "per-client" { stage = "rcpt"; key = "client_ip"; rate = ["2/1h"]; }'))
    results = [send(pf, f"r{i}@example.org") for i in range(4)]
    accepted, refused = split(results)
    assert len(accepted) == 2, describe(results, pf, s)
    assert all(r.rcpt[0][0] == 451 and "127.0.0.1" in r.rcpt[0][1] for r in refused), \
        describe(results, pf, s)
    out = s.cli("limits", "show", "127.0.0.1").stdout
    assert "used 2/2" in out, out


def policy_request(state, instance="", client_port="40001", **attrs):
    lines = {"request": "smtpd_access_policy", "protocol_state": state,
             "protocol_name": "ESMTP", "client_address": "192.0.2.7",
             "client_name": "mx.example.org", "client_port": client_port,
             "server_address": "127.0.0.1", "server_port": "25",
             "helo_name": "mx.example.org", "sender": "a@example.org",
             "instance": instance}
    lines.update(attrs)
    return "".join(f"{k}={v}\n" for k, v in lines.items()) + "\n"


def test_policy_service_counts_connections_per_smtp_session(sluiced):
    """With smtpd_delay_reject = no (CONNECT, EHLO and MAIL before any instance) and with
    several messages in one SMTP session, a connection is counted once per SMTP session,
    and a message once."""
    s = sluiced(config(
        'limit "conns" { stage = "connect"; key = "client_ip"; rate = ["3/1h"]; }',
        'limit "msgs" { stage = "mail"; key = "sender"; rate = ["100/1h"]; }',
        milter=False, policy=True))
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(policy_socket(s))
        # one SMTP session, smtpd_delay_reject = no: instance is empty until MAIL is
        # accepted, then three messages
        for state in ("CONNECT", "EHLO", "MAIL"):
            assert policy_exchange(c, policy_request(state)) == "action=DUNNO\n\n"
        for i, inst in enumerate(("a.1", "a.2", "a.3")):
            if i:
                assert policy_exchange(c, policy_request("MAIL", inst)) == "action=DUNNO\n\n"
            assert policy_exchange(c, policy_request(
                "RCPT", inst, recipient=f"r{i}@example.net")) == "action=DUNNO\n\n"
    out = s.cli("limits", "show", "192.0.2.7", "conns").stdout
    assert "used 1/3" in out, out
    out = s.cli("limits", "show", "a@example.org", "msgs").stdout
    assert "used 3/100" in out, out
    # three more SMTP sessions (other client ports) fill the budget; the fourth is refused
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(policy_socket(s))
        for port in ("40002", "40003"):
            assert policy_exchange(c, policy_request("CONNECT", client_port=port)) == \
                "action=DUNNO\n\n"
        reply = policy_exchange(c, policy_request("CONNECT", client_port="40004"))
        assert reply.startswith("action=451 4.7.1 "), reply


def test_milter_helo_rule_counts_once_per_session(sluiced, postfix):
    """HELO repeated in one SMTP session (as after STARTTLS) charges a helo rule once."""
    s, pf = with_milter(sluiced, postfix, config(
        'limit "per-helo" { stage = "helo"; key = "helo"; rate = ["10/1h"]; }'))
    with smtplib.SMTP(local_hostname="client.sluice.test", timeout=30) as c:
        c.connect("127.0.0.1", pf.port)
        for _ in range(3):
            c.ehlo()
            c.rset()
    out = s.cli("limits", "show", "client.sluice.test").stdout
    assert "used 1/10" in out, out


def test_policy_service_session_in_postfix_attribute_order(sluiced):
    """Attributes in the order Postfix writes them, where `instance` follows the client's
    address closely: two messages of one SMTP session are one connection."""
    s = sluiced(config(
        'limit "conns" { stage = "connect"; key = "client_ip"; rate = ["3/1h"]; }',
        milter=False, policy=True))

    def request(instance, rcpt):
        return ("request=smtpd_access_policy\nprotocol_state=RCPT\nprotocol_name=ESMTP\n"
                "helo_name=h\nqueue_id=\nsender=a@x.org\n"
                f"recipient={rcpt}\nrecipient_count=0\nclient_address=192.0.2.9\n"
                f"client_name=c\nreverse_client_name=c\ninstance={instance}\n"
                "client_port=40001\nserver_address=127.0.0.1\nserver_port=25\n\n")

    with socket.socket(socket.AF_UNIX) as c:
        c.connect(policy_socket(s))
        for inst in ("b.1", "b.2"):
            assert policy_exchange(c, request(inst, f"r@{inst}.example")) == "action=DUNNO\n\n"
    out = s.cli("limits", "show", "192.0.2.9", "conns").stdout
    assert "used 1/3" in out, out


def test_stop_closes_idle_policy_connections_and_answers_a_request_under_way(sluiced):
    """Postfix keeps its policy connections open between requests (up to
    smtpd_policy_service_max_idle) and reconnects for the next one: at SIGTERM sluiced
    closes an idle connection at once, answers a request that is arriving and then
    closes that one too, and exits without waiting for its shutdown_timeout."""
    s = sluiced(config('limit "msgs" { stage = "rcpt"; key = "rcpt_domain"; '
                       'rate = ["100/1h"]; }', milter=False, policy=True)
                + "shutdown_timeout = 30s;\n")
    idle = socket.socket(socket.AF_UNIX)
    busy = socket.socket(socket.AF_UNIX)
    try:
        for c in (idle, busy):
            c.connect(policy_socket(s))
            assert policy_exchange(c, policy_request(
                "RCPT", "q.1", recipient="r@example.net")) == "action=DUNNO\n\n"
        half = policy_request("RCPT", "q.2", recipient="r@example.net")
        busy.sendall(half[:40].encode())
        time.sleep(0.2)  # the first bytes are read before the stop
        started = time.monotonic()
        s.signal(signal.SIGTERM)
        idle.settimeout(10)
        assert idle.recv(4096) == b"", "an idle policy connection was kept open"
        # the request under way is answered, then its connection ends too
        assert policy_exchange(busy, half[40:]) == "action=DUNNO\n\n"
        busy.settimeout(10)
        assert busy.recv(4096) == b""
        assert s.wait(20) == 0
        assert time.monotonic() - started < 10, "sluiced waited for its shutdown_timeout"
    finally:
        idle.close()
        busy.close()


# ---------------------------------------------------------------------------------------
# 8: the rules beyond rates, as `sluice test` explains them (no Postfix: the policy
# service is spoken to directly; about 2 s)

def test_sluice_test_explains_chains_scopes_distinct_blocks_and_sessions(sluiced):
    s = sluiced(config(
        'limit "fan-out" { stage = "rcpt"; key = "sasl_user|sender"; count = "distinct";',
        '  of = "rcpt"; rate = ["2/1h"]; block = 1h; }',
        'limit "campus" { stage = "mail"; key = "sender"; rate = ["100/1h"];',
        '  only { client_ip = ["198.51.100.0/24"]; } }',
        'limit "per-ip" { stage = "connect"; key = "client_ip"; count = "sessions"; max = 2; }',
        milter=False, policy=True))

    def test(*more):
        return s.cli("test", "--client-ip", "192.0.2.7", "--from", "a@example.org", *more).stdout

    out = test("--rcpt", "one@example.net")
    # the chain: no SASL login, so the sender gives the key, and it says so
    assert re.search(r"limit fan-out \(key sasl_user\|sender, count distinct, action tempfail\): "
                     r"key sender:a@example\.org \(from sender, the first of the chain with a "
                     r"value\): within its limits; 2/1h used 0/2; this value is new in a "
                     r"window: it counts 1", out), out
    assert re.search(r"limit campus .*: does not apply \(only client_ip: no match\)", out), out
    assert re.search(r"limit per-ip .*: key 192\.0\.2\.7: within its limits; 0 of 2 sessions "
                     r"at once held now on this node; counted through the milter only", out), out
    out = test("--sasl-user", "bob", "--rcpt", "x@example.net")
    assert "key sasl_user:bob (from sasl_user" in out, out

    # two recipients through the policy service; the second comes again, then a third
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(policy_socket(s))
        for i, rcpt in enumerate(("one@example.net", "two@example.net", "one@example.net")):
            assert policy_exchange(c, policy_request(
                "RCPT", f"q.{i}", recipient=rcpt)) == "action=DUNNO\n\n"
        out = test("--rcpt", "one@example.net")
        assert re.search(r"2/1h used 2/2; this value was counted in every window already: "
                         r"it passes and counts 0", out), out
        assert re.search(r"^result: accept$", out, re.M), out
        out = test("--rcpt", "three@example.net")
        assert re.search(r"OVER its limits; 2/1h used 2/2; this value is new in a window: it "
                         r"counts 1; room again in \d+s; a refusal now blocks the key for "
                         r"3600s", out), out
        reply = policy_exchange(c, policy_request("RCPT", "q.9", recipient="three@example.net"))
        assert reply.startswith("action=451 4.7.1 "), reply
    out = test("--rcpt", "three@example.net")
    m = re.search(r"BLOCKED \(block = 3600s after a refusal\): it ends in (\d+)s", out)
    assert m and 3590 <= int(m.group(1)) <= 3600, out
    shown = s.cli("limits", "show", "sender:a@example.org", "fan-out").stdout
    assert re.search(r"BLOCKED \(block = 3600s\), ends in \d+s", shown), shown
    # even a known recipient waits for the block's end
    assert re.search(r"^result: tempfail$", test("--rcpt", "one@example.net"), re.M)
    res = s.cli("limits", "reset", "sender:a@example.org", "fan-out")
    assert "reset" in res.stdout, res.stdout
    assert re.search(r"^result: accept$", test("--rcpt", "one@example.net"), re.M)
    # the policy service does not count sessions
    shown = s.cli("limits", "show", "192.0.2.7", "per-ip").stdout
    assert "0 of 2 sessions at once" in shown, shown
