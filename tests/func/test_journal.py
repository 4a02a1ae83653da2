"""Logs under systemd: each stderr line carries its priority when stderr is the journal.

The real journal: systemd-journald runs in a private mount namespace (journal_ns.py:
nothing of the machine's /run is touched), sluiced's stderr is a journal stream opened
with the header systemd sends for the shipped unit (its SyslogIdentifier= and
SyslogFacility=), and journalctl then shows the start lines at info and notice and the
failed reload's line at error, all with facility mail (2) and identifier sluiced.  What
this does not prove: systemd itself (PID 1) is not running, so the header is the one
systemd's exec code writes, sent by the helper.

Without journald: sluiced's stderr is a file and JOURNAL_STREAM names that file (lines
start with <N>), another file (bare lines, as when stderr was redirected away from the
journal), or is absent (bare).  A configuration error at start, written before the log
is set up, gets its <3> too.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess

import pytest

from conftest import SLUICED, require_binary, wait_until

HERE = pathlib.Path(__file__).resolve().parent
UNIT = HERE.parent.parent / "etc" / "sluiced.service.in"
JOURNALD = "/lib/systemd/systemd-journald"

CONFIG = """user = "root";
state_dir = "@DIR@";
shutdown_timeout = 2s;
log { target = "stderr"; level = "info"; }
control { listen = "unix:@DIR@/control.sock"; }
milter { listen = "unix:@DIR@/milter.sock"; }
"""
# a reload of this fails: an unknown key, which sluiced reports at error and keeps running
BAD = CONFIG + "bogus_key = 1;\n"
LINE = re.compile(r"^(<\d>)?\d{4}-\d\d-\d\dT[\d:.]+ sluiced\[\d+\]: (\w+): (.*)$")
PRIO = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "error": 3, "crit": 2}


def test_unit_sets_mail_facility_and_identifier():
    unit = UNIT.read_text()
    assert re.search(r"^SyslogFacility=mail$", unit, re.M)
    assert re.search(r"^SyslogIdentifier=sluiced$", unit, re.M)


def test_real_journald_files_priority_and_facility(tmp_path):
    require_binary(SLUICED, "SLUICED")
    if not os.access(JOURNALD, os.X_OK) or not shutil.which("journalctl"):
        pytest.skip("systemd-journald or journalctl is not installed")
    if not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    cfg, bad = tmp_path / "sluiced.conf", tmp_path / "bad.conf"
    cfg.write_text(CONFIG.replace("@DIR@", str(tmp_path)))
    bad.write_text(BAD.replace("@DIR@", str(tmp_path)))
    cfg.chmod(0o600)
    bad.chmod(0o600)
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "/usr/bin/python3",
                          str(HERE / "journal_ns.py"), str(UNIT), SLUICED, str(cfg), str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    entries = [json.loads(line) for line in res.stdout.splitlines()]
    assert entries[-1] == {"exit": 0}, entries
    entries = entries[:-1]
    assert len(entries) >= 4, entries
    for e in entries:
        # the prefix was taken off and became the priority; the rest is the line
        m = LINE.match(e["MESSAGE"])
        assert m and m.group(1) is None, e
        assert e["PRIORITY"] == str(PRIO[m.group(2)]), e
        assert e["SYSLOG_FACILITY"] == "2", e          # mail
        assert e["SYSLOG_IDENTIFIER"] == "sluiced", e
    by_text = {e["MESSAGE"].split(": ", 2)[2]: e["PRIORITY"] for e in entries}
    assert any(t.startswith("milter listening on") and p == "6" for t, p in by_text.items())
    assert any(t.startswith("sluiced ") and " started: " in t and p == "5"
               for t, p in by_text.items())
    assert any(t.startswith("reload failed, keeping the running configuration: ")
               and "bogus_key" in t and p == "3" for t, p in by_text.items()), by_text


def start_on_file(sluiced, journal_stream):
    """sluiced whose stderr is its log file, with JOURNAL_STREAM naming: "self" that file,
    "other" another file, None nothing."""
    sd = sluiced(CONFIG, start=False)
    sd.log.path.touch()
    env = dict(os.environ)
    env.pop("JOURNAL_STREAM", None)
    if journal_stream:
        st = os.stat(sd.log.path if journal_stream == "self" else "/")
        env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    sd.env = env
    return sd.start()


def reload_fails(sd):
    sd.config.write_text(sd.config_text + "bogus_key = 1;\n")
    sd.signal(signal.SIGHUP)
    wait_until(lambda: "reload failed" in sd.log.text(), 10, "the failed reload's line")


@pytest.mark.parametrize("journal_stream", ["self", "other", None])
def test_prefixes_on_daemon_lines(sluiced, journal_stream):
    sd = start_on_file(sluiced, journal_stream)
    wait_until(lambda: " started: " in sd.log.text(), 10, "the start line")
    reload_fails(sd)
    lines = [line for line in sd.log.text().splitlines() if " sluiced[" in line]
    assert lines
    levels = set()
    for line in lines:
        m = LINE.match(line)
        assert m, line
        levels.add(m.group(2))
        if journal_stream == "self":
            assert m.group(1) == f"<{PRIO[m.group(2)]}>", line
        else:
            assert m.group(1) is None, line
    assert {"info", "notice", "error"} <= levels
    error = next(line for line in lines if "reload failed" in line)
    assert error.startswith("<3>") == (journal_stream == "self")
    info = next(line for line in lines if "milter listening on" in line)
    assert info.startswith("<6>") == (journal_stream == "self")


@pytest.mark.parametrize("journal_stream", ["self", None])
def test_start_error_before_the_log_is_set_up(tmp_path, journal_stream):
    require_binary(SLUICED, "SLUICED")
    cfg = tmp_path / "sluiced.conf"
    cfg.write_text(BAD.replace("@DIR@", str(tmp_path)))
    cfg.chmod(0o600)
    err = tmp_path / "stderr"
    env = dict(os.environ)
    env.pop("JOURNAL_STREAM", None)
    with open(err, "wb") as f:
        if journal_stream:
            st = os.fstat(f.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        rc = subprocess.run([SLUICED, "-c", str(cfg)], stderr=f, env=env, timeout=30).returncode
    assert rc == 1
    text = err.read_text()
    assert "bogus_key" in text
    assert text.startswith("<3>sluiced: " if journal_stream else "sluiced: "), text
