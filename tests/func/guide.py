"""Read the code blocks of sluice's guides (doc/*.md) so that tests can run them as written.

A guide marks each block a test runs with the fence's info string: the kind of text
first (what the block is: a file such as ``main.cf``, ``sluice.conf``, ``sendmail.mc``,
or ``sh`` for commands), then a name for the step, e.g.::

    ```main.cf milter
    smtpd_milters = unix:sluice/milter.sock
    ```

Renderers show the first word as the language and ignore the rest.  ``block(guide,
kind, name)`` returns the text of the one block with that kind and name; a guide that
lost a block, or holds it twice, fails the test that follows it.

The only changes a test may make to a block are the substitutions it lists in a table
(``substitute(text, table)``): paths and ports of the real installation replaced by the
test's private ones.  Each substitution must apply, so that a guide that changes a path
without its test fails instead of silently running something else.
"""

import pathlib
import re
import smtplib
import subprocess

DOC = pathlib.Path(__file__).resolve().parent.parent.parent / "doc"

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(guide):
    """Every fenced block of doc/GUIDE as (kind, name, text)."""
    text = (DOC / guide).read_text()
    found = []
    for m in FENCE.finditer(text):
        words = m.group(1).split()
        kind = words[0] if words else ""
        name = " ".join(words[1:])
        found.append((kind, name, m.group(2)))
    return found


def block(guide, kind, name=""):
    """The text of the one block of doc/GUIDE whose info string is `kind name`."""
    hits = [t for k, n, t in blocks(guide) if k == kind and n == name]
    assert len(hits) == 1, (f"doc/{guide} has {len(hits)} blocks marked "
                            f"```{kind} {name}``` (expected exactly one)")
    return hits[0]


def substitute(text, table):
    """Apply (old, new) pairs in order; each old must occur in text."""
    for old, new in table:
        assert old in text, f"substitution {old!r} does not apply to:\n{text}"
        text = text.replace(old, new)
    return text


# sluiced's paths in a guide, as the `sluiced` fixture of conftest.py takes them: @DIR@ is
# the instance's own directory.  The configuration goes to the fixture whole, so that
# what the fixture adds to every configuration it starts applies to the guides' too.
SLUICED_PATHS = [("/run/sluice", "@DIR@"), ("/var/spool/sluice", "@DIR@/queue"),
                 ("/var/lib/sluice", "@DIR@")]


def follow(guide, kind, name, table, real=()):
    """The guide's block with the substitutions of table that apply to it; none of the
    strings of `real` (the paths and ports of a real installation) may be left in it."""
    text = block(guide, kind, name)
    text = substitute(text, [(old, new) for old, new in table if old in text])
    for r in real:
        assert r not in text, f"```{kind} {name}``` of doc/{guide}: {r} is left after " \
                              "the substitutions (the guide changed: follow it in the test)"
    return text


def main_cf(text):
    """A main.cf block as a dict (continuation lines joined, comments dropped)."""
    params = {}
    key = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t" and key:
            params[key] += " " + line.strip()
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        params[key] = value.strip()
    return params


def run_sh(text, env=None, cwd=None, timeout=60):
    """Run a ```sh block with `sh -e`, failing with its output if a command fails."""
    res = subprocess.run(["/bin/sh", "-ex"], input=text, capture_output=True, text=True,
                         env=env, cwd=cwd, timeout=timeout)
    assert res.returncode == 0, (f"the guide's commands failed (exit {res.returncode}):\n"
                                 f"{text}\n--- output ---\n{res.stdout}{res.stderr}")
    return res


def send(port, sender, rcpts, data, helo="client.example.org"):
    """One SMTP transaction to 127.0.0.1:port, as a client of the guide's MTA would make
    it: every RCPT tried, DATA when one was accepted.  Returns (accepted, refused) with
    refused a dict rcpt -> (code, text)."""
    accepted, refused = [], {}
    with smtplib.SMTP("127.0.0.1", port, timeout=60) as c:
        c.ehlo(helo)
        code, text = c.mail(sender)
        assert code == 250, (code, text)
        for r in rcpts:
            code, text = c.rcpt(r)
            if code == 250:
                accepted.append(r)
            else:
                refused[r] = (code, text.decode())
        if accepted:
            code, text = c.data(data)
            assert code == 250, (code, text)
    return accepted, refused
