"""The relay behind a real MTA: a private Postfix whose relayhost is sluice's intake hands
it mail from smtp-source, and sluice relays it at the lane's rate.

The smarthost (peers/smarthost.py) is the judge of the rate: it records the time of every
MAIL FROM it accepts, and windows_over(N, W) lists any window of W seconds that held more
than N of them.  The test starts its own smarthost, sluiced and Postfix in the test's
private directory.
"""

import re
import shutil
import time

import pytest

from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_relay import lanes, relay_config

FROM = "list@example.org"


def test_postfix_relays_through_sluice_at_the_lane_rate(sluiced, postfix, smarthost):
    """Postfix (relayhost = sluice's intake) gets 10 messages from smtp-source and hands
    them to sluice, which relays them through a 4/2s lane (default guard, 2 connections)
    to a smarthost that bans at 4/2s: all 10 delivered, no ban, no window over, and each
    message's Received: chain shows Postfix first, then sluice."""
    require_binary(SLUICE, "SLUICE")
    for tool in ("smtp-source", "postfix"):
        if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin"):
            pytest.skip(f"{tool} is not installed")
    count = 10
    sh = smarthost(rate="4/2", mode="ban", ban_seconds=60)
    port = free_port()
    sd = sluiced(relay_config(port, sh.port, route='tls = "none";\nrate = ["4/2s"];\n'
                              'recipients_per_message = 1;'))
    pf = postfix(relayhost=f"[127.0.0.1]:{port}")
    res = pf.smtp_source("-m", str(count), "-s", "2", "-N", "-M", "client.sluice.test",
                         "-f", FROM, "-t", "member@example.net", "-S", "via postfix")
    assert res.returncode == 0, f"smtp-source: {res.stdout}{res.stderr}\n{pf.maillog.tail()}"

    # Postfix handed every message to sluice ...
    wait_until(lambda: len(pf.maillog.findall(
        rf"relay=127\.0\.0\.1\[127\.0\.0\.1\]:{port},.*status=sent "
        r"\(250 2\.0\.0 Ok: queued as [0-9A-Z]{16}\)")) >= count, 60,
        f"Postfix to relay {count} messages to sluice")
    wait_until(lambda: pf.queue() == [], 30, "Postfix's queue to empty")

    # ... and sluice relayed them at the lane's rate
    try:
        msgs = sh.wait_accepted(count, timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- sluiced log ---\n{sd.log.tail()}") from None
    time.sleep(0.5)
    msgs = sh.accepted()
    assert len(msgs) == count, [m.rcpts for m in msgs]
    rcpts = sorted(r for m in msgs for r in m.rcpts)
    assert len(set(rcpts)) == count, f"expected {count} distinct recipients, got {rcpts}"
    assert all(r.endswith("member@example.net") for r in rcpts), rcpts
    assert all(m.sender == FROM for m in msgs), [m.sender for m in msgs]
    assert sh.bans == 0, sh.ban_events()
    assert sh.windows_over(4, 2.0) == [], sh.attempts()
    # the 4/2s lane took at least two full windows for 10 messages
    times = sorted(sh.attempts())
    assert times[-1] - times[0] >= 4.0, times

    for m in msgs:
        received = m.parsed().get_all("Received")
        assert received and len(received) >= 2, m.content[:500]
        # newest first: sluice's (it got the message from Postfix), then Postfix's
        sluice_rcv = " ".join(received[0].split())
        postfix_rcv = " ".join(received[1].split())
        assert re.search(r"^from mx\.sluice\.test \(\[127\.0\.0\.1\]\) by relay\.sluice\.test "
                         r"\(sluice\) with E?SMTP id [0-9A-Z]{16}", sluice_rcv), sluice_rcv
        assert re.search(r"^from client\.sluice\.test .*by mx\.sluice\.test \(Postfix\) "
                         r"with E?SMTP id", postfix_rcv), postfix_rcv
        assert m.parsed()["Subject"] == "via postfix"

    wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 10, "sluice's queue to empty")
    lane = lanes(sd)[0]
    assert lane["delivered"] == count and lane["failed"] == 0 and lane["suspensions"] == 0, lane
