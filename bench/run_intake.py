#!/usr/bin/python3
"""Intake throughput with durability on: sluiced's SMTP intake against Postfix's smtpd.

usage: bench/run_intake.py BUILD

Both servers keep their queue on the same disk (a directory under BENCH_DIR, default
/var/tmp), and both make every message durable before they answer 250: sluice by its group
commit (doc/QUEUE.md), Postfix by cleanup(8)'s fsync of each queue file.  Postfix is
configured to put every message on hold (smtpd_data_restrictions = static:HOLD), so that,
like the intake here, it only takes mail in: no queue manager moves files during the run.

For each concurrency (BENCH_CONCURRENCY, default "1 10 100") and each round
(BENCH_ROUNDS, default 3) the two servers take BENCH_MESSAGES(c) 4 KB messages from
Postfix's smtp-source one after the other; the table gives the median messages/s of each
and their ratio.  Then one counting pass per server under `strace -f -c` (not timed)
gives the flushes (fsync, fdatasync, syncfs) per message at concurrency 10 and 100.

Environment: BENCH_CONCURRENCY, BENCH_ROUNDS, BENCH_SIZE (bytes, default 4096),
BENCH_DIR, BENCH_KEEP=1 (keep the directory).
"""

import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "func"))
import conftest  # noqa: E402  (the Postfix instance and helpers of the functional tests)
import harness  # noqa: E402

SMTP_SOURCE = "/usr/sbin/smtp-source"


def say(*a):
    print("run_intake:", *a, file=sys.stderr, flush=True)


def messages_for(c):
    return max(400, 40 * c)


def smtp_source(port, conc, count, size):
    cmd = [SMTP_SOURCE, "-s", str(conc), "-m", str(count), "-l", str(size),
           "-f", "bench@sender.example", "-t", "rcpt@dest.example", f"127.0.0.1:{port}"]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    dt = time.monotonic() - t0
    if res.returncode != 0 or res.stderr.strip():
        raise SystemExit(f"smtp-source failed ({res.returncode}): {res.stderr[:500]}")
    return count / dt


class Sluice(harness.Sluiced):
    name = "sluice"

    def __init__(self, build, base):
        d = base / "sluice"
        self.port = conftest.free_port()
        super().__init__(build, d, conftest.root_user_line() + f"""
log {{ target = "stderr"; level = "notice"; }}
state_dir = "{d}";
control {{ listen = "unix:{d}/control.sock"; }}
intake {{ listen = "inet:127.0.0.1:{self.port}"; max_sessions = 2000; }}
queue {{ dir = "{d}/queue"; }}
""", "run_intake")
        self.start(harness.tcp_listening(self.port))

    def pids(self):
        return [self.proc.pid]

    def flushes(self):
        import json
        q = json.loads(self.cli("stats", "--json"))["queue"]
        return q["commits"], q["syncs"] + q["dir_syncs"]


class Postfix:
    name = "Postfix"

    def __init__(self, base):
        d = base / "postfix"
        d.mkdir()
        os.chmod(d, 0o755)
        self.pf = conftest.Postfix(d, None, {
            "smtpd_data_restrictions": "check_client_access static:HOLD",
            "default_process_limit": "200",
            "smtpd_client_connection_count_limit": "0",
            "smtpd_client_message_rate_limit": "0",
            "smtpd_client_connection_rate_limit": "0",
            "anvil_rate_time_unit": "60s",
        })
        self.pf.start()
        self.port = self.pf.port

    def pids(self):
        master = self.pf.master_pid()
        out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True,
                             text=True).stdout
        kids = [int(p) for p, pp in (line.split() for line in out.splitlines())
                if int(pp) == master]
        return [master, *kids]

    def stop(self):
        self.pf.stop()


def count_flushes(server, conc, count, size):
    """Messages sent and flush calls made while strace watches every process of server."""
    args = ["strace", "-f", "-c", "-U", "name,calls", "-e",
            "trace=fsync,fdatasync,syncfs,sync,sync_file_range"]
    for p in server.pids():
        args += ["-p", str(p)]
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        st = subprocess.Popen(args + ["-o", out.name], stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # strace attaches
        smtp_source(server.port, conc, count, size)
        time.sleep(0.5)
        st.send_signal(2)
        st.wait(30)
        text = open(out.name).read()
    calls = sum(int(m.group(2)) for m in
                re.finditer(r"^\s*(fsync|fdatasync|syncfs|sync|sync_file_range)\s+(\d+)",
                            text, re.M))
    return calls / count


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    build = pathlib.Path(sys.argv[1]).resolve()
    for p in (build / "src/daemon/sluiced", pathlib.Path(SMTP_SOURCE)):
        if not p.exists():
            raise SystemExit(f"run_intake: {p} is missing")
    concs = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "1 10 100").split()]
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    size = int(os.environ.get("BENCH_SIZE", "4096"))
    base = pathlib.Path(tempfile.mkdtemp(prefix="sluice-bench-intake.",
                                         dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    os.chmod(base, 0o755)
    servers = []
    try:
        conftest.raise_fd_limit()
        servers = [Sluice(build, base), Postfix(base)]
        for s in servers:  # warm-up: processes forked, caches filled
            smtp_source(s.port, 10, 200, size)
        rates = {(s.name, c): [] for s in servers for c in concs}
        for c in concs:
            for r in range(rounds):
                for s in servers if r % 2 == 0 else reversed(servers):
                    rate = smtp_source(s.port, c, messages_for(c), size)
                    rates[(s.name, c)].append(rate)
                    say(f"c={c} round {r + 1}: {s.name} {rate:.0f} msg/s")
        flushes = {}
        for c in [c for c in concs if c > 1] or concs:
            for s in servers:
                flushes[(s.name, c)] = count_flushes(s, c, messages_for(c), size)
                say(f"c={c}: {s.name} {flushes[(s.name, c)]:.3f} flushes/message (strace)")
        commits, calls = servers[0].flushes()
        uname = os.uname()
        print(f"Intake, {size}-byte messages from smtp-source, queue on "
              f"{subprocess.run(['df', '--output=fstype', str(base)], capture_output=True, text=True).stdout.split()[-1]}"
              f", {os.cpu_count()} CPUs, {uname.sysname} {uname.release}, median of "
              f"{rounds} rounds:\n")
        print("| concurrency | sluice msg/s | Postfix msg/s | ratio | sluice flushes/msg "
              "| Postfix flushes/msg |")
        print("|---:|---:|---:|---:|---:|---:|")
        for c in concs:
            a = statistics.median(rates[("sluice", c)])
            b = statistics.median(rates[("Postfix", c)])
            fa = flushes.get(("sluice", c))
            fb = flushes.get(("Postfix", c))
            print(f"| {c} | {a:.0f} | {b:.0f} | {a / b:.2f}x | "
                  f"{'' if fa is None else f'{fa:.2f}'} | {'' if fb is None else f'{fb:.2f}'} |")
        print(f"\nsluice's own count over the whole run: {commits} commits, {calls} flushes "
              f"({calls / max(commits, 1):.2f} per message, syncfs + directory fsync).")
    finally:
        for s in servers:
            try:
                s.stop()
            except Exception as e:  # keep stopping the others
                say(f"stopping {s.name}: {e}")
        if os.environ.get("BENCH_KEEP") == "1":
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
