"""Provider lanes and signal thresholds, with real peers.

Direct delivery (mx = true) resolves MX records through a DNS server run here
(python3-dnslib, on a free loopback port, given to the relay as relay.dns_servers); the
MX hosts are test smarthosts listening on port 25 of their own loopback addresses
(127.19.3.x).  Three domains whose MX hosts are one provider's names share the
provider's one budget, measured from the next hop's arrival times; a domain outside the
provider keeps its own lane and budget.  A signal with after = 3 suspends its lane on
the third matching reply, and not before; below it a 5xx it matches bounces nobody, and
a transaction counts once.  A provider's window outlives a restart; a domain that moves
away takes its queued mail; a reload during a transaction leaves nothing unscheduled.
"""
import re
import threading
import time

import pytest

from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_relay import lanes, send

dnslib = pytest.importorskip("dnslib", reason="python3-dnslib (Debian) is needed")
from dnslib import A, MX, QTYPE, RCODE, RR  # noqa: E402
from dnslib.server import BaseResolver, DNSServer  # noqa: E402

PROVIDER_IP = "127.19.3.1"
OTHER_IP = "127.19.3.2"

# The test's zone: MX records (preference, host) and A records.
ZONE_MX = {
    "a.example": [(10, "mx1.mx.bigmail.test")],
    "b.example": [(10, "mx2.mx.bigmail.test")],
    "c.example": [(10, "mx1.mx.bigmail.test"), (20, "mx2.mx.bigmail.test")],
    "other.example": [(10, "mx.other.test")],
    "a2.example": [(10, "mx1.mx.bigmail.test")],
}
ZONE_A = {
    "mx1.mx.bigmail.test": PROVIDER_IP,
    "mx2.mx.bigmail.test": PROVIDER_IP,
    "mx.other.test": OTHER_IP,
}


class _Zone(BaseResolver):
    def __init__(self):
        self.queries = []
        self.lock = threading.Lock()

    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        with self.lock:
            self.queries.append((name, qtype))
        if qtype == "MX" and name in ZONE_MX:
            for pref, host in ZONE_MX[name]:
                reply.add_answer(RR(name + ".", QTYPE.MX, rdata=MX(host + ".", pref), ttl=300))
        elif qtype == "A" and name in ZONE_A:
            reply.add_answer(RR(name + ".", QTYPE.A, rdata=A(ZONE_A[name]), ttl=300))
        elif name not in ZONE_MX and name not in ZONE_A:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


@pytest.fixture
def dns():
    zone = _Zone()
    port = free_port()
    server = DNSServer(zone, port=port, address="127.0.0.1", tcp=False)
    server.start_thread()
    yield port, zone
    server.stop()


@pytest.fixture
def direct(sluiced, smarthost, dns):
    """Factory: direct(routes) -> (sluiced, intake port, the provider's MX host, the other
    domain's MX host, the DNS zone): routes and providers over the test's DNS."""
    require_binary(SLUICE, "SLUICE")

    def factory(routes, relay_extra="", **big_opts):
        dns_port, zone = dns
        big = smarthost(host=PROVIDER_IP, port=25, **big_opts)
        other = smarthost(host=OTHER_IP, port=25)
        port = free_port()
        return (sluiced(provider_config(port, dns_port, extra=routes, relay_extra=relay_extra)),
                port, big, other, zone)

    return factory


def provider_config(intake_port, dns_port, extra="", retry="1s", relay_extra=""):
    return f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "@DIR@";
log {{ target = "stderr"; level = "info"; }}
control {{ listen = "unix:@DIR@/control.sock"; }}
intake {{ listen = "inet:127.0.0.1:{intake_port}"; hostname = "relay.sluice.test"; }}
queue {{ dir = "@DIR@/queue"; }}
relay {{
  retry {{ min = {retry}; max = {retry}; }}
  suspend {{ min = 1s; max = 2s; }}
  dns_servers = "127.0.0.1:{dns_port}";
  {relay_extra}
}}
{extra}
"""


def test_provider_domains_share_one_exact_budget(direct):
    """9 messages to three domains behind the provider's MX names leave at the
    provider's 3/4s, counted together (each domain alone would have the route's 100/1s);
    a fourth domain, not the provider's, keeps its own lane and sends at once."""
    sd, port, big, other, zone = direct("""
route "d" {
  domains = ["*"];
  mx = true;
  tls = "none";
  lanes = "provider";
  rate = ["100/1s"];
  recipients_per_message = 1;
}
provider "bigmail" {
  mx = ["*.mx.bigmail.test"];
  rate = ["3/4s"];
  connections = 2;
}
""")
    rcpts = [f"u{i}@{d}" for d in ("a.example", "b.example", "c.example") for i in range(3)]
    t0 = time.time()
    for r in rcpts:
        send(port, [r])
    send(port, [f"o{i}@other.example" for i in range(3)], count=1)
    send(port, ["o3@other.example"])
    send(port, ["o4@other.example"])
    other.wait_accepted(3, timeout=15)
    t_other = time.time() - t0
    big.wait_accepted(9, timeout=30)
    got = sorted(r for m in big.accepted() for r in m.rcpts)
    assert got == sorted(rcpts)
    # one budget: never more than 3 in any 4 s, and no slower than the budget says
    assert big.windows_over(3, 4.0) == [], big.summary()
    times = sorted(m.t_mail for m in big.accepted())
    span = times[-1] - times[0]
    assert 8.0 <= span < 11.0, times
    # the other domain was not held back by the provider's budget
    assert t_other < 5.0, t_other
    out = {l["lane"]: l for l in lanes(sd)}
    p = out["d:provider:bigmail"]
    assert p["provider"] == "bigmail"
    assert sorted(p["domains"]) == ["a.example", "b.example", "c.example"]
    assert p["ndomains"] == 3 and p["delivered"] == 9 and p["max_connections"] == 2
    assert [w["configured"] for w in p["windows"]] == [3]
    assert out["d:other.example"]["delivered"] == 5
    assert out["d:a.example"]["forwards_to"] == "d:provider:bigmail"
    assert "provider" not in out["d:other.example"] or not out["d:other.example"]["provider"]
    # the domains' MX records were asked once each (the match is made per answer)
    mx_queries = [q for q in zone.queries if q[1] == "MX"]
    assert sorted(mx_queries) == sorted((d + ".example", "MX") for d in ("a", "b", "c", "other"))
    text = sd.cli("lanes").stdout
    assert re.search(r"carries +3 domain\(s\): [abc]\.example, [abc]\.example, [abc]\.example",
                     text), text


def restart_keeps(sd, big, lane, used):
    """Restart sd: the group lane keeps its `used` sends, one message still waits and
    the provider's host got no more."""
    sd.stop()
    sd.start()
    wait_until(lambda: lane in {l["lane"] for l in lanes(sd)}, 10,
               "the group lane after the restart")
    time.sleep(1.0)
    a = {l["lane"]: l for l in lanes(sd)}[lane]
    assert a["windows"][0]["used"] == used and a["waiting"] == 1, a
    assert len(big.accepted()) == used


def test_mx_lanes_group_by_mx_host_set(direct):
    """lanes = "mx": a.example and a2.example have the same MX host and share its lane
    and the route's budget (2/1h: the third message waits); other.example's MX set is
    another lane.  A reload and a restart keep the group's history."""
    sd, port, big, other, _ = direct("""
route "d" { domains = ["*"]; mx = true; tls = "none"; lanes = "mx"; rate = ["2/1h"]; }
""")
    for r in ("x@a.example", "y@a2.example", "z@a.example", "w@other.example"):
        send(port, [r])
    big.wait_accepted(2, timeout=15)
    other.wait_accepted(1, timeout=15)
    time.sleep(1.0)
    out = {l["lane"]: l for l in lanes(sd)}
    a = out["d:mx:mx1.mx.bigmail.test"]
    assert sorted(a["domains"]) == ["a.example", "a2.example"]
    assert a["sends"] == 2 and a["waiting"] == 1, a
    assert out["d:mx:mx.other.test"]["delivered"] == 1
    assert len(big.accepted()) == 2
    # a reload groups the domains again (each from a new answer, as its mail comes) and
    # the lane keeps its history: with 3/1h the waiting message is the third send, and
    # a fourth waits
    sd.write_config(sd.config_text.replace('rate = ["2/1h"]', 'rate = ["3/1h"]'))
    sd.cli("reload")
    big.wait_accepted(3, timeout=15)
    send(port, ["v@a.example"])
    time.sleep(1.5)
    assert len(big.accepted()) == 3
    a = {l["lane"]: l for l in lanes(sd)}["d:mx:mx1.mx.bigmail.test"]
    assert a["windows"][0]["used"] == 3 and a["waiting"] == 1, a
    # (which of a.example and a2.example had the waiting message depends on which
    # answer came first: only the domains with mail since the reload are in again)
    assert "a.example" in a["domains"] and set(a["domains"]) <= {"a.example", "a2.example"}
    # a restart keeps the group lane's sends (relay.lanes, under its name)
    restart_keeps(sd, big, "d:mx:mx1.mx.bigmail.test", 3)


def threshold_config(port, sh_port, match, retry):
    """A smarthost route with a suspend signal on match, after = 3 within = 1m."""
    return provider_config(port, 53, retry=retry, extra=f"""
route "isp" {{
  domains = ["*"];
  smarthost = "[127.0.0.1]:{sh_port}";
  tls = "none";
  signal {{ match = "{match}"; action = "suspend"; for = 1h; after = 3; within = 1m; }}
}}
""")


def test_threshold_signal_acts_on_the_nth_reply(sluiced, smarthost):
    """A signal with after = 3 within = 1m: the first two matching 451s are ordinary
    retries (the lane shows the count), the third suspends the lane; nothing bounces."""
    require_binary(SLUICE, "SLUICE")
    sh = smarthost(rcpt_tempfail_p=1.0)
    port = free_port()
    sd = sluiced(threshold_config(port, sh.port, r"^451 4\\.3\\.0 temporary local problem",
                                  "3s"))
    send(port, ["t@example.net"])

    def n451():
        return sh.rejections.get(451, 0)

    wait_until(lambda: n451() >= 2, 15, "two 451 replies")
    wait_until(lambda: lanes(sd)[0]["thresholds"] and
               lanes(sd)[0]["thresholds"][0]["count"] == 2, 2, "the count of 2")
    lane = lanes(sd)[0]
    assert n451() == 2 and not lane["suspended"], lane
    assert lane["thresholds"][0]["after"] == 3
    assert "threshold    2 of 3 within 1m" in sd.cli("lanes").stdout
    wait_until(lambda: lanes(sd)[0]["suspended"], 15, "the suspension")
    lane = lanes(sd)[0]
    assert n451() == 3 and "Temporary local problem" in lane["reason"], lane
    assert lane["thresholds"] == [] and lane["failed"] == 0
    time.sleep(3)
    assert n451() == 3
    assert "1 recipient" in sd.cli("queue").stdout or "t@example.net" in sd.cli("queue").stdout


def test_threshold_5xx_signal_defers_below_n_once_per_transaction(sluiced, smarthost):
    """A suspend signal on a 5xx with after = 3: below the third matching transaction the
    refused recipients are deferred, never bounced (law 5), and one transaction with three
    refused recipients counts once; the third transaction suspends the lane."""
    require_binary(SLUICE, "SLUICE")
    sh = smarthost(reject_rcpt_regex=r"^<?bad")
    port = free_port()
    sd = sluiced(threshold_config(port, sh.port, r"^550 5\\.1\\.1 .*user unknown", "2s"))
    send(port, ["bad1@example.net", "bad2@example.net", "bad3@example.net"])
    wait_until(lambda: sh.rejections.get(550, 0) >= 3, 15, "the first transaction")
    wait_until(lambda: lanes(sd)[0]["thresholds"], 2, "the count")
    lane = lanes(sd)[0]
    assert lane["thresholds"][0]["count"] == 1, lane
    assert lane["failed"] == 0 and not lane["suspended"], lane
    # a reload that keeps the signal keeps its count
    sd.cli("reload")
    time.sleep(0.3)
    lane = lanes(sd)[0]
    assert lane["thresholds"] and lane["thresholds"][0]["count"] == 1, lane
    wait_until(lambda: lanes(sd)[0]["suspended"], 15, "the suspension")
    lane = lanes(sd)[0]
    # (the retries may split the three into transactions of their own: two more at least)
    n550 = sh.rejections.get(550, 0)
    assert 5 <= n550 <= 9, sh.rejections
    assert lane["failed"] == 0 and "User unknown" in lane["reason"], lane
    time.sleep(2.5)
    assert sh.rejections.get(550, 0) == n550
    # nobody was bounced: no notice went out, the three still wait
    assert sh.accepted() == []
    q = sd.cli("queue").stdout
    assert all(f"bad{i}@example.net" in q for i in (1, 2, 3)), q


def test_provider_budget_survives_a_restart(direct):
    """A provider's window longer than any of its route's (the route has none): a restart
    keeps the provider lane's sends, and the third message still waits."""
    sd, port, big, other, _ = direct("""
route "d" { domains = ["*"]; mx = true; tls = "none"; lanes = "provider"; }
provider "bigmail" { mx = ["*.mx.bigmail.test"]; rate = ["2/1h"]; }
""")
    for r in ("x@a.example", "y@b.example", "z@c.example"):
        send(port, [r])
    big.wait_accepted(2, timeout=15)
    wait_until(lambda: {l["lane"]: l for l in lanes(sd)}.get("d:provider:bigmail", {})
               .get("waiting") == 1, 10, "the third message waiting")
    restart_keeps(sd, big, "d:provider:bigmail", 2)


def test_a_domain_leaving_the_provider_takes_its_queued_mail(direct):
    """b.example's mail waits in the provider's lane (the provider refuses MAIL); then
    b.example's MX moves to another host: when the group's answer (b.example's, 1 s)
    is found gone, the domain is looked up again and its queued mail goes to the new
    host, instead of waiting in a group with no answer."""
    sd, port, big, other, _ = direct("""
route "d" { domains = ["*"]; mx = true; tls = "none"; lanes = "provider"; }
provider "bigmail" { mx = ["*.mx.bigmail.test"]; }
""", relay_extra="dns_min_ttl = 0s; dns_max_ttl = 1s;")
    big.suspend()
    saved = ZONE_MX["b.example"]
    try:
        send(port, ["x@b.example"])
        wait_until(lambda: {l["lane"]: l for l in lanes(sd)}.get("d:provider:bigmail", {})
                   .get("suspended"), 10, "the provider lane suspended")
        ZONE_MX["b.example"] = [(10, "mx.other.test")]
        other.wait_accepted(1, timeout=15)
    finally:
        ZONE_MX["b.example"] = saved
    assert [r for m in other.accepted() for r in m.rcpts] == ["x@b.example"]
    assert big.accepted() == []
    out = {l["lane"]: l for l in lanes(sd)}
    assert out["d:b.example"]["delivered"] == 1, out


def test_one_message_to_several_domains_of_a_provider(direct):
    """One message to three of the provider's domains and another: each domain's
    recipients move into the provider's item as its answer comes (the message's other
    lanes stay), and every recipient is delivered once."""
    sd, port, big, other, _ = direct("""
route "d" { domains = ["*"]; mx = true; tls = "none"; lanes = "provider"; }
provider "bigmail" { mx = ["*.mx.bigmail.test"]; }
""")
    send(port, ["x@a.example", "y@other.example", "z@b.example", "w@c.example",
                "v@a.example"])
    other.wait_accepted(1, timeout=15)
    wait_until(lambda: sum(len(m.rcpts) for m in big.accepted()) >= 4, 15, "4 recipients")
    time.sleep(0.5)
    got = sorted(r for m in big.accepted() for r in m.rcpts)
    assert got == ["v@a.example", "w@c.example", "x@a.example", "z@b.example"], got
    out = {l["lane"]: l for l in lanes(sd)}
    p = out["d:provider:bigmail"]
    assert p["delivered"] == 4 and p["waiting"] == 0 and p["ndomains"] == 3, p
    assert sd.cli("queue").stdout.strip() in ("", "the queue is empty", "0 messages"), \
        sd.cli("queue").stdout


def test_reload_moves_a_recipient_in_flight_out_of_the_group(direct):
    """A transaction in the provider's lane waits for its final reply when a reload
    drops provider lanes: the recipient is routed to its domain's lane meanwhile, and
    when the transaction ends (the reply never comes: uncertain) it is sent again from
    there, not left unscheduled."""
    sd, port, big, other, _ = direct("""
route "d" { domains = ["*"]; mx = true; tls = "none"; lanes = "provider"; data_timeout = 3s; }
provider "bigmail" { mx = ["*.mx.bigmail.test"]; }
""", drop_after_dot_first=1, drop_how="hang")
    send(port, ["x@a.example"])
    wait_until(lambda: len(big.dropped()) == 1, 10, "the transaction in flight")
    sd.write_config(sd.config_text.replace('lanes = "provider"; ', "").replace(
        'provider "bigmail" { mx = ["*.mx.bigmail.test"]; }', ""))
    sd.cli("reload")
    big.wait_accepted(1, timeout=15)
    out = {l["lane"]: l for l in lanes(sd)}
    assert out["d:a.example"]["delivered"] == 1, out
