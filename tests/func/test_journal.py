"""Logs under systemd: each stderr line carries its priority when stderr is the journal.

Without journald (the real journal is test_journald.py): sluiced's stderr is a file and
JOURNAL_STREAM names that file (lines are "<N>level: message", the journal adding the
time and identifier itself), another file (dated lines with sluiced[PID], as when stderr
was redirected away from the journal), or is absent (the same).  A configuration error
or a usage error at start, written before the log is set up, gets its <3> too.
"""

import os
import pathlib
import re
import signal
import subprocess

import pytest

from conftest import SLUICED, require_binary, wait_until

UNIT = pathlib.Path(__file__).resolve().parent.parent.parent / "etc" / "sluiced.service.in"

CONFIG = """user = "root";
state_dir = "@DIR@";
shutdown_timeout = 2s;
log { target = "stderr"; level = "info"; }
control { listen = "unix:@DIR@/control.sock"; }
milter { listen = "unix:@DIR@/milter.sock"; }
"""
BAD = CONFIG + "bogus_key = 1;\n"   # a start with it fails
# a line on a plain stderr, and on the journal (which adds the time and identifier itself)
LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+ sluiced\[\d+\]: (\w+): (.*)$")
JLINE = re.compile(r"^<(\d)>(\w+): (.*)$")
PRIO = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "error": 3, "crit": 2}


def test_unit_sets_mail_facility_and_identifier():
    unit = UNIT.read_text()
    assert re.search(r"^SyslogFacility=mail$", unit, re.M)
    assert re.search(r"^SyslogIdentifier=sluiced$", unit, re.M)


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
    lines = sd.log.text().splitlines()
    assert lines
    levels = set()
    for line in lines:
        if journal_stream == "self":
            m = JLINE.match(line)
            assert m and m.group(1) == str(PRIO[m.group(2)]), line
            level, text = m.group(2), m.group(3)
        else:
            m = LINE.match(line)
            assert m, line
            level, text = m.group(1), m.group(2)
        levels.add(level)
        # one line per message, nothing of the time or pid doubled in the journal
        assert "sluiced[" not in text, line
    assert {"info", "notice", "error"} <= levels
    error = next(line for line in lines if "reload failed" in line)
    assert error.startswith("<3>error: reload failed") == (journal_stream == "self")
    info = next(line for line in lines if "milter listening on" in line)
    assert info.startswith("<6>info: milter listening on") == (journal_stream == "self")


def run_at_start(tmp_path, args, journal_stream):
    """sluiced ARGS with its stderr on a file that JOURNAL_STREAM names (journal_stream
    true) or not: its exit status and what it wrote."""
    require_binary(SLUICED, "SLUICED")
    err = tmp_path / "stderr"
    env = dict(os.environ)
    env.pop("JOURNAL_STREAM", None)
    with open(err, "wb") as f:
        if journal_stream:
            st = os.fstat(f.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        rc = subprocess.run([SLUICED] + args, stderr=f, env=env, timeout=30).returncode
    return rc, err.read_text()


@pytest.mark.parametrize("journal_stream", ["self", None])
def test_start_error_before_the_log_is_set_up(tmp_path, journal_stream):
    cfg = tmp_path / "sluiced.conf"
    cfg.write_text(BAD.replace("@DIR@", str(tmp_path)))
    cfg.chmod(0o600)
    rc, text = run_at_start(tmp_path, ["-c", str(cfg)], journal_stream)
    assert rc == 1
    assert "bogus_key" in text
    assert text.startswith("<3>sluiced: " if journal_stream else "sluiced: "), text


@pytest.mark.parametrize("journal_stream", ["self", None])
@pytest.mark.parametrize("args,text", [(["-x"], "invalid option -- 'x'"),
                                       (["-c"], "option requires an argument -- 'c'"),
                                       (["extra"], "unexpected argument 'extra'")])
def test_usage_error_at_start(tmp_path, journal_stream, args, text):
    """getopt's errors carry the priority too (its own message would not)."""
    rc, out = run_at_start(tmp_path, args, journal_stream)
    assert rc == 2
    first = out.splitlines()[0]
    assert first == ("<3>" if journal_stream else "") + "sluiced: " + text
