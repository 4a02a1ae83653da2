"""Run sluiced with its stderr on a real systemd-journald, as systemd runs the unit.

Run as `unshare -m --propagation private python3 journal_ns.py UNIT SLUICED CONFIG
BAD_CONFIG`: in its own mount namespace (so the machine's /run is not touched) it mounts
tmpfs on /run/systemd and /run/log, starts systemd-journald (volatile storage), opens a
stream to /run/systemd/journal/stdout with the header systemd's exec code sends for
StandardError=journal -- identifier from the unit's SyslogIdentifier=, priority the
unit's SyslogFacility= with level info, level prefixes parsed -- makes it sluiced's
stderr with JOURNAL_STREAM set to its device and inode (as systemd does), starts
sluiced, makes a reload fail (BAD_CONFIG copied over CONFIG, SIGHUP), stops it, and
prints the journal's entries of identifier sluiced as JSON lines on stdout.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

FACILITIES = {"kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5}


def unit_setting(unit_text, key):
    m = re.search(rf"^{key}=(\S+)$", unit_text, re.M)
    if not m:
        sys.exit(f"the unit sets no {key}=")
    return m.group(1)


def wait_for(cond, what, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    sys.exit(f"timed out waiting for {what}")


def main():
    unit, sluiced, config, bad = sys.argv[1:5]
    unit_text = open(unit).read()
    ident = unit_setting(unit_text, "SyslogIdentifier")
    facility = FACILITIES[unit_setting(unit_text, "SyslogFacility")]
    for d in ("/run/systemd", "/run/log"):
        os.makedirs(d, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", d], check=True)
    os.makedirs("/run/systemd/journal")
    jd = subprocess.Popen(["/lib/systemd/systemd-journald"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists("/run/systemd/journal/stdout"), "journald")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("/run/systemd/journal/stdout")
        s.shutdown(socket.SHUT_RD)
        # identifier, unit, priority, level_prefix, forward to syslog, kmsg, console
        s.sendall(f"{ident}\n\n{facility * 8 + 6}\n1\n0\n0\n0\n".encode())
        st = os.fstat(s.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        control = re.search(r'listen = "unix:([^"]*control[^"]*)"', open(config).read())[1]
        sd = subprocess.Popen([sluiced, "-c", config], stdin=subprocess.DEVNULL,
                              stdout=s.fileno(), stderr=s.fileno(), env=env)
        s.close()
        wait_for(lambda: os.path.exists(control), "sluiced's control socket")
        time.sleep(0.3)
        shutil.copy(bad, config)
        sd.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        sd.send_signal(signal.SIGTERM)
        rc = sd.wait(30)
        time.sleep(0.5)   # journald reads the stream's end
        out = subprocess.run(["journalctl", "--directory=/run/log/journal", "-o", "json",
                              "--no-pager", f"SYSLOG_IDENTIFIER={ident}"],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            e = json.loads(line)
            print(json.dumps({k: e.get(k) for k in ("MESSAGE", "PRIORITY", "SYSLOG_FACILITY",
                                                    "SYSLOG_IDENTIFIER")}))
        print(json.dumps({"exit": rc}))
    finally:
        jd.terminate()
        jd.wait(10)


if __name__ == "__main__":
    main()
