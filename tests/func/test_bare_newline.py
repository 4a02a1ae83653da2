"""Line endings at the intake (doc/INTAKE.md, "Line endings"), end to end: a raw client
sends the exact bytes to sluiced's intake, the relay delivers what was queued to a
smarthost (peers/smarthost.py, aiosmtpd), and the smarthost's record of what it received is the
judge.

* A command line cut by a bare LF is answered 500 5.5.2 and the session closed: the
  recipient smuggled behind it never reaches the next hop, nor does anything else that
  session sent.
* A command line with a bare CR is refused whole (500 5.5.2), and the session goes on.
* A bare LF or CR in DATA is stored and sent on as CRLF under bare_newline = "normalize"
  (the default), and refused with 550 5.5.2 under "reject" (nothing queued, the session
  goes on); LF "." LF and CR "." CR never end the data under either.
* The key's configuration errors name the file, line and key; sluiced -n/-D print it.
"""

import re
import subprocess
import time

import pytest

from conftest import SLUICED, free_port, require_binary, sluiced_check, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_intake import Client, intake_counters, qid_of
from test_relay import relay_config

SENDER = "list@example.org"
LEGIT = "legit@example.net"
INJECTED = "injected@example.net"


def config(intake_port, smarthost_port, intake_extra=""):
    return relay_config(intake_port, smarthost_port, route='tls = "none";',
                        intake=intake_extra)


@pytest.fixture
def setup(sluiced, smarthost):  # noqa: F811 (the fixture imported above)
    """Factory: setup(intake_extra="") -> (sluiced, smarthost, intake port)."""
    def factory(intake_extra=""):
        sh = smarthost()
        port = free_port()
        sd = sluiced(config(port, sh.port, intake_extra))
        return sd, sh, port
    return factory


def connect(port):
    c = Client(("127.0.0.1", port))
    r = c.reply()
    assert r.code == 220, f"expected a 220 greeting, got {r}"
    return c


def body(subject):
    return (f"From: <{SENDER}>\r\nTo: <{LEGIT}>\r\nSubject: {subject}\r\n"
            f"Message-ID: <{subject.replace(' ', '.')}.{time.time()}@example.org>\r\n\r\n"
            ).encode()


def send_clean(port, subject):
    """A well-formed message to LEGIT alone; returns its QID."""
    with connect(port) as c:
        qid = qid_of(c.message(SENDER, [LEGIT], body(subject) + b"clean body\r\n"))
        c.expect("QUIT", "221")
    return qid


def counters(sd):
    return intake_counters(sd.stats())


def delivered(sh, n):
    """The smarthost's messages once n have arrived, and no more a moment later."""
    msgs = sh.wait_accepted(n, timeout=20)
    time.sleep(0.5)
    msgs = sh.accepted()
    assert len(msgs) == n, f"expected {n} messages at the next hop, got " \
                           f"{[(m.rcpts, m.content[:80]) for m in msgs]}"
    return msgs


def queue_empty(sd):
    wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 20, "the queue to empty")


def subject_of(msg):
    return msg.header("Subject")


# ---------------------------------------------------------------------------------------
# commands

def test_bare_lf_command_is_refused_and_the_smuggled_recipient_never_leaves(setup):
    """The smuggled form, pipelined with the rest of a transaction: 500 5.5.2 Error: bare
    <LF> received, the session closed, nothing of it queued; a clean message afterwards is
    the only one the next hop gets, for its one recipient."""
    sd, sh, port = setup()
    with connect(port) as c:
        c.expect("EHLO client.sluice.test", "250")
        c.send(f"MAIL FROM:<{SENDER}>\nRCPT TO:<{INJECTED}>\r\n"
               f"RCPT TO:<{LEGIT}>\r\nDATA\r\n".encode() + body("smuggled") +
               b"smuggled body\r\n.\r\nQUIT\r\n")
        r = c.reply()
        assert r.lines == ["500 5.5.2 Error: bare <LF> received"], \
            f"expected only 500 5.5.2 bare <LF> to the smuggled line, got {r}"
        assert c.closed(), "expected the session closed after the bare LF"
        assert c.buf == b"", f"expected no reply after the 500, got {c.buf!r}"
    sd.log.wait_for(r"bare <LF> in a command, closing client=\[127\.0\.0\.1\]")
    st = counters(sd)
    assert st["bare_command"] == 1 and st["messages"] == 0, st

    send_clean(port, "after the smuggling")
    msgs = delivered(sh, 1)
    assert [m.rcpts for m in msgs] == [(LEGIT,)], \
        f"expected one message for <{LEGIT}> alone, got {[m.rcpts for m in msgs]}"
    assert subject_of(msgs[0]) == "after the smuggling"
    assert all(INJECTED not in m.rcpts for m in sh.accepted())
    queue_empty(sd)


@pytest.mark.parametrize("line", [
    f"MAIL FROM:<{SENDER}>\rRCPT TO:<{INJECTED}>\r\n",
    f"MAIL FROM:<{SENDER}>\r\rRCPT TO:<{INJECTED}>\r\n",
    f"RCPT TO:<{INJECTED}>\r\r\n",
], ids=["CR-between", "CR-CR-between", "CR-before-CRLF"])
def test_bare_cr_command_is_refused_whole_and_the_session_goes_on(setup, line):
    """A bare CR inside a CRLF line: 500 5.5.2 Error: bare <CR> received, the whole line
    refused (a MAIL after it is not "nested"), and the session delivers a clean
    transaction to its one recipient."""
    sd, sh, port = setup()
    with connect(port) as c:
        c.expect("EHLO client.sluice.test", "250")
        c.send(line.encode())
        r = c.reply()
        assert r.lines == ["500 5.5.2 Error: bare <CR> received"], f"{line!r}: got {r}"
        qid = qid_of(c.message(SENDER, [LEGIT], body("after a bare CR") + b"x\r\n", ehlo=None))
        c.expect("QUIT", "221")
    assert counters(sd)["bare_command"] == 1
    msgs = delivered(sh, 1)
    assert msgs[0].rcpts == (LEGIT,), f"{qid}: the next hop got {msgs[0].rcpts}"
    queue_empty(sd)


# ---------------------------------------------------------------------------------------
# DATA

# (content between 354 and the final CRLF.CRLF, what the next hop must get of it)
BARE_DATA = [
    (b"line one\nline two\r\nline three\rline four\r\n",
     b"line one\r\nline two\r\nline three\r\nline four\r\n"),
    # the smuggling forms: content, never the end; the "." line arrives as a line "."
    (b"carrier\n.\nMAIL FROM:<x@evil.example>\nRCPT TO:<injected@example.net>\nDATA\n"
     b"smuggled\r\n",
     b"carrier\r\n.\r\nMAIL FROM:<x@evil.example>\r\nRCPT TO:<injected@example.net>\r\n"
     b"DATA\r\nsmuggled\r\n"),
    (b"carrier\r.\rsecond\r\n", b"carrier\r\n.\r\nsecond\r\n"),
    (b"carrier\r\n.\nsecond\r\n", b"carrier\r\n.\r\nsecond\r\n"),
    (b"carrier\n.\r\nsecond\r\n", b"carrier\r\n.\r\nsecond\r\n"),
]


def test_bare_newlines_in_data_are_normalized_by_default(setup):
    """bare_newline = "normalize" (the default): each message is queued and reaches the
    next hop with CRLF line ends only, its fake ends as content, one message each."""
    sd, sh, port = setup()
    for i, (data, _) in enumerate(BARE_DATA):
        with connect(port) as c:
            qid_of(c.message(SENDER, [LEGIT], body(f"bare {i}") + data))
            # nothing else is pending: the fake end ended nothing
            c.expect("NOOP", "250")
            c.expect("QUIT", "221")
    msgs = delivered(sh, len(BARE_DATA))
    got = {subject_of(m): m for m in msgs}
    for i, (_, want) in enumerate(BARE_DATA):
        m = got[f"bare {i}"]
        assert m.rcpts == (LEGIT,)
        content = m.content
        assert re.search(rb"\r(?!\n)|(?<!\r)\n", content) is None, \
            f"message {i}: a bare CR or LF reached the next hop: {content!r}"
        assert content.endswith(want), f"message {i}: expected it to end in {want!r}, " \
                                       f"got {content!r}"
    assert all(INJECTED not in m.rcpts for m in msgs)
    assert counters(sd)["bare_eol"] == len(BARE_DATA)
    queue_empty(sd)


@pytest.mark.parametrize("data,why", [
    (b"line one\nline two\r\n", "bare <LF> received"),
    (b"line one\rline two\r\n", "bare <CR> received"),
    (b"carrier\n.\nMAIL FROM:<x@evil.example>\r\n", "bare <LF> received"),
    (b"carrier\r.\rsecond\r\n", "bare <CR> received"),
], ids=["LF", "CR", "LF.LF", "CR.CR"])
def test_bare_newline_reject_refuses_the_message(setup, data, why):
    """bare_newline = "reject": the data is read to its real end, answered 550 5.5.2,
    nothing is queued, and the same session then queues a clean message, the only one the
    next hop gets."""
    sd, sh, port = setup('bare_newline = "reject";')
    with connect(port) as c:
        r = c.message(SENDER, [LEGIT], body("refused") + data)
        assert r.lines == [f"550 5.5.2 Error: {why}"], f"expected 550 5.5.2 {why}, got {r}"
        c.expect("NOOP", "250")
        qid_of(c.message(SENDER, [LEGIT], body("clean after") + b"clean\r\n", ehlo=None))
        c.expect("QUIT", "221")
    sd.log.wait_for(r"refused reason=bare-newline from=<list@example\.org>")
    st = counters(sd)
    assert st["rejected"] == 1 and st["messages"] == 1 and st["bare_eol"] == 1, st
    msgs = delivered(sh, 1)
    assert subject_of(msgs[0]) == "clean after", msgs[0].content[:200]
    queue_empty(sd)
    tmp = sd.dir / "queue" / "tmp"
    assert not any(tmp.iterdir()), f"left in tmp/: {list(tmp.iterdir())}"


def test_bare_newline_reject_still_refuses_bare_lf_commands(setup):
    """The key is about DATA: commands are held to CRLF under "reject" too."""
    sd, sh, port = setup('bare_newline = "reject";')
    with connect(port) as c:
        c.send(b"EHLO client.sluice.test\n")
        r = c.reply()
        assert r.lines == ["500 5.5.2 Error: bare <LF> received"], r
        assert c.closed()
    assert counters(sd)["bare_command"] == 1


# ---------------------------------------------------------------------------------------
# configuration

def run_sluiced(*args):
    return subprocess.run([SLUICED, *args], capture_output=True, text=True, timeout=30)


def test_bare_newline_key_is_checked_and_printed(sluiced):
    require_binary(SLUICED, "SLUICED")
    port = free_port()
    sd = sluiced(config(port, 1, 'bare_newline = "strip";'), start=False)
    res = sluiced_check(sd.config)
    assert res.returncode != 0, res
    # file, line and key, and the value given
    line = next(i + 1 for i, l in enumerate(sd.config.read_text().splitlines())
                if "bare_newline =" in l)
    assert re.search(rf"{re.escape(sd.config.name)}:{line}:.*bare_newline", res.stderr) \
        and '"strip"' in res.stderr and "normalize" in res.stderr \
        and "reject" in res.stderr, res.stderr
    sd.write_config(config(port, 1, "bare_newline = true;"))
    res = sluiced_check(sd.config)
    assert res.returncode != 0 and "bare_newline" in res.stderr, res.stderr

    sd.write_config(config(port, 1, 'bare_newline = "reject";'))
    res = run_sluiced("-n", "-c", str(sd.config))
    assert res.returncode == 0 and re.search(r'^\s*bare_newline = "reject";', res.stdout,
                                             re.M), res.stdout + res.stderr
    sd.write_config(config(port, 1))
    res = run_sluiced("-n", "-c", str(sd.config))
    assert res.returncode == 0 and not re.search(r"^\s*bare_newline", res.stdout, re.M), \
        res.stdout
    res = run_sluiced("-D", "-c", str(sd.config))
    assert res.returncode == 0 and re.search(r'^\s*bare_newline = "normalize";.*#',
                                             res.stdout, re.M), res.stdout + res.stderr
