"""What the Python benchmarks share: sluiced started from a build directory on a
configuration of the benchmark's, its control client, its log, and reading /proc.

Every benchmark starts its daemons with ``Sluiced``: it writes the configuration (mode
0600, as sluiced wants), runs ``BUILD/src/daemon/sluiced -c CONF`` with its output
appended to a log file in the same directory, waits until a condition of the caller's
says the daemon serves (``tcp_listening(port)``, a socket file, EHLO answered) while
checking that it is still alive, runs ``BUILD/src/cli/sluice`` on its control socket,
and stops it.  A failure raises the caller's error class (SystemExit by default, so a
benchmark ends with the message and sluiced's last log lines).

Nothing here needs pytest: the benchmarks that drive a private Postfix import the
functional tests' conftest.py themselves.
"""

import os
import pathlib
import socket
import subprocess
import time

TICK = os.sysconf("SC_CLK_TCK")


def env_int(name, default):
    """The integer in environment variable name, or default."""
    return int(os.environ.get(name, str(default)))


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_listening(port, host="127.0.0.1"):
    """A condition for Sluiced.start(): true once host:port accepts a connection."""
    def listening():
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            return False
    return listening


# ---- /proc ------------------------------------------------------------------------------

def proc_cpu(path, children=False):
    """utime + stime (+ cutime + cstime) in seconds from a /proc/.../stat file."""
    try:
        text = open(path).read()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    f = text[text.rindex(")") + 2:].split()
    ticks = int(f[11]) + int(f[12])  # utime, stime (fields 14 and 15)
    if children:
        ticks += int(f[13]) + int(f[14])  # cutime, cstime
    return ticks / TICK


def tree_cpu(root):
    """CPU seconds of a process tree: every live process under root (root included), and
    the children root has reaped (its cutime/cstime)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True,
                         text=True).stdout
    kids = {}
    for line in out.splitlines():
        p, pp = (int(x) for x in line.split())
        kids.setdefault(pp, []).append(p)
    total, todo = 0.0, [root]
    while todo:
        p = todo.pop()
        total += proc_cpu(f"/proc/{p}/stat", children=True)
        todo += kids.get(p, [])
    return total


# ---- sluiced ----------------------------------------------------------------------------

class Sluiced:
    """sluiced of build in directory (created if need be), on configuration text config.

    prog prefixes the messages of the errors raised (error, SystemExit by default);
    conf_name and log_name are the files' names in directory.  Nothing runs before
    start()."""

    def __init__(self, build, directory, config, prog, error=SystemExit,
                 conf_name="sluice.conf", log_name="sluiced.log"):
        self.build = pathlib.Path(build)
        self.dir = pathlib.Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / conf_name
        self.log = self.dir / log_name
        self.control = self.dir / "control.sock"
        self.prog = prog
        self.error = error
        self.proc = None
        self.t_exec = None
        self._logf = None
        self.write_config(config)

    def write_config(self, text):
        """Replaces the configuration file (read at start and at `sluice reload`)."""
        self.conf.write_text(text)
        self.conf.chmod(0o600)

    def _fail(self, what):
        return self.error(f"{self.prog}: {what}\n--- {self.log.name} ---\n{self.log_tail()}")

    def start(self, ready=None, timeout=15, interval=0.02):
        """Runs sluiced; with ready (a function), asks it every interval seconds, up to
        timeout seconds, until it returns true, failing at once when sluiced exits.
        Returns the seconds from exec to ready (to the exec without it).  A sluiced that
        does not serve in time is stopped before the error is raised."""
        if self._logf is None:
            self._logf = open(self.log, "ab")
        self.t_exec = time.monotonic()
        self.proc = subprocess.Popen([str(self.build / "src/daemon/sluiced"), "-c",
                                      str(self.conf)],
                                     stdin=subprocess.DEVNULL, stdout=self._logf,
                                     stderr=subprocess.STDOUT)
        if ready is not None:
            while not ready():
                if not self.alive():
                    raise self._fail(f"sluiced exited ({self.proc.returncode}) before it "
                                     "served")
                if time.monotonic() - self.t_exec > timeout:
                    self.stop()
                    raise self._fail(f"sluiced did not serve within {timeout} s (stopped)")
                time.sleep(interval)
        return time.monotonic() - self.t_exec

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid

    def log_tail(self, n=30):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except FileNotFoundError:
            return ""

    def cli(self, *args, timeout=60):
        """`sluice -s CONTROL ARGS...`: its standard output; a non-zero exit fails."""
        res = subprocess.run([str(self.build / "src/cli/sluice"), "-s", str(self.control),
                              *args], capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise self._fail(f"sluice {' '.join(args)} exited {res.returncode}: "
                             f"{res.stdout}{res.stderr}")
        return res.stdout

    def cpu(self):
        """sluiced's CPU seconds so far (utime + stime)."""
        return proc_cpu(f"/proc/{self.proc.pid}/stat")

    def stop(self, timeout=60):
        """SIGTERM and its exit status; SIGKILL past timeout (then None).  The log is
        closed; start() may run sluiced again."""
        rc = self.proc.returncode if self.proc else None
        if self.alive():
            self.proc.terminate()
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
                rc = None
        if self._logf is not None:
            self._logf.close()
            self._logf = None
        return rc
