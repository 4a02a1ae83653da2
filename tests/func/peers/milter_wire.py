"""A minimal MTA side of the milter protocol v6, written from MILTER-PROTOCOL.md.

Used by the functional tests to send exactly the bytes a test wants (malformed packets,
one byte at a time, many packets in one write) and to read every reply packet.  It honours
the filter's negotiated skip (SMFIP_NO*) and no-reply (SMFIP_NR_*) bits the way Postfix
does, so a test can run a whole session against any configuration.
"""

import socket
import struct
import time

# commands (MTA -> filter)
OPTNEG, MACRO, CONNECT, HELO, MAIL, RCPT, DATA = b"O", b"D", b"C", b"H", b"M", b"R", b"T"
HEADER, EOH, BODY, EOB, UNKNOWN, ABORT, QUIT, QUIT_NC = (b"L", b"N", b"B", b"E", b"U",
                                                         b"A", b"Q", b"K")
# replies (filter -> MTA)
CONTINUE, ACCEPT, REJECT, TEMPFAIL, REPLYCODE, DISCARD, SKIP, PROGRESS = (
    b"c", b"a", b"r", b"t", b"y", b"d", b"s", b"p")
QUARANTINE, ADDHEADER, INSHEADER, CHGHEADER = b"q", b"h", b"i", b"m"
ADDRCPT, ADDRCPT_PAR, DELRCPT, CHGFROM, REPLBODY, SHUTDOWN = b"+", b"2", b"-", b"e", b"b", b"4"
FINAL_REPLIES = (CONTINUE, ACCEPT, REJECT, TEMPFAIL, REPLYCODE, DISCARD, SKIP, SHUTDOWN)
MODIFICATIONS = (QUARANTINE, ADDHEADER, INSHEADER, CHGHEADER, ADDRCPT, ADDRCPT_PAR, DELRCPT,
                 CHGFROM, REPLBODY)

# actions (SMFIF_*)
F_ADDHDRS, F_CHGBODY, F_ADDRCPT, F_DELRCPT = 0x01, 0x02, 0x04, 0x08
F_CHGHDRS, F_QUARANTINE, F_CHGFROM, F_ADDRCPT_PAR, F_SETSYMLIST = 0x10, 0x20, 0x40, 0x80, 0x100
ALL_ACTIONS = 0x1FF

# protocol bits (SMFIP_*)
P_NOCONNECT, P_NOHELO, P_NOMAIL, P_NORCPT = 0x01, 0x02, 0x04, 0x08
P_NOBODY, P_NOHDRS, P_NOEOH, P_NR_HDR = 0x10, 0x20, 0x40, 0x80
P_NOUNKNOWN, P_NODATA, P_SKIP, P_RCPT_REJ = 0x100, 0x200, 0x400, 0x800
P_NR_CONN, P_NR_HELO, P_NR_MAIL, P_NR_RCPT = 0x1000, 0x2000, 0x4000, 0x8000
P_NR_DATA, P_NR_UNKN, P_NR_EOH, P_NR_BODY = 0x10000, 0x20000, 0x40000, 0x80000
P_HDR_LEADSPC = 0x100000
POSTFIX_PROTOCOL = 0x1FFFFF          # what Postfix >= 2.6 offers

# per command: (skip bit, no-reply bit, config stage name)
STEPS = {
    CONNECT: (P_NOCONNECT, P_NR_CONN, "connect"),
    HELO: (P_NOHELO, P_NR_HELO, "helo"),
    MAIL: (P_NOMAIL, P_NR_MAIL, "mail"),
    RCPT: (P_NORCPT, P_NR_RCPT, "rcpt"),
    DATA: (P_NODATA, P_NR_DATA, "data"),
    HEADER: (P_NOHDRS, P_NR_HDR, "header"),
    EOH: (P_NOEOH, P_NR_EOH, "eoh"),
    BODY: (P_NOBODY, P_NR_BODY, "body"),
    UNKNOWN: (P_NOUNKNOWN, P_NR_UNKN, "unknown"),
}
SKIP_BIT = {name: bits[0] for bits in STEPS.values() for name in [bits[2]]}
ALL_SKIP_BITS = sum(SKIP_BIT.values())

NOT_SENT = "not sent"      # step() result when the filter negotiated the step away
NO_REPLY = "no reply"      # step() result when the filter negotiated no reply


class Closed(Exception):
    """The filter closed the connection (EOF or reset)."""


def packet(code, payload=b""):
    return struct.pack(">I", len(payload) + 1) + code + payload


def strs(*values):
    """NUL-terminated strings, concatenated."""
    return b"".join((v.encode() if isinstance(v, str) else v) + b"\0" for v in values)


def connect_payload(host="client.example.net", family=b"4", port=12345, address="192.0.2.7"):
    if family == b"U":
        return strs(host) + b"U"
    return strs(host) + family + struct.pack(">H", port) + strs(address)


def optneg_payload(version=6, actions=ALL_ACTIONS, protocol=POSTFIX_PROTOCOL):
    return struct.pack(">III", version, actions, protocol)


class MilterClient:
    """One connection to a filter.  address: "unix:/path", "inet:host:port" or a path."""

    def __init__(self, address, timeout=10.0, connect=True):
        self.address = address
        self.timeout = timeout
        self.buf = b""
        self.version = self.actions = self.protocol = None
        self.offered_protocol = POSTFIX_PROTOCOL
        self.sock = None
        if connect:
            self.open()

    def open(self):
        a = self.address
        if a.startswith("inet:"):
            host, _, port = a[5:].rpartition(":")
            self.sock = socket.create_connection((host, int(port)), timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            path = a[5:] if a.startswith("unix:") else a
            # A unix socket whose listen queue is full fails with EAGAIN instead of
            # blocking (the socket has a timeout, so it is non-blocking underneath).
            deadline = time.monotonic() + self.timeout
            while True:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(self.timeout)
                try:
                    self.sock.connect(path)
                    break
                except BlockingIOError:
                    self.sock.close()
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        return self

    def local_port(self):
        name = self.sock.getsockname()
        return name[1] if isinstance(name, tuple) else None

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # raw I/O ----------------------------------------------------------------------------
    def send_raw(self, data, byte_by_byte=False, pause=0.0):
        if not byte_by_byte:
            self.sock.sendall(data)
            return
        for i in range(len(data)):
            self.sock.sendall(data[i:i + 1])
            if pause:
                time.sleep(pause)

    def send(self, code, payload=b"", **kw):
        self.send_raw(packet(code, payload), **kw)

    def _fill(self, n, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.buf) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out waiting for the filter")
                self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError) as e:
                raise Closed(str(e)) from None
            if not chunk:
                raise Closed("EOF")
            self.buf += chunk
        self.sock.settimeout(self.timeout)

    def read(self, timeout=None):
        """One packet from the filter: (code, payload)."""
        timeout = self.timeout if timeout is None else timeout
        self._fill(4, timeout)
        (length,) = struct.unpack(">I", self.buf[:4])
        assert 1 <= length <= 64 * 1024 * 1024, f"filter sent a packet of length {length}"
        self._fill(4 + length, timeout)
        code, payload = self.buf[4:5], self.buf[5:4 + length]
        self.buf = self.buf[4 + length:]
        return code, payload

    def read_reply(self, timeout=None):
        """The final reply to a command (PROGRESS packets are skipped)."""
        while True:
            code, payload = self.read(timeout)
            if code != PROGRESS:
                return code, payload

    def expect_closed(self, timeout=5.0):
        """True if the filter closes the connection within timeout (anything it sends first
        is returned in self.before_close); False if it is still open."""
        self.before_close = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.before_close.append(self.read(timeout=left))
        except Closed:
            return True
        except socket.timeout:
            return False

    def pending(self, timeout=0.3):
        """Packets that arrive within timeout without being asked for (should be none)."""
        got = []
        try:
            while True:
                got.append(self.read(timeout=timeout))
        except (socket.timeout, Closed):
            pass
        return got

    # protocol steps ---------------------------------------------------------------------
    def negotiate(self, version=6, actions=ALL_ACTIONS, protocol=POSTFIX_PROTOCOL, **kw):
        self.offered_protocol = protocol
        self.offered_actions = actions
        self.send(OPTNEG, optneg_payload(version, actions, protocol), **kw)
        code, payload = self.read_reply()
        assert code == OPTNEG, f"OPTNEG answered with {code!r} {payload!r}"
        assert len(payload) >= 12, f"OPTNEG reply too short: {payload!r}"
        self.version, self.actions, self.protocol = struct.unpack(">III", payload[:12])
        self.optneg_rest = payload[12:]
        return self.version, self.actions, self.protocol

    def negotiated(self, stage):
        """True when the filter wants the step (no skip bit)."""
        return not (self.protocol & SKIP_BIT[stage])

    def macro(self, stage, *pairs, **kw):
        self.send(MACRO, stage + strs(*pairs), **kw)

    def step(self, code, payload=b"", **kw):
        """Send a command that expects a reply, the way Postfix would: not at all if the
        filter asked to skip it, without reading a reply if it asked for none.  Returns
        (reply code, payload), NOT_SENT or NO_REPLY."""
        skip, noreply, _ = STEPS[code]
        if self.protocol & skip:
            return NOT_SENT
        # an MTA speaking an older version has no such command (section 3.6)
        if (code == DATA and self.version < 4) or (code == UNKNOWN and self.version < 3):
            return NOT_SENT
        self.send(code, payload, **kw)
        if self.protocol & noreply & self.offered_protocol:
            return NO_REPLY
        return self.read_reply()

    def connect(self, host="client.example.net", family=b"4", port=12345,
                address="192.0.2.7", **kw):
        return self.step(CONNECT, connect_payload(host, family, port, address), **kw)

    def helo(self, name="client.example.net", **kw):
        return self.step(HELO, strs(name), **kw)

    def mail(self, sender="<sender@example.net>", *params, **kw):
        return self.step(MAIL, strs(sender, *params), **kw)

    def rcpt(self, recipient="<rcpt@example.org>", *params, **kw):
        return self.step(RCPT, strs(recipient, *params), **kw)

    def data(self, **kw):
        return self.step(DATA, **kw)

    def header(self, name, value, **kw):
        return self.step(HEADER, strs(name, value), **kw)

    def eoh(self, **kw):
        return self.step(EOH, **kw)

    def body(self, chunk, **kw):
        return self.step(BODY, chunk, **kw)

    def unknown(self, line, **kw):
        return self.step(UNKNOWN, strs(line), **kw)

    def eob(self, **kw):
        """End of message: returns (list of modification packets, final code, payload)."""
        self.send(EOB, **kw)
        mods = []
        while True:
            code, payload = self.read()
            if code == PROGRESS:
                continue
            if code in FINAL_REPLIES:
                return mods, code, payload
            assert code in MODIFICATIONS, f"unexpected packet {code!r} {payload!r} at EOB"
            mods.append((code, payload))

    def abort(self, **kw):
        self.send(ABORT, **kw)

    def quit(self):
        try:
            self.send(QUIT)
        except OSError:
            pass
        self.close()

    def message(self, sender="<sender@example.net>", recipients=("<rcpt@example.org>",),
                headers=(("From", "sender@example.net"), ("Subject", "test")),
                body=b"Hello.\r\n", **kw):
        """One whole transaction (MAIL .. EOB).  Returns a dict of replies per step;
        stops early, as an MTA would, when a step ends the message."""
        out = {}

        def ended(r):
            return r not in (NOT_SENT, NO_REPLY) and r[0] != CONTINUE

        out["mail"] = self.mail(sender, **kw)
        if ended(out["mail"]):
            return out
        out["rcpt"] = []
        for r in recipients:
            reply = self.rcpt(r, **kw)
            out["rcpt"].append(reply)
        if all(ended(r) for r in out["rcpt"]):
            return out
        out["data"] = self.data(**kw)
        if ended(out["data"]):
            return out
        out["header"] = []
        for name, value in headers:
            reply = self.header(name, value, **kw)
            out["header"].append(reply)
            if ended(reply):
                return out
        out["eoh"] = self.eoh(**kw)
        if ended(out["eoh"]):
            return out
        chunks = [body] if isinstance(body, (bytes, bytearray)) else list(body)
        out["body"] = []
        for chunk in chunks:
            reply = self.body(chunk, **kw)
            out["body"].append(reply)
            if reply not in (NOT_SENT, NO_REPLY) and reply[0] == SKIP:
                break
            if ended(reply):
                return out
        out["eom"] = self.eob(**kw)
        return out

    def full_session(self, messages=1, **kw):
        """OPTNEG, CONNECT, HELO, `messages` transactions each followed by ABORT, QUIT.
        Returns the list of per-message reply dicts."""
        if self.protocol is None:
            self.negotiate()
        connect = self.connect()
        assert connect in (NOT_SENT, NO_REPLY) or connect[0] == CONTINUE, connect
        helo = self.helo()
        assert helo in (NOT_SENT, NO_REPLY) or helo[0] == CONTINUE, helo
        results = []
        for _ in range(messages):
            results.append(self.message(**kw))
            self.abort()
        self.quit()
        return results


def accepted(result):
    """True when a message() result ended with an accepting EOB reply."""
    eom = result.get("eom")
    return eom is not None and eom[1] in (ACCEPT, CONTINUE)
