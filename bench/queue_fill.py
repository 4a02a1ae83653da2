#!/usr/bin/python3
"""Write a backlog of committed messages straight into a sluice queue directory.

usage: bench/queue_fill.py DIR COUNT [SIZE]

Writes COUNT messages of one recipient each (r<i>@dest.example, from
bench@sender.example) as committed files DIR/msg/H/QID, in the format of doc/QUEUE.md
("The message file"; src/queue/queue_file.c writes it, tests/func/peers/queuefile.py
reads it independently), every recipient `T` (to do), as if the intake had taken them.  SIZE
(default 1024) is the message's size in bytes, sluice's own Received: field included.
sluiced must not be running on DIR: the files go straight under their final names, and
sluiced reads them all at its next start.

Arrival times are spread one millisecond apart, the newest a second before now, so that
the queue IDs sort by arrival as real ones do and, since a message's directory H is
bits 12 to 16 of its arrival time in microseconds, the files spread over the 32
directories in runs of four or five, as the intake's commit batches leave them.  The
sequence part of the ID starts at a random value, as sluiced's does.

The checksum is XXH64: Debian's python3-xxhash, or else libxxhash.so.0 (the library
sluiced itself links) through ctypes.  Nothing is flushed per file; fill() syncs the
file system once at the end (the caller may time that apart).
"""

import os
import pathlib
import random
import struct
import sys
import time

try:
    import xxhash

    def xxh64(data):
        return xxhash.xxh64_intdigest(data, seed=0)
except ImportError:  # the library sluiced links, through ctypes
    import ctypes
    _lib = ctypes.CDLL("libxxhash.so.0")
    _lib.XXH64.restype = ctypes.c_uint64
    _lib.XXH64.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64)

    def xxh64(data):
        return _lib.XXH64(data, len(data), 0)

MAGIC = b"SLUICEQ1"
VERSION = 1
ID_ALPHABET = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
ID_BUCKET = 7                                     # H is the ID's 8th character
SENDER = "bench@sender.example"
CLIENT = "[127.0.0.1]"
HELO = "source.bench.test"
HOSTNAME = "relay.bench.test"


def queue_id(arrival_us, seq):
    """16 characters: 52 bits of arrival time in µs, then 28 bits of sequence."""
    v = (arrival_us & ((1 << 52) - 1)) << 28 | (seq & ((1 << 28) - 1))
    out = bytearray(16)
    for i in range(15, -1, -1):
        out[i] = ID_ALPHABET[v & 31]
        v >>= 5
    return out.decode()


def record(rtype, payload):
    return rtype + struct.pack("<I", len(payload)) + payload


def message(qid, arrival_us, rcpt, size):
    """The whole file of one message, and the body's length."""
    date = time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(arrival_us / 1e6))
    head = (f"Received: from {HELO} ({CLIENT})\r\n\tby {HOSTNAME} (sluice) with ESMTP id "
            f"{qid}\r\n\tfor <{rcpt}>; {date}\r\n"
            f"From: <{SENDER}>\r\nTo: <{rcpt}>\r\nSubject: backlog {qid}\r\n"
            f"Date: {date}\r\nMessage-ID: <{qid}@sender.example>\r\n\r\n").encode()
    line = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789\r\n"
    body = bytearray(head)
    while len(body) < size:
        body += line
    del body[max(size, len(head) + 2):]
    body[-2:] = b"\r\n"
    env = qid.encode() + struct.pack("<QIQ", arrival_us, 0, 0)
    for s in (SENDER, CLIENT, HELO):
        b = s.encode()
        env += struct.pack("<H", len(b)) + b
    # the checksum counts the control bytes and the status byte as zeros
    pre = [record(b"S", MAGIC + struct.pack("<I", VERSION)), record(b"E", env)]
    ctl_hashed, ctl = record(b"C", bytes(8)), record(b"C", b"--------")
    rec_hashed, rec = record(b"R", b"\0" + rcpt.encode()), record(b"R", b"T" + rcpt.encode())
    bod = record(b"B", bytes(body))
    hashed = b"".join(pre) + ctl_hashed + rec_hashed + bod
    data = b"".join(pre) + ctl + rec + bod
    return data + record(b"Z", struct.pack("<Q", xxh64(hashed))), len(body)


def syncfs(path):
    """Flushes the file system that holds path (syncfs(2); sync(2) if that fails)."""
    import ctypes
    fd = os.open(str(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def fill(qdir, count, size=1024, progress=None, sync=True):
    """Writes count messages into qdir (made if missing); returns a dict of timings:
    write_s (the files), sync_s (one syncfs-wide sync), bytes (the files' total)."""
    qdir = pathlib.Path(qdir)
    msg = qdir / "msg"
    for h in ID_ALPHABET.decode():
        (msg / h).mkdir(parents=True, exist_ok=True, mode=0o700)
    for d in (qdir, msg):
        os.chmod(d, 0o700)
    now_us = int(time.time() * 1e6)
    first_us = now_us - 1_000_000 - count * 1000
    seq0 = random.getrandbits(28)
    t0 = time.monotonic()
    total = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    base = str(msg) + "/"
    for i in range(count):
        arrival = first_us + i * 1000
        qid = queue_id(arrival, seq0 + i)
        data, _ = message(qid, arrival, f"r{i}@dest.example", size)
        fd = os.open(base + qid[ID_BUCKET] + "/" + qid, flags, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        total += len(data)
        if progress and (i + 1) % 100000 == 0:
            progress(i + 1, time.monotonic() - t0)
    t1 = time.monotonic()
    if sync:
        syncfs(qdir)
    return {"write_s": t1 - t0, "sync_s": time.monotonic() - t1, "bytes": total}


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    size = int(sys.argv[3]) if len(sys.argv) == 4 else 1024
    res = fill(sys.argv[1], int(sys.argv[2]), size,
               progress=lambda n, s: print(f"queue_fill: {n} written in {s:.1f} s",
                                           file=sys.stderr, flush=True))
    print(f"queue_fill: {sys.argv[2]} messages, {res['bytes']} bytes, written in "
          f"{res['write_s']:.1f} s, synced in {res['sync_s']:.1f} s")


if __name__ == "__main__":
    main()
