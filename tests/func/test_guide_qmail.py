"""doc/QMAIL.md, followed as written: sluice in qmail-remote's place.

qmail is not packaged for Debian 12, so the test plays qmail-rspawn: it runs the guide's
install commands in a private copy of /var/qmail/bin (holding a stand-in for the
original qmail-remote), then calls the installed `qmail-remote host sender recip...`
with the message on standard input and standard error on the same descriptor as
standard output, as qmail-rspawn does, and checks the reports byte for byte against
qmail-remote(8): per recipient r, h or s (with text), then K, Z or D, each ending in a
NUL byte, exit status 0.  Accepted mail must then really be in sluice's queue and be
delivered by the guide's route to a test smarthost.

The only changes made to the guide's blocks are the substitutions of SUBST below: the
installation's paths become the test's private ones, and the smarthost's address is
the test smarthost's.  tests/func/test_inject.py covers the injector's corner cases
(dot lines, double bounces, misuse); this file covers the guide.
"""

import json
import os
import subprocess

import pytest

import guide
from peers import queuefile
from conftest import SLUICE, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)

GUIDE = "QMAIL.md"


def subst(sh, s=None, qmail_bin=None):
    """The substitution table: (text in the guide, text in the test)."""
    t = guide.SLUICED_PATHS + [("[192.0.2.25]:25", sh.relayhost)]
    if s is not None:
        t += [("/var/qmail/bin", str(qmail_bin)), ("/usr/bin/sluice", SLUICE),
              ("/etc/sluice/sluice.conf", str(s.config))]
    return t


REAL = ("/run/sluice", "/var/spool/sluice", "/var/lib/sluice", "192.0.2.25",
        "/var/qmail", "/usr/bin/sluice", "/etc/sluice")


@pytest.fixture
def setup(sluiced, smarthost, workdir):  # noqa: F811
    """sluiced on the guide's configuration, qmail's bin directory with the guide's
    install done.  Returns (sluiced, smarthost, qmail_bin, table)."""
    require_binary(SLUICE, "SLUICE")
    sh = smarthost()
    s = sluiced(guide.follow(GUIDE, "sluice.conf", "qmail", subst(sh), REAL))
    qmail_bin = workdir / "qmail" / "bin"
    qmail_bin.mkdir(parents=True)
    original = qmail_bin / "qmail-remote"
    original.write_text("#!/bin/sh\necho 'Zthe original qmail-remote ran'\n")
    original.chmod(0o755)
    table = subst(sh, s, qmail_bin)
    guide.run_sh(guide.follow(GUIDE, "sh", "qmail-install", table, REAL))
    return s, sh, qmail_bin, table


def qmail_remote(qmail_bin, *args, data):
    """As qmail-rspawn runs it: stdout and stderr on one pipe, a clean environment."""
    env = {"PATH": "/usr/bin:/bin"}
    res = subprocess.run([str(qmail_bin / "qmail-remote"), *args], input=data,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         timeout=60)
    assert res.returncode == 0, res
    return res.stdout


def queued(s):
    return queuefile.messages(s.dir / "queue")


def test_install_keeps_the_original(setup):
    s, sh, qmail_bin, table = setup
    assert (qmail_bin / "qmail-remote.orig").read_text().startswith("#!/bin/sh\necho 'Z")
    assert os.access(qmail_bin / "qmail-remote", os.X_OK)


def test_accepted_message_is_queued_then_delivered_by_the_route(setup):
    s, sh, qmail_bin, table = setup
    data = b"Received: (qmail 4242 invoked by uid 1000)\nFrom: a@example.org\n" \
           b"Subject: via qmail\n\nHello.\n.\n"
    out = qmail_remote(qmail_bin, "example.net", "a@example.org", "r1@example.net",
                       "r2@example.com", data=data)
    host = f"unix:{s.dir}/intake.sock"
    prefix = b"r\0r\0K" + f"{host} accepted message.\nRemote host said: 250 2.0.0 Ok: " \
                          f"queued as ".encode()
    assert out.startswith(prefix) and out.endswith(b"\n\0") and out.count(b"\0") == 3, out
    qid = out[len(prefix):-2].decode()

    msgs = sh.wait_accepted(1, timeout=30)
    m = msgs[0]
    assert m.sender == "a@example.org"
    assert sorted(m.rcpts) == ["r1@example.net", "r2@example.com"]
    # what qmail stored, in CRLF, dot-stuffing undone by the smarthost: nothing added
    # but the Received: line of sluice's intake
    assert m.content.endswith(data.replace(b"\n", b"\r\n")), m.content
    # the queue ID qmail logged is the one sluice queued and delivered
    assert f" id {qid}".encode() in m.content.split(b"\r\n\r\n")[0], m.content
    # delivered: the lane of the guide's route counts it, and the queue is empty
    def lane_delivered():
        lanes = json.loads(s.cli("lanes", "--json").stdout)
        return [l for l in lanes if l["lane"] == "isp" and l["delivered"] == 2]
    wait_until(lane_delivered, 20, "lane isp to count 2 recipients delivered")
    wait_until(lambda: queued(s) == [], 20, "the queue to be empty")


def test_recipient_refused_by_the_intake_is_h(setup):
    s, sh, qmail_bin, table = setup
    out = qmail_remote(qmail_bin, "example.net", "a@example.org", "ok@example.net",
                       "bad@example..net", data=b"Subject: x\n\nx\n")
    host = f"unix:{s.dir}/intake.sock"
    reports = out.split(b"\0")
    assert reports[-1] == b"" and len(reports) == 4, out
    assert reports[0] == b"r"
    assert reports[1].startswith(f"h{host} does not like recipient.\nRemote host said: "
                                 "501 5.1.3 ".encode()) and reports[1].endswith(b"\n")
    assert reports[2].startswith(b"K")
    # only the accepted recipient is queued and delivered
    msgs = sh.wait_accepted(1, timeout=30)
    assert list(msgs[0].rcpts) == ["ok@example.net"]


def test_sluiced_down_is_temporary_and_nothing_is_queued(setup):
    s, sh, qmail_bin, table = setup
    assert s.stop() == 0
    out = qmail_remote(qmail_bin, "example.net", "a@example.org", "r@example.net",
                       data=b"Subject: x\n\nx\n")
    assert out.startswith(b"ZSorry, I wasn't able to establish an SMTP connection to the "
                          b"sluice intake (") and out.endswith(b"(#4.4.1)\n\0"), out
    assert out.count(b"\0") == 1    # no recipient report: qmail retries them all
    assert queued(s) == []
    assert sh.accepted() == []


def test_going_back_restores_qmail_remote(setup):
    s, sh, qmail_bin, table = setup
    guide.run_sh(guide.follow(GUIDE, "sh", "qmail-uninstall", table, REAL))
    out = qmail_remote(qmail_bin, "example.net", "a@example.org", "r@example.net",
                       data=b"x\n")
    assert out == b"Zthe original qmail-remote ran\n"
    assert not (qmail_bin / "qmail-remote.orig").exists()
