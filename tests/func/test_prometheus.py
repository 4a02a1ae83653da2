"""The shipped Prometheus rules and Grafana dashboard against a live sluiced.

sluiced runs as in test_metrics.py (a milter, a policy service, an intake with its queue,
a route to a smarthost that wants AUTH, two rules, a host class, the memory store).

- Every metric name the dashboard's queries (and its variables) and the rules file's
  expressions use is on a live scrape of /metrics, and the dashboard is valid JSON with
  the shape Grafana imports.  Names are taken from PromQL roughly but strictly: strings,
  ranges, label matchers, `by (...)`-style label lists and Grafana variables are cut out,
  then every identifier not followed by "(" that is not a keyword is a metric name; each
  must look like one of sluice's (sluice_*, process_*, or a recorded sluice:*), so a
  label name that slipped through fails the test instead of passing unseen.
- Debian's `prometheus` server on loopback (its own data directory) scrapes sluiced every
  second with the shipped rules evaluated every second; after real milter traffic (a
  refused recipient, a protocol error), a policy request and mail relayed through the
  intake to the smarthost, its HTTP API shows every rule loaded with health "ok", each
  recording rule's series with plausible values, every dashboard query accepted and
  (but for the suspended lanes' reasons) answered, and the milter protocol-error alert
  pending.  About 10 s.
What is not tested: Grafana itself (not packaged in Debian) rendering the dashboard.
"""

import json
import pathlib
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import free_port, wait_until
from peers.milter_wire import TEMPFAIL
from peers.smarthost import smarthost  # noqa: F401 (fixture)
from test_metrics import milter_four_recipients, policy_ask, scrape, send_mail
from test_metrics import setup  # noqa: F401 (fixture)
from test_policy import policy_request

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
RULES = ROOT / "etc" / "prometheus" / "sluice-rules.yml"
DASHBOARD = ROOT / "etc" / "grafana" / "sluice.json"
PROMETHEUS = "/usr/bin/prometheus"
# the one dashboard query with nothing to show while no lane is suspended
DASHBOARD_EMPTY_NOW = ('max by (lane, reason) (sluice_lane_suspension_info{job=~".*", '
                       'instance=~".*"})')

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "offset", "bool", "inf", "nan", "atan2",
            # aggregation operators, followed by "by (...)" rather than "("
            "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
            "bottomk", "topk", "quantile"}


def promql_metric_names(expr):
    """The metric names an expression reads (see the module's docstring)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\$\{?\w+\}?", "", e)                     # Grafana variables
    e = re.sub(r"\[[^\]]*\]", "", e)                       # ranges, subqueries
    e = re.sub(r"\{[^}]*\}", "", e)                        # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\boffset\s+\w+", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in KEYWORDS or re.fullmatch(r"\d+\w*", word):
            continue
        names.add(word)
    return names


def test_promql_metric_names_parser():
    assert promql_metric_names(
        'sum by (rule, verdict) (rate(sluice_rule_decisions_total{job=~"$job", '
        'verdict=~"tempfail|reject"}[$__rate_interval]))') == {"sluice_rule_decisions_total"}
    assert promql_metric_names(
        "a:b:rate5m > 4 * avg_over_time(a:b:rate5m[1d] offset 30m) and on (x) c_total"
    ) == {"a:b:rate5m", "c_total"}
    assert promql_metric_names("time() - process_start_time_seconds{x=\"a{b}\"}") == \
        {"process_start_time_seconds"}
    assert promql_metric_names("histogram_quantile(0.95, sum by (le) (rate(h_bucket[5m])))") \
        == {"h_bucket"}


def dashboard_queries(dash):
    """Every PromQL text of the dashboard: the panels' targets and the variables'."""
    out = []

    def walk(panels):
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            out.append(m.group(1) if m else q)
    return out


def rules_file():
    """(recorded names, expressions) of the shipped rules, read without a YAML parser:
    `record:` lines and the `expr:` values (one line, or a folded block)."""
    records, exprs = set(), []
    lines = RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- record: (\S+)$", line):
            records.add(m.group(1))
        elif m := re.match(r"(\s*)expr: (.*)$", line):
            if m.group(2) in (">-", "|", ">"):
                block = []
                for nxt in lines[i + 1:]:
                    if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= len(m.group(1)):
                        break
                    block.append(nxt.strip())
                exprs.append(" ".join(block))
            else:
                exprs.append(m.group(2))
    return records, exprs


def exposed_names(families):
    names = set(families)
    for fam in families.values():
        names.update(n for n, _, _ in fam["samples"])
    return names


def test_dashboard_and_rules_use_only_exposed_metrics(setup):
    sd, sh, ports = setup()
    text, families = scrape(ports["metrics"])
    exposed = exposed_names(families)
    for family in ("sluice_lane_suspended", "sluice_store_on_failure",
                   "sluice_queue_oldest_message_age_seconds", "process_cpu_seconds_total"):
        assert family in exposed, family

    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36 and dash["title"] and dash["uid"]
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    ids = []

    def check_panels(panels):
        for p in panels:
            ids.append(p["id"])
            assert {"type", "title", "gridPos"} <= set(p), p
            if p["type"] != "row":
                assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p
                assert p["targets"], p["title"]
            check_panels(p.get("panels", []))
    check_panels(dash["panels"])
    assert len(ids) == len(set(ids)), "panel ids repeat"
    boxes = [(p["title"], p["gridPos"]) for p in dash["panels"]]
    for i, (a, g) in enumerate(boxes):
        assert g["x"] + g["w"] <= 24, a
        for b, h in boxes[i + 1:]:
            assert not (g["x"] < h["x"] + h["w"] and h["x"] < g["x"] + g["w"] and
                        g["y"] < h["y"] + h["h"] and h["y"] < g["y"] + g["h"]), (a, b)

    records, exprs = rules_file()
    assert len(records) >= 8 and len(exprs) == 18, (records, len(exprs))
    used = {}
    for where, queries in (("dashboard", dashboard_queries(dash)), ("rules", exprs)):
        assert queries, where
        for q in queries:
            names = promql_metric_names(q)
            assert names, f"{where}: no metric name found in {q!r}"
            for n in names:
                assert re.fullmatch(r"(sluice|process)_\w+|sluice:\w+(:\w+)?", n), \
                    f"{where}: {n!r} from {q!r} is not a metric name: the parser is wrong"
                used.setdefault(n, where)
    missing = {n: w for n, w in used.items() if n not in exposed and n not in records}
    assert not missing, f"used but not on the page: {missing}"
    # the dashboard covers every part of the page it promises
    dash_names = set().union(*(promql_metric_names(q) for q in dashboard_queries(dash)))
    for n in ("sluice_rule_decisions_total", "sluice_session_duration_seconds_bucket",
              "sluice_session_work_seconds_bucket", "sluice_queue_messages",
              "sluice_queue_oldest_message_age_seconds", "sluice_lane_suspended",
              "sluice_lane_sends_total", "sluice_store_up", "sluice_store_on_failure",
              "process_cpu_seconds_total", "process_resident_memory_bytes",
              "process_open_fds"):
        assert n in dash_names, n


# ---- a real Prometheus ------------------------------------------------------------------

class Prometheus:
    def __init__(self, workdir, target):
        self.port = free_port()
        self.dir = workdir / "prometheus"
        self.dir.mkdir()
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: sluice
    static_configs:
      - targets: ["127.0.0.1:{target}"]
""")
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, q):
        """{frozenset(labels without __name__): value} of an instant query."""
        return {frozenset((k, v) for k, v in s["metric"].items() if k != "__name__"):
                float(s["value"][1]) for s in self.api("query", query=q)["result"]}

    def ready(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            assert self.proc.poll() is None, (self.dir / "prometheus.log").read_text()
            return False

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus(workdir):
    if not shutil.which(PROMETHEUS):
        pytest.skip("Debian's prometheus package is not installed")
    started = []

    def factory(target):
        p = Prometheus(workdir, target)
        started.append(p)
        wait_until(p.ready, 20, "prometheus ready")
        return p
    yield factory
    for p in started:
        p.stop()


def one(series, **labels):
    want = frozenset(labels.items())
    found = [v for k, v in series.items() if want <= k]
    assert len(found) == 1, (labels, series)
    return found[0]


def test_prometheus_runs_the_shipped_rules(setup, prometheus):
    sd, sh, ports = setup()
    prom = prometheus(ports["metrics"])
    wait_until(lambda: prom.query('up{job="sluice"} == 1'), 15, "a first scrape")
    t0 = time.monotonic()
    # milter: a message to four recipients of one domain; "strict" refuses the fourth
    replies = milter_four_recipients(ports["milter"])
    assert replies[3] in (TEMPFAIL, b"y"), replies
    # a milter peer that speaks nonsense: a packet longer than any allowed
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(ports["milter"])
        s.sendall(b"\x7f\xff\xff\xffO")
        assert s.recv(100) == b""
    assert policy_ask(ports["policy"], policy_request(
        "RCPT", "p.1", sender="b@example.net", recipient="x@example.com")) == "action=DUNNO\n\n"
    # the relay: three recipients in two messages through the intake to the smarthost.
    # A lane is on the page from its first mail on, so rate() sees only what comes after
    # Prometheus first scraped it: the second message.
    send_mail(ports["intake"], ["u1@example.net", "u2@example.net"])
    sh.wait_accepted(1, timeout=30)
    wait_until(lambda: prom.query('sluice_lane_recipients_total{result="delivered"} == 2'), 10,
               "the lane's first scrape")
    send_mail(ports["intake"], ["u3@example.net"])
    sh.wait_accepted(2, timeout=30)

    # every rule loaded and evaluated without error
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert [g["file"] for g in groups] == [str(RULES)]
    assert len(rules) == 18
    for r in rules:
        assert r["health"] == "ok", r
    records = {r["name"] for r in rules if r["type"] == "recording"}
    alerts = {r["name"] for r in rules if r["type"] == "alerting"}
    assert alerts == {"SluiceLaneSuspended", "SluiceLaneBanned", "SluiceQueueGrowing",
                      "SluiceQueueAging", "SluiceStoreOnFailure",
                      "SluiceRuleRefusingFarMoreThanUsual", "SluiceMilterProtocolErrors",
                      "SluiceSessionsEvicted", "SluiceDown"}

    # the recorded series, once the rates have seen the traffic and the queue is empty
    def recorded():
        r = {name: prom.query(name) for name in records}
        if not all(r.values()):
            return None
        if one(r["sluice:lane_recipients:rate5m"], lane="isp", result="delivered") <= 0:
            return None
        if one(r["sluice:queue_messages:sum"]) != 0:
            return None
        return r
    r = wait_until(recorded, 20, "every recorded series, after the traffic", interval=0.5)
    elapsed = time.monotonic() - t0 + 5   # rate() may extrapolate up to a window's end

    def plausible(v, events):
        """a per-second rate of a counter that grew by `events` during the test"""
        return events / (elapsed + 300) * 0.5 <= v <= events / 1.0

    base = {"job": "sluice", "instance": f"127.0.0.1:{ports['metrics']}"}
    dec = r["sluice:rule_decisions:rate5m"]
    assert plausible(one(dec, rule="strict", verdict="tempfail", **base), 1)
    assert plausible(one(dec, rule="strict", verdict="continue", **base), 3 + 1)
    assert plausible(one(dec, rule="shadow", verdict="warn", **base), 2)
    assert plausible(one(r["sluice:rule_refusals:rate5m"], rule="strict", **base), 1)
    # a warn rule's hits are not refusals
    assert not [k for k in r["sluice:rule_refusals:rate5m"] if ("rule", "shadow") in k]
    assert plausible(one(r["sluice:protocol_errors:rate5m"], service="milter", **base), 1)
    assert one(r["sluice:protocol_errors:rate5m"], service="policy", **base) == 0
    assert plausible(one(r["sluice:sessions:rate5m"], service="milter", **base), 2)
    assert one(r["sluice:queue_messages:sum"], **base) == 0
    assert one(r["sluice:queue_oldest_message_age_seconds:max"], **base) == 0
    assert plausible(one(r["sluice:lane_sends:rate5m"], lane="isp", **base), 1)
    assert plausible(one(r["sluice:lane_recipients:rate5m"], lane="isp", result="delivered",
                         **base), 1)
    assert one(r["sluice:lane_recipients:rate5m"], lane="isp", result="failed", **base) == 0
    # 2 sends counted in the lane's 60 s window of 10
    assert one(r["sluice:lane_budget_used:ratio"], lane="isp", **base) == pytest.approx(0.2)

    # the dashboard's queries, with its variables at their "all" values, are PromQL this
    # Prometheus accepts (a syntax error is an HTTP 400), and they find the traffic
    dash = json.loads(DASHBOARD.read_text())
    empty = []
    for q in dashboard_queries(dash):
        q = q.replace("$__rate_interval", "1m").replace("$job", ".*").replace("$instance", ".*")
        if not prom.api("query", query=q)["result"]:
            empty.append(q)
    assert empty == [DASHBOARD_EMPTY_NOW], empty

    # the protocol error's alert matched the real series (pending: its for: is 1m); the
    # others are quiet
    active = wait_until(lambda: prom.api("alerts")["alerts"], 10, "an active alert")
    assert [(a["labels"]["alertname"], a["labels"]["service"], a["state"]) for a in active] \
        == [("SluiceMilterProtocolErrors", "milter", "pending")], active
