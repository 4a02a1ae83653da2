"""The SMTP intake (src/intake/) and the queue it writes (doc/QUEUE.md), against the real
daemon.

Every test starts its own sluiced with an intake on a free loopback port, its queue in the
instance directory and a control socket, and talks to it with real clients -- swaks,
Postfix's smtp-source, a private Postfix relaying to it (relayhost), and a raw socket
where a test needs exact bytes (pipelining, smuggling, limits).  What was queued is read
back from the files under queue/msg/ with an independent reader (peers/queuefile.py), and
compared with what was sent byte for byte; `sluice queue` must agree.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import time

import pytest

from conftest import free_port, queued_id, wait_until
from peers import queuefile

HOSTNAME = "mx.sluice.test"
FROM = "sender@sluice.test"
TO = "rcpt@example.net"
QID_RE = r"[0-9A-HJKMNP-TV-Z]{16}"
# queue_file.h QUEUE_ID_BUCKET: the character of a QID that names its msg/H directory
QID_BUCKET = 7
SWAKS = shutil.which("swaks") or "/usr/bin/swaks"
SMTP_SOURCE = shutil.which("smtp-source", path="/usr/sbin:/usr/bin") or "/usr/sbin/smtp-source"


# ---------------------------------------------------------------------------------------
# configuration and the daemon

def q(value):
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def intake_config(port, intake=(), queue=(), listen=None, hostname=HOSTNAME):
    """A complete configuration: control socket, intake on 127.0.0.1:port (and/or the
    given listen addresses), queue in @DIR@/queue.  intake/queue: extra lines."""
    listen = listen or [f"inet:127.0.0.1:{port}"]
    lines = ["workers = 2;",
             "stats_interval = 0;",
             'state_dir = "@DIR@";',
             'log { target = "stderr"; level = "info"; }',
             # `listen` on a line of its own: the sluiced fixture waits for each
             "control {", '  listen = "unix:@DIR@/control.sock";', "}",
             "intake {",
             f"  listen = [{', '.join(q(a.replace('PORT', str(port))) for a in listen)}];",
             f"  hostname = {q(hostname)};",
             *["  " + line for line in intake],
             "}",
             "queue {", '  dir = "@DIR@/queue";',
             *["  " + line for line in queue],
             "}"]
    return "\n".join(lines) + "\n"


class Intake:
    """A running sluiced with an intake, and what a test looks at."""

    def __init__(self, s, port):
        self.s = s
        self.port = port
        self.queue_dir = s.dir / "queue"
        self.log = s.log

    def connect(self, timeout=10, greeting=True, source=None):
        """A client of the intake on 127.0.0.1; source: the client's own address (any of
        127/8 on loopback)."""
        c = Client(("127.0.0.1", self.port), timeout, source=source)
        if greeting:
            r = c.reply()
            assert r.code == 220, f"expected a 220 greeting, got {r}"
        return c

    # the queue on disk -------------------------------------------------------------------
    def msg_files(self):
        """{QID: path} of every file under queue/msg/."""
        return {p.name: p for p in sorted(self.queue_dir.glob("msg/*/*")) if p.is_file()}

    def tmp_files(self):
        return sorted(p.name for p in (self.queue_dir / "tmp").iterdir())

    def corrupt_files(self):
        return sorted(p.name for p in (self.queue_dir / "corrupt").iterdir())

    def read(self, qid):
        files = self.msg_files()
        assert qid in files, f"expected {qid} under {self.queue_dir}/msg/, found {sorted(files)}"
        path = files[qid]
        assert path.parent.name == qid[QID_BUCKET], \
            f"{qid} is in msg/{path.parent.name}/, expected msg/{qid[QID_BUCKET]}/"
        return read_queue_file(path)

    def assert_nothing_queued(self, before=()):
        """No message beyond `before` in msg/, nothing in tmp/ (once the session's abort
        has run: polled)."""
        def settled():
            return not self.tmp_files() and set(self.msg_files()) <= set(before)
        try:
            wait_until(settled, 5, "tmp/ empty and no new file in msg/")
        except AssertionError:
            raise AssertionError(f"expected nothing queued: msg/ holds "
                                 f"{sorted(set(self.msg_files()) - set(before))} new, tmp/ "
                                 f"holds {self.tmp_files()}\n--- log ---\n"
                                 f"{self.log.tail()}") from None
        listed = set(self.listed())
        assert listed <= set(before), \
            f"expected `sluice queue` to list nothing new, it lists {sorted(listed - set(before))}"

    # `sluice` -------------------------------------------------------------------------------
    def cli(self, *args, check=True):
        return self.s.cli(*args, check=check)

    def listing(self):
        """The whole queue: after a start, once sluiced has loaded it (`sluice status`
        says "loading" until then).  {"messages": [...], "count": N, "bytes": B} of the JSON lines
        `sluice queue --json` prints, one message a line."""
        deadline = time.monotonic() + 30
        while json.loads(self.cli("status", "--json").stdout).get("queue", {}).get(
                "loading") and time.monotonic() < deadline:
            time.sleep(0.05)
        res = self.cli("queue", "--json")
        try:
            msgs = [json.loads(line) for line in res.stdout.splitlines()]
        except ValueError as e:
            raise AssertionError(f"`sluice queue --json` printed no JSON lines ({e}):\n"
                                 f"{res.stdout}")
        return {"messages": msgs, "count": len(msgs), "bytes": sum(m["size"] for m in msgs)}

    def listed(self):
        """{QID: entry} of `sluice queue --json`."""
        return {m["id"]: m for m in self.listing()["messages"]}

    def stats(self):
        res = self.cli("stats", "--json")
        return json.loads(res.stdout, object_pairs_hook=MultiDict)


class MultiDict(dict):
    """A JSON object that keeps every value of a repeated key (in .all)."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.all = {}
        for k, v in pairs:
            self.all.setdefault(k, []).append(v)
        self.duplicates = [k for k, vs in self.all.items() if len(vs) > 1]


def intake_counters(stats):
    """The intake's message counters of `sluice stats --json` ("intake_mail"; "intake"
    holds the service's session statistics)."""
    v = stats.get("intake_mail")
    if isinstance(v, dict) and "messages" in v:
        return v
    raise AssertionError(f"no intake counters in `sluice stats --json`: {dict(stats)}")


@pytest.fixture
def intake(sluiced):
    """Factory: intake(intake=[lines], queue=[lines], listen=[...]) -> Intake."""
    def factory(start=True, **kw):
        port = free_port()
        s = sluiced(intake_config(port, **kw), start=start)
        return Intake(s, port)
    return factory


# ---------------------------------------------------------------------------------------
# queue files (the independent reader)

def read_queue_file(path):
    """The parsed queue file (peers/queuefile.py); fails the test on a file it refuses."""
    try:
        return queuefile.load(path)
    except queuefile.QueueFileError as e:
        raise AssertionError(f"{path}: the reader refused it: {e}") from None


RECEIVED_RE = re.compile(
    rb"Received: from (?P<helo>\S+) \((?P<client>[^)\r\n]*)\)\r\n"
    rb"\tby (?P<by>\S+) \(sluice\) with (?P<with>\S+) id (?P<id>[0-9A-Z]{16})"
    rb"(?:\r\n\tfor <(?P<for>[^>\r\n]*)>)?"
    rb"; (?P<date>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{1,2} "
    rb"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d [+-]\d{4})"
    rb"\r\n")


def split_received(body):
    """(match of sluice's Received: header at the start of body, the rest)."""
    m = RECEIVED_RE.match(body)
    assert m, f"expected sluice's Received: header first in the body, got {body[:300]!r}"
    return m, body[m.end():]


def stored_form(data):
    """What the intake stores for DATA content `data` (the bytes between 354 and the
    final CRLF.CRLF, that CRLF included): every line end (CRLF, bare LF, bare CR)
    becomes CRLF, a leading dot is removed, except on a line that is only "."
    (smtp.h, smtp_data_decode)."""
    lines = re.split(rb"\r\n|\n|\r", data)
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for line in lines:
        if line.startswith(b".") and line != b".":
            line = line[1:]
        out.append(line + b"\r\n")
    return b"".join(out)


def dot_stuff(message):
    """SMTP transparency (RFC 5321 4.5.2) for a message of CRLF lines."""
    return re.sub(rb"(?m)^\.", b"..", message)


# ---------------------------------------------------------------------------------------
# a raw SMTP client: exact bytes, replies read one by one

class Reply:
    def __init__(self, lines):
        self.lines = lines                       # full lines without CRLF
        self.code = int(lines[-1][:3])
        self.text = "\n".join(lines)

    def __str__(self):
        return self.text

    __repr__ = __str__

    def starts(self, prefix):
        return self.lines[0].startswith(prefix)


class Client:
    def __init__(self, address, timeout=10, source=None):
        if isinstance(address, str):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(address)
        else:
            self.sock = socket.create_connection(
                address, timeout=timeout, source_address=(source, 0) if source else None)
        self.buf = b""
        self.eof = False

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                self.eof = True
                raise EOFError(f"connection closed (unanswered bytes {self.buf!r})")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode("utf-8", "replace")

    def reply(self):
        lines = [self._line()]
        while len(lines[-1]) > 3 and lines[-1][3] == "-":
            lines.append(self._line())
        return Reply(lines)

    def cmd(self, line):
        self.send(line + "\r\n")
        return self.reply()

    def expect(self, line, prefix):
        r = self.cmd(line)
        assert r.starts(prefix), f"{line!r}: expected {prefix!r}, got {r}"
        return r

    def closed(self, timeout=5):
        """True when the server closes the connection within timeout (what it sends
        before that is kept in self.buf)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def message(self, sender, rcpts, data, ehlo="client.sluice.test", params=""):
        """EHLO (unless ehlo is None), MAIL, RCPTs, DATA, data (already stuffed and
        ending in CRLF), the final dot; returns the reply to the dot."""
        if ehlo:
            self.expect(f"EHLO {ehlo}", "250")
        self.expect(f"MAIL FROM:<{sender}>{params}", "250")
        for r in rcpts:
            self.expect(f"RCPT TO:<{r}>", "250")
        self.expect("DATA", "354")
        self.send(data + b".\r\n")
        return self.reply()


def qid_of(reply):
    m = re.fullmatch(rf"250 2\.0\.0 Ok: queued as ({QID_RE})", reply.lines[-1])
    assert m, f"expected '250 2.0.0 Ok: queued as QID', got {reply}"
    return m.group(1)


def assert_envelope(qf, sender, rcpts, status="T"):
    got = [(r.status, r.address) for r in qf.recipients]
    want = [(status, a) for a in rcpts]
    assert qf.sender == sender and got == want, \
        f"expected sender <{sender}> and recipients {want}, the file holds <{qf.sender}> {got}"


@pytest.fixture(autouse=True)
def _need_tools():
    for tool in ("swaks",):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")


def message_bytes(subject, body_lines):
    head = (f"From: <{FROM}>\r\nTo: <{TO}>\r\nSubject: {subject}\r\n"
            "Message-ID: <test@sluice.test>\r\n\r\n").encode()
    return head + b"".join(line + b"\r\n" for line in body_lines)


# ---------------------------------------------------------------------------------------
# swaks: one message, the file byte for byte, `sluice queue`

DOT_LINES = [b"first line", b".starts with one dot", b"..starts with two dots", b".",
             b"..", b"...", b"", b"last line"]


def swaks(port, *args):
    cmd = [SWAKS, "--server", f"127.0.0.1:{port}", "--ehlo", "client.sluice.test",
           "--timeout", "20", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_swaks_message_is_queued_byte_for_byte(intake, workdir):
    it = intake()
    msg = message_bytes("swaks to the intake", DOT_LINES)
    data_file = workdir / "data.eml"
    data_file.write_bytes(msg)
    res = swaks(it.port, "--from", FROM, "--to", TO, "--data", str(data_file))
    qid = queued_id(res.stdout)
    assert res.returncode == 0 and qid, f"swaks exited {res.returncode}:\n{res.stdout}{res.stderr}"
    assert re.fullmatch(QID_RE, qid), f"expected a 16-character QID, got {qid!r}"
    # swaks stuffs dots (RFC 5321 4.5.2): what it sent is what the server must undo
    assert " -> ..starts with one dot" in res.stdout.splitlines(), \
        f"expected swaks to stuff the dots:\n{res.stdout}"

    qf = it.read(qid)
    assert_envelope(qf, FROM, [TO])
    assert qf.id == qid, f"expected the envelope's QID {qid}, got {qf.id}"
    m, rest = split_received(qf.body)
    assert m["helo"] == b"client.sluice.test" and m["client"] == b"[127.0.0.1]", m.group(0)
    assert m["by"] == HOSTNAME.encode() and m["with"] == b"ESMTP", m.group(0)
    assert m["id"] == qid.encode() and m["for"] == TO.encode(), m.group(0)
    # what swaks sent between 354 and the final dot, from its transcript (it adds an
    # empty line at the end)
    lines = res.stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("<-  354"))
    stop = lines.index(" -> .", start)
    sent = "".join(l[4:] + "\r\n" for l in lines[start + 1:stop]).encode()
    assert sent.startswith(dot_stuff(msg)), f"swaks sent {sent!r}"
    assert rest == stored_form(sent), f"expected the message as sent (dot-unstuffed, " \
                                      f"CRLF), got:\n{rest!r}\nsent:\n{sent!r}"
    assert rest.startswith(msg), rest
    assert b"\n" not in qf.body.replace(b"\r\n", b""), "a bare LF in the stored body"

    listed = it.listed()
    assert list(listed) == [qid], f"expected `sluice queue --json` to list {qid}, got {listed}"
    e = listed[qid]
    assert e["sender"] == FROM and [(r["address"], r["status"]) for r in e["recipients"]] \
        == [(TO, "T")] \
        and e["held"] is False and e["size"] == len(qf.body), \
        f"expected {FROM} -> {TO} (T), not held, size {len(qf.body)}: {e}"
    text = it.cli("queue").stdout
    assert qid in text and f"<{FROM}>" in text and f"T <{TO}>" in text, text
    show = it.cli("queue", "show", qid).stdout
    for want in (f"id:        {qid}", f"sender:    <{FROM}>", "client:    [127.0.0.1]",
                 "helo:      client.sluice.test", f"T <{TO}>"):
        assert want in show, f"expected {want!r} in `sluice queue show`:\n{show}"
    js = json.loads(it.cli("queue", "show", qid, "--json").stdout)
    assert js["id"] == qid and js["sender"] == FROM and js["size"] == len(qf.body) \
        and [(r["address"], r["status"]) for r in js["recipients"]] == [(TO, "T")], js
    st = intake_counters(it.stats())
    assert st["messages"] == 1 and st["recipients"] == 1 and st["bytes"] == len(qf.body), st


def test_several_recipients_and_no_for_clause(intake):
    """With more than one recipient the Received: header names none (privacy), and
    every recipient is in the file, in order, status T."""
    it = intake()
    rcpts = [f"r{i}@example.net" for i in range(5)]
    with it.connect() as c:
        qid = qid_of(c.message(FROM, rcpts, message_bytes("five", [b"hello"])))
    qf = it.read(qid)
    assert_envelope(qf, FROM, rcpts)
    m, rest = split_received(qf.body)
    assert m["for"] is None, f"expected no 'for' clause with 5 recipients: {m.group(0)!r}"
    assert rest == message_bytes("five", [b"hello"])


def test_null_sender_is_queued(intake):
    it = intake()
    with it.connect() as c:
        qid = qid_of(c.message("", [TO], message_bytes("bounce", [b"x"])))
    qf = it.read(qid)
    assert_envelope(qf, "", [TO])
    assert it.listed()[qid]["sender"] == "", it.listed()


# ---------------------------------------------------------------------------------------
# smtp-source: many concurrent sessions, the group commit

def test_smtp_source_100_messages_over_10_sessions(intake):
    if not os.path.exists(SMTP_SOURCE):
        pytest.skip("smtp-source is not installed")
    it = intake()
    t0 = time.monotonic()
    res = subprocess.run([SMTP_SOURCE, "-s", "10", "-m", "100", "-c", "-l", "4096",
                          "-f", FROM, "-t", TO, "-M", "source.sluice.test",
                          f"127.0.0.1:{it.port}"],
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert res.returncode == 0 and not res.stderr.strip(), \
        f"smtp-source exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    files = it.msg_files()
    assert len(files) == 100, f"expected 100 files in msg/, found {len(files)}"
    assert not it.tmp_files(), f"expected tmp/ empty, found {it.tmp_files()}"
    for qid in files:
        qf = it.read(qid)
        assert_envelope(qf, FROM, [TO])
        _, rest = split_received(qf.body)
        assert len(rest) >= 4096, f"{qid}: expected at least 4096 bytes of message, " \
                                  f"got {len(rest)}"
    listing = it.listing()
    assert listing["count"] == 100 and set(it.listed()) == set(files), \
        f"expected `sluice queue --json` to list the 100 files, count {listing['count']}"
    stats = it.stats()
    qs, ins = stats["queue"], intake_counters(stats)
    assert qs["messages"] == 100 and qs["commits"] == 100 and qs["commit_errors"] == 0, qs
    assert ins["messages"] == 100 and ins["recipients"] == 100 and ins["rejected"] == 0, ins
    assert ins["bytes"] == listing["bytes"], \
        f"expected intake bytes {ins['bytes']} == the listed bytes {listing['bytes']}"
    assert 1 <= qs["batches"] <= 100, qs
    flushes = (qs["syncs"] + qs["dir_syncs"]) / qs["commits"]
    assert flushes <= 2.0 and abs(flushes - qs["flushes_per_message"]) < 0.01, \
        f"expected at most 2 flushes per message (syncfs + directory fsync), got {qs}"
    print(f"100 messages in {took:.2f}s, {qs['batches']} batches, "
          f"{qs['flushes_per_message']} flushes per message")


# ---------------------------------------------------------------------------------------
# a real Postfix with relayhost = the intake

def test_postfix_relays_into_the_queue(intake, postfix):
    it = intake()
    pf = postfix(relayhost=f"[127.0.0.1]:{it.port}")
    res = pf.swaks("--from", FROM, "--to", TO, "--h-Subject", "through Postfix",
                   "--body", "Relayed by Postfix to sluice.\n.leading dot\n")
    pf_qid = queued_id(res.stdout)
    assert res.returncode == 0 and pf_qid, f"swaks to Postfix:\n{res.stdout}{res.stderr}"
    line = pf.maillog.wait_for(rf"^.*\b{pf_qid}: to=<{re.escape(TO)}>, "
                               rf"relay=127\.0\.0\.1\[127\.0\.0\.1\]:{it.port},.*"
                               rf"status=sent \(250 2\.0\.0 Ok: queued as ({QID_RE})\)",
                               timeout=60)
    qid = line.group(1)
    wait_until(lambda: pf.queue() == [], 30, "Postfix's queue to be empty")
    qf = it.read(qid)
    assert_envelope(qf, FROM, [TO])
    m, rest = split_received(qf.body)
    assert m["helo"] == b"mx.sluice.test" and m["client"] == b"[127.0.0.1]" \
        and m["for"] == TO.encode(), m.group(0)
    assert rest.startswith(b"Received: from client.sluice.test"), \
        f"expected Postfix's own Received: header next, got {rest[:200]!r}"
    assert b"\r\nSubject: through Postfix\r\n" in rest and \
        b"\r\n\r\nRelayed by Postfix to sluice.\r\n.leading dot\r\n" in rest, rest
    e = it.listed()[qid]
    assert e["sender"] == FROM and [(r["address"], r["status"]) for r in e["recipients"]] == [(TO, "T")], e
    js = json.loads(it.cli("queue", "show", qid, "--json").stdout)
    assert js["declared_size"] > 0, f"expected Postfix's SIZE= to be recorded: {js}"


# ---------------------------------------------------------------------------------------
# ESMTP

def test_ehlo_advertises_the_extensions(intake):
    it = intake(intake=["max_message_size = 2MiB;"])
    with it.connect() as c:
        r = c.expect("EHLO client.sluice.test", "250")
        assert r.lines[0] == f"250-{HOSTNAME}", r
        keywords = [l[4:] for l in r.lines[1:]]
        for kw in ("PIPELINING", f"SIZE {2 << 20}", "8BITMIME", "ENHANCEDSTATUSCODES",
                   "SMTPUTF8"):
            assert kw in keywords, f"expected {kw!r} in the EHLO reply, got {keywords}"
        for absent in ("STARTTLS", "AUTH", "CHUNKING"):
            assert not any(k.startswith(absent) for k in keywords), \
                f"{absent} advertised but not implemented: {keywords}"
        r = c.expect("HELO client.sluice.test", "250")
        assert r.lines == [f"250 {HOSTNAME}"], f"expected a one-line HELO reply, got {r}"


def test_pipelined_group_gets_its_replies_in_order(intake):
    it = intake()
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        # one write: the server must answer all of it, in order
        c.send(f"MAIL FROM:<{FROM}> SIZE=200\r\nRCPT TO:<a@example.net>\r\n"
               "RCPT TO:<bad address>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
        got = [c.reply() for _ in range(5)]
        want = ["250 2.1.0", "250 2.1.5", "501 5.1.3", "250 2.1.5", "354"]
        assert all(r.starts(w) for r, w in zip(got, want)), \
            f"expected replies {want} in order, got {got}"
        # the data, the dot, another transaction and QUIT in one write
        c.send(b"Subject: pipelined\r\n\r\nbody\r\n.\r\n"
               b"MAIL FROM:<" + FROM.encode() + b">\r\nRCPT TO:<c@example.net>\r\nDATA\r\n")
        r1 = c.reply()
        qid1 = qid_of(r1)
        rest = [c.reply() for _ in range(3)]
        assert [r.code for r in rest] == [250, 250, 354], rest
        c.send(b"second\r\n.\r\nQUIT\r\n")
        qid2 = qid_of(c.reply())
        assert c.reply().starts("221 2.0.0"), "expected 221 to QUIT"
        assert c.closed(), "expected the server to close after QUIT"
    assert_envelope(it.read(qid1), FROM, ["a@example.net", "b@example.net"])
    assert_envelope(it.read(qid2), FROM, ["c@example.net"])
    assert split_received(it.read(qid2).body)[1] == b"second\r\n"


def test_8bitmime_and_smtputf8_are_accepted_and_recorded(intake):
    it = intake()
    body8 = "Subject: caf\u00e9\r\n\r\nna\u00efve 8-bit body\r\n".encode()
    with it.connect() as c:
        qid_plain = qid_of(c.message(FROM, [TO], b"Subject: plain\r\n\r\nx\r\n"))
        qid8 = qid_of(c.message(FROM, [TO], body8, ehlo=None, params=" BODY=8BITMIME"))
        utf_rcpt = "j\u00f6rg@b\u00fccher.example"
        c.expect(f"MAIL FROM:<{FROM}> BODY=8BITMIME SMTPUTF8", "250")
        c.send(f"RCPT TO:<{utf_rcpt}>\r\n".encode())
        r = c.reply()
        assert r.starts("250"), f"expected a UTF-8 recipient accepted with SMTPUTF8, got {r}"
        c.expect("DATA", "354")
        c.send(body8 + b".\r\n")
        qid_utf = qid_of(c.reply())
        # an 8-bit address without SMTPUTF8: refused
        c.expect(f"MAIL FROM:<{FROM}>", "250")
        c.send(f"RCPT TO:<{utf_rcpt}>\r\n".encode())
        r = c.reply()
        assert r.starts("553 5.6.7"), f"expected 553 5.6.7 for an 8-bit address " \
                                      f"without SMTPUTF8, got {r}"

    def flags(qid):
        js = json.loads(it.cli("queue", "show", qid, "--json").stdout)
        return js["8bitmime"], js["smtputf8"]
    assert flags(qid_plain) == (False, False), flags(qid_plain)
    assert flags(qid8) == (True, False), flags(qid8)
    assert flags(qid_utf) == (True, True), flags(qid_utf)
    qf = it.read(qid_utf)
    assert_envelope(qf, FROM, [utf_rcpt])
    m, rest = split_received(qf.body)
    assert m["with"] == b"UTF8SMTP" and rest == body8, (m.group(0), rest)
    assert split_received(it.read(qid8).body)[1] == body8


def test_helo_refuses_esmtp_parameters(intake):
    it = intake()
    with it.connect() as c:
        c.expect("HELO client.sluice.test", "250")
        r = c.cmd(f"MAIL FROM:<{FROM}> SIZE=100")
        assert r.starts("555 5.5.4"), f"expected 555 5.5.4 for SIZE= after HELO, got {r}"
        r = c.cmd(f"MAIL FROM:<{FROM}> BODY=8BITMIME")
        assert r.starts("555 5.5.4"), f"expected 555 5.5.4 for BODY= after HELO, got {r}"
        qid = qid_of(c.message(FROM, [TO], b"Subject: helo\r\n\r\nx\r\n", ehlo=None))
    m, _ = split_received(it.read(qid).body)
    assert m["with"] == b"SMTP", f"expected 'with SMTP' after HELO: {m.group(0)!r}"


# ---------------------------------------------------------------------------------------
# limits

def test_message_over_max_message_size(intake):
    it = intake(intake=["max_message_size = 10KiB;"])
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        r = c.cmd(f"MAIL FROM:<{FROM}> SIZE={10 * 1024 + 1}")
        assert r.starts("552 5.3.4"), f"expected 552 5.3.4 for SIZE over the limit, got {r}"
        c.expect(f"MAIL FROM:<{FROM}> SIZE={10 * 1024}", "250")
        c.expect(f"RCPT TO:<{TO}>", "250")
        c.expect("DATA", "354")
        c.send(b"Subject: big\r\n\r\n" + (b"x" * 70 + b"\r\n") * 200 + b".\r\n")
        r = c.reply()
        assert r.starts("552 5.3.4"), f"expected 552 5.3.4 for 14 KB over 10KiB, got {r}"
        it.assert_nothing_queued()
        # the session goes on
        qid = qid_of(c.message(FROM, [TO], b"Subject: small\r\n\r\nx\r\n", ehlo=None))
    assert list(it.msg_files()) == [qid]
    assert intake_counters(it.stats())["rejected"] == 1


def test_recipients_over_max_recipients(intake):
    it = intake(intake=["max_recipients = 3;"])
    rcpts = [f"r{i}@example.net" for i in range(5)]
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        c.expect(f"MAIL FROM:<{FROM}>", "250")
        got = [c.cmd(f"RCPT TO:<{r}>") for r in rcpts]
        assert [r.lines[0][:9] for r in got] == ["250 2.1.5"] * 3 + ["452 4.5.3"] * 2, \
            f"expected 3 accepted then 452 4.5.3, got {got}"
        c.expect("DATA", "354")
        c.send(b"Subject: three\r\n\r\nx\r\n.\r\n")
        qid = qid_of(c.reply())
    assert_envelope(it.read(qid), FROM, rcpts[:3])


def test_command_line_over_512_bytes(intake):
    it = intake()
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        # 510 bytes of text and CRLF: the longest line RFC 5321 4.5.3.1.4 allows
        c.expect("NOOP " + "x" * 505, "250")
        r = c.cmd("NOOP " + "x" * 506)
        assert r.starts("500 5.5.2"), f"expected 500 5.5.2 for a 513-byte line, got {r}"
        # a much longer line, whole in one write: answered at once (not only when the
        # client sends something more), and only once
        c.sock.settimeout(3)
        try:
            r = c.cmd("MAIL FROM:<" + "a" * 2000 + "@example.net>")
        except socket.timeout:
            raise AssertionError("expected 500 5.5.2 at once for a 2 KB command line sent "
                                 "whole, got no reply within 3 s") from None
        assert r.starts("500 5.5.2"), f"expected 500 5.5.2 for a 2 KB line, got {r}"
        c.sock.settimeout(10)
        r = c.cmd("NOOP")
        assert r.starts("250"), f"expected the session to go on after a long line, got {r}"
        qid = qid_of(c.message(FROM, [TO], b"Subject: after\r\n\r\nx\r\n", ehlo=None))
    assert list(it.msg_files()) == [qid]


def test_message_line_over_max_line_length(intake):
    it = intake(intake=["max_line_length = 100;"])
    with it.connect() as c:
        ok = b"Subject: lines\r\n\r\n" + b"y" * 100 + b"\r\n"
        qid = qid_of(c.message(FROM, [TO], ok))
        c.expect(f"MAIL FROM:<{FROM}>", "250")
        c.expect(f"RCPT TO:<{TO}>", "250")
        c.expect("DATA", "354")
        c.send(b"Subject: lines\r\n\r\n" + b"y" * 101 + b"\r\n.\r\n")
        r = c.reply()
        assert r.starts("550 5.6.0"), f"expected 550 5.6.0 for a 101-byte line, got {r}"
        it.assert_nothing_queued(before=[qid])
        c.expect("NOOP", "250")
    assert split_received(it.read(qid).body)[1] == ok


def test_bad_sequence(intake):
    it = intake()
    with it.connect() as c:
        for line, want in [(f"MAIL FROM:<{FROM}>", "503 5.5.1"),
                           (f"RCPT TO:<{TO}>", "503 5.5.1"),
                           ("DATA", "503 5.5.1"),
                           ("EHLO client.sluice.test", "250"),
                           (f"RCPT TO:<{TO}>", "503 5.5.1"),
                           ("DATA", "503 5.5.1"),
                           (f"MAIL FROM:<{FROM}>", "250"),
                           (f"MAIL FROM:<{FROM}>", "503 5.5.1"),
                           # MAIL but no recipient: Postfix's answer too
                           ("DATA", "554 5.5.1"),
                           (f"RCPT TO:<{TO}>", "250"),
                           ("DATA", "354")]:
            r = c.cmd(line)
            assert r.starts(want), f"{line}: expected {want}, got {r}"
        c.send(b"x\r\n.\r\n")
        qid_of(c.reply())


def test_syntax_errors(intake):
    it = intake()
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        for line, want in [("MAIL FROM:<a b@example.net>", "501 5.1.7"),
                           ("MAIL FROM:<a@b@example.net>", "501 5.1.7"),
                           ("MAIL FROM:<a@example.net> FOO=bar", "555 5.5.4"),
                           ("MAIL TO:<a@example.net>", "501 5.5.4"),
                           ("EHLO", "501 5.5.4"),
                           ("XYZZY", "500 5.5.2"),
                           ("EXPN list", "502 5.5.1"),
                           (f"MAIL FROM:<{FROM}>", "250"),
                           ("RCPT TO:<bad address>", "501 5.1.3"),
                           ("RCPT TO:<a@@example.net>", "501 5.1.3"),
                           ("RCPT TO:<>", "501 5.1.3"),
                           (f"RCPT TO:<{TO}>", "250"),
                           ("DATA extra", "501 5.5.4")]:
            r = c.cmd(line)
            assert r.starts(want), f"{line}: expected {want}, got {r}"


def test_vrfy_noop_rset_help_quit(intake):
    it = intake()
    with it.connect() as c:
        for line, want in [("VRFY postmaster", "252"), ("NOOP", "250 2.0.0"),
                           ("RSET", "250 2.0.0"), ("HELP", "214"),
                           ("EHLO client.sluice.test", "250"),
                           (f"MAIL FROM:<{FROM}>", "250"), (f"RCPT TO:<{TO}>", "250"),
                           ("RSET", "250 2.0.0"),
                           # the transaction is gone
                           ("DATA", "503 5.5.1"),
                           ("QUIT", "221 2.0.0")]:
            r = c.cmd(line)
            assert r.starts(want), f"{line}: expected {want}, got {r}"
        assert c.closed(), "expected the connection closed after QUIT"
    it.assert_nothing_queued()


def test_too_many_errors_close_the_session(intake):
    it = intake(intake=["max_errors = 3;"])
    with it.connect() as c:
        assert c.cmd("XYZZY 1").starts("500"), "expected 500"
        assert c.cmd("XYZZY 2").starts("500"), "expected 500"
        c.send("XYZZY 3\r\n")
        r1 = c.reply()
        r2 = c.reply()
        assert r1.starts("500") and r2.starts("421 4.7.0"), \
            f"expected 500 then 421 4.7.0 on the third error, got {r1} / {r2}"
        assert c.closed(), "expected the connection closed after 421"
    it.log.wait_for(r"too many errors \(3\), closing")


def test_max_sessions(intake):
    it = intake(intake=["max_sessions = 2;"])
    first, second = it.connect(), it.connect()
    # Sessions between commands hold their slots; one that has not sent its first
    # command yet would make room for a newcomer (test_hostile.py).
    first.expect("EHLO client.sluice.test", "250")
    second.expect("EHLO client.sluice.test", "250")
    try:
        with it.connect(greeting=False) as c:
            r = c.reply()
            assert r.starts("421 4.3.2"), f"expected 421 4.3.2 for a third session, got {r}"
            assert c.closed(), "expected the connection closed after the 421"
        first.expect("QUIT", "221")
        first.closed()

        def admitted():
            with it.connect(greeting=False) as c:
                return c.reply().code == 220
        wait_until(admitted, 5, "a new session admitted once one has ended")
        qid = qid_of(second.message(FROM, [TO], b"Subject: still here\r\n\r\nx\r\n"))
    finally:
        first.close()
        second.close()
    assert list(it.msg_files()) == [qid]


def test_idle_timeout(intake):
    it = intake(intake=["idle_timeout = 1s;"])
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        t0 = time.monotonic()
        c.sock.settimeout(10)
        r = c.reply()
        took = time.monotonic() - t0
        assert r.starts("421 4.4.2"), f"expected 421 4.4.2 after the idle timeout, got {r}"
        assert 0.8 <= took <= 4, f"expected the 421 about 1 s after the last command, took {took:.2f}s"
        assert c.closed(), "expected the connection closed after the 421"


def test_timeout_in_the_middle_of_data_leaves_nothing(intake):
    it = intake(intake=["idle_timeout = 1s;", "command_timeout = 1s;"])
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        c.expect(f"MAIL FROM:<{FROM}>", "250")
        c.expect(f"RCPT TO:<{TO}>", "250")
        c.expect("DATA", "354")
        c.send(b"Subject: stalled\r\n\r\npart of a line")
        c.sock.settimeout(10)
        r = c.reply()
        assert r.starts("421 4.4.2"), f"expected 421 4.4.2 for a stalled DATA, got {r}"
        assert c.closed(), "expected the connection closed after the 421"
    it.assert_nothing_queued()


def test_client_gone_in_the_middle_of_data_leaves_nothing(intake):
    it = intake()
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        c.expect(f"MAIL FROM:<{FROM}>", "250")
        c.expect(f"RCPT TO:<{TO}>", "250")
        c.expect("DATA", "354")
        c.send(b"Subject: cut\r\n\r\n" + b"z" * 200000 + b"\r\n")
    it.assert_nothing_queued()
    with it.connect() as c:
        c.expect("NOOP", "250")      # the daemon is fine


def test_rset_abandons_the_transaction(intake):
    it = intake()
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        c.expect(f"MAIL FROM:<{FROM}>", "250")
        c.expect(f"RCPT TO:<{TO}>", "250")
        c.expect("RSET", "250")
        c.expect("MAIL FROM:<other@sluice.test>", "250")
        c.expect("RCPT TO:<second@example.net>", "250")
        c.expect("DATA", "354")
        c.send(b"Subject: after rset\r\n\r\nx\r\n.\r\n")
        qid = qid_of(c.reply())
    # the second transaction only: nothing of the first survived
    assert_envelope(it.read(qid), "other@sluice.test", ["second@example.net"])
    assert list(it.msg_files()) == [qid]


def test_quit_after_the_250_keeps_the_message(intake):
    it = intake()
    c = it.connect()
    qid = qid_of(c.message(FROM, [TO], b"Subject: quit\r\n\r\nx\r\n"))
    c.expect("QUIT", "221")
    assert c.closed()
    c.close()
    assert_envelope(it.read(qid), FROM, [TO])
    # and a client that just drops the connection after the 250
    c = it.connect()
    qid2 = qid_of(c.message(FROM, [TO], b"Subject: drop\r\n\r\nx\r\n"))
    c.close()
    it.s.stop()
    assert set(it.msg_files()) == {qid, qid2}
    it.s.start()
    assert set(it.listed()) == {qid, qid2}, it.listed()


# ---------------------------------------------------------------------------------------
# SMTP smuggling

SMUGGLED = (b"MAIL FROM:<smuggler@evil.example>\r\nRCPT TO:<victim@example.net>\r\n"
            b"DATA\r\nSubject: smuggled\r\n\r\nsmuggled body\r\n")


@pytest.mark.parametrize("fake_end", [b"\n.\n", b"\r\n.\n", b"\n.\r\n", b"\r.\r",
                                      b"\r\n.\r", b"\r.\r\n"],
                         ids=["LF.LF", "CRLF.LF", "LF.CRLF", "CR.CR", "CRLF.CR", "CR.CRLF"])
def test_smtp_smuggling_is_one_message(intake, fake_end):
    """A fake end of data followed by a second transaction, then the real CRLF.CRLF: one
    message is queued, and the fake end and the smuggled commands are its content."""
    it = intake()
    data = b"Subject: carrier\r\n\r\ncarrier body" + fake_end + SMUGGLED
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        c.expect(f"MAIL FROM:<{FROM}>", "250")
        c.expect(f"RCPT TO:<{TO}>", "250")
        c.expect("DATA", "354")
        c.send(data + b".\r\n")
        qid = qid_of(c.reply())
        # nothing else is pending: the next reply is to NOOP
        r = c.cmd("NOOP")
        assert r.starts("250 2.0.0"), f"expected only the NOOP's reply after the 250, got {r}"
    files = it.msg_files()
    assert list(files) == [qid], f"expected exactly one message ({qid}), msg/ holds {sorted(files)}"
    qf = it.read(qid)
    assert_envelope(qf, FROM, [TO])
    _, rest = split_received(qf.body)
    assert rest == stored_form(data), f"expected the smuggled text as content:\n" \
                                      f"{stored_form(data)!r}\ngot\n{rest!r}"
    assert b"\r\n.\r\nMAIL FROM:<smuggler@evil.example>\r\n" in rest, rest
    assert intake_counters(it.stats())["bare_eol"] == 1


# ---------------------------------------------------------------------------------------
# access

def test_client_outside_allow_is_refused_at_connect(intake):
    it = intake(intake=['allow = ["10.0.0.0/8"];'])
    with it.connect(greeting=False) as c:
        r = c.reply()
        assert r.starts("554 5.7.1"), f"expected 554 5.7.1 at connect, got {r}"
        # RFC 5321 3.1: after a 554 greeting the server answers 503 to everything but
        # QUIT; nothing it is sent can queue a message
        for cmd in ("EHLO x", f"MAIL FROM:<{FROM}>", f"RCPT TO:<{TO}>", "DATA"):
            r = c.cmd(cmd)
            assert r.starts("503 5.7.1"), f"expected 503 5.7.1 to {cmd} after 554, got {r}"
        c.send("Subject: refused\r\n\r\nx\r\n.\r\n")
        r = c.cmd("QUIT")
        while not r.starts("221"):
            assert r.code // 100 == 5, f"expected 5xx replies, then 221 to QUIT, got {r}"
            r = c.reply()
        assert c.closed(), "expected the connection closed after QUIT"
    it.assert_nothing_queued()
    it.log.wait_for(r"client \[127\.0\.0\.1\] not in intake allow: refused")
    assert intake_counters(it.stats())["refused"] == 1


ALLOW_EDGES = [
    # 127.0.0.0-1: the intake's usual client is the last address in
    ("127.0.0.0/31", ["127.0.0.1"], ["127.0.0.2"]),
    # 127.0.0.2-3: 127.0.0.1 is the address just below
    ("127.0.0.2/31", ["127.0.0.2", "127.0.0.3"], ["127.0.0.1", "127.0.0.4"]),
    # one address: its neighbours on both sides are out
    ("127.0.0.2/32", ["127.0.0.2"], ["127.0.0.1", "127.0.0.3"]),
    # a boundary inside the byte, not at its last bit
    ("127.0.0.128/25", ["127.0.0.128", "127.0.0.255"], ["127.0.0.127"]),
]


@pytest.mark.parametrize("allow, inside, outside", ALLOW_EDGES,
                         ids=[e[0] for e in ALLOW_EDGES])
def test_allow_prefix_boundaries(intake, allow, inside, outside):
    """allow = [one prefix] and clients bound to the addresses on either side of its
    edges (loopback carries all of 127/8): each address inside is greeted 220 and its
    message is queued with client=[ADDR]; each one outside gets 554 5.7.1 at connect and
    the log line naming it, and the intake counts exactly those refusals."""
    it = intake(intake=[f"allow = [{q(allow)}];"])
    for addr in inside:
        with it.connect(greeting=False, source=addr) as c:
            r = c.reply()
            assert r.starts("220"), f"{addr} in allow {allow}: expected 220, got {r}"
            qid = qid_of(c.message(FROM, [TO], b"Subject: inside\r\n\r\nx\r\n"))
            c.expect("QUIT", "221")
        esc = re.escape(addr)
        it.log.wait_for(rf"svc=intake peer=\S+ queued qid={qid} .* client=\[{esc}\]$")
    for addr in outside:
        with it.connect(greeting=False, source=addr) as c:
            r = c.reply()
            assert r.starts("554 5.7.1"), (
                f"{addr} outside allow {allow}: expected 554 5.7.1 at connect, got {r}")
            r = c.cmd(f"MAIL FROM:<{FROM}>")
            assert r.starts("503 5.7.1"), f"expected 503 5.7.1 after 554, got {r}"
        it.log.wait_for(rf"client \[{re.escape(addr)}\] not in intake allow: refused")
    for addr in inside:
        assert not it.log.search(rf"client \[{re.escape(addr)}\] not in intake allow"), \
            it.log.tail()
    assert sorted(it.msg_files()) == sorted(m["id"] for m in it.listing()["messages"])
    assert len(it.msg_files()) == len(inside)
    assert intake_counters(it.stats())["refused"] == len(outside)


def test_default_allow_takes_loopback(intake):
    it = intake()
    with it.connect() as c:
        qid = qid_of(c.message(FROM, [TO], b"Subject: loopback\r\n\r\nx\r\n"))
    assert list(it.msg_files()) == [qid]


def test_unix_socket_listener_ignores_allow(intake):
    """allow is for inet listeners; a unix socket is guarded by its file mode, so a local
    client gets in even when no network is allowed."""
    it = intake(intake=['allow = ["10.0.0.0/8"];'],
                listen=["inet:127.0.0.1:PORT", "unix:@DIR@/intake.sock"])
    path = str(it.s.dir / "intake.sock")
    with Client(path) as c:
        r = c.reply()
        assert r.starts("220"), f"expected 220 on the unix socket, got {r}"
        qid = qid_of(c.message(FROM, [TO], b"Subject: unix\r\n\r\nx\r\n", ehlo="local"))
    qf = it.read(qid)
    assert_envelope(qf, FROM, [TO])
    # and the inet listener still refuses
    with it.connect(greeting=False) as c:
        assert c.reply().starts("554 5.7.1")


# ---------------------------------------------------------------------------------------
# `sluice queue`

def queue_three(it):
    qids = []
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        for i in range(3):
            qids.append(qid_of(c.message(FROM, [f"r{i}@example.net"],
                                         f"Subject: {i}\r\n\r\nx\r\n".encode(), ehlo=None)))
    return qids


def test_queue_hold_release_delete_flush(intake):
    it = intake()
    a, b, c = queue_three(it)
    assert sorted([a, b, c]) == [a, b, c], "expected QIDs to sort by arrival"
    assert it.read(a).control[0:1] == b"-"

    res = it.cli("queue", "hold", a)
    assert f"{a}: held" in res.stdout, res.stdout
    assert it.listed()[a]["held"] is True and it.listed()[b]["held"] is False
    text = it.cli("queue").stdout
    assert re.search(rf"^{a}!", text, re.M) and re.search(rf"^{b} ", text, re.M), text
    assert it.read(a).control[0:1] == b"H", f"expected control byte 0 'H': {it.read(a).control}"
    assert "(held)" in it.cli("queue", "show", a).stdout
    assert it.stats()["queue"]["held"] == 1

    it.cli("queue", "release", a)
    assert it.listed()[a]["held"] is False
    assert it.read(a).control[0:1] == b"-"

    res = it.cli("queue", "flush", b)
    assert f"{b}: eligible for delivery now" in res.stdout, res.stdout

    res = it.cli("queue", "delete", b)
    assert f"{b}: deleted" in res.stdout, res.stdout
    assert set(it.msg_files()) == {a, c} and set(it.listed()) == {a, c}

    # unknown IDs: exit 1, "no such message"
    for args in (("hold", b), ("release", "0000000000000000"), ("delete", b),
                 ("flush", "nonsense"), ("show", b), ("list", b)):
        res = it.cli("queue", *args, check=False)
        assert res.returncode == 1 and "no such message" in res.stdout + res.stderr, \
            f"`sluice queue {' '.join(args)}`: expected exit 1 and 'no such message', got " \
            f"{res.returncode}: {res.stdout}{res.stderr}"
    # several IDs, one unknown: the others are done, exit 1
    res = it.cli("queue", "hold", a, b, c, check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 1 and f"{a}: held" in out and f"{b}: no such message" in out \
        and f"{c}: held" in out, f"expected exit 1, {a} and {c} held, {b} unknown: " \
                                 f"{res.returncode} {out}"
    assert all(e["held"] for e in it.listed().values())


def test_queue_all_and_json(intake):
    it = intake()
    qids = queue_three(it)
    res = it.cli("queue", "hold", "--all", "--json")
    js = json.loads(res.stdout)
    assert js == {"selected": 3, "done": 3, "failed": 0, "missing": 0}, js
    assert all(it.read(q).control[0:1] == b"H" for q in qids)
    assert it.stats()["queue"]["held"] == 3
    it.cli("queue", "release", "--all")
    assert not any(e["held"] for e in it.listed().values())
    js = json.loads(it.cli("queue", "flush", "--all", "--json").stdout)
    assert js["done"] == 3, js
    lines = it.cli("queue", "list", qids[1], "--json").stdout.splitlines()
    assert [json.loads(line)["id"] for line in lines] == [qids[1]], lines
    res = it.cli("queue", "hold", "--all", qids[0], check=False)
    assert res.returncode != 0, f"expected --all with an ID refused: {res.stdout}"
    js = json.loads(it.cli("queue", "delete", "--all", "--json").stdout)
    assert js["done"] == 3 and js["failed"] == 0, js
    assert it.msg_files() == {} and it.listing()["count"] == 0
    assert "the queue is empty" in it.cli("queue").stdout
    res = it.cli("queue", "delete", "--all")
    assert "the queue is empty" in res.stdout, res.stdout
    res = it.cli("queue", "bogus", "x", check=False)
    assert res.returncode != 0 and "unknown queue command" in res.stdout + res.stderr, res


# ---------------------------------------------------------------------------------------
# recovery at start

def other_qid(qid):
    """A valid QID with the same msg/H directory: another sequence number."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    last = alphabet[(alphabet.index(qid[-1]) + 1) % 32]
    return qid[:-1] + last


def test_recovery_at_start(intake):
    it = intake()
    with it.connect() as c:
        c.expect("EHLO client.sluice.test", "250")
        good = qid_of(c.message(FROM, [TO], b"Subject: good\r\n\r\nx\r\n", ehlo=None))
        uncertain = qid_of(c.message(FROM, ["u1@example.net", "u2@example.net"],
                                     b"Subject: uncertain\r\n\r\nx\r\n", ehlo=None))
        big = qid_of(c.message(FROM, [TO], b"Subject: big\r\n\r\n" +
                               (b"b" * 50 + b"\r\n") * 100, ehlo=None))
    assert it.s.stop() == 0
    files = it.msg_files()
    # a leftover tmp/ file (a write that never reached its commit point)
    leftover = other_qid(other_qid(good))
    (it.queue_dir / "tmp" / leftover).write_bytes(files[good].read_bytes()[:100])
    # a truncated copy of a committed message under another valid QID, in its right dir
    damaged = other_qid(big)
    while damaged in files:
        damaged = other_qid(damaged)
    data = files[big].read_bytes()
    (files[big].parent / damaged).write_bytes(data[:len(data) // 2])
    # the second recipient of one message was being delivered: status U
    rcpts = read_queue_file(files[uncertain]).recipients
    assert [r.status for r in rcpts] == ["T", "T"], rcpts
    with open(files[uncertain], "r+b") as f:
        f.seek(rcpts[1].status_offset)
        f.write(b"U")
    assert [r.status for r in read_queue_file(files[uncertain]).recipients] == ["T", "U"]

    mark = it.log.mark()
    it.s.start()
    assert it.tmp_files() == [], f"expected tmp/ emptied by recovery, found {it.tmp_files()}"
    assert it.corrupt_files() == [damaged], \
        f"expected corrupt/ to hold {damaged}, found {it.corrupt_files()}"
    assert (it.queue_dir / "corrupt" / damaged).read_bytes() == data[:len(data) // 2]
    it.log.wait_for(rf"{damaged} moved to corrupt/", after=mark)
    it.log.wait_for(rf"{uncertain}: 1 recipients? uncertain", after=mark)
    assert [r.status for r in it.read(uncertain).recipients] == ["T", "T"], \
        f"expected the U recipient back to T: {it.read(uncertain).recipients}"
    assert set(it.msg_files()) == {good, uncertain, big}, sorted(it.msg_files())
    listed = it.listed()
    assert set(listed) == {good, uncertain, big}, f"expected the good messages listed: {listed}"
    assert [r["status"] for r in listed[uncertain]["recipients"]] == ["T", "T"]


# ---------------------------------------------------------------------------------------
# a failed commit

def test_full_disk_answers_452_and_leaves_nothing(intake):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for the queue needs root")
    # no reserve: the 1 MiB disk is below queue.min_free's default of 10 MiB, and what is
    # checked here is the write path (test_overload.py checks the reserve at MAIL)
    it = intake(start=False, queue=["min_free = 0;"])
    qdir = it.queue_dir
    qdir.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs",
                          str(qdir)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the queue: {res.stderr.strip()}")
    try:
        it.s.start()
        with it.connect() as c:
            ok = qid_of(c.message(FROM, [TO], b"Subject: fits\r\n\r\nx\r\n"))
        # fill the file system, leaving less than a body chunk free
        filler = qdir / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        st = os.statvfs(qdir)
        assert st.f_bavail * st.f_frsize < 64 * 1024, "the tmpfs is not full"
        with it.connect() as c:
            c.expect("EHLO client.sluice.test", "250")
            # a message written as it comes (156 KB: body records fail), and a small
            # one (written whole with its end record at the final dot)
            for what, body in (("large", (b"f" * 76 + b"\r\n") * 2000), ("small", b"s\r\n")):
                c.expect(f"MAIL FROM:<{FROM}>", "250")
                c.expect(f"RCPT TO:<{TO}>", "250")
                r = c.cmd("DATA")
                if r.code == 354:
                    c.send(b"Subject: " + what.encode() + b"\r\n\r\n" + body + b".\r\n")
                    r = c.reply()
                assert r.starts("452 4.3.1"), \
                    f"expected 452 4.3.1 for a {what} message on a full disk, got {r}"
                it.assert_nothing_queued(before=[ok])
            # room again: the same session queues
            filler.unlink()
            qid = qid_of(c.message(FROM, [TO], b"Subject: room again\r\n\r\nx\r\n", ehlo=None))
        assert set(it.msg_files()) == {ok, qid} and not it.tmp_files()
        stats = it.stats()
        assert intake_counters(stats)["rejected"] == 2 and \
            intake_counters(stats)["messages"] == 2, stats
    finally:
        it.s.stop()
        res = subprocess.run(["umount", str(qdir)], capture_output=True, text=True)
        if res.returncode != 0:
            subprocess.run(["umount", "-l", str(qdir)])


def test_failed_rename_answers_451_and_leaves_nothing(intake):
    """The commit itself fails (the batch's rename into msg/H/ finds the directory gone:
    sluiced renames through the directory descriptors it opened at start, so removing
    the empty msg/H directories makes every rename fail with ENOENT): 451 4.3.0, the
    tmp/ file is removed, nothing is in msg/, and the next start recreates the layout."""
    it = intake()
    for d in (it.queue_dir / "msg").iterdir():
        d.rmdir()
    with it.connect() as c:
        r = c.message(FROM, [TO], b"Subject: no directory\r\n\r\nx\r\n")
        assert r.starts("451 4.3.0"), f"expected 451 4.3.0 when the commit fails, got {r}"
        assert not it.tmp_files(), f"expected tmp/ empty after the failed commit, " \
                                   f"found {it.tmp_files()}"
        c.expect("NOOP", "250")
    it.log.wait_for(r"commit failed")
    stats = it.stats()
    assert stats["queue"]["commit_errors"] == 1 and stats["queue"]["commits"] == 0 and \
        stats["queue"]["messages"] == 0, stats["queue"]
    assert intake_counters(stats)["rejected"] == 1, intake_counters(stats)
    assert it.listing()["count"] == 0
    it.s.stop()
    it.s.start()
    assert len(list((it.queue_dir / "msg").iterdir())) == 32
    with it.connect() as c:
        qid = qid_of(c.message(FROM, [TO], b"Subject: again\r\n\r\nx\r\n"))
    assert list(it.msg_files()) == [qid]


# ---------------------------------------------------------------------------------------
# statistics (last: under meson's -x a failure here hides nothing)

def test_background_daemon_commits_and_stops(workdir):
    """sluiced -d forks into the background: its committer thread must run in the child
    (a fork keeps only the calling thread), so a message is answered 250 and SIGTERM
    ends the daemon."""
    from conftest import SLUICED, wait_listening, with_root_user
    port = free_port()
    d = workdir / "bg"
    d.mkdir()
    conf = d / "sluiced.conf"
    conf.write_text(with_root_user(intake_config(port).replace("@DIR@", str(d))))
    pid_file = d / "sluiced.pid"
    log = d / "sluiced.log"
    with open(log, "ab") as logf:  # the daemon keeps stderr (its log) open
        res = subprocess.run([SLUICED, "-c", str(conf), "-d", "-p", str(pid_file)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=logf, timeout=30)
    assert res.returncode == 0, f"sluiced -d exited {res.returncode}: {log.read_text()}"
    wait_until(pid_file.exists, 10, "the pid file")
    pid = int(pid_file.read_text().split()[0])
    try:
        wait_listening(f"inet:127.0.0.1:{port}", 10)
        c = Client(("127.0.0.1", port), 10)
        assert c.reply().code == 220
        r = c.message(FROM, [TO], message_bytes("background", [b"hello"]))
        assert r.code == 250, f"expected 250 from a background sluiced, got {r}"
        c.close()
    finally:
        os.kill(pid, 15)

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    wait_until(gone, 15, "the background sluiced to exit after SIGTERM")
    assert not list((d / "queue" / "tmp").iterdir())
    assert "sluiced stopped" in log.read_text()


def test_client_that_never_reads_cannot_grow_memory(intake):
    """A client pipelining NOOPs without reading a reply: the session stops reading once
    its unread replies pass a limit, so the daemon's memory stays bounded (and the
    sender is held back by TCP) instead of buffering every reply."""
    it = intake()
    rss0 = rss_kib(it.s.pid)
    s = socket.create_connection(("127.0.0.1", it.port), 10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    sent, chunk, t0 = 0, b"NOOP\r\n" * 1000, time.monotonic()
    while time.monotonic() - t0 < 4:
        try:
            sent += s.send(chunk)
        except BlockingIOError:
            time.sleep(0.01)
    grown = rss_kib(it.s.pid) - rss0
    s.close()
    assert sent < 50_000_000, f"expected the server to stop reading, it took {sent} bytes"
    assert grown < 16 * 1024, f"expected RSS to grow by less than 16 MiB, it grew {grown} KiB"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/PID/status")


def test_stats_json_has_no_duplicate_keys(intake):
    """`sluice stats --json` is one object whose keys are unique: the intake's session
    statistics (connections, durations) and its message counters must not both be
    called "intake" (a JSON parser keeps one of them and loses the other)."""
    it = intake()
    with it.connect() as c:
        qid_of(c.message(FROM, [TO], message_bytes("stats", [b"x"])))
    stats = it.stats()

    def dups(node, path="$"):
        out = []
        if isinstance(node, MultiDict):
            out += [f"{path}.{k}" for k in node.duplicates]
            for k, vs in node.all.items():
                for v in vs:
                    out += dups(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out += dups(v, f"{path}[{i}]")
        return out
    found = dups(stats)
    assert not found, f"expected unique keys in `sluice stats --json`, repeated: {found}\n" \
                      f"{it.cli('stats', '--json').stdout}"
