"""The example configurations of etc/examples/ pass `sluiced -t`, as shipped.

Each example is checked in a copy whose only change is its secrets directory:
/etc/sluice/ becomes a temporary directory holding the password files the example names
(`sluiced -t` reads them, as the daemon does at start and at reload).  The overrides
files are shipped beside the examples and found relative to the configuration file, as
sluice.conf(5) says, so they are copied with them unchanged.
"""

import os
import re
import shutil
import subprocess

import pytest

from conftest import SLUICED, SOURCE_ROOT, ensure_user, require_binary, sluiced_check

EXAMPLES = SOURCE_ROOT / "etc/examples"
NAMES = ["isp-smarthost.conf", "university.conf", "cluster.conf"]

# What each story needs (README.md, "Integration with an MTA"), as keys that must be set
# in its example.
STORY_KEYS = {
    "isp-smarthost.conf": [r"^route ", r"^\s*rate = ", r"^\s*tls = \"require\"",
                           r"^\s*password_file = ", r"^\s*uncertain = ", r"^\s*signal \{"],
    "university.conf": [r"^class ", r"\"\*\.example\.edu\"", r"\d+\.\d+\.\d+\.\d+/\d+",
                        r"hosts = \[\"\*\"\]", r"^\s*inbound = ", r"key = \"rcpt_domain\"",
                        r"^\s*overrides = "],
    "cluster.conf": [r"^\s*type = \"redis\"", r"^\s*on_failure = ", r"^\s*shared = true"],
}


def copy_example(name, d):
    """The example in d, its secrets under d: the one substitution of these tests."""
    text = (EXAMPLES / name).read_text()
    if "/etc/sluice/" in text:
        text = text.replace("/etc/sluice/", f"{d}/")
    for f in EXAMPLES.glob("*.limits"):
        shutil.copy(f, d / f.name)
    for secret in re.findall(rf'"{re.escape(str(d))}/([^"]+)"', text):
        (d / secret).write_text("example-secret\n")
        (d / secret).chmod(0o600)  # sluiced refuses a secret others can read
    path = d / name
    path.write_text(text)
    return path



@pytest.mark.parametrize("name", NAMES)
def test_example_passes_sluiced_t(name, workdir):
    require_binary(SLUICED, "SLUICED")
    if os.geteuid() == 0:
        ensure_user("sluice")  # the examples run sluiced as sluice
    res = sluiced_check(copy_example(name, workdir))
    assert res.returncode == 0, f"sluiced -t {name}:\n{res.stderr}"
    assert "configuration ok" in res.stdout + res.stderr


@pytest.mark.parametrize("name", NAMES)
def test_example_tells_its_story(name):
    text = (EXAMPLES / name).read_text()
    missing = [k for k in STORY_KEYS[name] if not re.search(k, text, re.M)]
    assert not missing, f"{name} lacks {missing}"


def test_a_missing_overrides_file_is_named_with_its_line(workdir):
    require_binary(SLUICED, "SLUICED")
    path = copy_example("university.conf", workdir)
    (workdir / "recipient-domain.limits").unlink()
    res = sluiced_check(path)
    line = next(i for i, l in enumerate(path.read_text().splitlines(), 1)
                if 'overrides = "recipient-domain.limits"' in l)
    assert res.returncode != 0
    assert f"university.conf:{line}:" in res.stderr and "recipient-domain.limits" in res.stderr


def test_a_missing_password_file_is_named(workdir):
    require_binary(SLUICED, "SLUICED")
    path = copy_example("isp-smarthost.conf", workdir)
    (workdir / "isp.secret").unlink()
    res = sluiced_check(path)
    assert res.returncode != 0
    assert 'route "isp".auth.password_file' in res.stderr and "isp.secret" in res.stderr


def dump(path, flag):
    return subprocess.run([SLUICED, flag, "-c", str(path)], capture_output=True, text=True,
                          timeout=30)


def test_n_prints_only_what_the_shipped_file_sets(workdir):
    """sluiced -n (as postconf -n): every block and key it writes is set in the file."""
    require_binary(SLUICED, "SLUICED")
    if os.geteuid() == 0:
        ensure_user("sluice")
    shipped = SOURCE_ROOT / "etc/sluice.conf"
    text = "\n".join(line.split("#")[0] for line in shipped.read_text().splitlines())
    res = dump(shipped, "-n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip(), "sluiced -n wrote nothing"
    for line in res.stdout.splitlines():
        m = re.match(r"^\s*([a-z_]+) (?:\{|= )", line)
        if m:
            assert re.search(rf"^\s*{m.group(1)}\s*(=|\{{)", text, re.M), \
                f"sluiced -n wrote {line!r}, which {shipped} does not set"
        else:
            assert line == "}", line
    # a default the file repeats is not written
    assert "stats_interval" not in res.stdout


@pytest.mark.parametrize("name", ["sluice.conf"] + NAMES)
def test_D_output_reads_back(name, workdir):
    """sluiced -D writes every effective setting; what it writes passes sluiced -t and
    gives the same settings again."""
    require_binary(SLUICED, "SLUICED")
    if os.geteuid() == 0:
        ensure_user("sluice")
    if name == "sluice.conf":
        path = workdir / name
        shutil.copy(SOURCE_ROOT / "etc/sluice.conf", path)
    else:
        path = copy_example(name, workdir)
    first = dump(path, "-D")
    assert first.returncode == 0, first.stderr
    again = workdir / "again.conf"
    again.write_text(first.stdout)
    again.chmod(0o600)  # an example's inline password would make it a secret
    res = sluiced_check(again)
    assert res.returncode == 0, f"sluiced -t on the output of -D {name}:\n{res.stderr}"
    second = dump(again, "-D")
    assert second.stdout == first.stdout
    for key in ["workers", "state_dir", "stats_interval", "commit_batch", "max_keys"]:
        assert re.search(rf"^\s*{key} = ", first.stdout, re.M), key


@pytest.mark.parametrize("name", ["sluice.conf"] + NAMES)
def test_D_writes_every_block(name, workdir):
    """sluiced -D and -n write every block of the file, the limit, class, route and
    provider blocks and the milter's reply {} and modify {} included, each under its name
    (what reads back the same is test_D_output_reads_back)."""
    require_binary(SLUICED, "SLUICED")
    if os.geteuid() == 0:
        ensure_user("sluice")
    if name == "sluice.conf":
        path = workdir / name
        shutil.copy(SOURCE_ROOT / "etc/sluice.conf", path)
    else:
        path = copy_example(name, workdir)
    text = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
    blocks = re.findall(r'^(limit|class|route|provider) "([^"]+)" \{', text, re.M)
    for flag in ["-D", "-n"]:
        res = dump(path, flag)
        assert res.returncode == 0, res.stderr
        for kind, label in blocks:
            assert f'{kind} "{label}" {{' in res.stdout, f"{flag} misses {kind} {label}"
    # and a fixed-reply milter's answers
    conf = workdir / "reply.conf"
    conf.write_text('milter { listen = "unix:m.sock";\n'
                    '  reply { helo = "550 5.7.1 no"; eom = accept; }\n'
                    '  modify { add_header = ["X-A: 1"]; change_from = "<a@example.org>"; }\n'
                    '}\n')
    first = dump(conf, "-D")
    assert first.returncode == 0, first.stderr
    assert re.search(r'^  reply \{\n    helo = "550 5.7.1 no";', first.stdout, re.M)
    assert re.search(r'^    change_from = "<a@example.org>";', first.stdout, re.M)
    again = workdir / "again.conf"
    again.write_text(first.stdout)
    assert sluiced_check(again).returncode == 0
    assert dump(again, "-D").stdout == first.stdout
