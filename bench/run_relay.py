#!/usr/bin/python3
"""Relay delivery: sluiced's relay against Postfix's smtp(8) client, and the scheduler's cost.

usage: bench/run_relay.py BUILD

Part 1, delivery throughput.  One smtp-sink (Postfix's test server) takes the mail of both
servers.  For each round (BENCH_ROUNDS, default 3) each server gets BENCH_MESSAGES (default
5,000) messages of one recipient from smtp-source while it cannot deliver them, and is
then released; the time from the release to the moment smtp-sink has counted the last of
them is the delivery time.  sluice: a route to the sink with `connections = 10`, the lane
suspended with `sluice lanes suspend` before the messages come in, released with `sluice
lanes resume`.  Postfix: a private instance with `relayhost = [127.0.0.1]:SINK` and
`default_destination_concurrency_limit = 10`, the messages put on hold by smtpd, moved to
the deferred queue with `postsuper -H ALL` (not timed), released with `postqueue -f`.
The servers alternate; the table gives each round and the medians.

Part 2, the scheduler's CPU.  BENCH_SENDS (default 10,000) messages through a lane with
`rate = [BENCH_RATE]` (default "200/1s", binding: the lane waits between sends), and the
same number through the unthrottled lane of part 1.  For each: sluiced's CPU time
(utime + stime of /proc/PID/stat, all threads) from the release to the last message, per
send, and the relay thread's own CPU and voluntary context switches (the times it went to
sleep).  Then an untimed second pass under `strace` attached to the relay thread alone
counts its epoll_wait calls (its wake-ups) and those that returned 0 (woken by a timer
alone, with no socket ready).

Environment: BENCH_MESSAGES, BENCH_ROUNDS, BENCH_SIZE (smtp-source -l, default 2048),
BENCH_CONNECTIONS (default 10), BENCH_SENDS, BENCH_RATE, BENCH_STRACE (1: do the strace
pass, default), BENCH_DIR (default /var/tmp), BENCH_JSON (default BUILD/bench/relay.json),
BENCH_KEEP=1 (keep the directory: configurations, logs, strace output).
"""

import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "func"))
import conftest  # noqa: E402  (the Postfix instance and helpers of the functional tests)
import harness  # noqa: E402
from harness import env_int, proc_cpu, tree_cpu  # noqa: E402

SMTP_SOURCE = "/usr/sbin/smtp-source"
SMTP_SINK = conftest.SMTP_SINK
POSTSUPER = shutil.which("postsuper", path="/usr/sbin:/usr/bin") or "/usr/sbin/postsuper"
TICK = os.sysconf("SC_CLK_TCK")
SENDER = "bench@sender.example"
RCPT = "rcpt@dest.example"


def say(*a):
    print("run_relay:", *a, file=sys.stderr, flush=True)


# ---- /proc ------------------------------------------------------------------------------

def ctx_switches(pid, tid):
    out = {}
    try:
        for line in open(f"/proc/{pid}/task/{tid}/status"):
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                k, v = line.split(":")
                out[k.split("_")[0]] = int(v)
    except FileNotFoundError:
        pass
    return out


# ---- the sink and the source ----------------------------------------------------------

class Sink:
    """smtp-sink -c: it prints "sess=N quit=N mesg=N\\r" whenever a message ends; a thread
    reads that and notes when the count first reaches the target set by wait()."""

    def __init__(self, base):
        self.port = conftest.free_port()
        self.count = 0
        self.target = None
        self.hit = None
        self.cond = threading.Condition()
        self.err = open(base / "smtp-sink.log", "ab")
        self.proc = subprocess.Popen([SMTP_SINK, "-u", "nobody", "-c",
                                      f"127.0.0.1:{self.port}", "1000"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.err)
        threading.Thread(target=self._read, daemon=True).start()
        conftest.wait_until(lambda: conftest.tcp_listening("127.0.0.1", self.port) or
                            self.proc.poll() is not None, 10, "smtp-sink to listen")
        if self.proc.poll() is not None:
            raise SystemExit("run_relay: smtp-sink exited at once (see smtp-sink.log)")

    def _read(self):
        fd = self.proc.stdout.fileno()
        rest = b""
        while True:
            chunk = os.read(fd, 65536)
            now = time.monotonic()
            if not chunk:
                return
            parts = (rest + chunk).split(b"\r")
            rest = parts.pop()
            counts = [int(m.group(1)) for p in parts for m in [re.search(rb"mesg=(\d+)", p)]
                      if m]
            if not counts:
                continue
            with self.cond:
                self.count = max(self.count, counts[-1])
                if self.target is not None and self.hit is None and self.count >= self.target:
                    self.hit = now
                self.cond.notify_all()

    def arm(self, target):
        with self.cond:
            self.target, self.hit = target, None
            if self.count >= target:
                self.hit = time.monotonic()

    def wait(self, timeout):
        """Waits for the target of arm(); returns the monotonic time it was reached."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.hit is not None, timeout):
                return None
            return self.hit

    def cpu(self):
        return proc_cpu(f"/proc/{self.proc.pid}/stat")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.err.close()


def smtp_source(port, count, size, conc=10):
    cmd = [SMTP_SOURCE, "-s", str(conc), "-m", str(count), "-l", str(size),
           "-f", SENDER, "-t", RCPT, f"127.0.0.1:{port}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0 or res.stderr.strip():
        raise SystemExit(f"run_relay: smtp-source failed ({res.returncode}): "
                         f"{res.stderr[:500]}")


# ---- the two servers --------------------------------------------------------------------

class Sluice(harness.Sluiced):
    name = "sluice"
    LANE = "sink"

    def __init__(self, build, base, name, sink, conns, rate=None):
        d = base / name
        self.sink = sink
        self.port = conftest.free_port()
        rate_line = f'rate = ["{rate}"];' if rate else "# no rate: unthrottled"
        super().__init__(build, d, conftest.root_user_line() + f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "{d}";
log {{ target = "stderr"; level = "info"; }}
control {{ listen = "unix:{d}/control.sock"; }}
intake {{ listen = "inet:127.0.0.1:{self.port}"; hostname = "relay.bench.test"; max_sessions = 2000; }}
queue {{ dir = "{d}/queue"; }}
route "{self.LANE}" {{
  domains = ["*"];
  smarthost = "[127.0.0.1]:{sink.port}";
  tls = "none";
  connections = {conns};
  recipients_per_message = 1;
  {rate_line}
}}
""", "run_relay")
        self.start(harness.tcp_listening(self.port))
        self.relay_tid = None
        self.delivered = 0

    def stats(self):
        return json.loads(self.cli("stats", "--json"))["relay"]

    def prime(self):
        """One message through the open lane, so that the lane exists (a lane is made when
        mail for it arrives) and can be suspended; strace watches which thread connects to
        the sink: that is the relay's thread."""
        out = self.dir / "connect.strace"
        st = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(out),
                               "-p", str(self.proc.pid)], stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # strace attaches to every thread
        self.sink.arm(self.sink.count + 1)
        smtp_source(self.port, 1, 100, 1)
        if self.sink.wait(30) is None:
            raise SystemExit(f"run_relay: sluice's first message did not reach the sink\n"
                             f"--- sluiced.log ---\n{self.log_tail()}")
        time.sleep(0.2)
        st.send_signal(signal.SIGINT)
        st.wait(30)
        m = re.search(rf"^(\d+)\s+connect\(\d+, \{{sa_family=AF_INET, "
                      rf"sin_port=htons\({self.sink.port}\)", out.read_text(), re.M)
        self.relay_tid = int(m.group(1)) if m else None
        if not self.relay_tid:
            say(f"{self.dir.name}: could not tell the relay thread (no connect() seen); "
                "its own figures are left out")
        self.delivered = self.stats()["delivered"]

    def hold(self):
        self.cli("lanes", "suspend", self.LANE)

    def wait_queued(self, n):
        """After smtp-source: the relay has taken in all n messages (its lane's waiting
        recipients).  Taking in a message costs the relay a scan of its list of messages,
        so with thousands queued it lags the intake by a second or more: waiting here
        keeps that work out of the timed delivery."""
        def ready():
            lanes = json.loads(self.cli("lanes", "--json"))
            return sum(x["waiting"] for x in lanes if x["lane"] == self.LANE) >= n
        try:
            conftest.wait_until(ready, 600, f"the relay to take in {n} messages", 0.2)
        except AssertionError as e:
            raise SystemExit(f"run_relay: {self.dir.name}: {e}\n--- sluiced.log ---\n"
                             f"{self.log_tail()}")

    def release(self):
        self.cli("lanes", "resume", self.LANE)

    def thread(self):
        if not self.relay_tid:
            return {}
        d = {"cpu": proc_cpu(f"/proc/{self.proc.pid}/task/{self.relay_tid}/stat")}
        d.update(ctx_switches(self.proc.pid, self.relay_tid))
        return d

    def check_done(self, n):
        """Every message delivered, none failed or deferred, and the queue empty."""
        want = self.delivered + n
        deadline = time.monotonic() + 60
        while True:
            st = self.stats()
            empty = "the queue is empty" in self.cli("queue")
            if st["delivered"] >= want and empty:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"run_relay: {self.dir.name}: {st['delivered'] - self.delivered}"
                                 f" of {n} delivered after 60 s, queue empty: {empty}, "
                                 f"stats {st}\n--- sluiced.log ---\n{self.log_tail()}")
            time.sleep(0.2)
        self.delivered = st["delivered"]
        if st["failed"] or st["uncertain"]:
            say(f"WARNING {self.dir.name}: relay stats {st}")
        return st


class Postfix:
    name = "Postfix"

    def __init__(self, base, sink, conns):
        d = base / "postfix"
        d.mkdir()
        os.chmod(d, 0o755)
        self.sink = sink
        # conftest.Postfix also starts an smtp-sink of its own; this one stays idle.
        self.pf = conftest.Postfix(d, None, {
            "relayhost": f"[127.0.0.1]:{sink.port}",
            "smtpd_data_restrictions": "check_client_access static:HOLD",
            "default_destination_concurrency_limit": str(conns),
            "smtp_tls_security_level": "none",
            "smtpd_client_connection_count_limit": "0",
            "smtpd_client_message_rate_limit": "0",
            "smtpd_client_connection_rate_limit": "0",
            # deferred mail waits for postqueue -f, not for a queue run
            "queue_run_delay": "3600s",
            "minimal_backoff_time": "3600s",
            "maximal_backoff_time": "7200s",
        })
        self.pf.start()
        self.port = self.pf.port
        self.env = conftest.Postfix._env()

    def count(self, queue):
        return sum(len(files) for _, _, files in os.walk(self.pf.queue_dir / queue))

    def run(self, *cmd):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=self.env)
        if res.returncode != 0:
            raise SystemExit(f"run_relay: {' '.join(cmd)} exited {res.returncode}: "
                             f"{res.stderr}\n--- maillog ---\n{self.pf.maillog.tail()}")

    def prime(self):
        self.hold()
        self.sink.arm(self.sink.count + 1)
        smtp_source(self.port, 1, 100, 1)
        self.wait_queued(1)
        self.release()
        if self.sink.wait(30) is None:
            raise SystemExit(f"run_relay: Postfix's first message did not reach the sink\n"
                             f"--- maillog ---\n{self.pf.maillog.tail()}")
        self.check_done(1)

    def hold(self):
        pass  # smtpd puts every message on hold

    def wait_queued(self, n):
        """After smtp-source: the n messages from hold to the deferred queue (not timed)."""
        conftest.wait_until(lambda: self.count("hold") >= n, 60, f"{n} messages on hold")
        self.run(POSTSUPER, "-c", str(self.pf.config_dir), "-H", "ALL")
        conftest.wait_until(lambda: self.count("deferred") >= n, 60,
                            f"{n} messages in the deferred queue")

    def release(self):
        self.run(conftest.POSTQUEUE, "-c", str(self.pf.config_dir), "-f")

    def cpu(self):
        return tree_cpu(self.pf.master_pid())

    def thread(self):
        return {}

    def check_done(self, n):
        def empty():
            return all(self.count(q) == 0 for q in ("incoming", "active", "deferred", "hold"))
        try:
            conftest.wait_until(empty, 60, "Postfix's queue to empty", interval=0.2)
        except AssertionError as e:
            raise SystemExit(f"run_relay: {e}\n--- maillog ---\n{self.pf.maillog.tail()}")
        return {}

    def stop(self):
        self.pf.stop()


# ---- one measured delivery --------------------------------------------------------------

def deliver(server, sink, n, size, timeout, strace_out=None):
    """Queue n messages that server cannot send yet, release them, and time the delivery.

    Returns a dict: seconds (release to the sink's count), msgs_per_s, cpu_s (the server's
    CPU over the same span plus a 0.5 s settle), sink_cpu_s, and the relay thread's
    figures for sluice."""
    server.hold()
    base = sink.count
    smtp_source(server.port, n, size)
    server.wait_queued(n)
    time.sleep(0.5)
    if sink.count != base:
        raise SystemExit(f"run_relay: {server.name} delivered {sink.count - base} "
                         "messages while it was held")
    st = None
    if strace_out is not None:
        st = subprocess.Popen(["strace", "-qq", "-C", "-T", "-o", str(strace_out),
                               "-p", str(server.relay_tid)], stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    sink.arm(base + n)
    c0, s0, th0 = server.cpu(), sink.cpu(), server.thread()
    t0 = time.monotonic()
    server.release()
    t1 = sink.wait(timeout)
    if t1 is None:
        extra = server.log_tail() if isinstance(server, Sluice) else server.pf.maillog.tail()
        raise SystemExit(f"run_relay: {server.name}: the sink has {sink.count - base} of {n} "
                         f"after {timeout} s\n--- log ---\n{extra}")
    time.sleep(0.5)  # the last replies, status writes and unlinks
    c1, s1, th1 = server.cpu(), sink.cpu(), server.thread()
    if st is not None:
        st.send_signal(signal.SIGINT)
        st.wait(60)
    res = {"messages": n, "seconds": t1 - t0, "msgs_per_s": n / (t1 - t0),
           "cpu_s": c1 - c0, "sink_cpu_s": s1 - s0}
    if th0 and th1:
        res["relay_thread"] = {k: th1[k] - th0[k] for k in th0 if k in th1}
    res["stats"] = server.check_done(n)
    return res


def parse_strace(path, sends):
    """The relay thread's epoll_wait calls (strace -C -T: every call with the time spent in
    it, then the summary): all of them (its wake-ups), those that lasted their whole
    timeout (a timer expired, whether or not a socket was ready at the same moment), those
    that returned 0 (a timer alone), those of these after which the thread made no system
    call before waiting again (it woke and found nothing to do), and the total of its
    system calls."""
    wait_re = re.compile(r"^epoll_wait\(\d+, .*, \d+, (-?\d+)\)\s+=\s+(-?\d+).*<([\d.]+)>$")
    waits = zeros = expired = idle = 0
    last_zero = False
    calls = None
    for line in path.read_text(errors="replace").splitlines():
        m = wait_re.match(line)
        if m:
            timeout, ret, spent = int(m.group(1)), int(m.group(2)), float(m.group(3)) * 1000
            waits += 1
            zeros += ret == 0
            expired += timeout > 0 and (ret == 0 or spent >= timeout - 0.1)
            idle += last_zero
            last_zero = ret == 0
            continue
        t = re.match(r"^\s*100\.00\s+[\d.]+\s+\d+\s+(\d+)", line)
        if t:
            calls = int(t.group(1))
        elif re.match(r"^[a-z_0-9]+\(", line):
            last_zero = False
    return {"epoll_waits": waits, "timer_wakeups": expired, "timer_only_wakeups": zeros,
            "idle_wakeups": idle, "syscalls": calls,
            "epoll_waits_per_send": waits / sends, "timer_wakeups_per_send": expired / sends,
            "timer_only_per_send": zeros / sends, "idle_wakeups_per_send": idle / sends,
            "syscalls_per_send": None if calls is None else calls / sends}


# ---- main --------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    build = pathlib.Path(sys.argv[1]).resolve()
    for p in (build / "src/daemon/sluiced", build / "src/cli/sluice",
              pathlib.Path(SMTP_SOURCE), pathlib.Path(SMTP_SINK),
              pathlib.Path(conftest.POSTFIX)):
        if not p.exists():
            raise SystemExit(f"run_relay: {p} is missing")
    if os.geteuid() != 0:
        raise SystemExit("run_relay: a private Postfix instance needs root")
    if not shutil.which("strace"):
        raise SystemExit("run_relay: strace is missing (Debian: strace)")
    n = env_int("BENCH_MESSAGES", 5000)
    rounds = env_int("BENCH_ROUNDS", 3)
    size = env_int("BENCH_SIZE", 2048)
    conns = env_int("BENCH_CONNECTIONS", 10)
    sends = env_int("BENCH_SENDS", 10000)
    rate = os.environ.get("BENCH_RATE", "200/1s")
    do_strace = os.environ.get("BENCH_STRACE", "1") == "1"
    json_path = pathlib.Path(os.environ.get("BENCH_JSON", str(build / "bench/relay.json")))
    m = re.fullmatch(r"(\d+)/(\d+)([smh]?)", rate)
    if not m:
        raise SystemExit(f"run_relay: BENCH_RATE={rate}: expected N/Ts such as 200/1s")
    rate_per_s = int(m.group(1)) / (int(m.group(2)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(3)])
    base = pathlib.Path(tempfile.mkdtemp(prefix="sluice-bench-relay.",
                                         dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    os.chmod(base, 0o755)
    started = []
    load0 = os.getloadavg()
    result = {"benchmark": "relay", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "cpus": os.cpu_count(), "kernel": " ".join(os.uname()[2:4]),
              "params": {"messages": n, "rounds": rounds, "size": size, "connections": conns,
                         "sends": sends, "rate": rate}}
    try:
        conftest.raise_fd_limit()
        sink = Sink(base)
        started.append(sink)
        fast = Sluice(build, base, "sluice", sink, conns)
        started.append(fast)
        pf = Postfix(base, sink, conns)
        started.append(pf)
        slow = Sluice(build, base, "sluice-throttled", sink, conns, rate)
        started.append(slow)
        for s in (fast, pf, slow):
            s.prime()
        say(f"sink on port {sink.port}; relay thread of sluiced {fast.proc.pid}: "
            f"{fast.relay_tid}, of the throttled one {slow.proc.pid}: {slow.relay_tid}")
        timeout = max(120, n / 20)

        # part 1 -------------------------------------------------------------------------
        warm = max(n // 10, 100)
        for s in (fast, pf):  # warm-up: processes forked, connections cached, caches filled
            deliver(s, sink, warm, size, timeout)
        servers = [fast, pf]
        part1 = []
        for r in range(rounds):
            row = {"round": r + 1}
            for s in servers if r % 2 == 0 else reversed(servers):
                d = deliver(s, sink, n, size, timeout)
                d.pop("stats", None)
                row[s.name] = d
                say(f"round {r + 1}: {s.name} {d['msgs_per_s']:.0f} msg/s "
                    f"({d['seconds']:.2f} s, CPU {d['cpu_s']:.2f} s, sink CPU "
                    f"{d['sink_cpu_s']:.2f} s)")
            row["ratio"] = row["sluice"]["msgs_per_s"] / row["Postfix"]["msgs_per_s"]
            part1.append(row)
        med = {name: statistics.median(r[name]["msgs_per_s"] for r in part1)
               for name in ("sluice", "Postfix")}
        medcpu = {name: statistics.median(r[name]["cpu_s"] / n for r in part1)
                  for name in ("sluice", "Postfix")}
        result["delivery"] = {
            "rounds": part1,
            "median_msgs_per_s": med,
            "median_ratio": statistics.median(r["ratio"] for r in part1),
            "median_cpu_ms_per_msg": {k: v * 1000 for k, v in medcpu.items()},
        }

        # part 2 -------------------------------------------------------------------------
        part2 = {}
        for label, s in (("unthrottled", fast), ("throttled", slow)):
            to = max(120, sends / 20) if label == "unthrottled" else sends / rate_per_s * 2 + 60
            d = deliver(s, sink, sends, size, to)
            d["stats"] = {k: d["stats"][k] for k in ("delivered", "failed", "deferred",
                                                     "uncertain", "suspensions",
                                                     "connections")}
            say(f"{label}: {sends} sends in {d['seconds']:.1f} s ({d['msgs_per_s']:.0f}/s), "
                f"sluiced CPU {d['cpu_s']:.2f} s, relay thread {d.get('relay_thread')}")
            if do_strace and s.relay_tid:
                out = base / f"{label}.strace"
                t = deliver(s, sink, sends, size, to * 3, strace_out=out)
                d["strace"] = parse_strace(out, sends)
                d["strace"]["seconds"] = t["seconds"]
                say(f"{label} under strace: {d['strace']}")
                if os.environ.get("BENCH_KEEP") != "1":
                    out.unlink()
            part2[label] = d
        result["scheduler"] = part2
        result["loadavg"] = {"start": load0, "end": os.getloadavg()}

        # report ---------------------------------------------------------------------------
        print(f"Relay delivery to smtp-sink, {n} messages of {size} bytes and 1 recipient "
              f"per round, {conns} connections each, {os.cpu_count()} CPUs, "
              f"{' '.join(os.uname()[2:3])}, load average {load0[0]:.2f} -> "
              f"{os.getloadavg()[0]:.2f}:\n")
        print("| round | sluice msg/s | Postfix msg/s | ratio | sluice CPU ms/msg "
              "| Postfix CPU ms/msg | sink CPU % (sluice / Postfix) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in part1:
            a, b = r["sluice"], r["Postfix"]
            print(f"| {r['round']} | {a['msgs_per_s']:.0f} | {b['msgs_per_s']:.0f} | "
                  f"{r['ratio']:.2f}x | {a['cpu_s'] / n * 1000:.3f} | "
                  f"{b['cpu_s'] / n * 1000:.3f} | "
                  f"{a['sink_cpu_s'] / a['seconds'] * 100:.0f} / "
                  f"{b['sink_cpu_s'] / b['seconds'] * 100:.0f} |")
        dl = result["delivery"]
        print(f"| median | {med['sluice']:.0f} | {med['Postfix']:.0f} | "
              f"{dl['median_ratio']:.2f}x | {medcpu['sluice'] * 1000:.3f} | "
              f"{medcpu['Postfix'] * 1000:.3f} | |")
        print(f"\nScheduler cost: {sends} messages of 1 recipient through one lane with "
              f"{conns} connections, unthrottled and with rate = [\"{rate}\"]:\n")
        print("| lane | sends/s | sluiced CPU s | CPU µs/send | relay thread CPU s "
              "| relay sleeps/send | epoll_wait/send | timer wake-ups/send | idle wake-ups/send "
              "| syscalls/send |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

        def f(x, fmt):
            return "" if x is None else format(x, fmt)
        for label in ("unthrottled", "throttled"):
            d = part2[label]
            th = d.get("relay_thread", {})
            stt = d.get("strace", {})
            vol = th["voluntary"] / sends if "voluntary" in th else None
            d["relay_sleeps_per_send"] = vol
            print(f"| {label if label == 'unthrottled' else rate} | {d['msgs_per_s']:.0f} | "
                  f"{d['cpu_s']:.2f} | {d['cpu_s'] / sends * 1e6:.0f} | "
                  f"{f(th.get('cpu'), '.2f')} | {f(vol, '.2f')} | "
                  f"{f(stt.get('epoll_waits_per_send'), '.2f')} | "
                  f"{f(stt.get('timer_wakeups_per_send'), '.2f')} | "
                  f"{f(stt.get('idle_wakeups_per_send'), '.3f')} | "
                  f"{f(stt.get('syscalls_per_send'), '.1f')} |")
        u, t = part2["unthrottled"], part2["throttled"]
        extra = {"cpu_us_per_send": (t["cpu_s"] - u["cpu_s"]) / sends * 1e6}
        if u.get("relay_sleeps_per_send") is not None and t.get("relay_sleeps_per_send") is not None:
            extra["relay_sleeps_per_send"] = t["relay_sleeps_per_send"] - u["relay_sleeps_per_send"]
        if "strace" in u and "strace" in t:
            for k in ("epoll_waits_per_send", "timer_wakeups_per_send"):
                extra[k] = t["strace"][k] - u["strace"][k]
        result["scheduler"]["throttled_minus_unthrottled"] = extra
        print(f"\nsluiced CPU per 10,000 sends: {u['cpu_s'] / sends * 10000:.2f} s unthrottled, "
              f"{t['cpu_s'] / sends * 10000:.2f} s throttled.  Throttled minus unthrottled, "
              "per send: " + ", ".join(f"{k} {v:+.2f}" for k, v in extra.items()) + ".")
        print(f"CPU is utime + stime at {TICK} Hz; the epoll_wait, timer and syscall columns "
              "come from a second, untimed pass under strace (relay thread only).")
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        shutil.copy(json_path, base / "relay.json")
        say(f"results in {json_path}")
    finally:
        for s in reversed(started):
            try:
                s.stop()
            except Exception as e:  # keep stopping the others
                say(f"stopping {s.name if hasattr(s, 'name') else s}: {e}")
        if os.environ.get("BENCH_KEEP") == "1":
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
