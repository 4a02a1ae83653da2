"""The Debian package (debian/, `make deb`), built, checked by lintian, installed with
dpkg, run on its own configuration and purged (suite 'slow': about 60 s, most of it the
package build).

It installs into this machine's real /usr, /etc, /run and /var and runs the installed
sluiced on the shipped /etc/sluice/sluice.conf, which binds the default addresses
(/run/sluice/*.sock, 127.0.0.1:10025); so it skips, saying why, when a sluice package is
installed already, when one of those directories or addresses is in use by something
else, and when not root or without dpkg-buildpackage and lintian.  Whatever happens, it
purges what it installed and stops what it started.
"""

import grp
import os
import pathlib
import pwd
import re
import shutil
import signal
import smtplib
import subprocess
import time

import pytest

from conftest import (SOURCE_ROOT, plain_only, tcp_listening, unix_listening, wait_listening,
                      wait_until)

SLUICED = "/usr/sbin/sluiced"
SLUICE = "/usr/bin/sluice"
CONF = "/etc/sluice/sluice.conf"
UNIT = "/lib/systemd/system/sluiced.service"
WANTS = "/etc/systemd/system/multi-user.target.wants/sluiced.service"
SPOOL = pathlib.Path("/var/spool/sluice")
# what the shipped configuration makes or binds: the test must own them
OWN_DIRS = ("/etc/sluice", "/var/lib/sluice", str(SPOOL))
LISTEN = ("unix:/run/sluice/control.sock", "unix:/run/sluice/milter.sock",
          "unix:/run/sluice/policy.sock", "unix:/run/sluice/intake.sock",
          "inet:127.0.0.1:10025")
SYSTEMD_RUNS = os.path.isdir("/run/systemd/system")


def run(*args, check=True, timeout=120, env=None):
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                         env=env)
    if check and res.returncode != 0:
        raise AssertionError(f"{args}: exit {res.returncode}\n--- stdout ---\n"
                             f"{res.stdout[-4000:]}\n--- stderr ---\n{res.stderr[-4000:]}")
    return res


def dpkg(*args, check=True):
    """dpkg, waiting while another dpkg or apt holds its lock (other work on the machine
    may be installing packages)."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    deadline = time.monotonic() + 120
    while True:
        res = run("dpkg", *args, check=False, env=env)
        if res.returncode == 0 or "lock" not in res.stderr or time.monotonic() > deadline:
            break
        time.sleep(1)
    if check and res.returncode != 0:
        raise AssertionError(f"dpkg {args}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


def package_status():
    res = run("dpkg-query", "-W", "-f=${db:Status-Status}", "sluice", check=False)
    return res.stdout.strip() if res.returncode == 0 else "not-installed"


def why_not():
    """The reason this machine cannot take the test, or None."""
    if os.geteuid() != 0:
        return "installs a package: needs root"
    for tool in ("dpkg-buildpackage", "lintian", "dh"):
        if not shutil.which(tool):
            return f"{tool} is missing (make deps-deb installs it)"
    status = package_status()
    if status not in ("not-installed", "config-files"):
        return f"a sluice package is installed already ({status}); this test purges its own"
    for d in OWN_DIRS:
        if os.path.exists(d):
            return f"{d} exists (another installation?); this test's purge would remove it"
    for address in LISTEN:
        if address.startswith("unix:") and unix_listening(address[5:]):
            return f"something listens on {address} (a sluiced already running?)"
        if address.startswith("inet:") and tcp_listening("127.0.0.1", 10025):
            return "something listens on 127.0.0.1:10025, the intake of the shipped sluice.conf"
    return None


REASON = why_not()
# the package is built from the sources, whatever the build under test: run it once
pytestmark = [plain_only, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    """`make deb` on this tree, its output in a temporary directory (the tree stays
    clean); returns that directory."""
    out = tmp_path_factory.mktemp("deb")
    started = time.monotonic()
    run("make", "-C", str(SOURCE_ROOT), "deb", f"DEB_DIR={out}", timeout=900)
    print(f"make deb: {time.monotonic() - started:.0f} s")
    return out


def the_deb(out):
    debs = sorted(out.glob("sluice_*_*.deb"))
    assert len(debs) == 1, debs
    return debs[0]


class Installed:
    """The package installed for one test, and the plain sluiced process the test runs
    (systemd may not run here); everything undone at teardown."""

    def __init__(self, deb_file, tmp):
        self.deb_file = deb_file
        self.tmp = tmp
        self.proc = None
        self.log = tmp / "sluiced.log"

    def install(self):
        res = dpkg("-i", str(self.deb_file))
        assert package_status() == "installed", res.stdout
        if SYSTEMD_RUNS:
            # postinst started the unit: it must be up; the test runs its own process
            wait_until(lambda: run("systemctl", "is-active", "sluiced", check=False)
                       .stdout.strip() == "active", 20, "sluiced.service to be active")
            run("systemctl", "stop", "sluiced")
        return res

    def start(self):
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen([SLUICED], stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT)
        try:
            for address in LISTEN:
                wait_listening(address, 15, alive=lambda: self.proc.poll() is None)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- log ---\n{self.log.read_text()}") from None

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(45)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"sluiced did not stop\n{self.log.read_text()}") from None

    def purge(self):
        return dpkg("--purge", "sluice")

    def teardown(self):
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        finally:
            if package_status() != "not-installed":
                dpkg("--purge", "sluice", check=False)
            # a queue the purge kept on purpose: the test's own mail
            shutil.rmtree(SPOOL, ignore_errors=True)


@pytest.fixture
def installed(deb, tmp_path):
    inst = Installed(the_deb(deb), tmp_path)
    try:
        yield inst
    finally:
        inst.teardown()


def free_the_user():
    """Remove the user and group sluice when nothing runs as that user (other tests make
    them with useradd), so that the install shows postinst making them; True if done."""
    try:
        uid = pwd.getpwnam("sluice").pw_uid
    except KeyError:
        uid = None
    if uid is not None:
        for status in pathlib.Path("/proc").glob("[0-9]*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            m = re.search(r"^Uid:\s+(\d+)", text, re.M)
            if m and int(m.group(1)) == uid:
                return False
        if run("userdel", "sluice", check=False).returncode != 0:
            return False
    run("groupdel", "sluice", check=False)
    return True


def mode_owner(path):
    st = os.stat(path)
    return (oct(st.st_mode & 0o7777), pwd.getpwuid(st.st_uid).pw_name,
            grp.getgrgid(st.st_gid).gr_name)


def test_lintian_finds_no_error_and_no_unexplained_warning(deb):
    """lintian on the .changes (the .deb and the .buildinfo): no E: and no W: line (the
    ones debian/sluice.lintian-overrides explains are not shown), and every override is
    still used."""
    changes = sorted(deb.glob("sluice_*.changes"))
    assert len(changes) == 1, changes
    res = run("lintian", "-I", "--show-overrides", str(changes[0]), check=False)
    lines = res.stdout.splitlines()
    bad = [ln for ln in lines if ln.startswith(("E:", "W:"))]
    stale = [ln for ln in lines if "unused-override" in ln or "mismatched-override" in ln]
    assert not bad and not stale, res.stdout
    assert [ln for ln in lines if ln.startswith("O:")], "the overrides were not read"


def test_install_run_purge(installed):
    """dpkg -i makes the user, the conffile, the enabled unit and /run/sluice; the
    installed sluiced checks, prints and runs the shipped configuration and answers
    `sluice status`; purge removes everything but the user (the queue is empty)."""
    fresh_user = free_the_user()
    installed.install()

    user = pwd.getpwnam("sluice")
    assert grp.getgrgid(user.pw_gid).gr_name == "sluice"
    if fresh_user:   # made by postinst, the Debian way
        assert user.pw_shell == "/usr/sbin/nologin" and user.pw_dir == "/nonexistent", user
    assert user.pw_uid < 1000, user

    conffiles = run("dpkg-query", "-W", "-f=${Conffiles}", "sluice").stdout
    assert re.search(r"^ /etc/sluice/sluice\.conf [0-9a-f]{32}$", conffiles, re.M), conffiles
    assert mode_owner(CONF) == ("0o640", "root", "sluice")
    assert mode_owner("/etc/sluice") == ("0o750", "root", "sluice")
    assert (SOURCE_ROOT / "etc/sluice.conf").read_bytes() == pathlib.Path(CONF).read_bytes()

    assert os.path.isfile(UNIT)
    assert os.readlink(WANTS) == UNIT
    # as dpkg's maintainer scripts ask it (it answers them only)
    assert run("deb-systemd-helper", "is-enabled", "sluiced.service", check=False,
               env=dict(os.environ, DPKG_MAINTSCRIPT_PACKAGE="sluice")).returncode == 0
    assert os.path.isfile("/usr/lib/tmpfiles.d/sluice.conf")
    if shutil.which("systemd-tmpfiles"):
        assert mode_owner("/run/sluice") == ("0o755", "root", "root")
        assert mode_owner("/var/lib/sluice") == ("0o750", "sluice", "sluice")
    for page in ("man1/sluice.1.gz", "man5/sluice.conf.5.gz", "man8/sluiced.8.gz"):
        assert os.path.isfile(f"/usr/share/man/{page}"), page
    doc = pathlib.Path("/usr/share/doc/sluice")
    for name in ("POSTFIX.md.gz", "SENDMAIL.md.gz", "QMAIL.md.gz", "OPERATIONS.md.gz",
                 "copyright", "changelog.gz", "examples/isp-smarthost.conf"):
        assert (doc / name).is_file(), name

    # the installed programs on the installed configuration (their default path)
    run(SLUICED, "-t")
    printed = run(SLUICED, "-n").stdout
    assert 'user = "sluice";' in printed, printed
    assert '"inet:127.0.0.1:10025", "unix:/run/sluice/intake.sock"' in printed, printed

    installed.start()
    uid_line = re.search(r"^Uid:.*$", pathlib.Path(f"/proc/{installed.proc.pid}/status")
                         .read_text(), re.M).group(0)
    assert uid_line.split()[1:] == [str(user.pw_uid)] * 4, uid_line   # dropped to sluice
    status = run(SLUICE, "status").stdout
    assert re.search(rf"\b{installed.proc.pid}\b", status), status
    assert CONF in status, status
    assert mode_owner(SPOOL) == ("0o750", "sluice", "sluice")
    assert installed.stop() == 0, installed.log.read_text()

    res = installed.purge()
    assert "kept" not in res.stderr, res.stderr
    assert package_status() == "not-installed"
    for gone in (SLUICED, SLUICE, CONF, "/etc/sluice", UNIT, WANTS, "/run/sluice",
                 "/var/lib/sluice", str(SPOOL), "/usr/lib/tmpfiles.d/sluice.conf",
                 "/usr/share/doc/sluice"):
        assert not os.path.lexists(gone), f"{gone} left after the purge"
    assert pwd.getpwnam("sluice").pw_uid == user.pw_uid     # Debian keeps system users


def test_purge_keeps_a_queue_that_holds_mail(installed):
    """A message queued through the installed intake survives the purge, which says so
    on stderr; the rest goes.  Installing twice (a reinstall over an existing user and
    configuration) changes nothing."""
    installed.install()
    installed.install()
    assert mode_owner(CONF) == ("0o640", "root", "sluice")

    installed.start()
    with smtplib.SMTP("127.0.0.1", 10025, timeout=30) as smtp:
        refused = smtp.sendmail("sender@example.org", ["rcpt@example.net"],
                                b"Subject: keep me\r\n\r\nQueued before the purge.\r\n")
    assert refused == {}
    queued = run(SLUICE, "queue").stdout
    assert "rcpt@example.net" in queued, queued
    assert installed.stop() == 0, installed.log.read_text()
    messages = [p for p in (SPOOL / "msg").rglob("*") if p.is_file()]
    assert len(messages) == 1, messages

    res = installed.purge()
    assert re.search(r"/var/spool/sluice holds 1 queued message\(s\): kept", res.stderr), \
        res.stderr
    assert package_status() == "not-installed"
    assert messages[0].is_file()
    for gone in (SLUICED, CONF, "/etc/sluice", "/run/sluice", "/var/lib/sluice"):
        assert not os.path.lexists(gone), f"{gone} left after the purge"
