"""The Debian package (debian/, `make deb`), built, checked by lintian, installed with
dpkg, run on its own configuration, upgraded and purged (suite 'slow': about 100 s, most
of it the package build).

It installs into this machine's real /usr, /etc, /run and /var and runs the installed
sluiced on the shipped /etc/sluice/sluice.conf, which binds the default addresses
(/run/sluice/*.sock, 127.0.0.1:10025); so it skips, saying why, when one of those
directories or addresses is in use by something else, and when not root or without
dpkg-buildpackage and lintian; a run where everything skipped exits 77, which meson shows
as SKIP (conftest.py).  A sluice package that dpkg knows of (installed, half-installed,
its configuration left) makes it fail, not skip: that is what a failed run of this test
leaves, and `dpkg --purge sluice` clears it.  Whatever happens, it purges what it
installed and stops what it started.  The machine's user sluice, if any, is never
removed or changed: the package must take it as it is; making the user on a machine
without one, and refusing a user of the wrong shape, are shown with a private copy of
/etc (test_postinst_user_on_a_private_etc).
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
    # never a terminal: dpkg must not stop at a question
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                         env=env, stdin=subprocess.DEVNULL)
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
    if package_status() != "not-installed":
        return None     # leftovers of the package's own: the test fails (below)
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


@pytest.fixture(scope="module", autouse=True)
def no_package_left():
    """A sluice package that dpkg knows of already is a failure, not a skip: it is what a
    failed run leaves (or an installation this test must not purge)."""
    status = package_status()
    if status != "not-installed":
        pytest.fail(f"dpkg knows a sluice package on this machine ({status}): left by a "
                    "failed run of this test? Clear it with `dpkg --purge sluice` (and "
                    "rm -r /var/spool/sluice /var/lib/sluice if they hold only test mail)",
                    pytrace=False)


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

    def install(self, deb_file=None):
        # --force-confold: a changed conffile is kept without a question (an upgrade)
        res = dpkg("-i", "--force-confold", str(deb_file or self.deb_file))
        assert package_status() == "installed", res.stdout
        self.no_unit()
        return res

    @staticmethod
    def no_unit():
        """Where systemd runs, postinst started (or restarted) the unit: it must be up;
        then it is stopped, the test runs its own process.  Stopping removes /run/sluice
        (RuntimeDirectory=): the package's tmpfiles.d entry makes it again, as at boot."""
        if SYSTEMD_RUNS:
            wait_until(lambda: run("systemctl", "is-active", "sluiced", check=False)
                       .stdout.strip() == "active", 20, "sluiced.service to be active")
            assert os.path.isdir("/run/sluice")
            run("systemctl", "stop", "sluiced")
            run("systemd-tmpfiles", "--create", "sluice.conf")

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
            # a queue (and the state kept with it) the purge kept on purpose: the test's
            # own mail; neither existed before the test (why_not)
            shutil.rmtree(SPOOL, ignore_errors=True)
            shutil.rmtree("/var/lib/sluice", ignore_errors=True)


@pytest.fixture
def installed(deb, tmp_path):
    inst = Installed(the_deb(deb), tmp_path)
    try:
        yield inst
    finally:
        inst.teardown()


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
    """dpkg -i makes the user (or takes the machine's system user sluice as it is), the
    conffile, the enabled unit and /run/sluice; the installed sluiced checks, prints and
    runs the shipped configuration and answers `sluice status`; purge removes everything
    but the user (the queue is empty)."""
    try:
        before = pwd.getpwnam("sluice")
    except KeyError:
        before = None
    installed.install()

    user = pwd.getpwnam("sluice")
    assert grp.getgrgid(user.pw_gid).gr_name == "sluice"
    if before is None:   # made by postinst, the Debian way
        assert user.pw_shell == "/usr/sbin/nologin" and user.pw_dir == "/nonexistent", user
    else:                # taken as it is
        assert user == before, (before, user)
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
    # sluiced makes its queue and state directories (below), not tmpfiles.d (where
    # systemd runs, the unit's start made them already)
    if not SYSTEMD_RUNS:
        assert not os.path.exists("/var/lib/sluice") and not SPOOL.exists()
    for page in ("man1/sluice.1.gz", "man5/sluice.conf.5.gz", "man8/sluiced.8.gz"):
        assert os.path.isfile(f"/usr/share/man/{page}"), page
    doc = pathlib.Path("/usr/share/doc/sluice")
    for name in ("POSTFIX.md.gz", "SENDMAIL.md.gz", "QMAIL.md.gz", "OPERATIONS.md.gz",
                 "copyright", "changelog.gz", "examples/isp-smarthost.conf"):
        assert (doc / name).is_file(), name
    for name in ("prometheus/sluice-rules.yml", "grafana/sluice.json"):  # read in place
        assert os.path.isfile(f"/usr/share/sluice/{name}"), name

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
    assert mode_owner("/var/lib/sluice")[1:] == ("sluice", "sluice")
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
    on stderr, and the state directory (the relay's send history) with it; the rest goes.  Installing twice (a reinstall over an existing user and
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
    assert re.search(r"/var/spool/sluice holds 1 queued message\(s\): kept, and "
                     r"/var/lib/sluice with it", res.stderr), res.stderr
    assert package_status() == "not-installed"
    assert messages[0].is_file()
    assert os.path.isdir("/var/lib/sluice")
    for gone in (SLUICED, CONF, "/etc/sluice", "/run/sluice"):
        assert not os.path.lexists(gone), f"{gone} left after the purge"


def repack(deb_file, out, version, conf_line):
    """The package again as version `version`, its shipped sluice.conf with one more
    line: what an upgrade that changes the conffile looks like to dpkg (seconds, where
    a second build would take a minute)."""
    tree = out / "tree"
    run("dpkg-deb", "-R", str(deb_file), str(tree))
    control = tree / "DEBIAN/control"
    text, n = re.subn(r"^Version: .*$", f"Version: {version}", control.read_text(), flags=re.M)
    assert n == 1
    control.write_text(text)
    assert "/etc/sluice/sluice.conf" in (tree / "DEBIAN/conffiles").read_text()
    with open(tree / "etc/sluice/sluice.conf", "a") as f:
        f.write(conf_line)
    new = out / f"sluice_{version}_new.deb"
    run("dpkg-deb", "--root-owner-group", "-b", str(tree), str(new))
    return new


def test_upgrade_keeps_the_edited_conffile(installed, tmp_path):
    """An administrator edits sluice.conf; an upgrade whose sluice.conf changed too keeps
    the edited file (--force-confold, as a question answered `N`), leaves the new one
    beside it as sluice.conf.dpkg-dist, keeps root:sluice 0640, and the installed
    sluiced accepts the kept file; the purge removes both."""
    installed.install()
    conf = pathlib.Path(CONF)
    edited = conf.read_text().replace("stats_interval = 5m;", "stats_interval = 7m;")
    assert edited != conf.read_text()
    conf.write_text(edited)
    new = repack(installed.deb_file, tmp_path, "99.0.0", "# shipped by 99.0.0\n")

    installed.install(new)
    assert run("dpkg-query", "-W", "-f=${Version}", "sluice").stdout == "99.0.0"
    assert conf.read_text() == edited
    dist = pathlib.Path(CONF + ".dpkg-dist")
    assert dist.read_text().endswith("# shipped by 99.0.0\n")
    assert mode_owner(CONF) == ("0o640", "root", "sluice")
    run(SLUICED, "-t")
    assert "stats_interval = 7m;" in run(SLUICED, "-n").stdout

    installed.purge()
    assert not os.path.lexists(dist) and not os.path.lexists("/etc/sluice")


def on_private_etc(tmp_path, group="", passwd="", conf_link=None):
    """The installed postinst (`configure`, as on a first install) in a mount namespace
    where /etc is a copy of this machine's, its user and group sluice removed and then
    the lines `group` and `passwd` added (and sluice.conf a symbolic link to `conf_link`
    if given): the machine's own accounts are never touched.  Returns the run and the
    copy."""
    etc = tmp_path / "etc"
    tmp_path.mkdir()
    run("cp", "-a", "/etc/.", str(etc))
    for name in ("passwd", "group", "shadow", "gshadow"):
        f = etc / name
        if f.exists():
            f.write_text("".join(ln for ln in f.read_text().splitlines(True)
                                 if not ln.startswith("sluice:")))
    for name, line in (("group", group), ("passwd", passwd)):
        with open(etc / name, "a") as f:
            f.write(line)
    if conf_link is not None:
        (etc / "sluice/sluice.conf").unlink()
        (etc / "sluice/sluice.conf").symlink_to(conf_link)
    res = run("unshare", "--mount", "sh", "-c",
              'mount --make-rprivate / && mount --bind "$1" /etc && exec "$2" configure',
              "sh", str(etc), "/var/lib/dpkg/info/sluice.postinst", check=False,
              env=dict(os.environ, DPKG_MAINTSCRIPT_PACKAGE="sluice",
                       DPKG_MAINTSCRIPT_NAME="postinst", DEBIAN_FRONTEND="noninteractive"))
    # a postinst that ran to the end restarted the unit where systemd runs
    if res.returncode == 0:
        Installed.no_unit()
    return res, etc


def entry(etc, name, field):
    for ln in (etc / name).read_text().splitlines():
        if ln.startswith(field + ":"):
            return ln.split(":")
    return None


def test_postinst_user_on_a_private_etc(installed, tmp_path):
    """postinst makes the system user and group sluice where there are none (a fresh
    machine), takes a group sluice left alone, and refuses, saying why, a login user
    sluice and a user sluice whose primary group is another one.  The machine's own
    accounts stay as they were."""
    installed.install()
    accounts = [pathlib.Path("/etc", name).read_bytes() for name in ("passwd", "group")]

    res, etc = on_private_etc(tmp_path / "fresh")
    assert res.returncode == 0, res.stderr
    user, group = entry(etc, "passwd", "sluice"), entry(etc, "group", "sluice")
    assert int(user[2]) < 1000 and user[3] == group[2], (user, group)
    assert user[5:] == ["/nonexistent", "/usr/sbin/nologin"], user
    conf = os.stat(etc / "sluice/sluice.conf")
    assert (conf.st_uid, conf.st_gid, oct(conf.st_mode & 0o777)) == (0, int(group[2]), "0o640")

    # a group sluice left alone becomes the user's group; a sluice.conf that is a
    # symbolic link is not followed by postinst's chown
    target = tmp_path / "elsewhere.conf"
    shutil.copy(CONF, target)
    os.chmod(target, 0o644)
    res, etc = on_private_etc(tmp_path / "group", group="sluice:x:990:\n", conf_link=target)
    assert res.returncode == 0, res.stderr
    assert entry(etc, "passwd", "sluice")[3] == "990"
    assert (os.stat(target).st_gid, oct(os.stat(target).st_mode & 0o777)) == (0, "0o644")

    res, _ = on_private_etc(tmp_path / "login", group="sluice:x:1500:\n",
                            passwd="sluice:x:1500:1500::/home/sluice:/bin/sh\n")
    assert res.returncode != 0
    assert "not as a login user (uid 1500)" in res.stderr, res.stderr

    res, _ = on_private_etc(tmp_path / "nogroup", group="sluice:x:990:\n",
                            passwd="sluice:x:990:65534::/nonexistent:/usr/sbin/nologin\n")
    assert res.returncode != 0
    assert "primary group is nogroup, not sluice" in res.stderr, res.stderr
    assert [pathlib.Path("/etc", name).read_bytes() for name in ("passwd", "group")] == accounts
