"""Limits shared by a cluster through a real redis-server.

Each test starts its own redis-server on a unix socket (or a loopback port for Sentinel)
in the test's directory, and two sluiced nodes with `store { type = "redis"; }`.  Mail
goes through two private Postfix instances, one per node, or straight to the nodes with
the milter client of peers/milter_wire.py when a test must hold sessions open or time single
decisions.
"""

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import free_port, wait_until
from peers import milter_wire as mw
from test_policy import (DOMAIN, TO, config, per_domain, send, split, describe,
                         wait_all_delivered, policy_socket)

REDIS_SERVER = "/usr/bin/redis-server"
REDIS_CLI = "/usr/bin/redis-cli"
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


class Redis:
    """A redis-server of the test's own, on a unix socket (port=None) or loopback."""

    def __init__(self, directory, port=None, extra=()):
        self.dir = directory
        self.port = port
        self.sock = f"{directory}/redis.sock"
        self.extra = list(extra)
        self.password = (self.extra[self.extra.index("--requirepass") + 1]
                         if "--requirepass" in self.extra else None)
        self.proc = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}" if self.port else f"unix:{self.sock}"

    def start(self):
        args = [REDIS_SERVER, "--port", str(self.port or 0), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                "--logfile", f"{self.dir}/redis.log"] + self.extra
        if not self.port:
            args += ["--unixsocket", self.sock, "--unixsocketperm", "777"]
        self.proc = subprocess.Popen(args)
        wait_until(lambda: self.ping(), 10, "redis-server answering")

    def cli(self, *args, check=True):
        where = ["-p", str(self.port)] if self.port else ["-s", self.sock]
        if self.password:
            where += ["-a", self.password, "--no-auth-warning"]
        r = subprocess.run([REDIS_CLI, *where, *args], capture_output=True, text=True,
                           timeout=10)
        if check:
            assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def ping(self):
        try:
            return self.cli("PING", check=False) == "PONG"
        except subprocess.TimeoutExpired:
            return False

    def keys(self, pattern="*"):
        out = self.cli("--scan", "--pattern", pattern)
        return [k for k in out.splitlines() if k]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis(workdir):
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed")
    servers = []

    def factory(port=None, extra=(), name="redis"):
        d = workdir / f"{name}{len(servers)}"
        d.mkdir()
        r = Redis(d, port, extra)
        servers.append(r)
        r.start()
        return r

    yield factory
    for r in servers:
        r.stop()


def redis_store(r, on_failure="local", nodes=2, timeout="50ms", extra=""):
    return (f'store {{ type = "redis"; server = "{r.address}"; on_failure = "{on_failure}"; '
            f'nodes = {nodes}; timeout = {timeout}; {extra} }}')


def two_nodes(sluiced, text, env_b=None):
    a = sluiced(text)
    b = sluiced(text, env=env_b)
    return a, b


# ---------------------------------------------------------------------------------------
# one budget for two nodes

def test_two_nodes_share_one_rate_limit_through_the_milter(sluiced, postfix, redis):
    """30 messages spread over two nodes (each behind its own Postfix) under one 10/1h
    rule: exactly 10 accepted in all."""
    r = redis()
    text = config(per_domain("10/1h"), redis_store(r))
    a, b = two_nodes(sluiced, text)
    pa = postfix(milter=f"unix:{a.milter_socket}")
    pb = postfix(milter=f"unix:{b.milter_socket}")
    results = [send(pa if i % 2 == 0 else pb, TO, subject=f"message {i}") for i in range(30)]
    accepted, refused = split(results)
    assert len(accepted) == 10 and len(refused) == 20, describe(results, pa, a)
    # both nodes took part in the 10
    assert any(x.accepted for x in results[0::2]) and any(x.accepted for x in results[1::2])
    for x in refused:
        assert x.rcpt[0][0] == 451 and f"Rate limit exceeded for {DOMAIN}" in x.rcpt[0][1]
    wait_all_delivered(pa, results[0::2])
    wait_all_delivered(pb, results[1::2])
    # the state is in Redis, named by rule and window
    keys = r.keys("sluice:per-domain:10/1h:*")
    assert len(keys) == 1, r.keys()
    assert 0 < int(r.cli("PTTL", keys[0])) <= 3600 * 1000 + 1000
    assert "connected to" in a.cli("stats").stdout


def test_two_nodes_share_one_rate_limit_through_the_policy_service(sluiced, postfix, redis):
    r = redis()
    text = config(per_domain("10/1h"), redis_store(r), milter=False, policy=True)
    a, b = two_nodes(sluiced, text)
    pa = postfix(smtpd_recipient_restrictions=f"check_policy_service unix:{policy_socket(a)}")
    pb = postfix(smtpd_recipient_restrictions=f"check_policy_service unix:{policy_socket(b)}")
    results = [send(pa if i % 2 == 0 else pb, TO, subject=f"message {i}") for i in range(30)]
    accepted, refused = split(results)
    assert len(accepted) == 10 and len(refused) == 20, describe(results, pa, a)
    assert any(x.accepted for x in results[0::2]) and any(x.accepted for x in results[1::2])
    for x in refused:
        assert x.rcpt[0][0] == 451 and "Rate limit exceeded" in x.rcpt[0][1], x
    wait_all_delivered(pa, results[0::2])
    wait_all_delivered(pb, results[1::2])


def test_a_node_with_a_skewed_clock_agrees_with_the_others(sluiced, postfix, redis):
    """Node B's clock is 5 minutes ahead (libfaketime): with a 10/1m rule its own clock
    would see node A's charges as long gone and accept 10 more.  Time comes from Redis,
    so the two still accept exactly 10 between them."""
    if not os.path.exists(FAKETIME_LIB):
        pytest.skip("libfaketime is not installed (Debian package faketime)")
    r = redis()
    text = config(per_domain("10/1m"), redis_store(r))
    env_b = dict(os.environ, LD_PRELOAD=FAKETIME_LIB, FAKETIME="+5m",
                 FAKETIME_DONT_RESET="1", DONT_FAKE_MONOTONIC="1")
    if "asan" in os.environ.get("SLUICED", "") or "ASAN_OPTIONS" in os.environ:
        pytest.skip("libfaketime cannot be preloaded under AddressSanitizer")
    a, b = two_nodes(sluiced, text, env_b=env_b)
    assert "running" in b.cli("status").stdout
    pa = postfix(milter=f"unix:{a.milter_socket}")
    pb = postfix(milter=f"unix:{b.milter_socket}")
    t0 = time.monotonic()
    results = [send(pa if i % 2 == 0 else pb, TO, subject=f"message {i}") for i in range(30)]
    assert time.monotonic() - t0 < 5.5, "too slow for a 10/1m check"
    accepted, refused = split(results)
    assert len(accepted) == 10, describe(results, pb, b)
    # the retry hints from both nodes agree: under a minute
    for x in refused:
        m = re.search(r"try again in (\d+)s", x.rcpt[0][1])
        assert m and 1 <= int(m.group(1)) <= 8, x


# ---------------------------------------------------------------------------------------
# host classes across nodes, as leases

CLASS_ALL = 'class "all" { hosts = ["*"]; sessions = 4; inbound = 4; }'


def open_session(node, ip):
    """A milter session that has sent CONNECT; returns (client, reply code)."""
    c = mw.MilterClient(node.milter_socket)
    c.negotiate()
    code, payload = c.connect(address=ip)
    return c, code


def test_class_sessions_shared_by_two_nodes_and_freed_when_a_node_dies(sluiced, redis):
    r = redis()
    text = config(CLASS_ALL, redis_store(r, extra="lease = 3s;"))
    a, b = two_nodes(sluiced, text)
    held, refused = [], 0
    # 10 simultaneous sessions, alternating between the nodes
    for i in range(10):
        node = a if i % 2 == 0 else b
        c, code = open_session(node, f"192.0.2.{i + 1}")
        if code == mw.CONTINUE:
            held.append((node, c))
        else:
            assert code == mw.REPLYCODE, code
            refused += 1
            c.close()
    assert len(held) == 4 and refused == 6, (len(held), refused)
    on_b = [c for node, c in held if node is b]
    assert on_b, "node B should hold some of the slots"
    # node A sees the class full
    c, code = open_session(a, "192.0.2.50")
    assert code == mw.REPLYCODE
    c.close()
    # node B dies holding its slots; they come back once its lease expires (3 s)
    b.signal(signal.SIGKILL)
    b.wait(10)
    b.expected_rc = -signal.SIGKILL
    t0 = time.monotonic()
    got = []

    def enter():
        cl, code = open_session(a, "192.0.2.60")
        if code == mw.CONTINUE:
            got.append(cl)
            return len(got) == len(on_b)
        cl.close()
        return False
    wait_until(enter, 10, "node B's slots coming back")
    assert time.monotonic() - t0 <= 3 + 2, "slots came back later than the lease"
    # and never more than 4 at once
    c, code = open_session(a, "192.0.2.61")
    assert code == mw.REPLYCODE
    c.close()
    for node, cl in held:
        if node is a:
            cl.close()
    for cl in got:
        cl.close()


# ---------------------------------------------------------------------------------------
# Redis away

def rcpt_decision(node, rcpt="<x@example.net>"):
    """One milter session with one message: (reply code to RCPT, its text, seconds the RCPT
    took).  A message accepted at RCPT is taken to its end, so that it stays counted (a
    message the client abandons gives its charges back)."""
    with mw.MilterClient(node.milter_socket) as c:
        c.negotiate()
        c.connect()
        c.helo()
        c.mail()
        t0 = time.monotonic()
        code, payload = c.rcpt(rcpt)
        took = time.monotonic() - t0
        if code == mw.CONTINUE:
            c.data()
            c.header("Subject", "x")
            c.eoh()
            c.body(b"hello\r\n")
            _, end, _ = c.eob()
            assert end in (mw.ACCEPT, mw.CONTINUE), end
        return code, payload, took


@pytest.mark.parametrize("mode", ["local", "accept", "tempfail"])
def test_redis_stopped_and_back(sluiced, redis, mode):
    """Stop redis-server in the middle of a run: every decision is answered within the
    timeout as on_failure says; once Redis is back the node uses it again."""
    r = redis()
    node = sluiced(config(per_domain("10/1h"), redis_store(r, on_failure=mode, nodes=2,
                                                          timeout="100ms")))
    for _ in range(3):
        code, _, _ = rcpt_decision(node)
        assert code == mw.CONTINUE
    assert len(r.keys("sluice:per-domain:*")) == 1
    r.stop()
    results = [rcpt_decision(node) for _ in range(8)]
    for code, payload, took in results:
        assert took < 0.1 + 0.25, f"a decision waited {took:.3f}s with Redis away"
    codes = [code for code, _, _ in results]
    if mode == "accept":
        assert codes == [mw.CONTINUE] * 8
    elif mode == "tempfail":
        assert all(c == mw.REPLYCODE for c in codes)
        assert b"451 4.3.0" in results[0][1]
        node.log.wait_for(r"limit store unavailable \(on_failure tempfail\): answering the "
                          r"rcpt with \"451 4\.3\.0 ")
    else:
        # this node's share of 10 (nodes = 2), counted here from zero
        assert codes == [mw.CONTINUE] * 5 + [mw.REPLYCODE] * 3, codes
    node.log.wait_for(r"redis store: .* unreachable .*on_failure=" + mode)
    stats = node.cli("stats").stdout
    assert "unreachable" in stats, stats
    status = node.cli("status").stdout
    assert re.search(r"^store: redis, unreachable \(.*\): on_failure=" + mode, status, re.M), status
    assert json.loads(node.cli("status", "--json").stdout)["store"]["up"] is False
    r.start()
    node.log.wait_for(r"redis store: .* again after", timeout=15)
    # Redis (emptied by the restart: no persistence) decides again
    wait_until(lambda: rcpt_decision(node)[0] == mw.CONTINUE and
               len(r.keys("sluice:per-domain:*")) == 1, 10, "decisions back in Redis")
    assert "connected to" in node.cli("stats").stdout
    assert json.loads(node.cli("status", "--json").stdout)["store"]["up"] is True


def test_a_stalled_redis_costs_each_decision_at_most_the_timeout(sluiced, redis):
    """SIGSTOP: the connection stays up but nothing answers."""
    r = redis()
    node = sluiced(config(per_domain("10/1h"), redis_store(r, timeout="50ms")))
    assert rcpt_decision(node)[0] == mw.CONTINUE
    r.proc.send_signal(signal.SIGSTOP)
    try:
        worst = max(rcpt_decision(node)[2] for _ in range(10))
        assert worst < 0.05 + 0.2, f"a decision waited {worst:.3f}s"
    finally:
        r.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: rcpt_decision(node)[2] < 0.05, 15, "fast answers again")


def test_a_decision_whose_session_ends_while_redis_decides_is_given_back(sluiced, redis):
    """The client goes away while its RCPT's decision waits in Redis: the decision still
    runs there and charges; the session ends once the answer has come (the engine holds
    a paused session's end until then) and gives the charge back, so the limit does not
    count a message that was never taken.  (A call withdrawn while in flight -- a forced
    close at the shutdown deadline -- is given back by the store itself when its answer
    comes: store_redis.c, redis_orphan().)"""
    r = redis()
    node = sluiced(config(per_domain("10/1h"), redis_store(r, timeout="5s")))
    assert rcpt_decision(node)[0] == mw.CONTINUE
    used = lambda: re.search(r"used (\d+)/10$",  # noqa: E731
                             node.cli("limits", "show", "example.net").stdout, re.M)
    assert used().group(1) == "1"
    c = mw.MilterClient(node.milter_socket)
    c.negotiate()
    c.connect()
    c.helo()
    c.mail()
    r.proc.send_signal(signal.SIGSTOP)
    try:
        c.send(mw.RCPT, mw.strs("<y@example.net>"))
        time.sleep(0.5)     # sent: it waits in Redis's socket
        c.close()
        time.sleep(0.5)     # sluiced sees the end of the session, withdraws the call
    finally:
        r.proc.send_signal(signal.SIGCONT)
    # Redis runs the script (2 used) and answers; the answer is given back (1 used)
    time.sleep(1)
    assert used().group(1) == "1", node.log.tail(10)


def test_bad_store_configuration_is_refused_with_file_and_line(sluiced, workdir):
    s = sluiced(config(per_domain("10/1h"), 'store { type = "redis"; on_failure = "maybe"; }'),
                start=False)
    r = subprocess.run([os.environ["SLUICED"], "-t", "-c", str(s.config)],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert re.search(r"sluiced\.conf:\d+: store\.on_failure: expected local, accept or tempfail",
                     r.stderr), r.stderr
    s.write_config(config(per_domain("10/1h"), 'store { type = "memory"; server = "x"; }'))
    r = subprocess.run([os.environ["SLUICED"], "-t", "-c", str(s.config)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and 'only with type = "redis"' in r.stderr, r.stderr


def test_operator_commands_read_the_shared_counts(sluiced, redis):
    """`sluice test` and `sluice limits show|reset` on one node see and change what the
    other node counted: they ask Redis (without blocking the node's loops)."""
    r = redis()
    a, b = two_nodes(sluiced, config(per_domain("10/1h"), redis_store(r)))
    for _ in range(3):
        assert rcpt_decision(a)[0] == mw.CONTINUE
    args = ("test", "--client-ip", "192.0.2.1", "--from", "s@example.org", "--rcpt",
            "x@example.net")
    out = b.cli(*args).stdout
    assert re.search(r"key example\.net: within its limits; 10/1h used 3/10", out), out
    assert "nothing is counted" in out and re.search(r"^result: accept$", out, re.M), out
    assert b.cli(*args).stdout == out  # explaining counted nothing
    shown = b.cli("limits", "show", "example.net").stdout
    assert re.search(r"^per-domain example\.net: 10/1h used 3/10$", shown, re.M), shown
    top = b.cli("limits", "top").stdout
    assert "needs the memory store" in top, top
    res = b.cli("limits", "reset", "example.net").stdout
    assert re.search(r"^per-domain example\.net: reset$", res, re.M), res
    assert r.keys("sluice:per-domain:*") == []
    assert re.search(r"used 0/10$", a.cli("limits", "show", "example.net").stdout, re.M)
    res = b.cli("limits", "reset", "example.net").stdout
    assert "nothing to reset" in res, res


def test_sentinel_finds_the_master_and_follows_a_failover(sluiced, redis, workdir):
    """sentinels + master_name: sluiced asks Redis Sentinel where the master is; after a
    failover the old master refuses writes (READONLY) and sluiced goes through the
    sentinels to the new one."""
    pm, pr, ps = free_port(), free_port(), free_port()
    while len({pm, pr, ps}) < 3:
        pr, ps = free_port(), free_port()
    master = redis(port=pm, name="master")
    replica = redis(port=pr, extra=["--replicaof", "127.0.0.1", str(pm)], name="replica")
    sdir = workdir / "sentinel"
    sdir.mkdir()
    conf = sdir / "sentinel.conf"
    conf.write_text(f"port {ps}\nbind 127.0.0.1\ndir {sdir}\nlogfile {sdir}/sentinel.log\n"
                    f"sentinel monitor main 127.0.0.1 {pm} 1\n"
                    "sentinel down-after-milliseconds main 1000\n"
                    "sentinel failover-timeout main 5000\n")
    sentinel = subprocess.Popen([REDIS_SERVER, str(conf), "--sentinel"])
    try:
        def cli(port, *args):
            return subprocess.run([REDIS_CLI, "-p", str(port), *args], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
        wait_until(lambda: cli(ps, "SENTINEL", "get-master-addr-by-name", "main")
                   .split() == ["127.0.0.1", str(pm)], 15, "sentinel watching the master")
        wait_until(lambda: "master_link_status:up" in cli(pr, "INFO", "replication"), 15,
                   "the replica in sync")
        node = sluiced(config(per_domain("10/1h"),
                              f'store {{ type = "redis"; sentinels = ["127.0.0.1:{ps}"]; '
                              'master_name = "main"; nodes = 2; timeout = 2s; }'))
        # a worker's first decision waits while its connection asks the sentinels where
        # the master is, and is decided there: not by on_failure
        assert rcpt_decision(node)[0] == mw.CONTINUE
        assert len(master.keys("sluice:per-domain:*")) == 1
        assert node.stats()["store"]["shared"]["fallbacks"] == 0, node.stats()["store"]
        node.log.wait_for(r"redis store: connected to master 'main'")
        cli(ps, "SENTINEL", "FAILOVER", "main")
        wait_until(lambda: cli(pr, "ROLE").splitlines()[:1] == ["master"], 30,
                   "the replica promoted")
        # decisions go on (on_failure answers during the switch); the new master is used
        def on_new_master():
            rcpt_decision(node, "<y@example.com>")
            return len(replica.keys("sluice:per-domain:*")) == 2
        wait_until(on_new_master, 30, "decisions reaching the new master")
        assert node.alive()
    finally:
        sentinel.terminate()
        sentinel.wait(10)


def test_redis_password(sluiced, redis):
    """A wrong password: the node says why, decides locally, and does not flap between
    "unreachable" and "back"; the right one (from a password_file) works."""
    r = redis(extra=["--requirepass", "s3cret"])
    node = sluiced(config(per_domain("10/1h"),
                          redis_store(r, extra='password = "wrong";')))
    node.log.wait_for(r"redis store: .* unreachable \(AUTH: .*(WRONGPASS|invalid)")
    assert rcpt_decision(node)[0] == mw.CONTINUE  # on_failure = local
    time.sleep(2)
    assert node.log.findall(r"again after") == [], node.log.tail(20)
    assert len(node.log.findall(r"unreachable")) == 1, node.log.tail(20)
    assert "AUTH" in node.cli("stats").stdout
    secret = node.dir / "redis.secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    other = sluiced(config(per_domain("10/1h"),
                           redis_store(r, extra=f'password_file = "{secret}";')))
    wait_until(lambda: rcpt_decision(other)[0] == mw.CONTINUE and
               len(r.keys()) == 1, 10,
               "decisions in Redis with the right password")
    assert "s3cret" not in other.log.text() and "s3cret" not in other.cli("stats").stdout


def test_policy_requests_pipelined_while_a_decision_waits_for_redis(sluiced, redis):
    """Requests that arrive while one waits for Redis are read and kept, and answered in
    order once it is back: the waiting request keeps its own copy of its attributes."""
    r = redis()
    node = sluiced(config(per_domain("2/1h"), redis_store(r), milter=False, policy=True))

    def request(rcpt, port):
        attrs = {"request": "smtpd_access_policy", "protocol_state": "RCPT",
                 "protocol_name": "ESMTP", "client_address": "192.0.2.9",
                 "client_port": str(port), "server_address": "127.0.0.1",
                 "server_port": "25", "client_name": "client.example", "helo_name": "h",
                 "sender": "s@example.org", "recipient": rcpt, "recipient_count": "0",
                 "instance": f"inst.{port}", "size": "0"}
        return "".join(f"{k}={v}\n" for k, v in attrs.items()).encode() + b"\n"
    rcpts = [f"u{i}@d{i % 3}.example" for i in range(12)]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(policy_socket(node))
        # every request in one write: the later ones come in while the first waits
        blob = b"".join(request(rc, 40000 + i) for i, rc in enumerate(rcpts))
        sock.sendall(blob)
        sock.settimeout(10)
        data = b""
        while data.count(b"\n\n") < len(rcpts):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {data!r}"
            data += chunk
    answers = [a for a in data.decode().split("\n\n") if a]
    assert len(answers) == len(rcpts), answers
    # 2 per domain per hour: the first two of each domain pass, the rest are refused
    seen = {}
    for rc, ans in zip(rcpts, answers):
        dom = rc.split("@")[1]
        seen[dom] = seen.get(dom, 0) + 1
        if seen[dom] <= 2:
            assert ans == "action=DUNNO", (rc, ans)
        else:
            assert ans.startswith("action=451 4.7.1 Rate limit exceeded for " + dom), (rc, ans)
    assert len(r.keys("sluice:per-domain:*")) == 3
