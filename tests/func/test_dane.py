"""DANE for direct delivery (RFC 7672) and DNS TTLs, against a real validating resolver.

A zone example.test is signed for the test (ldns-signzone), served by NSD, and validated
by Unbound (peers/dnssec.py); the MX hosts of its domains all point to one STARTTLS next hop on
loopback (peers/smarthost.py, aiosmtpd) whose certificate the TLSA records match or not.  The
route delivers to the MX hosts on that next hop's port (route.port), so the TLSA names
are _PORT._tcp.HOST.  What is checked: a matching DANE-EE (3 1 1) or DANE-TA (2 0 0)
record delivers and says "DANE verified"; a record that does not match, and records
that do not validate (SERVFAIL), defer the recipient -- never a bounce -- with the reason
in `sluice lanes`, `sluice queue` and the log, and so does a server with TLSA records
that does not offer STARTTLS (never the mail in clear); no TLSA delivers with opportunistic TLS,
and dane-only defers it; a resolver that does not validate gives no DANE.  Then TTLs: an
MX answer is asked again once its TTL is over, not before, and a failed lookup is asked
again within seconds, not minutes.
"""

import hashlib
import json
import re
import smtplib
import threading
import time

import pytest

from conftest import SLUICE, free_port, require_binary, wait_until
from peers.dnssec import SignedDNS, available
from peers.smarthost import Smarthost, make_test_certs

pytestmark = pytest.mark.skipif(not available(), reason="needs nsd, unbound, ldnsutils")

ZONE = "example.test"
# an MX host of 245 characters: _PORT._tcp. before it is longer than a name can be
LONG = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 40])


def spki_sha256(cert_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()


def der_hex(cert_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return cert.public_bytes(serialization.Encoding.DER).hex()


def zone_records(port, certs, mx_ttl=60, plain_port=None):
    """The zone's records.  The certificate names mx, mxbad, mxnone, mxta and mxbogus,
    and mxw*: a partial wildcard, which DANE-TA does not accept for mxwild (RFC 7672
    3.2.3); not mxtaname (DANE-TA: deferred), mxeename (DANE-EE: no name check) nor mxzero.  The
    domain "two" has a first MX host whose TLSA records do not validate (mxbogus2, on an
    address of its own, as mx.c drops duplicate addresses) and a second that delivers;
    "zero" has MX, A and TLSA answers of TTL 0."""
    ee = spki_sha256(certs.cert)
    ta = der_hex(certs.ca_cert)
    wrong = hashlib.sha256(b"another key").hexdigest()
    recs = []
    for dom, host in (("ok", "mx"), ("bad", "mxbad"), ("none", "mxnone"), ("ta", "mxta"),
                      ("bogus", "mxbogus"), ("strict", "mxnone"), ("ttl", "mx"),
                      ("pkix", "mxpkix"), ("taname", "mxtaname"), ("eename", "mxeename"),
                      ("two", "mxbogus2"), ("wild", "mxwild")):
        recs.append(f"{dom} {mx_ttl if dom == 'ttl' else 60} IN MX 10 {host}")
    recs += ["two 60 IN MX 20 mx", "zero 0 IN MX 10 mxzero", "mxzero 0 IN A 127.0.0.1",
             f"long 60 IN MX 10 {LONG}", f"{LONG} 60 IN A 127.0.0.1",
             "mxbogus2 60 IN A 127.0.0.2", f"_{port}._tcp.mxzero 0 IN TLSA 3 1 1 {ee}"]
    for host in ("mx", "mxbad", "mxnone", "mxta", "mxbogus", "mxpkix", "mxtaname",
                 "mxeename", "mxwild"):
        recs.append(f"{host} 60 IN A 127.0.0.1")
    recs += [f"_{port}._tcp.mx 60 IN TLSA 3 1 1 {ee}",
             f"_{port}._tcp.mxbad 60 IN TLSA 3 1 1 {wrong}",
             f"_{port}._tcp.mxta 60 IN TLSA 2 0 0 {ta}",
             f"_{port}._tcp.mxtaname 60 IN TLSA 2 0 0 {ta}",
             f"_{port}._tcp.mxwild 60 IN TLSA 2 0 0 {ta}",
             f"_{port}._tcp.mxeename 60 IN TLSA 3 1 1 {ee}",
             f"_{port}._tcp.mxbogus 60 IN TLSA 3 1 1 {ee}",
             f"_{port}._tcp.mxbogus2 60 IN TLSA 3 1 1 {ee}",
             f"_{port}._tcp.mxpkix 60 IN TLSA 1 1 1 {ee}"]  # PKIX-EE: not for SMTP
    if plain_port:
        recs += ["plain 60 IN MX 10 mxplain", "mxplain 60 IN A 127.0.0.1",
                 f"_{plain_port}._tcp.mxplain 60 IN TLSA 3 1 1 {ee}"]
    return recs


class SlowHop(Smarthost):
    """A next hop whose end of DATA can be made to take `slow` seconds (in_data is set
    when it starts): a transaction under way for as long as a test needs."""
    slow = 0.0
    in_data = threading.Event()

    def _on_data(self, server, envelope):
        if self.slow:
            self.in_data.set()
            time.sleep(self.slow)  # holds the hop's loop: nothing else is answered
        return super()._on_data(server, envelope)


@pytest.fixture(scope="module")
def next_hop(func_tmp):
    """The STARTTLS server every MX host of the zone points to."""
    d = func_tmp / "dane"
    certs = make_test_certs(d / "certs", hostnames=tuple(
        f"{h}.{ZONE}" for h in ("mx", "mxbad", "mxnone", "mxta", "mxbogus", "mxw*")), ips=())
    sh = SlowHop(tls_cert=certs.cert, tls_key=certs.key).start()
    plain = Smarthost().start()  # no STARTTLS
    yield sh, certs, d, plain
    plain.stop()
    sh.stop()


@pytest.fixture(scope="module")
def dns(next_hop):
    sh, certs, d, plain = next_hop
    with SignedDNS(d, ZONE, zone_records(sh.port, certs, plain_port=plain.port),
                   bogus=[f"_{sh.port}._tcp.mxbogus", f"_{sh.port}._tcp.mxbogus2"]) as z:
        yield z


def config(intake, dns_servers, hop_port, extra_relay="", plain_port=1, extra_routes=""):
    return f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "@DIR@";
log {{ target = "stderr"; level = "debug"; }}
control {{ listen = "unix:@DIR@/control.sock"; }}
intake {{ listen = "inet:127.0.0.1:{intake}"; hostname = "relay.sluice.test"; }}
queue {{ dir = "@DIR@/queue"; }}
relay {{
  retry {{ min = 30s; max = 1m; }}
  suspend {{ min = 1s; max = 2s; }}
  dns_servers = "{dns_servers}";
  {extra_relay}
}}
{extra_routes}
route "plain" {{ domains = ["plain.{ZONE}"]; mx = true; port = {plain_port}; tls = "dane"; }}
route "strict" {{ domains = ["strict.{ZONE}"]; mx = true; port = {hop_port}; tls = "dane-only"; }}
route "direct" {{ domains = ["*.{ZONE}"]; mx = true; port = {hop_port}; tls = "dane"; }}
"""


def send(port, rcpts, sender="list@example.org"):
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        msg = (f"From: <{sender}>\r\nTo: <list@example.org>\r\nSubject: dane\r\n"
               f"Message-ID: <{time.time()}@example.org>\r\n\r\nHello.\r\n")
        assert not s.sendmail(sender, rcpts, msg)


def got(sh, rcpt):
    return [m for m in sh.accepted() if rcpt in m.rcpts]


def lane(sd, name):
    for entry in json.loads(sd.cli("lanes", "--json").stdout):
        if entry["lane"] == name:
            return entry
    return None


@pytest.fixture
def relay(sluiced, next_hop, dns):
    require_binary(SLUICE, "SLUICE")
    sh = next_hop[0]

    def factory(dns_port=None, extra_relay="", servers=None, extra_routes=""):
        port = free_port()
        sd = sluiced(config(port, servers or f"127.0.0.1:{dns_port or dns.port}", sh.port,
                            extra_relay, plain_port=next_hop[3].port,
                            extra_routes=extra_routes))
        return sd, port

    return factory


def test_matching_tlsa_delivers_verified(relay, next_hop):
    """DANE-EE 3 1 1 of the next hop's key, and DANE-TA 2 0 0 of its CA: delivered over
    TLS, and the log and `sluice lanes` say how the server was authenticated.  DANE-EE
    checks no name: a host the certificate does not name is delivered to.  A first MX host
    whose TLSA lookup fails (SERVFAIL) is skipped for the second (RFC 7672 2.2)."""
    sh = next_hop[0]
    sd, port = relay()
    send(port, [f"a@ok.{ZONE}", f"b@ta.{ZONE}", f"x@eename.{ZONE}", f"y@two.{ZONE}"])
    wait_until(lambda: got(sh, f"a@ok.{ZONE}") and got(sh, f"b@ta.{ZONE}"), 20,
               "delivery to both domains")
    wait_until(lambda: got(sh, f"x@eename.{ZONE}") and got(sh, f"y@two.{ZONE}"), 20,
               "delivery to eename and two")
    sd.log.wait_for(r"lane=direct:eename\.example\.test mta=mxeename\.example\.test\S* DANE "
                    r"verified: TLSA DANE-EE 3 1 1")
    sd.log.wait_for(r"lane=direct:two\.example\.test mta=mxbogus2\.example\.test DANE: the TLSA "
                    r"lookup of _\d+\._tcp\.mxbogus2\.example\.test failed.*: the next MX host")
    sd.log.wait_for(r"lane=direct:two\.example\.test mta=mx\.example\.test\S* DANE verified")
    assert lane(sd, f"direct:two.{ZONE}")["deferred"] == 0
    assert all(m.tls for m in got(sh, f"a@ok.{ZONE}") + got(sh, f"b@ta.{ZONE}"))
    sd.log.wait_for(r"lane=direct:ok\.example\.test mta=mx\.example\.test\S* DANE verified: "
                    r"TLSA DANE-EE 3 1 1")
    sd.log.wait_for(r"lane=direct:ta\.example\.test mta=mxta\.example\.test\S* DANE verified: "
                    r"TLSA DANE-TA 2 0 0")
    assert "DANE verified: TLSA DANE-EE 3 1 1" in lane(sd, f"direct:ok.{ZONE}")["dane"]
    text = sd.cli("lanes").stdout
    assert re.search(r"dane +mx\.example\.test\S* DANE verified", text), text


def test_mismatch_and_bogus_defer_never_bounce(relay, next_hop):
    """A TLSA record the certificate does not match, and records whose signatures do not
    validate (Unbound: SERVFAIL): nothing is sent, the recipients are deferred with the
    reason (lanes, queue, log), nothing fails and no bounce is queued."""
    sh = next_hop[0]
    sd, port = relay()
    send(port, [f"c@bad.{ZONE}", f"d@bogus.{ZONE}", f"t@taname.{ZONE}", f"s@wild.{ZONE}"])
    # DANE-TA checks the MX host's name: the certificate does not hold mxtaname, and
    # holds mxwild only through a partial wildcard (mxw*)
    for user, dom in (("t", "taname"), ("s", "wild")):
        sd.log.wait_for(rf"rcpt=<{user}@{dom}\.example\.test> lane=direct:{dom}\.example\.test "
                        r".*status=deferred dsn=4\.7\.5 reply=\"the server's certificate does not "
                        r"name the MX host \(DANE-TA\)", timeout=20)
    sd.log.wait_for(r"rcpt=<c@bad\.example\.test> lane=direct:bad\.example\.test .*"
                    r"status=deferred dsn=4\.7\.5 reply=\"the server's certificate matches no "
                    r"TLSA record", timeout=20)
    sd.log.wait_for(r"rcpt=<d@bogus\.example\.test> lane=direct:bogus\.example\.test .*"
                    r"status=deferred dsn=4\.7\.5 reply=\"the TLSA lookup of _\d+\._tcp\."
                    r"mxbogus\.example\.test failed", timeout=20)
    assert not got(sh, f"c@bad.{ZONE}") and not got(sh, f"d@bogus.{ZONE}")
    assert not got(sh, f"t@taname.{ZONE}") and not got(sh, f"s@wild.{ZONE}")
    bad, bogus = lane(sd, f"direct:bad.{ZONE}"), lane(sd, f"direct:bogus.{ZONE}")
    assert "DEFERRED" in bad["dane"] and "matches no TLSA record" in bad["dane"], bad
    assert bad["failed"] == 0 and bad["deferred"] >= 1, bad
    assert "DEFERRED" in bogus["dane"] and "SERVFAIL" in bogus["dane"], bogus
    assert bogus["failed"] == 0 and bogus["deferred"] >= 1, bogus
    listing = sd.cli("queue").stdout
    assert "matches no TLSA record" in listing and "TLSA lookup" in listing, listing
    msgs = [json.loads(l) for l in sd.cli("queue", "--json").stdout.splitlines()]
    assert len(msgs) == 1, msgs  # no bounce was queued
    assert "bounced" not in sd.log.text()


def test_tlsa_without_starttls_defers(relay, next_hop):
    """TLSA records make TLS mandatory: a server that does not offer STARTTLS gets
    nothing, not the mail in clear, and the recipient is deferred."""
    plain = next_hop[3]
    sd, port = relay()
    send(port, [f"n@plain.{ZONE}"])
    sd.log.wait_for(r"rcpt=<n@plain\.example\.test> lane=plain:plain\.example\.test .*"
                    r"status=deferred dsn=4\.7\.5 reply=\"the TLS its TLSA records require "
                    r"failed: .*STARTTLS is not offered", timeout=20)
    assert not [m for m in plain.accepted() if f"n@plain.{ZONE}" in m.rcpts]
    assert lane(sd, f"plain:plain.{ZONE}")["failed"] == 0


def test_no_tlsa_is_opportunistic_and_dane_only_defers(relay, next_hop):
    """A host without TLSA records: delivered with opportunistic TLS under dane; under
    dane-only nothing is sent and the recipient is deferred.  A host with only unusable
    records (PKIX-EE): TLS without verification (RFC 7672 2.2: not in clear).  An MX
    host whose TLSA name would be too long has none: opportunistic TLS, not a deferral."""
    sh = next_hop[0]
    sd, port = relay()
    send(port, [f"e@none.{ZONE}", f"f@strict.{ZONE}", f"o@pkix.{ZONE}", f"w@long.{ZONE}"])
    wait_until(lambda: got(sh, f"w@long.{ZONE}"), 20, "delivery to long.example.test")
    sd.log.wait_for(r"lane=direct:long\.example\.test mta=a{63}\S* no DANE: TLS not verified "
                    r"\(a{63}\S*: no DANE, no TLSA records can exist for")
    wait_until(lambda: got(sh, f"o@pkix.{ZONE}"), 20, "delivery to pkix.example.test")
    assert got(sh, f"o@pkix.{ZONE}")[0].tls
    sd.log.wait_for(r"lane=direct:pkix\.example\.test mta=mxpkix\S* no DANE: TLS not verified "
                    r"\(mxpkix\.example\.test: TLSA records of mxpkix\.example\.test, none usable")
    wait_until(lambda: got(sh, f"e@none.{ZONE}"), 20, "delivery to none.example.test")
    assert got(sh, f"e@none.{ZONE}")[0].tls
    sd.log.wait_for(r"lane=direct:none\.example\.test mta=mxnone\S* no DANE: TLS not verified "
                    r"\(mxnone\.example\.test: no DANE, no TLSA records")
    sd.log.wait_for(r"rcpt=<f@strict\.example\.test> lane=strict:strict\.example\.test .*"
                    r"status=deferred dsn=4\.7\.5 reply=\"no TLSA records for .*dane-only",
                    timeout=20)
    assert not got(sh, f"f@strict.{ZONE}")
    assert "dane-only" in lane(sd, f"strict:strict.{ZONE}")["dane"]


def test_resolver_that_does_not_validate_gives_no_dane(relay, next_hop):
    """The same zone through an Unbound without its validator: no AD bit, so no DANE --
    even the record that would not match is not used -- and dane-only defers."""
    sh, certs, d, _ = next_hop
    with SignedDNS(d, ZONE, zone_records(sh.port, certs), validate=False) as plain:
        sd, port = relay(dns_port=plain.port)
        send(port, [f"g@bad.{ZONE}", f"h@strict.{ZONE}"])
        wait_until(lambda: got(sh, f"g@bad.{ZONE}"), 20, "delivery to bad.example.test")
        sd.log.wait_for(r"lane=direct:bad\.example\.test mta=mxbad\S* no DANE: TLS not verified "
                        r"\(mxbad\.example\.test: no DANE, the MX records of bad\.example\.test "
                        r"are not DNSSEC-validated")
        sd.log.wait_for(r"rcpt=<h@strict\.example\.test> .*status=deferred dsn=4\.7\.5 "
                        r"reply=\"the MX records of strict\.example\.test are not "
                        r"DNSSEC-validated", timeout=20)
        assert not got(sh, f"h@strict.{ZONE}")


def mx_queries(z, name, rtype="MX"):
    log = (z.dir / "unbound.log").read_text()
    return len(re.findall(rf"{re.escape(name)}\. {rtype} IN", log))


def test_mx_answer_is_used_for_its_ttl(relay, next_hop, func_tmp):
    """An MX answer of TTL 2s is asked again for a message sent after it expired; one of
    TTL 60s is not (dns_min_ttl = 0).  Answers of TTL 0 (MX, A, TLSA) serve the attempt
    that asked for them, and are asked again for the next.  A TLSA answer is the relay's,
    not a lane's: ttl and ok share the MX host mx, whose records are asked once."""
    sh, certs, d, _ = next_hop
    with SignedDNS(func_tmp / "ttl", ZONE, zone_records(sh.port, certs, mx_ttl=2),
                   log_queries=True) as z:
        # no idle connection is reused: each message needs a new one, and a lookup
        sd, port = relay(dns_port=z.port, extra_relay="dns_min_ttl = 0; idle_timeout = 200ms;")
        send(port, [f"i@ttl.{ZONE}", f"j@ok.{ZONE}", f"z@zero.{ZONE}"])
        wait_until(lambda: got(sh, f"i@ttl.{ZONE}") and got(sh, f"j@ok.{ZONE}"), 20,
                   "the first delivery")
        # answers of TTL 0 serve the attempt that asked for them: delivered, no livelock
        wait_until(lambda: got(sh, f"z@zero.{ZONE}"), 20, "delivery to zero.example.test")
        sd.log.wait_for(r"lane=direct:zero\.example\.test mta=mxzero\S* DANE verified")
        first_ttl, first_ok = mx_queries(z, f"ttl.{ZONE}"), mx_queries(z, f"ok.{ZONE}")
        assert first_ttl >= 1 and first_ok >= 1
        time.sleep(3.5)  # past the 2s TTL (Unbound's cache too), well within 60s
        first_zero = mx_queries(z, f"_{sh.port}._tcp.mxzero.{ZONE}", "TLSA")
        assert first_zero >= 1
        send(port, [f"k@ttl.{ZONE}", f"l@ok.{ZONE}", f"z2@zero.{ZONE}"])
        wait_until(lambda: got(sh, f"k@ttl.{ZONE}") and got(sh, f"l@ok.{ZONE}") and
                   got(sh, f"z2@zero.{ZONE}"), 20, "the second delivery")
        assert mx_queries(z, f"ttl.{ZONE}") > first_ttl
        assert mx_queries(z, f"ok.{ZONE}") == first_ok
        assert mx_queries(z, f"_{sh.port}._tcp.mxzero.{ZONE}", "TLSA") > first_zero
        assert mx_queries(z, f"_{sh.port}._tcp.mx.{ZONE}", "TLSA") == 1


def test_failed_lookup_is_retried_soon(relay, next_hop, func_tmp):
    """An MX RRset that does not validate (SERVFAIL) suspends the lane for
    dns_retry_min (1s), doubling; once the zone is fixed the mail leaves within seconds."""
    sh, certs, d, _ = next_hop
    recs = zone_records(sh.port, certs)
    with SignedDNS(func_tmp / "retry", ZONE, recs, bogus=["ttl"], log_queries=True) as z:
        sd, port = relay(dns_port=z.port,
                         extra_relay="dns_retry_min = 1s; dns_retry_max = 2s;")
        send(port, [f"m@ttl.{ZONE}"])
        sd.log.wait_for(r"lane=direct:ttl\.example\.test suspended for 1s: \"cannot look up "
                        r"ttl\.example\.test: temporary DNS failure", timeout=20)
        sd.log.wait_for(r"lane=direct:ttl\.example\.test suspended for 2s", timeout=20)
        assert not got(sh, f"m@ttl.{ZONE}")
        z.update(recs)
        t0 = time.time()
        wait_until(lambda: got(sh, f"m@ttl.{ZONE}"), 20, "delivery once the zone validates")
        assert time.time() - t0 < 10
        assert lane(sd, f"direct:ttl.{ZONE}")["failed"] == 0


def test_second_resolver_cannot_undo_a_servfail(relay, next_hop, dns, func_tmp):
    """dns_servers lists the validating resolver, then one that does not validate: the
    first's SERVFAIL for records that do not validate is its verdict; the second is not
    asked, so no unsigned answer turns it into opportunistic TLS.  Deferred."""
    sh, certs, d, _ = next_hop
    with SignedDNS(func_tmp / "second", ZONE, zone_records(sh.port, certs), validate=False,
                   bogus=[f"_{sh.port}._tcp.mxbogus"]) as nv:
        sd, port = relay(servers=f"127.0.0.1:{dns.port},127.0.0.1:{nv.port}")
        send(port, [f"p@bogus.{ZONE}"])
        sd.log.wait_for(r"rcpt=<p@bogus\.example\.test> .*status=deferred dsn=4\.7\.5 "
                        r"reply=\"the TLSA lookup of _\d+\._tcp\.mxbogus\.example\.test failed",
                        timeout=20)
        assert not got(sh, f"p@bogus.{ZONE}")


def test_reload_to_dane_does_not_reuse_a_connection(relay, next_hop):
    """A connection made under tls = "may" is busy when a reload makes the route "dane":
    it is not used again after its transaction; the next message gets a new connection,
    whose DANE check (a TLSA record that does not match) defers it."""
    sh = next_hop[0]
    route = (f'route "reload" {{ domains = ["bad.{ZONE}"]; mx = true; port = {sh.port}; '
             f'tls = "may"; connections = 1; }}')
    sd, port = relay(extra_routes=route)
    sh.in_data.clear()
    sh.slow = 2.0
    try:
        send(port, [f"u@bad.{ZONE}"])
        assert sh.in_data.wait(20), "the first transaction did not start"
        sd.write_config(sd.config_text.replace('tls = "may"; connections = 1;',
                                               'tls = "dane"; connections = 1;'))
        sd.cli("reload")
        sd.log.wait_for(r"configuration applied", timeout=10)
        send(port, [f"v@bad.{ZONE}"])
    finally:
        sh.slow = 0.0
    wait_until(lambda: got(sh, f"u@bad.{ZONE}"), 20, "the first delivery")
    sd.log.wait_for(r"rcpt=<v@bad\.example\.test> lane=reload:bad\.example\.test .*"
                    r"status=deferred dsn=4\.7\.5 reply=\"the server's certificate matches no "
                    r"TLSA record", timeout=20)
    assert not got(sh, f"v@bad.{ZONE}")
