"""The newer kinds of limit shared by two nodes through a real redis-server.

Penalty boxes (`block`), distinct values (`count = "distinct"`), sessions at once
(`count = "sessions"`) and chain keys (`key = "a|b"`), each with two sluiced nodes whose
`store { type = "redis"; }` is one redis-server of the test's own (test_redis.py's
fixture, on a unix socket).  Decisions are asked straight of the nodes: the Postfix
policy protocol on their policy sockets, and for sessions rules (which apply through the
milter only) the milter client of peers/milter_wire.py, which can hold sessions open.

The store answers with `on_failure = "tempfail"` and a generous `timeout`, so that a
decision Redis did not make shows up as a refusal ("451 4.3.0") instead of passing
quietly on a node's local share; each test also checks that no decision fell back.
Windows are a few seconds long where a test must wait for them; each test says what it
costs.  The whole file takes about 10 s.
"""

import re
import signal
import socket
import time

from conftest import wait_until
from peers import milter_wire as mw
from test_policy import config, policy_exchange, policy_socket
from test_redis import redis, redis_store  # noqa: F401  (redis: the fixture)


def store(r, extra=""):
    return redis_store(r, on_failure="tempfail", nodes=2, timeout="2s", extra=extra)


def two_nodes(sluiced, r, *rules, store_extra=""):
    text = config(*rules, store(r, store_extra), milter=True, policy=True)
    return sluiced(text), sluiced(text)


def no_fallbacks(*nodes):
    for n in nodes:
        shared = n.stats()["store"]["shared"]
        assert shared["fallbacks"] == 0, (shared, n.log.tail(20))


_instance = [0]


def ask(node, state, **attrs):
    """One policy request on a connection of its own, as a new message (its own
    `instance`); the action line of the answer ("action=DUNNO", "action=451 ...")."""
    _instance[0] += 1
    lines = {"request": "smtpd_access_policy", "protocol_state": state,
             "protocol_name": "ESMTP", "client_address": "192.0.2.7",
             "client_name": "mx.example.org", "client_port": str(40000 + _instance[0]),
             "server_address": "127.0.0.1", "server_port": "25",
             "helo_name": "mx.example.org", "sender": "a@example.org",
             "instance": f"rr.{_instance[0]}"}
    lines.update(attrs)
    request = "".join(f"{k}={v}\n" for k, v in lines.items()) + "\n"
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(policy_socket(node))
        answer = policy_exchange(c, request)
    assert answer.endswith("\n\n"), repr(answer)
    return answer.strip()


def show(node, key, rule):
    return node.cli("limits", "show", key, rule).stdout


# ---------------------------------------------------------------------------------------
# block: a penalty box every node sees (about 6 s: it waits out a 5 s block once)

BLOCK_RULE = ('limit "boxed" { stage = "mail"; key = "sender"; rate = "1/2s"; block = 5s; '
              'action = "tempfail"; }')


def test_a_block_started_on_one_node_holds_on_the_other(sluiced, redis):
    r = redis()
    a, b = two_nodes(sluiced, r, BLOCK_RULE)
    who = "boxed@example.org"
    assert ask(a, "MAIL", sender=who) == "action=DUNNO"
    refused = ask(a, "MAIL", sender=who)
    t_refused = time.monotonic()
    assert refused.startswith("action=451 4.7.1 "), refused
    assert who in refused, refused
    # the window has room again after 2 s; the block (5 s from the refusal) does not
    time.sleep(2.3)
    out = show(b, who, "boxed")
    assert re.search(rf"^boxed {re.escape(who)}: .*; BLOCKED \(block = 5s\), ends in [123]s$",
                     out, re.M), out
    again = ask(b, "MAIL", sender=who)
    assert again.startswith("action=451 4.7.1 "), (again, out)
    # a refusal during the block does not extend it: it ends 5 s after the first one
    time.sleep(max(0.0, t_refused + 5.3 - time.monotonic()))
    out = show(b, who, "boxed")
    assert "BLOCKED" not in out, out
    assert ask(b, "MAIL", sender=who) == "action=DUNNO", (out, b.log.tail(10))

    # `limits reset` on one node lifts a block at once for every node (a fresh sender)
    who = "reset@example.org"
    assert ask(a, "MAIL", sender=who) == "action=DUNNO"
    assert ask(a, "MAIL", sender=who).startswith("action=451 ")
    assert "BLOCKED" in show(b, who, "boxed")
    res = a.cli("limits", "reset", who, "boxed").stdout
    assert re.search(rf"^boxed {re.escape(who)}: reset$", res, re.M), res
    out = show(b, who, "boxed")
    assert "BLOCKED" not in out, out
    assert ask(b, "MAIL", sender=who) == "action=DUNNO", out
    no_fallbacks(a, b)


# ---------------------------------------------------------------------------------------
# distinct: the values one node counted are known to the other (under 1 s)

DISTINCT_RULE = ('limit "fan-out" { stage = "rcpt"; key = "sender"; count = "distinct"; '
                 'of = "rcpt"; rate = "2/1h"; }')


def test_distinct_values_are_shared_by_the_nodes(sluiced, redis):
    r = redis()
    a, b = two_nodes(sluiced, r, DISTINCT_RULE)
    who = "fan@example.org"
    for rcpt in ("r1@example.net", "r2@example.net"):
        assert ask(a, "RCPT", sender=who, recipient=rcpt) == "action=DUNNO", rcpt
    # a third value on the other node: no room
    third = ask(b, "RCPT", sender=who, recipient="r3@example.net")
    assert third.startswith("action=451 4.7.1 "), third
    # a value node A counted passes on node B, again and again, and is not charged
    for rcpt in ("r1@example.net", "r2@example.net", "r1@example.net"):
        assert ask(b, "RCPT", sender=who, recipient=rcpt) == "action=DUNNO", rcpt
    # the refused value was not remembered
    third = ask(a, "RCPT", sender=who, recipient="r3@example.net")
    assert third.startswith("action=451 4.7.1 "), third
    out = show(a, who, "fan-out")
    assert re.search(r"2/1h used 2/2", out), out
    # another key has its own values
    assert ask(b, "RCPT", sender="other@example.org",
               recipient="r3@example.net") == "action=DUNNO"
    no_fallbacks(a, b)


# ---------------------------------------------------------------------------------------
# sessions: slots of one key held on both nodes (about 3.5 s: a 3 s lease runs out)

SESSIONS_RULE = ('limit "per-client" { stage = "connect"; key = "client_ip"; '
                 'count = "sessions"; max = 2; action = "tempfail"; }')


def open_session(node, ip):
    """A milter session that has sent CONNECT and stays open: (client, (code, payload))."""
    c = mw.MilterClient(node.milter_socket)
    c.negotiate()
    reply = c.connect(address=ip)
    return c, reply


def enters(node, ip, keep):
    """True (the session kept open in keep) when a new session from ip is let in."""
    c, reply = open_session(node, ip)
    if reply[0] == mw.CONTINUE:
        keep.append(c)
        return True
    c.close()
    return False


def assert_refused(reply):
    code, payload = reply
    assert code == mw.REPLYCODE, reply
    assert payload.startswith(b"451 4.7.1 "), payload


def test_sessions_at_once_are_shared_and_a_dead_nodes_slots_come_back(sluiced, redis):
    r = redis()
    a, b = two_nodes(sluiced, r, SESSIONS_RULE, store_extra="lease = 3s;")
    ip, other = "192.0.2.20", "192.0.2.21"
    held = []
    try:
        ca, reply = open_session(a, ip)
        held.append(ca)
        assert reply[0] == mw.CONTINUE, reply
        cb, reply = open_session(b, ip)
        held.append(cb)
        assert reply[0] == mw.CONTINUE, reply
        # one lease hash for the (rule, key), a field pair per node (doc/CLUSTERS.md)
        keys = r.keys("sluice:class:s:*")
        assert len(keys) == 1, r.keys()
        fields = r.cli("HGETALL", keys[0]).splitlines()
        assert len([f for f in fields if f.startswith("c:")]) == 2, fields
        # a third from that address is refused on either node
        for node in (a, b):
            c, reply = open_session(node, ip)
            c.close()
            assert_refused(reply)
        # another address has slots of its own
        c, reply = open_session(a, other)
        held.append(c)
        assert reply[0] == mw.CONTINUE, reply
        # a session that ends on A frees its slot for B (the release is asynchronous)
        held.remove(ca)
        ca.close()
        wait_until(lambda: enters(b, ip, held), 5, "A's slot free for B")
        # now B holds both; hand one to A, then A dies holding it
        held.remove(cb)
        cb.close()
        wait_until(lambda: enters(a, ip, held), 5, "B's slot free for A")
        c, reply = open_session(b, ip)
        c.close()
        assert_refused(reply)
        a.signal(signal.SIGKILL)
        a.wait(10)
        a.expected_rc = -signal.SIGKILL
        t0 = time.monotonic()
        wait_until(lambda: enters(b, ip, held), 10, "the dead node's slot back")
        took = time.monotonic() - t0
        assert took <= 3 + 2, f"the slot came back after {took:.1f}s (lease = 3s)"
        # and no more than 2 at once
        c, reply = open_session(b, ip)
        c.close()
        assert_refused(reply)
        no_fallbacks(b)
    finally:
        for c in held:
            c.close()


# ---------------------------------------------------------------------------------------
# chain keys: the alternative that gave the key names it (under 1 s)

CHAIN_RULE = ('limit "chained" { stage = "mail"; key = "sasl_user|sender"; '
              'rate = "10/1h"; }')


def test_chain_key_through_the_policy_service_is_named_by_its_alternative(sluiced, redis):
    r = redis()
    a, b = two_nodes(sluiced, r, CHAIN_RULE)
    # Postfix sends sasl_username with an empty value for a client that did not log in:
    # no value, so the next alternative gives the key
    for _ in range(2):
        assert ask(a, "MAIL", sender="a@example.com", sasl_username="") == "action=DUNNO"
    assert ask(b, "MAIL", sender="a@example.com") == "action=DUNNO"
    assert ask(a, "MAIL", sender="a@example.com", sasl_username="bob") == "action=DUNNO"
    out = show(b, "sender:a@example.com", "chained")
    assert re.search(r"^chained sender:a@example\.com: 10/1h used 3/10$", out, re.M), out
    out = show(b, "sasl_user:bob", "chained")
    assert re.search(r"^chained sasl_user:bob: 10/1h used 1/10$", out, re.M), out
    no_fallbacks(a, b)


# ---------------------------------------------------------------------------------------
# many decisions of distinct and block rules in one script call (about 1 s): a worker's
# loop sends the decisions of one pass together, and each of these items carries two keys
# and more arguments than a plain rate

def test_a_batch_of_distinct_and_block_decisions_fits_one_call(sluiced, redis):
    r = redis()
    # one window and short names: the key text is short, the arguments are not
    rule = ('limit "f" { stage = "rcpt"; key = "sender"; count = "distinct"; of = "rcpt"; '
            'rate = ["1000/1h"]; block = 1h; }')
    text = config(rule, store(r), milter=False, policy=True).replace("workers = 2;",
                                                                   "workers = 1;")
    node = sluiced(text)
    conns = []
    for i in range(60):
        c = socket.socket(socket.AF_UNIX)
        c.connect(policy_socket(node))
        conns.append(c)
    # every request is written before any answer is read: one pass of the loop reads
    # many of them, and their decisions go to Redis together
    for i, c in enumerate(conns):
        c.sendall((f"request=smtpd_access_policy\nprotocol_state=RCPT\n"
                   f"client_address=192.0.2.{i % 200 + 1}\nclient_port={41000 + i}\n"
                   f"sender=s{i % 7}@example.org\nrecipient=r{i}@example.net\n"
                   f"instance=b.{i}\n\n").encode())
    answers = []
    for c in conns:
        c.settimeout(10)
        data = b""
        while not data.endswith(b"\n\n"):
            chunk = c.recv(4096)
            assert chunk, "connection closed"
            data += chunk
        answers.append(data.decode().strip())
        c.close()
    assert answers == ["action=DUNNO"] * 60, answers
    no_fallbacks(node)
    calls = node.stats()["store"]["shared"]["calls"]
    assert calls < 60, f"{calls} script calls for 60 decisions: nothing was batched"
