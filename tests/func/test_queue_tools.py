"""The queue tools at depth (sluice(1), "queue"): a listing that streams, selections,
actions on a selection, the summary, each recipient's next attempt and last reply.

sluiced relays through the test smarthost (peers/smarthost.py), which answers every RCPT with
``451 4.3.0 Temporary local problem`` (as Postfix's ``smtp-sink -r rcpt``): the mail
queued through the intake to a few domains is deferred, with its retry an hour away.
Then each selector lists what it should, the JSON lines parse, IDs come on the input,
hold/release/flush/delete act on a selection and say how many, and the summary counts
per domain and age.  A queue of 20,000 messages, written straight into the queue
directory, is listed in parts of the control protocol (``more LEN``).
"""

import json
import re
import socket
import subprocess
import time

import pytest

from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_queue_load import fill
from test_relay import relay_config, send

SENDS = [  # (sender, recipients): 8 messages, 8 recipients
    ("list@example.org", ["a1@example.com"]),
    ("list@example.org", ["a2@example.com"]),
    ("list@example.org", ["a3@example.com"]),
    ("list@example.org", ["b1@sub.example.com"]),
    ("list@example.org", ["b2@sub.example.com"]),
    ("list@example.org", ["c1@other.org"]),
    ("list@example.org", ["c2@other.org"]),
    ("bob@example.net", ["d1@example.com"]),
]


@pytest.fixture
def deferred(sluiced, smarthost):
    """sluiced with 8 messages deferred by a smarthost that answers 451 to every RCPT."""
    require_binary(SLUICE, "SLUICE")

    def factory(sends=SENDS):
        sh = smarthost(rcpt_tempfail_p=1.0)
        port = free_port()
        conf = relay_config(port, sh.port, route='tls = "none";')
        sd = sluiced(conf.replace("retry { min = 1s; max = 2s; }",
                                  "retry { min = 1h; max = 2h; }"))
        for sender, rcpts in sends:
            send(port, rcpts, sender=sender)
        want = sum(len(r) for _, r in sends)
        wait_until(lambda: sum(r["attempts"] >= 1 for m in listing(sd)
                               for r in m["recipients"]) == want, 30,
                   "every recipient tried once")
        return sd, sh, port

    return factory


def listing(sd, *args):
    """`sluice queue --json ARGS`: one object a line."""
    out = sd.cli("queue", *args, "--json").stdout
    return [json.loads(line) for line in out.splitlines()]


def ids_of(sd, *args):
    return [m["id"] for m in listing(sd, *args)]


def cli_input(sd, text, *args, check=True):
    res = subprocess.run([SLUICE, "-s", sd.control_socket, *args], input=text,
                         capture_output=True, text=True, timeout=60)
    if check:
        assert res.returncode == 0, (args, res.returncode, res.stdout, res.stderr)
    return res


def test_selections_actions_and_summary(deferred):
    sd, sh, port = deferred()
    now_us = time.time() * 1e6
    msgs = listing(sd)
    assert len(msgs) == 8
    for m in msgs:
        assert set(m) >= {"id", "size", "arrival", "arrival_us", "held", "sender", "recipients"}
        (r,) = m["recipients"]
        assert r["status"] == "T" and r["attempts"] == 1, r
        assert r["next_attempt_us"] > now_us + 50 * 60 * 1e6, r
        assert r["last_reply"].startswith("451 4.3.0"), r
    by_addr = {m["recipients"][0]["address"]: m["id"] for m in msgs}

    # text: a line per recipient with its state and its last reply
    text = sd.cli("queue").stdout
    assert re.search(r"^    T <a1@example\.com>  deferred: next attempt in (\d+m\d\ds|1h\d\dm), "
                     r"1 attempt$", text, re.M), text
    assert "        last reply: 451 4.3.0" in text, text
    assert re.search(r"^-- 8 messages, 8 recipients, \d+ bytes\n\Z", text, re.M), text
    show = sd.cli("queue", "show", by_addr["c1@other.org"]).stdout
    assert re.search(r"T <c1@other\.org>  deferred: next attempt in \S+, 1 attempt\n"
                     r"      last reply: 451 4\.3\.0", show), show
    js = json.loads(sd.cli("queue", "show", by_addr["c1@other.org"], "--json").stdout)
    assert js["recipients"][0]["attempts"] == 1 and \
        js["recipients"][0]["last_reply"].startswith("451 4.3.0"), js

    # each selector
    def rcpts(*args):
        return sorted(m["recipients"][0]["address"] for m in listing(sd, *args))

    assert rcpts("--domain", "example.com") == ["a1@example.com", "a2@example.com",
                                                 "a3@example.com", "d1@example.com"]
    assert rcpts("--domain", ".example.com") == ["b1@sub.example.com", "b2@sub.example.com"]
    assert rcpts("--domain", "OTHER.org") == ["c1@other.org", "c2@other.org"]
    assert rcpts("--sender", "@example.net") == ["d1@example.com"]
    assert rcpts("--sender", "bob@example.net") == ["d1@example.com"]
    assert len(rcpts("--sender", "list@example.org")) == 7
    assert rcpts("--sender", "<>") == []
    assert len(rcpts("--state", "deferred")) == 8
    assert rcpts("--state", "todo") == [] and rcpts("--state", "held") == []
    assert rcpts("--state", "uncertain") == []
    assert rcpts("--older-than", "1h") == []
    time.sleep(1.1)
    assert len(rcpts("--older-than", "1s")) == 8
    assert rcpts("--domain", "example.com", "--sender", "@example.net",
                 "--state", "deferred") == ["d1@example.com"]
    res = sd.cli("queue", "--state", "frozen", check=False)
    assert res.returncode == 1 and "expected deferred, todo, held or uncertain" in res.stderr
    res = sd.cli("queue", "--older-than", "soon", check=False)
    assert res.returncode == 1 and "expected a duration" in res.stderr
    text = sd.cli("queue", "--domain", "other.org").stdout
    assert "-- 2 messages, 2 recipients" in text, text
    assert "-- 0 messages" in sd.cli("queue", "--domain", "none.test").stdout

    # IDs on the input, one a line; one that is not in the queue
    pick = [by_addr["a2@example.com"], by_addr["c2@other.org"]]
    res = cli_input(sd, "\n".join(pick + ["0000000000000000"]) + "\n", "queue", "-", "--json",
                    check=False)
    assert res.returncode == 1
    assert sorted(json.loads(l)["id"] for l in res.stdout.splitlines()) == sorted(pick)
    res = cli_input(sd, "\n".join(pick) + "\n", "queue", "list", "-")
    assert "-- 2 messages, 2 recipients" in res.stdout and pick[0] in res.stdout, res.stdout

    # actions on a selection: counts, and the state they leave
    res = sd.cli("queue", "hold", "--domain", "other.org")
    assert res.stdout == "2 messages held\n", res.stdout
    assert sorted(ids_of(sd, "--state", "held")) == sorted(
        [by_addr["c1@other.org"], by_addr["c2@other.org"]])
    assert sd.stats()["queue"]["held"] == 2
    js = json.loads(sd.cli("queue", "release", "--state", "held", "--json").stdout)
    assert js == {"selected": 2, "done": 2, "failed": 0, "missing": 0}, js
    assert ids_of(sd, "--state", "held") == []
    res = cli_input(sd, by_addr["b1@sub.example.com"] + "\n", "queue", "hold", "-")
    assert res.stdout == "1 message held\n", res.stdout
    sd.cli("queue", "release", "--all")
    res = sd.cli("queue", "flush", "--domain", "example.com", "--sender", "@example.org")
    assert res.stdout == "3 messages eligible for delivery now\n", res.stdout
    # the three are tried again at once (and deferred again); the others wait
    wait_until(lambda: all(m["recipients"][0]["attempts"] == 2
                           for m in listing(sd, "--domain", "example.com",
                                            "--sender", "@example.org")), 20,
               "the flushed recipients tried again")
    assert all(m["recipients"][0]["attempts"] == 1 for m in listing(sd, "--domain", "other.org"))

    # the summary: recipients by domain and age (all under 5 minutes)
    text = sd.cli("queue", "summary").stdout
    lines = text.splitlines()
    assert lines[0].split() == ["T", "5m", "10m", "20m", "40m", "80m", "160m", "320m", "640m",
                                "1280m", "1280m+"], text
    rows = {l.split()[0]: [int(x) for x in l.split()[1:]] for l in lines[1:]}
    assert rows["example.com"] == [4, 4] + [0] * 9, text
    assert rows["sub.example.com"][:2] == [2, 2] and rows["other.org"][:2] == [2, 2], text
    assert rows["TOTAL"] == [8, 8] + [0] * 9 and lines[-1].split()[0] == "TOTAL", text
    js = json.loads(sd.cli("queue", "summary", "--json").stdout)
    assert js["buckets"][0] == "5m" and js["buckets"][-1] == "1280m+"
    assert [(d["domain"], d["total"]) for d in js["domains"]] == [
        ("example.com", 4), ("other.org", 2), ("sub.example.com", 2)], js
    assert js["total"]["total"] == 8 and js["total"]["counts"][0] == 8
    js = json.loads(sd.cli("queue", "summary", "--by", "sender", "--json").stdout)
    assert {d["domain"]: d["total"] for d in js["domains"]} == {"example.org": 7,
                                                                 "example.net": 1}, js
    js = json.loads(sd.cli("queue", "summary", "--state", "deferred", "--domain",
                           "other.org", "--json").stdout)
    assert js["total"]["total"] == 2, js

    # delete: IDs from the input
    res = cli_input(sd, "\n".join(pick) + "\n", "queue", "delete", "-")
    assert res.stdout == "2 messages deleted\n", res.stdout
    assert len(listing(sd)) == 6
    res = sd.cli("queue", "delete", "--domain", "nowhere.test")
    assert res.stdout == "0 messages deleted\n", res.stdout
    assert sh.accepted() == []


def test_bounce_sends_a_dsn(deferred):
    sd, sh, port = deferred(sends=[("owner@example.org", ["x1@gone.example"]),
                                   ("owner@example.org", ["x2@gone.example"]),
                                   ("keep@example.org", ["y@stays.example"])])
    # the DSNs (and only they: the others wait an hour) go out; before the bounce, which
    # queues and sends them at once
    sh._rcpt_tempfail_p = 0.0
    res = sd.cli("queue", "bounce", "--domain", "gone.example")
    assert res.stdout == "2 messages returned to the sender\n", res.stdout
    # one DSN per message, as for any bounce
    wait_until(lambda: len([m for m in sh.accepted() if m.sender == ""]) >= 2, 15, "the DSNs")
    dsns = [m for m in sh.accepted() if m.sender == ""]
    assert len(dsns) == 2, dsns
    assert all(d.rcpts == ("owner@example.org",) for d in dsns), [d.rcpts for d in dsns]
    bodies = [d.content.decode(errors="replace") for d in dsns]
    for body in bodies:
        assert "5.0.0" in body and "returned by the administrator" in body, body
    assert sorted(a for a in ("x1@gone.example", "x2@gone.example")
                  for body in bodies if a in body) == ["x1@gone.example", "x2@gone.example"]
    wait_until(lambda: [m["recipients"][0]["address"] for m in listing(sd)
                        if m["sender"]] == ["y@stays.example"], 10, "the bounced ones gone")


def frames(sock_path, request):
    """The frames of one reply, read off the control socket: [(kind, body)]."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    s.sendall(request.encode() + b"\n")
    data, out = b"", []
    while True:
        while b"\n" not in data:
            chunk = s.recv(1 << 16)
            assert chunk, "closed in the middle of a reply"
            data += chunk
        head, data = data.split(b"\n", 1)
        kind, n = head.decode().split()
        while len(data) < int(n):
            chunk = s.recv(1 << 20)
            assert chunk
            data += chunk
        out.append((kind, data[:int(n)]))
        data = data[int(n):]
        if kind != "more":
            s.close()
            return out


def test_a_listing_of_20000_streams(sluiced):
    require_binary(SLUICE, "SLUICE")
    sd = sluiced("\n".join([
        "workers = 2;", "stats_interval = 0;", 'state_dir = "@DIR@";',
        'log { target = "stderr"; level = "info"; }',
        'control { listen = "unix:@DIR@/control.sock"; }',
        f'intake {{ listen = "inet:127.0.0.1:{free_port()}"; hostname = "mx.sluice.test"; }}',
        'queue { dir = "@DIR@/queue"; }', ""]), start=False)
    (sd.dir / "queue").mkdir(mode=0o700)
    ids = fill(sd.dir / "queue", 20000)
    sd.start()
    wait_until(lambda: '"loading":false' in sd.cli("status", "--json").stdout, 30,
               "the queue loaded")

    # the protocol: parts of at most 64 KiB each, then the last frame
    fr = frames(sd.control_socket, "queue")
    assert len(fr) > 10 and all(k == "more" for k, _ in fr[:-1]) and fr[-1][0] == "ok"
    assert max(len(b) for _, b in fr) < 200 * 1024
    text = b"".join(b for _, b in fr).decode()
    assert text.endswith("-- 20000 messages, 20000 recipients, %d bytes\n"
                         % (20000 * (len(b"Subject: deep queue\r\n\r\n")
                                     + 20 * len(b"line of the body\r\n"))))
    listed = re.findall(r"^([0-9A-Z]{16})[ !] ", text, re.M)
    assert listed == ids

    # the command: text and JSON lines
    out = sd.cli("queue", timeout=60).stdout
    assert out == text
    lines = sd.cli("queue", "--json", timeout=60).stdout.splitlines()
    assert [json.loads(l)["id"] for l in lines] == ids
    # IDs on the input: several requests, one total
    res = cli_input(sd, "\n".join(ids[::2]) + "\n", "queue", "-")
    assert res.stdout.count("queue id (! held)") == 1
    assert res.stdout.endswith("-- 10000 messages, 10000 recipients, %d bytes\n"
                               % (10000 * (len(b"Subject: deep queue\r\n\r\n")
                                           + 20 * len(b"line of the body\r\n"))))
    assert re.findall(r"^([0-9A-Z]{16})[ !] ", res.stdout, re.M) == ids[::2]
    # selections walk the index daemon-side
    assert sd.cli("queue", "flush", "--all").stdout == "20000 messages eligible for delivery now\n"
    assert sd.cli("queue", "flush", "--older-than", "2h").stdout == \
        "0 messages eligible for delivery now\n"
    js = json.loads(sd.cli("queue", "summary", "--json").stdout)
    assert js["domains"] == [{"domain": "example.org", "total": 20000,
                              "counts": [0, 0, 0, 0, 20000, 0, 0, 0, 0, 0]}], js
