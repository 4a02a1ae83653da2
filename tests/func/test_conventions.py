"""The conventions of the field, checked from outside against the real daemon:

* libmilter's and Sendmail's socket strings (src/lib/sockspec.c) with a real Postfix and
  miltertest (a libmilter-style client), and refused with FILE:LINE: KEY by `sluiced -t`
  (a listen host that does not resolve too); the address bound logged at start, with a
  warning on a wildcard; libmilter's inet6 wildcard taking IPv4 clients; an inet
  control socket other hosts reach refused unless allow_remote;
* JSON (src/lib/buf.c): an SMTPUTF8 message through the intake read back from
  `sluice queue --json` by a strict parser, a milter peer's ill-formed bytes as U+FFFD;
* units (sluice.conf(5) UNITS): a size's k/M/G and kB/MB/GB refused naming both readings, and
  what `sluiced -D` prints read back to the same values.

Postfix's smtpd_milters takes inet:HOST:PORT and unix:PATH only: Postfix 3.7 stops its
smtpd with "fatal: PORT@HOST: garbage after numerical service" on inet:PORT@HOST (shown
below), so the Postfix test points Postfix at the socket in Postfix's spelling and sluiced
at the same socket in libmilter's; miltertest connects with libmilter's spelling itself.
"""

import json
import pathlib
import re
import shutil
import socket
import subprocess

import pytest

from conftest import (SLUICE, SLUICED, free_port, milter_config, sluiced_check,
                      wait_until)
from test_intake import Client, intake_config, qid_of
from peers import milter_wire

FROM = "sender@sluice.test"
LUA = pathlib.Path(__file__).resolve().parent / "lua"
MILTERTEST = shutil.which("miltertest") or "/usr/bin/miltertest"

# one rule whose decisions show that the mail went through sluiced: the second message to
# the same recipient within the hour is refused (451 from the milter)
ONE_PER_HOUR = """limit "one-per-rcpt" {
  stage = "rcpt"; key = "rcpt"; count = "messages"; rate = ["1/1h"];
  action = "tempfail"; reply = "451 4.7.1 one per hour for %{key}";
}
"""



# connect with miltertest's own parser of socket strings and negotiate
CONNECT_LUA = """dofile(luadir .. "/common.lua")
run(function()
  local conn = open_and_negotiate()
  mt.disconnect(conn)
end)
"""


def miltertest_negotiates(socket_string, daemon):
    """miltertest (OpenDKIM's libmilter-style client: it parses socket strings as libmilter
    does) connects to socket_string and negotiates with sluiced."""
    if not shutil.which(MILTERTEST):
        pytest.skip("miltertest is not installed")
    script = daemon.dir / "connect.lua"
    script.write_text(CONNECT_LUA)
    cmd = [MILTERTEST, "-s", str(script), "-D", f"socket={socket_string}",
           "-D", f"luadir={LUA}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and f"connected to {socket_string}" in res.stdout, \
        f"$ {' '.join(cmd)}\n{res.stdout}{res.stderr}\n--- sluiced ---\n{daemon.log.tail(20)}"


def connects(family, address):
    with socket.socket(family) as c:
        return c.connect_ex(address) == 0


# ---------------------------------------------------------------------------------------
# socket strings

def test_postfix_reaches_sluiced_listening_on_libmilters_inet_port_at_host(sluiced, postfix):
    port = free_port()
    spec = f"inet:{port}@127.0.0.1"
    s = sluiced(milter_config(listen=spec, extra=ONE_PER_HOUR))
    assert f'listen = "{spec}"' in s.config_text
    # the same socket, in Postfix's spelling
    pf = postfix(milter=f"inet:127.0.0.1:{port}")
    rcpt = "one@example.net"
    first = pf.swaks("--from", FROM, "--to", rcpt)
    assert first.returncode == 0, first.stdout + first.stderr + pf.maillog.tail()
    second = pf.swaks("--from", FROM, "--to", rcpt)
    assert "451 4.7.1 one per hour for one@example.net" in second.stdout, \
        second.stdout + pf.maillog.tail()
    pf.maillog.wait_for(r"milter-reject: RCPT from .*451 4\.7\.1 one per hour")
    assert not pf.maillog.search(r"warning: .*milter", flags=re.I), pf.maillog.tail()
    milter = s.milter_stats()
    assert milter["connections"] >= 2, milter
    # and miltertest, speaking libmilter's spelling, reaches the very same listener
    miltertest_negotiates(spec, s)


def test_postfix_itself_refuses_inet_port_at_host(sluiced, postfix):
    """What the docs say of Postfix: smtpd_milters does not take libmilter's form."""
    port = free_port()
    sluiced(milter_config(listen=f"inet:{port}@127.0.0.1"))
    pf = postfix(milter=f"inet:{port}@127.0.0.1")
    pf.swaks("--from", FROM, "--to", "x@example.net", "--timeout", "10", timeout=60)
    pf.maillog.wait_for(rf"fatal: {port}@127\.0\.0\.1: garbage after numerical service",
                        timeout=30)


@pytest.mark.parametrize("form", ["local:@DIR@/m.sock", "inet6:PORT@[::1]", "inet6:PORT@::1",
                                  "inet:PORT", "INET:PORT@localhost"])
def test_libmilter_forms_listen(sluiced, form):
    port = free_port()
    spec = form.replace("PORT", str(port))
    s = sluiced(milter_config(listen=spec, mode="0666" if "local:" in spec else None))
    spec = spec.replace("@DIR@", str(s.dir))
    if not spec.startswith("local:"):
        # the numeric address bound, at start; a warning only where other hosts reach it
        bound = f"0.0.0.0:{port}" if spec == f"inet:{port}" else \
            f"127.0.0.1:{port}" if "localhost" in spec else f"[::1]:{port}"
        s.log.wait_for(rf" milter listening on {re.escape(spec)}: {re.escape(bound)}$",
                       flags=re.M)
        warned = s.log.search(rf"milter listens on {re.escape(bound)} \({re.escape(spec)}\), "
                              r"which other hosts can reach and which has no authentication")
        assert bool(warned) == (spec == f"inet:{port}"), s.log.tail()
    if spec.startswith("local:"):
        path = spec[len("local:"):]
        wait_until(lambda: connects(socket.AF_UNIX, path), 10, path)
    elif "::1" in spec:
        wait_until(lambda: connects(socket.AF_INET6, ("::1", port)), 10, f"[::1]:{port}")
        # IPv6 only: nothing on 127.0.0.1 for that port
        assert not connects(socket.AF_INET, ("127.0.0.1", port))
        # miltertest (OpenDKIM's, as packaged) has no IPv6: the test's own milter client
        with milter_wire.MilterClient(f"inet:::1:{port}") as m:
            assert m.negotiate()[0] == 6
        return
    miltertest_negotiates(spec.replace("INET:", "inet:"), s)


@pytest.mark.parametrize("value, message", [
    ("inet:0@127.0.0.1", r"port 0 is out of range 1-65535"),
    ("inet:65536@127.0.0.1", r"port 65536 is out of range 1-65535"),
    ("inet:8891@", r"empty host"),
    ("inet:@127.0.0.1", r"missing port"),
    ("inet:smtp@127.0.0.1", r'port "smtp" is not a number'),
    ("inet6:8891@127.0.0.1", r"127\.0\.0\.1 is an IPv4 address; write inet:"),
    ("inet:8891@[mx.example]", r"\[mx\.example\] is not a numeric address"),
    ("local:", r"empty unix socket path"),
    ("unix:/" + "p" * 107, r"unix socket path longer than 107 bytes"),
    ("tcp:8891@127.0.0.1", r'unknown socket type "tcp"'),
    ("inet:8891@bad_host!", r"neither an address nor a host name"),
    ("inet:18891@nonexistent.invalid", r"nonexistent\.invalid: Name or service not known"),
    ("inet:025@127.0.0.1", r"port 025: leading zeros are not allowed"),
    ("inet6:2001:db8::1:8891", r"written in brackets: inet6:\[2001:db8::1\]:8891"),
    ("inet:8891@127.1", r"neither a dotted-quad address \(a\.b\.c\.d\) nor a host name"),
    ("inet6:[::ffff:127.0.0.1]:8891", r"IPv4-mapped .*; write inet:127\.0\.0\.1:8891"),
])
def test_malformed_socket_strings_are_refused_with_file_line_and_key(workdir, value,
                                                                     message):
    conf = workdir / "bad.conf"
    conf.write_text(f'user = "root";\nstate_dir = "{workdir}";\n'
                    f'milter {{\n  mode = "0660";\n  listen = "{value}";\n}}\n')
    res = sluiced_check(conf)
    assert res.returncode != 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    shown = value if len(value) <= 100 else value[:100] + "..."
    assert re.search(rf'{re.escape(str(conf))}:5: milter\.listen: "{re.escape(shown)}": '
                     rf'.*{message}', out), out


def test_inet6_wildcard_in_libmilters_form_takes_ipv4_clients_too(sluiced):
    """libmilter leaves IPV6_V6ONLY alone, so its inet6:PORT takes IPv4 clients on a
    Linux default; sluiced does the same for that form (and keeps inet6:[::]:PORT v6-only,
    as test_libmilter_forms_listen's [::1] shows)."""
    port = free_port()
    s = sluiced(milter_config(listen=f"inet6:{port}"))
    s.log.wait_for(rf" milter listening on inet6:{port}: \[::\]:{port} \(and IPv4\)$",
                   flags=re.M)
    with milter_wire.MilterClient(f"inet:127.0.0.1:{port}") as m:
        assert m.negotiate()[0] == 6
    assert connects(socket.AF_INET6, ("::1", port))


def control_config(workdir, listen, extra="", password=True):
    conf = workdir / "control.conf"
    secret = workdir / "control.secret"
    secret.write_text("a control password\n")
    secret.chmod(0o600)
    pw = f'  password_file = "{secret}";\n' if password else ""
    conf.write_text(f'user = "root";\nstate_dir = "{workdir}";\n'
                    f'milter {{ listen = "unix:{workdir}/m.sock"; }}\n'
                    f'control {{\n  listen = "{listen}";\n{pw}{extra}}}\n')
    return conf


def test_an_inet_control_socket_other_hosts_reach_must_be_allowed(workdir):
    port = free_port()
    conf = control_config(workdir, f"inet:{port}")
    res = sluiced_check(conf)
    assert res.returncode != 0, res
    assert re.search(rf'{re.escape(str(conf))}:5: control\.listen: "inet:{port}" can be '
                     r"reached from other hosts, and the control password crosses the network "
                     r"in clear: .*set allow_remote = true", res.stderr), res.stderr
    res = sluiced_check(control_config(workdir, f"inet:{port}", "  allow_remote = true;\n"))
    assert res.returncode == 0, res.stderr
    res = sluiced_check(control_config(workdir, f"inet:{port}@127.0.0.1"))
    assert res.returncode == 0, res.stderr


def test_sluice_connects_to_a_control_socket_in_libmilters_form(sluiced, sluice_cli,
                                                                monkeypatch):
    port = free_port()
    spec = f"inet:{port}@127.0.0.1"
    s = sluiced(milter_config().replace('listen = "unix:@DIR@/control.sock"',
                                        f'listen = "{spec}"; password_file = '
                                        '"@DIR@/control.secret"'), start=False)
    (s.dir / "control.secret").write_text("pw\n")
    (s.dir / "control.secret").chmod(0o600)
    s.start()
    monkeypatch.setenv("SLUICE_CONTROL_PASSWORD", "pw")
    assert f'listen = "{spec}"' in s.config_text
    res = s.cli("status", socket_path=spec)
    assert res.returncode == 0 and res.stdout, res
    # a name: its addresses tried in turn
    res = s.cli("status", socket_path=f"inet:{port}@localhost")
    assert res.returncode == 0 and res.stdout, res
    res = s.cli("status", socket_path=f"inet:{port}@nonexistent.invalid", check=False)
    assert res.returncode != 0 and f'"inet:{port}@nonexistent.invalid": nonexistent.invalid: ' \
        in res.stderr, res
    for bad, why in (("inet:0@127.0.0.1", "port 0 is out of range 1-65535"),
                     ("local:/" + "p" * 200, "longer than 107 bytes"),
                     ("inet:x", 'port "x" is not a number')):
        res = s.cli("status", socket_path=bad, check=False)
        assert res.returncode != 0 and why in res.stderr, res


# ---------------------------------------------------------------------------------------
# JSON: UTF-8 passes through, ill-formed bytes become U+FFFD

UTF8_FROM = "\u00fc@ex\u00e4mple.org"
UTF8_RCPT = "j\u00f6rg@b\u00fccher.example"
def cli_json(s, *args):
    """`sluice ARGS --json`: its raw output must be valid UTF-8 (decoded strictly), and
    strict JSON (json.loads refuses a raw control character): one document, or one a line.
    No byte of the UTF-8 text may come out as a \\u00XX escape (the old mojibake)."""
    res = subprocess.run([SLUICE, "-s", s.control_socket, *args, "--json"],
                         capture_output=True, timeout=30)
    assert res.returncode == 0, res
    text = res.stdout.decode("utf-8")
    assert not re.search(r"\\u00[89a-f][0-9a-f]", text), text
    try:
        return json.loads(text)
    except ValueError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_smtputf8_addresses_come_out_of_queue_json_as_sent(sluiced):
    port = free_port()
    dead = free_port()      # the relay cannot deliver: the message stays queued
    config = intake_config(port) + (
        'relay {\n  retry { min = 1h; max = 2h; }\n}\n'
        f'route "isp" {{\n  domains = ["*"];\n  smarthost = "[127.0.0.1]:{dead}";\n'
        '  tls = "none";\n}\n')
    s = sluiced(config)
    with Client(("127.0.0.1", port)) as c:
        assert c.reply().code == 220
        c.expect("EHLO client.sluice.test", "250")
        c.expect(f"MAIL FROM:<{UTF8_FROM}> SMTPUTF8", "250")
        c.expect(f"RCPT TO:<{UTF8_RCPT}>", "250")
        c.expect("DATA", "354")
        c.send("Subject: caf\u00e9\r\n\r\nna\u00efve\r\n.\r\n".encode())
        qid = qid_of(c.reply())

    listed = cli_json(s, "queue")
    listed = {m["id"]: m for m in (listed if isinstance(listed, list) else [listed])}
    assert listed[qid]["sender"] == UTF8_FROM, listed[qid]
    assert [r["address"] for r in listed[qid]["recipients"]] == [UTF8_RCPT], listed[qid]
    shown = cli_json(s, "queue", "show", qid)
    shown = shown[0] if isinstance(shown, list) else shown
    assert shown["sender"] == UTF8_FROM and shown["smtputf8"] is True, shown
    assert shown["recipients"][0]["address"] == UTF8_RCPT, shown
    assert shown["recipients"][0]["status"] == "T", shown
    # the lanes, and the rest that --json prints, parse as strictly
    wait_until(lambda: cli_json(s, "lanes"), 10, "a lane in `sluice lanes --json`")
    cli_json(s, "status")
    cli_json(s, "stats")


def test_ill_formed_bytes_from_a_milter_peer_become_u_fffd(sluiced):
    """A milter peer's bytes are not checked as UTF-8 (Postfix passes what its client
    sent): a key made of them comes out of --json as valid UTF-8, each bad byte U+FFFD."""
    s = sluiced(milter_config(extra=(
        'limit "per-rcpt" { stage = "rcpt"; key = "rcpt"; count = "messages"; '
        'rate = ["1/1h"]; action = "tempfail"; }\n')))
    rcpts = {b"<b\xe9d@example.org>": "b\ufffdd@example.org",             # Latin-1
             b"<s\xed\xa0\x80r@example.org>": "s\ufffd\ufffd\ufffdr@example.org",  # surrogate
             "<\u00fc\u2028@ex\u00e4mple.org>".encode(): "\u00fc\u2028@ex\u00e4mple.org"}
    with milter_wire.MilterClient(f"unix:{s.milter_socket}") as m:
        m.negotiate()
        m.connect()
        m.helo()
        out = m.message("<sender@example.net>", list(rcpts))
        assert all(r[0] == milter_wire.CONTINUE for r in out["rcpt"]), out
    res = subprocess.run([SLUICE, "-s", s.control_socket, "limits", "top", "--json"],
                         capture_output=True, timeout=30)
    assert b"\\u2028" in res.stdout and b"\\ufffd" in res.stdout, res.stdout
    keys = {e["key"] for e in cli_json(s, "limits", "top")}
    for want in rcpts.values():
        assert any(want.lower() in k.lower() for k in keys), (want, keys)


# ---------------------------------------------------------------------------------------
# units: k/M/G are powers of ten, Ki/Mi/Gi of two; a size takes only Ki/Mi/Gi

def sizes_config(workdir, max_message_size, max_line_length="998"):
    conf = workdir / "units.conf"
    conf.write_text(f'user = "root";\nstate_dir = "{workdir}";\n'
                    f'intake {{\n  listen = "unix:{workdir}/i.sock";\n'
                    f'  max_message_size = {max_message_size};\n'
                    f'  max_line_length = {max_line_length};\n}}\n'
                    f'queue {{ dir = "{workdir}/q"; }}\n')
    return conf


@pytest.mark.parametrize("value, message", [
    ("10M", r'"10M" is ambiguous: write 10MiB \(10485760 bytes\) or 10000000$'),
    ("10MB", r'"10MB" is ambiguous: write 10MiB \(10485760 bytes\) or 10000000$'),
    ("64kb", r'"64kb" is ambiguous: write 64KiB \(65536 bytes\) or 64000$'),
    ("1g", r'"1g" is ambiguous: write 1GiB \(1073741824 bytes\) or 1000000000$'),
    ("1050G", r'"1050G" is ambiguous: write 1050000000000$'),
    ("10MiBs", r'expected a size in bytes such as 512, 64KiB, 10MiB or 1GiB'),
])
def test_a_size_with_a_decimal_unit_is_refused_naming_both_readings(workdir, value, message):
    conf = sizes_config(workdir, value)
    res = sluiced_check(conf)
    assert res.returncode != 0, res
    assert re.search(rf"{re.escape(str(conf))}:5: intake\.max_message_size: {message}",
                     res.stderr, re.M), res.stderr


def test_an_octet_count_is_a_size(workdir):
    conf = sizes_config(workdir, "10MiB", max_line_length="2k")
    res = sluiced_check(conf)
    assert res.returncode != 0, res
    assert re.search(rf'{re.escape(str(conf))}:6: intake\.max_line_length: "2k" is '
                     r"ambiguous: write 2KiB \(2048 bytes\) or 2000$", res.stderr,
                     re.M), res.stderr


@pytest.mark.parametrize("value, printed", [
    ("10MiB", "10MiB"), ("10Mi", "10MiB"), ("10000000", "10000000"),
    ("10485760", "10MiB"), ("1536KiB", "1536KiB"), ("2GiB", "2GiB"), ("3000B", "3000"),
])
def test_sizes_are_read_and_printed_back_in_a_form_read_again(workdir, value, printed):
    conf = sizes_config(workdir, value, max_line_length="1KiB")
    res = sluiced_check(conf)
    assert res.returncode == 0, res
    dump = subprocess.run([SLUICED, "-D", "-c", str(conf)], capture_output=True, text=True,
                          timeout=30)
    assert dump.returncode == 0, dump
    assert re.search(rf"^\s*max_message_size = {printed};", dump.stdout, re.M), dump.stdout
    assert re.search(r"^\s*max_line_length = 1KiB;", dump.stdout, re.M), dump.stdout
    # what -D printed is itself a configuration sluiced reads, to the same values
    again = workdir / "again.conf"
    again.write_text(dump.stdout)
    res = sluiced_check(again)
    assert res.returncode == 0, res.stderr
    dump2 = subprocess.run([SLUICED, "-D", "-c", str(again)], capture_output=True,
                           text=True, timeout=30)
    assert dump2.stdout == dump.stdout
