"""Limits shared through a real Redis Cluster (store { type = "redis"; cluster = [...]; }).

Each test starts its own cluster of six redis-servers on loopback (3 masters, 3 replicas;
peers/redis_cluster.py), and one or two sluiced nodes whose seed list names the three masters.
Decisions are made straight through the milter protocol (peers/milter_wire.py, via
test_redis.rcpt_decision), one message with one recipient per session, so that a test can
time single decisions and tell apart the three answers:

    admit     RCPT continues (the message is taken to its end, so it stays counted)
    limit     451 4.7.1 "Rate limit exceeded" -- decided by Redis (or the local share)
    fallback  451 4.3.0 -- on_failure = "tempfail" answered, Redis was not asked

Redis names every rate-limit key PREFIX RULE ... with a hash tag, so that all windows of
a (rule, key) live in one slot; the tests find a key by the keys that appear when a
decision is made, never by computing its name.
"""

import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import SLUICED, free_port, plain_only, wait_until
from peers import milter_wire as mw
from peers.redis_cluster import RedisCluster, REDIS_SERVER, key_slot
from test_policy import config, per_domain
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_redis import CLASS_ALL, Redis, open_session, rcpt_decision, two_nodes

PATTERN = "sluice:per-domain:*"

# The long scenarios (failovers, migrations, lost slot ranges, the relay) run once, in the
# plain build (plain_only); under ASan+UBSan the short tests run, which go through the
# same code.


@pytest.fixture
def cluster(workdir):
    """Factory: cluster(extra=[...]) -> a started RedisCluster; all stopped at teardown."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed")
    made = []

    def factory(extra=(), **kw):
        c = RedisCluster(workdir / f"cluster{len(made)}", extra=extra, **kw)
        made.append(c)
        c.start()
        return c

    yield factory
    for c in made:
        c.stop()


def cluster_store(c=None, seeds=None, on_failure="local", nodes=2, timeout="50ms",
                  extra=""):
    seeds = seeds if seeds is not None else c.seeds
    listed = ", ".join(f'"{s}"' for s in seeds)
    return (f'store {{ type = "redis"; cluster = [{listed}]; nodes = {nodes}; '
            f'timeout = {timeout}; on_failure = "{on_failure}"; {extra} }}')


class Decision:
    def __init__(self, node, domain, code, payload, took):
        self.node, self.domain, self.took = node, domain, took
        self.payload = payload
        if code == mw.CONTINUE:
            self.kind = "admit"
        elif code == mw.REPLYCODE and b"4.7.1" in payload:
            self.kind = "limit"
        elif code == mw.REPLYCODE and b"4.3.0" in payload:
            self.kind = "fallback"
        else:
            raise AssertionError(f"unexpected answer {code!r} {payload!r} for {domain}")

    def __repr__(self):
        return f"{self.kind}({self.domain}, {self.took * 1000:.0f}ms)"


def decide(node, domain="example.net"):
    return Decision(node, domain, *rcpt_decision(node, f"<u@{domain}>"))


def kinds(decisions):
    return [d.kind for d in decisions]


def store_stats(node):
    """The store's counters from `sluice stats --json` (fallbacks, timeouts, ...)."""
    s = node.stats()["store"]
    return s.get("shared", s)


def fallbacks(node):
    return int(store_stats(node)["fallbacks"])


def warm_up(*nodes):
    """A few decisions on a domain of its own on every node, so that each worker has
    made its connections before the decisions a test counts."""
    for node in nodes:
        for _ in range(3):
            decide(node, "warm-up.example")


def decide_from_redis(node, domain, timeout=10):
    """The first decision for domain on node that is not answered by on_failure (each
    worker of a node reconnects on its own, with backoff)."""
    got = []

    def redis_decided():
        got.append(decide(node, domain))
        return got[-1].kind != "fallback"
    wait_until(redis_decided, timeout, f"a decision for {domain} from Redis", interval=0.1)
    return got[-1]


def until_spent(nodes, domain, timeout=30, check=None):
    """Decisions for domain, alternating nodes, until two in a row (one per node) say the
    budget is spent; returns them all."""
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out.append(decide(nodes[len(out) % len(nodes)], domain))
        if check:
            check(out)
        if kinds(out[-len(nodes):]) == ["limit"] * len(nodes):
            return out
        time.sleep(0.02)
    raise AssertionError(f"the budget of {domain} never seen spent by every node: {out}")


def settled(nodes, domain, want="limit", timeout=10):
    """Wait until 2 decisions per node in a row are `want` (none admitted meanwhile
    unless want is admit), then check that 2 more per node cost no fallback."""
    def all_want():
        tail = [decide(n, domain) for n in nodes * 2]
        assert want == "admit" or "admit" not in kinds(tail), tail
        return kinds(tail) == [want] * len(tail)
    wait_until(all_want, timeout, f"every node deciding {domain} from Redis", interval=0.1)
    fb = [fallbacks(n) for n in nodes]
    tail = [decide(n, domain) for n in nodes * 2]
    assert kinds(tail) == [want] * len(tail), tail
    assert [fallbacks(n) for n in nodes] == fb


def new_keys(c, before, pattern=PATTERN):
    """{key: master} of the keys that were not there before."""
    now = c.keys(pattern)
    return {k: m for k, m in now.items() if k not in before}


def key_of(c, node, domain, pattern=PATTERN):
    """Make a first decision for domain on node and return (decision, its key, the master
    holding it).  Exactly one key must have appeared, in the slot of its hash tag."""
    before = c.keys(pattern)
    d = decide(node, domain)
    keys = new_keys(c, before, pattern)
    assert len(keys) == 1, f"{domain}: keys appeared: {keys}"
    (key, master), = keys.items()
    assert c.owner_of_slot(key_slot(key)) is master
    return d, key, master


def line_of(text, needle):
    return text.splitlines().index(needle) + 1


# ---------------------------------------------------------------------------------------
# the harness alone

@plain_only
def test_cluster_harness_creates_a_cluster_and_fails_over(cluster):
    """Six servers, three masters with a replica each, cluster_state:ok everywhere; keys
    set through `redis-cli -c` land in the slots CLUSTER KEYSLOT names; a master killed
    with SIGKILL is replaced by its replica within seconds and comes back as a replica."""
    t0 = time.monotonic()
    c = cluster()
    created = time.monotonic() - t0
    assert created < 15, f"the cluster took {created:.1f}s to create"
    masters = c.masters()
    assert len(masters) == 3 and len(c.nodes) == 6
    replicas = [c.replica_of(m) for m in masters]
    assert len(set(replicas)) == 3 and not set(replicas) & set(masters)
    assert sum(len(c.slots_of(m)) for m in masters) == 16384
    for i in range(15):
        key = f"key:{i}"
        out = subprocess.run(["/usr/bin/redis-cli", "-c", "-p", str(masters[0].port),
                              "SET", key, str(i)], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        assert out == "OK", out
        assert key_slot(key) == c.keyslot(key)
        assert c.owner_of_key(key).cli("GET", key) == str(i)
    # tagged keys share a slot
    assert key_slot("a:{x}:1") == key_slot("b:{x}:2") == c.keyslot("{x}")
    assert all(m.dbsize() > 0 for m in masters), [m.dbsize() for m in masters]
    victim = c.owner_of_key("key:1")
    t1 = time.monotonic()
    c.kill_master(victim)
    new = c.wait_failover(victim)
    failover = time.monotonic() - t1
    assert failover < 10, f"failover took {failover:.1f}s"
    assert new is replicas[masters.index(victim)]
    assert c.owner_of_key("key:1") is new and new.cli("GET", "key:1") == "1"
    c.restart(victim)
    wait_until(lambda: victim.role() == "slave", 10, "the old master back as a replica")
    print(f"cluster created in {created:.1f}s, failover in {failover:.1f}s")


# ---------------------------------------------------------------------------------------
# one budget for two nodes

def test_two_nodes_share_one_rate_limit_through_the_cluster(sluiced, cluster):
    c = cluster()
    a, b = two_nodes(sluiced, config(per_domain("10/1m"), cluster_store(c)))
    warm_up(a, b)
    fb = fallbacks(a), fallbacks(b)
    warm_keys = c.keys(PATTERN)
    t0 = time.monotonic()
    results = [decide(a if i % 2 == 0 else b) for i in range(16)]
    assert time.monotonic() - t0 < 5.5, "too slow for a 10/1m check"
    assert kinds(results) == ["admit"] * 10 + ["limit"] * 6, results
    assert any(d.kind == "admit" for d in results[0::2])
    assert any(d.kind == "admit" for d in results[1::2])
    assert b"Rate limit exceeded for example.net" in results[-1].payload
    assert (fallbacks(a), fallbacks(b)) == fb, "decisions answered by on_failure"
    # one key for (rule, domain), with all its windows, on the master serving its slot
    keys = new_keys(c, warm_keys)
    assert len(keys) == 1, keys
    for k, m in keys.items():
        assert re.search(r"\{[^}]+\}", k), f"no hash tag in {k}"
        assert c.owner_of_slot(key_slot(k)) is m
        assert 0 < int(m.cli("PTTL", k)) <= 60 * 1000 + 1000
    for node in (a, b):
        out = node.cli("stats").stdout
        assert "connected to cluster" in out, out
    # the operator's commands reach the key on its master
    shown = b.cli("limits", "show", "example.net").stdout
    assert re.search(r"^per-domain example\.net: 10/1m used 10/10\b", shown, re.M), shown
    res = a.cli("limits", "reset", "example.net").stdout
    assert re.search(r"^per-domain example\.net: reset$", res, re.M), res
    assert new_keys(c, warm_keys) == {}
    assert decide(b).kind == "admit"


@plain_only
def test_keys_spread_over_every_master(sluiced, cluster):
    """60 domains under a rule with two windows: every domain's state is in one slot
    (hash tag), and the slots of the 60 fall on all three masters."""
    c = cluster()
    rule = ('limit "per-domain" { stage = "rcpt"; key = "rcpt_domain"; '
            'rate = ["10/1m", "100/1h"]; }')
    a, b = two_nodes(sluiced, config(rule, cluster_store(c, on_failure="tempfail")))
    warm_up(a, b)
    fb = fallbacks(a), fallbacks(b)
    per_master = {m: 0 for m in c.masters()}
    seen = c.keys(PATTERN)
    for i in range(60):
        node = a if i % 2 == 0 else b
        domain = f"d{i}.example"
        d = decide(node, domain)
        assert d.kind == "admit", d
        keys = new_keys(c, seen)
        assert keys, f"no key in Redis for {domain}"
        slots = {key_slot(k) for k in keys}
        assert len(slots) == 1, f"{domain}: its windows are in several slots: {keys}"
        for k, m in keys.items():
            assert "{" in k and "}" in k, f"no hash tag in {k}"
            per_master[m] += 1
        seen.update(keys)
    counts = {m.address: n for m, n in per_master.items()}
    assert all(n >= 5 for n in per_master.values()), counts
    # what Redis itself holds: DBSIZE on each master agrees
    total = sum(m.dbsize() for m in c.masters())
    assert total == len(c.keys("*")), (total, counts)
    assert (fallbacks(a), fallbacks(b)) == fb


# ---------------------------------------------------------------------------------------
# failures and changes of the cluster

@plain_only
def test_failover_of_the_hot_keys_master_keeps_the_limit_exact(sluiced, cluster):
    """SIGKILL the master serving the hot key: while its replica takes over, decisions
    are answered by on_failure (tempfail: none admitted wrongly); once it serves the slot,
    the count goes on where it was (the replica had it), exactly."""
    c = cluster()
    a, b = two_nodes(sluiced, config(per_domain("10/1h"),
                                     cluster_store(c, on_failure="tempfail")))
    warm_up(a, b)
    first, key, master = key_of(c, a, "example.net")
    before = [first] + [decide(b if i % 2 == 0 else a) for i in range(3)]
    assert kinds(before) == ["admit"] * 4, before
    replica = c.replica_of(master)
    c.kill_master(master)        # once the replica has every charge
    t0 = time.monotonic()

    def quick(out):
        assert out[-1].took < 0.05 + 0.3, f"a decision waited {out[-1].took:.3f}s: {out}"
    # until both nodes have answered from Redis that the budget is spent
    after = until_spent((a, b), "example.net", check=quick)
    recovered = time.monotonic() - t0
    admitted = kinds(after).count("admit")
    assert admitted == 6, f"{admitted} admitted after the failover (4 before, limit 10): " \
                          f"{after}"
    assert kinds(after[-2:]) == ["limit", "limit"], after
    first_limit = kinds(after).index("limit")
    assert "admit" not in kinds(after)[first_limit:], after
    assert replica.role() == "master"
    assert c.owner_of_slot(key_slot(key)) is replica
    assert recovered < 15, f"decisions came back from Redis after {recovered:.1f}s"
    # settled: no more fallbacks
    settled((a, b), "example.net")
    print(f"decisions from Redis again {recovered:.1f}s after the kill; "
          f"{kinds(after).count('fallback')} answered by on_failure meanwhile")


def _decide_in_background(nodes, domain, stop, out, pause=0.005):
    i = 0
    while not stop.is_set():
        out.append(decide(nodes[i % len(nodes)], domain))
        i += 1
        time.sleep(pause)


@plain_only
def test_reshard_under_load_makes_no_wrong_decision(sluiced, cluster):
    """`redis-cli --cluster reshard` moves the hot key's slot (with a few hundred others)
    to another master while two nodes decide on it: nothing is answered by on_failure,
    every charge is in the key that moved (`sluice limits show`), and the total admitted
    is exactly the limit."""
    limit = 150
    c = cluster()
    a, b = two_nodes(sluiced, config(per_domain(f"{limit}/1d"),
                                     cluster_store(c, on_failure="tempfail")))
    warm_up(a, b)
    first, key, src = key_of(c, a, "example.net")
    slot = key_slot(key)
    dst = next(m for m in c.masters() if m is not src)
    # the slot is in the middle of what moves: up to 300 slots after it move too
    n = min(c.slots_to_move(src, slot) + 300, len(c.slots_of(src)))
    fb = fallbacks(a), fallbacks(b)
    stop, during = threading.Event(), []
    t = threading.Thread(target=_decide_in_background, args=((a, b), "example.net", stop,
                                                             during))
    t.start()
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        proc = c.reshard(src, dst, n, background=True)
        rc = proc.wait(120)
        took = time.monotonic() - t0
        time.sleep(0.1)
    finally:
        stop.set()
        t.join(30)
    assert rc == 0, f"reshard failed:\n{c.reshard_log()}"
    c.wait_ok()
    assert c.owner_of_slot(slot) is dst
    assert key in dst.keys(PATTERN) and key not in src.keys(PATTERN), "the key did not move"
    results = [first] + during
    assert "fallback" not in kinds(results), \
        f"answered by on_failure during the move: {[d for d in results if d.kind != 'admit']}"
    admitted = kinds(results).count("admit")
    if admitted < limit:
        shown = b.cli("limits", "show", "example.net").stdout
        assert re.search(rf"^per-domain example\.net: {limit}/1d used {admitted}/{limit}\b",
                         shown, re.M), (admitted, shown)
    # then on to the limit, and past it
    results += until_spent((a, b), "example.net")
    expected = ["admit"] * min(limit, len(results))
    expected += ["limit"] * (len(results) - len(expected))
    assert kinds(results) == expected, [d for d in results if d.kind != "admit"][:5]
    settled((a, b), "example.net")
    assert (fallbacks(a), fallbacks(b)) == fb
    assert len(during) > 10, f"only {len(during)} decisions during the {took:.1f}s move"
    print(f"{n} slots moved in {took:.1f}s with {len(during)} decisions meanwhile")


def test_a_slot_migrating_step_by_step_is_followed(sluiced, cluster):
    """The hot key's slot moved by hand, a decision at every step: MIGRATING with the key
    still on the old master (served there), the key moved but the slot not yet given
    away (the old master answers ASK), and the slot given to the new master (MOVED for a
    node that still has the old map).  Every decision is exact."""
    c = cluster()
    a, b = two_nodes(sluiced, config(per_domain("10/1h"),
                                     cluster_store(c, on_failure="tempfail")))
    warm_up(a, b)
    first, key, src = key_of(c, a, "example.net")
    slot = key_slot(key)
    dst = next(m for m in c.masters() if m is not src)
    results = [first]
    fb = fallbacks(a), fallbacks(b)

    def between(stage):
        # where the key is at this stage, and that the decisions charged it there
        holder, other = (src, dst) if stage == "migrating" else (dst, src)
        assert key in holder.keys(PATTERN) and key not in other.keys(PATTERN), stage
        value = holder.raw_get(key)
        for node in (a, b):
            results.append(decide(node))
        assert holder.raw_get(key) != value, f"{stage}: the decisions did not reach " \
                                                f"{holder}"
        assert key not in other.keys(PATTERN), stage
    c.migrate_slot(slot, src, dst, between)
    for node in (a, b, a, b):
        results.append(decide(node))
    assert c.owner_of_slot(slot) is dst and key in dst.keys(PATTERN)
    assert kinds(results) == ["admit"] * 9, results
    results += [decide(n) for n in (a, b, a)]
    assert kinds(results) == ["admit"] * 10 + ["limit"] * 2, results
    assert (fallbacks(a), fallbacks(b)) == fb
    # ASK while the key had moved, MOVED for the node with the old map: counted
    assert int(store_stats(a)["redirects"]) + int(store_stats(b)["redirects"]) >= 2


def decide_as(node, sender, domain):
    """As decide(), from a given sender."""
    with mw.MilterClient(node.milter_socket) as cl:
        cl.negotiate()
        cl.connect()
        cl.helo()
        cl.mail(f"<{sender}>")
        t0 = time.monotonic()
        code, payload = cl.rcpt(f"<u@{domain}>")
        took = time.monotonic() - t0
        if code == mw.CONTINUE:
            cl.data()
            cl.header("Subject", "x")
            cl.eoh()
            cl.body(b"hello\r\n")
            _, end, _ = cl.eob()
            assert end in (mw.ACCEPT, mw.CONTINUE), end
    return Decision(node, domain, code, payload, took)


def test_a_decision_over_two_slots_is_split_and_refunded(sluiced, cluster):
    """Two rules at RCPT, per sender and per recipient domain: their keys are in two
    slots (two masters, maybe), so a decision is two script calls.  When the sender's
    rule refuses, what the domain's part charged is given back: the domain's budget
    counts only admitted messages."""
    c = cluster()
    rules = ('limit "per-sender" { stage = "rcpt"; key = "sender"; rate = ["3/1h"]; }\n'
             'limit "per-domain" { stage = "rcpt"; key = "rcpt_domain"; rate = ["5/1h"]; }')
    a, b = two_nodes(sluiced, config(rules, cluster_store(c, on_failure="tempfail")))
    before = c.keys("sluice:*")
    first = decide_as(a, "s1@example.org", "example.net")
    assert first.kind == "admit", first
    keys = new_keys(c, before, "sluice:*")
    assert len(keys) == 2, keys
    assert len({key_slot(k) for k in keys}) == 2, f"both keys in one slot: {keys}"
    out = [first] + [decide_as(n, "s1@example.org", "example.net") for n in (b, a)]
    assert kinds(out) == ["admit"] * 3, out
    refused = [decide_as(n, "s1@example.org", "example.net") for n in (b, a) * 3]
    assert kinds(refused) == ["limit"] * 6, refused
    assert b"s1@example.org" in refused[0].payload, refused[0].payload
    # the refunds are sent as the refusals are answered; give them a round trip
    time.sleep(0.2)
    shown = a.cli("limits", "show", "example.net").stdout
    assert re.search(r"^per-domain example\.net: 5/1h used 3/5\b", shown, re.M), shown
    more = [decide_as(n, "s2@example.org", "example.net") for n in (b, a, b)]
    assert kinds(more) == ["admit", "admit", "limit"], more
    assert b"example.net" in more[-1].payload, more[-1].payload
    assert fallbacks(a) == fallbacks(b) == 0


@pytest.mark.parametrize("full_coverage", ["no", "yes"])
@plain_only
def test_a_lost_slot_range_answers_by_on_failure_and_recovers(sluiced, cluster,
                                                              full_coverage):
    """A master and its replica killed: their slots are served by nobody.  With
    cluster-require-full-coverage no, keys in those slots are answered by on_failure
    (tempfail) at once, other keys are still decided by Redis, exactly; with yes (the
    default) the whole cluster refuses (CLUSTERDOWN) and every key is answered by
    on_failure.  Started again, the two servers take their slots back (nodes.conf) and
    decisions go to Redis again."""
    c = cluster(extra=["--cluster-require-full-coverage", full_coverage])
    a, b = two_nodes(sluiced, config(per_domain("5/1h"),
                                     cluster_store(c, on_failure="tempfail")))
    warm_up(a, b)
    where = {}
    for i in range(12):
        d, key, master = key_of(c, a if i % 2 == 0 else b, f"d{i}.example")
        assert d.kind == "admit", d
        where[f"d{i}.example"] = master
    victim = where["d0.example"]
    lost = [dom for dom, m in where.items() if m is victim]
    kept = [dom for dom, m in where.items() if m is not victim]
    assert kept, where
    killed = c.lose_slot_range(victim)
    survivors = [n for n in c.alive_nodes()]

    def marked_failed():
        return all("fail" in r["flags"] for v in survivors for r in c.cluster_nodes(v)
                   if r["id"] == victim.id)
    wait_until(marked_failed, 15, f"{victim} flagged fail by the others", interval=0.1)
    if full_coverage == "yes":
        wait_until(lambda: all(not n.state_ok() for n in survivors), 15,
                   "cluster_state:fail")
    else:
        assert all(n.state_ok() for n in survivors)
    fb = fallbacks(a) + fallbacks(b)
    out = []
    for round_ in range(4):
        for dom in lost + kept:
            node = a if len(out) % 2 == 0 else b
            d = decide(node, dom)
            assert d.took < 0.05 + 0.3, f"a decision waited {d.took:.3f}s"
            out.append(d)
    for dom in lost:
        assert kinds(d for d in out if d.domain == dom) == ["fallback"] * 4, out
    for dom in kept:
        got = kinds(d for d in out if d.domain == dom)
        if full_coverage == "yes":
            assert got == ["fallback"] * 4, (dom, out)
        else:
            # 1 before, 4 more: the 5th is the last of 5/1h, decided by Redis
            assert got == ["admit"] * 4, (dom, out)
    expect_fb = 4 * (len(lost) + (len(kept) if full_coverage == "yes" else 0))
    assert fallbacks(a) + fallbacks(b) - fb == expect_fb
    if full_coverage == "no":
        for dom in kept:
            assert decide(a, dom).kind == "limit"
    # the node says so (the state of a store is one line, whichever master is away)
    for node in (a, b):
        stats = node.cli("stats").stdout
        assert re.search(r"^store redis: unreachable \(.*\): on_failure=tempfail", stats,
                         re.M), stats
    # back: the restarted master is empty (no persistence), its domains count from 0
    c.restore(killed)
    t0 = time.monotonic()
    back = until_spent((a, b), lost[0])
    assert kinds(back).count("admit") == 5, back
    assert "admit" not in kinds(back)[kinds(back).index("limit"):], back
    settled((a, b), lost[0])
    for dom in kept:
        d = decide_from_redis(b, dom)
        assert d.kind == ("admit" if full_coverage == "yes" else "limit"), d
    for node in (a, b):
        wait_until(lambda: "connected to cluster" in node.cli("stats").stdout, 10,
                   "the store connected again")
        node.log.wait_for(r"redis store: .* again after")
    print(f"lost {len(lost)} of 12 domains; back {time.monotonic() - t0:.1f}s after "
          "the restart")


def test_a_cluster_with_a_password(sluiced, cluster):
    """Every node requires a password: sluiced gives it (password_file) on every
    connection it makes, to each master; a wrong one is a start-up error that says
    AUTH was refused, and the password is never printed."""
    c = cluster(password="s3cret")
    s = sluiced(config(per_domain("3/1h"),
                       cluster_store(c, extra='password = "not-it-x9q";')), start=False)
    r = run_sluiced(s)
    assert r.returncode != 0, r
    out = r.stdout + r.stderr
    assert re.search(r"WRONGPASS|invalid|AUTH", out), out
    assert c.seeds[0] in out and "not-it-x9q" not in out, out
    secret = s.dir / "redis.secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    node = sluiced(config(per_domain("3/1h"),
                          cluster_store(c, on_failure="tempfail",
                                        extra=f'password_file = "{secret}";')))
    out = [decide(node, f"d{i}.example") for i in range(12)]
    assert kinds(out) == ["admit"] * 12, out
    assert all(m.dbsize() > 0 for m in c.masters()), "some master was never written to"
    assert kinds([decide(node, "d0.example") for _ in range(3)]) == ["admit", "admit",
                                                                      "limit"]
    assert fallbacks(node) == 0
    assert "s3cret" not in node.log.text() and "s3cret" not in node.cli("stats").stdout


def test_pipelined_policy_requests_over_every_master(sluiced, cluster):
    """Many policy requests in one write, for domains whose keys are on different
    masters: the decisions of one loop pass are batched per slot and node, and every
    answer comes back in order and exact (2 per domain, the rest refused)."""
    import socket
    from test_policy import policy_socket
    c = cluster()
    node = sluiced(config(per_domain("2/1h"), cluster_store(c, on_failure="tempfail"),
                          milter=False, policy=True))

    def request(rcpt, port):
        attrs = {"request": "smtpd_access_policy", "protocol_state": "RCPT",
                 "protocol_name": "ESMTP", "client_address": "192.0.2.9",
                 "client_port": str(port), "server_address": "127.0.0.1",
                 "server_port": "25", "client_name": "client.example", "helo_name": "h",
                 "sender": "s@example.org", "recipient": rcpt, "recipient_count": "0",
                 "instance": f"inst.{port}", "size": "0"}
        return "".join(f"{k}={v}\n" for k, v in attrs.items()).encode() + b"\n"
    rcpts = [f"u{i}@d{i % 9}.example" for i in range(45)]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(policy_socket(node))
        sock.sendall(b"".join(request(rc, 40000 + i) for i, rc in enumerate(rcpts)))
        sock.settimeout(10)
        data = b""
        while data.count(b"\n\n") < len(rcpts):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {data!r}"
            data += chunk
    answers = [a for a in data.decode().split("\n\n") if a]
    assert len(answers) == len(rcpts), answers
    seen = {}
    for rc, ans in zip(rcpts, answers):
        dom = rc.split("@")[1]
        seen[dom] = seen.get(dom, 0) + 1
        if seen[dom] <= 2:
            assert ans == "action=DUNNO", (rc, ans)
        else:
            assert ans.startswith("action=451 4.7.1 Rate limit exceeded for " + dom), (rc, ans)
    keys = c.keys(PATTERN)
    assert len(keys) == 9, keys
    assert len(set(keys.values())) == 3, "the 9 domains' keys are not on all three masters"
    assert fallbacks(node) == 0
    # one session decides its requests in turn: one script call each
    assert int(store_stats(node)["calls"]) == len(rcpts), store_stats(node)


def test_reload_keeps_the_cluster_store(sluiced, cluster):
    """`sluice reload` with a stricter rate keeps deciding through the cluster, from the
    same keys' windows; new seeds (the same cluster named by its replicas, or a closed
    port) are, like every store setting, for the next start: the reload says so and the
    running store goes on deciding from Redis."""
    c = cluster()
    node = sluiced(config(per_domain("5/1h"), cluster_store(c, on_failure="tempfail")))
    assert kinds([decide(node) for _ in range(2)]) == ["admit"] * 2

    def reload(text, warned):
        node.write_config(text)
        mark = node.log.mark()
        res = node.cli("reload")
        assert "reloading" in res.stdout, res.stdout
        node.log.wait_for(r"configuration reloaded from", after=mark)
        found = node.log.search(r"store settings changed; they take effect at the next "
                                r"restart", after=mark)
        assert bool(found) == warned, node.log.tail(5)
    reload(config(per_domain("3/1h"), cluster_store(c, on_failure="tempfail")), False)
    out = [decide(node) for _ in range(4)]
    assert kinds(out) == ["admit"] * 3 + ["limit"], out
    replicas = [c.replica_of(m).address for m in c.masters()]
    reload(config(per_domain("3/1h"), cluster_store(seeds=replicas, on_failure="tempfail")),
           True)
    assert decide(node).kind == "limit"
    reload(config(per_domain("3/1h"), cluster_store(seeds=[f"127.0.0.1:{free_port()}"],
                                                    on_failure="tempfail")), True)
    out = [decide(node, "other.example") for _ in range(4)]
    assert kinds(out) == ["admit"] * 3 + ["limit"], out
    assert "(reloaded 3 times)" in node.cli("status").stdout
    assert fallbacks(node) == 0


# ---------------------------------------------------------------------------------------
# host classes across nodes, on a cluster

@plain_only
def test_class_sessions_shared_by_two_nodes_on_a_cluster(sluiced, cluster):
    c = cluster()
    a, b = two_nodes(sluiced, config(CLASS_ALL, cluster_store(c, extra="lease = 3s;")))
    held, refused = [], 0
    for i in range(10):
        node = a if i % 2 == 0 else b
        cl, code = open_session(node, f"192.0.2.{i + 1}")
        if code == mw.CONTINUE:
            held.append((node, cl))
        else:
            assert code == mw.REPLYCODE, code
            refused += 1
            cl.close()
    assert len(held) == 4 and refused == 6, (len(held), refused)
    keys = c.keys("sluice:*class*")
    assert len(keys) == 1, keys
    (key, master), = keys.items()
    assert "{all}" in key, key
    assert c.owner_of_slot(key_slot("{all}")) is master
    on_b = [cl for node, cl in held if node is b]
    assert on_b, "node B should hold some of the slots"
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
    cl, code = open_session(a, "192.0.2.61")
    assert code == mw.REPLYCODE
    cl.close()
    for node, cl in held:
        if node is a:
            cl.close()
    for cl in got:
        cl.close()


# ---------------------------------------------------------------------------------------
# a relay lane shared by two nodes, on a cluster

@plain_only
def test_two_nodes_share_one_lane_budget_on_a_cluster(sluiced, smarthost, cluster):
    """As test_relay_shared_budget's shared lane, with the budget on a cluster: the lane's
    windows are keys with one hash tag (the lane's name), in the slot of that tag on the
    master serving it; 20 one-recipient messages from two nodes reach the smarthost never more
    than 5 in any 2 s window."""
    from conftest import SLUICE, require_binary
    from test_relay import delivered_rcpts, lanes, relay_config
    from test_relay_shared_budget import SHARED_ROUTE, send_each
    require_binary(SLUICE, "SLUICE")
    c = cluster()
    sh = smarthost(rate="5/2", mode="none")
    nodes = []
    for name in ("node-a", "node-b"):
        port = free_port()
        store = cluster_store(c, extra=f'node = "{name}";')
        nodes.append((sluiced(relay_config(port, sh.port, route=SHARED_ROUTE, extra=store)),
                      port))
    (a, pa), (b, pb) = nodes
    ra = [f"a{i:02d}@example.net" for i in range(10)]
    rb = [f"b{i:02d}@example.net" for i in range(10)]
    threads = [threading.Thread(target=send_each, args=(pa, ra, "from a")),
               threading.Thread(target=send_each, args=(pb, rb, "from b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        sh.wait_accepted(20, timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- node a ---\n{a.log.tail()}\n--- node b ---\n"
                             f"{b.log.tail()}") from None
    time.sleep(0.5)
    assert sorted(delivered_rcpts(sh)) == sorted(ra + rb)
    assert sh.windows_over(5, 2.0) == [], sorted(sh.attempts())
    for node, n in ((a, 10), (b, 10)):
        wait_until(lambda: "the queue is empty" in node.cli("queue").stdout, 10,
                   "the queue to empty")
        lane = lanes(node)[0]
        assert lane["delivered"] == n and lane["failed"] == 0, lane
    keys = c.keys("sluice:lane:*")
    assert keys, c.keys()
    tags = {re.search(r"\{([^}]+)\}", k).group(1) if "{" in k else None for k in keys}
    assert len(tags) == 1 and None not in tags, keys
    for k, m in keys.items():
        assert c.owner_of_slot(key_slot(k)) is m
    assert fallbacks(a) == fallbacks(b) == 0


# ---------------------------------------------------------------------------------------
# bad input

def run_sluiced(s, *args, timeout=30):
    """sluiced [args] -c CONFIG in the foreground; fails if it is still running after
    timeout seconds (it must have refused to start)."""
    try:
        return subprocess.run([SLUICED,
                               *args, "-c", str(s.config)], capture_output=True, text=True,
                              timeout=timeout, cwd=s.dir)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"sluiced {' '.join(args)} still running after {timeout}s; "
                             f"output: {e.stdout!r} {e.stderr!r}") from None


def test_seeds_that_are_no_cluster_are_a_start_up_error(sluiced, workdir):
    """A seed list naming a redis-server that is not in cluster mode, or a port where
    nothing listens: sluiced refuses to start, naming the address."""
    plain = Redis(workdir / "plain", port=free_port())
    plain.dir.mkdir()
    plain.start()
    try:
        s = sluiced(config(per_domain("10/1h"), cluster_store(seeds=[plain.address])),
                    start=False)
        r = run_sluiced(s)
        assert r.returncode != 0, r
        out = r.stdout + r.stderr
        assert plain.address in out and re.search(r"cluster", out, re.I), out
    finally:
        plain.stop()
    closed = free_port()
    s2 = sluiced(config(per_domain("10/1h"), cluster_store(seeds=[f"127.0.0.1:{closed}"])),
                 start=False)
    r = run_sluiced(s2)
    assert r.returncode != 0, r
    out = r.stdout + r.stderr
    assert f"127.0.0.1:{closed}" in out, out


def test_one_seed_answering_is_enough(sluiced, cluster):
    """A seed list whose first address is closed starts all the same from the others,
    and decides from the cluster."""
    c = cluster()
    seeds = [f"127.0.0.1:{free_port()}"] + c.seeds[1:]
    node = sluiced(config(per_domain("3/1h"), cluster_store(seeds=seeds,
                                                            on_failure="tempfail")))
    out = [decide(node) for _ in range(4)]
    assert kinds(out) == ["admit"] * 3 + ["limit"], out
    assert len(c.keys(PATTERN)) == 1


def test_masters_announced_outside_the_seeds_hosts_are_followed_and_logged_once(sluiced,
                                                                              cluster):
    """The cluster announces its nodes at 127.0.0.2 (cluster-announce-ip) while the seeds
    say 127.0.0.1: sluiced follows the map to 127.0.0.2, decides there, and says so once
    per address, however many decisions and map refreshes follow."""
    c = cluster(extra=["--bind", "127.0.0.1 127.0.0.2", "--cluster-announce-ip", "127.0.0.2"])
    node = sluiced(config(per_domain("3/1h"), cluster_store(c, on_failure="tempfail")))
    out = [decide(node, f"d{i % 6}.example") for i in range(24)]
    assert kinds(out) == (["admit"] * 6) * 3 + ["limit"] * 6, out
    assert fallbacks(node) == 0
    for m in c.masters():
        announced = f"127.0.0.2:{m.port}"
        node.log.wait_for(rf"redis store: the cluster sends requests to "
                          rf"{re.escape(announced)}, a host not among the seeds", timeout=5)
        found = node.log.findall(rf"sends requests to {re.escape(announced)},")
        assert len(found) == 1, found


def test_bad_cluster_configuration_is_refused_with_file_and_line(sluiced):
    seeds = 'cluster = ["127.0.0.1:7000", "127.0.0.1:7001"];'
    for store, keys, why in [
            (f'store {{ type = "redis"; server = "127.0.0.1:6379"; {seeds} }}',
             "server|cluster", r"server.*cluster|cluster.*server"),
            (f'store {{ type = "redis"; sentinels = ["127.0.0.1:26379"]; '
             f'master_name = "m"; {seeds} }}',
             "sentinels|cluster", r"sentinels.*cluster|cluster.*sentinels"),
            ('store { type = "redis"; cluster = []; }', "cluster", r"empty|at least|no seed"),
            (f'store {{ type = "redis"; db = 1; {seeds} }}', "db|cluster", r"database|db"),
            (f'store {{ type = "redis"; prefix = "s{{x}}:"; {seeds} }}', "prefix",
             r"[{}]|hash tag"),
    ]:
        text = config(per_domain("10/1h"), store)
        s = sluiced(text, start=False)
        r = subprocess.run([SLUICED,
                            "-t", "-c", str(s.config)], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1, (store, r)
        line = line_of(text, store)
        assert re.search(rf"sluiced\.conf:{line}: store\.({keys}): .*({why})",
                         r.stderr), (store, r.stderr)


# ---------------------------------------------------------------------------------------
# a master that stops answering (a network partition, a stuck host)

@plain_only
def test_a_stalled_master_is_dropped_and_its_replica_followed(sluiced, cluster):
    """SIGSTOP the master of the hot key: its connection stays up but nothing answers.
    Each decision costs at most the timeout (answered by on_failure); within a second
    the node drops the connection as stalled ("no reply for ...ms", the store reported
    unreachable), asks the other masters for the slot map every second, and once the
    cluster has failed the master over (~2.5 s) its decisions go to the replica, with
    every charge kept."""
    c = cluster()
    node = sluiced(config(per_domain("100/1h"), cluster_store(c, on_failure="tempfail")))
    first, key, master = key_of(c, node, "example.net")
    assert first.kind == "admit"
    admitted = 1 + kinds([decide(node) for _ in range(4)]).count("admit")
    replica = c.replica_of(master)
    c.wait_replicas_in_sync()
    mark = node.log.mark()
    master.proc.send_signal(signal.SIGSTOP)
    out = []
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15:
            d = decide(node)
            out.append(d)
            assert d.took < 0.05 + 0.25, f"a decision waited {d.took:.3f}s: {out[-5:]}"
            if kinds(out[-3:]) == ["admit"] * 3 and "fallback" in kinds(out):
                break
            time.sleep(0.02)
        moved = time.monotonic() - t0
        stats = node.cli("stats").stdout
    finally:
        master.proc.send_signal(signal.SIGCONT)
    assert "fallback" in kinds(out), "no decision waited on the stopped master?"
    assert node.log.search(r"redis store: .* unreachable \(.*no reply for \d+ms",
                           after=mark), \
        f"the stalled connection was never dropped ({moved:.1f}s of fallbacks); " \
        f"stats: {[l for l in stats.splitlines() if l.startswith('store')]}"
    assert kinds(out[-3:]) == ["admit"] * 3, f"not back after {moved:.1f}s: {out[-5:]}"
    assert moved < 8, f"decisions went to the promoted replica only {moved:.1f}s after " \
                      "the master stopped"
    assert replica.role() == "master" and c.owner_of_slot(key_slot(key)) is replica
    admitted += kinds(out).count("admit")
    shown = node.cli("limits", "show", "example.net").stdout
    assert re.search(rf"^per-domain example\.net: 100/1h used {admitted}/100\b", shown,
                     re.M), (admitted, shown)
    wait_until(lambda: master.role() == "slave", 15, "the old master back as a replica")
    settled((node,), "example.net", want="admit")
