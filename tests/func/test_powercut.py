"""Power cuts: every message answered 250 survives the loss of everything that was not
flushed (doc/QUEUE.md, "Guarantees"; law 2, doc/ARCHITECTURE.md).

sluiced's queue and state directory are on the test disk (peers/forgetdisk.py,
tests/powercut/forgetdisk.c): a FUSE file system that keeps what was written apart from
what was flushed, and that, on command, "loses power": it kills sluiced on the spot --
at a chosen flush, before or just after it is done, or at a random moment -- and throws
away every change that no flush made durable, or keeps a random part of them, page by
page and name by name, as a disk writing back in its own order may.  The kernel's caches
go with an unmount; sluiced starts again on what survived.

Meanwhile Python SMTP clients inject messages as an MTA would (a transaction that did not
end in 250 is sent again), recording the QID of each 250.  The relay delivers through
the test smarthost (peers/smarthost.py), which rejects some recipients for good (so bounces
are made), answers some RCPTs with 451 (so retry times are journaled), and records every
message it accepts and every send over the route's rate.  sluiced is reloaded now and
then between cuts.

After each cut the test reads the surviving queue with its own reader (peers/queuefile.py):
a recipient the smarthost had already accepted whose surviving status byte is still T or
U is in the documented window (doc/QUEUE.md, "One flush per transaction") and may be
delivered once more.  At the end, once the relay has emptied the queue:

* every message answered 250 was delivered to each recipient the smarthost accepts, and
  each recipient it rejects got into a bounce: nothing acknowledged is lost;
* no recipient was delivered more often than once plus the cuts that caught it in the
  window;
* the smarthost never saw more sends than the route's rate in any window: the send
  history (state_dir/relay.lanes) lost none across the cuts;
* nothing ever went to corrupt/, and tmp/ is empty.

Run with the flushes of sluiced turned into nothing (tests/powercut/nosync.c), the same
check must find acknowledged messages lost: the last test shows that it does.
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

import pytest

from conftest import free_port, wait_until
from peers import forgetdisk, queuefile
from peers.smarthost import Smarthost

pytestmark = pytest.mark.skipif(forgetdisk.unavailable() is not None,
                                reason=str(forgetdisk.unavailable()))

SEED = int(os.environ.get("SLUICE_POWERCUT_SEED", "8461"))
RATE = (20, 2)                 # the route's rate, and the smarthost's limit (mode none)
QID_RE = re.compile(rb"\A(?:[^\r\n]*\r\n(?:[ \t][^\r\n]*\r\n)*)*?Received: from "
                    rb"client\.sluice\.test [^\r\n]*\r\n\tby mx\.sluice\.test \(sluice\) "
                    rb"with ESMTP id (?P<qid>[0-9A-Z]{16})")
FINAL_RCPT_RE = re.compile(rb"Final-Recipient: rfc822; ?([^\r\n]+)")


def config(intake_port, smarthost_port):
    return "\n".join([
        "workers = 2;",
        "stats_interval = 0;",
        "shutdown_timeout = 5s;",
        'state_dir = "@DIR@/disk/state";',
        'log { target = "stderr"; level = "notice"; }',
        'control { listen = "unix:@DIR@/control.sock"; }',
        "intake {",
        f'  listen = "inet:127.0.0.1:{intake_port}";',
        '  hostname = "mx.sluice.test";',
        "  command_timeout = 10s;",
        "}",
        'queue { dir = "@DIR@/disk/queue"; }',
        "relay {",
        "  retry { min = 1s; max = 2s; }",
        "  suspend { min = 1s; max = 2s; }",
        "}",
        'route "isp" {',
        '  domains = ["*"];',
        f'  smarthost = "[127.0.0.1]:{smarthost_port}";',
        f'  rate = ["{RATE[0]}/{RATE[1]}s"];',
        # the distance between sluiced's count and the smarthost's: in the burst after a
        # restart, the smarthost (a Python server sharing its process with the test's
        # clients) records a MAIL up to ~150 ms after sluiced counted it
        "  guard = 300ms;",
        "  connections = 4;",
        "}",
    ]) + "\n"


class Message:
    def __init__(self, index, rcpts, body):
        self.index = index
        self.sender = f"s{index}@example.org"
        self.rcpts = rcpts
        self.body = body
        self.qid = None


def make_messages(rng, n):
    out = []
    for i in range(n):
        rcpts = [f"r{i}.{j}@d{j % 3}.example.net" for j in range(rng.randint(1, 4))]
        if rng.random() < 0.1:
            rcpts.append(f"bad{i}@example.net")      # the smarthost rejects it: a bounce
        size = int(300 * (60 ** rng.random()))
        head = (f"From: <s{i}@example.org>\r\nSubject: power cut {i}\r\n"
                f"Message-ID: <{i}.{SEED}@powercut.test>\r\n\r\n").encode()
        line = f"{i} ".encode() + b"x" * 70 + b"\r\n"
        out.append(Message(i, rcpts, head + line * max(1, size // len(line))))
    return out


class QidSMTP(smtplib.SMTP):
    """smtplib keeps the reply to the final dot: the QID is taken from it."""

    def data(self, msg):
        code, resp = super().data(msg)
        if code == 250:
            found = re.fullmatch(rb"2\.0\.0 Ok: queued as ([0-9A-Z]{16})", resp)
            self.qid = found.group(1).decode() if found else None
        return code, resp


def send_one(port, m):
    """One transaction; the QID of its 250, or an exception."""
    with QidSMTP("127.0.0.1", port, timeout=15, local_hostname="client.sluice.test") as c:
        c.qid = None
        refused = c.sendmail(m.sender, m.rcpts, m.body)
        if refused:
            raise AssertionError(f"message {m.index}: recipients refused: {refused}")
        if not c.qid:
            raise AssertionError(f"message {m.index}: 250 without a QID")
        return c.qid


def inject_loop(port, state, pace):
    """Worker: take a message (one sent before and not yet answered 250 first, then a
    new one until the cuts are over), send it until it is answered 250."""
    rng = random.Random()
    while not state["stop"]:
        with state["lock"]:
            if state["again"]:
                m = state["again"].popleft()
            elif state["fresh"] and not state["closed"]:
                m = state["fresh"].popleft()
                state["taken"].append(m)
            else:
                m = None
        if m is None:
            if state["closed"]:
                return
            time.sleep(0.05)
            continue
        try:
            m.qid = send_one(port, m)
        except AssertionError as e:
            with state["lock"]:
                state["errors"].append(str(e))
        except (OSError, smtplib.SMTPException):
            with state["lock"]:
                state["again"].append(m)
                state["retried"] += 1
            time.sleep(rng.uniform(0.02, 0.1))
            continue
        time.sleep(rng.uniform(0, 2 * pace))


def surviving_statuses(queue_dir):
    """{qid: {address: status}} of every file under msg/, and the names of files the
    independent reader refuses (a message whose data a flush should have kept)."""
    out, damaged = {}, []
    msg = queue_dir / "msg"
    if not msg.exists():
        return out, damaged
    for sub in msg.iterdir():
        for p in sub.iterdir():
            try:
                f = queuefile.load(p)
            except (queuefile.QueueFileError, ValueError, OSError) as e:
                damaged.append(f"{p.name}: {e}")
                continue
            out[f.id] = {r.address: r.status for r in f.recipients}
    return out, damaged


_parsed = {}     # Message.seq -> (sender, qid or None, final recipients): parsed once


def deliveries(smarthost):
    """[(qid, rcpt)] of each accepted message (not bounces), in order; and the bounced
    recipients (from the Final-Recipient fields of the delivered bounces)."""
    out, bounced = [], collections.Counter()
    for m in smarthost.accepted():
        p = _parsed.get(m.seq)
        if p is None:
            if m.sender == "":
                p = _parsed[m.seq] = ("", None, [a.decode().strip() for a in
                                                 FINAL_RCPT_RE.findall(m.content)])
            else:
                found = QID_RE.match(m.content)
                assert found, f"a delivered message without sluice's Received: " \
                              f"{m.content[:300]!r}"
                p = _parsed[m.seq] = (m.sender, found["qid"].decode(), None)
        if p[0] == "":
            for a in p[2]:
                bounced[a] += 1
            continue
        for r in m.rcpts:
            out.append((p[1], r))
    return out, bounced


def queue_empty(s):
    """Loaded (a restarted daemon lists only what it has loaded so far) and empty."""
    status = json.loads(s.cli("status", "--json").stdout)
    return not status["queue"]["loading"] and not s.cli("queue", "--json").stdout.strip()


def run_scenario(sluiced, workdir, cuts, nmessages, seed, preload, pace=0.1, keep=None):
    rng = random.Random(seed)
    messages = make_messages(rng, nmessages)
    _parsed.clear()          # a new smarthost numbers its messages from 1 again
    intake_port = free_port()
    sh = Smarthost(rate=RATE, mode="none", reject_rcpt_regex=r"^bad",
                   rcpt_tempfail_p=0.05, seed=seed)
    sh.start()
    s = sluiced(config(intake_port, sh.port), start=False,
                env={**os.environ, "LD_PRELOAD": preload,
                     "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") +
                     ":verify_asan_link_order=0"})
    disk = forgetdisk.ForgetDisk(s.dir / "disk").start()
    queue_dir = s.dir / "disk" / "queue"
    report = dict(cuts=0, at_flush=0, at_random=0, partial=0, reloads=0, window=0,
                  damaged=[], acked=0, lost=[], duplicates=0, beyond=[], overs=[],
                  corrupt=[], retried=0, bounces=0)
    allowance = collections.Counter()     # (qid, rcpt): deliveries beyond the first allowed
    events = []                           # (time.time(), what): cuts and restarts
    history = []                          # (time.time(), [send times]) of relay.lanes
    state = dict(stop=False, closed=False, lock=threading.Lock(), errors=[], retried=0,
                 fresh=collections.deque(messages), again=collections.deque(), taken=[])
    workers = []
    try:
        s.start()
        disk.victim(s.pid)
        workers = [threading.Thread(target=inject_loop, args=(intake_port, state, pace),
                                    daemon=True) for _ in range(4)]
        for w in workers:
            w.start()
        for cut in range(cuts):
            time.sleep(rng.uniform(0.05, 0.4))
            if rng.random() < 0.15:
                s.cli("reload")
                report["reloads"] += 1
                time.sleep(rng.uniform(0, 0.2))
            if rng.random() < 0.7:
                disk.cut_at_flush(rng.randint(1, 30), after=rng.random() < 0.5)
                report["at_flush"] += 1
                deadline = time.monotonic() + 3
                while not disk.is_off() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if not disk.is_off():       # nothing flushed for a while: cut now
                    disk.cut_now()
            else:
                disk.cut_now()
                report["at_random"] += 1
            rc = s.wait(10)
            events.append((time.time(), f"cut {cut}"))
            assert rc == -signal.SIGKILL, f"cut {cut}: expected sluiced killed by the " \
                                          f"disk, got {rc}\n{s.log.tail()}"
            # the smarthost has read what the dead daemon sent (its own thread records
            # each MAIL's time: not held back by this one's work on the queue)
            wait_until(lambda: sh.active_connections == 0, 10, "the smarthost's connections "
                       "of the dead daemon to close")
            report["cuts"] += 1
            delivered, _ = deliveries(sh)
            p = keep if keep is not None else \
                0.0 if rng.random() < 0.5 else rng.uniform(0.2, 0.9)
            report["partial"] += p > 0
            disk.restore(rng.getrandbits(48), p)
            lanes = s.dir / "disk" / "state" / "relay.lanes"
            history.append((time.time(), [int(x) / 1e6 for x in re.findall(
                rb"^isp (\d+)$", lanes.read_bytes() if lanes.exists() else b"", re.M)]))
            statuses, damaged = surviving_statuses(queue_dir)
            report["damaged"] += [f"cut {cut}: {d}" for d in damaged]
            for key in set(delivered):
                qid, rcpt = key
                if statuses.get(qid, {}).get(rcpt) in ("T", "U"):
                    allowance[key] += 1
                    report["window"] += 1
            s.start()
            events.append((time.time(), f"restart {cut}"))
            disk.victim(s.pid)
        # the rest of the messages, then everything delivered and the queue empty
        with state["lock"]:
            state["closed"] = True
        wait_until(lambda: all(m.qid for m in state["taken"]) or state["errors"], 120,
                   "every message sent answered 250")
        assert not state["errors"], state["errors"][:5]
        # at the route's rate, plus time for retries and bounces
        wait_until(lambda: queue_empty(s), 60 + 2 * len(state["taken"]) * RATE[1] / RATE[0],
                   "the relay to empty the queue")
        assert s.stop() == 0, s.log.tail()
    finally:
        state["stop"] = True
        for w in workers:
            w.join(20)
        if s.alive():
            s.stop()
        sh.stop()
        disk_stats = disk.stats() if os.path.ismount(disk.mnt) else {}
        corrupt = sorted(p.name for p in (queue_dir / "corrupt").iterdir()) \
            if (queue_dir / "corrupt").exists() else []
        tmp = sorted(p.name for p in (queue_dir / "tmp").iterdir()) \
            if (queue_dir / "tmp").exists() else []
        disk.stop()

    delivered, bounced = deliveries(sh)
    counts = collections.Counter(delivered)
    messages = state["taken"]
    report["acked"] = len(messages)
    report["retried"] = state["retried"]
    report["bounces"] = sum(bounced.values())
    for m in messages:
        for r in m.rcpts:
            if r.startswith("bad"):
                if not bounced[r]:
                    report["lost"].append(f"{m.qid} {r} (no bounce)")
            elif not counts[(m.qid, r)]:
                report["lost"].append(f"{m.qid} {r}")
    for key, n in counts.items():
        if n > 1:
            report["duplicates"] += n - 1
            if n - 1 > allowance[key]:
                report["beyond"].append(f"{key[0]} {key[1]}: {n} deliveries, "
                                        f"{allowance[key]} cut(s) in its window")
    report["overs"] = sh.overs()
    # for each send over the rate: the sends of its window and the cuts among them
    report["over_windows"] = []
    for t, _ in report["overs"][:3]:
        sends = [round(a - t, 3) for a in sh.attempts() if t - RATE[1] < a <= t]
        near = [(round(e - t, 3), what) for e, what in events if t - RATE[1] - 1 < e <= t]
        before = [h for h in history if h[0] < t]
        hist = [round(x - t, 3) for x in before[-1][1] if t - RATE[1] - 1 < x <= t] \
            if before else []
        report["over_windows"].append(f"over at {t:.3f}: sends at {sends}; {near}; the "
                                      f"history after the last cut before it: {hist}")
    report["corrupt"] = corrupt
    report["tmp"] = tmp
    report["log_corrupt"] = s.log.findall(r"^.*moved to corrupt/.*$")
    report["flushes"] = disk_stats.get("flushes")
    return report


def describe(r):
    return (f"{r['cuts']} cuts ({r['at_flush']} at a flush, {r['at_random']} at a random "
            f"moment; {r['partial']} kept part of the unflushed changes), {r['reloads']} "
            f"reloads; {r['acked']} messages acknowledged ({r['retried']} transactions "
            f"sent again); lost {len(r['lost'])}; {r['duplicates']} deliveries again, "
            f"{r['window']} recipients caught in the window, beyond it "
            f"{len(r['beyond'])}; over the rate {len(r['overs'])}; {r['bounces']} "
            f"bounces; damaged {len(r['damaged'])}, corrupt/ {len(r['corrupt'])}; "
            f"{r['flushes']} flushes")


def assert_durable(r):
    assert not r["lost"], f"acknowledged and lost: {r['lost'][:10]}\n{describe(r)}"
    assert not r["damaged"], f"a file a flush promised, unreadable: {r['damaged'][:5]}"
    assert not r["corrupt"] and not r["log_corrupt"], \
        f"expected nothing in corrupt/: {r['corrupt'][:5]} {r['log_corrupt'][:5]}"
    assert not r["beyond"], f"delivered again outside the window: {r['beyond'][:10]}"
    assert not r["overs"], f"the smarthost saw more than {RATE[0]} sends in " \
                           f"{RATE[1]} s: {r['overs'][:10]}\n{describe(r)}\n" + \
                           "\n".join(r["over_windows"])
    assert not r["tmp"], f"expected tmp/ empty after a clean stop: {r['tmp']}"


def test_power_cuts_lose_nothing(sluiced, workdir):
    r = run_scenario(sluiced, workdir, cuts=int(os.environ.get("SLUICE_POWERCUT_CUTS", "20")),
                     nmessages=20000, seed=SEED, preload=forgetdisk.SYNCFS_BRIDGE)
    print("\n" + describe(r))
    assert_durable(r)
    assert r["cuts"] >= 20


def test_the_check_sees_a_daemon_that_does_not_flush(sluiced, workdir):
    """The same scenario with every flush of sluiced made a no-op (nosync.c preloaded
    before the syncfs bridge): acknowledged messages must be found lost, or the test
    above proves nothing."""
    r = run_scenario(sluiced, workdir, cuts=4, nmessages=20000, seed=SEED + 1,
                     preload=f"{forgetdisk.NOSYNC}:{forgetdisk.SYNCFS_BRIDGE}", keep=0.0)
    print("\n" + describe(r))
    assert r["lost"], f"expected acknowledged messages lost without flushes\n{describe(r)}"


def intake_config(intake_port):
    """config() without the relay: the intake alone."""
    text = config(intake_port, 1)
    return text[:text.index("relay {")]


def transaction(port, i):
    """One message; (code, reply text) of its end."""
    m = Message(i, [f"r{i}@example.net"], f"Subject: {i}\r\n\r\nbody {i}\r\n".encode())
    try:
        with QidSMTP("127.0.0.1", port, timeout=15, local_hostname="client.sluice.test") as c:
            c.qid = None
            c.sendmail(m.sender, m.rcpts, m.body)
            return 250, c.qid
    except smtplib.SMTPDataError as e:
        return e.smtp_code, e.smtp_error.decode(errors="replace")
    except smtplib.SMTPResponseException as e:
        return e.smtp_code, e.smtp_error.decode(errors="replace")


FAILURES = [
    # (what fails, errno, the reply the client must get)
    ("syncfs", "EIO", 451),       # the batch's syncfs: from then on a flush per file
    ("fsync", "EIO", 451),        # that flush (fdatasync of the tmp/ file)
    ("fsync", "ENOSPC", 452),
    ("fsyncdir", "EIO", 451),     # the flush of msg/H/: the commit point
    ("rename", "EIO", 451),
    ("write", "EIO", 451),
    ("write", "ENOSPC", 452),
    ("create", "EIO", 451),       # the tmp/ file itself
]


def test_failed_flushes_and_writes_are_never_answered_250(sluiced, workdir):
    """Each step of a commit fails once, on the disk: the message gets a 4xx (never 250),
    the next one is taken, and after a power cut the queue holds exactly the messages
    answered 250."""
    port = free_port()
    s = sluiced(intake_config(port), start=False,
                env={**os.environ, "LD_PRELOAD": forgetdisk.SYNCFS_BRIDGE,
                     "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") +
                     ":verify_asan_link_order=0"})
    disk = forgetdisk.ForgetDisk(s.dir / "disk").start()
    queue_dir = s.dir / "disk" / "queue"
    acked, refused = [], []
    try:
        s.start()
        disk.victim(s.pid)
        code, qid = transaction(port, 0)
        assert code == 250, f"expected 250 before any failure, got {code} {qid}"
        acked.append(qid)
        for n, (op, err, want) in enumerate(FAILURES, 1):
            before = disk.stats()["failed"]
            disk.fail(op, err, 1)
            code, text = transaction(port, 100 + n)
            assert disk.stats()["failed"] == before + 1, \
                f"{op} {err}: the disk failed no request (the step was not reached)"
            assert code == want, f"{op} failing with {err}: expected {want}, got {code} " \
                                 f"{text}\n{s.log.tail()}"
            refused.append(text)
            code, qid = transaction(port, n)
            assert code == 250, f"after {op} {err}: expected the next message taken, " \
                                f"got {code} {qid}\n{s.log.tail()}"
            acked.append(qid)
        disk.cut_now()
        assert s.wait(10) == -signal.SIGKILL
        disk.restore(SEED, 0.0)
        statuses, damaged = surviving_statuses(queue_dir)
        assert not damaged, damaged
        assert sorted(statuses) == sorted(acked), \
            f"expected exactly the {len(acked)} messages answered 250 after the cut; " \
            f"missing {sorted(set(acked) - set(statuses))}, " \
            f"more {sorted(set(statuses) - set(acked))}"
        s.start()
        wait_until(lambda: len(s.cli("queue", "--json").stdout.splitlines()) == len(acked),
                   20, "the restarted daemon to list them")
        assert s.stop() == 0
    finally:
        if s.alive():
            s.stop()
        disk.stop()


def test_a_failed_status_flush_is_reported_and_nothing_is_dropped(sluiced, workdir):
    """The relay's flush of a delivered recipient's byte fails: it says so, keeps the
    message (it is not removed as if done), and after a power cut the recipient is
    delivered again -- the window -- never lost."""
    sh = Smarthost(mode="none")
    sh.start()
    port = free_port()
    s = sluiced(config(port, sh.port), start=False,
                env={**os.environ, "LD_PRELOAD": forgetdisk.SYNCFS_BRIDGE,
                     "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") +
                     ":verify_asan_link_order=0"})
    disk = forgetdisk.ForgetDisk(s.dir / "disk").start()
    try:
        s.start()
        disk.victim(s.pid)
        disk.fail("fsync", "EIO", 1000)      # every file flush from now: the relay's
        code, qid = transaction(port, 1)     # the commit flushes with syncfs: taken
        assert code == 250, f"{code} {qid}"
        wait_until(lambda: len(sh.accepted()) == 1, 20, "the delivery")
        s.log.wait_for(rf"qid={qid} statuses cannot be flushed: Input/output error")
        time.sleep(0.5)
        listed = s.cli("queue", "--json").stdout
        assert qid in listed, f"expected {qid} kept in the queue, its byte not on disk"
        disk.cut_now()
        assert s.wait(10) == -signal.SIGKILL
        disk.restore(SEED, 0.0)
        s.start()
        wait_until(lambda: len(sh.accepted()) == 2, 20, "the delivery again after the cut")
        wait_until(lambda: queue_empty(s), 20, "the queue empty")
        assert s.stop() == 0
    finally:
        if s.alive():
            s.stop()
        sh.stop()
        disk.stop()


def test_a_torn_send_history_keeps_the_lines_after_it(sluiced):
    """What a power cut leaves at the end of state_dir/relay.lanes: a page never written
    back (zero bytes) with lines appended after the restart behind it, and a last line
    cut short.  Every whole line still counts, and so does the next send."""
    sh = Smarthost(mode="none")
    sh.start()
    port = free_port()
    try:
        s = sluiced(config(port, sh.port).replace(f'rate = ["{RATE[0]}/{RATE[1]}s"]',
                                                  'rate = ["10/1h"]'), start=False)
        state = s.dir / "disk" / "state"
        state.mkdir(parents=True)
        now = int(time.time() * 1e6)
        (state / "relay.lanes").write_bytes(
            f"isp {now - 3000000}\n".encode() + b"\0" * 300 + b"1234\n" +
            f"isp {now - 2000000}\n".encode() + b"\0" * 10 +
            f"isp {now - 1000000}\n".encode() + b"isp 17")
        s.start()
        code, qid = transaction(port, 1)
        assert code == 250
        wait_until(lambda: len(sh.accepted()) == 1, 20, "the delivery")
        lanes = s.cli("lanes", "--json").stdout
        used = [int(u) for u in re.findall(r'"used": (\d+)', lanes)]
        assert used == [4], f"expected the 3 whole lines and the new send counted " \
                            f"(used 4 of 10/1h), got {used}: {lanes}"
        assert s.stop() == 0
    finally:
        sh.stop()
