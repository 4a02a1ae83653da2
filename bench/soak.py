#!/usr/bin/python3
"""Soak: sluiced's milter under a million sessions beside 10,000 held connections.

usage: bench/soak.py [BUILD]            (default ./build; `make soak` uses build)

One sluiced runs a milter with a host class and three rate limits (keyed by client_ip at
CONNECT, sender at MAIL, rcpt_domain at RCPT; their rates are generous, so nothing is
refused and every session pays for every decision).  One milter_load holds SOAK_IDLE
connections open in the middle of a transaction (OPTNEG, CONNECT, HELO, MAIL and the RCPTs
sent, then silence: --idle-mail) while it runs SOAK_SESSIONS sessions through
SOAK_CONCURRENCY other connections.  The script samples sluiced's /proc entries and
`sluice stats --json` every half second and reports:

  - RSS at start (no connection), after the warm-up (the idle connections open and the
    first SOAK_WARMUP sessions done), at the middle and at the end of the run (the idle
    connections still open), and the growth from warm-up to end: PASS if it is at most
    SOAK_MAX_GROWTH percent (default 5), FAIL otherwise;
  - protocol errors seen by milter_load and by sluiced (`protocol_errors`, `timeouts`);
  - the open descriptors of sluiced (/proc/PID/fd) at baseline, peak under load and after
    the run (PASS when back to the baseline);
  - the thread count (PASS when it never changed);
  - the throughput.

Exit status 0 when every check passes, 1 when one fails, 2 when the run could not be made.
Environment: SOAK_SESSIONS (1000000), SOAK_IDLE (10000), SOAK_CONCURRENCY (100),
SOAK_WARMUP (100000 sessions), SOAK_MAX_GROWTH (5), SOAK_KEEP=1 keeps the directory,
SOAK_JSON (a file for the figures, default BUILD/bench/soak.json).
"""

import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import harness
from harness import env_int

HERE = pathlib.Path(__file__).resolve().parent


def say(*a):
    print("soak:", *a, file=sys.stderr, flush=True)


def proc_status(pid):
    """(RSS KiB, threads) from /proc/PID/status."""
    rss = thr = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                thr = int(line.split()[1])
    return rss, thr


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_targets(pid):
    """What sluiced's descriptors point at, socket inodes folded: for the report."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        t = "socket" if t.startswith("socket:") else t
        out[t] = out.get(t, 0) + 1
    return out


def raise_nofile(need):
    """Soft (and, as root, hard) RLIMIT_NOFILE to 65536 or need: sluiced and milter_load
    inherit it, and each holds a descriptor per connection."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(need, 65536)
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            hard = want
        except (ValueError, OSError):
            want = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < need:
        raise SystemExit(f"soak: open files limit {want} < {need}: run as root or lower "
                         "SOAK_IDLE")


CONF = """workers = 2;
stats_interval = 0;
state_dir = "{d}/state";
log {{ target = "stderr"; level = "notice"; }}
control {{ listen = "unix:{d}/control.sock"; }}
milter {{ listen = "unix:{d}/milter.sock"; max_sessions = {max_sessions}; }}
class "all" {{ hosts = ["*"]; sessions = {max_sessions}; inbound = {max_sessions}; }}
limit "per-client-ip" {{ stage = "connect"; key = "client_ip"; rate = ["1000000000/1m"]; }}
limit "per-sender" {{ stage = "mail"; key = "sender"; rate = ["1000000000/1m"]; }}
limit "per-rcpt-domain" {{ stage = "rcpt"; key = "rcpt_domain"; count = "messages";
  rate = ["1000000000/1m", "1000000000/1d"]; }}
"""


class Sampler(threading.Thread):
    """Samples sluiced every 0.5 s: (t, sessions done, current, RSS KiB, fds, threads)."""

    def __init__(self, pid, sluice, conf):
        super().__init__(daemon=True)
        self.pid, self.sluice, self.conf = pid, sluice, conf
        self.samples = []
        self.stop = threading.Event()

    def stats(self):
        r = subprocess.run([self.sluice, "-c", self.conf, "stats", "--json"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def sample(self):
        st = self.stats()
        rss, thr = proc_status(self.pid)
        fds = proc_fds(self.pid)
        m = st["milter"] if st else {}
        s = {"t": time.monotonic(), "sessions": m.get("since_start", {}).get("sessions", 0),
             "current": m.get("sessions_current", 0), "rss_kib": rss, "fds": fds,
             "threads": thr, "stats": st}
        self.samples.append(s)
        return s

    def run(self):
        while not self.stop.wait(0.5):
            try:
                self.sample()
            except (OSError, ValueError, subprocess.SubprocessError):
                pass


def main():
    build = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
    sessions = env_int("SOAK_SESSIONS", 1000000)
    idle = env_int("SOAK_IDLE", 10000)
    conc = env_int("SOAK_CONCURRENCY", 100)
    warm = env_int("SOAK_WARMUP", min(100000, sessions // 10))
    max_growth = float(os.environ.get("SOAK_MAX_GROWTH", "5"))
    sluiced = build / "src/daemon/sluiced"
    sluice = build / "src/cli/sluice"
    load = build / "bench/milter_load"
    for p in (sluiced, sluice, load):
        if not p.exists():
            say(f"{p} is missing: build first (meson setup build && ninja -C build)")
            return 2
    raise_nofile(idle + conc + 2048)

    d = pathlib.Path(tempfile.mkdtemp(prefix="sluice-soak."))
    (d / "state").mkdir()
    text = CONF.format(d=d, max_sessions=max(30000, 2 * (idle + conc)))
    sd = harness.Sluiced(build, d, text, "soak")
    conf = sd.conf
    if os.getuid() == 0:
        # sluiced wants an explicit user to run as root, if it knows the key
        text = conf.read_text()
        sd.write_config('user = "root";\n' + text)
        if subprocess.run([str(sluiced), "-t", "-c", str(conf)],
                          capture_output=True).returncode != 0:
            sd.write_config(text)
    sock = d / "milter.sock"
    try:
        sd.start(lambda: sock.exists() and (d / "control.sock").exists(), timeout=10,
                 interval=0.1)
    except SystemExit as e:
        say(f"sluiced did not start: {e}")
        return 2
    daemon = sd.proc
    time.sleep(0.5)
    sampler = Sampler(daemon.pid, str(sluice), str(conf))
    start = sampler.sample()
    time.sleep(0.5)
    start["fds"] = proc_fds(daemon.pid)
    say(f"sluiced {daemon.pid}: RSS {start['rss_kib']} KiB, {start['fds']} fds, "
        f"{start['threads']} threads; {idle} idle connections, {sessions} sessions at "
        f"concurrency {conc}")
    fds_start = fd_targets(daemon.pid)
    sampler.start()
    cmd = [str(load), "-c", str(conc), "-n", str(sessions), "-w", "0", "-i", str(idle),
           "--idle-mail", "--json", "--pid", str(daemon.pid), f"unix:{sock}"]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    if res.returncode >= 2 or not res.stdout.strip():
        say(f"milter_load failed ({res.returncode}): {res.stderr[-1000:]}")
        daemon.kill()
        return 2
    lj = json.loads(res.stdout.strip().splitlines()[-1])

    # after the run: the idle connections are released; wait for sluiced to close them
    after = None
    for _ in range(60):
        after = sampler.sample()
        if after["current"] == 0 and after["fds"] <= start["fds"]:
            break
        time.sleep(0.5)
    time.sleep(1)
    after = sampler.sample()
    # the control connection of that `sluice stats` may still be open: count again
    time.sleep(0.5)
    after["fds"] = proc_fds(daemon.pid)
    fds_after = fd_targets(daemon.pid)
    sampler_samples = [s for s in sampler.samples if s["t"] <= t0 + wall]

    if after["fds"] > start["fds"]:
        extra = {k: v - fds_start.get(k, 0) for k, v in fds_after.items()
                 if v > fds_start.get(k, 0)}
        say(f"descriptors left after the run: {extra}")
    rc = sd.stop(timeout=30)
    if rc is None:
        rc = "killed"

    def first_at(n):
        for s in sampler_samples:
            if s["sessions"] - start["sessions"] >= n and s["current"] >= idle:
                return s
        return None

    loaded = [s for s in sampler_samples if s["current"] >= idle]
    warm_s = first_at(warm)
    mid_s = first_at(sessions // 2)
    end_s = loaded[-1] if loaded else None
    if not (warm_s and mid_s and end_s):
        say("too few samples with the idle connections open; run longer")
        return 2
    growth = 100.0 * (end_s["rss_kib"] - warm_s["rss_kib"]) / warm_s["rss_kib"]
    st_end = after["stats"]["milter"]
    perrs = st_end["since_start"]["protocol_errors"]
    touts = st_end["since_start"]["timeouts"]
    load_errs = lj["errors"]["total"]
    thr_seen = sorted({s["threads"] for s in sampler.samples})
    fd_peak = max(s["fds"] for s in sampler.samples)
    checks = {
        "rss": growth <= max_growth,
        "errors": load_errs == 0 and perrs == 0 and touts == 0 and lj.get("idle_lost", 0) == 0,
        "fds": after["fds"] <= start["fds"],
        "threads": len(thr_seen) == 1,
        "exit": rc == 0,
    }
    rate = lj.get("sessions_per_s") or lj.get("rate")
    fig = {
        "sessions": sessions, "idle": idle, "concurrency": conc,
        "idle_held": lj.get("idle_held"), "wall_s": round(wall, 1), "load": lj,
        "rss_kib": {"start": start["rss_kib"], "warmup": warm_s["rss_kib"],
                    "middle": mid_s["rss_kib"], "end": end_s["rss_kib"],
                    "after": after["rss_kib"]},
        "rss_growth_pct": round(growth, 2),
        "fds": {"baseline": start["fds"], "peak": fd_peak, "after": after["fds"]},
        "threads": thr_seen,
        "daemon_protocol_errors": perrs, "daemon_timeouts": touts,
        "client_errors": load_errs, "store": after["stats"].get("store"),
        "exit_status": rc, "checks": checks,
        # the samples: seconds, sessions done, sessions open, RSS KiB, fds, store keys and
        # bytes
        "series": [[round(x["t"] - t0, 1), x["sessions"] - start["sessions"], x["current"],
                    x["rss_kib"], x["fds"], ((x["stats"] or {}).get("store") or {}).get("keys"),
                    ((x["stats"] or {}).get("store") or {}).get("bytes")]
                   for x in sampler.samples],
    }
    out = pathlib.Path(os.environ.get("SOAK_JSON", build / "bench" / "soak.json"))
    out.write_text(json.dumps(fig, indent=1) + "\n")

    def ok(b):
        return "PASS" if b else "FAIL"

    mib = lambda k: f"{k / 1024:.1f} MiB"  # noqa: E731
    print(f"# Soak: {sessions:,} milter sessions beside {idle:,} held connections")
    print()
    print("| measure | value | check |")
    print("|---|---:|---|")
    print(f"| wall time | {wall:.0f} s | |")
    print(f"| sessions/s (milter_load) | {rate:,.0f} | |" if rate else "| sessions/s | ? | |")
    print(f"| idle connections held to the end | {lj.get('idle_held')} of {idle} | |")
    print(f"| RSS at start | {mib(start['rss_kib'])} | |")
    print(f"| RSS after warm-up ({warm:,} sessions) | {mib(warm_s['rss_kib'])} | |")
    print(f"| RSS at the middle | {mib(mid_s['rss_kib'])} | |")
    print(f"| RSS at the end | {mib(end_s['rss_kib'])} | |")
    print(f"| RSS growth, warm-up to end | {growth:+.2f} % | {ok(checks['rss'])} "
          f"(≤ {max_growth:g} %) |")
    print(f"| RSS after the run (no connection) | {mib(after['rss_kib'])} | |")
    print(f"| protocol errors: milter_load / sluiced (errors, timeouts) | "
          f"{load_errs} / {perrs}, {touts} | {ok(checks['errors'])} |")
    print(f"| descriptors: baseline / peak / after | {start['fds']} / {fd_peak} / "
          f"{after['fds']} | {ok(checks['fds'])} |")
    print(f"| threads (every sample) | {', '.join(map(str, thr_seen))} | "
          f"{ok(checks['threads'])} |")
    print(f"| sluiced exit status after SIGTERM | {rc} | {ok(checks['exit'])} |")
    print()
    verdict = all(checks.values())
    print("PASS" if verdict else "FAIL")
    say(f"figures in {out}")
    if os.environ.get("SOAK_KEEP") == "1":
        say(f"kept {d}")
    else:
        shutil.rmtree(d, ignore_errors=True)
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
