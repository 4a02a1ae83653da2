#!/usr/bin/python3
"""Assemble a Redis Lua script from its source and shared helpers: lua_include.py OUT IN LIBDIR

Redis runs a script as one self-contained text (EVAL has no require), so a helper used by
several scripts is kept once in LIBDIR and copied in at build time: each line of IN that
reads `--@include NAME.lua` is replaced by the text of LIBDIR/NAME.lua.  Each helper goes
in at most once per script; helpers include no others.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^--@include ([A-Za-z0-9_]+\.lua)\s*$')


def main() -> None:
    out, src, libdir = sys.argv[1:4]
    seen = set()
    parts = []
    with open(src, encoding='utf-8') as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                parts.append(line)
                continue
            name = m.group(1)
            if name in seen:
                sys.exit('%s:%d: %s included twice' % (src, lineno, name))
            seen.add(name)
            with open(os.path.join(libdir, name), encoding='utf-8') as lib:
                text = lib.read()
            if re.search(r'^--@include', text, re.M):
                sys.exit('%s: helpers include no others' % name)
            parts.append(text if text.endswith('\n') else text + '\n')
    with open(out, 'w', encoding='utf-8') as f:
        f.write(''.join(parts))


main()
