"""The milter with a real Postfix over minutes (meson suite 'slow'): sessions that stay quiet
for longer than the default idle timeout, and 10000 messages over 50 parallel sessions."""

import smtplib
import time

from peers import milter_wire as w
from conftest import all_stages, milter_config, queued_id, wait_until


def test_quiet_sessions_survive_the_default_idle_timeout(sluiced, postfix):
    """The MTA keeps the milter connection for the whole SMTP session, and SMTP clients
    may pause for minutes (Postfix's smtpd_timeout is 300s): with the default idle
    timeout, a milter session quiet for 75s and an SMTP session that pauses 75s before
    DATA both still complete."""
    s = sluiced(milter_config(reply=all_stages("continue")))
    pf = postfix(milter=f"unix:{s.milter_socket}")

    raw = w.MilterClient(s.milter_socket, timeout=120)
    raw.negotiate()
    assert raw.connect()[0] == w.CONTINUE

    smtp = smtplib.SMTP("127.0.0.1", pf.port, local_hostname="client.sluice.test",
                        timeout=120)
    smtp.ehlo()
    assert smtp.mail("sender@sluice.test")[0] == 250
    assert smtp.rcpt("rcpt@example.net")[0] == 250

    time.sleep(75)

    assert raw.helo()[0] == w.CONTINUE
    assert w.accepted(raw.message())
    raw.abort()
    raw.quit()

    code, reply = smtp.data(b"Subject: patience\r\n\r\nI waited.\r\n")
    smtp.quit()
    assert code == 250, reply
    pf.wait_delivered(queued_id(reply.decode()))
    assert s.milter_stats()["timeouts"] == 0


def test_postfix_volume(sluiced, postfix):
    """10000 messages over 50 parallel SMTP sessions through Postfix, every stage
    negotiated: all delivered, no protocol error, no session left, threads unchanged."""
    s = sluiced(milter_config(reply=all_stages("continue"), workers=2))
    pf = postfix(milter=f"unix:{s.milter_socket}", default_process_limit="100")
    threads = s.threads()
    res = pf.smtp_source("-d", "-m", "10000", "-s", "50", "-l", "20000",
                         "-M", "client.sluice.test", "-f", "sender@sluice.test",
                         "-t", "rcpt@example.net", timeout=1200)
    assert res.returncode == 0, f"{res.stdout}{res.stderr}\n{pf.maillog.tail()}"
    wait_until(lambda: len(pf.maillog.findall(r"status=sent")) >= 10000, 900,
               "10000 deliveries", interval=2)
    assert not pf.maillog.findall(r"warning: .*milter.*")
    assert not pf.maillog.findall(r"milter-reject")
    wait_until(lambda: s.milter_stats()["sessions_current"] == 0, 30, "milter sessions to end")
    st = s.milter_stats()
    assert st["protocol_errors"] == 0 and st["timeouts"] == 0, st
    assert st["sessions_peak"] <= 60, st
    assert s.threads() == threads
