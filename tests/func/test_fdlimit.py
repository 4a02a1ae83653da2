"""sluiced at its file-descriptor limit.

The daemon holds back the descriptors of its own parts and a reserve; the sessions share
the rest.  Past it a connection is refused (as over max_sessions), said once, the open
sessions go on, the control socket answers, and sessions are admitted again when
descriptors are free.  Where the limit is lowered below what the daemon holds already
(prlimit on the running process), the kernel refuses accept(): sluiced backs off instead
of spinning, and the control socket still answers from a descriptor kept for it.  A limit
too low to start is refused at start, with the sum.
"""

import os
import re
import resource
import socket
import subprocess
import time

from peers import milter_wire as w
from conftest import SLUICED, milter_config, wait_until

SESSIONS = 16       # what the test leaves the sessions

POLICY_REQUEST = (b"request=smtpd_access_policy\nprotocol_state=RCPT\nprotocol_name=ESMTP\n"
                  b"client_address=192.0.2.1\nclient_name=client.example.net\n"
                  b"helo_name=x\nsender=a@example.org\nrecipient=b@example.net\n"
                  b"recipient_count=0\nqueue_id=\nsize=0\n\n")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0   # utime + stime, clock ticks


def held_back(inst):
    m = inst.log.wait_for(r"file descriptor limit \d+ \((\d+) held back from the sessions\)")
    return int(m.group(1))


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_sessions_share_what_the_limit_leaves_and_the_operator_keeps_control(sluiced):
    inst = sluiced(milter_config(level="info", extra="policy { listen = \"unix:@DIR@/policy.sock\"; }"))
    held = held_back(inst)
    nofile = held + SESSIONS
    hard = resource.prlimit(inst.pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(inst.pid, resource.RLIMIT_NOFILE, (nofile, hard))

    # A session that is open before the limit is reached, and must survive it.
    early = w.MilterClient(inst.milter_socket)
    early.negotiate()
    early.connect()

    # The others, each between two requests (a session that has sent nothing yet would
    # give way to a newcomer rather than hold the descriptors: test_hostile.py).
    held = []
    for _ in range(SESSIONS - 1):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(inst.dir / "policy.sock"))
        s.sendall(POLICY_REQUEST)
        assert s.recv(512).startswith(b"action=")
        held.append(s)
    clients = []
    for i in range(2 * SESSIONS):          # more than the sessions may hold
        s = socket.socket(socket.AF_UNIX)
        s.connect(inst.milter_socket if i % 2 else str(inst.dir / "policy.sock"))
        clients.append(s)
    inst.log.wait_for(r"refused: the sessions hold the descriptors the file descriptor "
                      r"limit leaves them", timeout=10)
    # refused: closed at once (EOF), not left in the listen queue
    time.sleep(1.0)
    closed = 0
    for s in clients:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
    assert closed == 2 * SESSIONS, closed

    # The operator's socket answers while the sessions hold all they may.
    res = inst.cli("status")
    assert res.returncode == 0 and res.stdout.strip(), res
    assert open_fds(inst.pid) <= nofile

    # Over 2 s at the limit, a busy accept loop would burn ~2 s of CPU.
    t0 = cpu_seconds(inst.pid)
    time.sleep(2.0)
    assert cpu_seconds(inst.pid) - t0 < 0.5
    refusals = len(re.findall(r"refused: the sessions hold", inst.log.text()))
    assert refusals <= 2, f"logged {refusals} times"   # once per service at most

    result = early.message()
    assert w.accepted(result), result
    early.abort()
    early.quit()

    for s in clients + held:
        s.close()
    wait_until(lambda: inst.milter_stats()["sessions_current"] == 0, 10, "sessions to end")
    with w.MilterClient(inst.milter_socket) as c:
        results = c.full_session()
    assert all(w.accepted(r) for r in results), results
    assert inst.alive()


def test_below_what_the_daemon_holds_it_backs_off_and_control_still_answers(sluiced):
    inst = sluiced(milter_config(level="info"))
    held_back(inst)
    # The limit at what is open now: the kernel refuses every accept.
    nofile = open_fds(inst.pid)
    hard = resource.prlimit(inst.pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(inst.pid, resource.RLIMIT_NOFILE, (nofile, hard))
    clients = []
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX)
        s.connect(inst.milter_socket)      # the kernel queues what sluiced cannot accept
        clients.append(s)
    inst.log.wait_for(r"cannot accept: Too many open files", timeout=10)
    t0 = cpu_seconds(inst.pid)
    time.sleep(2.0)
    used = cpu_seconds(inst.pid) - t0
    assert used < 0.5, f"sluiced used {used:.2f} s of CPU in 2 s at the fd limit"
    episodes = len(re.findall(r"milter\): cannot accept: Too many open files",
                              inst.log.text()))
    assert episodes == 1, f"logged {episodes} times for one episode"

    # control: accepted from the descriptor kept for it
    res = inst.cli("status", timeout=10)
    assert res.returncode == 0, res
    inst.log.wait_for(r"\(control\): at the file descriptor limit; accepting with the "
                      r"descriptor kept for it")

    for s in clients:
        s.close()
    resource.prlimit(inst.pid, resource.RLIMIT_NOFILE, (4096, hard))
    inst.log.wait_for(r"accepting again", timeout=10)
    with w.MilterClient(inst.milter_socket) as c:
        results = c.full_session()
    assert all(w.accepted(r) for r in results), results
    assert inst.cli("status").returncode == 0
    wait_until(lambda: inst.milter_stats()["sessions_current"] == 0, 10, "sessions to end")


def test_a_limit_too_low_to_serve_is_refused_at_start_with_the_sum(workdir):
    d = workdir
    conf = d / "sluiced.conf"
    conf.write_text(f"""user = "root";
state_dir = "{d}";
log {{ target = "stderr"; }}
control {{ listen = "unix:{d}/control.sock"; }}
milter {{ listen = "unix:{d}/milter.sock"; }}
intake {{ listen = "inet:127.0.0.1:1"; }}
queue {{ dir = "{d}/queue"; }}
""")
    res = subprocess.run(["prlimit", "--nofile=100", SLUICED, "-c", str(conf)],
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 1, res
    m = re.search(r"file descriptor limit 100 is too low: sluiced holds (\d+) open at start "
                  r"\+ (\d+) for the event loops \+ (\d+) listeners \+ (\d+) for the queue \+ "
                  r"(\d+) for the relay \+ (\d+) for metrics \+ (\d+) for Redis \+ (\d+) kept "
                  r"in reserve = (\d+), and needs 3 more for one session of each service",
                  res.stderr)
    assert m, res.stderr
    parts = [int(x) for x in m.groups()]
    assert sum(parts[:-1]) == parts[-1]
    assert parts[2] == 3 and parts[3] > 64 and parts[7] == 32
    # nothing was bound or made: the failure comes before the parts start
    assert not (d / "milter.sock").exists() and not (d / "queue").exists()
    # the same configuration starts with the limit it names
    want = int(re.search(r"to at least (\d+)", res.stderr).group(1))
    assert want >= parts[-1] + 3
