"""The relay against a smarthost that behaves like an ISP's (peers/smarthost.py, aiosmtpd).

Each test starts sluiced with an intake on loopback, a queue and one route to a smarthost
started for the test, queues mail through the intake with smtplib (a real SMTP client),
and checks what the smarthost received and when: every recipient delivered, never more
sends in a window than the route allows (the smarthost's own log of send times is the
judge), throttling and bans suspending the lane without a bounce, permanent failures in
one DSN, and the lane's state through `sluice lanes`.
"""

import email
import json
import re
import smtplib
import time

import pytest

from conftest import SLUICE, free_port, require_binary, wait_until
from peers.smarthost import make_test_certs, smarthost, tls_certs  # noqa: F401 (fixtures)

HOST = "relay.sluice.test"


def relay_config(intake_port, smarthost_port, route="", relay="", extra="", intake=""):
    route_lines = "\n".join("  " + l for l in route.strip().splitlines())
    relay_lines = "\n".join("  " + l for l in relay.strip().splitlines())
    intake_lines = "\n".join("  " + l for l in intake.strip().splitlines())
    return f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "@DIR@";
log {{ target = "stderr"; level = "info"; }}
control {{
  listen = "unix:@DIR@/control.sock";
}}
intake {{
  listen = "inet:127.0.0.1:{intake_port}";
  hostname = "{HOST}";
{intake_lines}
}}
queue {{ dir = "@DIR@/queue"; }}
relay {{
  retry {{ min = 1s; max = 2s; }}
  suspend {{ min = 1s; max = 2s; }}
{relay_lines}
}}
route "isp" {{
  domains = ["*"];
  smarthost = "[127.0.0.1]:{smarthost_port}";
{route_lines}
}}
{extra}
"""


def send(port, rcpts, sender="list@example.org", subject="hello", body="Hello.\r\n",
         count=1):
    """Queue count messages through the intake; returns the time the last was accepted."""
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        for i in range(count):
            msg = (f"From: <{sender}>\r\nTo: <list@example.org>\r\n"
                   f"Subject: {subject} {i}\r\nMessage-ID: <{i}.{time.time()}@example.org>\r\n"
                   f"\r\n{body}")
            refused = s.sendmail(sender, rcpts, msg)
            assert not refused, refused
    return time.time()


def lanes(sd):
    return json.loads(sd.cli("lanes", "--json").stdout)


def delivered_rcpts(sh):
    out = []
    for m in sh.accepted():
        out.extend(m.rcpts)
    return out


@pytest.fixture
def relay(sluiced, smarthost):
    """Factory: relay(route=..., relay=..., **smarthost kwargs) -> (sluiced, smarthost, port)."""
    require_binary(SLUICE, "SLUICE")

    def factory(route="", relay="", extra="", start=True, **sh_kwargs):
        sh = smarthost(**sh_kwargs)
        port = free_port()
        sd = sluiced(relay_config(port, sh.port, route=route, relay=relay, extra=extra),
                     start=start)
        return sd, sh, port

    return factory


def test_throttled_list_post_is_delivered_exactly_at_the_limit(relay):
    """A list post of 64 recipients, one message each, through a lane of 8/2s with the
    smarthost in ban mode: every recipient delivered, no window over, no ban, and the
    lane sent at no less than 95% of the allowed rate over its busy period (a perfect
    lane sends N at the start of each window: N * bursts in (bursts - 1) * W)."""
    sd, sh, port = relay(route='tls = "none";\nrate = ["8/2s"];\nconnections = 1;\n'
                         'recipients_per_message = 1;\nguard = 20ms;',
                         rate="8/2", mode="ban", ban_seconds=30)
    rcpts = [f"user{i}@example.net" for i in range(64)]
    send(port, rcpts)
    sh.wait_accepted(64, timeout=40)
    assert sorted(delivered_rcpts(sh)) == sorted(rcpts)
    assert sh.bans == 0, sh.ban_events()
    assert sh.windows_over(8, 2.0) == []
    times = sorted(sh.attempts())
    busy = times[-1] - times[0]
    utilization = (len(times) / (busy + 2.0)) / (8 / 2.0)
    assert utilization >= 0.95, (len(times), busy, utilization)
    # the queue is empty and the lane says what it did
    wait_until(lambda: "the queue is empty" in sd.cli("queue").stdout, 10, "the queue to empty")
    lane = lanes(sd)[0]
    assert lane["lane"] == "isp" and lane["delivered"] == 64 and lane["failed"] == 0
    assert lane["suspensions"] == 0


def test_ban_suspends_the_lane_and_bounces_nobody(relay):
    """The smarthost refuses everything with 550 5.7.1 ... suspended: the lane is suspended,
    no recipient fails, no DSN is sent, and all is delivered after the ban lifts."""
    sd, sh, port = relay(route='tls = "none";\nrate = ["20/1s"];\nrecipients_per_message = 2;')
    sh.suspend()
    rcpts = [f"u{i}@example.net" for i in range(6)]
    send(port, rcpts)
    sd.log.wait_for(r"lane=isp suspended for \d+s: \"550 5\.7\.1", timeout=15)
    lane = lanes(sd)[0]
    assert lane["suspended"] is True and "5.7.1" in lane["reason"]
    assert lane["failed"] == 0
    text = sd.cli("lanes").stdout
    assert "SUSPENDED" in text
    time.sleep(2)
    sh.unsuspend()
    sh.wait_accepted(3, timeout=30)
    wait_until(lambda: sorted(delivered_rcpts(sh)) == sorted(rcpts), 30, "all delivered")
    assert all(m.sender != "" for m in sh.accepted()), "a DSN was sent"
    st = sd.stats()["relay"]
    assert st["failed"] == 0 and st["dsn_sent"] == 0 and st["suspensions"] >= 1


def test_unknown_recipients_get_exactly_one_dsn(relay):
    """Two of five recipients are unknown (550 5.1.1): the other three are delivered, and
    the sender gets one RFC 3464 DSN listing exactly those two."""
    bad = ["nobody1@example.net", "nobody2@example.net"]
    good = ["a@example.net", "b@example.net", "c@example.net"]
    sd, sh, port = relay(route='tls = "none";\nrate = ["50/1s"];', reject_rcpts=bad)
    send(port, good[:2] + bad[:1] + good[2:] + bad[1:], sender="owner@example.org",
         subject="report")
    wait_until(lambda: any(m.sender == "" for m in sh.accepted()), 20, "a DSN")
    time.sleep(1)
    dsns = [m for m in sh.accepted() if m.sender == ""]
    assert len(dsns) == 1
    assert list(dsns[0].rcpts) == ["owner@example.org"]
    msg = email.message_from_bytes(dsns[0].content)
    assert msg.get_content_type() == "multipart/report"
    assert msg.get_param("report-type") == "delivery-status"
    parts = msg.get_payload()
    status = parts[1]
    assert status.get_content_type() == "message/delivery-status"
    text = status.as_string()
    finals = re.findall(r"Final-Recipient: rfc822; ?(\S+)", text)
    assert sorted(finals) == sorted(bad)
    assert text.count("Action: failed") == 2
    assert "Status: 5.1.1" in text
    assert "Diagnostic-Code: smtp; 550" in text
    assert "Remote-MTA: dns;" in text
    assert "Subject: report" in parts[2].as_string()
    normal = [r for m in sh.accepted() if m.sender for r in m.rcpts]
    assert sorted(normal) == sorted(good)
    st = sd.stats()["relay"]
    assert st["failed"] == 2 and st["dsn_sent"] == 1 and st["delivered"] >= 3


def test_tempfail_with_retry_hint_waits_and_delivers(relay):
    """A relay answering 450 4.2.1 ... try again in N seconds: the lane waits that long,
    nothing bounces, everything arrives."""
    sd, sh, port = relay(route='tls = "none";\nrate = ["100/1s"];\nrecipients_per_message = 1;',
                         rate="3/3", mode="tempfail")
    rcpts = [f"t{i}@example.net" for i in range(7)]
    send(port, rcpts)
    sd.log.wait_for(r"lane=isp (suspended|slowed)", timeout=20)
    wait_until(lambda: sorted(delivered_rcpts(sh)) == sorted(rcpts), 40, "all delivered")
    assert sd.stats()["relay"]["failed"] == 0
    assert all(m.sender for m in sh.accepted())


def test_lost_reply_after_dot_is_uncertain_and_retried(relay):
    """The connection drops after the final dot: the recipient goes to U (counted), is sent
    again, and ends delivered; the possible duplicate is the one in flight."""
    sd, sh, port = relay(route='tls = "none";\nrate = ["100/1s"];',
                         drop_after_dot_first=1, drop_delivers=True)
    send(port, ["x@example.net"])
    wait_until(lambda: len(sh.accepted()) >= 2, 20, "the message sent twice")
    sd.log.wait_for(r"status=uncertain", timeout=5)
    wait_until(lambda: sd.stats()["relay"]["delivered"] == 1, 10, "delivered")
    assert sd.stats()["relay"]["uncertain"] == 1


def test_starttls_verify_and_auth(relay, tls_certs, workdir):
    """STARTTLS with the certificate checked against a private CA, then AUTH: the
    smarthost sees a TLS session and the authenticated user."""
    secret = workdir / "isp.secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    route = (f'tls = "verify";\nca_file = "{tls_certs.ca_cert}";\nsni = "localhost";\n'
             f'auth {{ user = "me"; password_file = "{secret}"; }}\nrate = ["10/1s"];')
    sd, sh, port = relay(route=route, tls_cert=tls_certs.cert, tls_key=tls_certs.key,
                         require_starttls=True, auth_user="me", auth_password="s3cret",
                         auth_required=True)
    send(port, ["secure@example.net"])
    sh.wait_accepted(1, timeout=20)
    m = sh.accepted()[0]
    assert m.tls and m.auth_user == "me"


def test_tls_verify_refuses_a_wrong_name(relay, tls_certs):
    """tls = verify and a certificate for another name: nothing is sent, the lane is
    suspended, and the message stays queued (no bounce)."""
    route = (f'tls = "verify";\nca_file = "{tls_certs.ca_cert}";\nsni = "wrong.example";\n'
             'rate = ["10/1s"];')
    sd, sh, port = relay(route=route, tls_cert=tls_certs.cert, tls_key=tls_certs.key)
    send(port, ["v@example.net"])
    sd.log.wait_for(r"lane=isp suspended", timeout=20)
    assert sh.accepted() == []
    assert sd.stats()["relay"]["failed"] == 0


def test_operator_suspends_and_resumes_a_lane(relay):
    sd, sh, port = relay(route='tls = "none";\nrate = ["100/1s"];')
    send(port, ["first@example.net"])
    sh.wait_accepted(1, timeout=15)
    sd.cli("lanes", "suspend", "isp")
    assert lanes(sd)[0]["suspended"] is True
    send(port, ["second@example.net"])
    time.sleep(1.5)
    assert len(sh.accepted()) == 1
    res = sd.cli("lanes", "resume", "nosuch", check=False)
    assert res.returncode != 0 and "no lane" in res.stdout + res.stderr
    sd.cli("lanes", "resume", "isp")
    sh.wait_accepted(2, timeout=15)


def test_reload_applies_the_new_rate_to_the_next_send(relay):
    """A lane of 1/60s has sent once and waits; a reload to 10/1s lets the next message go
    at once (budgets keep their history: the first send still counts)."""
    sd, sh, port = relay(route='tls = "none";\nrate = ["1/60s"];\nrecipients_per_message = 1;')
    send(port, ["r1@example.net", "r2@example.net"])
    sh.wait_accepted(1, timeout=15)
    time.sleep(1)
    assert len(sh.accepted()) == 1
    sd.write_config(sd.config_text.replace('rate = ["1/60s"];', 'rate = ["10/1s"];'))
    sd.cli("reload")
    sh.wait_accepted(2, timeout=10)


def test_restart_cannot_cause_a_burst(relay):
    """The send history survives a restart: a lane of 2/20s that sent 2 sends nothing more
    until the window has passed, even across a restart."""
    sd, sh, port = relay(route='tls = "none";\nrate = ["2/20s"];\nrecipients_per_message = 1;')
    send(port, ["h1@example.net", "h2@example.net"])
    sh.wait_accepted(2, timeout=15)
    sd.stop()
    sd.start()
    send(port, ["h3@example.net"])
    time.sleep(3)
    assert len(sh.accepted()) == 2, "a restart let a send past the window"
    assert sh.windows_over(2, 20.0) == []


def test_expired_message_bounces_once(relay):
    """queue.lifetime passes while the smarthost refuses connections: every recipient
    fails with 4.4.7 and one DSN is queued to the sender."""
    dead = free_port()
    sd, sh, port = relay(route='tls = "none";', start=False)
    sd.write_config(sd.config_text.replace(f"[127.0.0.1]:{sh.port}", f"[127.0.0.1]:{dead}")
                    .replace('queue { dir = "' + str(sd.dir) + '/queue"; }',
                             'queue { dir = "' + str(sd.dir) + '/queue"; lifetime = 2s; }'))
    sd.start()
    send(port, ["late@example.net"], sender="me@example.org")
    sd.log.wait_for(r"status=bounced dsn=4\.4\.7", timeout=60)
    sd.log.wait_for(r"bounce queued as \S+ to <me@example\.org>", timeout=10)
    wait_until(lambda: sd.stats()["relay"]["dsn_sent"] == 1, 10, "the DSN committed")
    # the DSN itself waits in the queue (the smarthost is down), from <> to the sender
    listing = sd.cli("queue").stdout
    assert "me@example.org" in listing


def test_null_sender_failures_are_logged_not_bounced(relay):
    sd, sh, port = relay(route='tls = "none";', reject_rcpts=["gone@example.net"])
    send(port, ["gone@example.net"], sender="")
    sd.log.wait_for(r"bounce not sent: the sender is null", timeout=15)
    st = sd.stats()["relay"]
    assert st["dsn_skipped"] == 1 and st["dsn_sent"] == 0


def test_bad_route_configuration_is_refused(sluiced, workdir):
    port = free_port()
    text = relay_config(port, 1, route='rate = ["8/banana"];')
    sd = sluiced(text, start=False)
    import subprocess
    from conftest import SLUICED
    res = subprocess.run([SLUICED, "-t", "-c", str(sd.config)], capture_output=True, text=True)
    assert res.returncode != 0
    assert "rate" in res.stderr and "sluiced.conf:" in res.stderr
    text = relay_config(port, 1, route='signal { match = "(unclosed"; action = "suspend"; }')
    sd.write_config(text)
    res = subprocess.run([SLUICED, "-t", "-c", str(sd.config)], capture_output=True, text=True)
    assert res.returncode != 0 and "match" in res.stderr


def test_outgoing_sessions_take_host_class_slots(relay):
    """A host class of sessions = 1 for the smarthost's address: however many connections
    the route allows, one outgoing session at a time (Sendmail's XLA); the rest waits."""
    sd, sh, port = relay(route='tls = "none";\nconnections = 4;\nrecipients_per_message = 1;',
                         extra='class "isp" { hosts = ["127.0.0.1"]; sessions = 1; inbound = 1; }\n'
                               'class "default" { hosts = ["*"]; sessions = 100; inbound = 100; }')
    rcpts = [f"c{i}@example.net" for i in range(12)]
    send(port, rcpts)
    wait_until(lambda: sorted(delivered_rcpts(sh)) == sorted(rcpts), 30, "all delivered")
    assert sh.max_concurrent == 1


def start_with_slow_route(sd):
    """Start sd (made with start=False) with a route "slow" for slow.example before "isp",
    to a port nothing listens on: its mail waits."""
    dead = free_port()
    slow = (f'route "slow" {{\n  domains = ["slow.example"];\n'
            f'  smarthost = "[127.0.0.1]:{dead}";\n  tls = "none";\n}}\nroute "isp" {{')
    sd.write_config(sd.config_text.replace('route "isp" {', slow, 1))
    sd.start()


def test_delay_warning_is_sent_once(relay):
    """relay.delay_warning: a message still waiting after it gets one delay notice (Action:
    delayed) for the recipients that wait, and is still delivered later."""
    sd, sh, port = relay(route='tls = "none";', relay="delay_warning = 1s;", start=False)
    start_with_slow_route(sd)
    send(port, ["a@slow.example", "b@example.net"], sender="me@example.org")
    wait_until(lambda: any(m.sender == "" for m in sh.accepted()), 30, "a delay notice")
    time.sleep(2)
    notices = [m for m in sh.accepted() if m.sender == ""]
    assert len(notices) == 1
    text = notices[0].content.decode("ascii", "replace")
    assert "Action: delayed" in text and "a@slow.example" in text
    assert "b@example.net" not in re.findall(r"Final-Recipient: rfc822; ?(\S+)", text)
    assert [r for m in sh.accepted() if m.sender for r in m.rcpts] == ["b@example.net"]
    # still queued for the slow recipient
    assert "a@slow.example" in sd.cli("queue").stdout


def test_bounce_to_postmaster_never_loops(relay):
    """Mail from <> that fails goes to relay.postmaster; when that bounce fails too, it is
    logged, never bounced again."""
    sd, sh, port = relay(route='tls = "none";', relay='postmaster = "pm@example.net";',
                         reject_rcpts=["gone@example.net", "pm@example.net"])
    send(port, ["gone@example.net"], sender="")
    sd.log.wait_for(r"bounce not sent: the sender is null <> \(it is a bounce itself\)",
                    timeout=20)
    time.sleep(1.5)
    st = sd.stats()["relay"]
    assert st["dsn_sent"] == 1 and st["failed"] == 2
    assert sh.accepted() == []


def test_uncertain_hold_is_written(relay):
    """uncertain = "hold": the message whose reply was lost is held on disk (sluice queue
    shows it) and sent again only when released."""
    sd, sh, port = relay(route='tls = "none";', relay='uncertain = "hold";',
                         drop_after_dot_first=1)
    send(port, ["u@example.net"])
    sd.log.wait_for(r"status=uncertain", timeout=20)
    msgs = [json.loads(line) for line in sd.cli("queue", "--json").stdout.splitlines()]
    assert len(msgs) == 1 and msgs[0].get("held") is True, msgs
    time.sleep(1.5)
    assert sh.accepted() == []
    sd.cli("queue", "release", msgs[0]["id"])
    sh.wait_accepted(1, timeout=15)


def test_lanes_command_errors(relay):
    sd, sh, port = relay(route='tls = "none";')
    send(port, ["l@example.net"])
    sh.wait_accepted(1, timeout=15)
    res = sd.cli("lanes", "suspend", "isp", "30", "m", check=False)
    assert res.returncode != 0 and "usage" in res.stdout + res.stderr
    res = sd.cli("lanes", "suspend", "isp", "soon", check=False)
    assert res.returncode != 0 and "duration" in res.stdout + res.stderr
    sd.cli("lanes", "suspend", "isp")
    assert "until resumed" in sd.cli("lanes").stdout
    sd.cli("lanes", "suspend", "isp", "30m")
    assert lanes(sd)[0]["suspended_for_ms"] <= 30 * 60 * 1000


@pytest.mark.parametrize("bad, words", [
    ('relay { suspend = 5m; }', ["suspend", "min"]),
    ('route "x" { domains = ["*"]; smarthost = "[127.0.0.1]:25"; shared = true; rate = "1/1s"; }',
     ["shared", "redis"]),
    ('route "x" { domains = ["*"]; smarthost = "[127.0.0.1]:25"; recipients_per_message = 5000; }',
     ["recipients_per_message"]),
    ('route "x" { domains = ["*"]; }', ["smarthost", "mx"]),
    ('route "x" { domains = ["a b"]; mx = true; }', ["domain"]),
])
def test_relay_configuration_errors_name_the_key(sluiced, bad, words):
    import subprocess
    from conftest import SLUICED
    port = free_port()
    text = relay_config(port, 1) + bad + "\n"
    if bad.startswith("relay {"):
        # the test's own relay block goes: the bad one is the only one
        text = re.sub(r"relay \{\n  retry \{[^\n]*\n  suspend \{[^\n]*\n\n\}\n", "", text)
        assert "retry" not in text
    sd = sluiced(text, start=False)
    res = subprocess.run([SLUICED, "-t", "-c", str(sd.config)], capture_output=True, text=True)
    assert res.returncode != 0, res.stdout
    for w in words:
        assert w in res.stderr, res.stderr
    assert "sluiced.conf:" in res.stderr


def test_suspension_survives_a_restart(relay):
    """A lane suspended (here by the operator; a ban works the same) stays suspended
    across a restart: a restart cannot send into a ban.  Resumed, it sends."""
    sd, sh, port = relay(route='tls = "none";')
    send(port, ["s1@example.net"])
    sh.wait_accepted(1, timeout=15)
    sd.cli("lanes", "suspend", "isp", "1h")
    sd.stop()
    sd.start()
    send(port, ["s2@example.net"])
    time.sleep(1.5)
    assert len(sh.accepted()) == 1
    lane = lanes(sd)[0]
    assert lane["suspended"] and "operator" in lane["reason"]
    sd.cli("lanes", "resume", "isp")
    sh.wait_accepted(2, timeout=15)
    sd.stop()
    sd.start()
    send(port, ["s3@example.net"])
    sh.wait_accepted(3, timeout=15)
