"""doc/SENDMAIL.md, followed as written, with Debian's sendmail and a real sluiced.

Debian's sendmail-bin conflicts with postfix (both provide mail-transport-agent), and
the other tests need postfix installed, so sendmail is not installed: the test fetches
the packages sendmail-bin and sendmail-base with `apt-get download` into
/var/cache/sluice-tests/ (once) and unpacks them with `dpkg-deb -x` into a private root
there, then runs that root's /usr/libexec/sendmail/sendmail with a private
`-C sendmail.cf`.  The m4 macros (sendmail-cf), m4 and the libraries sendmail links are
in the Makefile's TEST_PKGS; they do not conflict with postfix.  The test is skipped,
with the reason, when the download fails or a piece is missing.

The sendmail.cf is built by m4 from LOCAL_MC (this test's own settings: a private
queue directory, a loopback port, no aliases file, host names from /etc/hosts), then
the guide's ```sendmail.mc``` blocks, then the MAILER lines -- the order the guide
gives.  sendmail wants a fully qualified host name; when the machine's is not one, the
daemon runs in a UTS namespace of its own (unshare -u) named mx.sluice.test, else it
would wait a minute for its name first.

The guide's blocks are changed only by the substitutions of table(): the paths of a
real installation become the test's private ones, the ports free ports, the smarthost's
address the test smarthost's.  Then the test checks what an administrator would: the
milter's rule refuses the 51st recipient at the SMTP client with its own text, the 50
accepted go through the intake (SMART_HOST and RELAY_MAILER_ARGS) into sluice's queue
and out through the guide's route to a test smarthost, and with sluiced stopped F=T
makes Sendmail answer 4xx.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import smtplib
import socket
import subprocess

import pytest

import guide
from conftest import (SLUICE, LogFile, free_port, require_binary, tcp_listening,
                      wait_until)
from peers.smarthost import smarthost  # noqa: F401 (fixture)

GUIDE = "SENDMAIL.md"
CACHE = pathlib.Path(os.environ.get("SLUICE_TEST_CACHE", "/var/cache/sluice-tests"))
PACKAGES = ("sendmail-bin", "sendmail-base")
CF_M4 = pathlib.Path("/usr/share/sendmail/cf/m4/cf.m4")
HOSTNAME = "mx.sluice.test"

LOCAL_MC = """\
include(`{cf_m4}')dnl
VERSIONID(`sluice guide test')dnl
OSTYPE(`linux')dnl
define(`confDOMAIN_NAME', `{hostname}')dnl
define(`QUEUE_DIR', `{dir}/queue')dnl
define(`STATUS_FILE', `{dir}/statistics')dnl
define(`confPID_FILE', `{dir}/sendmail.pid')dnl
define(`confSERVICE_SWITCH_FILE', `{dir}/service.switch')dnl
define(`ALIAS_FILE', `')dnl
define(`HELP_FILE', `')dnl
define(`confDONT_PROBE_INTERFACES', `True')dnl
define(`confBIND_OPTS', `-DNSRCH -DEFNAMES')dnl
define(`confDONT_BLAME_SENDMAIL', `GroupWritableDirPathSafe,TrustStickyBit')dnl
define(`confTO_QUEUERETURN', `1h')dnl
FEATURE(`nocanonify')dnl
FEATURE(`accept_unresolvable_domains')dnl
DAEMON_OPTIONS(`Port={port}, Addr=127.0.0.1, Name=MTA')dnl
"""
MAILERS = "MAILER(`local')dnl\nMAILER(`smtp')dnl\n"


def fetch_sendmail():
    """The private root holding Debian's sendmail; skips when it cannot be had."""
    root = CACHE / "sendmail-root"
    binary = root / "usr/libexec/sendmail/sendmail"
    if binary.exists():
        return binary
    if os.geteuid() != 0:
        pytest.skip("fetching sendmail into /var/cache/sluice-tests needs root")
    CACHE.mkdir(parents=True, exist_ok=True)
    debs = [next(iter(CACHE.glob(f"{p}_*.deb")), None) for p in PACKAGES]
    if None in debs:
        res = subprocess.run(["apt-get", "download", *PACKAGES], cwd=CACHE,
                             capture_output=True, text=True, timeout=300)
        if res.returncode != 0:     # a fresh system may have no package lists yet
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600)
            res = subprocess.run(["apt-get", "download", *PACKAGES], cwd=CACHE,
                                 capture_output=True, text=True, timeout=300)
        debs = [next(iter(CACHE.glob(f"{p}_*.deb")), None) for p in PACKAGES]
        if res.returncode != 0 or None in debs:
            pytest.skip(f"apt-get download {' '.join(PACKAGES)} failed: "
                        f"{res.stderr.strip()[-300:]}")
    tmp = CACHE / f"sendmail-root.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True, timeout=120)
    try:
        os.rename(tmp, root)     # complete or absent: a killed run leaves only tmp
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)   # another run unpacked it first
    return binary


@pytest.fixture(scope="module")
def sendmail_binary():
    if not CF_M4.exists() or not shutil.which("m4"):
        pytest.skip("sendmail-cf and m4 are not installed (make deps-test)")
    binary = fetch_sendmail()
    res = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30)
    missing = [l.split()[0] for l in res.stdout.splitlines() if "not found" in l]
    if missing:
        pytest.skip(f"libraries sendmail needs are not installed: {missing}")
    return binary


class Sendmail:
    """A private sendmail daemon (-bD, in the foreground) on a loopback port."""

    def __init__(self, binary, directory, mc_blocks):
        self.dir = pathlib.Path(directory)
        self.dir.mkdir()
        (self.dir / "queue").mkdir(mode=0o700)
        (self.dir / "service.switch").write_text("hosts files\naliases files\n")
        self.port = free_port()
        mc = LOCAL_MC.format(cf_m4=CF_M4, hostname=HOSTNAME, dir=self.dir, port=self.port)
        mc += "".join(b if b.endswith("\n") else b + "\n" for b in mc_blocks) + MAILERS
        (self.dir / "sendmail.mc").write_text(mc)
        with open(self.dir / "sendmail.cf", "w") as cf:
            subprocess.run(["m4", str(self.dir / "sendmail.mc")], stdout=cf, check=True,
                           timeout=60)
        self.log = LogFile(self.dir / "sendmail.out")
        cmd = [str(binary), "-C", str(self.dir / "sendmail.cf"), "-bD"]
        if "." not in socket.gethostname() and shutil.which("unshare"):
            probe = subprocess.run(["unshare", "-u", "true"], capture_output=True)
            if probe.returncode == 0:
                cmd = ["unshare", "-u", "/bin/sh", "-c",
                       f'hostname {HOSTNAME} && exec "$@"', "sh", *cmd]
        with open(self.log.path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, cwd=self.dir)
        wait_until(lambda: tcp_listening("127.0.0.1", self.port) or self.proc.poll() is not None,
                   90, f"sendmail to listen on {self.port}")
        assert self.proc.poll() is None, f"sendmail exited:\n{self.log.text()}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def sendmail(sendmail_binary, workdir):
    instances = []

    def factory(mc_blocks):
        inst = Sendmail(sendmail_binary, workdir / f"sendmail{len(instances)}", mc_blocks)
        instances.append(inst)
        return inst
    yield factory
    for inst in instances:
        inst.stop()


def table(intake_port, sh, s=None):
    """The substitutions: (text in the guide, text in this test); with s, sluiced's
    paths are its directory's, else @DIR@ for the sluiced fixture."""
    t = [("/run/sluice", str(s.dir)) if s else guide.SLUICED_PATHS[0]]
    t += guide.SLUICED_PATHS[1:]
    return t + [("10025", str(intake_port)), ("[192.0.2.25]:25", sh.relayhost)]


REAL = ("/run/sluice", "/var/spool/sluice", "/var/lib/sluice", "10025", "192.0.2.25")


def follow(kind, name, t):
    return guide.follow(GUIDE, kind, name, t, REAL)


@pytest.fixture
def setup(sluiced, smarthost, sendmail):  # noqa: F811
    require_binary(SLUICE, "SLUICE")
    sh = smarthost()
    intake_port = free_port()
    s = sluiced(follow("sluice.conf", "sendmail", table(intake_port, sh)))
    t = table(intake_port, sh, s)
    sm = sendmail([follow("sendmail.mc", "milter", t), follow("sendmail.mc", "smarthost", t)])
    return s, sh, sm


def send(sm, rcpts, sender="sender@example.org"):
    """One message through sendmail: (accepted, refused)."""
    return guide.send(sm.port, sender, rcpts,
                      b"Subject: through sendmail\r\n\r\nHello.\r\n")


def test_milter_limits_and_smart_host_delivery(setup):
    s, sh, sm = setup
    rcpts = [f"user{i}@example.net" for i in range(51)]
    accepted, refused = send(sm, rcpts)
    # the guide's rule, through the milter, at the SMTP client
    assert accepted == rcpts[:50], refused
    assert list(refused) == ["user50@example.net"]
    code, text = refused["user50@example.net"]
    assert code == 451 and re.fullmatch(
        r"4\.7\.1 Too many recipients from 127\.0\.0\.1, try again in [0-9dhms]+", text), text

    # the 50 accepted: SMART_HOST -> the intake on the guide's port -> the route
    msg = sh.wait_accepted(1, timeout=60)[0]
    assert msg.sender == "sender@example.org"
    assert sorted(msg.rcpts) == sorted(rcpts[:50])
    assert msg.header("Subject") == "through sendmail"

    def lane():
        lanes = json.loads(s.cli("lanes", "--json").stdout)
        return [l for l in lanes if l["lane"] == "isp" and l["delivered"] == 50]
    wait_until(lane, 30, "lane isp to count 50 recipients delivered")
    # the guide's classes: the SMTP session from 127.0.0.1 entered "default" (through
    # the milter's CONNECT), and so did the relay's connection to the smarthost
    text = s.cli("stats", "--json").stdout
    classes = {c["name"]: c for c in json.loads(text)["classes"]}
    assert set(classes) == {"campus", "default"}, text
    assert classes["default"]["entered"] >= 2 and classes["default"]["refused"] == 0, text
    assert classes["default"]["inbound"] == 5 and classes["campus"]["entered"] == 0, text


def test_sluiced_down_tempfails(setup):
    """F=T: with the milter unreachable, Sendmail refuses mail for now."""
    s, sh, sm = setup
    assert s.stop() == 0
    with smtplib.SMTP("127.0.0.1", sm.port, timeout=60) as c:
        c.ehlo("client.example.org")
        assert c.mail("sender@example.org") == (451, b"4.3.2 Please try again later")
    assert sh.accepted() == []


def test_full_class_refuses_a_session_at_connect(setup):
    """XLA: the guide's class "default" admits 5 sessions; the 6th gets 421 at connect,
    and one is admitted again once a session ends."""
    s, sh, sm = setup
    held = []
    try:
        for _ in range(5):
            c = smtplib.SMTP("127.0.0.1", sm.port, timeout=60)
            assert c.ehlo("client.example.org")[0] == 250
            held.append(c)
        with pytest.raises(smtplib.SMTPConnectError) as e:
            smtplib.SMTP("127.0.0.1", sm.port, timeout=60)
        # Sendmail gives its own text to a 421 from the milter at connect
        assert (e.value.smtp_code, e.value.smtp_error) == \
            (421, f"4.7.0 {HOSTNAME} closing connection".encode())
        # ... and the refusal is the class's
        text = s.cli("stats", "--json").stdout
        classes = {c["name"]: c for c in json.loads(text)["classes"]}
        assert classes["default"]["refused"] == 1 and classes["default"]["used"] == 5, text
        held.pop().quit()

        def admitted():
            try:
                c = smtplib.SMTP("127.0.0.1", sm.port, timeout=60)
            except smtplib.SMTPConnectError:
                return False
            held.append(c)
            return True
        wait_until(admitted, 10, "a session to be admitted again")
    finally:
        for c in held:
            c.close()
