#!/usr/bin/python3
"""Seeds with run-time limits for two fuzzers: gen_corpus_ov.py [CORPUS_DIR]

corpus/snapshot/: version 2 snapshot images (fuzz_snapshot.c: a mode byte, then the
image) with records and a section of run-time limits -- valid ones, one with an expired
entry, one unlimited, one with the most windows, and broken ones (a bad key hash, a rule
with a space, a length past the bound), each with its checksum right so that the decoder
of the section is reached.  corpus/redis_ov/: ov_read.lua replies as RESP
(fuzz_redis_ov.c).  Files are named by the SHA-1 of their bytes, as libFuzzer names them.
"""
import hashlib
import os
import struct
import sys

import xxhash

NOW = 1700000000000000000
SEED = 0x8f1b762aef401be7


def key_hash(rule, key, seed=SEED):
    return xxhash.xxh3_64_intdigest(rule + b"\0" + key, seed=seed)


def entry(rule, key, windows, until=0, hash_=None):
    b = struct.pack("<QQI", key_hash(rule, key) if hash_ is None else hash_, until, len(windows))
    for c, p, burst in windows:
        b += struct.pack("<QQQ", c, p, burst)
    return b + struct.pack("<I", len(rule)) + rule + struct.pack("<I", len(key)) + key


def image(records, entries, version=2):
    b = b"SLUICESNAP1\n" + struct.pack("<IQQ", version, SEED, len(records))
    for h, tat in records:
        b += struct.pack("<QQ", h, tat)
    if version == 2:
        b += struct.pack("<Q", len(entries)) + b"".join(entries)
    return b + struct.pack("<QQ", 0, xxhash.xxh64_intdigest(b, seed=0))


M = 60 * 10**9
H = 3600 * 10**9
D = 86400 * 10**9


def snapshots():
    rec = [(0x1111, NOW + M), (0x2222, NOW + H), (0x3333, NOW - 1)]
    good = [entry(b"per-domain", b"example.com", [(100, M, 150), (5000, D, 5000)]),
            entry(b"per-domain", b"bulk.example.org", [], until=NOW + H),
            entry(b"fan-out", b"user@example.net+192.0.2.0/24", [(1, 1, 1)] * 1 +
                  [(2, 2 * M, 3), (3, H, 3), (4, D, 9)]),
            entry(b"old", b"expired.example", [(1, M, 1)], until=NOW - 1)]
    yield image(rec, good)
    yield image([], good[:1])
    yield image(rec, [])
    yield image(rec, [good[0], good[0]])                       # the same key twice
    yield image(rec, [entry(b"r", b"k", [(1, M, 1)], hash_=1)])  # a foreign key hash
    yield image(rec, [entry(b"a rule", b"k", [(1, M, 1)])])      # a rule with a space
    yield image(rec, [entry(b"r", b"k" * 513, [(1, M, 1)])])     # a key past the bound
    yield image(rec, [entry(b"r", b"k", [(0, M, 1)])])           # a zero count
    yield image(rec, [entry(b"r", b"k", [(1, M, 1)] * 5)])       # five windows
    yield image(rec, good[:2])[:-20] + image(rec, good[:2])[-16:]  # cut inside
    yield image(rec, [], version=1)


def resp(x):
    if isinstance(x, list):
        return b"*%d\r\n" % len(x) + b"".join(resp(e) for e in x)
    if isinstance(x, int):
        return b":%d\r\n" % x
    return b"$%d\r\n%s\r\n" % (len(x), x)


def field(h):
    return b"%016x" % h


def replies():
    v = b"1 0 100/60000000000/150,5000/86400000000000/5000 per-domain example.com"
    yield resp([b"3", [field(key_hash(b"per-domain", b"example.com")), v]])
    yield resp([b"0", []])
    yield resp([b"12", [field(1), b"1 %d 0 per-domain a key with spaces" % (NOW + H),
                        field(2), b"1 0 1/1/1,2/2/2,3/3/3,4/4/4 r k",
                        b"short", b"1 0 0 r k",
                        field(3), b"2 0 0 r k",
                        field(4), b"1 0 1/2/3, r k"]])
    yield resp([7, [field(5), b"1 0 0 r k"]])
    yield resp([b"x", []])
    yield b"-ERR something\r\n"
    yield resp([b"1", [field(6)]])


def write(directory, data):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def main():
    corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    for img in snapshots():
        write(os.path.join(corpus, "snapshot"), b"\xfc" + img)   # as is, max_keys 64
        write(os.path.join(corpus, "snapshot"), b"\x03" + img)   # repaired, max_keys 1
    for r in replies():
        write(os.path.join(corpus, "redis_ov"), r)


if __name__ == "__main__":
    main()
