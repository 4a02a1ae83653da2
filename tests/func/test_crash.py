"""The intake's promise across crashes: a 250 to the final dot means the message is in the
queue, whole, once (doc/QUEUE.md, "Guarantees"; law 2, doc/ARCHITECTURE.md).

Several SMTP clients (Python's smtplib, over concurrent connections) inject a few hundred
messages of mixed sizes and recipient counts while another thread kills sluiced with
SIGKILL at random moments and starts it again on the same port and queue directory.  The
clients behave like an MTA: a transaction that did not end in 250 (connection refused or
cut, a 4xx) is sent again.  Each client records, for each message, the QID of the 250 it
finally got and the exact bytes it sent.

At the end sluiced is stopped cleanly and every file under queue/msg/ is read with the
independent reader (peers/queuefile.py):

* every message answered 250 is there under its QID, exactly once, with its envelope
  and its body byte for byte (sluice's Received: header checked separately);
* a file whose QID no client was told (RFC 1047's window: committed, then killed before
  the reply went out) is an exact copy of a message that was sent -- a duplicate is
  allowed, a loss or a mix-up is not; they are counted and reported;
* nothing is in corrupt/, and tmp/ is empty after the restarts' recoveries.

SIGKILL tests the process dying, not the machine: the page cache survives it, so this
test cannot show a missing flush; the unit tests and the commit order in queue_dir.c
cover that part.
"""

import collections
import json
import os
import random
import re
import signal
import smtplib
import threading
import time


from conftest import free_port, wait_until
from peers import queuefile

SEED = int(os.environ.get("SLUICE_CRASH_SEED", "1047"))
MESSAGES = 1200
CLIENTS = 6
MAX_KILLS = 12
HOSTNAME = "mx.sluice.test"
RECEIVED_RE = re.compile(
    rb"Received: from client\.sluice\.test \(\[127\.0\.0\.1\]\)\r\n"
    rb"\tby mx\.sluice\.test \(sluice\) with ESMTP id (?P<id>[0-9A-Z]{16})"
    rb"(?:\r\n\tfor <(?P<for>[^>\r\n]*)>)?; [^\r\n]+\r\n")


def config(port):
    return "\n".join([
        "workers = 2;",
        "stats_interval = 0;",
        'state_dir = "@DIR@";',
        'log { target = "stderr"; level = "notice"; }',
        "control {", '  listen = "unix:@DIR@/control.sock";', "}",
        "intake {",
        f'  listen = "inet:127.0.0.1:{port}";',
        f'  hostname = "{HOSTNAME}";',
        "  command_timeout = 10s;",
        "}",
        "queue {", '  dir = "@DIR@/queue";', "}",
    ]) + "\n"


class Message:
    def __init__(self, index, sender, rcpts, body):
        self.index = index
        self.sender = sender
        self.rcpts = rcpts
        self.body = body            # CRLF lines, not stuffed: what must be stored
        self.qid = None             # from the 250 that ended its transaction
        self.attempts = 0


def make_messages(rng):
    """Mixed sizes from 200 bytes to ~300 KB (log-uniform), 1-50 recipients, some dot
    lines, every line CRLF and at most 998 octets."""
    out = []
    for i in range(MESSAGES):
        size = int(200 * (1500 ** rng.random()))
        nrcpt = 1 if rng.random() < 0.4 else rng.randint(2, 50)
        sender = "" if i % 50 == 7 else f"sender{i}@sluice.test"
        rcpts = [f"r{i}.{j}@d{j % 7}.example.net" for j in range(nrcpt)]
        head = (f"From: <sender{i}@sluice.test>\r\nTo: <r{i}.0@d0.example.net>\r\n"
                f"Subject: crash test message {i}\r\nMessage-ID: <{i}.{SEED}@sluice.test>\r\n"
                "\r\n").encode()
        lines = []
        total = len(head)
        while total < size:
            kind = rng.random()
            if kind < 0.03:
                line = b"."
            elif kind < 0.06:
                line = b".." + rng.choice([b"", b"x", b". dot dot"])
            elif kind < 0.12:
                line = b"." + rng.randbytes(rng.randint(0, 60)).hex().encode()
            elif kind < 0.15:
                line = b""
            else:
                n = rng.randint(1, 200)
                line = (f"{i}:{len(lines)} ".encode() + rng.randbytes(n).hex().encode())[:n + 8]
            lines.append(line + b"\r\n")
            total += len(line) + 2
        out.append(Message(i, sender, rcpts, head + b"".join(lines)))
    return out


class Injector:
    """CLIENTS threads sending every message until it gets a 250, retrying the others."""

    def __init__(self, port, messages):
        self.port = port
        self.todo = collections.deque(messages)
        self.lock = threading.Lock()
        self.pending = len(messages)
        self.failures = collections.Counter()   # why transactions failed
        self.errors = []                        # unexpected: permanent replies
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True)
                        for n in range(CLIENTS)]

    def start(self):
        for t in self.threads:
            t.start()

    def done(self):
        with self.lock:
            return self.pending == 0 or bool(self.errors)

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def take(self):
        with self.lock:
            return self.todo.popleft() if self.todo else None

    def give_back(self, m, why):
        with self.lock:
            self.todo.append(m)
            self.failures[why] += 1

    def run(self, n):
        rng = random.Random(SEED * 100 + n)
        conn = None
        while not self.done():
            m = self.take()
            if m is None:
                time.sleep(0.02)
                continue
            m.attempts += 1
            try:
                if conn is None:
                    conn = smtplib.SMTP("127.0.0.1", self.port, timeout=20,
                                        local_hostname="client.sluice.test")
                    conn.ehlo()
                qid = self.send(conn, m)
            except smtplib.SMTPResponseException as e:
                if 400 <= e.smtp_code < 500:
                    why = f"{e.smtp_code} reply"
                else:
                    with self.lock:
                        self.errors.append(f"message {m.index}: {e.smtp_code} {e.smtp_error!r}")
                    why = "permanent"
                conn = self.drop(conn)
                self.give_back(m, why)
                time.sleep(rng.uniform(0.01, 0.1))
                continue
            except (OSError, smtplib.SMTPException) as e:
                conn = self.drop(conn)
                self.give_back(m, type(e).__name__)
                time.sleep(rng.uniform(0.02, 0.15))
                continue
            m.qid = qid
            with self.lock:
                self.pending -= 1
            if rng.random() < 0.1:             # some sessions end, new ones begin
                conn = self.drop(conn, quit=True)
        self.drop(conn, quit=True)

    @staticmethod
    def drop(conn, quit=False):
        if conn is not None:
            try:
                if quit:
                    conn.quit()
                conn.close()
            except Exception:
                pass
        return None

    @staticmethod
    def send(conn, m):
        code, resp = conn.mail(m.sender, [f"SIZE={len(m.body)}"])
        if code != 250:
            raise smtplib.SMTPResponseException(code, resp)
        for r in m.rcpts:
            code, resp = conn.rcpt(r)
            if code != 250:
                conn.rset()
                raise smtplib.SMTPResponseException(code, resp)
        code, resp = conn.data(m.body)        # smtplib stuffs the dots
        if code != 250:
            raise smtplib.SMTPResponseException(code, resp)
        found = re.fullmatch(rb"2\.0\.0 Ok: queued as ([0-9A-Z]{16})", resp)
        if not found:
            raise AssertionError(f"message {m.index}: 250 without a QID: {resp!r}")
        return found.group(1).decode()


def test_kill_during_injection_loses_nothing(sluiced):
    rng = random.Random(SEED)
    messages = make_messages(rng)
    port = free_port()
    s = sluiced(config(port))
    queue_dir = s.dir / "queue"
    inj = Injector(port, messages)
    t0 = time.monotonic()
    inj.start()

    kills = leftovers = 0
    kill_times = []
    while not inj.done() and kills < MAX_KILLS:
        time.sleep(rng.uniform(0.05, 0.4))
        if inj.done():
            break
        s.signal(signal.SIGKILL)
        assert s.wait(10) == -signal.SIGKILL, "sluiced did not die of SIGKILL"
        kills += 1
        kill_times.append(round(time.monotonic() - t0, 2))
        left = {p.name for p in (queue_dir / "tmp").iterdir()}
        leftovers += len(left)
        time.sleep(rng.uniform(0, 0.2))
        s.start()
        # recovery ran before the intake listened: what the kill left in tmp/ is gone
        # (new sessions may have begun files of their own since)
        still = left & {p.name for p in (queue_dir / "tmp").iterdir()}
        assert not still, f"expected recovery to empty tmp/ of what the kill left, " \
                          f"found {sorted(still)} still there after the restart"
    finished = inj.join(90)
    took = time.monotonic() - t0
    assert not inj.errors, f"expected no permanent reply, got {inj.errors[:10]}"
    assert finished and inj.pending == 0, \
        f"expected every message answered 250 within 90 s, {inj.pending} still pending " \
        f"(retries: {dict(inj.failures)})\n--- log ---\n{s.log.tail()}"
    assert kills >= 5, f"expected at least 5 kills during the injection, got {kills} " \
                       f"(the injection took {took:.1f}s): make the messages bigger"

    # the last kill's leftovers were handled by the last start's recovery, and a clean
    # stop leaves nothing behind
    assert s.stop() == 0, f"sluiced exited {s.returncode} on SIGTERM\n{s.log.tail()}"

    tmp = sorted(p.name for p in (queue_dir / "tmp").iterdir())
    corrupt = sorted(p.name for p in (queue_dir / "corrupt").iterdir())
    assert not corrupt, f"expected nothing in corrupt/, found {corrupt}\n" \
                        f"{s.log.findall(r'^.*corrupt.*$')}"
    assert not tmp, f"expected tmp/ empty after recovery and a clean stop, found {tmp}"
    assert not s.log.search(r"moved to corrupt/"), s.log.findall(r"^.*corrupt.*$")

    files = queuefile.messages(queue_dir)       # raises on a file the reader refuses
    by_qid = {}
    for f in files:
        assert f.id not in by_qid, f"QID {f.id} twice under msg/"
        assert f.path.parent.name == f.id[7], f"{f.id} in msg/{f.path.parent.name}/"
        assert f.checksum_checked, "python3-xxhash missing: checksums not checked"
        by_qid[f.id] = f

    acked = {}
    for m in messages:
        assert m.qid not in acked, \
            f"messages {acked[m.qid].index} and {m.index} both answered with QID {m.qid}"
        acked[m.qid] = m

    def content(m):
        return (m.sender, [(a, "T") for a in m.rcpts], m.body)

    def stored(f):
        rec = RECEIVED_RE.match(f.body)
        assert rec, f"{f.id}: expected sluice's Received: header first: {f.body[:200]!r}"
        assert rec["id"].decode() == f.id, f"{f.id}: Received: names id {rec['id']}"
        return (f.sender, [(r.address, r.status) for r in f.recipients], f.body[rec.end():])

    missing, wrong = [], []
    for qid, m in acked.items():
        f = by_qid.get(qid)
        if f is None:
            missing.append((m.index, qid))
        elif stored(f) != content(m):
            wrong.append((m.index, qid))
    assert not missing, f"expected every message answered 250 in the queue; missing " \
                        f"(message, QID): {missing[:20]} of {len(missing)}"
    assert not wrong, f"expected each file to hold exactly what was sent; differing " \
                      f"(message, QID): {wrong[:20]} of {len(wrong)}"

    sent_contents = {}
    for m in messages:
        sent_contents.setdefault(repr(content(m)), m)
    duplicates, strangers = [], []
    for qid, f in by_qid.items():
        if qid in acked:
            continue
        m = sent_contents.get(repr(stored(f)))
        if m is None:
            strangers.append(qid)
        else:
            duplicates.append((m.index, qid))
    assert not strangers, f"expected every unacknowledged file to be a copy of a sent " \
                          f"message; these match none: {strangers}"
    assert len(by_qid) == len(messages) + len(duplicates)

    # the restarted daemon lists exactly the files, once it has loaded them (it loads
    # its queue in the background: `sluice status` says "loading" until then)
    s.start()
    wait_until(lambda: not json.loads(s.cli("status", "--json").stdout)["queue"]["loading"],
               30, "the queue to load")
    listed = [json.loads(line)["id"] for line in s.cli("queue", "--json").stdout.splitlines()]
    assert set(listed) == set(by_qid), \
        f"expected `sluice queue` to list the {len(by_qid)} files, got {len(listed)}"
    retries = sum(m.attempts - 1 for m in messages)
    print(f"\n{MESSAGES} messages ({sum(len(m.body) for m in messages) / 1e6:.1f} MB, "
          f"{sum(len(m.rcpts) for m in messages)} recipients) over {CLIENTS} connections "
          f"in {took:.1f}s; {kills} kills at {kill_times}, leaving {leftovers} files in tmp/; {retries} retried transactions "
          f"({dict(inj.failures)}); {len(duplicates)} duplicates (committed, reply lost): "
          f"{duplicates}")
