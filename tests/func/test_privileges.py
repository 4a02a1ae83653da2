"""sluiced's identity and what it protects: the drop from root to its user, the directories
and sockets it makes for that user, secret files, the control socket's peers, readiness
for systemd, and what `meson install` puts in place.

The tests run as root (as sluiced does when it drops); the daemon's user is the system
user `sluice` (created here when missing, as `make run` does), an operator is the system
user `sluiceop` in the group `sluice`, and a stranger is `nobody`.  The sluice command is
run as those users with setpriv(1).
"""
import grp
import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import smtplib
import socket
import stat
import subprocess
import time

import pytest

from conftest import (SLUICE, SLUICED, SOURCE_ROOT, ensure_user, free_port, require_binary,
                      sluiced_check, wait_until)
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_redis import redis  # noqa: F401 (fixture)

USER = "sluice"
OPERATOR = "sluiceop"
STRANGER = "nobody"


@pytest.fixture(scope="module")
def users():
    if os.geteuid() != 0:
        pytest.skip("needs root: sluiced drops from root to its user")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")
    daemon = ensure_user(USER)
    operator = ensure_user(OPERATOR, groups=[grp.getgrgid(daemon.pw_gid).gr_name])
    return {"daemon": daemon, "operator": operator, "stranger": pwd.getpwnam(STRANGER)}


def as_user(name, *argv, clear_groups=False, timeout=20):
    """Run argv as user name: its own groups from /etc/group, or none."""
    pw = pwd.getpwnam(name)
    groups = ["--clear-groups"] if clear_groups else ["--init-groups"]
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", *groups,
                           *argv],
                          capture_output=True, text=True, timeout=timeout)


def base_config(user=USER, control="", extra=""):
    return f"""user = "{user}";
workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "@DIR@/state";
log {{ target = "stderr"; level = "info"; }}
control {{ listen = "unix:@DIR@/control.sock"; {control} }}
milter {{ listen = "unix:@DIR@/run/milter.sock"; }}
{extra}
"""


def readable_by_user(s):
    """Reload reads the configuration as the user: root's file, the user's group."""
    s.config.chmod(0o640)
    shutil.chown(s.config, "root", USER)


def proc_ids(pid):
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    uid = [int(x) for x in re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()]
    gid = [int(x) for x in re.search(r"^Gid:\s+(.*)$", status, re.M).group(1).split()]
    groups = [int(x) for x in re.search(r"^Groups:[ \t]*(.*)$", status, re.M).group(1).split()]
    return uid, gid, groups



def send_one(port, rcpt="someone@example.net"):
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        s.sendmail("me@example.org", [rcpt], "Subject: hi\r\n\r\nHello.\r\n")


# ---------------------------------------------------------------------------------------
# the drop

def test_drops_to_its_user_after_binding_and_writes_the_queue_as_it(sluiced, users):
    """Started as root with user = "sluice": every uid and gid of the running daemon is
    the user's, its only group is the user's group, the directories it made belong to
    the user, and the queue files of a message it accepted are the user's."""
    d = users["daemon"]
    port = free_port()
    s = sluiced(base_config(extra=f'intake {{ listen = "inet:127.0.0.1:{port}"; }}\n'
                                  'queue { dir = "@DIR@/spool/queue"; }'))
    uid, gid, groups = proc_ids(s.pid)
    assert uid == [d.pw_uid] * 4, uid
    assert gid == [d.pw_gid] * 4, gid
    assert groups == [d.pw_gid], groups
    s.log.wait_for(rf"running as user {USER} \(uid {d.pw_uid}, gid {d.pw_gid}\)")

    for sub, mode in (("state", 0o750), ("spool", 0o755), ("spool/queue", 0o750),
                      ("run", 0o755)):
        st = os.stat(s.dir / sub)
        assert (st.st_uid, st.st_gid) == (d.pw_uid, d.pw_gid), sub
        assert stat.S_IMODE(st.st_mode) == mode, (sub, oct(st.st_mode))

    send_one(port)
    files = [p for p in (s.dir / "spool/queue").rglob("*") if p.is_file()]
    assert any("msg" in p.parts for p in files), files
    for p in files:
        st = os.stat(p)
        assert (st.st_uid, st.st_gid) == (d.pw_uid, d.pw_gid), p
    assert s.cli("status").returncode == 0
    # at stop the user removes its sockets (their directory is its own)
    assert s.stop() == 0
    assert not os.path.exists(s.dir / "run/milter.sock")
    snapshot = s.dir / "state/limits.snapshot"
    assert snapshot.exists() and snapshot.stat().st_uid == d.pw_uid


def test_started_as_root_without_user_is_refused(workdir):
    """No user key and started as root: refused, telling the admin what to write."""
    require_binary(SLUICED, "SLUICED")
    conf = workdir / "sluice.conf"
    conf.write_text(base_config().replace(f'user = "{USER}";\n', "").replace(
        "@DIR@", str(workdir)))
    res = subprocess.run([SLUICED, "-c", str(conf)], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 1, res
    assert 'user = "sluice";' in res.stderr and 'user = "root";' in res.stderr, res.stderr
    assert str(conf) in res.stderr
    assert not os.path.exists(workdir / "control.sock")
    # the check of the file itself passes: the file is valid, the start is what is refused
    assert sluiced_check(conf).returncode == 0


def test_user_root_keeps_root_and_says_so(sluiced):
    s = sluiced(base_config(user="root"))
    assert proc_ids(s.pid)[0] == [0, 0, 0, 0]
    s.log.wait_for(r'notice: user = "root": sluiced keeps running as root')


@pytest.mark.parametrize("key, text, message", [
    ("user", 'user = "no-such-user-x";', r'user: unknown user "no-such-user-x"'),
    ("group", 'user = "sluice"; group = "no-such-group-x";',
     r'group: unknown group "no-such-group-x"'),
    ("owner", 'user = "sluice"; policy { listen = "unix:/tmp/x.sock"; owner = "no-such-user-x"; }',
     r'policy\.owner: unknown user "no-such-user-x"'),
    ("group needs user", 'group = "sluice";', r"group: group needs user"),
])
def test_unknown_user_or_group_is_a_precise_error(workdir, users, key, text, message):
    conf = workdir / "sluice.conf"
    conf.write_text(f'milter {{ listen = "unix:{workdir}/m.sock"; }}\n{text}\n')
    res = sluiced_check(conf)
    assert res.returncode == 1, res
    assert re.search(rf"{re.escape(str(conf))}:2: {message}", res.stderr), res.stderr


def test_not_root_applies_no_user(workdir, users):
    """Started as another user, user is not applied: a notice, and it runs."""
    conf = workdir / "sluice.conf"
    (workdir / "d").mkdir()
    shutil.chown(workdir / "d", users["stranger"].pw_name)
    conf.write_text(base_config().replace("@DIR@", str(workdir / "d")))
    conf.chmod(0o644)
    stranger = users["stranger"]
    proc = subprocess.Popen(["setpriv", f"--reuid={stranger.pw_uid}",
                             f"--regid={stranger.pw_gid}", "--clear-groups", SLUICED, "-c", str(conf)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: os.path.exists(workdir / "d/control.sock"), 15,
                   "the control socket")
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out
    assert re.search(r"notice: not started as root: user and group are not applied; "
                     rf"running as uid {users['stranger'].pw_uid}", out), out


# ---------------------------------------------------------------------------------------
# sockets and directories

def test_socket_owner_group_and_mode(sluiced, users):
    s = sluiced(base_config(extra=f'policy {{ listen = "unix:@DIR@/pf/private/policy"; '
                                  f'owner = "{STRANGER}"; group = "{USER}"; '
                                  f'mode = "0640"; }}'))
    d, stranger = users["daemon"], users["stranger"]
    st = os.stat(s.dir / "pf/private/policy")
    assert stat.S_ISSOCK(st.st_mode)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == \
        (stranger.pw_uid, d.pw_gid, 0o640)
    # by default a socket belongs to the user and group sluiced drops to
    st = os.stat(s.dir / "control.sock")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (d.pw_uid, d.pw_gid, 0o660)
    st = os.stat(s.dir / "run/milter.sock")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (d.pw_uid, d.pw_gid, 0o660)


def test_an_existing_queue_the_user_cannot_write_is_refused(sluiced, users):
    """A queue left owned by root: refused at start, naming the directory and the fix;
    the same for one root-owned file in a queue that is otherwise the user's; an empty
    root-owned directory (as systemd's ExecStartPre makes it) is taken over."""
    port = free_port()
    text = base_config(extra=f'intake {{ listen = "inet:127.0.0.1:{port}"; }}\n'
                             'queue { dir = "@DIR@/queue"; }')
    s = sluiced(text, start=False)
    q = s.dir / "queue"
    q.mkdir(mode=0o700)
    (q / "lock").write_text("")
    s.expected_rc = 1
    with pytest.raises(AssertionError):
        s.start(timeout=10)
    s.wait(10)
    assert s.returncode == 1
    assert re.search(rf"error: {re.escape(str(q))} is not usable by uid "
                     rf"{users['daemon'].pw_uid} \(owner 0, mode 0700\); fix: chown -R "
                     rf"{USER}: {re.escape(str(q))}", s.log.text()), s.log.tail()
    assert not os.path.exists(s.dir / "control.sock")

    # the directory is the user's now, one file in it is not
    subprocess.run(["chown", "-R", f"{USER}:", str(q)], check=True)
    (q / "tmp").mkdir()
    shutil.chown(q / "tmp", USER, USER)
    stray = q / "tmp" / "left-by-root"
    stray.write_text("x")
    stray.chmod(0o600)
    s2 = sluiced(text.replace("@DIR@/queue", str(q)), start=False)
    s2.expected_rc = 1
    with pytest.raises(AssertionError):
        s2.start(timeout=10)
    s2.wait(10)
    assert re.search(rf"{re.escape(str(stray))} is not readable and writable by uid "
                     rf"\d+ \(owner 0, mode 0600\); fix: chown -R {USER}: ",
                     s2.log.text()), s2.log.tail()

    # an empty directory owned by root is given to the user
    s3 = sluiced(text, start=False)
    (s3.dir / "queue").mkdir(mode=0o755)
    s3.start()
    st = os.stat(s3.dir / "queue")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (users["daemon"].pw_uid, 0o750)


# ---------------------------------------------------------------------------------------
# secret files

def redis_store_text(password_line):
    return ('store { type = "redis"; server = "127.0.0.1:1"; on_failure = "local"; '
            f'timeout = 50ms; {password_line} }}')


@pytest.mark.parametrize("mode, owner, ok", [
    (0o600, "root", True),
    (0o640, "root", True),
    (0o600, USER, True),
    (0o644, "root", False),
    (0o604, "root", False),
    (0o602, "root", False),
    (0o600, STRANGER, False),
])
def test_password_file_modes(workdir, users, mode, owner, ok):
    secret = workdir / "redis.secret"
    secret.write_text("s3cret-from-file\n")
    secret.chmod(mode)
    shutil.chown(secret, owner)
    conf = workdir / "sluice.conf"
    conf.write_text(base_config(extra=redis_store_text(f'password_file = "{secret}";'))
                    .replace("@DIR@", str(workdir)))
    res = sluiced_check(conf)
    if ok:
        assert res.returncode == 0, res.stderr
        return
    assert res.returncode == 1
    assert "s3cret-from-file" not in res.stderr
    if mode & 0o007:
        assert (f"store.password_file: {secret} has mode {mode:04o}: others may "
                f"{'change' if mode & 0o002 else 'read'} it; fix: chmod 0640 {secret}"
                in res.stderr), res.stderr
    else:
        assert (f"{secret} is owned by uid {users['stranger'].pw_uid}, neither root nor "
                f"the daemon's user; fix: chown root {secret}" in res.stderr), res.stderr


def test_inline_password_makes_the_configuration_a_secret(workdir, users):
    conf = workdir / "sluice.conf"
    conf.write_text(base_config(extra=redis_store_text('password = "inline-s3cret";'))
                    .replace("@DIR@", str(workdir)))
    conf.chmod(0o644)
    res = sluiced_check(conf)
    assert res.returncode == 1
    assert (f"store.password: {conf} (it holds a password) has mode 0644: others may read "
            f"it; fix: chmod 0640 {conf}") in res.stderr, res.stderr
    assert "inline-s3cret" not in res.stderr
    conf.chmod(0o640)
    assert sluiced_check(conf).returncode == 0


def test_route_password_file_checked_and_reload_refused(sluiced, users):
    """A route's password_file made readable to all while sluiced runs: the reload is
    refused with the file, its mode and the fix, and the running configuration stays."""
    port = free_port()
    s = sluiced(base_config(extra=f'''intake {{ listen = "inet:127.0.0.1:{port}"; }}
queue {{ dir = "@DIR@/queue"; }}
route "isp" {{
  domains = ["*"]; smarthost = "[127.0.0.1]:1"; tls = "none";
  auth {{ user = "me"; password_file = "@DIR@/isp.secret"; plaintext = true; }}
}}'''), start=False)
    secret = s.dir / "isp.secret"
    secret.write_text("route-s3cret\n")
    secret.chmod(0o640)
    shutil.chown(secret, "root", USER)
    # reload reads the configuration as the user: it must be able to
    s.config.chmod(0o640)
    shutil.chown(s.config, "root", USER)
    s.start()
    secret.chmod(0o644)
    res = s.cli("reload", check=False)
    assert res.returncode == 1
    assert (f"{secret} has mode 0644: others may read it; fix: chmod 0640 {secret}"
            in res.stdout + res.stderr), res
    assert "the running configuration is kept" in res.stdout + res.stderr
    secret.chmod(0o640)
    assert s.cli("reload").returncode == 0
    s.log.wait_for(r"configuration reloaded")


def test_secrets_appear_in_no_log_and_no_output(sluiced, users, redis, smarthost):
    """A Redis that refuses sluiced's password and a smarthost that refuses its AUTH:
    the failures are logged and shown, the passwords never."""
    redis_pw, route_pw = "Rd-Pa55-9f3e1c", "Rt-Pa55-77ab20"
    r = redis(extra=["--requirepass", "the-right-one"])
    sh = smarthost(auth_user="me", auth_password="not-what-sluice-sends",
                   auth_required=True)
    port = free_port()
    s = sluiced(f"""user = "{USER}";
workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "@DIR@/state";
log {{ target = "stderr"; level = "debug"; }}
control {{ listen = "unix:@DIR@/control.sock"; }}
intake {{ listen = "inet:127.0.0.1:{port}"; }}
queue {{ dir = "@DIR@/queue"; }}
store {{ type = "redis"; server = "{r.address}"; password = "{redis_pw}";
        on_failure = "local"; timeout = 200ms; }}
relay {{ retry {{ min = 1s; max = 2s; }} suspend {{ min = 1s; max = 2s; }} }}
route "isp" {{
  domains = ["*"]; smarthost = "[127.0.0.1]:{sh.port}"; tls = "none";
  auth {{ user = "me"; password_file = "@DIR@/isp.secret"; plaintext = true;
          mechanisms = "PLAIN LOGIN"; }}
}}
""", start=False)
    secret = s.dir / "isp.secret"
    secret.write_text(route_pw + "\n")
    secret.chmod(0o600)
    s.start()
    s.log.wait_for(r"redis store: .* unreachable \(AUTH: .*(WRONGPASS|invalid)", timeout=15)
    send_one(port)
    s.log.wait_for(r"(?i)auth", timeout=20)
    wait_until(lambda: re.search(r"relay: .*(535|authentication)", s.log.text(), re.I), 20,
               "the smarthost's refusal of AUTH in the log")
    outputs = [s.log.text()]
    for cmd in (("status",), ("status", "--json"), ("stats",), ("stats", "--json"),
                ("lanes",), ("lanes", "--json"), ("queue", "--json")):
        res = s.cli(*cmd, check=False)
        outputs.append(res.stdout + res.stderr)
    assert json.loads(s.cli("status", "--json").stdout)["store"]["up"] is False
    for out in outputs:
        assert redis_pw not in out and route_pw not in out
    # the base64 forms of what AUTH PLAIN would carry are not there either
    import base64
    for pw in (redis_pw, route_pw):
        b = base64.b64encode(f"\0me\0{pw}".encode()).decode()
        assert all(b not in out for out in outputs)


# ---------------------------------------------------------------------------------------
# the control socket's peers

def test_control_peers(sluiced, users, cli_copy):
    """A socket made 0666 by mistake: a stranger is refused all the same; a member of the
    socket's group may use every command (admin = "group", the default)."""
    s = sluiced(base_config(control='mode = "0666";'), start=False)
    readable_by_user(s)
    s.start()
    sock = str(s.dir / "control.sock")
    res = as_user(STRANGER, cli_copy, "-s", sock, "status", clear_groups=True)
    assert res.returncode == 1, res
    assert "permission denied" in res.stderr and "sluiced running" not in res.stdout
    s.log.wait_for(rf"warning: control: uid {users['stranger'].pw_uid} refused")

    res = as_user(OPERATOR, cli_copy, "-s", sock, "status")
    assert res.returncode == 0 and "sluiced" in res.stdout, res
    res = as_user(OPERATOR, cli_copy, "-s", sock, "reload")
    assert res.returncode == 0, res
    # the operator without its groups is a stranger
    res = as_user(OPERATOR, cli_copy, "-s", sock, "status", clear_groups=True)
    assert res.returncode == 1 and "permission denied" in res.stderr


def test_control_admin_root(sluiced, users, cli_copy):
    """admin = "root": the group may look, not change; root may do both."""
    port = free_port()
    s = sluiced(base_config(control='admin = "root";',
                            extra=f'intake {{ listen = "inet:127.0.0.1:{port}"; }}\n'
                                  'queue { dir = "@DIR@/queue"; }'), start=False)
    readable_by_user(s)
    s.start()
    sock = str(s.dir / "control.sock")
    for cmd in (["status"], ["stats", "--json"], ["queue"], ["limits", "top"], ["help"]):
        res = as_user(OPERATOR, cli_copy, "-s", sock, *cmd)
        assert res.returncode == 0, (cmd, res)
    for cmd in (["reload"], ["queue", "hold", "--all"], ["queue", "delete", "--all"],
                ["queue", "flush", "--all"], ["limits", "reset", "k"],
                ["lanes", "suspend", "isp", "1m"], ["lanes", "resume", "isp"]):
        res = as_user(OPERATOR, cli_copy, "-s", sock, *cmd)
        assert res.returncode == 1, (cmd, res)
        assert "permission denied: this command changes sluiced's state" in res.stderr, res
    assert s.log.findall(r"SIGHUP") == []
    assert s.cli("reload").returncode == 0
    s.log.wait_for(r"configuration reloaded")


def test_control_admin_root_reads_the_form_by_position(sluiced, users, cli_copy):
    """admin = "root": the form of a request decides, by position, from the command table,
    not a word among its arguments: the group may show a key named "set", and may not end
    the statistics interval (stats --reset), which root may."""
    s = sluiced(base_config(control='admin = "root";',
                            extra='limit "per-client" { stage = "connect"; key = "client_ip"; '
                                  'rate = "10/1m"; }'), start=False)
    readable_by_user(s)
    s.start()
    sock = str(s.dir / "control.sock")
    for cmd in (["limits", "show", "set"], ["limits", "show", "reset", "per-client"],
                ["limits", "top", "per-client"], ["stats"], ["stats", "--json"]):
        res = as_user(OPERATOR, cli_copy, "-s", sock, *cmd)
        assert res.returncode == 0, (cmd, res)
        assert "permission denied" not in res.stderr
    for cmd in (["stats", "--reset"], ["stats", "--json", "--reset"],
                ["limits", "--json", "reset", "k"], ["limits", "nonsense"]):
        res = as_user(OPERATOR, cli_copy, "-s", sock, *cmd)
        assert res.returncode == 1, (cmd, res)
        assert "permission denied" in res.stderr, (cmd, res)
    assert "interval ended by the control command" not in s.log.text()
    # a word after the form is no way around it: the handler takes only its options
    res = as_user(OPERATOR, cli_copy, "-s", sock, "stats", "x", "--reset")
    assert res.returncode == 1 and "usage: stats [--reset] [--json]" in res.stderr, res
    assert "interval ended by the control command" not in s.log.text()
    s.cli("stats", "--reset")
    s.log.wait_for(r"stats: interval ended by the control command")


def test_the_command_needs_no_secret(sluiced, users, cli_copy):
    """The sluice command reads sluice.conf only for its sockets: a program injecting mail
    as any user (`sluice sendmail`), and an operator asking for the status, work with
    the daemon's password and overrides files readable by root alone."""
    port = free_port()
    s = sluiced(base_config(extra=f"""
intake {{ listen = "inet:127.0.0.1:{port}"; }}
queue {{ dir = "@DIR@/queue"; }}
limit "per-domain" {{
  stage = "rcpt"; key = "rcpt_domain"; rate = "100/1m"; action = "tempfail";
  overrides = "@DIR@/domains.limits";
}}
route "isp" {{
  domains = ["*"]; smarthost = "[127.0.0.1]:{free_port()}"; tls = "none";
  auth {{ user = "me"; password_file = "@DIR@/isp.secret"; plaintext = true; }}
  rate = "1/1h";
}}
"""), start=False)
    for name, text in (("isp.secret", "not-for-programs\n"),
                       ("domains.limits", "example.net 5/1m\n")):
        (s.dir / name).write_text(text)
        (s.dir / name).chmod(0o600)
        shutil.chown(s.dir / name, "root", "root")
    s.config.chmod(0o644)
    s.start()
    conf = str(s.config)
    # the program: a stranger, without any of sluice's groups
    res = subprocess.run(["setpriv", f"--reuid={users['stranger'].pw_uid}",
                          f"--regid={users['stranger'].pw_gid}", "--clear-groups",
                          cli_copy, "-c", conf, "sendmail", "-f", "prog@example.org",
                          "someone@example.net"],
                         input="Subject: from a program\n\nHello.\n", capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res
    wait_until(lambda: "someone@example.net" in s.cli("queue").stdout, 10, "the message queued")
    # the operator: finds the control socket through the same file
    res = as_user(OPERATOR, cli_copy, "-c", conf, "status")
    assert res.returncode == 0 and "sluiced" in res.stdout, res
    # the daemon itself did read them: the override is in force
    assert "5/1m" in s.cli("limits", "show", "example.net").stdout


# ---------------------------------------------------------------------------------------
# systemd

class NotifySocket:
    def __init__(self, address):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(15)

    def next(self):
        return self.sock.recv(4096).decode()

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("abstract", [False, True])
def test_sd_notify(sluiced, workdir, abstract):
    """READY=1 comes only once the listeners accept, RELOADING=1 then READY=1 around a
    reload, STOPPING=1 at SIGTERM; "@name" is the abstract namespace."""
    if abstract:
        name = f"@sluice-test-{os.getpid()}-{time.monotonic_ns()}"
        ns = NotifySocket("\0" + name[1:])
    else:
        name = str(workdir / "notify.sock")
        ns = NotifySocket(name)
    try:
        port = free_port()
        s = sluiced(base_config(user="root", extra=f'intake {{ listen = "inet:127.0.0.1:{port}"; }}\n'
                                                   'queue { dir = "@DIR@/queue"; }'),
                    start=False, env=dict(os.environ, NOTIFY_SOCKET=name))
        s.start()
        msg = ns.next()
        assert "READY=1" in msg.split("\n"), msg
        assert "STATUS=running" in msg
        # the listeners were up when READY=1 was sent
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(str(s.dir / "run/milter.sock"))
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        s.signal(signal.SIGHUP)
        msg = ns.next()
        assert "RELOADING=1" in msg.split("\n") and "MONOTONIC_USEC=" in msg, msg
        assert "READY=1" in ns.next()
        s.signal(signal.SIGTERM)
        msg = ns.next()
        assert "STOPPING=1" in msg.split("\n"), msg
        assert s.wait(30) == 0
    finally:
        ns.close()


def test_ready_waits_for_the_listeners(sluiced, workdir):
    """A listener that cannot be bound: no READY=1 ever, and sluiced exits 1."""
    name = str(workdir / "notify.sock")
    ns = NotifySocket(name)
    ns.sock.settimeout(3)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        s = sluiced(base_config(user="root", extra='intake { listen = "inet:127.0.0.1:%d"; }\n'
                                'queue { dir = "@DIR@/queue"; }' % busy.getsockname()[1]),
                    start=False, env=dict(os.environ, NOTIFY_SOCKET=name))
        s.expected_rc = 1
        with pytest.raises(AssertionError):
            s.start(timeout=5)
        assert s.wait(10) == 1
        with pytest.raises(socket.timeout):
            ns.next()
    finally:
        busy.close()
        ns.close()


def build_dir():
    return pathlib.Path(SLUICED).resolve().parents[2]


def test_meson_install_and_the_unit(workdir):
    """meson install into a staging directory: the programs, the man pages, the unit, the
    example configuration and the examples; and systemd-analyze accepts the unit."""
    require_binary(SLUICED, "SLUICED")
    build = build_dir()
    meson = shutil.which("meson")
    if not meson or not (build / "meson-private").is_dir():
        pytest.skip("no meson build directory")
    intro = json.loads(subprocess.run([meson, "introspect", "--buildoptions", str(build)],
                                      capture_output=True, text=True, check=True).stdout)
    opts = {o["name"]: o["value"] for o in intro}
    dest = workdir / "dest"
    res = subprocess.run([meson, "install", "-C", str(build), "--no-rebuild", "--destdir",
                          str(dest)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr

    def staged(*parts):
        p = pathlib.Path(*parts)
        return dest / p.relative_to("/") if p.is_absolute() else dest / p

    prefix = opts["prefix"]

    def under_prefix(opt, *rest):
        return staged(os.path.join(prefix, opts[opt], *rest))

    sbin = under_prefix("sbindir", "sluiced")
    binary = under_prefix("bindir", "sluice")
    for p in (sbin, binary):
        assert p.is_file() and os.access(p, os.X_OK), p
    if shutil.which("scdoc"):
        for page in ("man8/sluiced.8", "man1/sluice.1", "man5/sluice.conf.5"):
            assert under_prefix("mandir", page).is_file(), page
    example = under_prefix("sysconfdir", "sluice", "sluice.conf.example")
    assert example.read_text() == (SOURCE_ROOT / "etc/sluice.conf").read_text()
    assert not under_prefix("sysconfdir", "sluice", "sluice.conf").exists()
    assert under_prefix("datadir", "doc", "sluice", "examples").is_dir()
    units = list(dest.rglob("sluiced.service"))
    assert len(units) == 1, units
    unit = units[0].read_text()
    real_sbin = os.path.join(prefix, opts["sbindir"], "sluiced")
    conf = os.path.join(prefix, opts["sysconfdir"], "sluice", "sluice.conf")
    assert f"ExecStart={real_sbin} -c {conf}\n" in unit
    assert "Type=notify" in unit and "ExecReload=/bin/kill -HUP $MAINPID" in unit
    if opts["systemdunitdir"]:
        assert units[0] == staged(opts["systemdunitdir"], "sluiced.service")

    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze is not installed")
    # verify wants the programs where the unit names them: point it at the staged ones
    check_unit = workdir / "sluiced.service"
    check_unit.write_text(unit.replace(real_sbin, str(sbin)))
    res = subprocess.run([analyze, "verify", "--man=no", str(check_unit)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sluiced.service" not in res.stderr, res.stderr


def test_shipped_configuration_layout(users):
    """The shipped etc/sluice.conf is the production layout, valid, and the sluice command
    finds its control socket in it."""
    require_binary(SLUICE, "SLUICE")
    shipped = SOURCE_ROOT / "etc/sluice.conf"
    text = shipped.read_text()
    assert re.search(r'^user = "sluice";$', text, re.M)
    assert 'listen = "unix:/run/sluice/control.sock";' in text
    assert sluiced_check(shipped).returncode == 0
    res = subprocess.run([SLUICE, "-c", str(shipped), "status"], capture_output=True,
                         text=True, timeout=20)
    # running or not, the command looked where the daemon listens
    assert res.returncode == 0 or "/run/sluice/control.sock" in res.stderr, res
