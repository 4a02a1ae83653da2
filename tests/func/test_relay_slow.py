"""The relay's long tests (meson suite 'slow'): the ISP list post of doc/RELAY.md at the
real rate, and delivery of a very large message while the daemon is killed again and again.

* A 500-recipient list post, one message per recipient, through a lane of 8/10s to a
  smarthost that bans at 8/10s: all delivered, no window over, no ban, and the lane keeps
  at least 95% of the allowed rate over its busy period (about 10.5 minutes).  The same
  for 5 messages of 16 recipients each through a lane of 8/5s (about 46 s).
* One message to 10,000 recipients is delivered while sluiced is killed with SIGKILL at
  random moments and started again: no recipient is lost, and the duplicates are only
  those of the transaction in flight at each kill (SLUICE_RELAY_CRASH_SEED picks the
  moments).

The whole file takes about 12 minutes (meson gives it 30: tests/func/meson.build); under
ASan+UBSan the list post at the real rate is left out (it runs once, in the plain build),
and the file takes about 1.5 minutes.

Utilization is measured as in test_relay.py: (sends / (busy + W)) / (N / W), busy being
the time from the first to the last MAIL FROM the smarthost accepted; a perfect lane
sends N at the start of each window.  The figures are printed (pytest -s shows them).
"""

import collections
import os
import random
import signal
import smtplib
import time

import pytest

from conftest import SLUICE, free_port, plain_only, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_relay import delivered_rcpts, lanes, relay_config, send

SEED = int(os.environ.get("SLUICE_RELAY_CRASH_SEED", "3464"))


def utilization(times, n, window):
    times = sorted(times)
    busy = times[-1] - times[0]
    return (len(times) / (busy + window)) / (n / window), busy


def perfect_utilization(sends, n, window, guard=0.1):
    """What a perfect lane scores: N sends at the start of each window lengthened by the
    guard, ceil(sends / N) bursts.  Below 1 when the last burst is partial (the formula
    charges it a whole window) and by the guard's share of the window."""
    bursts = -(-sends // n)
    return (sends / ((bursts - 1) * (window + guard) + window)) / (n / window)


def wait_delivered(sd, sh, n, timeout):
    """Wait for n accepted messages; fail at once on a ban (the wait would be long)."""
    deadline = time.monotonic() + timeout
    while len(sh.accepted()) < n:
        if sh.bans:
            raise AssertionError(f"the smarthost banned sluice at {sh.ban_events()} after "
                                 f"{len(sh.accepted())} messages; windows over: "
                                 f"{sh.windows_over(*sh.rate)[:5]}\n--- log ---\n"
                                 f"{sd.log.tail()}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{len(sh.accepted())} of {n} messages delivered after "
                                 f"{timeout}s\n--- log ---\n{sd.log.tail()}")
        time.sleep(0.5)
    return sh.accepted()


@pytest.fixture
def relay(sluiced, smarthost):
    require_binary(SLUICE, "SLUICE")

    def factory(route, intake="", **sh_kwargs):
        sh = smarthost(**sh_kwargs)
        port = free_port()
        text = relay_config(port, sh.port, route=route)
        if intake:
            text = text.replace('  hostname = "relay.sluice.test";\n',
                                f'  hostname = "relay.sluice.test";\n  {intake}\n', 1)
            assert intake in text
        return sluiced(text), sh, port

    return factory


def check_throttled_run(sd, sh, rcpts, n, window, messages):
    """Everything delivered once, no ban, no window over; returns (utilization, busy)."""
    assert sorted(delivered_rcpts(sh)) == sorted(rcpts)
    assert len(sh.accepted()) == messages
    assert sh.bans == 0, sh.ban_events()
    assert sh.windows_over(n, window) == []
    assert sh.max_in_window(window) == n
    util, busy = utilization(sh.attempts(), n, window)
    wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 30, "the queue to empty")
    lane = lanes(sd)[0]
    assert lane["delivered"] == len(rcpts) and lane["failed"] == 0, lane
    assert lane["suspensions"] == 0, lane
    return util, busy


@plain_only  # 10.5 minutes of real time: once, in the plain build
def test_list_post_500_recipients_at_8_per_10s(relay):
    """The ISP story: one message to 500 recipients, lane 8/10s, one recipient per
    message, one connection; the smarthost bans at 8/10s.  All 500 delivered, no window
    over, no ban, utilization >= 95% (about 625 s)."""
    sd, sh, port = relay('tls = "none";\nrate = ["8/10s"];\nrecipients_per_message = 1;\n'
                         'connections = 1;', intake="max_recipients = 1000;",
                         rate="8/10", mode="ban", ban_seconds=60)
    rcpts = [f"subscriber{i:03d}@example.net" for i in range(500)]
    t0 = time.time()
    send(port, rcpts, subject="list post")
    wait_delivered(sd, sh, 500, timeout=900)
    took = time.time() - t0
    time.sleep(1)
    util, busy = check_throttled_run(sd, sh, rcpts, 8, 10.0, 500)
    print(f"\n500 recipients at 8/10s: duration {took:.1f}s (busy {busy:.1f}s), "
          f"utilization {util:.4f} (a perfect lane: {perfect_utilization(500, 8, 10.0):.4f}), "
          f"bans {sh.bans}, windows over 0")
    assert util >= 0.95, (busy, util)


def test_five_messages_of_16_recipients_at_8_per_5s(relay):
    """5 messages x 16 recipients, one recipient per transaction, lane 8/5s, smarthost
    banning at 8/5s: 80 sends, all delivered, none over, utilization >= 95% (~46 s).
    (80 sends are 10 whole bursts: with 100 the partial 13th burst alone caps the
    utilization of a perfect lane at 94.4%.)"""
    sd, sh, port = relay('tls = "none";\nrate = ["8/5s"];\nrecipients_per_message = 1;\n'
                         'connections = 1;', rate="8/5", mode="ban", ban_seconds=60)
    rcpts = []
    t0 = time.time()
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        for k in range(5):
            batch = [f"m{k}r{i:02d}@example.net" for i in range(16)]
            rcpts += batch
            msg = (f"From: <list@example.org>\r\nTo: <list@example.org>\r\n"
                   f"Subject: post {k}\r\nMessage-ID: <{k}.{t0}@example.org>\r\n\r\n"
                   f"Post {k}.\r\n")
            assert not s.sendmail("list@example.org", batch, msg)
    wait_delivered(sd, sh, 80, timeout=180)
    took = time.time() - t0
    time.sleep(1)
    util, busy = check_throttled_run(sd, sh, rcpts, 8, 5.0, 80)
    # every recipient got the post addressed to it
    for m in sh.accepted():
        k = int(m.rcpts[0][1])
        assert m.parsed()["Subject"] == f"post {k}", (m.rcpts, m.parsed()["Subject"])
    print(f"\n5 messages x 16 recipients at 8/5s: duration {took:.1f}s (busy {busy:.1f}s), "
          f"utilization {util:.4f} (a perfect lane: {perfect_utilization(80, 8, 5.0):.4f})")
    assert util >= 0.95, (busy, util)


# ---------------------------------------------------------------------------------------
# SIGKILL while a 10,000-recipient message is delivered

RCPTS = 10000
PER_MESSAGE = 100


def test_kill_while_delivering_10000_recipients_loses_none(relay):
    """One message to 10,000 recipients, 100 per transaction, one connection, lane
    4/1s (so that delivery lasts about 25 s), smarthost accepting everything.  sluiced is
    killed with SIGKILL every 1-3 s (5-8 times; every other kill is aimed just after the
    smarthost's 250 to a final dot) and started again; at the end every
    recipient was delivered at least once, the duplicates are at most one transaction's
    recipients per kill (one transaction per kill), no window of 1 s held more than 4
    sends (the history survives a kill), the queue is empty and nothing is in
    queue/corrupt/."""
    rng = random.Random(SEED)
    sd, sh, port = relay(f'tls = "none";\nrate = ["4/1s"];\n'
                         f'recipients_per_message = {PER_MESSAGE};\nconnections = 1;',
                         intake="max_recipients = 10000;", mode="none")
    rcpts = [f"r{i:05d}@example.net" for i in range(RCPTS)]
    t_inject = time.monotonic()
    with smtplib.SMTP("127.0.0.1", port, timeout=60) as s:
        msg = ("From: <big@example.org>\r\nTo: <undisclosed-recipients:;>\r\n"
               "Subject: to ten thousand\r\n\r\nHello, all of you.\r\n")
        refused = s.sendmail("big@example.org", rcpts, msg)
        assert not refused, list(refused.items())[:5]
    t0 = time.monotonic()
    inject_took = t0 - t_inject

    kills = 0
    kill_at = []           # (monotonic since t0, smarthost deliveries so far)
    target = rng.randint(5, 8)
    aimed = 0
    while kills < target:
        time.sleep(rng.uniform(1.0, 3.0))
        if len(set(delivered_rcpts(sh))) >= RCPTS:
            break
        if kills % 2:
            # aimed: right after the smarthost answered 250 to a final dot, while sluice
            # is marking that transaction's recipients delivered (the duplicate window)
            n0 = len(sh.accepted())
            deadline = time.monotonic() + 2.0
            while len(sh.accepted()) == n0 and time.monotonic() < deadline:
                time.sleep(0.0005)
            aimed += len(sh.accepted()) > n0
        sd.signal(signal.SIGKILL)
        assert sd.wait(10) == -signal.SIGKILL, "sluiced did not die of SIGKILL"
        kills += 1
        kill_at.append((round(time.monotonic() - t0, 2), len(sh.accepted())))
        time.sleep(rng.uniform(0, 0.3))
        sd.start()
    try:
        wait_until(lambda: len(set(delivered_rcpts(sh))) >= RCPTS, 120,
                   "every recipient delivered", interval=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}: {len(set(delivered_rcpts(sh)))} of {RCPTS}\n"
                             f"--- log ---\n{sd.log.tail()}") from None
    took = time.monotonic() - t0
    assert kills >= 5, f"expected at least 5 kills during delivery, got {kills} " \
                       f"(delivery took {took:.1f}s)"
    wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 30,
               "the queue to empty")
    time.sleep(1)

    delivered = delivered_rcpts(sh)
    counts = collections.Counter(delivered)
    assert set(counts) == set(rcpts), sorted(set(counts) ^ set(rcpts))[:10]
    duplicates = sum(c - 1 for c in counts.values())
    # the transactions that first carried a duplicated recipient: at most one per kill
    first_tx = {}
    for m in sh.accepted():
        for r in m.rcpts:
            first_tx.setdefault(r, m.seq)
    dup_tx = sorted({first_tx[r] for r, c in counts.items() if c > 1})
    corrupt = sorted(p.name for p in (sd.dir / "queue" / "corrupt").iterdir()) \
        if (sd.dir / "queue" / "corrupt").exists() else []
    print(f"\n{RCPTS} recipients, {PER_MESSAGE} per transaction: injected in "
          f"{inject_took:.1f}s, delivered in {took:.1f}s with {kills} kills at "
          f"{kill_at} (s, smarthost messages; {aimed} aimed just after a 250 to the "
          f"dot); {len(sh.accepted())} transactions, "
          f"{duplicates} duplicate deliveries from transactions {dup_tx}")
    assert duplicates <= kills * PER_MESSAGE, (duplicates, kills, dup_tx)
    assert len(dup_tx) <= kills, dup_tx
    assert all(m.sender == "big@example.org" for m in sh.accepted()), "a DSN was sent"
    # the send history survives SIGKILL: no restart let the lane burst past 4/1s
    assert sh.windows_over(4, 1.0) == [], sh.windows_over(4, 1.0)
    assert not corrupt, f"expected nothing in queue/corrupt/, found {corrupt}"
    assert not sd.log.search(r"moved to corrupt/"), sd.log.findall(r"^.*corrupt.*$")
    assert sd.stats()["relay"]["failed"] == 0
