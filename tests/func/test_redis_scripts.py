"""The Redis store's Lua scripts (src/store/redis/*.lua) on a real redis-server.

Every case of tests/cases/store.cases -- the table tests/unit/test_store_cases.c runs
against the memory store and slide.c -- runs here through gcra.lua, refund.lua and
slide.lua with `redis-cli --eval`, and must give the same answers to the nanosecond: a
rule decides the same way whichever store holds its state.

Then what only the scripts have: the expiry every write sets (a key lives exactly as
long as it holds information, plus a second), the server's TIME when the caller passes
"" for now, input checks, and the concurrency-slot leases (slot_enter, slot_release,
slot_renew) with explicit times, where a node whose lease ran out stops counting; and
random traffic through gcra.lua, refund.lua and slide.lua against a model of the rules in
exact integers, for the carries and roundings a hand-written table may miss.

slide.lua decides over several windows of a lane at once: admitted only if every window
admits, a refusal charging none, the wait the largest over the refusing windows.  Beside
hand-computed cases, two nodes' random sends must never exceed N in any window, and
slide.c itself (compiled here into a small shared library, driven through ctypes) must
give the same answers as the script for the same sequence of calls and times.

The server is private to this module: its own unix socket in a temporary directory, no
TCP port, no persistence; every test starts from an empty database.
"""

import os
import pathlib
import re
import shutil
import signal
import subprocess

import pytest

from conftest import unix_listening, wait_until

HERE = pathlib.Path(__file__).resolve().parent
SOURCE_ROOT = HERE.parent.parent
# the scripts as sluiced embeds them: assembled in the build directory (with their
# helpers, src/store/redis/lib); $REDIS_SCRIPTS is set by meson
SCRIPTS = pathlib.Path(os.environ.get("REDIS_SCRIPTS") or SOURCE_ROOT / "build/src/store/redis")
CASES = SOURCE_ROOT / "tests/cases/store.cases"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"

SEC = 10**9
U64_MAX = 2**64 - 1
DEFAULT_EPOCH = 1700000000 * SEC
BLOCKING, COUNT_REJECTED = 1, 2
# gcra.lua's own flags (store_redis.c sets them from STORE_DISTINCT and block_ns)
DISTINCT, BLOCK = 4, 8


# ---------------------------------------------------------------------------------------
# the table (its format is described at the top of the file)

UNITS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": SEC, "m": 60 * SEC, "h": 3600 * SEC,
         "d": 86400 * SEC}
DURATION = re.compile(r"\d+[a-z]*(?:[+-]\d+[a-z]*)*")


class TableError(Exception):
    pass


def duration(text):
    if not DURATION.fullmatch(text):
        raise TableError(f"bad duration {text!r}")
    total = 0
    for sign, digits, unit in re.findall(r"([+-]?)(\d+)([a-z]*)", text):
        if unit and unit not in UNITS:
            raise TableError(f"bad unit in {text!r}")
        total += (-1 if sign == "-" else 1) * int(digits) * UNITS.get(unit or "ns")
    if total < 0:
        raise TableError(f"negative duration {text!r}")
    return total


def window(text):
    m = re.fullmatch(r"(\d+)/([^:]+)(?::(\d+))?", text)
    if not m:
        raise TableError(f"bad window {text!r}")
    count, period = int(m.group(1)), duration(m.group(2))
    burst = int(m.group(3)) if m.group(3) else count
    if count == 0 or period == 0 or burst == 0:
        raise TableError(f"bad window {text!r}")
    return {"count": count, "period": period, "burst": burst,
            "t": -(-period // count)}      # T = ceil(period / count)


def parse_item(case, text, want_flags):
    """KEY:COST:FLAGS[:VALUE] (a decision's item) or KEY:COST[:FLAGS[:VALUE]] (a
    refund's); flag d (distinct) and a VALUE, a decimal > 0, go together."""
    parts = text.split(":")
    if not (3 if want_flags else 2) <= len(parts) <= 4 or parts[0] not in case["keys"]:
        raise TableError(f"bad item {text!r}")
    flags = 0
    if len(parts) > 2 and parts[2] != "-":
        for f in parts[2]:
            if f not in "bcd":
                raise TableError(f"bad flags in {text!r}")
            flags |= {"b": BLOCKING, "c": COUNT_REJECTED, "d": DISTINCT}[f]
    if bool(flags & DISTINCT) != (len(parts) == 4):
        raise TableError(f"flag d and a VALUE go together in {text!r}")
    item = {"key": parts[0], "cost": int(parts[1]), "flags": flags}
    if flags & DISTINCT:
        if not parts[3].isdigit() or int(parts[3]) == 0 or int(parts[3]) >= 2**64:
            raise TableError(f"bad value in {text!r}")
        item["value"] = str(int(parts[3]))     # the decimal store_redis.c sends
    return item


def parse_result(case, item, text):
    name, _, rest = text.partition("=")
    fields = rest.split(",")
    if name != item["key"] or len(fields) < 4 or fields[0] not in ("ok", "over") or \
            fields[1] not in ("charged", "-") or \
            fields[4:] not in ([], ["known"], ["blocked"], ["known", "blocked"]):
        raise TableError(f"bad result {text!r} for item {item['key']}")
    if "known" in fields[4:] and not item["flags"] & DISTINCT:
        raise TableError(f"only a distinct item (flag d) can be known: {text!r}")
    if "blocked" in fields[4:] and not case.get("block", {}).get(name):
        raise TableError(f"only an item of a key with a block can be blocked: {text!r}")
    used = [int(u) for u in fields[3].split("/")]
    if len(used) != len(case["keys"][name]):
        raise TableError(f"used in {text!r} needs one value per window")
    return {"ok": fields[0] == "ok", "charged": fields[1] == "charged",
            "retry": duration(fields[2]), "used": used, "known": "known" in fields[4:],
            "blocked": "blocked" in fields[4:]}


def load_cases(path):
    cases = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        tok = re.sub(r"(^|\s)#.*", "", line).split()
        if not tok:
            continue
        try:
            if tok[0] == "case":
                if any(c["name"] == " ".join(tok[1:]) for c in cases) or len(tok) < 2:
                    raise TableError("a case needs a unique name")
                cases.append({"name": " ".join(tok[1:]), "epoch": DEFAULT_EPOCH, "keys": {},
                              "steps": []})
                continue
            if not cases:
                raise TableError("before the first case")
            case = cases[-1]
            if tok[0] == "epoch":
                if len(tok) != 2 or case["steps"]:
                    raise TableError("epoch NS, before the first step")
                case["epoch"] = int(tok[1])
            elif tok[0] == "key":
                block = 0
                if len(tok) > 3 and tok[-1].startswith("block="):
                    block = duration(tok.pop()[len("block="):])
                    if block == 0:
                        raise TableError("block=DURATION, more than 0")
                if len(tok) < 3 or len(tok) > 6 or tok[1] in case["keys"]:
                    raise TableError("key NAME WINDOW... [block=DURATION]")
                case["keys"][tok[1]] = [window(w) for w in tok[2:]]
                case.setdefault("block", {})[tok[1]] = block
            elif tok[0] == "decide":
                arrow = tok.index("=>")
                if tok[1] not in ("check", "peek") or arrow < 4 or \
                        tok[arrow + 1] not in ("pass", "refuse") or \
                        len(tok) - arrow - 2 != arrow - 3:
                    raise TableError("decide MODE TIME ITEM... => PASS RESULT...")
                items = [parse_item(case, t, True) for t in tok[3:arrow]]
                for item, res in zip(items, tok[arrow + 2:]):
                    item["want"] = parse_result(case, item, res)
                case["steps"].append({"kind": "decide", "line": lineno, "mode": tok[1],
                                      "now": case["epoch"] + duration(tok[2]),
                                      "items": items, "pass": tok[arrow + 1] == "pass"})
            elif tok[0] == "refund":
                if len(tok) < 3:
                    raise TableError("refund TIME ITEM...")
                case["steps"].append({"kind": "refund", "line": lineno,
                                      "now": case["epoch"] + duration(tok[1]),
                                      "items": [parse_item(case, t, False) for t in tok[2:]]})
            elif tok[0] == "slide":
                if len(tok) != 10 or tok[6] != "=>" or tok[1] not in ("take", "peek") or \
                        tok[7] not in ("ok", "no"):
                    raise TableError("slide MODE TIME NAME N W => OK WAIT COUNT")
                case["steps"].append({
                    "kind": "slide", "line": lineno, "mode": tok[1],
                    "now": case["epoch"] + duration(tok[2]), "name": tok[3],
                    "limit": int(tok[4]), "window": duration(tok[5]), "ok": tok[7] == "ok",
                    "wait": U64_MAX if tok[8] == "never" else duration(tok[8]),
                    "count": int(tok[9])})
            else:
                raise TableError(f"unknown directive {tok[0]!r}")
        except (TableError, ValueError, IndexError) as e:
            raise TableError(f"{path}:{lineno}: {e}") from None
    return cases


TABLE = load_cases(CASES)


# ---------------------------------------------------------------------------------------
# redis-server and redis-cli

# How redis-cli prints an error reply when its output is not a terminal.
ERROR_REPLY = re.compile(r"(\(error\) )?(ERR|WRONGTYPE|NOSCRIPT|BUSY|NOPERM|READONLY|LOADING|"
                         r"OOM|EXECABORT|MISCONF|NOAUTH|WRONGPASS)\b")


class Redis:
    """A private redis-server on a unix socket, driven through redis-cli."""

    def __init__(self, directory):
        self.dir = pathlib.Path(directory)
        self.sock = str(self.dir / "redis.sock")
        self.log = self.dir / "redis.log"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--unixsocket", self.sock, "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--logfile", str(self.log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited {self.proc.returncode}:\n"
                                     f"{self.log.read_text(errors='replace')}")
            return unix_listening(self.sock) and self.cli("PING") == ["PONG"]
        wait_until(ready, 15, "redis-server to answer")
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cli(self, *args):
        """Run redis-cli; its raw output as lines.  An error reply raises: redis-cli
        exits 0 on one, so the text is what tells."""
        res = subprocess.run([REDIS_CLI, "-s", self.sock, *map(str, args)],
                             capture_output=True, text=True, timeout=30)
        lines = res.stdout.splitlines()
        if res.returncode != 0 or (lines and ERROR_REPLY.match(lines[0])):
            raise RedisError(f"redis-cli {' '.join(map(str, args))}: rc {res.returncode}\n"
                             f"{res.stdout}{res.stderr}")
        return lines

    def eval(self, script, keys, args):
        return self.cli("--eval", SCRIPTS / script, *keys, ",", *args)

    def time_ns(self):
        secs, micros = self.cli("TIME")
        return int(secs) * SEC + int(micros) * 1000


class RedisError(Exception):
    pass


@pytest.fixture(scope="module")
def redis_server(func_tmp):
    for tool in (REDIS_SERVER, REDIS_CLI):
        if not pathlib.Path(tool).exists():
            pytest.skip(f"{tool} not installed")
    d = func_tmp / "redis-scripts"
    d.mkdir()
    server = Redis(d)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture
def redis(redis_server):
    redis_server.cli("FLUSHALL")
    return redis_server


# ---------------------------------------------------------------------------------------
# the table through the scripts

def window_keys(name, windows):
    """One key per window, named by the window as the memory store's records are: a
    window whose numbers change starts afresh."""
    return [f"case:{name}:{j}:{w['count']}:{w['period']}:{w['burst']}"
            for j, w in enumerate(windows)]


def item_key(name, windows):
    """The one key of an item, which holds all its windows, named by them as sluiced
    names it (a window whose numbers change starts afresh)."""
    return f"case:{name}:" + ",".join(f"{w['count']}:{w['period']}:{w['burst']}"
                                      for w in windows)


def gcra_batch(redis, case, now, decisions):
    """Run gcra.lua over several decisions [(mode, items)] in one call, with the keys and
    arguments redis_send_decisions() (src/store/store_redis.c) gives it: a distinct item
    (flag 4) adds its values' set (its key + ":v"), its VALUE and each window's period in
    ms; a key with a block adds flag 8 and block_ns, in every mode (a peek reads the
    block).  Returns, per decision, (pass, [(ok, charged, retry, [used...]) per item]);
    a distinct item's tuple then has known, an item with a block then blocked (1 or 0):
    the script says them of those items only."""
    keys, args = [], [now, len(decisions)]
    for mode, items in decisions:
        args += [mode, len(items)]
        for it in items:
            windows = case["keys"][it["key"]]
            block = case.get("block", {}).get(it["key"], 0)
            flags = it["flags"] | (BLOCK if block else 0)
            keys.append(item_key(it["key"], windows))
            if flags & DISTINCT:
                keys.append(item_key(it["key"], windows) + ":v")
            args += [it["cost"], flags, len(windows)]
            if flags & DISTINCT:
                args.append(it["value"])
            if block:
                args.append(block)
            for w in windows:
                args += [w["t"], w["burst"]]
                if flags & DISTINCT:
                    args.append(w["period"] // 10**6)
    out = [int(x) for x in redis.eval("gcra.lua", keys, args)]
    at, answers = 0, []
    for mode, items in decisions:
        passed, results = out[at], []
        at += 1
        for it in items:
            nw = len(case["keys"][it["key"]])
            ok, charged, retry = out[at:at + 3]
            used = out[at + 3:at + 3 + nw]
            at += 3 + nw
            res = (ok, charged, retry, used)
            if it["flags"] & DISTINCT:
                res += (out[at],)
                at += 1
            if case.get("block", {}).get(it["key"]):
                res += (out[at],)
                at += 1
            results.append(res)
        answers.append((passed, results))
    assert at == len(out), f"reply longer than expected: {out}"
    return answers


def gcra(redis, case, mode, now, items):
    """Run gcra.lua for one decision; returns (pass, [(ok, charged, retry, [used...])])."""
    return gcra_batch(redis, case, now, [(mode, items)])[0]


def refund(redis, case, now, items):
    # as store_redis.c's refund_some(): a distinct value's charge is not given back, so
    # its item is not sent (store.h)
    items = [it for it in items if not it.get("flags", 0) & DISTINCT]
    if not items:
        return 0
    keys, args = [], [now, len(items)]
    for it in items:
        windows = case["keys"][it["key"]]
        keys.append(item_key(it["key"], windows))
        args += [it["cost"], len(windows)] + [w["t"] for w in windows]
    return int(redis.eval("refund.lua", keys, args)[0])


def run_case(redis, case):
    sends = 0
    for st in case["steps"]:
        where = f"{CASES}:{st['line']}"
        if st["kind"] == "decide":
            passed, results = gcra(redis, case, st["mode"], st["now"], st["items"])
            assert passed == int(st["pass"]), f"{where}: pass {passed}"
            for i, (it, got) in enumerate(zip(st["items"], results)):
                w = it["want"]
                want = (int(w["ok"]), int(w["charged"]), w["retry"], w["used"])
                if it["flags"] & DISTINCT:
                    want += (int(w["known"]),)
                if case.get("block", {}).get(it["key"]):
                    want += (int(w["blocked"]),)
                assert got == want, f"{where}: item {i} ({it['key']}): got {got}, expected {want}"
        elif st["kind"] == "refund":
            refund(redis, case, st["now"], st["items"])
        else:
            sends += 1
            out = redis.eval("slide.lua", [f"slide:{st['name']}"],
                             [st["mode"], st["now"], f"node1:{sends}", st["limit"],
                              st["window"]])
            got = (int(out[0]), int(out[1]), int(out[2]))
            want = (int(st["ok"]), st["wait"], st["count"])
            assert got == want, f"{where}: got {got}, expected {want}"


@pytest.mark.parametrize("case", TABLE, ids=[c["name"] for c in TABLE])
def test_case(redis, case):
    run_case(redis, case)


def test_the_table_is_whole():
    """Every kind of step is in the table, so neither program runs a table that tests less
    than it seems to."""
    kinds = {(st["kind"], st.get("mode")) for c in TABLE for st in c["steps"]}
    assert kinds >= {("decide", "check"), ("decide", "peek"), ("refund", None),
                     ("slide", "take"), ("slide", "peek")}
    assert len(TABLE) >= 30


# ---------------------------------------------------------------------------------------
# expiry: a key lives as long as it holds information, plus a second

MIN = 60 * SEC


def pttl_about(redis, key, ms):
    """PTTL is ms minus the moments since the write (a slow machine: up to 2 s)."""
    pttl = int(redis.cli("PTTL", key)[0])
    assert ms - 2000 < pttl <= ms, f"PTTL {key} = {pttl}, expected just under {ms}"


def test_gcra_sets_px_while_the_tat_is_ahead(redis):
    case = {"keys": {"k": [window("10/1m")], "s": [window("7/10s:3")]}}
    key = item_key("k", case["keys"]["k"])
    now = redis.time_ns()
    item = {"key": "k", "cost": 3, "flags": BLOCKING}
    assert gcra(redis, case, "check", now, [item]) == (1, [(1, 1, 0, [3])])
    assert redis.cli("GET", key) == [str(now + 18 * SEC)]
    pttl_about(redis, key, 18000 + 1000)
    item["cost"] = 1
    gcra(redis, case, "check", now, [item])
    pttl_about(redis, key, 24000 + 1000)
    # T = 1428571429 ns: the TAT to the ns, the PX rounded up to the ms
    skey = item_key("s", case["keys"]["s"])
    gcra(redis, case, "check", now, [{"key": "s", "cost": 1, "flags": 0}])
    assert redis.cli("GET", skey) == [str(now + 1428571429)]
    pttl_about(redis, skey, 1429 + 1000)
    # a refund shortens the PX with the TAT; one that leaves nothing owed deletes the key
    assert refund(redis, case, now, [{"key": "k", "cost": 2}]) == 1
    assert redis.cli("GET", key) == [str(now + 12 * SEC)]
    pttl_about(redis, key, 12000 + 1000)
    assert refund(redis, case, now, [{"key": "k", "cost": 2}, {"key": "s", "cost": 1}]) == 2
    assert redis.cli("EXISTS", key, skey) == ["0"]
    assert refund(redis, case, now, [{"key": "k", "cost": 2}]) == 0


def test_gcra_writes_only_charges(redis):
    case = {"keys": {"k": [window("2/1m")], "j": [window("2/1m")]}}
    now = redis.time_ns()
    peek = [{"key": "k", "cost": 1, "flags": BLOCKING}]
    assert gcra(redis, case, "peek", now, peek) == (1, [(1, 0, 0, [0])])
    zero = [{"key": "k", "cost": 0, "flags": BLOCKING}]
    assert gcra(redis, case, "check", now, zero) == (1, [(1, 1, 0, [0])])
    assert redis.cli("DBSIZE") == ["0"]
    # a refused decision writes nothing, not even the expiry of the item that had room
    gcra(redis, case, "check", now, [{"key": "j", "cost": 2, "flags": BLOCKING}])
    jkey = item_key("j", case["keys"]["j"])
    before = redis.cli("GET", jkey)
    batch = [{"key": "j", "cost": 1, "flags": BLOCKING}, {"key": "k", "cost": 1, "flags": 0}]
    assert gcra(redis, case, "check", now, batch) == (0, [(0, 0, 30 * SEC, [2]), (1, 0, 0, [0])])
    assert redis.cli("GET", jkey) == before
    assert redis.cli("DBSIZE") == ["1"]


def test_gcra_and_refund_use_time_for_an_empty_now(redis):
    case = {"keys": {"k": [window("10/1m")]}}
    key = item_key("k", case["keys"]["k"])
    t1 = redis.time_ns()
    assert gcra(redis, case, "check", "", [{"key": "k", "cost": 2, "flags": BLOCKING}]) == \
        (1, [(1, 1, 0, [2])])
    t2 = redis.time_ns()
    tat = int(redis.cli("GET", key)[0])
    assert t1 <= tat - 12 * SEC <= t2
    assert (tat - 12 * SEC) % 1000 == 0     # TIME has microseconds
    pttl_about(redis, key, 12000 + 1000)
    assert refund(redis, case, "", [{"key": "k", "cost": 2}]) == 1
    assert redis.cli("EXISTS", key) == ["0"]


def test_slide_expiry_and_time(redis):
    t1 = redis.time_ns()
    out = redis.eval("slide.lua", ["lane"], ["take", "", "n1:1", 2, MIN])
    t2 = redis.time_ns()
    assert out == ["1", "0", "1"]
    score = int(redis.cli("ZSCORE", "lane", "n1:1")[0])
    assert t1 // 1000 <= score <= t2 // 1000
    pttl_about(redis, "lane", 60000 + 1000)
    # W off the ms: rounded up
    redis.eval("slide.lua", ["lane2"], ["take", t1, "n1:2", 2, 1500 * 10**6 + 1])
    pttl_about(redis, "lane2", 1501 + 1000)
    # peek writes nothing
    assert redis.eval("slide.lua", ["lane3"], ["peek", t1, "", 2, MIN]) == ["1", "0", "0"]
    assert redis.cli("EXISTS", "lane3") == ["0"]


# ---------------------------------------------------------------------------------------
# slide.lua over several windows: one decision

def slide(redis, keys, mode, now, member, windows):
    """Run slide.lua over windows [(N, W), ...]; returns [ok, wait, count...] as ints."""
    args = [mode, now, member]
    for n, w in windows:
        args += [n, w]
    return [int(x) for x in redis.eval("slide.lua", keys, args)]


def members(redis, key):
    return redis.cli("ZRANGE", key, 0, -1, "WITHSCORES")


def test_slide_windows_as_one(redis):
    t0 = DEFAULT_EPOCH + 123456789          # 789 ns past its microsecond
    keys, lane = ["w:0", "w:1"], [(2, SEC), (3, MIN)]
    assert slide(redis, keys, "take", t0, "a1", lane) == [1, 0, 1, 1]
    assert slide(redis, keys, "take", t0 + 1000, "a2", lane) == [1, 0, 2, 2]
    # the minute has room, the second does not: nothing is added anywhere
    before = [members(redis, k) for k in keys]
    assert slide(redis, keys, "take", t0 + 2000, "a3", lane) == [0, SEC - 1789, 2, 2]
    assert [members(redis, k) for k in keys] == before
    # on the microsecond the first send leaves: admitted, counted in both
    assert slide(redis, keys, "take", t0 + SEC + 211, "a4", lane) == [1, 0, 2, 3]
    # the second has room, the minute refuses; the take forgot what no longer counts
    assert slide(redis, keys, "take", t0 + 3 * SEC, "a5", lane) == [0, MIN - 3 * SEC + 211, 0, 3]
    assert redis.cli("ZCARD", "w:0") == ["0"] and redis.cli("ZCARD", "w:1") == ["3"]
    # a peek forgets nothing and writes nothing
    assert slide(redis, ["v:0", "v:1"], "peek", t0, "", lane) == [1, 0, 0, 0]
    assert redis.cli("EXISTS", "v:0", "v:1") == ["0"]


def test_slide_largest_wait_of_the_refusing_windows(redis):
    t0 = DEFAULT_EPOCH + 123456789
    keys, lane = ["b:0", "b:1"], [(1, SEC), (2, MIN)]
    assert slide(redis, keys, "take", t0, "b1", lane)[0] == 1
    assert slide(redis, keys, "take", t0 + SEC + 211, "b2", lane)[0] == 1
    # both refuse: the later of the two leavings
    assert slide(redis, keys, "take", t0 + SEC + 1211, "b3", lane) == \
        [0, MIN - SEC - 1000, 1, 2]
    # only the minute refuses (the second's send left)
    assert slide(redis, keys, "peek", t0 + 2 * SEC + 211, "", lane) == [0, MIN - 2 * SEC, 0, 2]
    # windows in the other order: the same answer
    assert slide(redis, keys[::-1], "peek", t0 + SEC + 1211, "", lane[::-1]) == \
        [0, MIN - SEC - 1000, 2, 1]
    # N = 0 in any refusing window: never
    assert slide(redis, keys, "peek", t0 + SEC + 1211, "", [(1, SEC), (0, MIN)]) == \
        [0, U64_MAX, 1, 2]
    assert slide(redis, ["z:0", "z:1"], "take", t0, "z1", [(5, SEC), (0, MIN)]) == \
        [0, U64_MAX, 0, 0]
    assert redis.cli("EXISTS", "z:0", "z:1") == ["0"]
    # a wait past 2^53 ns stays exact: 300 days, asked 1 ns after the send
    day = 86400 * SEC
    assert slide(redis, ["y:0"], "take", t0 + 211, "y1", [(1, 300 * day)])[0] == 1
    assert slide(redis, ["y:0"], "peek", t0 + 212, "", [(1, 300 * day)]) == \
        [0, 300 * day - 1, 1]
    assert slide(redis, ["y:0"], "peek", t0 + 1211, "", [(1, 300 * day)]) == \
        [0, 300 * day - 1000, 1]


def test_slide_expiry_per_window(redis):
    now = redis.time_ns()
    keys = ["e:0", "e:1", "e:2"]
    lane = [(2, 1500 * 10**6 + 1), (5, MIN), (9, 3600 * SEC)]
    assert slide(redis, keys, "take", now, "e1", lane) == [1, 0, 1, 1, 1]
    pttl_about(redis, "e:0", 1501 + 1000)
    pttl_about(redis, "e:1", 60000 + 1000)
    pttl_about(redis, "e:2", 3600000 + 1000)
    # the same member in every set, with the same score
    scores = {k: redis.cli("ZSCORE", k, "e1") for k in keys}
    assert len(set(map(tuple, scores.values()))) == 1
    assert int(scores["e:0"][0]) == -(-now // 1000)


def test_scripts_check_their_input(redis):
    case = {"keys": {"k": [window("10/1m")]}}
    with pytest.raises(RedisError, match="more keys than items"):
        redis.eval("gcra.lua", ["a", "b"], [DEFAULT_EPOCH, 1, "check", 1, 1, 1, 1, 6 * SEC, 10])
    with pytest.raises(RedisError, match="fewer keys than items"):
        redis.eval("gcra.lua", ["a"], [DEFAULT_EPOCH, 1, "check", 2, 1, 1, 1, 6 * SEC, 10,
                                       1, 1, 1, 6 * SEC, 10])
    with pytest.raises(RedisError, match="more arguments than windows"):
        redis.eval("gcra.lua", ["a"], [DEFAULT_EPOCH, 1, "check", 1, 1, 1, 1, 6 * SEC, 10, 7])
    with pytest.raises(RedisError, match="T is not a decimal"):
        redis.eval("gcra.lua", ["a"], [DEFAULT_EPOCH, 1, "check", 1, 1, 1, 2, 6 * SEC, 10])
    with pytest.raises(RedisError, match="now is not a decimal"):
        gcra(redis, case, "check", "-5", [{"key": "k", "cost": 1, "flags": 1}])
    with pytest.raises(RedisError, match="neither check nor peek"):
        gcra(redis, case, "charge", DEFAULT_EPOCH, [{"key": "k", "cost": 1, "flags": 1}])
    with pytest.raises(RedisError, match="member id"):
        redis.eval("slide.lua", ["lane"], ["take", DEFAULT_EPOCH, "", 1, MIN])
    with pytest.raises(RedisError, match="fewer windows than keys"):
        redis.eval("slide.lua", ["l0", "l1"], ["take", DEFAULT_EPOCH, "m", 1, MIN])
    with pytest.raises(RedisError, match="more windows than keys"):
        redis.eval("slide.lua", ["l0"], ["take", DEFAULT_EPOCH, "m", 1, MIN, 2, MIN])
    with pytest.raises(RedisError, match="no window"):
        redis.eval("slide.lua", [], ["peek", DEFAULT_EPOCH, ""])
    with pytest.raises(RedisError, match="N is not a decimal"):
        redis.eval("slide.lua", ["l0", "l1"], ["take", DEFAULT_EPOCH, "m", 1, MIN, "x", MIN])
    with pytest.raises(RedisError, match="W is not a decimal"):
        redis.eval("slide.lua", ["l0", "l1"], ["take", DEFAULT_EPOCH, "m", 1, MIN, 1, "-1"])
    with pytest.raises(RedisError, match="lease_ms"):
        redis.eval("slot_enter.lua", ["cls"], ["a", 1, 0, 1000])
    assert redis.cli("DBSIZE") == ["0"]


# ---------------------------------------------------------------------------------------
# concurrency slots: leases

def enter(redis, node, cap, lease, now, key="cls"):
    return [int(x) for x in redis.eval("slot_enter.lua", [key], [node, cap, lease, now])]


def release(redis, node, key="cls"):
    return int(redis.eval("slot_release.lua", [key], [node])[0])


def renew(redis, node, lease, now, counts):
    keys = list(counts)
    return [int(x) for x in redis.eval("slot_renew.lua", keys,
                                       [node, lease, now, *counts.values()])]


def fields(redis, key="cls"):
    out = redis.cli("HGETALL", key)
    return dict(zip(out[0::2], out[1::2]))


def test_slot_enter_up_to_cap(redis):
    assert enter(redis, "a", 2, 1000, 1000) == [1, 1]
    assert enter(redis, "b", 2, 1000, 1000) == [1, 2]
    assert enter(redis, "c", 2, 1000, 1000) == [0, 2]
    assert fields(redis) == {"c:a": "1", "e:a": "2000", "c:b": "1", "e:b": "2000"}
    pttl_about(redis, "cls", 2000)


def test_slot_an_expired_lease_stops_counting(redis):
    assert enter(redis, "a", 1, 1000, 1000) == [1, 1]
    # a lease holds up to its expiry, included
    assert enter(redis, "b", 1, 1000, 2000) == [0, 1]
    # one ms later a's slot is gone, and so are its fields
    assert enter(redis, "b", 1, 1000, 2001) == [1, 1]
    assert fields(redis) == {"c:b": "1", "e:b": "3001"}
    # a late release by a finds nothing, and brings back no field
    assert release(redis, "a") == 0
    assert fields(redis) == {"c:b": "1", "e:b": "3001"}


def test_slot_release_never_below_zero(redis):
    enter(redis, "a", 5, 1000, 1000)
    enter(redis, "a", 5, 1000, 1000)
    assert release(redis, "a") == 1
    assert release(redis, "a") == 0
    assert release(redis, "a") == 0
    assert fields(redis)["c:a"] == "0"
    assert release(redis, "nobody") == 0
    assert "c:nobody" not in fields(redis)


def test_slot_renew(redis):
    assert enter(redis, "b", 10, 1000, 5000, key="h1") == [1, 1]      # b's lease: 6000
    assert renew(redis, "a", 1000, 5000, {"h1": 2, "h2": 0}) == [3, 0]
    assert fields(redis, "h1") == {"c:b": "1", "e:b": "6000", "c:a": "2", "e:a": "6000"}
    assert redis.cli("EXISTS", "h2") == ["0"]
    pttl_about(redis, "h1", 2000)
    # b did not renew: at 6001 it no longer counts and its fields go
    assert renew(redis, "a", 1000, 6001, {"h1": 3, "h2": 1}) == [3, 1]
    assert fields(redis, "h1") == {"c:a": "3", "e:a": "7001"}
    assert fields(redis, "h2") == {"c:a": "1", "e:a": "7001"}
    # a count of 0 removes the node
    assert renew(redis, "a", 1000, 6500, {"h1": 0}) == [0]
    assert redis.cli("EXISTS", "h1") == ["0"]


def test_slot_expiry_is_only_extended(redis):
    enter(redis, "long", 10, 10000, 1000)
    pttl_about(redis, "cls", 20000)
    enter(redis, "short", 10, 1000, 1000)
    pttl_about(redis, "cls", 20000)


def test_slot_time_for_an_empty_now(redis):
    t1 = redis.time_ns() // 10**6
    assert enter(redis, "a", 1, 5000, "") == [1, 1]
    t2 = redis.time_ns() // 10**6
    assert t1 + 5000 <= int(fields(redis)["e:a"]) <= t2 + 5000
    assert renew(redis, "a", 5000, "", {"cls": 1}) == [1]
    assert t1 + 5000 <= int(fields(redis)["e:a"]) <= redis.time_ns() // 10**6 + 5000


# ---------------------------------------------------------------------------------------
# random traffic against a model of store.h and slide.h in exact integers
#
# "now" follows the real clock plus an offset that only grows, so no key's PX (set from
# the server's clock) ends while the TAT it holds is still ahead in the test's time.

class GcraModel:
    """store.h's rules, per (key, window) TAT."""

    def __init__(self):
        self.tat = {}

    def decide(self, mode, now, items):
        results, passed = [], True
        for it in items:
            c = it["cost"] or 1
            ok, retry, wins = True, 0, []
            for key, w in zip(it["keys"], it["windows"]):
                base = max(self.tat.get(key, 0), now)
                need, limit = base - now + c * w["t"], w["burst"] * w["t"]
                if need > limit:
                    ok, retry = False, max(retry, need - limit)
                wins.append((key, w, base))
            results.append([ok, retry, wins])
            if not ok and it["flags"] & BLOCKING:
                passed = False
        out = []
        for it, (ok, retry, wins) in zip(items, results):
            charged = mode == "check" and ok and (passed or it["flags"] & COUNT_REJECTED)
            used = []
            for key, w, base in wins:
                if charged and it["cost"]:
                    self.tat[key] = min(base + it["cost"] * w["t"], U64_MAX)
                after = max(self.tat.get(key, 0), now) - now
                used.append(-(-after // w["t"]) if w["t"] else 0)
            out.append((int(ok), int(bool(charged)), min(retry, U64_MAX), used))
        return int(passed), out

    def refund(self, now, items):
        for it in items:
            for key, w in zip(it["keys"], it["windows"]):
                tat = self.tat.get(key)
                if tat is None or tat <= now or not it["cost"]:
                    continue
                tat -= it["cost"] * w["t"]
                if tat <= now:
                    del self.tat[key]
                else:
                    self.tat[key] = tat


def random_window(rng):
    count = rng.choice([1, 2, 3, 7, 10, 13, 100])
    period = rng.choice([1000, 7919, 10**6, SEC, 10 * SEC, MIN, 3600 * SEC]) * rng.choice([1, 3])
    burst = max(1, count + rng.choice([0, 0, -count // 2, count]))
    return {"count": count, "period": period, "burst": burst, "t": -(-period // count)}


def test_gcra_random_against_model(redis):
    import random
    import time
    rng = random.Random(20240601)
    model = GcraModel()
    keys = {}
    for k in range(5):
        windows = [random_window(rng) for _ in range(rng.choice([1, 1, 2, 3]))]
        keys[f"r{k}"] = {"windows": windows, "keys": window_keys(f"r{k}", windows)}
    case = {"keys": {name: v["windows"] for name, v in keys.items()}}
    offset, charged_items, refused = 0, [], 0
    for step in range(400):
        gap = rng.random()
        offset += 0 if gap < 0.4 else rng.randrange(2000) if gap < 0.8 else \
            rng.randrange(20 * SEC)
        now = time.time_ns() + offset
        if charged_items and rng.random() < 0.08:
            items = charged_items.pop(rng.randrange(len(charged_items)))
            refund(redis, case, now, items)
            model.refund(now, [dict(it, **keys[it["key"]]) for it in items])
            continue
        names = rng.sample(sorted(keys), rng.choice([1, 1, 2, 3]))
        items = [{"key": n, "cost": rng.randrange(0, 5),
                  "flags": rng.choice([0, BLOCKING, BLOCKING, BLOCKING | COUNT_REJECTED,
                                       COUNT_REJECTED])} for n in names]
        mode = "peek" if rng.random() < 0.15 else "check"
        got = gcra(redis, case, mode, now, items)
        want = model.decide(mode, now, [dict(it, **keys[it["key"]]) for it in items])
        assert got == want, f"step {step} {mode} now {now} {items}: got {got}, model {want}"
        refused += not got[0]
        charged = [it for it, r in zip(items, got[1]) if r[1] and it["cost"]]
        if charged:
            charged_items.append(charged)
    assert refused > 20


def test_gcra_decisions_of_one_call_see_each_other(redis):
    """sluiced sends the decisions a loop makes in one pass as one script call: each is
    taken in order, as if it were alone, and sees what the ones before it charged --
    the same key in several of them included."""
    import random
    import time
    rng = random.Random(20261127)
    model = GcraModel()
    keys = {}
    for k in range(4):
        windows = [random_window(rng) for _ in range(2 if k == 0 else rng.choice([1, 2, 3]))]
        keys[f"b{k}"] = {"windows": windows, "keys": window_keys(f"b{k}", windows)}
    case = {"keys": {name: v["windows"] for name, v in keys.items()}}
    refused = 0
    for step in range(60):
        now = time.time_ns() + step * rng.randrange(1, 3 * SEC)
        decisions = []
        for _ in range(rng.choice([2, 5, 20])):
            names = rng.sample(sorted(keys), rng.choice([1, 1, 2]))
            items = [{"key": n, "cost": rng.randrange(0, 4),
                      "flags": rng.choice([BLOCKING, BLOCKING, 0, COUNT_REJECTED])}
                     for n in names]
            decisions.append(("peek" if rng.random() < 0.1 else "check", items))
        got = gcra_batch(redis, case, now, decisions)
        want = [model.decide(mode, now, [dict(it, **keys[it["key"]]) for it in items])
                 for mode, items in decisions]
        assert got == want, f"step {step}: got {got}, model {want}"
        refused += sum(1 for passed, _ in got if not passed)
    assert refused > 20
    # a key of several windows holds their TATs in order, separated by spaces
    multi = next(n for n, v in keys.items() if len(v["windows"]) > 1)
    value = redis.cli("GET", item_key(multi, keys[multi]["windows"]))
    assert value and len(value[0].split(" ")) == len(keys[multi]["windows"]), value


def test_slide_random_against_model(redis):
    import random
    import time
    rng = random.Random(77)
    for lane in range(4):
        # windows off the us, and long enough that real time between steps does not
        # empty them
        limit = rng.randrange(1, 6)
        w = rng.choice([50 * 10**6 + 1500, 200 * 10**6 - 1, SEC + 999999, 3 * SEC + 7])
        w_us, sent, offset, refused = -(-w // 1000), [], 0, 0
        for step in range(120):
            offset += 0 if rng.random() < 0.5 else rng.randrange(w // limit + 2000)
            now = time.time_ns() + offset
            mode = "peek" if rng.random() < 0.2 else "take"
            out = [int(x) for x in redis.eval("slide.lua", [f"lane{lane}"],
                                              [mode, now, f"n:{step}", limit, w])]
            fl = now // 1000
            live = sorted(s for s in sent if s + w_us > fl)
            if mode == "take":
                sent = list(live)
            if len(live) < limit:
                if mode == "take":
                    sent.append(-(-now // 1000))
                want = [1, 0, len(live) + (mode == "take")]
            else:
                leaves = live[len(live) - limit] + w_us
                want = [0, (leaves - fl) * 1000 - now % 1000, len(live)]
                refused += 1
            assert out == want, f"lane {lane} step {step} {mode} now {now}: {out} != {want}"
        assert refused > 0


def lane_model(nwin):
    return [[] for _ in range(nwin)]


def model_slide(sets, mode, now, windows):
    """slide.lua's rule in exact integers: every window forgets on a take, admits below
    N; admitted iff all do; the wait is the largest over the refusing windows."""
    fl, ceil_us = now // 1000, -(-now // 1000)
    ok, wait, counts = True, 0, []
    for i, (n, w) in enumerate(windows):
        w_us = -(-w // 1000)
        live = sorted(s for s in sets[i] if s + w_us > fl)
        if mode == "take":
            sets[i] = list(live)
        if len(live) >= n:
            ok = False
            wait = max(wait, U64_MAX if n == 0 else
                       (live[len(live) - n] + w_us - fl) * 1000 - now % 1000)
        counts.append(len(live))
    if ok and mode == "take":
        for i in range(len(windows)):
            sets[i].append(ceil_us)
            counts[i] += 1
    return [int(ok), wait if not ok else 0, *counts]


def random_lane(rng, nwin):
    wins = sorted(rng.sample([20 * 10**6 - 1, 50 * 10**6 + 1500, 120 * 10**6 + 7,
                              300 * 10**6, SEC + 999999, 3 * SEC + 7], nwin))
    return [(rng.randrange(1, 4) * (i + 1), w) for i, w in enumerate(wins)]


def assert_never_over(times, windows):
    """No N + 1 sends within any window of length W: t[k + N] - t[k] >= W."""
    times = sorted(times)
    for n, w in windows:
        for k in range(len(times) - n):
            assert times[k + n] - times[k] >= w, \
                f"{n + 1} sends within {w} ns: {times[k]}..{times[k + n]}"


def test_slide_random_windows_against_model(redis):
    """Two nodes take in turn from lanes of one to four windows, peeking now and then,
    N lowered for a call, in half of them the clock stepping back a little: every answer
    as the model gives it, and in the others never more than N sends in any window."""
    import random
    import time
    rng = random.Random(4242)
    for lane in range(6):
        nwin = rng.randrange(1, 5)
        windows = random_lane(rng, nwin)
        keys = [f"rl{lane}:{i}" for i in range(nwin)]
        pace = max(w // n for n, w in windows)          # about the lane's rate
        sets, offset, sent, refused = lane_model(nwin), 0, [], 0
        steady = lane % 2 == 0                          # odd lanes: the clock steps back
        for step in range(150):
            r = rng.random()
            if r < 0.05 and not steady:
                offset -= rng.randrange(300 * 10**6)    # the clock steps back (< 1 s)
            elif r < 0.6:
                offset += rng.randrange(pace + 2000)
            now = time.time_ns() + offset
            lim = list(windows)
            if rng.random() < 0.1:     # N lowered for one call (the bound still holds)
                j = rng.randrange(nwin)
                lim[j] = (rng.randrange(0, lim[j][0] + 1), lim[j][1])
            mode = "peek" if rng.random() < 0.2 else "take"
            got = slide(redis, keys, mode, now, f"node{step % 2}:{step}", lim)
            want = model_slide(sets, mode, now, lim)
            assert got == want, f"lane {lane} step {step} {mode} now {now} {lim}: " \
                f"{got} != {want}"
            if got[0] and mode == "take":
                sent.append(now)
            refused += not got[0]
        assert refused > 10 and len(sent) > 10
        if steady:
            assert_never_over(sent, windows)


def test_slide_never_over_with_two_nodes(redis):
    """Fixed limits, the clock only going forward: the admitted sends of two nodes
    together never exceed N in any window of length W, whatever their times."""
    import random
    import time
    rng = random.Random(99)
    windows = [(3, 40 * 10**6 + 1500), (5, 100 * 10**6 - 1), (8, 400 * 10**6 + 3)]
    keys = [f"two:{i}" for i in range(len(windows))]
    sent, offset = [], 0
    for step in range(400):
        offset += rng.randrange(8 * 10**6) if rng.random() < 0.7 else 0
        now = time.time_ns() + offset
        out = slide(redis, keys, "take", now, f"n{step % 2}:{step}", windows)
        if out[0]:
            sent.append(now)
        else:
            # the wait is exact: one ns earlier is still refused, at it admitted
            assert slide(redis, keys, "peek", now + out[1] - 1, "", windows)[0] == 0
            assert slide(redis, keys, "peek", now + out[1], "", windows)[0] == 1
    assert len(sent) > 30
    assert_never_over(sent, windows)
    # and the sets hold no more than the largest N of each window
    for (n, _), k in zip(windows, keys):
        assert int(redis.cli("ZCARD", k)[0]) <= n


# ---------------------------------------------------------------------------------------
# slide.lua against slide.c itself: the C file compiled as a small shared library and
# driven through ctypes with the same sequence of calls (one struct slide per window,
# a send admitted iff every window admits it, as a lane holds them)

@pytest.fixture(scope="module")
def slide_c(func_tmp):
    import ctypes
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    so = func_tmp / "libslide.so"
    subprocess.run([cc, "-std=c17", "-O1", "-shared", "-fPIC", "-o", str(so),
                    str(SOURCE_ROOT / "src/store/slide.c")], check=True, timeout=120)
    lib = ctypes.CDLL(str(so))
    u64 = ctypes.c_uint64

    class Slide(ctypes.Structure):
        _fields_ = [("at", ctypes.POINTER(u64)), ("cap", ctypes.c_uint32),
                    ("head", ctypes.c_uint32), ("len", ctypes.c_uint32)]

    lib.slide_init.argtypes = [ctypes.POINTER(Slide), ctypes.c_uint32]
    lib.slide_done.argtypes = [ctypes.POINTER(Slide)]
    for f in (lib.slide_take, lib.slide_peek):
        f.argtypes = [ctypes.POINTER(Slide), u64, u64, u64, ctypes.POINTER(u64)]
        f.restype = ctypes.c_bool
    lib.slide_count.argtypes = [ctypes.POINTER(Slide), u64, u64]
    lib.slide_count.restype = u64

    class Lane:
        def __init__(self, nwin):
            self.sl = [Slide() for _ in range(nwin)]
            for s in self.sl:
                assert lib.slide_init(ctypes.byref(s), 64) == 0

        def call(self, mode, now, windows):
            ok, wait = True, 0
            for s, (n, w) in zip(self.sl, windows):
                if mode == "take":      # forget, as the script does in every window
                    lib.slide_take(ctypes.byref(s), 0, w, now, None)
                wv = u64()
                if not lib.slide_peek(ctypes.byref(s), n, w, now, ctypes.byref(wv)):
                    ok, wait = False, max(wait, wv.value)
            if ok and mode == "take":
                for s, (n, w) in zip(self.sl, windows):
                    assert lib.slide_take(ctypes.byref(s), n, w, now, None)
            return [int(ok), wait, *(lib.slide_count(ctypes.byref(s), w, now)
                                     for s, (_, w) in zip(self.sl, windows))]

        def close(self):
            for s in self.sl:
                lib.slide_done(ctypes.byref(s))

    return Lane


def test_slide_same_answers_as_slide_c(redis, slide_c):
    import random
    import time
    rng = random.Random(31337)
    for lane in range(5):
        nwin = rng.randrange(1, 5)
        windows = random_lane(rng, nwin)
        keys = [f"c{lane}:{i}" for i in range(nwin)]
        pace = max(w // n for n, w in windows)
        c_lane, offset, refused = slide_c(nwin), 0, 0
        try:
            for step in range(200):
                r = rng.random()
                if r < 0.03:
                    offset -= rng.randrange(300 * 10**6)
                elif r < 0.6:
                    offset += rng.randrange(pace + 2000)
                now = time.time_ns() + offset
                lim = list(windows)
                if rng.random() < 0.1:
                    j = rng.randrange(nwin)
                    lim[j] = (rng.randrange(0, lim[j][0] + 2), lim[j][1])
                mode = "peek" if rng.random() < 0.2 else "take"
                got = slide(redis, keys, mode, now, f"n:{step}", lim)
                want = c_lane.call(mode, now, lim)
                assert got == want, f"lane {lane} step {step} {mode} now {now} {lim}: " \
                    f"slide.lua {got} != slide.c {want}"
                refused += not got[0]
        finally:
            c_lane.close()
        assert refused > 10
