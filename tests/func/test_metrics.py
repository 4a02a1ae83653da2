"""The Prometheus endpoint (metrics {} block): what a scraper reads after real traffic.

sluiced runs with a milter, the Postfix policy service, an intake and a route to a
smarthost (peers/smarthost.py) that wants AUTH; a `warn` rule and a `tempfail` rule watch
recipients, and one host class takes every incoming milter session.  The tests drive
milter sessions (peers/milter_wire.py), policy requests, and mail through the intake to the
smarthost, then scrape /metrics with urllib and parse the page strictly: every line is a
HELP, a TYPE or a well-formed sample; a family's HELP and TYPE come before its samples
and it appears once; a histogram's buckets are cumulative and end with +Inf equal to its
_count.  They assert the numbers an administrator would check.  Also: paths other than
/metrics, methods other than GET, the cap on connections, no endpoint without the block,
and precise configuration errors.
"""

import calendar
import math
import os
import re
import shutil
import signal
import smtplib
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import SLUICED, free_port, require_binary, wait_until
from peers.milter_wire import CONTINUE, NO_REPLY, NOT_SENT, TEMPFAIL, MilterClient
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_policy import policy_request

SECRET = "s3cret-Pw-4711"

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(\{{(?:{LABEL}(?:,{LABEL})*)?\}})? (\S+)(?: -?\d+)?$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def unescape(v):
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def parse_value(text):
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?", text):
        raise AssertionError(f"bad value {text!r}")
    return float(text)


def parse_exposition(text):
    """{family: {"type", "help", "samples": [(name, {labels}, value)]}}; raises
    AssertionError on anything the text format 0.0.4 does not allow here."""
    assert text.endswith("\n"), "the page must end with a newline"
    families = {}
    current = None
    seen_type = set()
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n}: {line!r}"
        if line.startswith("#"):
            m = re.fullmatch(rf"# (HELP|TYPE) ({NAME}) (.*)", line)
            assert m, f"malformed comment, {where}"
            kind, name, rest = m.groups()
            if kind == "HELP":
                assert name not in families, f"family {name} given twice, {where}"
                assert rest.strip(), f"empty HELP, {where}"
                families[name] = {"help": rest, "type": None, "samples": []}
                current = name
            else:
                assert current == name, f"TYPE without its HELP first, {where}"
                assert name not in seen_type and rest in TYPES, where
                seen_type.add(name)
                families[name]["type"] = rest
            continue
        m = SAMPLE.match(line)
        assert m, f"malformed sample, {where}"
        name, labels_text, value = m.groups()
        assert current is not None and families[current]["type"], \
            f"sample before its family's HELP and TYPE, {where}"
        fam = families[current]
        allowed = {current}
        if fam["type"] == "histogram":
            allowed = {current + "_bucket", current + "_sum", current + "_count"}
        assert name in allowed, f"sample {name} inside family {current}, {where}"
        labels = {}
        if labels_text:
            for k, v in LABEL_RE.findall(labels_text):
                assert k not in labels, f"label {k} twice, {where}"
                labels[k] = unescape(v)
        fam["samples"].append((name, labels, parse_value(value)))
    for name, fam in families.items():
        assert fam["type"], f"{name} has no TYPE"
        if fam["type"] == "histogram":
            check_histogram(name, fam["samples"])
        if fam["type"] == "counter":
            assert name.endswith("_total"), f"counter {name} does not end in _total"
    return families


def check_histogram(name, samples):
    series = {}
    for sname, labels, value in samples:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        s = series.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if sname.endswith("_bucket"):
            s["buckets"].append((parse_value(labels["le"]), value))
        elif sname.endswith("_sum"):
            s["sum"] = value
        else:
            s["count"] = value
    assert series, f"histogram {name} has no series"
    for key, s in series.items():
        les = [le for le, _ in s["buckets"]]
        counts = [c for _, c in s["buckets"]]
        assert les == sorted(les) and les[-1] == math.inf, (name, key, les)
        assert counts == sorted(counts), f"{name}{key}: buckets not cumulative {counts}"
        assert s["count"] is not None and s["sum"] is not None, (name, key)
        assert counts[-1] == s["count"], (name, key, counts[-1], s["count"])
        assert s["sum"] >= 0


def scrape(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200
        ctype = r.headers["Content-Type"]
        assert ctype.startswith("text/plain") and "version=0.0.4" in ctype, ctype
        text = r.read().decode()
    return text, parse_exposition(text)


def value(families, name, **labels):
    """The one sample of family or sample name with exactly these labels."""
    fam = families.get(name) or families[re.sub(r"_(bucket|sum|count)$", "", name)]
    found = [v for n, lab, v in fam["samples"] if n == name and lab == labels]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def config(metrics_port, milter_sock, policy_port, intake_port, smarthost_port, secret_file,
           metrics=None):
    metrics_block = (metrics.replace("@MPORT@", str(metrics_port)) if metrics is not None
                     else f'metrics {{ listen = "inet:127.0.0.1:{metrics_port}"; }}')
    return f"""workers = 2;
stats_interval = 0;
shutdown_timeout = 5s;
state_dir = "@DIR@";
log {{ target = "stderr"; level = "info"; }}
control {{ listen = "unix:@DIR@/control.sock"; }}
milter {{ listen = "unix:{milter_sock}"; }}
policy {{ listen = "inet:127.0.0.1:{policy_port}"; }}
intake {{ listen = "inet:127.0.0.1:{intake_port}"; hostname = "relay.sluice.test"; }}
queue {{ dir = "@DIR@/queue"; }}
{metrics_block}
class "all" {{ hosts = ["*"]; sessions = 5; inbound = 5; }}
limit "shadow" {{
  stage = "rcpt"; key = "sender"; count = "recipients"; rate = ["2/1m"]; action = "warn";
}}
limit "strict" {{
  stage = "rcpt"; key = "rcpt_domain"; count = "recipients"; rate = ["3/1m"];
  action = "tempfail"; reply = "451 4.7.1 Too many recipients for %{{key}}";
}}
relay {{ retry {{ min = 1s; max = 2s; }} }}
route "isp" {{
  domains = ["*"];
  smarthost = "[127.0.0.1]:{smarthost_port}";
  tls = "none";
  auth {{ user = "me"; password_file = "{secret_file}"; plaintext = true; }}
  rate = ["10/1m"];
}}
"""


@pytest.fixture
def setup(sluiced, smarthost, workdir):
    """Factory: setup(metrics=None) -> (sluiced, smarthost, ports dict)."""
    def factory(metrics=None):
        sh = smarthost(auth_user="me", auth_password=SECRET, auth_required=True)
        secret = workdir / "isp.secret"
        secret.write_text(SECRET + "\n")
        secret.chmod(0o600)
        ports = {"metrics": free_port(), "policy": free_port(), "intake": free_port(),
                 "milter": str(workdir / "milter.sock")}
        sd = sluiced(config(ports["metrics"], ports["milter"], ports["policy"],
                            ports["intake"], sh.port, secret, metrics=metrics))
        return sd, sh, ports
    return factory


def send_mail(port, rcpts, sender="list@example.org"):
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as s:
        msg = (f"From: <{sender}>\r\nTo: <list@example.org>\r\nSubject: hi\r\n"
               f"Message-ID: <{time.time()}@example.org>\r\n\r\nHello.\r\n")
        refused = s.sendmail(sender, rcpts, msg)
        assert not refused, refused


def policy_ask(port, text):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(text.encode())
        data = b""
        while not data.endswith(b"\n\n"):
            chunk = c.recv(4096)
            assert chunk, "the policy service closed the connection"
            data += chunk
    return data.decode()


def passed(reply):
    return reply in (NOT_SENT, NO_REPLY) or reply[0] == CONTINUE


def milter_four_recipients(path):
    """One milter session from <a@example.net> to r0..r3@example.org; the RCPT replies."""
    with MilterClient("unix:" + path) as m:
        m.negotiate()
        assert m.connect()[0] == CONTINUE
        assert passed(m.helo())
        assert passed(m.mail("<a@example.net>"))
        replies = [m.rcpt(f"<r{i}@example.org>")[0] for i in range(4)]
        m.quit()
    return replies


def test_metrics_after_real_traffic(setup):
    sd, sh, ports = setup()
    mport = ports["metrics"]

    # milter: one message to four recipients of one domain from one sender.  shadow
    # (2/1m per sender, warn): 2 within, 2 over; strict (3/1m per domain, tempfail): 3
    # within (the third at 100% of its burst: near the limit), the fourth refused.
    replies = milter_four_recipients(ports["milter"])
    assert replies[:3] == [CONTINUE] * 3
    assert replies[3] in (TEMPFAIL, b"y"), replies
    # policy: one recipient of another domain, within both rules
    assert policy_ask(ports["policy"], policy_request(
        "RCPT", "p.1", sender="b@example.net",
        recipient="x@example.com")) == "action=DUNNO\n\n"
    # intake -> queue -> relay -> smarthost: two messages, four recipients
    send_mail(ports["intake"], ["u1@example.net", "u2@example.net", "u3@example.net"])
    send_mail(ports["intake"], ["u4@example.net"])
    sh.wait_accepted(2, timeout=30)

    def settled():
        _, f = scrape(mport)
        return (value(f, "sluice_lane_recipients_total", lane="isp", result="delivered") == 4
                and value(f, "sluice_queue_messages", state="queued") == 0
                and value(f, "sluice_sessions", service="milter") == 0)
    wait_until(settled, 20, "deliveries to show in the metrics")
    text, f = scrape(mport)

    # decisions per rule and verdict
    assert value(f, "sluice_rule_decisions_total", rule="shadow", verdict="continue") == 3
    assert value(f, "sluice_rule_decisions_total", rule="shadow", verdict="warn") == 2
    assert value(f, "sluice_rule_decisions_total", rule="strict", verdict="continue") == 4
    assert value(f, "sluice_rule_decisions_total", rule="strict", verdict="tempfail") == 1
    assert value(f, "sluice_rule_near_limit_total", rule="strict") == 1
    assert value(f, "sluice_rule_near_limit_total", rule="shadow") == 1
    # the store answered every decision (five RCPT events), in memory, without error
    assert value(f, "sluice_store_decisions_total", store="memory") == 5
    assert value(f, "sluice_store_errors_total", store="memory") == 0
    assert value(f, "sluice_store_decision_seconds_count", store="memory") == 5
    assert value(f, "sluice_store_up", store="memory") == 1
    assert value(f, "sluice_store_on_failure", store="memory") == 0
    # sessions per service, and their histograms agree with the counters
    assert value(f, "sluice_sessions_total", service="milter") == 1
    assert value(f, "sluice_connections_total", service="policy") == 1
    assert value(f, "sluice_connections_total", service="intake") == 2
    for svc in ("milter", "policy", "intake", "control"):
        assert value(f, "sluice_session_duration_seconds_count", service=svc) == \
            value(f, "sluice_sessions_total", service=svc)
        assert value(f, "sluice_protocol_errors_total", service=svc) == 0
    # the milter session gave its slot back; the relay's connection to the smarthost
    # (127.0.0.1 is in the class too), kept open while idle, holds one
    out_now = value(f, "sluice_relay_connections")
    assert out_now == value(f, "sluice_lane_connections", lane="isp")
    assert value(f, "sluice_class_slots", **{"class": "all"}) == out_now
    assert value(f, "sluice_class_entered_total", **{"class": "all"}) == \
        1 + value(f, "sluice_relay_connections_total")
    assert value(f, "sluice_class_slots_limit", direction="inbound", **{"class": "all"}) == 5
    # queue: both committed, nothing left; fsyncs and commits both counted
    assert value(f, "sluice_queue_commits_total") == 2
    assert value(f, "sluice_queue_fsyncs_total") >= 1
    assert value(f, "sluice_queue_accepted_bytes_total") > 100
    assert value(f, "sluice_queue_messages", state="held") == 0
    assert value(f, "sluice_queue_oldest_message_age_seconds") == 0
    # the lane: two transactions, four recipients delivered, its budget and rate
    assert value(f, "sluice_lane_sends_total", lane="isp") == 2
    assert value(f, "sluice_lane_recipients_total", lane="isp", result="failed") == 0
    assert value(f, "sluice_lane_budget_used", lane="isp", window="60s") == 2
    assert value(f, "sluice_lane_budget_limit", lane="isp", window="60s") == 10
    assert value(f, "sluice_lane_rate_factor", lane="isp") == 1
    assert value(f, "sluice_lane_suspended", lane="isp") == 0
    assert value(f, "sluice_relay_dsn_total", kind="bounce") == 0
    # the process
    assert value(f, "sluice_build_info", version=value_label(f, "sluice_build_info")) == 1
    assert value(f, "sluice_threads") >= 5   # main, 2 workers, committer, relay, metrics
    # the standard process_* families of Prometheus's client libraries, checked against
    # /proc (the old sluice_open_fds, sluice_resident_memory_bytes and
    # sluice_start_time_seconds are gone: these replace them)
    for gone in ("sluice_open_fds", "sluice_resident_memory_bytes", "sluice_start_time_seconds"):
        assert gone not in f, gone
    pid = sd.pid
    assert f["process_cpu_seconds_total"]["type"] == "counter"
    assert f["process_cpu_seconds_total"]["help"] == \
        "Total user and system CPU time spent in seconds."
    for name in ("process_open_fds", "process_max_fds", "process_virtual_memory_bytes",
                 "process_resident_memory_bytes", "process_start_time_seconds"):
        assert f[name]["type"] == "gauge", name
    fds = value(f, "process_open_fds")
    assert 5 < fds and abs(fds - len(os.listdir(f"/proc/{pid}/fd"))) <= 2
    with open(f"/proc/{pid}/limits") as lim:
        soft = next(int(line.split()[3]) for line in lim if line.startswith("Max open files"))
    assert value(f, "process_max_fds") == soft
    status = open(f"/proc/{pid}/status").read()
    vm = {k: int(v.split()[0]) * 1024 for k, v in re.findall(r"^(Vm\w+):\s+(.*)$", status, re.M)}
    assert abs(value(f, "process_resident_memory_bytes") - vm["VmRSS"]) < 8 << 20
    assert value(f, "process_resident_memory_bytes") > 1 << 20
    assert abs(value(f, "process_virtual_memory_bytes") - vm["VmSize"]) < 64 << 20
    with open(f"/proc/{pid}/stat") as st:
        ticks = st.read().rsplit(")", 1)[1].split()
    cpu_now = (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    assert 0 <= value(f, "process_cpu_seconds_total") <= cpu_now
    assert cpu_now - value(f, "process_cpu_seconds_total") < 1
    # as client_golang: /proc/PID/stat's starttime (field 22, ticks since boot) after
    # /proc/stat's btime, to the tick; and ps(1)'s start time, to the second
    btime = int(re.search(r"^btime (\d+)$", open("/proc/stat").read(), re.M)[1])
    start = btime + int(ticks[19]) / os.sysconf("SC_CLK_TCK")
    assert abs(value(f, "process_start_time_seconds") - start) < 0.001
    lstart = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True,
                            text=True, check=True, env=dict(os.environ, TZ="UTC", LC_ALL="C"))
    ps_start = calendar.timegm(time.strptime(lstart.stdout.strip(), "%a %b %d %H:%M:%S %Y"))
    assert ps_start <= value(f, "process_start_time_seconds") < ps_start + 1
    # no secret and no key in the page
    assert SECRET not in text
    for key in ("a@example.net", "example.org", "example.com", "b@example.net", "192.0.2.7"):
        assert key not in text, key

    # a suspended lane keeps its mail: queue depth, the reason, and the message's age
    sd.cli("lanes", "suspend", "isp")
    send_mail(ports["intake"], ["late@example.net", "later@example.net"])
    time.sleep(1.2)
    _, f = scrape(mport)
    assert value(f, "sluice_queue_messages", state="queued") == 1
    assert value(f, "sluice_queue_recipients", state="todo") == 2
    assert value(f, "sluice_queue_bytes") > 50
    assert value(f, "sluice_queue_oldest_message_age_seconds") >= 1.0
    assert value(f, "sluice_lane_suspended", lane="isp") == 1
    assert value(f, "sluice_lane_suspension_info", lane="isp",
                 reason="suspended by the operator") == 1
    assert value(f, "sluice_lane_suspensions_total", lane="isp") == 1
    assert len(sh.accepted()) == 2


def value_label(families, name):
    return families[name]["samples"][0][1]["version"]


def test_class_slots_while_sessions_are_held_open(setup):
    sd, sh, ports = setup()
    clients = []
    try:
        for _ in range(3):
            m = MilterClient("unix:" + ports["milter"])
            m.negotiate()
            assert m.connect()[0] == CONTINUE
            clients.append(m)
        _, f = scrape(ports["metrics"])
        assert value(f, "sluice_class_slots", **{"class": "all"}) == 3
        assert value(f, "sluice_sessions", service="milter") == 3
    finally:
        for m in clients:
            m.quit()
    wait_until(lambda: value(scrape(ports["metrics"])[1], "sluice_class_slots",
                             **{"class": "all"}) == 0, 10, "the slots to be given back")


def test_http_paths_methods_and_limits(setup):
    sd, sh, ports = setup(metrics='metrics { listen = "inet:127.0.0.1:@MPORT@"; '
                          'max_connections = 2; }')
    port = ports["metrics"]
    for path in ("/", "/metric", "/metrics/x", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
        assert e.value.code == 404, path
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and "GET" in e.value.headers["Allow"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x" * 10000,
                                 method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 413
    # a query string is no other page
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?x=1", timeout=10) as r:
        assert r.status == 200
    # headers past the bound are refused
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"X-Filler": "a" * 20000})
    with pytest.raises((urllib.error.HTTPError, ConnectionError)) as e:
        urllib.request.urlopen(req, timeout=10)
    if isinstance(e.value, urllib.error.HTTPError):
        assert e.value.code in (400, 413, 431)
    # two idle connections take both places: a third scraper waits until one goes
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    time.sleep(0.3)
    third = socket.create_connection(("127.0.0.1", port), timeout=10)
    third.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    third.settimeout(1.0)
    with pytest.raises(socket.timeout):
        third.recv(100)
    idle[0].close()
    third.settimeout(5.0)
    assert third.recv(100).startswith(b"HTTP/1.0 200")
    third.close()
    idle[1].close()
    # and the daemon goes on serving
    scrape(port)


def test_no_block_no_endpoint(setup):
    sd, sh, ports = setup(metrics="")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", ports["metrics"]), timeout=2).close()
    assert not sd.log.search(r"metrics listening")


def test_reload_resets_rule_counters(setup):
    sd, sh, ports = setup()
    assert policy_ask(ports["policy"], policy_request(
        "RCPT", "p.1", sender="b@example.net", recipient="x@example.com")) == "action=DUNNO\n\n"
    _, f = scrape(ports["metrics"])
    assert value(f, "sluice_rule_decisions_total", rule="strict", verdict="continue") == 1
    mark = sd.log.mark()
    sd.signal(signal.SIGHUP)
    sd.log.wait_for(r"configuration reloaded", after=mark)
    _, f = scrape(ports["metrics"])
    assert value(f, "sluice_reloads_total") == 1
    assert value(f, "sluice_rule_decisions_total", rule="strict", verdict="continue") == 0
    # the store and the sessions keep counting across the reload
    assert value(f, "sluice_store_decisions_total", store="memory") == 1
    assert value(f, "sluice_connections_total", service="policy") == 1


@pytest.mark.parametrize("block, message", [
    ('metrics { listen = "inet:0.0.0.0:9187"; }',
     r':\d+: metrics\.listen: "inet:0\.0\.0\.0:9187" can be reached from other hosts.*'
     r'allow_remote = true'),
    ('metrics { listen = "inet6:[::]:9187"; }', r':\d+: metrics\.listen: .*other hosts'),
    ('metrics { listen = "inet:127.0.0.1:99999"; }',
     r':\d+: metrics\.listen: .*port 99999 is out of range'),
    ('metrics { listen = "http://127.0.0.1:9187"; }', r':\d+: metrics\.listen: .*expected'),
    ('metrics { max_connections = 0; }', r':\d+: metrics\.max_connections: .*out of range'),
    ('metrics { allow_remote = "perhaps"; }', r':\d+: metrics\.allow_remote: '),
    ('metrics { port = 9187; }', r':\d+: metrics\.port: unknown key'),
])
def test_bad_metrics_block_is_a_precise_error(workdir, block, message):
    require_binary(SLUICED, "SLUICED")
    conf = workdir / "bad.conf"
    conf.write_text(f'policy {{ listen = "inet:127.0.0.1:{free_port()}"; }}\n{block}\n')
    res = subprocess.run([SLUICED, "-t", "-c", str(conf)], capture_output=True, text=True,
                         timeout=20)
    assert res.returncode == 1, res
    assert re.search(re.escape(str(conf)) + message, res.stderr), res.stderr


def test_allow_remote_accepts_any_address(workdir):
    require_binary(SLUICED, "SLUICED")
    conf = workdir / "remote.conf"
    conf.write_text(f'policy {{ listen = "inet:127.0.0.1:{free_port()}"; }}\n'
                    'metrics { listen = "inet:0.0.0.0:9187"; allow_remote = true; }\n')
    res = subprocess.run([SLUICED, "-t", "-c", str(conf)], capture_output=True, text=True,
                         timeout=20)
    assert res.returncode == 0, res


def test_scrape_during_the_drain_and_stop(setup):
    """SIGTERM with a milter session open: sluiced drains, the relay's loop has ended, and
    a scrape still answers at once (without the relay's lanes); then sluiced exits 0
    once the session ends, the metrics thread stopped with it."""
    sd, sh, ports = setup()
    send_mail(ports["intake"], ["u1@example.net"])
    sh.wait_accepted(1, timeout=30)
    m = MilterClient("unix:" + ports["milter"])
    m.negotiate()
    assert m.connect()[0] == CONTINUE
    mark = sd.log.mark()
    sd.signal(signal.SIGTERM)
    sd.log.wait_for(r"draining 1 sessions", after=mark)
    time.sleep(0.5)
    started = time.monotonic()
    _, f = scrape(ports["metrics"])
    assert time.monotonic() - started < 5
    assert value(f, "sluice_sessions", service="milter") == 1
    assert "sluice_lane_sends_total" not in f
    m.quit()
    assert sd.wait(20) == 0


def test_redis_away_shows_on_failure_and_no_password(sluiced):
    """The Redis store configured with a password and a server that does not answer:
    decisions follow on_failure = local, and the page says so (store up 0, on_failure
    1, fallbacks counted) without the password."""
    policy_port, mport, dead = free_port(), free_port(), free_port()
    sd = sluiced(f"""workers = 2;
stats_interval = 0;
state_dir = "@DIR@";
log {{ target = "stderr"; level = "info"; }}
policy {{ listen = "inet:127.0.0.1:{policy_port}"; }}
metrics {{ listen = "inet:127.0.0.1:{mport}"; }}
store {{
  type = "redis"; server = "127.0.0.1:{dead}"; password = "{SECRET}";
  timeout = 200ms; on_failure = "local";
}}
limit "strict" {{ stage = "rcpt"; key = "rcpt_domain"; count = "recipients"; rate = ["3/1m"]; }}
""")
    for i in range(2):
        assert policy_ask(policy_port, policy_request(
            "RCPT", f"p.{i}", recipient=f"x{i}@example.com")) == "action=DUNNO\n\n"

    def away():
        _, f = scrape(mport)
        return (value(f, "sluice_store_on_failure", store="redis") == 1
                and value(f, "sluice_store_fallbacks_total", store="redis") >= 2)
    wait_until(away, 10, "the store to report on_failure")
    text, f = scrape(mport)
    assert value(f, "sluice_store_up", store="redis") == 0
    assert value(f, "sluice_rule_decisions_total", rule="strict", verdict="continue") == 2
    assert SECRET not in text


def test_reload_keeps_the_endpoint_where_it_is(setup):
    """A reload that moves the endpoint warns that it takes effect at the next restart;
    the endpoint keeps answering where it is."""
    sd, sh, ports = setup()
    other = free_port()
    sd.write_config(sd.config_text.replace(f"127.0.0.1:{ports['metrics']}",
                                           f"127.0.0.1:{other}"))
    mark = sd.log.mark()
    sd.signal(signal.SIGHUP)
    sd.log.wait_for(r"reload: listen addresses changed; they take effect at the next "
                    r"restart", after=mark)
    sd.log.wait_for(r"configuration reloaded", after=mark)
    _, f = scrape(ports["metrics"])
    assert value(f, "sluice_reloads_total") == 1
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", other), timeout=2).close()


def test_process_figures_left_out_without_proc(tmp_path):
    """Where /proc cannot be read (here an empty tmpfs over it in a private mount
    namespace) the figures it gives are left out, not written as 0: a counter at 0
    would read as a reset, a start time at 0 as a restart.  The rest of the page stays."""
    require_binary(SLUICED, "SLUICED")
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs none /proc"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("a private mount namespace is refused here: " + probe.stderr.strip())
    port = free_port()
    cfg = tmp_path / "sluiced.conf"
    cfg.write_text(f'''user = "root";
state_dir = "{tmp_path}";
log {{ target = "stderr"; level = "info"; }}
control {{ listen = "unix:{tmp_path}/control.sock"; }}
milter {{ listen = "unix:{tmp_path}/milter.sock"; }}
metrics {{ listen = "inet:127.0.0.1:{port}"; }}
''')
    cfg.chmod(0o600)
    log = open(tmp_path / "log", "wb")
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                             'mount -t tmpfs none /proc && exec "$0" -c "$1"', SLUICED,
                             str(cfg)], stdout=log, stderr=log)
    try:
        def page():
            try:
                return scrape(port)
            except OSError:
                return None
        got = wait_until(page, 15, "the metrics page")
        text, f = got
        for gone in ("process_cpu_seconds_total", "process_open_fds",
                     "process_virtual_memory_bytes", "process_resident_memory_bytes",
                     "process_start_time_seconds", "sluice_threads"):
            assert gone not in f and gone not in text, gone
        assert value(f, "process_max_fds") > 0
        assert value(f, "sluice_build_info", version=value_label(f, "sluice_build_info")) == 1
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
