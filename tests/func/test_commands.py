"""The control commands, their help and sluice(1) come from one table.

`sluice --help` prints the table of src/proto/control_cmds.c; the daemon dispatches on
it and refuses to start if a row has no handler.  These tests hold the manual to the
table: every form of a command that `sluice --help` lists has its entry in sluice(1)'s
COMMANDS (or, for the injectors, its section under INJECTORS), and the manual documents
no form the table lacks.  A running daemon's `help` lists the same forms.
"""

import re
import subprocess

from conftest import SLUICE, SOURCE_ROOT, milter_config, require_binary

MAN = SOURCE_ROOT / "doc/sluice.1.scd"
SUB = re.compile(r"^[a-z]+(\|[a-z]+)*$")


def forms_of_help(text):
    """{(name, sub)} of the lines "  name [sub] args" of a help text."""
    forms = set()
    for line in text.splitlines():
        m = re.match(r"^  (\S.*)$", line)
        if not m:
            continue
        words = m.group(1).split()
        sub = words[1] if len(words) > 1 and SUB.match(words[1]) else None
        forms.add((words[0], sub))
    return forms


def forms_of_man():
    """{(name, sub)} of the term lines of sluice(1)'s COMMANDS, and its INJECTORS."""
    text = MAN.read_text()
    commands = text.split("\n# COMMANDS\n", 1)[1].split("\n# ", 1)[0]
    forms = set()
    for line in commands.splitlines():
        m = re.match(r"^\*([a-z][a-z -]*)\*((?:\|\*[a-z]+\*)*)( \[\*([a-z]+)\*\])?", line)
        if not m:
            continue
        words = m.group(1).split()
        alts = re.findall(r"\|\*([a-z]+)\*", m.group(2))
        sub = words[1] if len(words) > 1 else m.group(4)
        if alts:
            sub = "|".join([sub] + alts)
        forms.add((words[0], sub))
    injectors = text.split("\n# INJECTORS\n", 1)[1].split("\n# ", 1)[0]
    for name in re.findall(r"^## ([a-z-]+)$", injectors, re.M):
        forms.add((name, None))
    return forms


def sluice_help():
    require_binary(SLUICE, "SLUICE")
    res = subprocess.run([SLUICE, "--help"], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    return res.stdout.split("\ncommands:\n", 1)[1].split("\noptions:\n", 1)[0]


def test_every_command_is_in_the_manual():
    table = forms_of_help(sluice_help())
    assert ("queue", "hold|release|delete|flush|bounce") in table
    assert ("sendmail", None) in table
    man = forms_of_man()
    assert not table - man, f"in the table, not in sluice(1): {sorted(table - man, key=str)}"


def test_the_manual_documents_no_other_command():
    table = forms_of_help(sluice_help())
    man = forms_of_man() - {("installing", None), ("finding", None)}
    assert not man - table, f"in sluice(1), not in the table: {sorted(man - table, key=str)}"


def test_the_check_reads_the_manual_as_written():
    # the parser itself: a form the manual writes in each of its styles
    assert forms_of_help("  limits show KEY [RULE]\n        a key\n  top [-n S]\n") == \
        {("limits", "show"), ("top", None)}
    man = forms_of_man()
    for form in [("queue", "list"), ("limits", "reset"), ("stats", None), ("help", None),
                 ("lanes", "suspend"), ("qmail-remote", None)]:
        assert form in man, form


def test_the_daemon_lists_the_same_commands(sluiced):
    """The daemon's `help` reply is the table's rows but the injectors, run by sluice."""
    table = forms_of_help(sluice_help())
    s = sluiced(milter_config())
    reply = s.cli("help").stdout
    assert forms_of_help(reply) == {f for f in table if f[0] not in ("sendmail", "qmail-remote")}
