"""The TCP control port: an inet control socket takes a password.

A unix control socket checks its peers' credentials; an inet one has none, so sluiced
wants control.password_file (every command) and may have control.read_password_file
(the commands that change nothing), and `sluice -s inet:HOST:PORT` sends one from
--password-file or $SLUICE_CONTROL_PASSWORD (or, for a socket found in sluice.conf, the
configuration's files when it may read them).  Run as the user `nobody` with runuser(1),
as any local user could: without a password, or with a wrong one, nothing is done; with
the read-only one, only what changes nothing; with the admin one, everything.  A
configuration with an inet control socket and no password_file, or with a password file
others may read, is refused with its file, line and key.
"""
import json
import os
import pwd
import re
import shutil
import smtplib
import subprocess

import pytest

from conftest import SLUICE, SLUICED, free_port, require_binary, sluiced_check

ADMIN_PW = "Adm1n pass %with spaces"
READ_PW = "r3ad-only-pw"
STRANGER = "nobody"


def as_stranger(*argv, env=None):
    """argv run as nobody (runuser -u nobody), with only env's variables added."""
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("needs root and runuser(1)")
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(["runuser", "-u", STRANGER, "--", "env", *extra, *argv],
                          capture_output=True, text=True, timeout=30)


def write_secret(path, text, mode=0o600, owner="root"):
    path.write_text(text + "\n")
    path.chmod(mode)
    shutil.chown(path, owner)


def config(port, cport, control_extra='admin = "root";', read=True):
    pw = 'password_file = "@DIR@/control.secret";'
    if read:
        pw += ' read_password_file = "@DIR@/control-read.secret";'
    return f"""user = "root";
workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
log {{ target = "stderr"; level = "info"; }}
control {{ listen = ["unix:@DIR@/control.sock", "inet:127.0.0.1:{cport}"]; {pw}
          {control_extra} }}
milter {{ listen = "unix:@DIR@/milter.sock"; }}
intake {{ listen = "inet:127.0.0.1:{port}"; }}
queue {{ dir = "@DIR@/queue"; }}
"""


def start(sluiced, read=True, control_extra='admin = "root";'):
    port, cport = free_port(), free_port()
    s = sluiced(config(port, cport, control_extra, read), start=False)
    write_secret(s.dir / "control.secret", ADMIN_PW)
    write_secret(s.dir / "control-read.secret", READ_PW)
    s.start()
    s.port, s.inet = port, f"inet:127.0.0.1:{cport}"
    return s


def queued(s):
    """The queue's message IDs, asked as root on the unix socket."""
    out = s.cli("queue", "--json").stdout
    return [json.loads(line)["id"] for line in out.splitlines() if line.startswith("{")]


def queue_one(s):
    with smtplib.SMTP("127.0.0.1", s.port, timeout=30) as c:
        c.sendmail("me@example.org", ["someone@example.net"], "Subject: hi\r\n\r\nHello.\r\n")
    ids = queued(s)
    assert len(ids) == 1, ids
    return ids[0]


def test_without_a_password_a_local_user_gets_nothing(sluiced, cli_copy):
    """nobody on the TCP port: refused, the message stays, a warning names the peer."""
    s = start(sluiced)
    qid = queue_one(s)
    for cmd in (["queue", "delete", qid], ["status"], ["queue", "delete", "--all"]):
        res = as_stranger(cli_copy, "-s", s.inet, *cmd)
        assert res.returncode == 1, (cmd, res)
        assert "permission denied: this control socket takes a password first" in res.stderr
    assert queued(s) == [qid]
    s.log.wait_for(r"warning: sid=\w+ svc=control peer=127\.0\.0\.1:\d+ control: refused: "
                   r"no password given, closing")
    # a configuration the stranger may read names the port and the password file, which
    # it may not read: sluice goes on without, and is refused
    conf = s.dir / "client.conf"
    conf.write_text(f'milter {{ listen = "unix:{s.dir}/milter.sock"; }}\n'
                    f'control {{ listen = "{s.inet}"; '
                    f'password_file = "{s.dir}/control.secret"; }}\n')
    conf.chmod(0o644)
    res = as_stranger(cli_copy, "-c", str(conf), "queue", "delete", qid)
    assert res.returncode == 1, res
    assert "permission denied: this control socket takes a password first" in res.stderr
    assert queued(s) == [qid]


def test_a_wrong_password_is_refused_and_logged_once_without_it(sluiced, cli_copy):
    s = start(sluiced)
    qid = queue_one(s)
    mark = len(s.log.lines())
    res = as_stranger(cli_copy, "-s", s.inet, "queue", "delete", qid,
                      env={"SLUICE_CONTROL_PASSWORD": "Guess-" + ADMIN_PW})
    assert res.returncode == 1, res
    assert res.stderr == "permission denied: wrong password\n", res
    assert queued(s) == [qid]
    s.log.wait_for(r"control: refused: wrong password, closing", after=mark)
    assert len(s.log.findall(r"wrong password", after=mark)) == 1
    # a malformed auth request: refused the same way (the codec's error, not the bytes)
    import socket
    with socket.create_connection(("127.0.0.1", int(s.inet.rsplit(":", 1)[1])), 10) as c:
        c.sendall(b"auth %zz\n")
        reply = c.recv(4096)
        assert reply.startswith(b"error ") and b"malformed auth request" in reply, reply
        assert c.recv(4096) == b""  # closed
    s.log.wait_for(r"control: refused: bad %XX in the password, closing")
    text = s.log.text()
    for pw in (ADMIN_PW, READ_PW, "Guess-"):
        assert pw not in text


def test_the_passwords_follow_the_admin_and_read_split(sluiced, cli_copy, workdir):
    """The read-only password runs what changes nothing and is refused the rest; the admin
    one runs every command, from a file (--password-file) or the environment."""
    s = start(sluiced)
    qid = queue_one(s)
    read_env = {"SLUICE_CONTROL_PASSWORD": READ_PW}
    for cmd in (["status"], ["stats"], ["queue"], ["queue", "show", qid],
                ["limits", "show", "set"], ["help"]):
        res = as_stranger(cli_copy, "-s", s.inet, *cmd, env=read_env)
        assert res.returncode == 0, (cmd, res)
    for cmd in (["queue", "delete", qid], ["queue", "--json", "hold", qid], ["reload"],
                ["stats", "--reset"], ["limits", "reset", "k"]):
        res = as_stranger(cli_copy, "-s", s.inet, *cmd, env=read_env)
        assert res.returncode == 1, (cmd, res)
        assert ("permission denied: this command changes sluiced's state, and the password "
                "given is control.read_password_file's") in res.stderr, res
    assert queued(s) == [qid]

    stranger = pwd.getpwnam(STRANGER)
    mine = workdir / "my.secret"
    write_secret(mine, ADMIN_PW, owner=stranger.pw_name)
    res = as_stranger(cli_copy, "-s", s.inet, "--password-file", str(mine), "queue", "hold",
                      qid)
    assert res.returncode == 0, res
    res = as_stranger(cli_copy, "-s", s.inet, "queue", "delete", qid,
                      env={"SLUICE_CONTROL_PASSWORD": ADMIN_PW})
    assert res.returncode == 0, res
    assert queued(s) == []
    # --password-file wins over the environment
    res = as_stranger(cli_copy, "-s", s.inet, "--password-file", str(mine), "status",
                      env={"SLUICE_CONTROL_PASSWORD": "wrong"})
    assert res.returncode == 0, res
    res = as_stranger(cli_copy, "-s", s.inet, "--password-file", str(workdir / "none"),
                      "status")
    assert res.returncode != 0 and "--password-file" in res.stderr, res


def test_sluice_reads_the_password_file_of_the_configuration(sluiced):
    """Root finds the inet socket in sluice.conf and reads control.password_file there."""
    require_binary(SLUICE, "SLUICE")
    port, cport = free_port(), free_port()
    s = sluiced(config(port, cport).replace(
        f'["unix:@DIR@/control.sock", "inet:127.0.0.1:{cport}"]',
        f'"inet:127.0.0.1:{cport}"'), start=False)
    write_secret(s.dir / "control.secret", ADMIN_PW)
    write_secret(s.dir / "control-read.secret", READ_PW)
    s.start()
    res = subprocess.run([SLUICE, "-c", str(s.config), "stats", "--reset"],
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res
    s.log.wait_for(r"stats: interval ended by the control command")


def test_the_start_says_how_each_control_listener_is_protected(sluiced):
    s = start(sluiced)
    s.log.wait_for(r'control on unix:\S+/control.sock: protected by peer credentials '
                   r'\(SO_PEERCRED\): root and sluiced\'s user run every command, the '
                   r'socket\'s group only those that change nothing \(admin = "root"\)')
    s.log.wait_for(rf"control on {re.escape(s.inet)}: protected by password: password_file's "
                   r"runs every command, read_password_file's only those that change nothing")


def test_a_reload_changes_the_password_for_new_connections(sluiced, cli_copy):
    """A new password works after the reload and the old one no more; a password file
    made readable to others fails the reload, and the running password stays."""
    s = start(sluiced)
    admin = {"SLUICE_CONTROL_PASSWORD": ADMIN_PW}
    assert as_stranger(cli_copy, "-s", s.inet, "status", env=admin).returncode == 0
    write_secret(s.dir / "control.secret", "a new one")
    assert s.cli("reload").returncode == 0
    s.log.wait_for(r"configuration reloaded")
    res = as_stranger(cli_copy, "-s", s.inet, "status", env=admin)
    assert res.returncode == 1 and "wrong password" in res.stderr, res
    new = {"SLUICE_CONTROL_PASSWORD": "a new one"}
    assert as_stranger(cli_copy, "-s", s.inet, "status", env=new).returncode == 0
    # a bad password file: the reload fails, naming it, and "a new one" stays
    write_secret(s.dir / "control.secret", "a third one", mode=0o644)
    res = s.cli("reload", check=False)
    assert res.returncode == 1, res
    secret = s.dir / "control.secret"
    assert (f"control.password_file: {secret} has mode 0644: others may read it; fix: "
            f"chmod 0640 {secret}") in res.stdout + res.stderr, res
    assert as_stranger(cli_copy, "-s", s.inet, "status", env=new).returncode == 0
    res = as_stranger(cli_copy, "-s", s.inet, "status",
                      env={"SLUICE_CONTROL_PASSWORD": "a third one"})
    assert res.returncode == 1, res



def test_an_inet_control_socket_without_a_password_is_refused(workdir):
    conf = workdir / "sluice.conf"
    port = free_port()
    conf.write_text(f'''user = "root";
state_dir = "{workdir}";
milter {{ listen = "unix:{workdir}/m.sock"; }}
control {{
  listen = ["unix:{workdir}/c.sock",
            "inet:127.0.0.1:{port}"];
}}
''')
    conf.chmod(0o600)
    res = sluiced_check(conf)
    assert res.returncode == 1, res
    assert (f'{conf}:6: control.listen[1]: "inet:127.0.0.1:{port}" is an inet address, whose '
            'clients carry no credentials: give password_file = '
            '"/etc/sluice/control.secret"; (a file only root and sluiced\'s user may read), '
            'or use a unix socket') in res.stderr, res.stderr
    # the start refuses it the same way, and binds nothing
    res = subprocess.run([SLUICED, "-c", str(conf)], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 1 and f"{conf}:6: control.listen[1]:" in res.stderr, res
    assert not os.path.exists(workdir / "c.sock")


@pytest.mark.parametrize("mode, owner, key, why", [
    (0o644, "root", "password_file", "has mode 0644: others may read it; fix: chmod 0640"),
    (0o602, "root", "read_password_file", "has mode 0602: others may change it"),
    (0o600, STRANGER, "password_file", "is owned by uid"),
])
def test_a_password_file_with_loose_permissions_is_refused(workdir, mode, owner, key, why):
    port = free_port()
    conf = workdir / "sluice.conf"
    files = {"password_file": workdir / "admin.secret",
             "read_password_file": workdir / "read.secret"}
    for k, path in files.items():
        write_secret(path, f"pw of {k}", *((mode, owner) if k == key else ()))
    conf.write_text(f'''user = "root";
state_dir = "{workdir}";
milter {{ listen = "unix:{workdir}/m.sock"; }}
control {{
  listen = "inet:127.0.0.1:{port}";
  password_file = "{files["password_file"]}";
  read_password_file = "{files["read_password_file"]}";
}}
''')
    conf.chmod(0o600)
    res = sluiced_check(conf)
    assert res.returncode == 1, res
    line = 6 if key == "password_file" else 7
    assert f"{conf}:{line}: control.{key}: {files[key]} {why}" in res.stderr, res.stderr
    assert "pw of" not in res.stderr
