"""The relay's open-idle message files against real smarthosts (peers/smarthost.py).

The relay keeps up to 64 idle message files open between transactions (relay.open_idle).
A message reused by a transaction leaves that list: while the transaction waits for its
peer, messages going idle push the oldest ones out and close their files, and must not
close the file of a message in a transaction.
"""

import re
import smtplib
import time

from peers import queuefile
from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_relay import delivered_rcpts, relay_config, send

FROM = "list@example.org"
OTHERS = 72     # messages going idle while the slow transaction waits: more than 64


def test_idle_files_pushed_out_spare_a_message_in_a_transaction(sluiced, smarthost):
    """Message X has a recipient in lane "isp" (a smarthost that answers 451 to every
    RCPT: X's try there ends at once and its file goes idle-open) and one in lane "slow"
    (a smarthost that greets after 1 s, so X is idle when that transaction takes it, and
    holds its 250 to the final dot for 4 s).  While "slow" waits, 72 other messages are
    tried in "isp", deferred and go idle-open, pushing the list past 64.  Then the 250
    comes: X's status is written (no "cannot be written"), X's "slow" recipient is
    delivered and only its "isp" one waits (in X's file too), and sluiced runs on and
    exits 0."""
    require_binary(SLUICE, "SLUICE")
    fast = smarthost(rcpt_tempfail_p=1.0)
    slow = smarthost(greeting_delay=1.0, data_reply_delay=4.0)
    port = free_port()
    conf = relay_config(port, fast.port, route='tls = "none";\nconnections = 1;')
    # no second try of X in "isp" while "slow" waits (it would open X's file again)
    conf = conf.replace("retry { min = 1s; max = 2s; }", "retry { min = 30s; max = 60s; }")
    conf = conf.replace('route "isp" {', f'''route "slow" {{
  domains = ["slow.example"];
  smarthost = "[127.0.0.1]:{slow.port}";
  tls = "none";
}}
route "isp" {{''')
    sd = sluiced(conf)

    send(port, ["x@fast.example", "x@slow.example"], sender=FROM, subject="X")
    # X's try in "isp" is over (deferred) before "slow" is greeted ...
    sd.log.wait_for(r"rcpt=<x@fast\.example> lane=isp .*status=deferred", timeout=10)
    # ... and "slow" has X's final dot, its 250 held
    wait_until(lambda: len(slow.accepted()) == 1, 10, "the slow smarthost to get X's dot")
    t_dot = time.time()
    mark = sd.log.mark()
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        for i in range(OTHERS):
            s.sendmail(FROM, [f"o{i:02d}@fast.example"],
                       f"From: <{FROM}>\r\nSubject: other {i}\r\n\r\nHello.\r\n")
    # every other message was tried (and deferred) while X's 250 was held
    wait_until(lambda: len(set(re.findall(r"rcpt=<(o\d+)@fast\.example> lane=isp .*"
                                          r"status=deferred", sd.log.text()[mark:])))
               >= OTHERS, 10, f"{OTHERS} deferrals in lane isp")
    held = time.time() - t_dot
    assert held < 4.0, f"the others were tried {held:.1f}s after X's dot, not while it waited"

    sd.log.wait_for(r"rcpt=<x@slow\.example> lane=slow .*status=sent", timeout=10,
                    after=mark)
    broken = [l for l in sd.log.lines() if "cannot be written" in l]
    assert broken == [], "a status written to a file closed under its transaction:\n" + \
        "\n".join(broken)
    assert delivered_rcpts(slow) == ["x@slow.example"] and fast.accepted() == []
    assert sd.alive(), sd.log.tail()
    assert sd.stats()["relay"]["delivered"] == 1, sd.stats()["relay"]
    assert sd.stop() == 0, sd.log.tail()
    # on disk (read after sluiced exited): X's "slow" recipient delivered, "isp" to do
    [x] = [m for m in queuefile.messages(sd.dir / "queue") if len(m.recipients) == 2]
    assert [(r.address, r.status) for r in x.recipients] == \
        [("x@fast.example", "T"), ("x@slow.example", "D")]
