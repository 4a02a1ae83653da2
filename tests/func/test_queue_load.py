"""A deep queue at start (doc/QUEUE.md, "Recovery at start"): sluiced answers at once and
loads its queue in the background.

20,000 committed messages are written straight into queue/msg/ in the documented file
format (doc/QUEUE.md, "The message file"; the XXH64 is computed here in Python), then
sluiced starts on that directory.  Checked:

* the intake answers EHLO within 1 s of the start, whatever the queue holds;
* `sluice status` shows the load as it goes (``queue: loading N of 20,000 messages``)
  and, at the end, the full count; `sluice queue` says when its list is partial;
* a message committed through the intake during the load is in the queue with the
  20,000 at the end.

The page cache is dropped before the start when this runs as root, so that the loader
reads from the disk as after a reboot; the progress line is then seen on any machine.
"""

import os
import pathlib
import re
import smtplib
import struct
import time

from conftest import free_port

MESSAGES = 20000
B32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M64, 31) * P1) & M64


def _merge(acc, val):
    return ((acc ^ _round(0, val)) * P1 + P4) & M64


def xxh64(data, seed=0):
    """XXH64 as its specification gives it (the C library's output)."""
    n = len(data)
    i = 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, i)
            v = [_round(v[k], lanes[k]) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for k in range(4):
            h = _merge(h, v[k])
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, i)
        h = (_rotl(h ^ _round(0, lane), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, i)
        h = (_rotl(h ^ ((lane * P1) & M64), 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * P5) & M64), 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


def qid(us, seq):
    n = ((us & ((1 << 52) - 1)) << 28) | (seq & ((1 << 28) - 1))
    return "".join(B32[(n >> (5 * (15 - i))) & 31] for i in range(16))


def message_file(ident, arrival_us, sender, rcpts, body):
    """The bytes of a committed queue file (every recipient T, control bytes '-')."""
    def rec(kind, payload):
        return kind + struct.pack("<I", len(payload)) + payload

    def s16(b):
        return struct.pack("<H", len(b)) + b

    env = (ident.encode() + struct.pack("<QIQ", arrival_us, 0, 0) + s16(sender)
           + s16(b"[127.0.0.1]") + s16(b"client.test"))
    recs = [rec(b"S", b"SLUICEQ1" + struct.pack("<I", 1)), rec(b"E", env),
            rec(b"C", b"-" * 8)] + [rec(b"R", b"T" + r) for r in rcpts] + [rec(b"B", body)]
    zeroed = bytearray(b"".join(recs))
    # the status and control bytes count as zeros
    off = len(recs[0]) + len(recs[1])
    zeroed[off + 5:off + 13] = b"\0" * 8
    off += len(recs[2])
    for r in rcpts:
        zeroed[off + 5] = 0
        off += 5 + 1 + len(r)
    digest = xxh64(bytes(zeroed))
    return b"".join(recs) + rec(b"Z", struct.pack("<Q", digest))


def fill(queue_dir, n):
    """n one-recipient messages, an hour old, written into msg/H/ directly."""
    ids = []
    t0 = int(time.time() * 1e6) - 3600 * 1000000
    body = b"Subject: deep queue\r\n\r\n" + b"line of the body\r\n" * 20
    for i in range(n):
        us = t0 + i * 100
        ident = qid(us, i)
        data = message_file(ident, us, b"sender@example.net",
                            [b"user%d@example.org" % i], body)
        d = queue_dir / "msg" / ident[7]
        d.mkdir(parents=True, exist_ok=True)
        (d / ident).write_bytes(data)
        ids.append(ident)
    return ids


def config(port):
    return "\n".join([
        "workers = 2;",
        "stats_interval = 0;",
        'state_dir = "@DIR@";',
        'log { target = "stderr"; level = "info"; }',
        'control { listen = "unix:@DIR@/control.sock"; }',
        f'intake {{ listen = "inet:127.0.0.1:{port}"; hostname = "mx.sluice.test"; }}',
        'queue { dir = "@DIR@/queue"; }',
        "",
    ])


def test_deep_queue_loads_in_background(sluiced, workdir):
    port = free_port()
    inst = sluiced(config(port), start=False)
    queue_dir = inst.dir / "queue"
    queue_dir.mkdir(mode=0o700)
    ids = fill(queue_dir, MESSAGES)
    os.sync()
    if os.geteuid() == 0:
        try:
            pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        except OSError:
            pass

    started = time.monotonic()
    inst.start()    # returns once the intake and the control socket listen
    with smtplib.SMTP("127.0.0.1", port, timeout=1) as s:
        code, _ = s.ehlo("client.test")
        assert code == 250
    answered = time.monotonic() - started
    assert answered < 1.0, f"the intake answered EHLO {answered:.2f} s after the start"

    # one message through the intake while the load runs
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as s:
        s.sendmail("new@example.net", ["fresh@example.org"],
                   b"Subject: during the load\r\n\r\nhello\r\n")

    seen_loading = []
    partial_list = False
    final = None
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        out = inst.cli("status").stdout
        m = re.search(r"^queue: loading ([\d,]+) of ([\d,]+) messages", out, re.M)
        if m:
            done, total = (int(x.replace(",", "")) for x in m.groups())
            # the message sent meanwhile counts when its commit beat the loader's
            # listing of the directory (a slow start, as under ASan)
            assert total in (MESSAGES, MESSAGES + 1) and 0 <= done <= total
            seen_loading.append(done)
            if not partial_list:
                listing = inst.cli("queue").stdout
                partial_list = listing.startswith("the queue is still loading")
            continue
        m = re.search(r"^queue: ([\d,]+) messages, .*\(loaded in ([\d.]+) s\)", out, re.M)
        if m:
            final = int(m.group(1).replace(",", ""))
            break
        assert re.search(r"^queue: loading, listing the messages", out, re.M), out
        time.sleep(0.05)
    assert final == MESSAGES + 1, f"status after the load: {out}"
    assert seen_loading, "sluice status never showed the load in progress"
    assert seen_loading == sorted(seen_loading)
    assert partial_list or seen_loading[-1] > MESSAGES * 0.9
    listing = inst.cli("queue").stdout
    assert not listing.startswith("the queue is still loading")
    assert ids[0] in listing and ids[-1] in listing
    assert f"-- {MESSAGES + 1} messages" in listing
