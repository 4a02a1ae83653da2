"""An independent reader of sluice's queue files, for the functional tests.

Written from the format in doc/QUEUE.md ("The message file") and the record layout in the
header comment of src/queue/queue_file.c, not from the C loader, so that a test that reads
what sluiced queued checks the file against the documented format.  A file is a sequence
of records ``type (1 byte) | length (u32 LE) | payload``:

====  =====================================================================================
S     ``SLUICEQ1`` and the format version (u32): 2, or 1 for files of earlier versions
E     queue ID (16) | arrival µs (u64) | ESMTP flags (u32) | declared SIZE (u64) | sender,
      client, HELO: each a u16 length and its bytes; version 2 adds RET (u8: 0 none,
      1 FULL, 2 HDRS) and ENVID (u16 length and its bytes, xtext-decoded)
C     8 control bytes, changed in place: [0] hold ``-``/``H``, [1] bounce ``-``/``P``/``S``,
      [2] delay notice ``-``/``W``
R     one per recipient: status byte (``T`` ``U`` ``D`` ``F``; version 2 also ``N``,
      delivered with a relayed notice owed) then the address; version 2
      puts NOTIFY (u8 bits: 1 NEVER, 2 SUCCESS, 4 FAILURE, 8 DELAY; 0 none) and ORCPT
      (u16 length and ``type;address`` xtext-decoded) between them
B     body: the message as received (CRLF lines, dot-unstuffed, sluice's Received: first),
      in records of at most 64 KiB
Z     XXH64 (seed 0) of every byte before it, the recipients' status bytes and the control
      bytes counted as zeros
====  =====================================================================================

The checksum is verified when the ``xxhash`` module is importable (Debian's
python3-xxhash); without it ``Message.checksum_checked`` is False and the rest is still
checked.

    msgs = queuefile.messages("/var/spool/sluice")    # every committed message, by ID
    m = msgs[0]
    m.sender, [r.address for r in m.recipients], m.body
"""

import dataclasses
import pathlib
import struct

try:
    import xxhash
except ImportError:  # the checksum is then not checked (see Message.checksum_checked)
    xxhash = None

MAGIC = b"SLUICEQ1"
VERSION = 2
VERSIONS = (1, 2)
ID_LEN = 16
ID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
BODY_CHUNK = 65536
FLAG_8BITMIME = 1 << 0
FLAG_SMTPUTF8 = 1 << 1
STATUSES = "TUDF"
STATUSES_V2 = "TUDFN"  # N: delivered, a relayed notice owed (version 2 only)


class QueueFileError(ValueError):
    """The file does not follow the documented format."""


@dataclasses.dataclass
class Recipient:
    address: str
    status: str           # "T" to do, "U" uncertain, "D" delivered, "F" failed,
                          # "N" delivered with a relayed notice owed (version 2)
    status_offset: int    # where the status byte is in the file
    notify: int = 0       # NOTIFY= bits (version 2), 0 if none
    orcpt: str = ""       # ORCPT= decoded, "type;address" (version 2)


@dataclasses.dataclass
class Message:
    path: pathlib.Path
    id: str
    arrival_us: int
    flags: int
    size: int             # declared with MAIL SIZE=, 0 if none
    sender: str           # "" for the null sender <>
    client: str
    helo: str
    control: bytes
    recipients: list
    body: bytes
    body_records: int
    checksum_checked: bool
    version: int = VERSION
    ret: int = 0          # RET=: 0 none, 1 FULL, 2 HDRS
    envid: str = ""       # ENVID= decoded

    @property
    def eightbitmime(self):
        return bool(self.flags & FLAG_8BITMIME)

    @property
    def smtputf8(self):
        return bool(self.flags & FLAG_SMTPUTF8)

    @property
    def held(self):
        return self.control[0:1] == b"H"

    def body_without_received(self):
        """The body with sluice's own Received: field (the first one) taken off."""
        if not self.body.startswith(b"Received:"):
            raise QueueFileError(f"{self.id}: the body does not start with Received:")
        pos = 0
        while True:
            end = self.body.index(b"\r\n", pos) + 2
            if self.body[end:end + 1] not in (b" ", b"\t"):
                return self.body[end:]
            pos = end


def _text(b):
    return b.decode("utf-8", errors="surrogateescape")


def valid_id(qid):
    return len(qid) == ID_LEN and all(c in ID_ALPHABET for c in qid)


def parse(data, path=None):
    """A Message from a whole file's bytes; raises QueueFileError naming the fault."""
    data = bytes(data)
    hashed = bytearray(data)   # the bytes the checksum covers, in-place bytes zeroed
    off = 0
    state = "start"
    env = None
    control = None
    recipients = []
    body = []
    end_at = None
    checksum = None
    version = VERSION
    while off < len(data):
        if state == "end":
            raise QueueFileError("bytes after the end record")
        if len(data) - off < 5:
            raise QueueFileError("a record header cut short")
        rtype = chr(data[off])
        (length,) = struct.unpack_from("<I", data, off + 1)
        payload = data[off + 5:off + 5 + length]
        if len(payload) != length:
            raise QueueFileError("a record running past the end of the file")
        if rtype == "S":
            if state != "start" or length != 12 or payload[:8] != MAGIC:
                raise QueueFileError("not a sluice queue file")
            (version,) = struct.unpack_from("<I", payload, 8)
            if version not in VERSIONS:
                raise QueueFileError(f"format version {version}, expected one of {VERSIONS}")
            state = "envelope"
        elif rtype == "E":
            if state != "envelope":
                raise QueueFileError("a misplaced envelope record")
            env = _envelope(payload, version)
            state = "control"
        elif rtype == "C":
            if state != "control" or length != 8:
                raise QueueFileError("a bad or misplaced control record")
            if (chr(payload[0]) not in "-H" or chr(payload[1]) not in "-PS"
                    or chr(payload[2]) not in "-W"):
                raise QueueFileError(f"bad control bytes {payload!r}")
            control = payload
            hashed[off + 5:off + 5 + length] = bytes(length)
            state = "recipients"
        elif rtype == "R":
            if state != "recipients" or length < 2:
                raise QueueFileError("a bad or misplaced recipient record")
            status = chr(payload[0])
            if status not in (STATUSES_V2 if version >= 2 else STATUSES):
                raise QueueFileError(f"recipient status {status!r}")
            notify, orcpt, addr = 0, "", payload[1:]
            if version >= 2:
                if length < 4:
                    raise QueueFileError("a version 2 recipient record too short")
                notify = payload[1]
                (n,) = struct.unpack_from("<H", payload, 2)
                if length - 4 < n:
                    raise QueueFileError("an ORCPT running past its record")
                orcpt, addr = _text(payload[4:4 + n]), payload[4 + n:]
            if not addr:
                raise QueueFileError("a recipient without an address")
            recipients.append(Recipient(_text(addr), status, off + 5, notify, orcpt))
            hashed[off + 5] = 0
        elif rtype == "B":
            if state not in ("recipients", "body") or not recipients:
                raise QueueFileError("a misplaced body record")
            if not 0 < length <= BODY_CHUNK:
                raise QueueFileError(f"a body record of {length} bytes")
            body.append(payload)
            state = "body"
        elif rtype == "Z":
            if state not in ("recipients", "body") or not recipients or length != 8:
                raise QueueFileError("a bad or misplaced end record")
            (checksum,) = struct.unpack("<Q", payload)
            end_at = off
            state = "end"
        else:
            raise QueueFileError(f"unknown record type {rtype!r} at offset {off}")
        off += 5 + length
    if state != "end":
        raise QueueFileError("no end record: the file is incomplete")
    checked = False
    if xxhash is not None:
        want = xxhash.xxh64_intdigest(bytes(hashed[:end_at]), seed=0)
        if want != checksum:
            raise QueueFileError(f"checksum {checksum:016x}, computed {want:016x}")
        checked = True
    qid, arrival, flags, size, sender, client, helo, ret, envid = env
    if path is not None and pathlib.Path(path).name != qid:
        raise QueueFileError(f"file {path} holds queue ID {qid}")
    return Message(path=pathlib.Path(path) if path else None, id=qid, arrival_us=arrival,
                   flags=flags, size=size, sender=sender, client=client, helo=helo,
                   control=control, recipients=recipients, body=b"".join(body),
                   body_records=len(body), checksum_checked=checked, version=version,
                   ret=ret, envid=envid)


def _envelope(p, version=VERSION):
    if len(p) < ID_LEN + 20 + 6:
        raise QueueFileError("an envelope record too short")
    qid = p[:ID_LEN].decode("ascii", errors="replace")
    if not valid_id(qid):
        raise QueueFileError(f"bad queue ID {qid!r}")
    arrival, flags, size = struct.unpack_from("<QIQ", p, ID_LEN)
    off = ID_LEN + 20
    fields = []
    for _ in range(3):
        if len(p) - off < 2:
            raise QueueFileError("an envelope string cut short")
        (n,) = struct.unpack_from("<H", p, off)
        if len(p) - off - 2 < n:
            raise QueueFileError("an envelope string running past its record")
        fields.append(_text(p[off + 2:off + 2 + n]))
        off += 2 + n
    ret, envid = 0, ""
    if version >= 2:
        if len(p) - off < 3 or p[off] > 2:
            raise QueueFileError("a bad RET or ENVID in the envelope")
        ret = p[off]
        (n,) = struct.unpack_from("<H", p, off + 1)
        if len(p) - off - 3 < n:
            raise QueueFileError("an ENVID running past its record")
        envid = _text(p[off + 3:off + 3 + n])
        off += 3 + n
    if off != len(p):
        raise QueueFileError("bytes after the envelope's strings")
    return (qid, arrival, flags, size, *fields, ret, envid)


def load(path):
    path = pathlib.Path(path)
    return parse(path.read_bytes(), path)


def messages(queue_dir):
    """Every committed message (queue_dir/msg/H/QID), sorted by queue ID (arrival)."""
    root = pathlib.Path(queue_dir) / "msg"
    if not root.is_dir():
        return []
    found = [load(p) for p in sorted(root.glob("*/*")) if p.is_file()]
    return sorted(found, key=lambda m: m.id)


def make_id(arrival_us, seq=0):
    """A queue ID as sluiced makes it: 52 bits of the arrival time, 28 of seq."""
    v = (arrival_us & ((1 << 52) - 1)) << 28 | (seq & ((1 << 28) - 1))
    return "".join(ID_ALPHABET[(v >> (5 * (ID_LEN - 1 - i))) & 31] for i in range(ID_LEN))


def write_v1(queue_dir, sender, recipients, body, arrival_us, client="[127.0.0.1]",
             helo="localhost", flags=0):
    """Write a committed message in format version 1 (what sluice wrote before DSN
    parameters were kept) as queue_dir/msg/H/QID; returns the queue ID.  Needs xxhash."""
    qid = make_id(arrival_us)
    recs = [(b"S", MAGIC + struct.pack("<I", 1))]
    env = qid.encode() + struct.pack("<QIQ", arrival_us, flags, 0)
    for f in (sender, client, helo):
        b = f.encode()
        env += struct.pack("<H", len(b)) + b
    recs.append((b"E", env))
    recs.append((b"C", b"-" * 8))
    for r in recipients:
        recs.append((b"R", b"T" + r.encode()))
    for i in range(0, len(body), BODY_CHUNK):
        recs.append((b"B", body[i:i + BODY_CHUNK]))
    out, hashed = bytearray(), bytearray()
    for t, p in recs:
        rec = t + struct.pack("<I", len(p)) + p
        out += rec
        if t == b"C":
            rec = rec[:5] + bytes(len(p))
        elif t == b"R":
            rec = rec[:5] + b"\0" + rec[6:]
        hashed += rec
    out += b"Z" + struct.pack("<I", 8) + struct.pack("<Q", xxhash.xxh64_intdigest(bytes(hashed), seed=0))
    d = pathlib.Path(queue_dir) / "msg" / qid[7]
    d.mkdir(parents=True, exist_ok=True)
    (d / qid).write_bytes(bytes(out))
    return qid
