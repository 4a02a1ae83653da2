"""Relay nodes that share budgets through a real redis-server: two sluiced nodes with one
shared lane, whose rate holds across both and which stops while Redis is down, and a host
class whose sessions count the outgoing sessions of every node.

The smarthost (peers/smarthost.py) is the judge of the rate: it records the time of every
MAIL FROM it accepts, and windows_over(N, W) lists any window of W seconds that held more
than N of them.  Each test starts its own smarthost, sluiced nodes and redis-server, in the
test's private directory.
"""

import os
import threading
import time

import pytest

from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_redis import REDIS_SERVER, Redis
from test_relay import delivered_rcpts, lanes, relay_config, send

FROM = "list@example.org"


def utilization(times, n, window):
    """As test_relay.py's throttled test: (sends / (busy + W)) / (N / W)."""
    times = sorted(times)
    busy = times[-1] - times[0]
    return (len(times) / (busy + window)) / (n / window), busy


@pytest.fixture
def redis_tcp(workdir):
    """A redis-server on a loopback port of the test's own (stopped at teardown)."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed")
    servers = []

    def factory():
        d = workdir / f"redis{len(servers)}"
        d.mkdir()
        r = Redis(d, port=free_port())
        servers.append(r)
        r.start()
        return r

    yield factory
    for r in servers:
        r.stop()


SHARED_ROUTE = 'tls = "none";\nrate = ["5/2s"];\nshared = true;\nrecipients_per_message = 1;\n' \
               'connections = 2;'


def shared_node(sluiced, r, sh, node):
    port = free_port()
    store = (f'store {{ type = "redis"; server = "127.0.0.1:{r.port}"; node = "{node}"; '
             f'nodes = 2; }}')
    sd = sluiced(relay_config(port, sh.port, route=SHARED_ROUTE, extra=store))
    return sd, port


def send_each(port, rcpts, subject):
    """One message per recipient (one SMTP session)."""
    for rcpt in rcpts:
        send(port, [rcpt], sender=FROM, subject=subject)


def test_two_nodes_share_one_lane_budget_through_redis(sluiced, smarthost, redis_tcp):
    """Two nodes, each with the same shared lane "isp" (5/2s, budget in Redis), get 15
    one-recipient messages each at the same moment: the smarthost sees all 30, never more
    than 5 in any 2 s window, and both nodes sent; the budget is the lane's sorted set
    in Redis."""
    require_binary(SLUICE, "SLUICE")
    r = redis_tcp()
    sh = smarthost(rate="5/2", mode="none")
    a, pa = shared_node(sluiced, r, sh, "node-a")
    b, pb = shared_node(sluiced, r, sh, "node-b")
    ra = [f"a{i:02d}@example.net" for i in range(15)]
    rb = [f"b{i:02d}@example.net" for i in range(15)]
    threads = [threading.Thread(target=send_each, args=(pa, ra, "from a")),
               threading.Thread(target=send_each, args=(pb, rb, "from b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        sh.wait_accepted(30, timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- node a ---\n{a.log.tail()}\n--- node b ---\n"
                             f"{b.log.tail()}") from None
    time.sleep(0.5)
    assert sorted(delivered_rcpts(sh)) == sorted(ra + rb)
    assert sh.overs() == [], sh.overs()
    assert sh.windows_over(5, 2.0) == [], sorted(sh.attempts())
    assert sh.max_in_window(2.0) == 5
    times = sorted(sh.attempts())
    util, busy = utilization(times, 5, 2.0)
    print(f"\nshared lane 5/2s, 2 nodes: 30 sends in {busy:.2f}s, utilization {util:.3f}")
    # 30 sends at 5 per (2 s + guard) need at least 5 full windows
    assert busy >= 5 * 2.0, times
    # both nodes delivered their own queue, counted in the shared lane
    for node, n in ((a, 15), (b, 15)):
        wait_until(lambda: "the queue is empty" in node.cli("queue").stdout, 10,
                   "the queue to empty")
        lane = lanes(node)[0]
        assert lane["delivered"] == n and lane["failed"] == 0, lane
    keys = r.keys("sluice:lane:*")
    assert keys, r.keys()


def test_outgoing_sessions_count_in_their_host_class_on_every_node(sluiced, smarthost,
                                                                   redis_tcp):
    """A host class's `sessions` counts the incoming and outgoing sessions of every node
    sharing a Redis store: while node A holds an incoming session from 127.0.0.1 (the
    class's one session), node B's relay does not open one to the smarthost on 127.0.0.1;
    once A's session ends, B delivers."""
    from peers import milter_wire as mw
    from test_policy import config
    require_binary(SLUICE, "SLUICE")
    r = redis_tcp()
    sh = smarthost(rate="100/1", mode="none")
    cls = ('class "loopback" { hosts = ["127.0.0.0/8"]; sessions = 1; inbound = 1; }\n'
           'class "default" { hosts = ["*"]; sessions = 100; inbound = 100; }')
    store = f'store {{ type = "redis"; server = "127.0.0.1:{r.port}"; nodes = 2; }}'
    a = sluiced(config(cls, store))
    port = free_port()
    b = sluiced(relay_config(port, sh.port, route='tls = "none";', extra=cls + "\n" + store))
    held = mw.MilterClient(a.milter_socket)
    held.negotiate()
    code, _ = held.connect(address="127.0.0.1")
    assert code == mw.CONTINUE, code
    send(port, ["x@example.net"], sender=FROM, subject="waits for the class")
    b.log.wait_for(r"queued qid=", timeout=10)
    time.sleep(3)  # the relay asks again every second
    assert delivered_rcpts(sh) == [], "B opened a session while A held the class's one"
    held.close()
    sh.wait_accepted(1, timeout=15)
    assert delivered_rcpts(sh) == ["x@example.net"]


def test_shared_lane_stops_while_redis_is_down(sluiced, smarthost, redis_tcp):
    """The shared budget cannot be asked (redis-server stopped): the lane sends nothing
    and is suspended with a reason naming the shared budget, no recipient fails; once
    redis-server is back the lane resumes and everything is delivered, still within
    5/2s."""
    require_binary(SLUICE, "SLUICE")
    r = redis_tcp()
    sh = smarthost(rate="5/2", mode="none")
    a, pa = shared_node(sluiced, r, sh, "node-a")
    b, pb = shared_node(sluiced, r, sh, "node-b")
    # it works: one message through each node
    send(pa, ["first-a@example.net"])
    send(pb, ["first-b@example.net"])
    sh.wait_accepted(2, timeout=20)

    r.stop()
    mark_a, mark_b = a.log.mark(), b.log.mark()
    ra = [f"down-a{i}@example.net" for i in range(4)]
    rb = [f"down-b{i}@example.net" for i in range(4)]
    send_each(pa, ra, "while down")
    send_each(pb, rb, "while down")
    for node, mark in ((a, mark_a), (b, mark_b)):
        node.log.wait_for(r"lane=isp suspended for \d+s: \"the shared budget cannot be "
                          r"(reached|asked)", timeout=15, after=mark)
        lane = lanes(node)[0]
        assert lane["suspended"] is True and "shared budget" in lane["reason"], lane
        assert lane["failed"] == 0, lane
    time.sleep(2)
    assert len(sh.attempts()) == 2 and len(sh.accepted()) == 2, \
        f"the lane sent without its shared budget: {[m.rcpts for m in sh.accepted()]}"
    for node in (a, b):
        assert node.stats()["relay"]["failed"] == 0

    t_back = time.time()
    r.start()
    try:
        wait_until(lambda: sorted(delivered_rcpts(sh)) ==
                   sorted(["first-a@example.net", "first-b@example.net"] + ra + rb),
                   45, "all delivered after redis-server came back")
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- node a ---\n{a.log.tail()}\n--- node b ---\n"
                             f"{b.log.tail()}") from None
    resumed = min(m.t_mail for m in sh.accepted()[2:])
    print(f"\nredis-server back; the first send followed {resumed - t_back:.2f}s later")
    assert resumed >= t_back
    assert sh.overs() == [] and sh.windows_over(5, 2.0) == [], sorted(sh.attempts())
    for node in (a, b):
        assert node.stats()["relay"]["failed"] == 0
        wait_until(lambda: "the queue is empty" in node.cli("queue").stdout, 10,
                   "the queue to empty")
    assert all(m.sender for m in sh.accepted()), "a DSN was sent"
