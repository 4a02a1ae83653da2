"""Delivery status notifications end to end (RFC 3461, RFC 3464).

The intake advertises DSN and takes RET, ENVID, NOTIFY and ORCPT from smtplib (a real
client) and from `sluice sendmail -N/-R/-V`; the relay passes them on to a next hop that
offers DSN (Postfix's smtp-sink, whose dump files record the MAIL and RCPT arguments) and
answers for a hop that does not (the aiosmtpd smarthost of peers/smarthost.py): a "relayed"
notice for NOTIFY=SUCCESS, no bounce for NOTIFY=NEVER, delay notices only for
NOTIFY=DELAY, bounces that carry the ENVID and ORCPT given and only the headers.  A bad
value gets 501 5.5.4 and nothing is queued; a message queued in the previous queue file
format (version 1) is delivered and bounced as before.
"""

import json
import os
import pathlib
import re
import signal
import smtplib
import subprocess
import time

from peers import queuefile, smtp_sink
from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_relay import relay, relay_config, start_with_slow_route  # noqa: F401 (fixture)

MSG = ("From: <me@example.org>\r\nTo: <you@example.net>\r\nSubject: dsn test\r\n"
       "Message-ID: <dsn.{n}@example.org>\r\n\r\nThe secret body line.\r\n")


class DumpSink:
    """Postfix's smtp-sink on a loopback port, offering DSN, dumping each message (with
    its X-Mail-Args and X-Rcpt-Args) to a file of its own in dump_dir."""

    def __init__(self, directory, port):
        self.dump = pathlib.Path(directory) / f"dump-{port}"
        self.dump.mkdir()
        os.chmod(self.dump, 0o777)  # smtp-sink writes as nobody
        self.proc = smtp_sink.start(port, pathlib.Path(directory) / f"sink-{port}.log", 20,
                                    dump=f"{self.dump}/%M.")

    def messages(self):
        """The messages smtp-sink has written whole (it writes a file as the message
        comes: one still being written lacks the body's last line)."""
        texts = [p.read_text(errors="replace") for p in sorted(self.dump.iterdir())]
        return [t for t in texts if "The secret body line." in t]

    def stop(self):
        smtp_sink.stop(self.proc)


def smtp_send(port, rcpts, sender="me@example.org", mail_options=(), rcpt_options=(), n=0):
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        s.ehlo("client.example")
        assert s.has_extn("dsn")
        refused = s.sendmail(sender, rcpts, MSG.format(n=n), mail_options=list(mail_options),
                             rcpt_options=list(rcpt_options))
        assert not refused, refused


def notices(sh):
    return [m for m in sh.accepted() if m.sender == ""]


def status_fields(text, name):
    return re.findall(rf"^{name}: ?(.*?)\r?$", text, re.M)


def test_parameters_reach_a_hop_that_offers_dsn(sluiced, workdir):
    """RET, ENVID, NOTIFY and ORCPT from smtplib and from `sluice sendmail -N -R -V` are
    in the MAIL and RCPT commands smtp-sink received, xtext-encoded; no notice is made."""
    require_binary(SLUICE, "SLUICE")
    sink_port, intake = free_port(), free_port()
    sink = DumpSink(workdir, sink_port)
    try:
        sd = sluiced(relay_config(intake, sink_port, route='tls = "none";'))
        smtp_send(intake, ["a@example.net", "b@example.net"],
                  mail_options=["RET=HDRS", "ENVID=QQ+2B314+3d"],
                  rcpt_options=["NOTIFY=success,FAILURE", "ORCPT=rfc822;old+2Bx@example.net"])
        res = subprocess.run([SLUICE, "-c", str(sd.config), "sendmail", "-N", "delay,failure",
                              "-R", "full", "-V", "env 2", "-f", "me@example.org",
                              "c@example.net"], input=MSG.format(n=2).encode(),
                             capture_output=True, timeout=30)
        assert res.returncode == 0, res.stderr
        wait_until(lambda: len(sink.messages()) >= 2, 20, "two messages at smtp-sink")
        texts = sink.messages()
        first = next(t for t in texts if "dsn.0@" in t)
        assert "X-Mail-Args: <me@example.org> RET=HDRS ENVID=QQ+2B314+3D" in first
        args = status_fields(first, "X-Rcpt-Args")
        assert sorted(args) == sorted(
            [f"<{r}@example.net> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;old+2Bx@example.net"
             for r in "ab"]), args
        second = next(t for t in texts if "dsn.2@" in t)
        assert "X-Mail-Args: <me@example.org> RET=FULL ENVID=env+202\n" in second
        assert status_fields(second, "X-Rcpt-Args") == ["<c@example.net> NOTIFY=FAILURE,DELAY"]
        wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 15, "an empty queue")
        time.sleep(1)
        assert len(sink.messages()) == 2  # the next hop notifies: no relayed notice here
        assert sd.stats()["relay"]["dsn_sent"] == 0
    finally:
        sink.stop()


def test_success_past_a_hop_without_dsn_gets_a_relayed_notice(relay):
    """NOTIFY=SUCCESS to a smarthost that does not offer DSN: the message goes without the
    parameters, and the sender gets one notice, Action: relayed, with the ENVID and the
    ORCPT; the recipient without NOTIFY gets none."""
    sd, sh, port = relay(route='tls = "none";')
    smtp_send(port, ["s@example.net"], mail_options=["ENVID=E-17"],
              rcpt_options=["NOTIFY=SUCCESS", "ORCPT=rfc822;first+40old.example"])
    smtp_send(port, ["plain@example.net"], n=1)
    wait_until(lambda: len(notices(sh)) >= 1, 20, "a relayed notice")
    time.sleep(1)
    assert len(notices(sh)) == 1
    n = notices(sh)[0]
    assert n.rcpts == ("me@example.org",)
    text = n.content.decode("ascii", "replace")
    assert status_fields(text, "Action") == ["relayed"]
    assert status_fields(text, "Original-Envelope-Id") == ["E-17"]
    assert status_fields(text, "Original-Recipient") == ["rfc822;first@old.example"]
    assert status_fields(text, "Final-Recipient") == ["rfc822; s@example.net"]
    assert sorted(r for m in sh.accepted() if m.sender for r in m.rcpts) == [
        "plain@example.net", "s@example.net"]


def test_notify_never_queues_no_bounce(relay):
    """A recipient with NOTIFY=NEVER that the next hop refuses with 550 fails without a
    bounce; a recipient with NOTIFY=DELAY only gets none either.  The next hop, which
    does not offer DSN, gets a transaction whose recipients all asked NEVER from the null
    reverse-path (RFC 3461 6.2: it cannot be told NEVER, so it must not bounce to the
    sender either); one that mixes NEVER with others keeps the sender."""
    sd, sh, port = relay(route='tls = "none";',
                         reject_rcpts=["gone@example.net", "gone2@example.net"])
    smtp_send(port, ["gone@example.net", "ok@example.net"],
              rcpt_options=["NOTIFY=NEVER"])
    smtp_send(port, ["gone2@example.net"], rcpt_options=["NOTIFY=DELAY"], n=1)
    sd.log.wait_for(r"bounce not sent: the failed recipients asked for none", timeout=20)
    wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 15, "an empty queue")
    time.sleep(1)
    st = sd.stats()["relay"]
    assert st["failed"] == 2 and st["dsn_sent"] == 0
    # no notice made here: the one message from <> is the NEVER one, passed on
    assert [(m.sender, m.rcpts) for m in sh.accepted()] == [("", ("ok@example.net",))]
    assert b"Message-ID: <dsn.0@example.org>" in sh.accepted()[0].content
    # mixed: NEVER beside a recipient without NOTIFY keeps the sender
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        s.ehlo("client.example")
        assert s.mail("me@example.org")[0] == 250
        assert s.rcpt("never@example.net", ["NOTIFY=NEVER"])[0] == 250
        assert s.rcpt("plain@example.net")[0] == 250
        assert s.data(MSG.format(n=2))[0] == 250
    sh.wait_accepted(2, timeout=20)
    assert sh.accepted()[1].sender == "me@example.org"
    assert sorted(sh.accepted()[1].rcpts) == ["never@example.net", "plain@example.net"]


def test_bounce_carries_envid_orcpt_and_headers_only(relay):
    """RET=HDRS, ENVID and ORCPT: the bounce names them (Original-Envelope-Id,
    Original-Recipient), as given (a double space kept), and returns the header section
    only; RET=FULL returns all."""
    sd, sh, port = relay(route='tls = "none";', reject_rcpts=["gone@example.net"])
    smtp_send(port, ["gone@example.net"], mail_options=["RET=HDRS", "ENVID=batch+2F42+20+20x"],
              rcpt_options=["NOTIFY=FAILURE", "ORCPT=rfc822;Gone+2Bold@example.net"])
    wait_until(lambda: len(notices(sh)) >= 1, 20, "a bounce")
    text = notices(sh)[0].content.decode("ascii", "replace")
    assert status_fields(text, "Action") == ["failed"]
    assert status_fields(text, "Original-Envelope-Id") == ["batch/42  x"]  # as given
    assert status_fields(text, "Original-Recipient") == ["rfc822;Gone+old@example.net"]
    assert "Content-Type: text/rfc822-headers" in text
    assert "Subject: dsn test" in text
    assert "The secret body line." not in text
    # RET=FULL: the whole message comes back
    smtp_send(port, ["gone@example.net"], mail_options=["RET=FULL"], n=1)
    wait_until(lambda: len(notices(sh)) >= 2, 20, "a second bounce")
    text = notices(sh)[1].content.decode("ascii", "replace")
    assert "Content-Type: message/rfc822" in text
    assert "Message-ID: <dsn.1@example.org>" in text and "The secret body line." in text
    assert status_fields(text, "Original-Envelope-Id") == []


def test_delay_notice_follows_notify(relay):
    """relay.delay_warning with NOTIFY: DELAY among them gets the notice, FAILURE alone
    does not; both stay queued."""
    sd, sh, port = relay(route='tls = "none";', relay="delay_warning = 1s;", start=False)
    start_with_slow_route(sd)
    smtp_send(port, ["a@slow.example"], rcpt_options=["NOTIFY=DELAY,FAILURE"],
              mail_options=["ENVID=D1"])
    smtp_send(port, ["b@slow.example"], rcpt_options=["NOTIFY=FAILURE"], n=1)
    smtp_send(port, ["c@slow.example"], sender="", n=2)  # no notice for <>, no parameter
    wait_until(lambda: len(notices(sh)) >= 1, 30, "a delay notice")
    time.sleep(3)
    assert len(notices(sh)) == 1
    text = notices(sh)[0].content.decode("ascii", "replace")
    assert status_fields(text, "Action") == ["delayed"]
    assert status_fields(text, "Final-Recipient") == ["rfc822; a@slow.example"]
    assert status_fields(text, "Original-Envelope-Id") == ["D1"]
    queued = sd.cli("queue").stdout
    assert "a@slow.example" in queued and "b@slow.example" in queued
    # the queue files keep the parameters (version 2), as doc/QUEUE.md says; one without
    # any is written in version 1, which a downgrade still reads
    files = queuefile.messages(sd.dir / "queue")
    assert [(m.version, m.envid) for m in files] == [(2, "D1"), (2, ""), (1, "")]
    assert [r.notify for m in files for r in m.recipients] == [4 | 8, 4, 0]


BAD = [
    ("MAIL", "ENVID=a+2"),
    ("MAIL", "ENVID=a+0D+0A"),
    ("MAIL", "ENVID=" + "x" * 101),
    ("MAIL", "RET=BODY"),
    ("MAIL", "RET=FULL RET=HDRS"),
    ("RCPT", "NOTIFY=NEVER,SUCCESS"),
    ("RCPT", "NOTIFY=SUCCESS,SUCCESS"),
    ("RCPT", "NOTIFY="),
    ("RCPT", "ORCPT=rfc822"),
    ("RCPT", "ORCPT=rfc822;" + "y" * 494),
    ("RCPT", "ORCPT=rfc822;a=b"),
]


def test_bad_values_get_501_and_nothing_is_queued(relay):
    """Each malformed, overlong or repeated DSN parameter gets 501 5.5.4; DATA then finds
    no transaction, and the queue stays empty.  Without EHLO they are 555."""
    sd, sh, port = relay(route='tls = "none";')
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        s.ehlo("client.example")
        for verb, param in BAD:
            s.rset()
            if verb == "MAIL":
                code, text = s.mail("me@example.org", [param])
            else:
                assert s.mail("me@example.org")[0] == 250
                code, text = s.rcpt("r@example.net", [param])
            assert (code, text[:5]) == (501, b"5.5.4"), (verb, param, code, text)
            if verb == "RCPT":
                assert s.docmd("DATA")[0] == 554  # no valid recipients
        s.rset()
        assert s.docmd("DATA")[0] == 503
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        s.helo("client.example")
        # smtplib drops parameters after HELO: sent by hand
        assert s.docmd("MAIL FROM:<me@example.org> ENVID=x")[0] == 555
        assert s.docmd("MAIL FROM:<me@example.org>")[0] == 250
        assert s.docmd("RCPT TO:<r@example.net> NOTIFY=NEVER")[0] == 555
    assert "the queue is empty" in sd.cli("queue").stdout
    assert list((sd.dir / "queue" / "msg").glob("*/*")) == []


def test_line_limits_of_mail_and_rcpt(relay):
    """RFC 3461 5: a MAIL line may be 100 characters longer than 512, a RCPT line 600
    (500, and NOTIFY beside a whole ORCPT): one octet more is 500 5.5.2, and a line of
    the limit is read and parsed (here refused for its overlong value)."""
    sd, sh, port = relay(route='tls = "none";')
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        s.ehlo("client.example")
        for verb, head, limit in (("MAIL", "MAIL FROM:<me@example.org> ENVID=", 612),
                                  ("RCPT", "RCPT TO:<r@example.net> ORCPT=rfc822;", 1112)):
            for extra, want in ((0, (501, b"5.5.4")), (1, (500, b"5.5.2"))):
                s.rset()
                if verb == "RCPT":
                    assert s.mail("me@example.org")[0] == 250
                line = head + "x" * (limit - 2 - len(head) + extra)
                code, text = s.docmd(line)
                assert (code, text[:5]) == want, (verb, len(line) + 2, code, text)
        assert s.noop()[0] == 250  # the session goes on


def test_a_version_1_queue_file_is_delivered_and_bounced(relay):
    """A message written in queue file format version 1 (before DSN parameters were kept)
    is delivered to its good recipient and bounced, as before, for the refused one."""
    sd, sh, port = relay(route='tls = "none";', reject_rcpts=["gone@example.net"],
                         start=False)
    body = (b"Received: from old ([127.0.0.1])\r\nFrom: <old@example.org>\r\n"
            b"Subject: from version 1\r\n\r\nOld body.\r\n")
    qid = queuefile.write_v1(sd.dir / "queue", "old@example.org",
                             ["ok@example.net", "gone@example.net"], body,
                             arrival_us=int(time.time() * 1e6) - 5_000_000)
    assert queuefile.messages(sd.dir / "queue")[0].version == 1
    sd.start()
    wait_until(lambda: len(notices(sh)) >= 1, 30, "the bounce")
    delivered = [m for m in sh.accepted() if m.sender]
    assert [m.rcpts for m in delivered] == [("ok@example.net",)]
    assert b"Subject: from version 1" in delivered[0].content
    text = notices(sh)[0].content.decode("ascii", "replace")
    assert notices(sh)[0].rcpts == ("old@example.org",)
    assert status_fields(text, "Final-Recipient") == ["rfc822; gone@example.net"]
    assert status_fields(text, "Original-Envelope-Id") == []
    assert status_fields(text, "Original-Recipient") == []
    assert qid in text


def test_relayed_notice_owed_survives_a_restart(relay):
    """The relayed notice owed for a recipient delivered to a hop without DSN is its status
    byte N (and its attempt log says status=relayed): after a restart, the report made
    when the message is done (here `sluice queue bounce` of its waiting recipient) still
    has it."""
    sd, sh, port = relay(route='tls = "none";', start=False)
    start_with_slow_route(sd)
    smtp_send(port, ["s@example.net", "b@slow.example"], mail_options=["ENVID=R1"],
              rcpt_options=["NOTIFY=SUCCESS,FAILURE"])
    sh.wait_accepted(1, timeout=20)
    [qid] = [json.loads(line)["id"] for line in sd.cli("queue", "--json").stdout.splitlines()]
    log = (sd.dir / "queue" / "log" / qid[7] / qid).read_text()
    assert re.search(r"rcpt=0 status=relayed ", log), log
    sd.stop()
    sd.start()
    sd.cli("queue", "bounce", qid)
    wait_until(lambda: len(notices(sh)) >= 1, 20, "the report")
    text = notices(sh)[0].content.decode("ascii", "replace")
    assert status_fields(text, "Final-Recipient") == ["rfc822; s@example.net",
                                                      "rfc822; b@slow.example"]
    assert status_fields(text, "Action") == ["relayed", "failed"]
    assert status_fields(text, "Original-Envelope-Id") == ["R1"]
    time.sleep(1)
    assert len(notices(sh)) == 1


def test_relayed_notice_owed_survives_sigkill_without_its_log(relay):
    """The debt of a relayed notice is the recipient's status byte N (doc/QUEUE.md), not
    the attempt log, which is never flushed: SIGKILL right after the delivery, with the
    log lost as a power cut may lose it, and the notice still goes after the restart,
    once the message's other recipient is delivered."""
    sd, sh, port = relay(route='tls = "none";', start=False)
    plain = sd.config_text
    start_with_slow_route(sd)
    smtp_send(port, ["s@example.net", "b@slow.example"], mail_options=["ENVID=K1"],
              rcpt_options=["NOTIFY=SUCCESS"])
    sh.wait_accepted(1, timeout=20)
    wait_until(lambda: "delivered, relayed notice owed" in sd.cli("queue").stdout, 10,
               "the listing to show the notice owed")
    sd.signal(signal.SIGKILL)
    assert sd.wait(10) == -signal.SIGKILL
    [m] = queuefile.messages(sd.dir / "queue")
    assert [r.status for r in m.recipients] == ["N", "T"]
    (sd.dir / "queue" / "log" / m.id[7] / m.id).unlink()
    sd.write_config(plain)  # slow.example now goes to the smarthost too
    sd.start()
    wait_until(lambda: len(notices(sh)) >= 1, 20, "the relayed notice")
    text = notices(sh)[0].content.decode("ascii", "replace")
    assert status_fields(text, "Final-Recipient") == ["rfc822; s@example.net",
                                                      "rfc822; b@slow.example"]
    assert status_fields(text, "Action") == ["relayed", "relayed"]
    assert status_fields(text, "Original-Envelope-Id") == ["K1"]
    wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 15, "an empty queue")
    assert len(notices(sh)) == 1
