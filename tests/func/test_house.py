"""The shape of the source tree, as doc/ARCHITECTURE.md describes it.

- No source file in src/ is longer than 1,800 lines.
- No circle of calls between units.  A unit is one source file, or the rooms of one
  module that share a private header (`*_int.h`, such as src/relay/relay_int.h): rooms
  are one module split by job and may call each other; anything else calls downwards
  only.  Calls are read from the objects of the build (`nm`), so a call made through a
  header's inline function or a macro counts where it is compiled.
"""

import collections
import re
import subprocess
from pathlib import Path

from conftest import SLUICED, SOURCE_ROOT, require_binary

MAX_LINES = 1800


def test_no_source_file_over_the_limit():
    long = []
    for path in sorted((SOURCE_ROOT / "src").rglob("*.[ch]")):
        n = path.read_text(errors="replace").count("\n")
        if n > MAX_LINES:
            long.append(f"{path.relative_to(SOURCE_ROOT)}: {n} lines")
    assert not long, "over %d lines:\n%s" % (MAX_LINES, "\n".join(long))


def units():
    """Source file stem -> unit name (the private header it includes, else itself)."""
    unit = {}
    for path in (SOURCE_ROOT / "src").rglob("*.c"):
        private = re.findall(r'^#include "(\w+_int)\.h"', path.read_text(errors="replace"),
                             re.M)
        unit[path.stem] = private[0] if private else path.stem
    return unit


def call_graph(build):
    unit = units()
    defined, needs = {}, collections.defaultdict(set)
    objs = [o for o in (build / "src").rglob("*.c.o")]
    assert objs, f"no objects under {build / 'src'}"
    for obj in objs:
        stem = obj.name[:-len(".c.o")]
        out = subprocess.run(["nm", str(obj)], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defined[f[2]] = unit.get(stem, stem)
            elif len(f) == 2 and f[0] == "U":
                needs[unit.get(stem, stem)].add(f[1])
    graph = collections.defaultdict(set)
    for u, syms in needs.items():
        for s in syms:
            if s in defined and defined[s] != u:
                graph[u].add(defined[s])
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


def test_no_circle_of_calls():
    require_binary(SLUICED, "SLUICED")
    build = Path(SLUICED).parents[2]  # build/src/daemon/sluiced
    found = circles(call_graph(build))
    assert not found, "units that call each other in a circle: %s" % found


def test_the_check_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
