#!/usr/bin/python3
"""The relay at a large deferred backlog: sluiced and Postfix side by side.

usage: bench/run_queue_scale.py BUILD

One lane to a smarthost that answers 450 to every RCPT (Postfix's `smtp-sink -r rcpt`),
a first retry two hours away, and messages of one recipient (BENCH_SIZE, default 1024
bytes).  For each backlog N in BENCH_BACKLOGS (default "10000,100000,1000000"), for each
server:

  build      sluice: N committed files written straight into a new queue directory
             (bench/queue_fill.py) before sluiced starts.  Postfix: N messages through
             smtp-source into smtpd, put on hold there, then (Postfix stopped) moved to
             the deferred queue with `postsuper -H ALL`.  Timed, reported apart.
  serve      time from exec (sluiced, or `postfix start`) to the intake or smtpd
             answering EHLO.
  first try  time from the same exec until every one of the N recipients was tried
             once: sluice's `sluice stats --json` relay counters (deferred + failed +
             delivered), Postfix's maillog lines `status=deferred (host ...` (Postfix is
             also told `postqueue -f`, since its files would otherwise wait for their
             time stamps).  ms per try = that time / N, and its ratio to the smallest
             backlog's.
  memory     sluiced's VmRSS and VmHWM after the first tries, and VmRSS / N.  Postfix:
             qmgr's VmRSS, and the proportional set size (Pss) of every process under
             master, / N.
  fresh      BENCH_FRESH (default 2000) new messages through smtp-source, the backlog
             waiting: their rate from the start of smtp-source to the last one's first
             try, over the same measured on an empty queue (once per server).  The
             first tries' writes are flushed (`sync`, untimed) before: a backlog that
             waits has long been written back, and the intake's syncfs() would
             otherwise pay for the wave of first tries that just ended.
  restart    sluice: kill -9, start, count the recipients tried in the next BENCH_AFTER
             (default 30) seconds; then SIGTERM, start, count again.  Postfix: `postfix
             stop; postfix start`, count.  No recipient is due for two hours, so the
             count should be 0.

Before each backlog past the first, the time the server would take (build and first
tries) is estimated from its previous rows; past BENCH_BUDGET seconds (default 1200; 0
never skips) that server skips the size, and the table says so with the estimate.  A
first-try phase that has not finished after BENCH_TRY_TIMEOUT seconds (default 3600) is
reported as partial (tries made, lower bound of the cost) and its fresh-mail step skipped.

Prints a table and PASS/FAIL per target on stdout, progress on stderr, and writes the
figures to BENCH_JSON (default BUILD/bench/queue_scale.json).  Exits non-zero only when
the harness itself fails, never for a missed target.

Environment: BENCH_BACKLOGS, BENCH_SERVERS ("sluice,postfix"), BENCH_FRESH, BENCH_AFTER,
BENCH_SIZE, BENCH_CONNECTIONS (default 4: sluice's `connections`, Postfix's
default_destination_concurrency_limit), BENCH_BUDGET, BENCH_TRY_TIMEOUT, BENCH_NICE
(default 10), BENCH_DIR (default /var/tmp), BENCH_JSON, BENCH_KEEP=1 (keep the directory).
"""

import json
import math
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "func"))
sys.path.insert(0, str(HERE))
import conftest  # noqa: E402  (the Postfix instance and helpers of the functional tests)
import queue_fill  # noqa: E402
import harness  # noqa: E402
from harness import env_int, tree_cpu  # noqa: E402

SMTP_SOURCE = conftest.SMTP_SOURCE
SMTP_SINK = conftest.SMTP_SINK
POSTSUPER = shutil.which("postsuper", path="/usr/sbin:/usr/bin") or "/usr/sbin/postsuper"
POSTCONF = shutil.which("postconf", path="/usr/sbin:/usr/bin") or "/usr/sbin/postconf"
SENDER = "bench@sender.example"
FRESH_RCPT = "fresh@dest.example"
BACKLOG_RCPT = "backlog@dest.example"
POLL = 0.2


class HarnessError(Exception):
    """The benchmark could not run (not a missed target)."""


def say(*a):
    print("run_queue_scale:", *a, file=sys.stderr, flush=True)


# ---- probes -----------------------------------------------------------------------------

def ehlo_ok(port, timeout=2.0):
    """True when 127.0.0.1:port greets and answers EHLO with a final 250 line."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            f = s.makefile("rb")
            line = f.readline()
            while line[3:4] == b"-":
                line = f.readline()
            if not line.startswith(b"220"):
                return False
            s.sendall(b"EHLO probe.bench.test\r\n")
            line = f.readline()
            while line[3:4] == b"-":
                line = f.readline()
            ok = line.startswith(b"250")
            s.sendall(b"QUIT\r\n")
            return ok
    except OSError:
        return False


def wait_serving(port, t0, alive, timeout):
    """Seconds from t0 (monotonic) to the first EHLO answered on port."""
    deadline = t0 + timeout
    while True:
        if ehlo_ok(port):
            return time.monotonic() - t0
        if not alive():
            raise HarnessError(f"the server on port {port} exited before it answered EHLO")
        if time.monotonic() > deadline:
            raise HarnessError(f"nothing answered EHLO on port {port} after {timeout} s")
        time.sleep(0.01)


def status_kib(pid, keys=("VmRSS", "VmHWM")):
    out = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k, _, v = line.partition(":")
            if k in keys:
                out[k] = int(v.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def pss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def process_tree(root):
    """(pid, comm) of root and every process under it."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True,
                         text=True).stdout
    kids, comm = {}, {}
    for line in out.splitlines():
        p, pp, c = line.split(None, 2)
        kids.setdefault(int(pp), []).append(int(p))
        comm[int(p)] = c.strip()
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        found.append((p, comm.get(p, "?")))
        todo += kids.get(p, [])
    return found


class LineCounter:
    """Counts lines holding a pattern in a growing log file, from a mark on."""

    def __init__(self, path, pattern):
        self.path = pathlib.Path(path)
        self.pattern = pattern
        self.mark()

    def mark(self):
        try:
            self.offset = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = 0
        self.rest = b""
        self.n = 0

    def count(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.n
        self.offset += len(chunk)
        lines = (self.rest + chunk).split(b"\n")
        self.rest = lines.pop()
        self.n += sum(1 for x in lines if self.pattern in x)
        return self.n


def smtp_source(port, count, size, conc, rcpt):
    cmd = [SMTP_SOURCE, "-s", str(conc), "-m", str(count), "-l", str(size),
           "-f", SENDER, "-t", rcpt, f"127.0.0.1:{port}"]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def source_done(p, timeout):
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0 or err.strip():
        raise HarnessError(f"smtp-source failed ({p.returncode}): {err[:500]}")


def wait_tries(tries, want, t0, timeout, what, progress=True):
    """Polls tries() until it reaches want; returns (seconds from t0, tries seen, done)."""
    deadline = time.monotonic() + timeout
    last_say = time.monotonic()
    while True:
        n = tries()
        now = time.monotonic()
        if n >= want:
            return now - t0, n, True
        if now > deadline:
            say(f"{what}: {n} of {want} after {timeout} s: giving up on this phase")
            return now - t0, n, False
        if progress and now - last_say > 30:
            say(f"{what}: {n} of {want} after {now - t0:.0f} s")
            last_say = now
        time.sleep(POLL)


# ---- the sink ---------------------------------------------------------------------------

class Sink:
    """smtp-sink answering 450 to every RCPT (-r rcpt, which also turns off PIPELINING)."""

    def __init__(self, base):
        self.port = conftest.free_port()
        self.err = open(base / "smtp-sink.log", "ab")
        self.proc = subprocess.Popen([SMTP_SINK, "-u", "nobody", "-r", "rcpt",
                                      f"127.0.0.1:{self.port}", "1000"],
                                     stdin=subprocess.DEVNULL, stdout=self.err,
                                     stderr=subprocess.STDOUT)
        conftest.wait_until(lambda: conftest.tcp_listening("127.0.0.1", self.port) or
                            self.proc.poll() is not None, 10, "smtp-sink to listen")
        if self.proc.poll() is not None:
            raise HarnessError("smtp-sink exited at once (see smtp-sink.log)")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.err.close()


# ---- sluice -----------------------------------------------------------------------------

class Sluice(harness.Sluiced):
    name = "sluice"

    def __init__(self, build, base, label, sink, conns):
        d = base / f"sluice-{label}"
        self.qdir = d / "queue"
        self.port = conftest.free_port()
        super().__init__(build, d, conftest.root_user_line() + f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "{d}";
log {{ target = "stderr"; level = "info"; }}
control {{ listen = "unix:{d}/control.sock"; }}
intake {{ listen = "inet:127.0.0.1:{self.port}"; hostname = "relay.bench.test"; max_sessions = 2000; }}
queue {{ dir = "{self.qdir}"; }}
relay {{ retry {{ min = 2h; max = 4h; }} }}
route "sink" {{
  domains = ["*"];
  smarthost = "[127.0.0.1]:{sink.port}";
  tls = "none";
  connections = {conns};
}}
""", "run_queue_scale", error=HarnessError)

    def fill(self, n, size):
        t0 = time.monotonic()
        res = queue_fill.fill(self.qdir, n, size,
                              progress=lambda k, s: say(f"sluice backlog: {k} files in {s:.0f} s"))
        res["seconds"] = time.monotonic() - t0
        return res

    def start(self, timeout):
        """Starts sluiced; returns the seconds from exec to the intake answering EHLO."""
        return super().start(lambda: ehlo_ok(self.port), timeout, interval=0.01)

    def cli(self, *args, timeout=120):
        return super().cli(*args, timeout=timeout)

    def relay_stats(self):
        return json.loads(self.cli("stats", "--json"))["relay"]

    def tries(self):
        """Recipients tried since this sluiced started (each try ends in one of these)."""
        if not self.alive():
            raise HarnessError(f"sluiced exited ({self.proc.returncode})\n--- sluiced.log "
                               f"---\n{self.log_tail()}")
        st = self.relay_stats()
        return st["deferred"] + st["failed"] + st["delivered"]

    def memory(self, n):
        kib = status_kib(self.proc.pid)
        rss = kib.get("VmRSS", 0) * 1024
        return {"rss": rss, "hwm": kib.get("VmHWM", 0) * 1024,
                "bytes_per_msg": rss / n if n else None}

    def kill9(self):
        self.proc.kill()
        self.proc.wait(60)

    def stop(self, timeout=60):
        """SIGTERM, and the exit status; SIGKILL past timeout (then None)."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        t0 = time.monotonic()
        rc = super().stop(timeout)
        if rc is None:
            say(f"sluiced did not stop {timeout} s after SIGTERM: killed")
        self.stop_s = time.monotonic() - t0
        return rc

    def close(self):
        if self.alive():
            self.stop()
        super().stop()  # closes the log


# ---- Postfix ----------------------------------------------------------------------------

class Postfix:
    name = "Postfix"

    def __init__(self, base, label, sink, conns):
        d = base / f"postfix-{label}"
        d.mkdir()
        os.chmod(d, 0o755)
        # conftest.Postfix starts an smtp-sink of its own too; it stays idle.
        self.pf = conftest.Postfix(d, None, {
            "relayhost": f"[127.0.0.1]:{sink.port}",
            "default_destination_concurrency_limit": str(conns),
            "smtp_tls_security_level": "none",
            "smtpd_client_connection_count_limit": "0",
            "smtpd_client_message_rate_limit": "0",
            "smtpd_client_connection_rate_limit": "0",
            "queue_run_delay": "300s",          # Postfix's default
            "minimal_backoff_time": "2h",
            "maximal_backoff_time": "4h",
        })
        self.env = conftest.Postfix._env()
        self.tries_log = LineCounter(self.pf.maillog.path, b" status=deferred (host ")
        self.started = False

    @property
    def port(self):
        return self.pf.port

    def count(self, queue):
        return sum(len(files) for _, _, files in os.walk(self.pf.queue_dir / queue))

    def run(self, *cmd, timeout=600):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=self.env)
        if res.returncode != 0:
            raise HarnessError(f"{' '.join(map(str, cmd))} exited {res.returncode}: "
                               f"{res.stderr}\n--- maillog ---\n{self.pf.maillog.tail()}")
        return res.stdout

    def postconf(self, setting):
        self.run(POSTCONF, "-c", str(self.pf.config_dir), "-e", setting)

    def first_start(self):
        self.pf.start()
        self.started = True

    def fill(self, n, size):
        """n messages through smtpd, held, then moved to the deferred queue while Postfix
        is stopped (so that none is tried before the timed start)."""
        t0 = time.monotonic()
        self.pf.main["smtpd_data_restrictions"] = "check_client_access static:HOLD"
        self.first_start()
        src = smtp_source(self.port, n, size, 20, BACKLOG_RCPT)
        last = time.monotonic()
        while src.poll() is None:
            time.sleep(1)
            if time.monotonic() - last > 30:
                say(f"Postfix backlog: {self.count('hold')} of {n} held after "
                    f"{time.monotonic() - t0:.0f} s")
                last = time.monotonic()
        source_done(src, 60)
        conftest.wait_until(lambda: self.count("hold") >= n, 600, f"{n} messages on hold", 0.5)
        t_smtp = time.monotonic() - t0
        self.stop()
        # postsuper logs to maillog_file itself while postlogd is down, as mail_owner
        if self.pf.maillog.path.exists():
            shutil.chown(self.pf.maillog.path, user=self.pf.main["mail_owner"])
        self.run(POSTSUPER, "-c", str(self.pf.config_dir), "-H", "ALL")
        conftest.wait_until(lambda: self.count("deferred") >= n, 600,
                            f"{n} messages in the deferred queue", 0.5)
        # A deferred file's time stamp is the time of its next attempt: a minute ago,
        # so that qmgr's first scan of the deferred queue at start takes them all (as
        # sluiced takes its whole queue at start).  postqueue -f would do it too, but it
        # also takes again the messages already tried by then.
        then = time.time() - 60
        for d, _, files in os.walk(self.pf.queue_dir / "deferred"):
            for f in files:
                os.utime(os.path.join(d, f), (then, then))
        self.postconf("smtpd_data_restrictions =")
        return {"seconds": time.monotonic() - t0, "smtp_s": t_smtp}

    def alive(self):
        pid = self.pf.master_pid()
        try:
            return bool(pid) and os.kill(pid, 0) is None
        except ProcessLookupError:
            return False

    def start(self, timeout):
        """`postfix start`; returns the seconds to smtpd's answer to EHLO."""
        self.t_exec = time.monotonic()
        proc = subprocess.Popen([conftest.POSTFIX, "-c", str(self.pf.config_dir), "start"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=self.env)
        self.started = True
        s = wait_serving(self.port, self.t_exec,
                         lambda: proc.poll() in (None, 0), timeout)
        out = proc.communicate(timeout=timeout)[0]
        if proc.returncode != 0:
            raise HarnessError(f"postfix start exited {proc.returncode}: {out}")
        return s

    def tries(self):
        return self.tries_log.count()

    def mark(self):
        self.tries_log.mark()

    def cpu(self):
        pid = self.pf.master_pid()
        return tree_cpu(pid) if pid else 0.0

    def memory(self, n):
        pid = self.pf.master_pid()
        procs = process_tree(pid) if pid else []
        qmgr = [p for p, c in procs if c == "qmgr"]
        rss = status_kib(qmgr[0]).get("VmRSS", 0) * 1024 if qmgr else 0
        pss = sum(pss_kib(p) for p, _ in procs) * 1024
        return {"qmgr_rss": rss, "pss_total": pss, "processes": len(procs),
                "bytes_per_msg": pss / n if n else None}

    def stop(self):
        pid = self.pf.master_pid()
        self.pf.postfix_cmd("stop", check=False)
        if pid:
            def gone():
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return True
                return False
            try:
                conftest.wait_until(gone, 60, "the Postfix master to exit")
            except AssertionError:
                os.kill(pid, signal.SIGKILL)
        self.started = False

    def close(self):
        if self.started:
            self.stop()
        if self.pf.sink is not None and self.pf.sink.poll() is None:
            self.pf.sink.terminate()
            self.pf.sink.wait(10)


# ---- the phases -------------------------------------------------------------------------

def fresh_rate(server, m, size, timeout):
    """m new messages through the server's SMTP port: their rate from the start of
    smtp-source to the last one's first try, and smtp-source's own time."""
    base = server.tries()
    t0 = time.monotonic()
    src = smtp_source(server.port, m, size, 10, FRESH_RCPT)
    ended = []
    waiter = threading.Thread(target=lambda: ended.append((src.wait(), time.monotonic())),
                              daemon=True)
    waiter.start()
    secs, n, done = wait_tries(lambda: server.tries() - base, m, t0, timeout,
                               f"{server.name} fresh mail")
    waiter.join(600)
    source_done(src, 60)
    inject = ended[0][1] - t0 if ended else None
    return {"messages": m, "seconds": secs, "tried": n, "complete": done,
            "per_s": n / secs if secs > 0 else None, "inject_s": inject}


def baseline(server_cls, args, fresh, size, timeout):
    """Start on an empty queue: time to serve, memory, fresh mail rate."""
    s = server_cls(*args)
    try:
        if isinstance(s, Postfix):
            s.first_start()
            s.stop()
            s.mark()
        serve = s.start(120)
        if isinstance(s, Postfix):
            s.mark()
        time.sleep(1)
        f = fresh_rate(s, fresh, size, timeout)
        mem = s.memory(0)
        say(f"{s.name} on an empty queue: serves after {serve:.2f} s, {fresh} fresh "
            f"messages tried at {f['per_s']:.0f}/s")
        return {"serve_s": serve, "fresh": f, "memory": mem}
    finally:
        s.close()


def run_size(server, n, size, fresh, after, timeout, empty_rate):
    """One server at one backlog: build, start, first tries, memory, fresh mail, restart."""
    row = {"n": n, "server": server.name}
    say(f"{server.name}, backlog {n}: building")
    row["build"] = server.fill(n, size)
    say(f"{server.name}, backlog {n}: built in {row['build']['seconds']:.1f} s")
    if isinstance(server, Postfix):
        server.mark()
    row["serve_s"] = server.start(max(600, timeout))
    c0 = server.cpu()
    say(f"{server.name}, backlog {n}: serving after {row['serve_s']:.2f} s")
    secs, tried, done = wait_tries(server.tries, n, server.t_exec, timeout,
                                   f"{server.name} first tries of {n}")
    row["first_try"] = {"seconds": secs, "tried": tried, "complete": done,
                        "ms_per_try": secs / max(tried, 1) * 1000,
                        "cpu_s": server.cpu() - c0}
    say(f"{server.name}, backlog {n}: {tried} tried in {secs:.1f} s "
        f"({row['first_try']['ms_per_try']:.3f} ms per try)")
    time.sleep(1)  # the last status writes
    row["memory"] = server.memory(n)
    # The first tries left the backlog's status bytes, attempt logs and retry records
    # dirty in the page cache; the kernel writes them within 30 s, and until then the
    # intake's group commit (one syncfs) would pay for them.  A backlog that waits is
    # past that: flush once, untimed, so that the fresh mail meets the steady state.
    subprocess.run(["sync"], check=False)
    if done:
        f = fresh_rate(server, fresh, size, max(300, timeout / 4))
        f["ratio"] = f["per_s"] / empty_rate if f["per_s"] and empty_rate else None
        row["fresh"] = f
        say(f"{server.name}, backlog {n}: fresh mail {f['per_s']:.0f}/s"
            + (f" ({f['ratio']:.2f} of the empty queue's)" if f["ratio"] else ""))
    else:
        row["fresh"] = {"skipped": "the first tries did not finish"}
    row["restart"] = restarts(server, after)
    return row


def restarts(server, after):
    out = []
    if isinstance(server, Sluice):
        ways = (("kill -9", server.kill9), ("SIGTERM", server.stop))
    else:
        ways = (("postfix stop", server.stop),)
    for how, stop in ways:
        t0 = time.monotonic()
        rc = stop()
        stop_s = time.monotonic() - t0
        if isinstance(server, Postfix):
            server.mark()
        serve = server.start(600)
        left = server.t_exec + after - time.monotonic()
        if left > 0:
            time.sleep(left)
        n = server.tries()
        r = {"stop": how, "stop_s": stop_s, "exit": rc, "serve_s": serve,
             "after_s": after, "retried": n}
        say(f"{server.name}: after {how} and a start, {n} recipients tried within "
            f"{after} s (serving after {serve:.2f} s)")
        out.append(r)
    return out


def estimate(rows, n):
    """Seconds the build and the first tries of backlog n would take, from earlier rows:
    the per-try cost scaled as it grew between the last two rows (cost ~ N^k, k in 0..2),
    the build linear in N."""
    done = [r for r in rows if "first_try" in r]
    if not done:
        return None
    last = done[-1]
    cost = last["first_try"]["seconds"] / max(last["first_try"]["tried"], 1)
    k = 0.0
    if len(done) >= 2 and all(r["first_try"]["complete"] for r in done[-2:]):
        a, b = done[-2], done[-1]
        ca = a["first_try"]["seconds"] / a["n"]
        cb = b["first_try"]["seconds"] / b["n"]
        if ca > 0 and cb > 0 and b["n"] != a["n"]:
            k = min(2.0, max(0.0, math.log(cb / ca) / math.log(b["n"] / a["n"])))
    tries = n * cost * (n / last["n"]) ** k
    build = last["build"]["seconds"] * n / last["n"]
    return {"seconds": tries + build, "first_try_s": tries, "build_s": build, "k": k}


# ---- report -----------------------------------------------------------------------------

def fmt(x, spec, none=""):
    return none if x is None else format(x, spec)


def report(result, targets):
    rows = result["rows"]
    p = result["params"]
    print(f"Relay at a deferred backlog: one lane, {p['connections']} connections, to "
          f"smtp-sink -r rcpt (450 to every RCPT), retry in 2 h, {p['size']}-byte "
          f"messages of 1 recipient; {result['cpus']} CPUs, load average "
          f"{result['loadavg']['start'][0]:.2f} -> {result['loadavg']['end'][0]:.2f}.\n")
    print("| backlog | server | build s | start→EHLO s | first tries s | ms/try | × smallest "
          "| CPU ms/try | fresh msg/s | fresh ratio | retried after restart | RSS MiB "
          "| B/msg |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("sluice", "Postfix"):
        base = result["empty"].get(name)
        if base:
            mem = base["memory"]
            rss = mem.get("rss", mem.get("pss_total", 0))
            print(f"| 0 | {name} | | {base['serve_s']:.2f} | | | | | "
                  f"{fmt(base['fresh']['per_s'], '.0f')} | 1 | | {rss / 2**20:.1f} | |")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['n']} | {r['server']} | skipped: {r['skipped']} |"
                  + " |" * 11)
            continue
        ft = r["first_try"]
        part = "" if ft["complete"] else f" ({ft['tried']} of {r['n']})"
        fr = r["fresh"]
        mem = r["memory"]
        rss = mem.get("rss", mem.get("pss_total", 0))
        rs = " / ".join(str(x["retried"]) for x in r["restart"])
        print(f"| {r['n']} | {r['server']} | {r['build']['seconds']:.1f} | "
              f"{r['serve_s']:.2f} | {ft['seconds']:.1f}{part} | {ft['ms_per_try']:.3f} | "
              f"{fmt(r.get('cost_ratio'), '.2f')} | "
              f"{ft['cpu_s'] / max(ft['tried'], 1) * 1000:.3f} | "
              f"{fmt(fr.get('per_s'), '.0f', 'n/a')} | {fmt(fr.get('ratio'), '.2f', 'n/a')} | "
              f"{rs} | {rss / 2**20:.1f} | {fmt(mem.get('bytes_per_msg'), '.0f')} |")
    print("\nfirst tries: from exec (sluiced, `postfix start`) to the last of the N tried; "
          "× smallest: ms/try over the same server's smallest backlog's.  Restart: sluice "
          "kill -9 / SIGTERM, Postfix stop+start, recipients tried in the "
          f"{p['after']} s after the start.  RSS: sluiced's VmRSS; Postfix: the Pss of "
          "all its processes (qmgr's RSS in the JSON).  Build: sluice writes the files, "
          "Postfix takes them through smtpd (its own row, not comparable).")
    for r in rows:
        if r.get("estimate") and "skipped" in r:
            e = r["estimate"]
            print(f"{r['server']} at {r['n']}: estimated {e['seconds'] / 60:.0f} min "
                  f"(build {e['build_s']:.0f} s + first tries {e['first_try_s']:.0f} s, "
                  f"cost ~ N^{e['k']:.2f}) > BENCH_BUDGET: skipped")
    print()
    for t in targets:
        print(f"{'PASS' if t['pass'] else 'FAIL'}  {t['server']} {t['n']}: {t['what']} "
              f"({t['value']})")


def evaluate(rows):
    """Targets per row: sluice's are the goal; Postfix's are shown for reference."""
    out = []
    largest, smallest = {}, {}
    for r in rows:
        if "skipped" not in r:
            largest[r["server"]] = max(largest.get(r["server"], 0), r["n"])
            smallest[r["server"]] = min(smallest.get(r["server"], r["n"]), r["n"])
    for r in rows:
        if "skipped" in r:
            continue
        who = r["server"] + ("" if r["server"] == "sluice" else " (reference)")
        ft = r["first_try"]
        if r.get("cost_ratio") is not None and r["n"] == largest[r["server"]] \
                and r["n"] != smallest[r["server"]]:
            out.append({"server": who, "n": r["n"], "what": "ms per first try ≤ 1.5 × the "
                        "smallest backlog's", "value": f"{r['cost_ratio']:.2f}×"
                        + ("" if ft["complete"] else ", a lower bound"),
                        "pass": ft["complete"] and r["cost_ratio"] <= 1.5})
        fr = r["fresh"]
        out.append({"server": who, "n": r["n"], "what": "fresh mail rate ≥ 0.8 × the empty "
                    "queue's", "value": fmt(fr.get("ratio"), ".2f", "not measured"),
                    "pass": bool(fr.get("ratio") and fr["ratio"] >= 0.8)})
        worst = max(x["retried"] for x in r["restart"])
        out.append({"server": who, "n": r["n"], "what": "nothing retried before its time "
                    "after a restart", "value": " / ".join(f"{x['retried']} after "
                                                          f"{x['stop']}" for x in r["restart"]),
                    "pass": worst == 0})
        if r["n"] == largest[r["server"]]:
            b = r["memory"].get("bytes_per_msg")
            out.append({"server": who, "n": r["n"], "what": "memory ≤ 1024 B per queued "
                        "message", "value": f"{b:.0f} B", "pass": b is not None and b <= 1024})
    return out


# ---- main -------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    build = pathlib.Path(sys.argv[1]).resolve()
    servers = [s.strip().lower() for s in
               os.environ.get("BENCH_SERVERS", "sluice,postfix").split(",") if s.strip()]
    need = [build / "src/daemon/sluiced", build / "src/cli/sluice", pathlib.Path(SMTP_SINK)]
    if "sluice" in servers or "postfix" in servers:
        need.append(pathlib.Path(SMTP_SOURCE))
    if "postfix" in servers:
        need += [pathlib.Path(conftest.POSTFIX), pathlib.Path(POSTSUPER)]
        if os.geteuid() != 0:
            raise SystemExit("run_queue_scale: a private Postfix instance needs root "
                             "(or BENCH_SERVERS=sluice)")
    for p in need:
        if not p.exists():
            raise SystemExit(f"run_queue_scale: {p} is missing")
    backlogs = [int(x) for x in
                os.environ.get("BENCH_BACKLOGS", "10000,100000,1000000").split(",") if x]
    fresh = env_int("BENCH_FRESH", 2000)
    after = env_int("BENCH_AFTER", 30)
    size = env_int("BENCH_SIZE", 1024)
    conns = env_int("BENCH_CONNECTIONS", 4)
    budget = env_int("BENCH_BUDGET", 1200)
    timeout = env_int("BENCH_TRY_TIMEOUT", 3600)
    os.nice(env_int("BENCH_NICE", 10))
    json_path = pathlib.Path(os.environ.get("BENCH_JSON",
                                            str(build / "bench/queue_scale.json")))
    base = pathlib.Path(tempfile.mkdtemp(prefix="sluice-bench-queue.",
                                         dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    os.chmod(base, 0o755)
    result = {"benchmark": "queue_scale", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "cpus": os.cpu_count(), "kernel": " ".join(os.uname()[2:4]),
              "params": {"backlogs": backlogs, "servers": servers, "fresh": fresh,
                         "after": after, "size": size, "connections": conns,
                         "budget": budget, "try_timeout": timeout},
              "loadavg": {"start": os.getloadavg()}, "empty": {}, "rows": []}
    say(f"working in {base}")
    sink = None
    live = []
    t_start = time.monotonic()
    try:
        conftest.raise_fd_limit()
        sink = Sink(base)
        kinds = {"sluice": (Sluice, lambda label: (build, base, label, sink, conns)),
                 "postfix": (Postfix, lambda label: (base, label, sink, conns))}
        for s in servers:
            cls, args = kinds[s]
            result["empty"][cls.name] = baseline(cls, args("empty"), fresh, size, 600)
        for n in backlogs:
            for s in servers:
                cls, args = kinds[s]
                mine = [r for r in result["rows"] if r["server"] == cls.name]
                est = estimate(mine, n)
                if est and budget and est["seconds"] > budget:
                    say(f"{cls.name}, backlog {n}: estimated {est['seconds']:.0f} s, over "
                        f"BENCH_BUDGET={budget}: skipped")
                    result["rows"].append({"n": n, "server": cls.name, "estimate": est,
                                           "skipped": f"estimated {est['seconds'] / 60:.0f} min"})
                    continue
                t0 = time.monotonic()
                srv = cls(*args(str(n)))
                live.append(srv)
                try:
                    row = run_size(srv, n, size, fresh, after, timeout,
                                   result["empty"][cls.name]["fresh"]["per_s"])
                finally:
                    srv.close()
                    live.remove(srv)
                    if os.environ.get("BENCH_KEEP") != "1":
                        shutil.rmtree(srv.dir if isinstance(srv, Sluice) else srv.pf.dir,
                                      ignore_errors=True)
                row["estimate"] = est
                row["wall_s"] = time.monotonic() - t0
                first = next((r for r in mine if "first_try" in r), None)
                row["cost_ratio"] = (row["first_try"]["ms_per_try"] /
                                     first["first_try"]["ms_per_try"]) if first else 1.0
                result["rows"].append(row)
                say(f"{cls.name}, backlog {n}: done in {row['wall_s']:.0f} s")
        result["loadavg"]["end"] = os.getloadavg()
        result["wall_s"] = time.monotonic() - t_start
        targets = evaluate(result["rows"])
        result["targets"] = targets
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        report(result, targets)
        say(f"results in {json_path}; the whole run took {result['wall_s'] / 60:.1f} min")
    except (HarnessError, AssertionError, subprocess.TimeoutExpired) as e:
        say(f"FAILED: {e}")
        sys.exit(2)
    finally:
        for s in live:
            try:
                s.close()
            except Exception as e:  # keep stopping the others
                say(f"stopping {s.name}: {e}")
        if sink:
            sink.stop()
        if os.environ.get("BENCH_KEEP") == "1":
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
