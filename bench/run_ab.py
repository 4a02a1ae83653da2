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
import socket
import statistics
import subprocess
import sys
import tempfile
import time

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, what, timeout=15):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"run_ab: {what} did not come up")
        time.sleep(0.05)


def start(build, d, text):
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "sluiced.conf"
    conf.write_text(text)
    conf.chmod(0o600)
    log = open(d / "log", "ab")
    return subprocess.Popen([str(build / "src/daemon/sluiced"), "-c", str(conf)],
                            stdout=log, stderr=subprocess.STDOUT)


def stop(p):
    p.terminate()
    p.wait(60)


def milter_round(build, load, d):
    p = start(build, d, MILTER_CONF.format(d=d))
    try:
        wait_for(lambda: (d / "milter.sock").exists(), "sluiced's milter")
        res = subprocess.run([str(load), "-c", "100", "-t", DURATION, "-w", "1", "--json",
                              "--pid", str(p.pid), f"unix:{d}/milter.sock"],
                             capture_output=True, text=True, timeout=120)
        j = json.loads(res.stdout.strip().splitlines()[-1])
        return j["sessions_per_s"], j.get("server", {}).get("cpu_us_per_session")
    finally:
        stop(p)


def intake_round(build, d):
    port = free_port()
    p = start(build, d, INTAKE_CONF.format(d=d, port=port))
    try:
        def up():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(up, "sluiced's intake")
        cmd = [SMTP_SOURCE, "-s", "10", "-m", str(MESSAGES), "-l", "4096",
               "-f", "bench@sender.example", "-t", "rcpt@dest.example", f"127.0.0.1:{port}"]
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        return MESSAGES / (time.monotonic() - t0)
    finally:
        stop(p)
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
