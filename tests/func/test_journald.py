"""Logs under systemd, on the real journal: systemd-journald runs in private PID and mount
namespaces (peers/journald_ns.py: nothing of the machine's /run, /etc/systemd or kernel log is
read or written, and everything dies with the namespace), sluiced's stderr is a journal
stream opened with the header systemd sends for the shipped unit (its SyslogIdentifier=
and SyslogFacility=), and journalctl then shows the start lines at info and notice and
the failed reload's line at error, all with facility mail (2) and identifier sluiced,
each message once (no second time or sluiced[PID] in it).  What this does not prove:
systemd itself (PID 1) is not running, so the header is the one systemd's exec code
writes, sent by the helper.

Where namespaces or mounts are not permitted (root in a default Docker container) the
file skips, and a run of it alone exits 77 (conftest.py), which meson shows as SKIP.
"""

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import SLUICED, require_binary
from test_journal import BAD, CONFIG, PRIO   # BAD: its reload fails (an unknown key)

HERE = pathlib.Path(__file__).resolve().parent
UNIT = HERE.parent.parent / "etc" / "sluiced.service.in"
JOURNALD = "/lib/systemd/systemd-journald"
UNSHARE = ["unshare", "-m", "-p", "-f", "--kill-child", "--mount-proc",
           "--propagation", "private"]

def namespaces_refused():
    """Why private namespaces with a tmpfs cannot be had here, or None."""
    if os.geteuid() != 0:
        return "needs root for private namespaces"
    if not shutil.which("unshare"):
        return "unshare(1) is not installed"
    try:
        res = subprocess.run(UNSHARE + ["sh", "-c", "mount -t tmpfs tmpfs /run"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare: {e}"
    if res.returncode != 0:
        return "private namespaces or a tmpfs mount refused here: " + \
            (res.stderr.strip().splitlines() or ["exit %d" % res.returncode])[-1]
    return None


def test_real_journald_files_priority_and_facility(tmp_path):
    require_binary(SLUICED, "SLUICED")
    if not os.access(JOURNALD, os.X_OK) or not shutil.which("journalctl"):
        pytest.skip("systemd-journald or journalctl is not installed")
    why = namespaces_refused()
    if why:
        pytest.skip(why)
    cfg, bad = tmp_path / "sluiced.conf", tmp_path / "bad.conf"
    cfg.write_text(CONFIG.replace("@DIR@", str(tmp_path)))
    bad.write_text(BAD.replace("@DIR@", str(tmp_path)))
    cfg.chmod(0o600)
    bad.chmod(0o600)
    res = subprocess.run(UNSHARE + ["/usr/bin/python3", str(HERE / "peers/journald_ns.py"),
                                    str(UNIT), SLUICED, str(cfg), str(bad)],
                         capture_output=True, text=True, timeout=60)
    jd_log = tmp_path / "journald.log"
    diag = res.stdout + res.stderr + (jd_log.read_text() if jd_log.exists() else "")
    assert res.returncode == 0, diag
    entries = [json.loads(line) for line in res.stdout.splitlines()]
    assert entries[-1] == {"exit": 0}, entries
    entries = entries[:-1]
    assert len(entries) >= 4, entries
    by_text = {}
    for e in entries:
        # the prefix was taken off and became the priority; the rest is "level: message"
        level, _, text = e["MESSAGE"].partition(": ")
        assert level in PRIO and text, e
        assert e["PRIORITY"] == str(PRIO[level]), e
        assert "sluiced[" not in text, e                 # nothing doubled
        assert e["SYSLOG_FACILITY"] == "2", e          # mail
        assert e["SYSLOG_IDENTIFIER"] == "sluiced", e
        by_text[text] = e["PRIORITY"]
    assert any(t.startswith("milter listening on") and p == "6" for t, p in by_text.items())
    assert any(t.startswith("sluiced ") and " started: " in t and p == "5"
               for t, p in by_text.items())
    assert any(t.startswith("reload failed, keeping the running configuration: ")
               and "bogus_key" in t and p == "3" for t, p in by_text.items()), by_text
