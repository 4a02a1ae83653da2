"""Fixtures for sluice's functional tests: real processes on loopback and unix sockets.

Everything a test needs is started here and stopped at teardown, in a private temporary
directory per test:

* ``sluiced(config_text)`` starts the daemon in the foreground with its log on stderr
  (captured to a file), waits until every socket named in ``listen = "..."`` is listening,
  and at teardown stops it with SIGTERM and asserts that it exited 0 and that its log holds
  no sanitizer report.
* ``postfix(milter=...)`` starts a private Postfix instance (own config_directory,
  queue_directory, data_directory, maillog_file) whose smtpd listens on a free loopback
  port, uses the given milter, and relays every message to a local smtp-sink that dumps
  each transaction to a file.  Nothing leaves the machine and /etc/postfix is never read
  for configuration.

The tests run as root (CI does).  The binaries come from $SLUICED and $SLUICE (set by
meson); run by hand, the defaults point at /work/main/build.  A test that needs the daemon
is skipped only when $SLUICED is unset and the default binary does not exist.
"""

import functools
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from peers import smtp_sink
from peers.smtp_sink import SMTP_SINK

HERE = pathlib.Path(__file__).resolve().parent
SOURCE_ROOT = HERE.parent.parent
SLUICED = os.environ.get("SLUICED") or str(SOURCE_ROOT / "build/src/daemon/sluiced")
SLUICE = os.environ.get("SLUICE") or str(SOURCE_ROOT / "build/src/cli/sluice")

SANITIZER_MARKERS = ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                     "WARNING: ThreadSanitizer", "ERROR: UndefinedBehaviorSanitizer")

# Every stage listed, so every stage is negotiated and answered.
ALL_STAGES = ("connect", "helo", "mail", "rcpt", "data", "header", "eoh", "body", "unknown")

# The `modify` block exactly as the interface specifies it (change_from is a one-element
# list there, like the other address keys).
INTERFACE_MODIFY_EXAMPLE = """modify { add_header = ["X-Sluice: yes"]; \
insert_header = ["0 X-First: 1"]; change_header = ["1 Subject: new"]; \
add_rcpt = ["<a@example.org>"]; add_rcpt_par = ["<b@example.org> NOTIFY=NEVER"]; \
del_rcpt = ["<c@example.org>"]; change_from = ["<new@example.org>"]; \
replace_body = "text"; quarantine = "reason"; }"""
SPEC_CHANGE_FROM = ["<new@example.org>"]



# A long scenario runs once, in the plain build: under ASan+UBSan (SLUICE_SANITIZE, set
# by tests/func/meson.build) the shorter tests go through the same code (CI time).
plain_only = pytest.mark.skipif(os.environ.get("SLUICE_SANITIZE", "none") != "none",
                                reason="a long scenario: run in the plain build only")

def modify_all():
    """Every modification the `modify` block can ask for (a fresh dict)."""
    return {
        "add_header": ["X-Sluice: yes", "X-Second: two"],
        "insert_header": ["0 X-First: 1"],
        "change_header": ["1 Subject: new"],
        "add_rcpt": ["<a@example.org>"],
        "add_rcpt_par": ["<b@example.org> NOTIFY=NEVER"],
        "del_rcpt": ["<c@example.org>"],
        "change_from": change_from_value(),
        "replace_body": "Replaced body.\r\n",
        "quarantine": "held by sluice",
    }


@functools.lru_cache(maxsize=None)
def change_from_value():
    """change_from as this sluiced takes it: the specified list, or else a plain string.

    If the daemon only takes the string, that mismatch with the interface fails one test
    (test_engine.py::test_config_check_accepts_the_interface_example) instead of every
    test that uses modifications, which then go on checking the modifications."""
    if not os.path.exists(SLUICED):
        return SPEC_CHANGE_FROM
    with tempfile.TemporaryDirectory(prefix="sluice-probe-") as d:
        path = os.path.join(d, "probe.conf")
        for value in (SPEC_CHANGE_FROM, SPEC_CHANGE_FROM[0]):
            with open(path, "w") as f:
                f.write(milter_config(modify={"change_from": value}).replace("@DIR@", d))
            res = subprocess.run([SLUICED, "-t", "-c", path], capture_output=True,
                                 timeout=30)
            if res.returncode == 0:
                return value
    return SPEC_CHANGE_FROM


# ---------------------------------------------------------------------------------------
# small utilities

def wait_until(predicate, timeout, what, interval=0.05):
    """Poll predicate() until it returns a true value (returned) or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unix_listening(path):
    """True when a unix stream socket bound to path is in the listening state.

    Read from /proc/net/unix, so the check opens no connection (a probe connection would
    be counted by the daemon and show up in its statistics)."""
    try:
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                fields = line.split()
                if len(fields) >= 8 and fields[7] == path and int(fields[3], 16) & 0x10000:
                    return True
    except FileNotFoundError:
        return os.path.exists(path)
    return False


def tcp_listening(host, port):
    """True when something listens on host:port (IPv4), read from /proc/net/tcp."""
    want = "%08X:%04X" % (int.from_bytes(socket.inet_aton(host), "little"), port)
    any_addr = "00000000:%04X" % port
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[1] in (want, any_addr):
                    return True
    except FileNotFoundError:
        with socket.socket() as s:
            return s.connect_ex((host, port)) == 0
    return False


def listen_addresses(config_text):
    """Every `listen = "..."` value in a configuration (string or list form), at the start
    of a line or inside a one-line block (`control { listen = "..."; }`)."""
    found = []
    for m in re.finditer(r'(?:^|[{;])\s*listen\s*[=:]?\s*(\[[^\]]*\]|"[^"]*")',
                         config_text, re.M):
        found += re.findall(r'"([^"]*)"', m.group(1))
    return found


def wait_listening(address, timeout, alive=lambda: True):
    if address.startswith(("unix:", "local:")):
        path = address.partition(":")[2]
        check = lambda: unix_listening(path)
    elif address.startswith("inet:") and "@" in address:    # libmilter's inet:PORT@HOST
        port, _, host = address[len("inet:"):].partition("@")
        check = lambda: tcp_listening(host.strip("[]"), int(port))
    elif address.startswith("inet:"):
        host, _, port = address[len("inet:"):].rpartition(":")
        check = lambda: tcp_listening(host or "127.0.0.1", int(port))
    else:
        return

    def ready():
        if not alive():
            raise AssertionError(f"process exited before {address} was listening")
        return check()
    wait_until(ready, timeout, f"{address} to listen")


class LogFile:
    """A log that grows while a test runs; waits look at text after a mark."""

    def __init__(self, path):
        self.path = pathlib.Path(path)

    def text(self):
        try:
            return self.path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def mark(self):
        """Current length: pass it as `after` to look only at lines written later."""
        return len(self.text())

    def lines(self, after=0):
        return self.text()[after:].splitlines()

    def search(self, pattern, after=0, flags=0):
        return re.search(pattern, self.text()[after:], flags | re.M)

    def findall(self, pattern, after=0, flags=0):
        return re.findall(pattern, self.text()[after:], flags | re.M)

    def wait_for(self, pattern, timeout=10, after=0, flags=0):
        """Wait for a regex match (multiline) and return the match object."""
        try:
            return wait_until(lambda: self.search(pattern, after, flags), timeout,
                              f"/{pattern}/ in {self.path}")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- {self.path} (tail) ---\n{self.tail()}") from None

    def tail(self, n=40):
        return "\n".join(self.text().splitlines()[-n:])


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# ---------------------------------------------------------------------------------------
# configuration helpers

def milter_config(reply=None, modify=None, milter_extra="", extra="", workers=2,
                  level="info", listen=None, mode=None, stats_interval="0"):
    """Text of a complete sluiced configuration; @DIR@ stands for the instance directory.

    reply: dict stage -> action (None: no reply block at all).
    modify: dict key -> value (str) or list of str (None: no modify block).
    """
    def q(value):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace(
            "\r", "\\r").replace("\n", "\\n").replace("\t", "\\t") + '"'

    listen = listen or "unix:@DIR@/milter.sock"
    if mode is None and listen.startswith("unix:"):
        mode = "0666"       # Postfix's smtpd runs as `postfix` and must connect
    lines = [f"workers = {workers};",
             f"stats_interval = {stats_interval};",
             f'log {{ target = "stderr"; level = "{level}"; }}',
             'control { listen = "unix:@DIR@/control.sock"; mode = "0660"; }',
             "milter {",
             f"  listen = {q(listen)};"]
    if mode:
        lines.append(f'  mode = "{mode}";')
    if milter_extra:
        lines += ["  " + l for l in milter_extra.strip().splitlines()]
    if reply is not None:
        lines.append("  reply {")
        lines += [f"    {stage} = {q(action)};" for stage, action in reply.items()]
        lines.append("  }")
    if modify is not None:
        lines.append("  modify {")
        for key, value in modify.items():
            if isinstance(value, (list, tuple)):
                lines.append(f"    {key} = [{', '.join(q(v) for v in value)}];")
            else:
                lines.append(f"    {key} = {q(value)};")
        lines.append("  }")
    lines.append("}")
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def all_stages(action="continue", **override):
    """A reply block that negotiates every stage, answering `action` unless overridden."""
    reply = {stage: action for stage in ALL_STAGES}
    reply.update(override)
    return reply


# ---------------------------------------------------------------------------------------
# sluiced

def ensure_user(name, groups=()):
    """The system user name (with a group of its own when it is sluice's), created when
    missing as `make run` does, and made a member of groups."""
    import grp
    import pwd
    try:
        pwd.getpwnam(name)
    except KeyError:
        own_group = ["--user-group"] if name == "sluice" else []
        subprocess.run(["useradd", "--system", *own_group, "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], check=True)
    for g in groups:
        if name not in grp.getgrnam(g).gr_mem:
            subprocess.run(["usermod", "-a", "-G", g, name], check=True)
    return pwd.getpwnam(name)


def root_user_line():
    """'user = "root";' when the tests run as root: sluiced, started as root, wants to be
    told whether to drop its privileges."""
    return 'user = "root";\n' if os.geteuid() == 0 else ""


def with_root_user(config_text):
    """The configuration with user = "root" added, when run as root and it names no user;
    added last, so that the line numbers of the test's own text stay as written."""
    if not root_user_line() or re.search(r"^user\s*=", config_text, re.M):
        return config_text
    return config_text + ("" if config_text.endswith("\n") else "\n") + root_user_line()


def with_own_state_dir(config_text, directory):
    """The configuration with state_dir set to the test's directory when it sets none:
    the default, /var/lib/sluice, belongs to the machine's sluiced (`make run`).  Added
    last, as with_root_user() does."""
    if re.search(r"^state_dir\s*=", config_text, re.M):
        return config_text
    return (config_text + ("" if config_text.endswith("\n") else "\n") +
            f'state_dir = "{directory}";\n')


class Sluiced:
    """One running sluiced and what a test needs to talk to it."""

    def __init__(self, directory, config_text, env=None, args=()):
        self.dir = pathlib.Path(directory)
        self.config_text = with_own_state_dir(
            with_root_user(config_text.replace("@DIR@", str(self.dir))), self.dir)
        self.config = self.dir / "sluiced.conf"
        self.config.write_text(self.config_text)
        self.config.chmod(0o600)  # it may hold a password: sluiced wants it private
        self.log = LogFile(self.dir / "sluiced.log")
        self.milter_socket = str(self.dir / "milter.sock")
        self.control_socket = str(self.dir / "control.sock")
        self.expected_rc = 0
        self.returncode = None
        self.env = dict(os.environ if env is None else env)
        self.args = list(args)
        self.proc = None

    # lifecycle --------------------------------------------------------------------------
    def start(self, timeout=15):
        logf = open(self.log.path, "ab")
        try:
            self.proc = subprocess.Popen([SLUICED, *self.args, "-c", str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, cwd=self.dir, env=self.env)
        finally:
            logf.close()
        try:
            for address in listen_addresses(self.config_text):
                wait_listening(address, timeout, alive=self.alive)
        except AssertionError as e:
            raise AssertionError(f"sluiced did not come up: {e}\n--- log ---\n"
                                 f"{self.log.tail()}") from None
        return self

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.returncode

    def stop(self, timeout=45):
        """SIGTERM and wait; returns the exit status (kills and fails on timeout)."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.returncode = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"sluiced did not exit within {timeout}s of SIGTERM"
                                     f"\n--- log ---\n{self.log.tail()}")
        else:
            self.returncode = self.proc.returncode
        return self.returncode

    def sanitizer_reports(self):
        text = self.log.text()
        return [m for m in SANITIZER_MARKERS if m in text]

    # observation ------------------------------------------------------------------------
    def threads(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        raise AssertionError("no Threads: line in /proc/PID/status")

    def cli(self, *args, check=True, timeout=20, socket_path=None):
        """Run `sluice -s CONTROL ARGS...`."""
        cmd = [SLUICE, "-s", socket_path or self.control_socket, *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}\n"
                                 f"stdout: {res.stdout}\nstderr: {res.stderr}")
        return res

    def stats(self):
        res = self.cli("stats", "--json")
        try:
            return json.loads(res.stdout)
        except ValueError as e:
            raise AssertionError(f"`sluice stats --json` printed no JSON ({e}):\n{res.stdout}")

    def milter_stats(self):
        return find_service(self.stats(), "milter")

    def write_config(self, text):
        self.config_text = with_own_state_dir(
            with_root_user(text.replace("@DIR@", str(self.dir))), self.dir)
        self.config.write_text(self.config_text)


def find_service(stats, name):
    """The per-service object called `name` holding a "connections" counter, anywhere in
    the JSON document (top level or under some "services" key)."""
    if isinstance(stats, dict):
        value = stats.get(name)
        if isinstance(value, dict) and "connections" in value:
            return value
        for v in stats.values():
            found = find_service(v, name)
            if found is not None:
                return found
    elif isinstance(stats, list):
        for v in stats:
            if isinstance(v, dict) and v.get("name") == name and "connections" in v:
                return v
            found = find_service(v, name)
            if found is not None:
                return found
    return None


def require_binary(path, var):
    if not os.path.exists(path):
        if os.environ.get(var):
            pytest.fail(f"${var}={path} does not exist")
        pytest.skip(f"{path} not built (set ${var})")


@pytest.fixture(scope="session")
def func_tmp():
    """A short, world-traversable base directory (Postfix's unprivileged daemons and
    smtp-sink must reach sockets and dump files under it; unix socket paths must stay
    under 108 bytes).  Set SLUICE_FUNC_KEEP=1 to keep it after the run."""
    raise_fd_limit()
    base = tempfile.mkdtemp(prefix="sluice-func-", dir="/tmp")
    os.chmod(base, 0o755)
    yield pathlib.Path(base)
    if not os.environ.get("SLUICE_FUNC_KEEP"):
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def workdir(func_tmp, request):
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:40]
    d = pathlib.Path(tempfile.mkdtemp(prefix=name + ".", dir=func_tmp))
    os.chmod(d, 0o755)
    return d


@pytest.fixture
def sluiced(workdir):
    """Factory: sluiced(config_text, start=True, env=None, args=()) -> Sluiced.

    @DIR@ in the text is replaced by the instance's own directory.  At teardown every
    instance still running gets SIGTERM; each must exit with its expected_rc (0 unless a
    test changed it) and its log must hold no sanitizer report."""
    require_binary(SLUICED, "SLUICED")
    instances = []

    def factory(config_text, start=True, env=None, args=()):
        d = workdir / f"sluiced{len(instances)}"
        d.mkdir()
        os.chmod(d, 0o755)
        inst = Sluiced(d, config_text, env=env, args=args)
        instances.append(inst)
        if start:
            try:
                inst.start()
            except AssertionError:
                # reported once, here; teardown need not repeat it
                if not inst.alive():
                    inst.expected_rc = inst.proc.returncode
                raise
        return inst

    yield factory

    problems = []
    for inst in instances:
        if inst.proc is None:
            continue
        try:
            rc = inst.stop()    # sluiced drains sessions for up to 30s
        except AssertionError as e:
            problems.append(str(e))
            continue
        if rc != inst.expected_rc:
            problems.append(f"sluiced exited {rc}, expected {inst.expected_rc}\n"
                            f"--- log ---\n{inst.log.tail()}")
        reports = inst.sanitizer_reports()
        if reports:
            problems.append(f"sanitizer report in {inst.log.path}: {reports}\n"
                            f"--- log ---\n{inst.log.tail(80)}")
    assert not problems, "\n\n".join(problems)


def sluiced_check(path):
    """`sluiced -t -c PATH`: the configuration check's exit status and messages."""
    require_binary(SLUICED, "SLUICED")
    return subprocess.run([SLUICED, "-t", "-c", str(path)], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def cli_copy(workdir):
    """The sluice command where every user can run it (not only root: /work may not be
    traversable)."""
    require_binary(SLUICE, "SLUICE")
    path = workdir / "sluice"
    shutil.copy(SLUICE, path)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def sluice_cli():
    require_binary(SLUICE, "SLUICE")
    return SLUICE


# ---------------------------------------------------------------------------------------
# Postfix

POSTFIX = shutil.which("postfix", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/postfix"
POSTQUEUE = shutil.which("postqueue", path="/usr/sbin:/usr/bin") or "/usr/sbin/postqueue"
POSTCAT = shutil.which("postcat", path="/usr/sbin:/usr/bin") or "/usr/sbin/postcat"
SMTP_SOURCE = shutil.which("smtp-source", path="/usr/sbin:/usr/bin") or "/usr/sbin/smtp-source"
SWAKS = shutil.which("swaks") or "/usr/bin/swaks"

# Services of the private instance: nothing chrooted (the chroot would need a copy of
# /etc files), one smtpd on the test port, postlogd for maillog_file.
MASTER_CF = """\
{listen} inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
local     unix  -       n       n       -       -       local
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""


class Postfix:
    """A private Postfix instance relaying everything to a local smtp-sink."""

    def __init__(self, directory, milter, main_overrides):
        self.dir = pathlib.Path(directory)
        self.config_dir = self.dir / "etc"
        self.queue_dir = self.dir / "spool"
        self.data_dir = self.dir / "data"
        self.sink_dir = self.dir / "sink"
        self.port = free_port()
        self.sink_port = free_port()
        while self.sink_port == self.port:
            self.sink_port = free_port()
        self.maillog = LogFile(self.dir / "maillog")
        self.sink_log = LogFile(self.dir / "smtp-sink.log")
        self.milter = milter
        self.main = {
            "compatibility_level": "3.6",
            "queue_directory": str(self.queue_dir),
            "data_directory": str(self.data_dir),
            "mail_owner": "postfix",
            "setgid_group": "postdrop",
            "myhostname": "mx.sluice.test",
            "mydomain": "sluice.test",
            "myorigin": "$myhostname",
            "mydestination": "",
            "local_recipient_maps": "",
            "alias_maps": "",
            "alias_database": "",
            "inet_interfaces": "127.0.0.1",
            "inet_protocols": "ipv4",
            "mynetworks": "127.0.0.0/8",
            "smtpd_relay_restrictions": "permit_mynetworks, reject_unauth_destination",
            "relayhost": f"[127.0.0.1]:{self.sink_port}",
            "smtp_dns_support_level": "disabled",
            "smtp_tls_security_level": "none",
            "smtpd_tls_security_level": "none",
            "smtpd_peername_lookup": "no",
            "smtputf8_enable": "no",
            "biff": "no",
            "notify_classes": "",
            "maillog_file": str(self.maillog.path),
            "maillog_file_prefixes": str(self.dir),
            "smtpd_milters": milter or "",
            "milter_default_action": "tempfail",
            "milter_protocol": "6",
            "milter_connect_timeout": "10s",
            "milter_command_timeout": "20s",
            "milter_content_timeout": "60s",
            "queue_run_delay": "5s",
            "minimal_backoff_time": "5s",
            "maximal_backoff_time": "10s",
        }
        self.main.update(main_overrides)
        self.sink = None

    def postfix_cmd(self, *args, check=True, timeout=60):
        res = subprocess.run([POSTFIX, "-c", str(self.config_dir), *args],
                             capture_output=True, text=True, timeout=timeout,
                             env=self._env())
        if check and res.returncode != 0:
            raise AssertionError(f"postfix {' '.join(args)} exited {res.returncode}\n"
                                 f"{res.stdout}{res.stderr}\n--- maillog ---\n"
                                 f"{self.maillog.tail()}")
        return res

    @staticmethod
    def _env():
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAIL_")}
        env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        return env

    def start(self):
        for d in (self.config_dir, self.data_dir, self.sink_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.queue_dir.mkdir(mode=0o755, exist_ok=True)
        # master(8) creates its lock file there after dropping privileges.
        shutil.chown(self.data_dir, user=self.main["mail_owner"])
        os.chmod(self.data_dir, 0o700)
        # smtp-sink drops to `nobody` before it writes its dump files.
        os.chmod(self.sink_dir, 0o1777)
        main_cf = "".join(f"{k} = {v}\n" for k, v in self.main.items())
        (self.config_dir / "main.cf").write_text(main_cf)
        (self.config_dir / "master.cf").write_text(
            MASTER_CF.format(listen=f"127.0.0.1:{self.port}"))

        self.sink = smtp_sink.start(self.sink_port, self.sink_log.path, 256,
                                    hostname="sink.sluice.test",
                                    dump=str(self.sink_dir) + "/msg.")

        self.postfix_cmd("start")
        wait_until(lambda: tcp_listening("127.0.0.1", self.port), 20,
                   f"Postfix smtpd on port {self.port}")
        return self

    def master_pid(self):
        try:
            return int((self.queue_dir / "pid/master.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def stop(self):
        pid = self.master_pid()
        self.postfix_cmd("stop", check=False)
        if pid:
            def gone():
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return True
                return False
            try:
                wait_until(gone, 20, "the Postfix master to exit")
            except AssertionError:
                os.kill(pid, signal.SIGKILL)
        smtp_sink.stop(self.sink)

    # clients ----------------------------------------------------------------------------
    def swaks(self, *args, timeout=120):
        """Run swaks against the instance; returns CompletedProcess (text)."""
        cmd = [SWAKS, "--server", "127.0.0.1", "--port", str(self.port),
               "--ehlo", "client.sluice.test", "--timeout", "60", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def smtp_source(self, *args, timeout=300):
        cmd = [SMTP_SOURCE, *args, f"127.0.0.1:{self.port}"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    # observation ------------------------------------------------------------------------
    def queue(self):
        """Queue entries from `postqueue -j` (one JSON object per message)."""
        res = subprocess.run([POSTQUEUE, "-c", str(self.config_dir), "-j"],
                             capture_output=True, text=True, timeout=30, env=self._env())
        assert res.returncode == 0, f"postqueue -j: {res.stderr}"
        return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]

    def postcat(self, queue_id):
        res = subprocess.run([POSTCAT, "-c", str(self.config_dir), "-q", queue_id],
                             capture_output=True, text=True, timeout=30, env=self._env())
        return res.stdout + res.stderr

    def sink_messages(self):
        """Texts of the transactions smtp-sink dumped so far.  A dump is written while the
        message arrives and is complete once Postfix logs status=sent for it."""
        return [p.read_text(errors="replace") for p in sorted(self.sink_dir.glob("msg.*"))]

    def wait_sink_messages(self, count, timeout=60, predicate=None):
        last = [None]

        def enough():
            msgs = [m for m in self.sink_messages() if predicate is None or predicate(m)]
            if len(msgs) < count:
                return None
            # unchanged since the previous poll: no dump is still being written
            if msgs != last[0]:
                last[0] = msgs
                return None
            return msgs
        try:
            return wait_until(enough, timeout, f"{count} message(s) at smtp-sink", interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- maillog ---\n{self.maillog.tail()}") from None

    def wait_delivered(self, queue_id, timeout=60):
        """Wait for `QID: ... status=sent` in the maillog; returns the line."""
        m = self.maillog.wait_for(rf"^.*\b{queue_id}: .*status=sent.*$", timeout)
        return m.group(0)


@pytest.fixture
def postfix(workdir):
    """Factory: postfix(milter="unix:/path", **main_cf) -> started Postfix instance."""
    for tool in (POSTFIX, SMTP_SINK):
        if not os.path.exists(tool):
            pytest.skip(f"{tool} not installed")
    if os.geteuid() != 0:
        pytest.skip("a private Postfix instance needs root")
    instances = []

    def factory(milter=None, **main_overrides):
        d = workdir / f"postfix{len(instances)}"
        d.mkdir()
        os.chmod(d, 0o755)
        inst = Postfix(d, milter, main_overrides)
        instances.append(inst)
        try:
            inst.start()
        except BaseException:
            inst.stop()
            raise
        return inst

    yield factory
    for inst in instances:
        inst.stop()


def queued_id(swaks_output):
    """The queue ID from swaks' transcript ("250 2.0.0 Ok: queued as 4Xy..."), or None."""
    m = re.search(r"queued as ([0-9A-Za-z]+)", swaks_output)
    return m.group(1) if m else None


# files that skip as a whole where the machine cannot take them (not root, namespaces or
# mounts refused, the package's directories or addresses in use)
SKIP_77_FILES = {"test_deb.py", "test_journald.py"}


def pytest_sessionfinish(session, exitstatus):
    """test_deb.py and test_journald.py skip as a whole where the machine cannot take
    them: a run of one of them alone where every test skipped exits 77, which meson
    shows as SKIP, not OK."""
    items = getattr(session, "items", None)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if (exitstatus == 0 and items and reporter is not None
            and len({pathlib.Path(str(item.fspath)).name for item in items}) == 1
            and pathlib.Path(str(items[0].fspath)).name in SKIP_77_FILES
            and len(reporter.stats.get("skipped", ())) == len(items)):
        session.exitstatus = 77
