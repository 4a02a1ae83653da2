"""sluiced at its file-descriptor limit: it backs off instead of spinning on the
listener, says so once, keeps its open sessions, and accepts again when descriptors are
free.  The limit is lowered for the running daemon alone (prlimit)."""

import re
import resource
import socket
import time

import milter_wire as w
from conftest import milter_config, wait_until

NOFILE = 48


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0   # utime + stime, clock ticks


def test_fd_exhaustion_backs_off_logs_once_and_recovers(sluiced):
    inst = sluiced(milter_config(level="info"))
    resource.prlimit(inst.pid, resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    # A session that is open before the limit is hit, and must survive it.
    early = w.MilterClient(inst.milter_socket)
    early.negotiate()
    early.connect()

    clients = []
    for _ in range(NOFILE + 20):          # more than the daemon can hold
        s = socket.socket(socket.AF_UNIX)
        s.connect(inst.milter_socket)      # the kernel queues what sluiced cannot accept
        clients.append(s)
    inst.log.wait_for(r"cannot accept: Too many open files", timeout=10)

    # Over 2 s at the limit, a busy accept loop would burn ~2 s of CPU.
    t0 = cpu_seconds(inst.pid)
    time.sleep(2.0)
    used = cpu_seconds(inst.pid) - t0
    assert used < 0.5, f"sluiced used {used:.2f} s of CPU in 2 s at the fd limit"
    assert inst.alive()
    episodes = len(re.findall(r"cannot accept: Too many open files", inst.log.text()))
    assert episodes == 1, f"logged {episodes} times for one episode"

    # The session opened before goes on.
    result = early.message()
    assert w.accepted(result), result
    early.abort()
    early.quit()

    for s in clients:
        s.close()
    inst.log.wait_for(r"accepting again", timeout=10)
    with w.MilterClient(inst.milter_socket) as c:
        results = c.full_session()
    assert all(w.accepted(r) for r in results), results
    wait_until(lambda: inst.milter_stats()["sessions_current"] == 0, 10, "sessions to end")
