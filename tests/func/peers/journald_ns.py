"""Run sluiced with its stderr on a real systemd-journald, as systemd runs the unit.

Run as `unshare -m -p -f --kill-child --mount-proc --propagation private python3
peers/journald_ns.py UNIT SLUICED CONFIG BAD_CONFIG`: PID 1 of its own PID and mount namespaces
(everything it starts dies with it, even when the test kills unshare), it mounts tmpfs
on /run and on /etc/systemd (journald reads its own journald.conf, written there:
volatile storage, nothing read from or forwarded to the kernel log, syslog or wall)
and starts systemd-journald logging to its console (stderr, a file), so that nothing of
the machine's /run, /etc or kernel log is read or written.  It opens a stream to
/run/systemd/journal/stdout with the header systemd's exec code sends for
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
JOURNALD_CONF = """[Journal]
Storage=volatile
ReadKMsg=no
ForwardToSyslog=no
ForwardToKMsg=no
ForwardToConsole=no
ForwardToWall=no
"""


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
    if os.getpid() != 1:
        sys.exit("not PID 1 of a PID namespace: run under unshare -p -f --kill-child")
    unit_text = open(unit).read()
    ident = unit_setting(unit_text, "SyslogIdentifier")
    facility = FACILITIES[unit_setting(unit_text, "SyslogFacility")]
    for d in ("/run", "/etc/systemd"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", d], check=True)
    os.makedirs("/run/systemd/journal")
    with open("/etc/systemd/journald.conf", "w") as f:
        f.write(JOURNALD_CONF)
    jd_log = open(os.path.join(os.path.dirname(config), "journald.log"), "wb")
    jd = subprocess.Popen(["/lib/systemd/systemd-journald"], stdin=subprocess.DEVNULL,
                          stdout=jd_log, stderr=jd_log,
                          env=dict(os.environ, SYSTEMD_LOG_TARGET="console"))
    sd = None
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
        if sd is not None and sd.poll() is None:
            sd.kill()
            sd.wait(10)
        jd.terminate()
        jd.wait(10)


if __name__ == "__main__":
    main()
