"""sluiced as the milter of a real, private Postfix instance, driven by swaks and
smtp-source.  Postfix relays every accepted message to a local smtp-sink that dumps it,
so a test sees what Postfix finally delivered (headers, envelope, body).

Where a test expects Postfix to refuse something, it also checks that the refusal came
from sluiced's answer ("milter-reject" in Postfix's log, the right SMTP stage) and not
from milter_default_action, which is what Postfix applies when the milter is broken.
"""

import re
import shutil
import time

import pytest

from conftest import (all_stages, free_port, milter_config, modify_all, queued_id,
                      wait_until)

FROM = "sender@sluice.test"
TO = "rcpt@example.net"


@pytest.fixture(autouse=True)
def _need_tools():
    for tool in ("swaks", "smtp-source", "postfix"):
        if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin"):
            pytest.skip(f"{tool} is not installed")


def start(sluiced, postfix, **config):
    s = sluiced(milter_config(**config))
    pf = postfix(milter=f"unix:{s.milter_socket}")
    return s, pf


def send(pf, *extra, to=TO, subject="sluice test", body="Hello from swaks.\n"):
    return pf.swaks("--from", FROM, "--to", to, "--h-Subject", subject, "--body", body,
                    *extra)


def transcript(res, pf, s=None):
    out = f"--- swaks (exit {res.returncode}) ---\n{res.stdout}{res.stderr}" \
          f"--- Postfix maillog ---\n{pf.maillog.tail(30)}"
    if s is not None:
        out += f"\n--- sluiced log ---\n{s.log.tail(20)}"
    return out


def replies_to(res, command):
    """The server's reply lines to the first client line starting with `command`, from a
    swaks transcript (client lines start " -> ", replies "<- " or "<** ")."""
    lines = res.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(" -> ") and line[4:].upper().startswith(command.upper()):
            out = []
            for reply in lines[i + 1:]:
                if reply.startswith("<-") or reply.startswith("<**"):
                    out.append(reply.split(" ", 1)[1].strip() if " " in reply else "")
                elif reply.startswith(" -> ") or reply.startswith("=== "):
                    break
            return out
    return None


def no_milter_trouble(pf):
    """Postfix had no problem talking to the milter (no failure, no fallback)."""
    bad = pf.maillog.findall(r"^.*warning: .*milter.*$", flags=re.I)
    assert not bad, "Postfix reported milter trouble:\n" + "\n".join(bad)


def test_default_configuration_accepts_and_delivers(sluiced, postfix):
    s, pf = start(sluiced, postfix)
    res = send(pf)
    qid = queued_id(res.stdout)
    assert res.returncode == 0 and qid, transcript(res, pf, s)
    line = pf.wait_delivered(qid)
    assert "relay=127.0.0.1" in line
    msg = pf.wait_sink_messages(1)[0]
    assert "Subject: sluice test" in msg and "Hello from swaks." in msg
    no_milter_trouble(pf)
    st = s.milter_stats()
    assert st["connections"] >= 1, f"Postfix never used the milter: {st}"
    assert st["protocol_errors"] == 0, st


def test_rcpt_tempfail(sluiced, postfix):
    s, pf = start(sluiced, postfix, reply={"rcpt": "tempfail"})
    res = send(pf)
    assert replies_to(res, "MAIL FROM")[0].startswith("250"), transcript(res, pf, s)
    rcpt = replies_to(res, "RCPT TO")
    assert rcpt and rcpt[0].startswith("451 4.7.1"), transcript(res, pf, s)
    assert queued_id(res.stdout) is None
    pf.maillog.wait_for(r"milter-reject: RCPT from .*: 451 4\.7\.1")
    no_milter_trouble(pf)


def test_rcpt_reply_text(sluiced, postfix):
    s, pf = start(sluiced, postfix, reply={"rcpt": "550 5.7.1 No thanks"})
    res = send(pf)
    assert replies_to(res, "RCPT TO") == ["550 5.7.1 No thanks"], transcript(res, pf, s)
    assert queued_id(res.stdout) is None
    no_milter_trouble(pf)


def test_rcpt_multiline_reply_text(sluiced, postfix):
    s, pf = start(sluiced, postfix,
                  reply={"rcpt": "550-5.7.1 first line\n550 5.7.1 second line"})
    res = send(pf)
    assert replies_to(res, "RCPT TO") == ["550-5.7.1 first line", "550 5.7.1 second line"], \
        transcript(res, pf, s)
    no_milter_trouble(pf)


def test_reject_at_connect(sluiced, postfix):
    s, pf = start(sluiced, postfix, reply={"connect": "reject"})
    res = send(pf)
    assert re.search(r"^<\*\* +55[04] ", res.stdout, re.M), transcript(res, pf, s)
    assert queued_id(res.stdout) is None
    pf.maillog.wait_for(r"milter-reject: CONNECT from")
    no_milter_trouble(pf)


def test_reply_text_at_end_of_message(sluiced, postfix):
    s, pf = start(sluiced, postfix, reply={"eom": "554 5.7.1 Refused by sluice"})
    res = send(pf)
    assert replies_to(res, "RCPT TO")[0].startswith("250")
    assert replies_to(res, ".") == ["554 5.7.1 Refused by sluice"], transcript(res, pf, s)
    assert queued_id(res.stdout) is None
    no_milter_trouble(pf)


def test_discard_at_mail(sluiced, postfix):
    s, pf = start(sluiced, postfix, reply={"mail": "discard"})
    res = send(pf)
    qid = queued_id(res.stdout)
    assert qid, "a discarded message is still accepted: " + transcript(res, pf, s)
    pf.maillog.wait_for(r"milter-discard: MAIL from .*milter triggers DISCARD action")
    time.sleep(1)
    assert pf.queue() == [] and pf.sink_messages() == []
    no_milter_trouble(pf)


def test_modifications_reach_the_delivered_message(sluiced, postfix):
    modify = dict(modify_all(), replace_body="Replaced body.\r\nSecond line.\r\n")
    del modify["quarantine"]
    s, pf = start(sluiced, postfix, modify=modify)
    res = send(pf, to=f"{TO},c@example.org", subject="old", body="Original body.\n")
    qid = queued_id(res.stdout)
    assert qid, transcript(res, pf, s)
    pf.maillog.wait_for(rf"{qid}: removed", timeout=60)
    msgs = pf.sink_messages()
    assert msgs, transcript(res, pf, s)
    envelope = "\n".join(l for m in msgs for l in m.splitlines() if l.startswith("X-"))
    rcpts = re.findall(r"^X-Rcpt-Args: (.*)$", envelope, re.M)
    assert re.findall(r"^X-Mail-Args: <([^>]*)>", envelope, re.M) == ["new@example.org"] * len(msgs)
    got = sorted(r.split()[0] for r in rcpts)
    assert got == ["<a@example.org>", "<b@example.org>", f"<{TO}>"], rcpts
    assert any(r.startswith("<b@example.org>") and "NOTIFY=NEVER" in r for r in rcpts), rcpts

    msg = msgs[0]
    header, _, body = msg.partition("\n\n")
    hlines = header.splitlines()
    names = [l.split(":", 1)[0] for l in hlines if not l[:1].isspace()]
    assert "X-Sluice: yes" in hlines and "X-Second: two" in hlines, header
    assert "X-First: 1" in hlines, header
    assert names.index("X-First") < names.index("Date"), "X-First was not inserted on top"
    assert "Subject: new" in hlines and "Subject: old" not in hlines, header
    assert body.startswith("Replaced body.\nSecond line.\n"), body
    assert "Original body." not in body
    no_milter_trouble(pf)


def test_quarantine_puts_the_message_on_hold(sluiced, postfix):
    s, pf = start(sluiced, postfix, modify={"quarantine": "held by sluice"})
    res = send(pf)
    qid = queued_id(res.stdout)
    assert qid, transcript(res, pf, s)
    pf.maillog.wait_for(rf"{qid}: milter-hold: END-OF-MESSAGE")
    entries = {e["queue_id"]: e for e in pf.queue()}
    assert entries.get(qid, {}).get("queue_name") == "hold", entries
    assert "*** ENVELOPE RECORDS hold/" in pf.postcat(qid)
    assert pf.sink_messages() == []
    no_milter_trouble(pf)


def test_many_messages_per_smtp_session(sluiced, postfix):
    """20 messages over 5 parallel SMTP sessions (several each), 100 KB bodies, every stage
    negotiated so headers and several BODY chunks go through sluiced."""
    s, pf = start(sluiced, postfix, reply=all_stages("continue"))
    res = pf.smtp_source("-d", "-m", "20", "-s", "5", "-l", "100000", "-M", "client.sluice.test",
                         "-f", FROM, "-t", TO)
    assert res.returncode == 0, f"smtp-source: {res.stdout}{res.stderr}\n{pf.maillog.tail()}"
    pf.wait_sink_messages(20, timeout=120)
    assert len(pf.maillog.findall(r"status=sent")) == 20
    per_session = [int(n) for n in pf.maillog.findall(r"disconnect from .* mail=(\d+)")]
    assert len(per_session) == 5 and sum(per_session) == 20, per_session
    assert max(per_session) >= 2, per_session
    no_milter_trouble(pf)
    wait_until(lambda: s.milter_stats()["sessions_current"] == 0, 20, "milter sessions to end")
    st = s.milter_stats()
    assert st["protocol_errors"] == 0, st
    assert 5 <= st["connections"] <= 10, st


def test_pipelined_transaction(sluiced, postfix):
    s, pf = start(sluiced, postfix, reply=all_stages("continue"))
    res = send(pf, "--pipeline", to=f"{TO},second@example.net")
    qid = queued_id(res.stdout)
    assert qid, transcript(res, pf, s)
    pf.wait_delivered(qid)
    no_milter_trouble(pf)


def test_stopped_milter_means_tempfail(sluiced, postfix):
    """With sluiced stopped, Postfix falls back to milter_default_action = tempfail: the
    same checks that pass above fail, so they depend on the milter."""
    s, pf = start(sluiced, postfix)
    res = send(pf)
    assert queued_id(res.stdout), transcript(res, pf, s)
    assert s.stop() == 0

    res = send(pf)
    assert queued_id(res.stdout) is None, "accepted with the milter stopped: " + \
        transcript(res, pf)
    assert re.search(r"^<\*\* +451 4\.7\.1 ", res.stdout, re.M), transcript(res, pf)
    pf.maillog.wait_for(r"warning: connect to Milter service unix:.*"
                        r"(No such file or directory|Connection refused)")


def test_older_milter_protocol_version(sluiced, postfix):
    """Postfix told to speak milter protocol 2 (no DATA, no UNKNOWN, no no-reply bits):
    sluiced negotiates down and its RCPT reply still arrives at RCPT."""
    s = sluiced(milter_config(reply=all_stages("continue", rcpt="451 4.7.1 Try later")))
    pf = postfix(milter=f"unix:{s.milter_socket}", milter_protocol="2")
    res = send(pf)
    assert replies_to(res, "RCPT TO") == ["451 4.7.1 Try later"], transcript(res, pf, s)
    no_milter_trouble(pf)


def test_milter_on_a_tcp_socket(sluiced, postfix):
    port = free_port()
    s = sluiced(milter_config(listen=f"inet:127.0.0.1:{port}",
                              modify={"add_header": ["X-Sluice: tcp"]}))
    pf = postfix(milter=f"inet:127.0.0.1:{port}")
    res = send(pf)
    qid = queued_id(res.stdout)
    assert qid, transcript(res, pf, s)
    pf.wait_delivered(qid)
    assert "X-Sluice: tcp" in pf.wait_sink_messages(1)[0]
    no_milter_trouble(pf)
