"""Postfix's smtp-sink(1) on a loopback port: a real SMTP server that takes every message
(or answers 450 to every RCPT), for the private Postfix instance of conftest.py and the
relay's tests.

``start()`` is the one place that starts it: each caller passes its own options (the
greeting's host name, a dump template, the command it refuses, the listen backlog) and
gets the process once it listens; ``stop()`` ends it.  smtp-sink drops to ``nobody``
before it writes its dump files, so a dump directory must be writable by that user.
"""

import os
import shutil
import subprocess

import pytest

SMTP_SINK = shutil.which("smtp-sink", path="/usr/sbin:/usr/bin") or "/usr/sbin/smtp-sink"


def start(port, log, backlog, *, hostname=None, dump=None, refuse=None):
    """Start smtp-sink as nobody on 127.0.0.1:port with the given listen backlog; its
    output is appended to the file log.  hostname: the name it greets with (-h); dump: the
    template of its dump files (-d, e.g. "DIR/msg." or "DIR/%M."); refuse: the command it
    answers 450 to (-r, e.g. "rcpt", which also turns off PIPELINING).

    Returns the subprocess.Popen once the port listens.  Skips the test where smtp-sink
    is not installed; fails it, with the log, when smtp-sink exits at once."""
    # conftest.py imports this module: its helpers are taken at call time
    from conftest import tcp_listening, wait_until

    if not os.path.exists(SMTP_SINK):
        pytest.skip("smtp-sink (postfix) is not installed")
    args = [SMTP_SINK, "-u", "nobody"]
    if hostname is not None:
        args += ["-h", hostname]
    if refuse is not None:
        args += ["-r", refuse]
    if dump is not None:
        args += ["-d", str(dump)]
    args += [f"127.0.0.1:{port}", str(backlog)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    wait_until(lambda: tcp_listening("127.0.0.1", port) or proc.poll() is not None, 10,
               "smtp-sink to listen")
    if proc.poll() is not None:
        with open(log, errors="replace") as f:
            raise AssertionError(f"smtp-sink exited:\n{f.read()}")
    return proc


def stop(proc):
    """End an smtp-sink start() returned (SIGTERM, then SIGKILL after 10 s); None and an
    smtp-sink that has already exited are left alone."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
