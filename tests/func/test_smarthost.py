"""The test smarthost (peers/smarthost.py) checked on its own with smtplib, mode by mode, before the
relay's tests rely on it.  Small windows (1-2 s) keep the whole file to a few seconds."""

import base64
import hashlib
import hmac
import json
import os
import signal
import smtplib
import ssl
import subprocess
import sys
import time

import pytest

from conftest import HERE, free_port, tcp_listening, wait_until
from peers.smarthost import (BAN_REPLY, RANDOM_TEMPFAIL_REPLY, SUSPEND_REPLY,
                       TOO_MANY_CONNECTIONS_REPLY, Smarthost, make_test_certs,
                       max_in_window_of, parse_rate, scram_escape, scram_keys,
                       smarthost, tls_certs, windows_over_of)  # noqa: F401 (fixtures)

SENDER = "list@example.org"


def body(subject="test", text="hello\r\n"):
    return (f"From: {SENDER}\r\nTo: someone@example.net\r\nSubject: {subject}\r\n\r\n"
            f"{text}").encode()


def connect(sh, timeout=5, ehlo=True):
    s = smtplib.SMTP("127.0.0.1", sh.port, local_hostname="client.test", timeout=timeout)
    if ehlo:
        s.ehlo()
    return s


def reply(code_text):
    code, text = code_text
    return f"{code} {text.decode() if isinstance(text, bytes) else text}"


def send(s, sender=SENDER, rcpts=("a@example.net",), data=None):
    """One transaction on an open connection; the reply that ended it, as "CODE text"
    (MAIL's or DATA's; RCPT replies in .rcpts).  RSET after a failure."""
    class Result(str):
        pass
    mail = s.mail(sender)
    if mail[0] != 250:
        r = Result(reply(mail))
        r.stage, r.rcpts = "MAIL", []
        return r
    rcpt_replies = [reply(s.rcpt(rcpt)) for rcpt in rcpts]
    if not any(x.startswith("250") for x in rcpt_replies):
        s.rset()
        r = Result(rcpt_replies[-1])
        r.stage, r.rcpts = "RCPT", rcpt_replies
        return r
    r = Result(reply(s.data(data or body())))
    r.stage, r.rcpts = "DATA", rcpt_replies
    if not r.startswith("250"):
        s.rset()
    return r


# ---------------------------------------------------------------------------------------
# pure helpers

def test_parse_rate():
    assert parse_rate("8/10") == (8, 10.0)
    assert parse_rate("8/1m") == (8, 60.0)
    assert parse_rate("500/1h") == (500, 3600.0)
    assert parse_rate((3, 2)) == (3, 2.0)
    assert parse_rate(None) is None
    with pytest.raises(ValueError):
        parse_rate("8 per minute")


def test_window_analysis_is_half_open():
    events = [(0.0, 1), (1.0, 1), (2.0, 1), (2.5, 1)]
    assert max_in_window_of(events, 2.0) == 3          # [1, 3) holds 1, 2, 2.5; 0 is out
    assert max_in_window_of(events, 2.0001) == 4 - 1   # [0, 2.0001) holds 0, 1, 2
    assert max_in_window_of(events, 2.6) == 4
    assert max_in_window_of([], 5) == 0
    assert max_in_window_of([(0, 2), (1, 3)], 1) == 3  # weights (recipients)
    assert windows_over_of(events, 2, 2.0) == [(1.0, 3)]
    assert windows_over_of(events, 3, 2.0) == []


# ---------------------------------------------------------------------------------------
# accepting and recording

def test_accepts_and_records_messages(smarthost, workdir):
    port = free_port()
    sh = smarthost(port=port, maildir=workdir / "maildir")
    assert sh.port == port and sh.relayhost == f"[127.0.0.1]:{port}"
    with connect(sh) as s:
        assert s.has_extn("pipelining") and s.has_extn("size")
        assert not s.has_extn("auth") and not s.has_extn("starttls")
        t0 = time.time()
        r = send(s, rcpts=("a@example.net", "b@example.net"),
                 data=body(text="line\r\n.starts with a dot\r\n"))
        assert r.startswith("250 2.0.0 Ok: queued as "), r
        assert r.rcpts == ["250 2.1.5 Ok"] * 2
        assert send(s, sender="<>").startswith("250")       # the null sender
    msgs = sh.accepted()
    assert [m.seq for m in msgs] == [1, 2]
    m = msgs[0]
    assert m.sender == SENDER and m.rcpts == ("a@example.net", "b@example.net")
    assert t0 <= m.t_mail <= m.t_rcpts[0] <= m.t_rcpts[1] <= m.t_data <= time.time()
    assert m.content.endswith(b"line\r\n.starts with a dot\r\n")
    assert m.size == len(m.content) and m.header("Subject") == "test"
    assert m.helo == "client.test" and not m.tls and m.auth_user is None
    assert r.endswith(m.queue_id)
    assert msgs[1].sender == ""
    assert sh.rejections == {} and sh.bans == 0 and len(sh.attempts()) == 2
    wait_until(lambda: sh.active_connections == 0, 5, "the connection to close")
    conns = sh.connections()
    assert len(conns) == 1 and conns[0].messages == 2 and conns[0].t_close is not None
    new = sorted(os.listdir(workdir / "maildir/new"))
    assert len(new) == 2
    assert (workdir / "maildir/new" / new[0]).read_bytes() == m.content
    envs = [json.loads(l) for l in (workdir / "maildir/envelopes.jsonl").read_text().splitlines()]
    assert envs[0]["rcpts"] == list(m.rcpts) and envs[1]["sender"] == ""


# ---------------------------------------------------------------------------------------
# rate limit modes

def test_ban_mode(smarthost):
    sh = smarthost(rate="3/1", mode="ban", ban_seconds=2)
    with connect(sh) as s:
        for _ in range(3):
            assert send(s).startswith("250")
        r = send(s)
        assert r == BAN_REPLY and r.stage == "MAIL"
        assert sh.bans == 1 and sh.banned
        time.sleep(1.1)                         # the window is empty, the ban is not
        assert send(s) == BAN_REPLY
        assert sh.bans == 1
        wait_until(lambda: not sh.banned, 3, "the ban to end")
        assert send(s).startswith("250")
    assert len(sh.accepted()) == 4
    assert sh.rejections == {550: 2}
    assert sh.max_in_window(1) == 3 and sh.windows_over(3, 1) == []
    assert len(sh.ban_events()) == 1


def test_ban_mode_counting_at_data(smarthost):
    sh = smarthost(rate="1/5", mode="ban", ban_seconds=5, count_at="data")
    with connect(sh) as s:
        assert send(s).startswith("250")
        r = send(s)
        assert r == BAN_REPLY and r.stage == "DATA"     # MAIL and RCPT were accepted
        assert send(s) == BAN_REPLY and sh.bans == 1    # banned at MAIL now
    sh.unban()
    assert not sh.banned


def test_tempfail_mode(smarthost):
    sh = smarthost(rate="3/1", mode="tempfail")
    with connect(sh) as s:
        for _ in range(3):
            assert send(s).startswith("250")
        r = send(s)
        assert r == "450 4.2.1 Rate limit exceeded, try again in 1 seconds", r
        assert sh.bans == 0
        wait_until(lambda: send(s).startswith("250"), 3, "the window to have room", 0.2)
    assert sh.max_in_window(1) == 3 and sh.windows_over(3, 1) == []
    assert sh.windows_over(2, 1) != []
    assert sh.rejections[450] >= 1


def test_tempfail_retry_is_computed_from_the_window(smarthost):
    sh = smarthost(rate="1/30", mode="tempfail")
    with connect(sh) as s:
        assert send(s).startswith("250")
        assert send(s) == "450 4.2.1 Rate limit exceeded, try again in 30 seconds"
        time.sleep(1.1)
        assert send(s) == "450 4.2.1 Rate limit exceeded, try again in 29 seconds"


def test_none_mode_accepts_and_records_overs(smarthost):
    sh = smarthost(rate="3/2", mode="none")
    with connect(sh) as s:
        for _ in range(5):
            assert send(s).startswith("250")
    assert len(sh.accepted()) == 5 and sh.rejections == {}
    assert [n for _, n in sh.overs()] == [4, 5]
    assert sh.max_in_window(2) == 5
    assert sh.windows_over(3, 2) != [] and sh.windows_over(3, 2)[0][1] == 5


def test_count_at_mail_counts_attempts(smarthost):
    sh = smarthost(rate="2/5", mode="tempfail")
    with connect(sh) as s:
        assert s.mail(SENDER)[0] == 250          # an attempt, then abandoned
        s.rset()
        assert send(s).startswith("250")
        r = send(s)
        assert r.startswith("450 4.2.1 ") and r.stage == "MAIL"
    assert len(sh.accepted()) == 1 and len(sh.attempts()) == 2


def test_count_at_data(smarthost):
    sh = smarthost(rate="2/5", mode="tempfail", count_at="data")
    with connect(sh) as s:
        assert s.mail(SENDER)[0] == 250          # not counted: no final dot
        s.rset()
        assert send(s).startswith("250")
        assert send(s).startswith("250")
        r = send(s)
        assert r.startswith("450 4.2.1 Rate limit exceeded") and r.stage == "DATA"
    assert sh.max_in_window(5) == 2


def test_count_recipients(smarthost):
    sh = smarthost(rate="3/5", mode="tempfail", count="recipients")
    with connect(sh) as s:
        assert send(s, rcpts=("a@x.test", "b@x.test")).startswith("250")
        r = send(s, rcpts=("c@x.test", "d@x.test"))
        assert r.startswith("250")                       # c went, d was refused
        assert r.rcpts[0] == "250 2.1.5 Ok" and r.rcpts[1].startswith("450 4.2.1 ")
    assert sh.accepted()[1].rcpts == ("c@x.test",)
    assert sh.max_in_window(5) == 3 and sh.max_in_window(5, unit="messages") == 2

    sh2 = smarthost(rate="3/5", mode="tempfail", count="recipients", count_at="data")
    with connect(sh2) as s:
        assert send(s, rcpts=("a@x.test", "b@x.test")).startswith("250")
        r = send(s, rcpts=("c@x.test", "d@x.test"))
        assert r.startswith("450 4.2.1 ") and r.stage == "DATA"
        assert send(s, rcpts=("e@x.test",)).startswith("250")
    assert sh2.max_in_window(5) == 3


# ---------------------------------------------------------------------------------------
# recipients

def test_unknown_recipients(smarthost):
    sh = smarthost(reject_rcpts=["Gone@Example.net"], reject_rcpt_regex=r"^nobody\d*@")
    with connect(sh) as s:
        r = send(s, rcpts=("gone@example.net", "nobody7@example.net", "ok@example.net"))
        assert r.rcpts == [
            "550 5.1.1 <gone@example.net>: Recipient address rejected: User unknown",
            "550 5.1.1 <nobody7@example.net>: Recipient address rejected: User unknown",
            "250 2.1.5 Ok"]
        assert r.startswith("250")
    assert sh.accepted()[0].rcpts == ("ok@example.net",)
    assert sh.rejections == {550: 2}


def test_random_tempfail_is_seeded(smarthost):
    def codes(sh):
        with connect(sh) as s:
            assert s.mail(SENDER)[0] == 250
            return [s.rcpt(f"r{i}@example.net")[0] for i in range(30)]
    a = codes(smarthost(rcpt_tempfail_p=0.5, seed=7))
    b = codes(smarthost(rcpt_tempfail_p=0.5, seed=7))
    assert a == b and set(a) == {250, 451}
    always = smarthost(rcpt_tempfail_p=1.0)
    with connect(always) as s:
        s.mail(SENDER)
        assert reply(s.rcpt("x@example.net")) == RANDOM_TEMPFAIL_REPLY


# ---------------------------------------------------------------------------------------
# connections

def test_connection_cap(smarthost):
    sh = smarthost(max_connections=2)
    s1, s2 = connect(sh), connect(sh)
    with pytest.raises(smtplib.SMTPConnectError) as e:
        connect(sh)
    assert e.value.smtp_code == 421
    assert f"421 {e.value.smtp_error.decode()}" == TOO_MANY_CONNECTIONS_REPLY
    s1.quit()
    wait_until(lambda: sh.active_connections == 1, 5, "the first connection to close")
    with connect(sh) as s3:
        assert send(s3).startswith("250")
    s2.quit()
    assert sh.max_concurrent == 2 and sh.refused_connections == 1
    assert sh.rejections == {421: 1}
    assert [c.refused for c in sh.connections()] == [False, False, True, False]


# ---------------------------------------------------------------------------------------
# STARTTLS and AUTH

def test_starttls_and_auth_plain_login(smarthost, tls_certs):
    sh = smarthost(tls_cert=tls_certs.cert, tls_key=tls_certs.key, require_starttls=True,
                   auth_user="me", auth_password="secret", auth_required=True)
    with connect(sh) as s:
        assert s.has_extn("starttls") and not s.has_extn("auth")
        assert s.mail(SENDER)[0] == 530                       # STARTTLS first
        with pytest.raises(ssl.SSLCertVerificationError):     # not trusted without the CA
            s.starttls(context=ssl.create_default_context())
    with connect(sh) as s:
        s.starttls(context=tls_certs.client_context())        # checks 127.0.0.1 too
        s.ehlo()
        assert s.esmtp_features["auth"].split() == ["LOGIN", "PLAIN", "SCRAM-SHA-256"]
        assert reply(s.mail(SENDER)) == "530 5.7.0 Authentication required"
        with pytest.raises(smtplib.SMTPAuthenticationError) as e:
            s.user, s.password = "me", "wrong"
            s.auth("PLAIN", s.auth_plain)
        assert e.value.smtp_code == 535
        s.user, s.password = "me", "secret"
        assert s.auth("PLAIN", s.auth_plain)[0] == 235
        assert send(s).startswith("250")
    with connect(sh) as s:
        s.starttls(context=tls_certs.client_context())
        s.ehlo()
        s.user, s.password = "me", "secret"
        assert s.auth("LOGIN", s.auth_login, initial_response_ok=False)[0] == 235
        assert send(s).startswith("250")
    msgs = sh.accepted()
    assert [(m.tls, m.auth_user) for m in msgs] == [(True, "me"), (True, "me")]
    assert [(mech, user, ok) for _, _, mech, user, ok in sh.auth_log()] == [
        ("PLAIN", "me", False), ("PLAIN", "me", True), ("LOGIN", "me", True)]
    assert [c.tls for c in sh.connections()] == [False, True, True]   # 1st: not trusted


def test_auth_without_tls_and_mechanism_choice(smarthost):
    sh = smarthost(auth_user="me", auth_password="secret", auth_mechanisms=("PLAIN",))
    with connect(sh) as s:
        assert s.esmtp_features["auth"].split() == ["PLAIN"]
        assert s.docmd("AUTH", "LOGIN")[0] == 504
        assert s.docmd("AUTH", "SCRAM-SHA-256")[0] == 504
        assert send(s).startswith("250")                     # auth not required
        assert s.login("me", "secret")[0] == 235
    none = smarthost()
    with connect(none) as s:
        assert reply(s.docmd("AUTH", "PLAIN AG1lAHNlY3JldA==")) == \
            "503 5.5.1 Error: authentication not enabled"


def test_expired_certificate_is_refused(smarthost, workdir):
    certs = make_test_certs(workdir / "expired", expired=True, key_type="rsa")
    sh = smarthost(tls_cert=certs.cert, tls_key=certs.key)
    with connect(sh) as s:
        with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
            s.starttls(context=certs.client_context())


class ScramClient:
    """SCRAM-SHA-256 client side for smtplib.SMTP.auth(), RFC 5802 section 3."""

    def __init__(self, user, password, nonce=None):
        self.user, self.password = user, password
        self.nonce = nonce or base64.b64encode(os.urandom(18)).decode()
        self.step = 0
        self.server_signature = None
        self.verified = False

    def __call__(self, challenge=None):
        self.step += 1
        if self.step == 1:
            self.first_bare = f"n={scram_escape(self.user)},r={self.nonce}"
            return "n,," + self.first_bare
        if self.step == 2:
            server_first = challenge.decode()
            attrs = dict(a.split("=", 1) for a in server_first.split(","))
            assert attrs["r"].startswith(self.nonce) and len(attrs["r"]) > len(self.nonce)
            salt, iterations = base64.b64decode(attrs["s"]), int(attrs["i"])
            stored_key, server_key, client_key = scram_keys(self.password, salt, iterations)
            without_proof = f"c=biws,r={attrs['r']}"
            auth_message = f"{self.first_bare},{server_first},{without_proof}".encode()
            signature = hmac.new(stored_key, auth_message, hashlib.sha256).digest()
            proof = bytes(a ^ b for a, b in zip(client_key, signature))
            self.server_signature = hmac.new(server_key, auth_message, hashlib.sha256).digest()
            return f"{without_proof},p={base64.b64encode(proof).decode()}"
        # step 3: server-final-message "v=..." as a 334 challenge; answered with nothing
        self.verified = challenge.decode() == \
            "v=" + base64.b64encode(self.server_signature).decode()
        return ""


def test_scram_sha256_rfc7677_vector(smarthost):
    """The exchange of RFC 7677 section 3, byte for byte, by hand."""
    sh = smarthost(auth_user="user", auth_password="pencil",
                   scram_salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="),
                   scram_iterations=4096, scram_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")

    def b64(text):
        return base64.b64encode(text.encode()).decode()

    with connect(sh) as s:
        assert "SCRAM-SHA-256" in s.esmtp_features["auth"].split()
        code, text = s.docmd("AUTH", "SCRAM-SHA-256 " + b64("n,,n=user,r=rOprNGfwEbeRWgbNEkqO"))
        assert code == 334
        assert base64.b64decode(text).decode() == (
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
            "s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
        code, text = s.docmd(b64(
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
            "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="))
        assert code == 334
        assert base64.b64decode(text).decode() == \
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        code, text = s.docmd("")
        assert code == 235, text
        assert send(s).startswith("250")
    assert sh.accepted()[0].auth_user == "user"


def test_scram_sha256_client_exchange(smarthost):
    sh = smarthost(auth_user="me,=x", auth_password="secret", auth_required=True)
    with connect(sh) as s:
        client = ScramClient("me,=x", "secret")
        assert s.auth("SCRAM-SHA-256", client)[0] == 235
        assert client.verified
        assert send(s).startswith("250")
    with connect(sh) as s:
        with pytest.raises(smtplib.SMTPAuthenticationError) as e:
            s.auth("SCRAM-SHA-256", ScramClient("me,=x", "wrong"))
        assert e.value.smtp_code == 535
        # without an initial response: a 334 with nothing, then the client-first-message
        client = ScramClient("me,=x", "secret")
        assert s.auth("SCRAM-SHA-256", client, initial_response_ok=False)[0] == 235
    with connect(sh) as s:
        assert s.docmd("AUTH", "SCRAM-SHA-256 " + base64.b64encode(
            b"p=tls-unique,,n=me,r=abc").decode())[0] == 501   # no channel binding
        assert s.docmd("AUTH", "SCRAM-SHA-256")[0] == 334
        assert s.docmd("*")[0] == 501                               # aborted
    assert [ok for *_, ok in sh.auth_log()] == [True, False, True]
    assert sh.accepted()[0].auth_user == "me,=x"


# ---------------------------------------------------------------------------------------
# dropping the connection after the final dot

def test_drop_after_dot_first(smarthost):
    sh = smarthost(drop_after_dot_first=1)
    with connect(sh) as s:
        with pytest.raises(smtplib.SMTPServerDisconnected):
            send(s)
    with connect(sh) as s:
        assert send(s).startswith("250")
    assert len(sh.dropped()) == 1 and sh.dropped()[0].dropped
    assert [m.dropped for m in sh.accepted()] == [False]


def test_drop_delivers_reset_and_hang(smarthost):
    sh = smarthost(drop_after_dot_p=1.0, drop_how="reset", drop_delivers=True)
    with connect(sh) as s:
        with pytest.raises((smtplib.SMTPServerDisconnected, ConnectionResetError)):
            send(s)
    assert [m.dropped for m in sh.accepted()] == [True] and len(sh.dropped()) == 1

    hang = smarthost(drop_after_dot_first=1, drop_how="hang")
    s = connect(hang, timeout=0.5)
    with pytest.raises(smtplib.SMTPServerDisconnected, match="timed out"):
        send(s)
    s.close()
    assert len(hang.dropped()) == 1 and hang.accepted() == []
    hang.set_drop(first=1, how="close")
    with connect(hang) as s:
        with pytest.raises(smtplib.SMTPServerDisconnected):
            send(s)
    with connect(hang) as s:
        assert send(s).startswith("250")
    assert len(hang.dropped()) == 2


# ---------------------------------------------------------------------------------------
# run-time switches

def test_suspend_and_set_rate(smarthost):
    sh = smarthost()
    with connect(sh) as s:
        assert send(s).startswith("250")
        sh.suspend()
        assert send(s) == SUSPEND_REPLY
        sh.unsuspend()
        assert send(s).startswith("250")
        sh.set_rate(1, 10)
        sh.set_mode("tempfail")
        assert send(s).startswith("250")
        assert send(s).startswith("450 4.2.1 Rate limit exceeded, try again in ")
        sh.set_mode("ban", ban_seconds=10)
        assert send(s) == BAN_REPLY and sh.bans == 1
        sh.unban()
        sh.set_rate(None)
        assert send(s).startswith("250")
    assert sh.rejections == {550: 2, 450: 1}


# ---------------------------------------------------------------------------------------
# script use

def test_script(workdir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "peers/smarthost.py"), "--port", str(port),
                             "--rate", "2/10", "--mode", "ban", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    try:
        wait_until(lambda: proc.poll() is not None or tcp_listening("127.0.0.1", port), 10,
                   "the script to listen")
        assert proc.poll() is None, proc.communicate()
        with smtplib.SMTP("127.0.0.1", port, timeout=5) as s:
            s.ehlo()
            assert send(s).startswith("250")
            assert send(s).startswith("250")
            assert send(s) == BAN_REPLY
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["accepted"] == 2 and summary["bans"] == 1
    assert summary["rejections"] == {"550": 1} and summary["max_in_window"] == 2

    res = subprocess.run([sys.executable, str(HERE / "peers/smarthost.py"), "--make-certs",
                          str(workdir / "c")], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    paths = json.loads(res.stdout)
    assert all(os.path.exists(paths[k]) for k in ("ca_cert", "ca_key", "cert", "key"))
