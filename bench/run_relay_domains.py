#!/usr/bin/python3
"""Relay routing over many domains: one list post to N domains through an mx = true route.

usage: bench/run_relay_domains.py BUILD [BUILD_OLD]

With `route { mx = true; }` the relay keeps one lane per recipient domain, so a post to
recipients in N domains makes N lanes, and every recipient routed looks its lane up by
name.  Law 8 (doc/ARCHITECTURE.md) says that lookup must not cost more as lanes grow.
This measures the routing and delivery of such a post, and, given two builds, compares
them (BUILD is "new", BUILD_OLD "old"; the ratios are new / old).

What runs (shared by every run): a DNS server (python3-dnslib, UDP on a free loopback
port) that answers MX for any name under dom.bench.test with mx.bench.test, and A for
that host with 127.0.0.1; one smtp-sink (Postfix's) on 127.0.0.1 taking all the mail.
For each size N in BENCH_DOMAINS (default "2000,20000"), for each round (BENCH_ROUNDS,
default 2), for each build (alternating which goes first), a fresh sluiced with its own
state directory:

  1. started with an intake (max_recipients = N) and a route that matches no test
     domain (domains = ["held.invalid"]): the post's recipients are queued but routed
     nowhere, so nothing is looked up or delivered yet;
  2. the post is injected: one message, BENCH_PER_MESSAGE recipients per message
     (default N: one message), recipient i at di.dom.bench.test, over one SMTP
     connection (Python smtplib);
  3. released: the configuration is rewritten to route "d" { domains = ["*"]; mx = true;
     port = SINK; tls = "none"; connections = BENCH_CONNECTIONS (default 1); } and
     applied with `sluice reload` (relay { dns_servers = "127.0.0.1:DNS"; } is there
     from the start: the resolver is not remade by a reload; idle_timeout = 100ms, so
     that each lane's connection closes after its one message: smtp-sink serves about
     a thousand connections at once, and the listen queue holds the rest).  The
     reload routes every queued recipient again (making the N lanes, one lookup by
     name per recipient) and kicks the lanes, which look up their MX and deliver;
  4. timed from just before `sluice reload` to the moment smtp-sink has counted all N
     messages (each lane sends its own); sluiced's CPU (utime + stime of
     /proc/PID/stat, all threads) over the same span.  Then every recipient must be
     delivered (sluice stats) and the queue empty.

So the timed span holds the routing of N recipients, N MX lookups and N SMTP
transactions; the DNS server and the sink are the same for both builds.  A run that
has not finished after BENCH_TIMEOUT seconds (default 300) is reported as cut off, and
that build skips the larger sizes.

Prints a table (medians, and new / old ratios) on stdout, progress on stderr, and writes
the figures to BENCH_JSON (default BUILD/bench/relay_domains.json).

Environment: BENCH_DOMAINS, BENCH_ROUNDS, BENCH_PER_MESSAGE, BENCH_CONNECTIONS,
BENCH_TIMEOUT, BENCH_DIR (default /var/tmp), BENCH_JSON, BENCH_KEEP=1 (keep the
directory: configurations, sluiced logs).
"""

import json
import os
import pathlib
import resource
import shutil
import smtplib
import socket
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "func"))
sys.path.insert(0, str(HERE))
import conftest  # noqa: E402  (helpers of the functional tests)
import harness  # noqa: E402
from harness import env_int  # noqa: E402
from run_relay import Sink  # noqa: E402

try:
    from dnslib import A, MX, QTYPE, RCODE, RR
    from dnslib.server import BaseResolver, DNSLogger, DNSServer
except ImportError:
    raise SystemExit("run_relay_domains: python3-dnslib (Debian) is needed")

ZONE = "dom.bench.test"
MX_HOST = "mx.bench.test"
SENDER = "list@sender.example"


def say(*a):
    print("run_relay_domains:", *a, file=sys.stderr, flush=True)


class Zone(BaseResolver):
    """MX mx.bench.test for every name under dom.bench.test; A 127.0.0.1 for the MX."""

    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        if name.endswith("." + ZONE):
            if qtype == "MX":
                reply.add_answer(RR(name + ".", QTYPE.MX, rdata=MX(MX_HOST + ".", 10),
                                    ttl=3600))
        elif name == MX_HOST:
            if qtype == "A":
                reply.add_answer(RR(name + ".", QTYPE.A, rdata=A("127.0.0.1"), ttl=3600))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


class Sluice(harness.Sluiced):
    def __init__(self, build, base, name, n, dns_port, sink_port, conns):
        d = base / name
        self.port = conftest.free_port()
        self.head = conftest.root_user_line() + f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "{d}";
log {{ target = "stderr"; level = "warning"; }}
control {{ listen = "unix:{d}/control.sock"; }}
intake {{ listen = "inet:127.0.0.1:{self.port}"; hostname = "relay.bench.test"; max_recipients = {max(n, 1)}; }}
queue {{ dir = "{d}/queue"; }}
relay {{
  retry {{ min = 1s; max = 2s; }}
  idle_timeout = 100ms;
  dns_servers = "127.0.0.1:{dns_port}";
}}
"""
        super().__init__(build, d, self.head + """route "hold" {
  domains = ["held.invalid"];
  smarthost = "[127.0.0.1]:9";
  tls = "none";
}
""", "run_relay_domains")
        self.release_conf = self.head + f"""route "d" {{
  domains = ["*"];
  mx = true;
  port = {sink_port};
  tls = "none";
  connections = {conns};
}}
"""
        self.start(harness.tcp_listening(self.port))

    def cli(self, *args, timeout=600):
        return super().cli(*args, timeout=timeout)

    def stats(self):
        return json.loads(self.cli("stats", "--json"))["relay"]

    def inject(self, n, per):
        body = (f"From: {SENDER}\r\nSubject: bench post\r\n\r\n" + "x" * 70 + "\r\n") * 1
        with smtplib.SMTP("127.0.0.1", self.port, timeout=600) as s:
            s.ehlo("list.bench.test")
            for first in range(0, n, per):
                rcpts = [f"u{i}@d{i}.{ZONE}" for i in range(first, min(n, first + per))]
                refused = s.sendmail(SENDER, rcpts, body)
                if refused:
                    raise SystemExit(f"run_relay_domains: {len(refused)} recipients refused")


def one_run(build, label, base, n, per, conns, dns_port, sink, timeout):
    s = Sluice(build, base, f"{label}-{n}-{time.monotonic_ns()}", n, dns_port, sink.port,
               conns)
    try:
        t = time.monotonic()
        s.inject(n, per)
        inject_s = time.monotonic() - t
        time.sleep(1.0)  # the relay takes the post in (and routes it nowhere)
        if s.stats().get("delivered", 0):
            raise SystemExit("run_relay_domains: mail left before the release")
        s.write_config(s.release_conf)
        sink.arm(sink.count + n)
        cpu0 = s.cpu()
        t0 = time.monotonic()
        s.cli("reload")
        hit = sink.wait(timeout)
        cpu1 = s.cpu()
        if hit is None:
            st = s.stats()
            say(f"{label} N={n}: cut off after {timeout} s, {st.get('delivered')} delivered")
            return {"cut": True, "seconds": timeout, "cpu_s": cpu1 - cpu0,
                    "delivered": st.get("delivered"), "inject_s": inject_s}
        secs = hit - t0
        # every recipient delivered, nothing failed, the queue empty
        deadline = time.monotonic() + 60
        while True:
            st = s.stats()
            if st["delivered"] >= n and "the queue is empty" in s.cli("queue"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"run_relay_domains: {label} N={n}: stats {st} after "
                                 f"the sink had {n}\n--- sluiced.log ---\n{s.log_tail()}")
            time.sleep(0.2)
        if st.get("failed") or st.get("deferred"):
            say(f"WARNING {label} N={n}: relay stats {st}")
        return {"cut": False, "seconds": secs, "cpu_s": cpu1 - cpu0, "inject_s": inject_s,
                "deferred": st.get("deferred", 0)}
    finally:
        s.stop()


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    builds = {"new": pathlib.Path(sys.argv[1]).resolve()}
    if len(sys.argv) == 3:
        builds["old"] = pathlib.Path(sys.argv[2]).resolve()
    for b in builds.values():
        for exe in ("src/daemon/sluiced", "src/cli/sluice"):
            if not (b / exe).exists():
                raise SystemExit(f"run_relay_domains: {b / exe} is missing")
    sizes = [int(x) for x in os.environ.get("BENCH_DOMAINS", "2000,20000").split(",")]
    rounds = env_int("BENCH_ROUNDS", 2)
    conns = env_int("BENCH_CONNECTIONS", 1)
    timeout = env_int("BENCH_TIMEOUT", 300)
    json_path = pathlib.Path(os.environ.get("BENCH_JSON",
                                            builds["new"] / "bench/relay_domains.json"))
    # a lane per domain may hold a connection each: descriptors for sluiced and the sink
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, 2 * max(sizes) + 1024)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    base = pathlib.Path(tempfile.mkdtemp(prefix="sluice-domains-",
                                         dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    os.chmod(base, 0o755)
    dns_port = conftest.free_port()
    dns = DNSServer(Zone(), port=dns_port, address="127.0.0.1", tcp=False,
                    logger=DNSLogger(logf=lambda s: None))
    # N lookups come at once: a deep receive queue, so that none is dropped (a dropped
    # query is a DNS failure to the relay, which suspends that lane for seconds)
    try:
        dns.server.socket.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
    except OSError:
        dns.server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    dns.start_thread()
    sink = Sink(base)
    load0 = os.getloadavg()
    results = {}
    skip = set()
    try:
        for n in sizes:
            per = env_int("BENCH_PER_MESSAGE", n) or n
            results[n] = {k: [] for k in builds}
            for r in range(rounds):
                order = list(builds) if r % 2 == 0 else list(reversed(builds))
                for label in order:
                    if label in skip:
                        continue
                    d = one_run(builds[label], label, base, n, per, conns, dns_port, sink,
                                timeout)
                    results[n][label].append(d)
                    say(f"N={n} round {r + 1} {label}: {d['seconds']:.2f} s"
                        f"{' (cut off)' if d['cut'] else ''}, sluiced CPU {d['cpu_s']:.2f} s"
                        f" (inject {d['inject_s']:.1f} s)")
                    if d["cut"]:
                        skip.add(label)
    finally:
        sink.stop()
        dns.stop()
        if os.environ.get("BENCH_KEEP") == "1":
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    def med(n, label, key):
        xs = [d[key] for d in results[n].get(label, [])]
        return statistics.median(xs) if xs else None

    def cut(n, label):
        return any(d["cut"] for d in results[n].get(label, []))

    def fmt(x, c=False):
        return "" if x is None else f"{'≥' if c else ''}{x:.2f}"
    per_txt = os.environ.get("BENCH_PER_MESSAGE", "N")
    print(f"One post to N recipients in N domains (BENCH_PER_MESSAGE={per_txt} recipients "
          f"per message), route mx = true, connections = {conns}, released by reload; "
          f"medians of {rounds} rounds; {os.cpu_count()} CPUs, load average "
          f"{load0[0]:.2f} -> {os.getloadavg()[0]:.2f}:\n")
    print("| N | old s | new s | new/old time | old CPU s | new CPU s | new/old CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        o_s, n_s = med(n, "old", "seconds"), med(n, "new", "seconds")
        o_c, n_c = med(n, "old", "cpu_s"), med(n, "new", "cpu_s")
        rt = n_s / o_s if o_s and n_s else None
        rc = n_c / o_c if o_c and n_c else None
        print(f"| {n} | {fmt(o_s, cut(n, 'old'))} | {fmt(n_s, cut(n, 'new'))} | "
              f"{fmt(rt)} | {fmt(o_c)} | {fmt(n_c)} | {fmt(rc)} |")
    print("\nTime: `sluice reload` to smtp-sink's N-th message; CPU: sluiced's utime + "
          "stime over that span.  ≥: cut off at BENCH_TIMEOUT.")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"builds": {k: str(v) for k, v in builds.items()},
                                     "connections": conns, "rounds": rounds,
                                     "results": {str(k): v for k, v in results.items()},
                                     "loadavg": {"start": load0, "end": os.getloadavg()}},
                                    indent=2) + "\n")
    say(f"results in {json_path}")


if __name__ == "__main__":
    main()
