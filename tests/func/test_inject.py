"""The mail injectors, `sluice sendmail` and `sluice qmail-remote`, against a real sluiced.

Each test starts sluiced with an SMTP intake on a unix socket and a queue of its own, runs
the injector as programs do (through `sluice -c FILE sendmail`, through links named
`sendmail` and `qmail-remote`, through bsd-mailx's mail(1) when it is installed), and
then reads what was committed with peers/queuefile.py -- an independent reader of the queue
file format of doc/QUEUE.md -- to check the envelope (sender, recipients and their
status) and that the body is byte for byte what the injector should have made of its
input.  Exit codes are those of <sysexits.h>; qmail-remote's output is checked byte for
byte (reports ending in NUL bytes, exit 0), and also as qmail-rspawn would read it.
"""

import os
import pwd
import re
import shutil
import subprocess

import pytest

from peers import queuefile
from conftest import SLUICE, require_binary

HOST = "mx.sluice.test"

EX_OK = 0
EX_USAGE = 64
EX_DATAERR = 65
EX_NOUSER = 67
EX_TEMPFAIL = 75
EX_CONFIG = 78

DATE_RE = (rb"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{1,2} "
           rb"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} "
           rb"\d\d:\d\d:\d\d [+-]\d{4}")
MSGID_RE = rb"<[0-9]{14}\.[0-9]+\.[0-9a-f]{16}@" + HOST.encode() + rb">"


def config(extra_intake=""):
    # `listen` on lines of their own: the sluiced fixture waits for what it finds there
    lines = ["workers = 2;",
             "stats_interval = 0;",
             'state_dir = "@DIR@";',
             'log { target = "stderr"; level = "info"; }',
             "control {", '  listen = "unix:@DIR@/control.sock";', "}",
             "intake {", '  listen = "unix:@DIR@/intake.sock";', f'  hostname = "{HOST}";']
    lines += ["  " + l for l in extra_intake.strip().splitlines()]
    lines += ["}", 'queue { dir = "@DIR@/queue"; }']
    return "\n".join(lines) + "\n"


@pytest.fixture
def intake(sluiced):
    """A running sluiced with an intake and a queue (the default configuration here)."""
    require_binary(SLUICE, "SLUICE")
    return sluiced(config())


def clean_env(**extra):
    """The environment without anything that would point the injectors elsewhere."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLUICE_INTAKE", "SLUICE_CONFIG", "NAME")}
    env.update(extra)
    return env


def run(cmd, data, env=None, timeout=60):
    if isinstance(data, str):
        data = data.encode()
    return subprocess.run(cmd, input=data, capture_output=True, timeout=timeout,
                          env=env or clean_env())


def sendmail(s, *args, data=b"", env=None):
    """`sluice -c CONFIG sendmail ARGS` with data on standard input."""
    return run([SLUICE, "-c", str(s.config), "sendmail", *args], data, env)


def link(directory, name):
    """A link NAME -> sluice, as an operator installs it."""
    path = directory / name
    if not path.exists():
        os.symlink(SLUICE, path)
    return str(path)


def queued(s):
    return queuefile.messages(s.dir / "queue")


def only_message(s):
    msgs = queued(s)
    assert len(msgs) == 1, f"expected one queued message, found {len(msgs)}"
    m = msgs[0]
    assert all(r.status == "T" for r in m.recipients), m.recipients
    return m


def rcpts(m):
    return [r.address for r in m.recipients]


def ok(res):
    assert res.returncode == EX_OK, \
        f"exit {res.returncode}\nstderr: {res.stderr.decode(errors='replace')}"
    return res


def login():
    return pwd.getpwuid(os.getuid()).pw_name


def split_header(body):
    head, sep, rest = body.partition(b"\r\n\r\n")
    assert sep, f"no empty line in {body!r}"
    return head.split(b"\r\n"), rest


def added_fields(head):
    """Date: and Message-ID: as added (checked against their formats), and the rest."""
    date = [l for l in head if l.startswith(b"Date: ")]
    msgid = [l for l in head if l.startswith(b"Message-ID: ")]
    assert len(date) == 1 and re.fullmatch(rb"Date: " + DATE_RE, date[0]), head
    assert len(msgid) == 1 and re.fullmatch(rb"Message-ID: " + MSGID_RE, msgid[0]), head
    return [l for l in head if l not in (date[0], msgid[0])]


# ---------------------------------------------------------------------------------------
# sendmail

def test_sendmail_argument_recipients(intake):
    msg = b"From: Alice <alice@example.org>\nTo: bob@example.net\nSubject: hello\n\nHi Bob.\n"
    res = ok(sendmail(intake, "-f", "alice@example.org", "bob@example.net",
                      "Carol <carol@example.net>", "dave", data=msg))
    assert res.stderr == b""
    m = only_message(intake)
    assert m.sender == "alice@example.org"
    # in order; an unqualified name gets the intake's host name, as Postfix's myorigin
    assert rcpts(m) == ["bob@example.net", "carol@example.net", f"dave@{HOST}"]
    assert m.checksum_checked or queuefile.xxhash is None
    head, rest = split_header(m.body_without_received())
    # the fields as given (CRLF), then the missing Date: and Message-ID: added at the end
    assert added_fields(head) == [b"From: Alice <alice@example.org>",
                                  b"To: bob@example.net", b"Subject: hello"]
    assert head[:3] == [b"From: Alice <alice@example.org>", b"To: bob@example.net",
                        b"Subject: hello"]
    assert rest == b"Hi Bob.\r\n"
    assert not m.eightbitmime
    assert m.size == len(m.body_without_received())   # SIZE= declared, what was sent


def test_sendmail_t_extracts_to_cc_bcc_and_removes_bcc(intake):
    msg = (b"To: \"Smith, John\" <john@example.org>, (a comment) plain@example.org,\n"
           b"  Friends: g1@example.org, G Two <g2@example.org>;, undisclosed-recipients:;\n"
           b"Cc: cc@example.org (The CC), \"quoted local\"@example.org\n"
           b"Bcc: hidden@example.org,\n"
           b"\thidden2@example.org\n"
           b"Subject: extraction\n"
           b"From: sender@example.org\n"
           b"Date: Mon, 1 Jan 2024 00:00:00 +0000\n"
           b"Message-ID: <given@example.org>\n"
           b"\n"
           b"Body.\n")
    # an argument recipient is added to those of the header (Postfix's rule), and one
    # named twice is queued once
    ok(sendmail(intake, "-t", "-f", "sender@example.org", "extra@example.org",
                "john@example.org", data=msg))
    m = only_message(intake)
    assert rcpts(m) == ["extra@example.org", "john@example.org", "plain@example.org",
                        "g1@example.org", "g2@example.org", "cc@example.org",
                        '"quoted local"@example.org', "hidden@example.org",
                        "hidden2@example.org"]
    expected = (msg.replace(b"Bcc: hidden@example.org,\n\thidden2@example.org\n", b"")
                .replace(b"\n", b"\r\n"))
    assert m.body_without_received() == expected   # nothing added: all three were there


def test_sendmail_t_uses_resent_fields_when_there_are_some(intake):
    msg = (b"To: original@example.org\nResent-To: new@example.org\n"
           b"Resent-Bcc: secret@example.org\nSubject: again\n\nx\n")
    ok(sendmail(intake, "-t", data=msg))
    m = only_message(intake)
    assert rcpts(m) == ["new@example.org", "secret@example.org"]
    assert b"Resent-Bcc" not in m.body and b"secret" not in m.body


def test_sendmail_from_full_name_and_default_sender(intake):
    ok(sendmail(intake, "-f", "who@example.org", "-F", "Dr. Who", "a@example.org",
                data=b"Subject: one\n\nx\n"))
    ok(sendmail(intake, "a@example.org", data=b"Subject: two\n\nx\n",
                env=clean_env(NAME="Test User")))
    first, second = queued(intake)
    assert first.sender == "who@example.org"
    head, _ = split_header(first.body_without_received())
    # "." is not an atom character: the name is quoted
    assert added_fields(head) == [b"Subject: one", b'From: "Dr. Who" <who@example.org>']
    # no -f: the login name, qualified with the intake's host name
    assert second.sender == f"{login()}@{HOST}"
    head, _ = split_header(second.body_without_received())
    assert added_fields(head) == [b"Subject: two",
                                  f"From: Test User <{login()}@{HOST}>".encode()]


def test_sendmail_null_sender(intake):
    ok(sendmail(intake, "-f", "<>", "a@example.org", data=b"Subject: n\n\nx\n"))
    m = only_message(intake)
    assert m.sender == ""


def test_sendmail_lone_dot_ends_input_unless_i(intake):
    data = b"Subject: dots\n\nbefore\n..two dots\n.\nafter\n"
    ok(sendmail(intake, "a@example.org", data=data))
    ok(sendmail(intake, "-i", "a@example.org", data=data))
    ok(sendmail(intake, "-oi", "a@example.org", data=data))
    plain, with_i, with_oi = (split_header(m.body_without_received())[1]
                              for m in queued(intake))
    assert plain == b"before\r\n..two dots\r\n"
    # dot-stuffed on the wire, unstuffed by the intake: the lines arrive as they were
    assert with_i == with_oi == b"before\r\n..two dots\r\n.\r\nafter\r\n"


def test_sendmail_line_endings_and_a_body_without_header(intake):
    # LF and CRLF mixed, no newline at the end, and no header at all
    ok(sendmail(intake, "-f", "s@example.org", "a@example.org",
                data=b"first line\nsecond\r\nthird"))
    m = only_message(intake)
    head, rest = split_header(m.body_without_received())
    assert added_fields(head) == [b"From: s@example.org"]
    # an empty line was put between the added fields and the body
    assert rest == b"first line\r\nsecond\r\nthird\r\n"


def test_sendmail_8bit_body_is_sent_as_8bitmime(intake):
    ok(sendmail(intake, "a@example.org", data="Subject: x\n\ncaf\u00e9\n".encode()))
    ok(sendmail(intake, "a@example.org", data=b"Subject: x\n\nascii\n"))
    eight, seven = queued(intake)
    assert eight.eightbitmime and not seven.eightbitmime
    assert split_header(eight.body_without_received())[1] == "caf\u00e9\r\n".encode()


def test_sendmail_mbox_from_line_is_dropped(intake):
    ok(sendmail(intake, "a@example.org",
                data=b"From someone Mon Jan  1 00:00:00 2024\nSubject: m\n\nx\n"))
    head, _ = split_header(only_message(intake).body_without_received())
    assert head[0] == b"Subject: m"


def fold(line, limit=998):
    """A line (bytes, no CRLF) broken as documented: CRLF and a space inserted so that no
    line is over limit, never inside a UTF-8 sequence."""
    out, room = [], limit
    while len(line) > room:
        cut = room
        for _ in range(3):
            if cut > 1 and line[cut] & 0xC0 == 0x80:
                cut -= 1
        out.append(line[:cut])
        line = b" " + line[cut:]
        room = limit
    return b"\r\n".join(out + [line])


def test_long_lines_are_broken_for_smtp(intake, workdir):
    # the intake refuses lines over 998 octets (RFC 5321 4.5.3.1.6); programs and qmail
    # send them anyway: the injectors break them as Postfix's SMTP client does
    long_header = b"X-Long: " + b"h" * 1500
    long_body = b"." + "\u00e9".encode() * 997 + b"tail"   # 2-byte characters
    exact = b"y" * 998
    data = long_header + b"\nSubject: l\n\n" + long_body + b"\n" + exact + b"\n"
    ok(sendmail(intake, "-i", "a@example.org", data=data))
    out = qmail_remote(workdir, intake, "example.org", "f@example.org", "a@example.org",
                       data=data)
    assert rspawn_view(out) == "K", out
    via_sendmail, via_qmail = queued(intake)
    expected = [fold(long_header), b"Subject: l", b"", fold(long_body), exact, b""]
    assert via_qmail.body_without_received() == b"\r\n".join(expected)
    body = via_sendmail.body_without_received()
    assert body.startswith(fold(long_header) + b"\r\nSubject: l\r\n")
    assert body.endswith(b"\r\n\r\n" + fold(long_body) + b"\r\n" + exact + b"\r\n")
    assert all(len(l) <= 998 for l in body.split(b"\r\n"))
    body.decode("utf-8")    # no character cut in two


def test_sendmail_ignores_options_programs_pass(intake):
    ok(sendmail(intake, "-oem", "-odi", "-odb", "-oQ/var/spool/x", "-B", "8BITMIME",
                "-N", "failure,delay", "-R", "hdrs", "-V", "env-1", "-U", "-m", "-n",
                "-L", "label", "-h", "10", "-ti", "a@example.org",
                data=b"To: b@example.org\n\nx\n.\ny\n"))
    m = only_message(intake)
    assert rcpts(m) == ["a@example.org", "b@example.org"]
    assert m.eightbitmime                               # -B 8BITMIME
    assert m.body.endswith(b"\r\nx\r\n.\r\ny\r\n")       # -i inside -ti


def test_sendmail_recipients_over_max_recipients_go_in_several_transactions(sluiced):
    s = sluiced(config("max_recipients = 2;"))
    names = [f"r{i}@example.org" for i in range(5)]
    ok(sendmail(s, *names, data=b"Subject: many\n\nx\n"))
    msgs = queued(s)
    assert [rcpts(m) for m in msgs] == [names[0:2], names[2:4], names[4:5]]
    bodies = {m.body_without_received() for m in msgs}
    assert len(bodies) == 1        # the same message, Message-ID included


def test_sendmail_bs_relays_an_smtp_session(intake):
    # a client that pipelines everything and ends without QUIT still gets its replies
    res = ok(sendmail(intake, "-bs", data=b"EHLO client.example\r\nMAIL FROM:<a@example.org>\r\n"
                      b"RCPT TO:<b@example.org>\r\nDATA\r\nSubject: bs\r\n\r\nx\r\n.\r\n"))
    m = only_message(intake)
    assert re.search(rb"^250 2\.0\.0 Ok: queued as " + m.id.encode() + rb"\r$", res.stdout,
                     re.M), res.stdout
    assert res.stdout.startswith(b"220 ") and rcpts(m) == ["b@example.org"]
    assert m.helo == "client.example"
    assert m.body_without_received() == b"Subject: bs\r\n\r\nx\r\n"


def test_sendmail_exit_codes(sluiced, workdir):
    require_binary(SLUICE, "SLUICE")
    s = sluiced(config("max_message_size = 2048;"))
    msg = b"Subject: x\n\nx\n"

    res = sendmail(s, data=msg)
    assert res.returncode == EX_USAGE and b"no recipients" in res.stderr
    assert sendmail(s, "-Z", "a@example.org", data=msg).returncode == EX_USAGE
    assert sendmail(s, "-bp", data=msg).returncode == EX_USAGE
    assert sendmail(s, "-f", data=msg).returncode == EX_USAGE

    # -t and no recipient anywhere: the message is at fault
    assert sendmail(s, "-t", data=msg).returncode == EX_DATAERR

    # a recipient the intake refuses for good: nothing is queued, not even for the others
    res = sendmail(s, "good@example.org", "bad@example..org", data=msg)
    assert res.returncode == EX_NOUSER, res.stderr
    assert re.search(rb"^sluice sendmail: .*<bad@example\.\.org>: 501 5\.1\.3 ",
                     res.stderr, re.M), res.stderr

    # larger than the intake takes
    res = sendmail(s, "a@example.org", data=msg + b"x" * 4096 + b"\n")
    assert res.returncode == EX_DATAERR, res.stderr
    assert queued(s) == []

    # no such configuration file; a configuration without an intake
    res = run([SLUICE, "-c", str(workdir / "nonexistent.conf"), "sendmail", "a@example.org"],
              msg)
    assert res.returncode == EX_CONFIG, res.stderr
    noin = workdir / "no-intake.conf"
    noin.write_text('policy { listen = "unix:/nonexistent/policy.sock"; }\n')
    res = run([SLUICE, "-c", str(noin), "sendmail", "a@example.org"], msg)
    assert res.returncode == EX_CONFIG and b"intake" in res.stderr

    # the intake cannot be reached: programs retry later
    s.stop()
    res = sendmail(s, "a@example.org", data=msg)
    assert res.returncode == EX_TEMPFAIL
    assert b"is sluiced running?" in res.stderr
    res = run([SLUICE, "sendmail", "a@example.org"], msg,
              env=clean_env(SLUICE_INTAKE=str(workdir / "nowhere.sock")))
    assert res.returncode == EX_TEMPFAIL


def test_sendmail_intake_address_given_directly(intake, workdir):
    sock = f"unix:{intake.dir}/intake.sock"
    # no configuration file named: the address alone is enough (the default file is not
    # read)
    ok(run([SLUICE, "sendmail", "--intake", sock, "-f", "a@example.org", "b@example.org"],
           b"Subject: 1\n\nx\n"))
    ok(run([link(workdir, "sendmail"), "-f", "a@example.org", "c@example.org"],
           b"Subject: 2\n\nx\n", env=clean_env(SLUICE_INTAKE=sock)))
    assert [rcpts(m) for m in queued(intake)] == [["b@example.org"], ["c@example.org"]]


def test_sendmail_link_takes_C_and_works_like_mail_calls_it(intake, workdir):
    sendmail_link = link(workdir, "sendmail")
    # as bsd-mailx calls it: sendmail -i -t (older mail(1)s: sendmail -i -- RCPT)
    ok(run([sendmail_link, "-C", str(intake.config), "-i", "-t"],
           b"To: one@example.org\nSubject: from mail\n\nline\n.\nend\n"))
    ok(run([sendmail_link, "-C", str(intake.config), "-oi", "--", "two@example.org"],
           b"Subject: two\n\nx\n"))
    first, second = queued(intake)
    assert rcpts(first) == ["one@example.org"] and rcpts(second) == ["two@example.org"]
    assert first.body.endswith(b"\r\nline\r\n.\r\nend\r\n")
    # as sendmail: errors are "sendmail: ..."
    res = run([sendmail_link, "-C", str(intake.config)], b"")
    assert res.returncode == EX_USAGE and res.stderr.startswith(b"sendmail: ")


def test_mail_command_through_the_sendmail_link(intake, workdir):
    mailx = shutil.which("bsd-mailx")
    if not mailx:
        pytest.skip("bsd-mailx is not installed")
    mailrc = workdir / "mailrc"
    mailrc.write_text(f"set sendmail={link(workdir, 'sendmail')}\n")
    env = clean_env(MAILRC=str(mailrc), HOME=str(workdir), SLUICE_CONFIG=str(intake.config))
    ok(run([mailx, "-s", "Subject from mail", "-c", "cc@example.org", "to@example.org"],
           b"Hello from mail(1).\n", env=env))
    m = only_message(intake)
    assert rcpts(m) == ["to@example.org", "cc@example.org"]
    assert m.sender == f"{login()}@{HOST}"
    head, rest = split_header(m.body_without_received())
    assert b"Subject: Subject from mail" in head
    assert rest == b"Hello from mail(1).\r\n"


# ---------------------------------------------------------------------------------------
# qmail-remote

def qmail_remote(workdir, s, *args, data=b"", env=None):
    """qmail-remote as qmail-rspawn runs it: a link named qmail-remote, the configuration
    from $SLUICE_CONFIG, standard error on the same descriptor as standard output."""
    env = env or clean_env(SLUICE_CONFIG=str(s.config))
    res = subprocess.run([link(workdir, "qmail-remote"), *args], input=data,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                         env=env)
    assert res.returncode == 0, res    # qmail-rspawn: anything else is its own failure
    return res.stdout


def reports(out):
    """The NUL-terminated reports, each (letter, text)."""
    assert out.endswith(b"\0"), out
    return [(r[:1].decode(), r[1:].decode()) for r in out[:-1].split(b"\0")]


def rspawn_view(out):
    """What qmail-rspawn makes of the output for qmail-send (qmail-rspawn.c, report()):
    the first K/Z/D report gives the result, a first report 's' or 'h' overrides it with
    Z or D."""
    result = None
    for r in out.split(b"\0")[:-1]:
        if r[:1] in (b"K", b"Z", b"D"):
            result = r[:1].decode()
            break
    first = out[:1]
    return {b"s": "Z", b"h": "D"}.get(first, result)


def test_qmail_remote_reports_and_queues(intake, workdir):
    data = b"Received: (qmail 1 invoked by uid 0)\nSubject: q\n\n.dot\nline\n"
    out = qmail_remote(workdir, intake, "example.org", "from@example.org",
                       "r1@example.org", "r2@example.net", data=data)
    m = only_message(intake)
    host = f"unix:{intake.dir}/intake.sock"
    assert out == (b"r\0r\0K" + f"{host} accepted message.\nRemote host said: "
                   f"250 2.0.0 Ok: queued as {m.id}\n".encode() + b"\0")
    assert rspawn_view(out) == "K"
    assert m.sender == "from@example.org"
    assert rcpts(m) == ["r1@example.org", "r2@example.net"]
    # LF -> CRLF, nothing added (qmail made the header), the dot line intact
    assert m.body_without_received() == data.replace(b"\n", b"\r\n")


def test_qmail_remote_null_sender_and_double_bounce(intake, workdir):
    for sender in ("", "#@[]"):
        out = qmail_remote(workdir, intake, "example.org", sender, "r@example.org",
                           data=b"Subject: bounce\n\nx\n")
        assert rspawn_view(out) == "K", out
    assert [m.sender for m in queued(intake)] == ["", ""]


def test_qmail_remote_refused_recipients(sluiced, workdir):
    s = sluiced(config("max_recipients = 2;"))
    out = qmail_remote(workdir, s, "example.org", "from@example.org", "ok@example.org",
                       "bad@example..org", "ok2@example.org", "over@example.org",
                       data=b"Subject: q\n\nx\n")
    rep = reports(out)
    assert [letter for letter, _ in rep] == ["r", "h", "r", "s", "K"], rep
    host = f"unix:{s.dir}/intake.sock"
    assert rep[1][1].startswith(f"{host} does not like recipient.\n"
                                "Remote host said: 501 5.1.3 ")
    assert rep[3][1].startswith(f"{host} does not like recipient.\n"
                                "Remote host said: 452 4.5.3 ")
    assert rcpts(only_message(s)) == ["ok@example.org", "ok2@example.org"]
    # as qmail-send sees it for one recipient (qmail-rspawn passes one at a time)
    out = qmail_remote(workdir, s, "example..org", "f@example.org", "bad@example..org",
                       data=b"x\n")
    assert rspawn_view(out) == "D"
    assert reports(out)[-1][0] == "D"


def test_qmail_remote_intake_down_is_temporary(sluiced, workdir):
    require_binary(SLUICE, "SLUICE")
    s = sluiced(config(), start=False)
    out = qmail_remote(workdir, s, "example.org", "f@example.org", "r@example.org",
                       data=b"x\n")
    assert out.count(b"\0") == 1 and out.startswith(b"Z") and b"(#4.4.1)" in out, out
    assert rspawn_view(out) == "Z"
    assert queued(s) == []


def test_qmail_remote_misuse_and_configuration(intake, workdir):
    out = qmail_remote(workdir, intake, "example.org", "f@example.org")
    assert out == b"DI (qmail-remote) was invoked improperly. (#5.3.5)\n\0"
    out = qmail_remote(workdir, intake, "example.org", "f@example.org", "r@example.org",
                       env=clean_env(SLUICE_CONFIG=str(workdir / "nonexistent.conf")))
    assert out.startswith(b"ZUnable to read the sluice configuration: ") and \
        out.endswith(b"(#4.3.0)\n\0"), out
    # `sluice -c FILE qmail-remote` works the same
    res = subprocess.run([SLUICE, "-c", str(intake.config), "qmail-remote", "example.org",
                          "f@example.org", "r@example.org"], input=b"x\n",
                         capture_output=True, timeout=60, env=clean_env())
    assert res.returncode == 0 and res.stderr == b"" and rspawn_view(res.stdout) == "K"
