"""Run-time per-key limits: `sluice limits set|unset|overrides`, against real processes.

With the memory store a run-time limit lives in sluiced's snapshot (it survives a
restart); with the Redis store it lives in Redis, and a node sees one set on another
within about a second (each node polls the version of the {ov} hash).  `sluice test`
shows which limits a key gets and says when they are a run-time limit's; the decisions
use the same lookup (tests/unit/test_policy.c holds the precedence: run-time limit, then
overrides file, then the rule's rate).
"""

import json
import os

import pytest

from conftest import wait_until
from test_policy import config
from peers import milter_wire as mw
from test_redis import REDIS_SERVER, Redis, rcpt_decision, redis, redis_store  # noqa: F401  (redis: the fixture)

RULE = ('limit "per-domain" { stage = "rcpt"; key = "rcpt_domain"; count = "messages"; '
        'rate = ["10/1h"]; overrides = "@DIR@/domains.limits"; }')
SESSIONS = ('limit "per-client" { stage = "connect"; key = "client_ip"; '
            'count = "sessions"; max = 3; }')


def rules_config(extra=""):
    return config(RULE, SESSIONS, extra)


def start(sluiced, text):
    """A sluiced whose overrides file exists before it starts (the fixture's directory
    is made by the factory: start it by hand)."""
    s = sluiced(text, start=False)
    (s.dir / "domains.limits").write_text("example.org 5/1h\n")
    return s.start()


def rcpt_line(s, rcpt):
    """The rcpt stage's line of `sluice test` for one recipient."""
    out = s.cli("test", "--client-ip", "192.0.2.1", "--rcpt", rcpt).stdout
    return [l for l in out.splitlines() if "limit per-domain" in l][0]


# ---------------------------------------------------------------------------------------
# the memory store

def test_set_wins_over_the_overrides_file_and_the_rate(sluiced):
    s = start(sluiced, rules_config())
    out = s.cli("limits", "set", "per-domain", "Example.ORG.", "100/1m", "5000/1d").stdout
    assert out == "per-domain example.org: 100/1m, 5000/1d (run-time, until unset)\n"
    line = rcpt_line(s, "a@example.org")
    assert "(run-time limit, until unset)" in line and "100/1m used 0/100" in line
    # another key: the rule's rate; the file's key without a run-time limit: the file
    assert "10/1h used 0/10" in rcpt_line(s, "a@other.example")
    s.cli("limits", "unset", "per-domain", "example.org")
    line = rcpt_line(s, "a@example.org")
    assert "(override)" in line and "5/1h used 0/5" in line
    # 0: the rule does not apply to the key
    s.cli("limits", "set", "per-domain", "bulk.example", "0")
    assert "unlimited for this key (run-time limit, until unset)" in \
        rcpt_line(s, "a@bulk.example")


def test_unset_says_whether_there_was_one(sluiced):
    s = start(sluiced, rules_config())
    s.cli("limits", "set", "per-domain", "example.com", "5/30s:10")
    assert s.cli("limits", "unset", "per-domain", "example.com").stdout == \
        "per-domain example.com: run-time limit removed\n"
    assert s.cli("limits", "unset", "per-domain", "example.com").stdout == \
        "per-domain example.com: had no run-time limit\n"
    r = s.cli("limits", "unset", "nosuch", "example.com", check=False)
    assert r.returncode == 1 and 'no rule named "nosuch"' in r.stderr, r


def test_overrides_lists_run_time_limits_and_the_files(sluiced):
    s = start(sluiced, rules_config())
    s.cli("limits", "set", "per-domain", "b.example", "7/1h", "--for", "1h")
    s.cli("limits", "set", "per-domain", "a.example", "0")
    out = s.cli("limits", "overrides").stdout.splitlines()
    assert out[0] == "per-domain a.example: unlimited (run-time, until unset)"
    assert out[1].startswith("per-domain b.example: 7/1h until 20") and \
        out[1].endswith("Z (run-time)")
    assert out[2].startswith("per-domain: 1 key in its overrides file ")
    lines = [json.loads(l) for l in s.cli("limits", "overrides", "--json").stdout.splitlines()]
    assert lines[0] == {"rule": "per-domain", "key": "a.example", "windows": [],
                        "unlimited": True, "until": None, "source": "run-time"}
    assert lines[1]["windows"] == ["7/1h"] and lines[1]["until"].endswith("Z")
    assert lines[2]["keys"] == 1 and lines[2]["source"] == "overrides file"


def test_for_expires(sluiced):
    s = start(sluiced, rules_config())
    s.cli("limits", "set", "per-domain", "example.com", "1/1h", "--for", "1s")
    assert "(run-time limit, until 20" in rcpt_line(s, "a@example.com")
    wait_until(lambda: "10/1h used" in rcpt_line(s, "a@example.com"), 5,
               "the run-time limit to expire")
    assert s.cli("limits", "overrides", "per-domain").stdout.startswith("no run-time limits")


def test_a_set_survives_a_restart(sluiced):
    s = start(sluiced, rules_config())
    s.cli("limits", "set", "per-domain", "example.com", "3/1h")
    s.stop()
    s.start()
    assert "3/1h used 0/3" in rcpt_line(s, "a@example.com")
    assert "(run-time limit, until unset)" in s.cli("limits", "show", "example.com",
                                                    "per-domain").stdout


@pytest.mark.parametrize("args, message", [
    (["nosuch", "example.com", "1/1m"], 'no rule named "nosuch"'),
    (["per-domain", "example.com", "1/1q"], 'bad rate "1/1q"'),
    (["per-domain", "example.com", "1/1m", "2/1m"], "two windows of the same period"),
    (["per-domain", "example.com", "0", "1/1m"], "0 (unlimited) stands alone"),
    (["per-domain", "example.com", "1/1m", "--for", "400d"], "from 1s to 366d"),
    (["per-client", "192.0.2.1", "1/1m"], "is a sessions rule"),
    (["per-domain", "example.com"], "usage: limits set RULE KEY RATE..."),
])
def test_errors(sluiced, args, message):
    s = start(sluiced, rules_config())
    r = s.cli("limits", "set", *args, check=False)
    assert r.returncode == 1 and message in r.stderr, r
    assert s.cli("limits", "overrides", "per-domain").stdout.startswith("no run-time limits")


# ---------------------------------------------------------------------------------------
# the Redis store: one table for every node

def test_set_on_one_node_is_seen_by_the_other(sluiced, redis):
    r = redis()
    text = rules_config(redis_store(r))
    a, b = start(sluiced, text), start(sluiced, text)
    out = a.cli("limits", "set", "per-domain", "example.com", "2/1h").stdout
    assert out == "per-domain example.com: 2/1h (run-time, until unset)\n"
    # the node that set it at once, the other within its poll
    assert "2/1h used 0/2" in rcpt_line(a, "x@example.com")
    wait_until(lambda: "2/1h used 0/2" in rcpt_line(b, "x@example.com"), 3,
               "node B to see the run-time limit")
    assert r.cli("HLEN", "sluice:{ov}") == "1"
    # and B's decisions use it: the third message of the two nodes is refused (the
    # rule's own rate, 10/1h, would take ten)
    got = [rcpt_decision(n, "<x@example.com>")[:2] for n in (b, a, b)]
    assert [code for code, _ in got] == [mw.CONTINUE, mw.CONTINUE, mw.REPLYCODE], got
    assert got[2][1].startswith(b"451 "), got
    b.cli("limits", "unset", "per-domain", "example.com")
    wait_until(lambda: "10/1h used" in rcpt_line(a, "x@example.com"), 3,
               "node A to see it removed")
    # --for: every node forgets it when it ends
    b.cli("limits", "set", "per-domain", "example.net", "4/1h", "--for", "2s")
    wait_until(lambda: "4/1h used" in rcpt_line(a, "x@example.net"), 3, "A to see it")
    wait_until(lambda: "10/1h used" in rcpt_line(a, "x@example.net"), 5, "it to expire")


def test_redis_unreachable_changes_nothing(sluiced, redis):
    r = redis()
    s = start(sluiced, rules_config(redis_store(r)))
    s.cli("limits", "set", "per-domain", "example.com", "2/1h")
    r.stop()
    res = s.cli("limits", "set", "per-domain", "example.org", "2/1h", check=False)
    assert res.returncode == 1 and "Redis unreachable" in res.stderr, res
    # the node keeps the table it had
    assert "2/1h used" in rcpt_line(s, "x@example.com")
    s.log.wait_for(r"run-time limits cannot be read from Redis", timeout=5)


def test_behind_sentinel(sluiced, redis, workdir):
    """sentinels + master_name: the thread asks the sentinels where the master is."""
    import subprocess
    from conftest import free_port
    from test_redis import REDIS_CLI
    pm, ps = free_port(), free_port()
    while ps == pm:
        ps = free_port()
    d = workdir / "master"
    d.mkdir()
    master = Redis(d, port=pm)
    master.start()
    sdir = workdir / "sentinel"
    sdir.mkdir()
    conf = sdir / "sentinel.conf"
    conf.write_text(f"port {ps}\nbind 127.0.0.1\ndir {sdir}\nlogfile {sdir}/sentinel.log\n"
                    f"sentinel monitor main 127.0.0.1 {pm} 1\n")
    sentinel = subprocess.Popen([REDIS_SERVER, str(conf), "--sentinel"])
    try:
        wait_until(lambda: subprocess.run(
            [REDIS_CLI, "-p", str(ps), "SENTINEL", "get-master-addr-by-name", "main"],
            capture_output=True, text=True, timeout=10).stdout.split() ==
            ["127.0.0.1", str(pm)], 15, "sentinel watching the master")
        s = start(sluiced, rules_config(f'store {{ type = "redis"; sentinels = '
                                        f'["127.0.0.1:{ps}"]; master_name = "main"; '
                                        'nodes = 2; timeout = 2s; }'))
        wait_until(lambda: s.cli("limits", "set", "per-domain", "example.com", "2/1h",
                                 check=False).returncode == 0, 5, "the set to go through")
        assert master.cli("HLEN", "sluice:{ov}") == "1"
        assert "2/1h used 0/2" in rcpt_line(s, "x@example.com")
    finally:
        sentinel.terminate()
        sentinel.wait(10)
        master.stop()


def test_on_a_redis_cluster(sluiced, workdir):
    """A cluster: the thread follows the MOVED to the master of the {ov} slot; a node
    seeded with another master sees what the first set."""
    from peers.redis_cluster import RedisCluster, key_slot
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed")
    c = RedisCluster(workdir / "cluster", replicas=0)
    c.start()
    try:
        owner = c.owner_of_slot(key_slot("sluice:{ov}"))
        others = [n for n in c.nodes if n is not owner]

        def store(seed):
            return (f'store {{ type = "redis"; cluster = ["{seed.address}"]; nodes = 2; '
                    'timeout = 2s; }')
        a = start(sluiced, rules_config(store(others[0])))
        b = start(sluiced, rules_config(store(others[1])))
        wait_until(lambda: a.cli("limits", "set", "per-domain", "example.com", "2/1h",
                                 check=False).returncode == 0, 5, "the set to go through")
        assert owner.cli("HLEN", "sluice:{ov}") == "1"
        wait_until(lambda: "2/1h used 0/2" in rcpt_line(b, "x@example.com"), 5,
                   "node B to see it")
    finally:
        c.stop()
