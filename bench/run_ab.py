#!/usr/bin/python3
"""Two builds of sluiced side by side on the same load: the milter and the intake.

usage: bench/run_ab.py OLD_BUILD NEW_BUILD

A change on a hot path is measured against the build before it, in one run, the two
alternating round by round (the machines are noisy: a ratio of medians taken side by side
means more than two absolute figures taken apart).  Each round runs, for each build:

  - milter: `milter_load -c 100` (OLD_BUILD's load generator for both) for BENCH_DURATION
    seconds against sluiced's milter with fixed replies (the configuration of
    bench/run_milter.sh): sessions/s and sluiced's CPU µs per session;
  - intake: Postfix's smtp-source, 10 connections, BENCH_MESSAGES 4 KB messages into
    sluiced's intake with its queue on BENCH_DIR (default /var/tmp): messages/s.

Prints a markdown table of the medians and new/old.  Environment: BENCH_ROUNDS (5),
BENCH_DURATION (4), BENCH_MESSAGES (2000), BENCH_DIR.
"""

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import harness

SMTP_SOURCE = "/usr/sbin/smtp-source"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
DURATION = os.environ.get("BENCH_DURATION", "4")
MESSAGES = int(os.environ.get("BENCH_MESSAGES", "2000"))

# what both configurations share: the daemon, its log and its control socket
BASE_CONF = """workers = 2;
user = "root";
state_dir = "{d}";
stats_interval = 0;
log {{ target = "stderr"; level = "warning"; }}
control {{ listen = "unix:{d}/control.sock"; }}
"""

MILTER_CONF = BASE_CONF + """milter {{
  listen = "unix:{d}/milter.sock";
  max_sessions = 30000;
  reply {{ connect = "continue"; helo = "continue"; mail = "continue"; rcpt = "continue"; eom = "accept"; }}
}}
"""

INTAKE_CONF = BASE_CONF + """intake {{ listen = "inet:127.0.0.1:{port}"; max_sessions = 1000; }}
queue {{ dir = "{d}/queue"; }}
"""


def say(*a):
    print("run_ab:", *a, file=sys.stderr, flush=True)


def start(build, d, text, ready):
    """sluiced of build in d on configuration text, once ready() is true."""
    sd = harness.Sluiced(build, d, text, "run_ab", conf_name="sluiced.conf", log_name="log")
    sd.start(ready, timeout=15, interval=0.05)
    return sd


def milter_round(build, load, d):
    sd = start(build, d, MILTER_CONF.format(d=d), lambda: (d / "milter.sock").exists())
    try:
        res = subprocess.run([str(load), "-c", "100", "-t", DURATION, "-w", "1", "--json",
                              "--pid", str(sd.pid), f"unix:{d}/milter.sock"],
                             capture_output=True, text=True, timeout=120)
        j = json.loads(res.stdout.strip().splitlines()[-1])
        return j["sessions_per_s"], j.get("server", {}).get("cpu_us_per_session")
    finally:
        sd.stop()


def intake_round(build, d):
    port = harness.free_port()
    sd = start(build, d, INTAKE_CONF.format(d=d, port=port), harness.tcp_listening(port))
    try:
        cmd = [SMTP_SOURCE, "-s", "10", "-m", str(MESSAGES), "-l", "4096",
               "-f", "bench@sender.example", "-t", "rcpt@dest.example", f"127.0.0.1:{port}"]
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        return MESSAGES / (time.monotonic() - t0)
    finally:
        sd.stop()
        shutil.rmtree(d / "queue", ignore_errors=True)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    builds = {"old": pathlib.Path(sys.argv[1]).resolve(),
              "new": pathlib.Path(sys.argv[2]).resolve()}
    load = builds["old"] / "bench/milter_load"
    base = pathlib.Path(tempfile.mkdtemp(prefix="sluice-ab-",
                                         dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    figures = {k: {"milter": [], "cpu": [], "intake": []} for k in builds}
    try:
        for r in range(ROUNDS):
            order = list(builds) if r % 2 == 0 else list(reversed(builds))
            for name in order:
                d = base / f"{name}-{r}"
                rate, cpu = milter_round(builds[name], load, d / "m")
                figures[name]["milter"].append(rate)
                if cpu is not None:
                    figures[name]["cpu"].append(cpu)
                figures[name]["intake"].append(intake_round(builds[name], d / "i"))
                say(f"round {r + 1}/{ROUNDS} {name}: milter {rate:.0f}/s, intake "
                    f"{figures[name]['intake'][-1]:.0f} msg/s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("| figure | old | new | new / old |")
    print("|---|---:|---:|---:|")
    for key, label in (("milter", "milter sessions/s (c=100)"),
                       ("cpu", "sluiced CPU µs per milter session"),
                       ("intake", "intake messages/s (10 connections, 4 KB)")):
        if not figures["old"][key] or not figures["new"][key]:
            continue
        o = statistics.median(figures["old"][key])
        n = statistics.median(figures["new"][key])
        print(f"| {label} | {o:,.1f} | {n:,.1f} | {n / o:.3f} |")
    print(f"\nmedians of {ROUNDS} rounds, the builds alternating")


if __name__ == "__main__":
    main()
