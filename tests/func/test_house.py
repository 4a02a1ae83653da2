"""The shape of the source tree, as doc/ARCHITECTURE.md describes it.

- No source file in src/ is longer than 1,200 lines, but for those named in
  OVER_THE_LIMIT (none today), which may not grow past what they held when named.
- No circle of calls between source files, but for the ones ALLOWED_CIRCLES names: the
  relay's event-loop rooms (lanes, connections, transactions, provider groups), the
  memory store's tables with their snapshot.  Everything else calls downwards only: a
  module's floor room calls none above it, its top room is called by none.  Calls are
  read from the objects of the build (`nm`), so a call made through a header's inline
  function or a macro counts where it is compiled, and a call through a function
  pointer registered by the room above (relay.up, a request's callback) is no arrow.
- A room of a module split by object holds the functions of its prefix (`relay_msg.c`
  holds `msg_*`): no file defines a function whose prefix is another room's.
"""

import collections
import subprocess
from pathlib import Path

from conftest import SLUICED, SOURCE_ROOT, require_binary

MAX_LINES = 1200
# Files still longer than the limit, and the most each may hold until it is split.
OVER_THE_LIMIT = {
}

ALLOWED_CIRCLES = [
    {"relay_lane", "relay_conn", "relay_tx", "relay_group"},
    {"store_memory", "store_memory_snap"},
]

# The rooms of the relay by the prefix of their functions (the longest prefix decides).
RELAY_ROOMS = {
    "base_": "relay_base", "msg_": "relay_msg", "lane_": "relay_lane",
    "lane_budget_": "lane", "conn_": "relay_conn", "tx_": "relay_tx",
    "group_": "relay_group", "signal_": "relay_signal", "dane_": "relay_dane",
    "bounce_": "relay_bounce", "hist_": "relay_hist", "flush_": "relay_flush",
    "sched_": "relay_sched", "outcome_": "outcome", "classify_": "classify",
    "threshold_": "threshold", "relay_conf_": "relay_conf",
}


def test_no_source_file_over_the_limit():
    long = []
    for path in sorted((SOURCE_ROOT / "src").rglob("*.[ch]")):
        rel = str(path.relative_to(SOURCE_ROOT))
        n = path.read_text(errors="replace").count("\n")
        if n > OVER_THE_LIMIT.get(rel, MAX_LINES):
            long.append(f"{rel}: {n} lines")
    assert not long, "over %d lines:\n%s" % (MAX_LINES, "\n".join(long))


def symbols(build):
    """Object stem -> (the functions and data it defines, the symbols it needs)."""
    objs = [o for o in (build / "src").rglob("*.c.o")]
    assert objs, f"no objects under {build / 'src'}"
    out = {}
    for obj in objs:
        stem = obj.name[:-len(".c.o")]
        text = subprocess.run(["nm", str(obj)], capture_output=True, text=True,
                              check=True).stdout
        defs, undef = set(), set()
        for line in text.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defs.add(f[2])
            elif len(f) == 2 and f[0] == "U":
                undef.add(f[1])
        out[stem] = (defs, undef)
    return out


def call_graph(syms):
    defined = {s: stem for stem, (defs, _) in syms.items() for s in defs}
    graph = collections.defaultdict(set)
    for stem, (_, undef) in syms.items():
        for s in undef:
            if s in defined and defined[s] != stem:
                graph[stem].add(defined[s])
    return graph


def circles(graph):
    """Strongly connected components of more than one unit (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def forbidden(found):
    """The circles that are no allowed circle (nor part of one)."""
    return [c for c in found if not any(set(c) <= a for a in ALLOWED_CIRCLES)]


def misplaced(syms, rooms):
    """Functions defined in a file that is not the room of their prefix."""
    bad = []
    for stem, (defs, _) in syms.items():
        for s in defs:
            prefixes = [p for p in rooms if s.startswith(p)]
            if not prefixes:
                continue
            owner = rooms[max(prefixes, key=len)]
            if owner != stem and stem in rooms.values():
                bad.append(f"{s} is in {stem}.c, the room of its prefix is {owner}.c")
    return sorted(bad)


def build_dir():
    require_binary(SLUICED, "SLUICED")
    return Path(SLUICED).parents[2]  # build/src/daemon/sluiced


def test_no_circle_of_calls():
    found = forbidden(circles(call_graph(symbols(build_dir()))))
    assert not found, "files that call each other in a circle: %s" % found


def test_relay_rooms_hold_their_prefix():
    syms = symbols(build_dir())
    relay = {stem: v for stem, v in syms.items()
             if (SOURCE_ROOT / "src/relay" / (stem + ".c")).exists()}
    assert not misplaced(relay, RELAY_ROOMS)


def test_the_check_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert forbidden([["relay_lane", "relay_tx"]]) == []
    assert forbidden([["relay_lane", "relay_msg"]]) == [["relay_lane", "relay_msg"]]


def test_the_check_sees_a_misplaced_function():
    syms = {"relay_tx": ({"tx_start", "lane_pick"}, set()), "relay_lane": ({"lane_kick"}, set()),
            "lane": ({"lane_budget_take"}, set())}
    assert misplaced(syms, RELAY_ROOMS) == [
        "lane_pick is in relay_tx.c, the room of its prefix is relay_lane.c"]
