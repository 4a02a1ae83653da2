"""A real Redis Cluster of Debian's redis-server (7.0) on loopback, for the functional tests.

    c = RedisCluster(workdir / "cluster").start()   # 3 masters + 3 replicas, state ok
    ...
    c.stop()                                         # always, at teardown

Each server runs in a subdirectory of its own (node0 ... node5), where it keeps its
nodes.conf: a server killed with SIGKILL and started again from its directory comes back
with its identity (node ID, slots, the master it replicates).  Nothing is persisted
(`--save '' --appendonly no`): a master that restarts is empty.

The cluster is created with `redis-cli --cluster create ... --cluster-replicas 1`; which
server became a master is read from CLUSTER NODES, never assumed.
"""

import json
import signal
import socket
import subprocess
import time

from conftest import free_port, wait_until

REDIS_SERVER = "/usr/bin/redis-server"
REDIS_CLI = "/usr/bin/redis-cli"


# ---------------------------------------------------------------------------------------
# hash slots, computed as Redis does (CRC16/XMODEM of the key or its {hash tag}, mod 16384)

def _crc16(data):
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def key_slot(key):
    """The hash slot of a key (str or bytes), hash tags included."""
    k = key.encode() if isinstance(key, str) else key
    start = k.find(b"{")
    if start >= 0:
        end = k.find(b"}", start + 1)
        if end > start + 1:
            k = k[start + 1:end]
    return _crc16(k) % 16384


# ---------------------------------------------------------------------------------------

def auth_args(password):
    return ["-a", password, "--no-auth-warning"] if password else []


def cli(port, *args, check=True, timeout=10, password=None):
    """`redis-cli -p PORT ARGS...`: its stdout, stripped."""
    r = subprocess.run([REDIS_CLI, "-p", str(port), *auth_args(password), *map(str, args)],
                       capture_output=True,
                       text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"redis-cli -p {port} {args}: {r.stderr}{r.stdout}"
    return r.stdout.strip()


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port():
    """A free port (conftest.free_port) for a cluster node: at most 55535, and with its
    cluster bus port (the port + 10000) free too."""
    for _ in range(1000):
        p = free_port()
        if p <= 55535 and _bindable(p + 10000):
            return p
    raise AssertionError("no free port pair (P, P + 10000) for a cluster node")


class Node:
    """One redis-server of the cluster."""

    def __init__(self, cluster, index, port):
        self.cluster = cluster
        self.index = index
        self.port = port
        self.dir = cluster.dir / f"node{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = None
        self.id = None           # known once the server runs (CLUSTER MYID)

    def __repr__(self):
        return f"<node{self.index} :{self.port} {(self.id or '?')[:8]}>"

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log"),
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.cluster.node_timeout),
                "--cluster-replica-validity-factor", "0",
                "--save", "", "--appendonly", "no",
                # replicas sync at once (the default waits 5 s for more replicas)
                "--repl-diskless-sync-delay", "0"] + self.cluster.extra
        if self.cluster.password:
            args += ["--requirepass", self.cluster.password,
                     "--masterauth", self.cluster.password]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(lambda: self._answers(), 10, f"redis-server on port {self.port}")
        self.id = self.cli("CLUSTER", "MYID")
        return self

    def _answers(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server on port {self.port} exited "
                                 f"{self.proc.returncode}:\n{self.log_tail()}")
        return self.ping()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def ping(self):
        try:
            return self.cli("PING", check=False, timeout=2) == "PONG"
        except subprocess.TimeoutExpired:
            return False

    def cli(self, *args, check=True, timeout=10):
        return cli(self.port, *args, check=check, timeout=timeout,
                   password=self.cluster.password)

    def info(self, section):
        """INFO section (or CLUSTER INFO for "cluster_info") as a dict."""
        out = (self.cli("CLUSTER", "INFO", check=False) if section == "cluster_info"
               else self.cli("INFO", section, check=False))
        d = {}
        for line in out.splitlines():
            k, sep, v = line.strip().partition(":")
            if sep:
                d[k] = v
        return d

    def state_ok(self):
        try:
            return self.info("cluster_info").get("cluster_state") == "ok"
        except subprocess.TimeoutExpired:
            return False

    def role(self):
        try:
            out = self.cli("ROLE", check=False, timeout=2).splitlines()
        except subprocess.TimeoutExpired:
            return None
        return out[0] if out else None

    def keys(self, pattern="*"):
        return [k for k in self.cli("--scan", "--pattern", pattern).splitlines() if k]

    def raw_get(self, key):
        """GET on this very node, also for a slot it is importing (after ASKING)."""
        r = subprocess.run([REDIS_CLI, "-p", str(self.port),
                            *auth_args(self.cluster.password)], input=f"ASKING\nGET {key}\n",
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()[1:]

    def dbsize(self):
        return int(self.cli("DBSIZE"))

    def kill(self):
        """SIGKILL, as a crash: nothing is flushed, the others see the node time out."""
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self, n=20):
        try:
            return "\n".join((self.dir / "redis.log").read_text(errors="replace")
                             .splitlines()[-n:])
        except FileNotFoundError:
            return ""


class RedisCluster:
    """masters + masters * replicas_per_master redis-servers in cluster mode on loopback.

    extra: more redis-server arguments for every node, e.g.
    ["--cluster-require-full-coverage", "no"]; password: every node requires it (and
    replicas authenticate with it to their masters)."""

    def __init__(self, directory, masters=3, replicas=1, node_timeout=1000, extra=(),
                 password=None):
        self.dir = directory
        self.password = password
        self.dir.mkdir(parents=True, exist_ok=True)
        self.node_timeout = node_timeout
        self.replicas = replicas
        self.extra = list(extra)
        ports = set()
        while len(ports) < masters * (1 + replicas):
            p = cluster_port()
            if p not in ports and p + 10000 not in ports and p - 10000 not in ports:
                ports.add(p)
        self.nodes = [Node(self, i, p) for i, p in enumerate(sorted(ports))]
        self.created_in = None

    # lifecycle --------------------------------------------------------------------------
    def start(self, timeout=30):
        t0 = time.monotonic()
        try:
            for n in self.nodes:
                n.start()
            r = subprocess.run([REDIS_CLI, *auth_args(self.password), "--cluster", "create",
                                *[n.address for n in self.nodes],
                                "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, f"redis-cli --cluster create: {r.stdout}{r.stderr}"
            self.wait_ok(timeout)
            # every replica in sync with its master, so that a failover loses nothing
            replicas = len(self.nodes) // (1 + self.replicas) * self.replicas
            self.wait_replicas_in_sync(timeout, expect=replicas)
        except BaseException:
            self.stop()
            raise
        self.created_in = time.monotonic() - t0
        return self

    def stop(self):
        """SIGTERM to every server at once, then wait for each (SIGKILL after 10 s)."""
        for n in self.nodes:
            if n.alive():
                n.proc.send_signal(signal.SIGCONT)
                n.proc.terminate()
        for n in self.nodes:
            n.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # topology ---------------------------------------------------------------------------
    @property
    def seeds(self):
        """The masters' addresses as first created ("127.0.0.1:P"), for a seed list."""
        return [n.address for n in self.masters()]

    def alive_nodes(self):
        return [n for n in self.nodes if n.alive()]

    def by_id(self, node_id):
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def by_port(self, port):
        for n in self.nodes:
            if n.port == int(port):
                return n
        raise KeyError(port)

    def cluster_nodes(self, via=None):
        """CLUSTER NODES as seen by `via` (default: the first live node): a list of dicts
        id, port, flags (set), master (id or None), connected (bool), slots (set)."""
        via = via or self.alive_nodes()[0]
        rows = []
        for line in via.cli("CLUSTER", "NODES").splitlines():
            f = line.split()
            if len(f) < 8:
                continue
            slots = set()
            for s in f[8:]:
                if s.startswith("["):       # a slot being imported or migrated
                    continue
                lo, _, hi = s.partition("-")
                slots.update(range(int(lo), int(hi or lo) + 1))
            rows.append({"id": f[0], "port": int(f[1].split("@")[0].rsplit(":", 1)[1]),
                         "flags": set(f[2].split(",")),
                         "master": None if f[3] == "-" else f[3],
                         "connected": f[7] == "connected", "slots": slots})
        return rows

    def masters(self, via=None):
        """Nodes that serve slots as masters (seen by `via`), lowest port first."""
        rows = self.cluster_nodes(via)
        return sorted((self.by_id(r["id"]) for r in rows
                       if "master" in r["flags"] and "fail" not in r["flags"] and r["slots"]),
                      key=lambda n: n.port)

    def replica_of(self, master, via=None):
        for r in self.cluster_nodes(via):
            if r["master"] == master.id:
                return self.by_id(r["id"])
        raise AssertionError(f"{master} has no replica")

    def slots_of(self, node, via=None):
        for r in self.cluster_nodes(via):
            if r["id"] == node.id:
                return r["slots"]
        return set()

    def keyslot(self, key):
        """CLUSTER KEYSLOT, asked of a live node."""
        return int(self.alive_nodes()[0].cli("CLUSTER", "KEYSLOT", key))

    def slot_ranges(self, via=None):
        """CLUSTER SLOTS: a list of (lo, hi, master node, [replica nodes])."""
        via = via or self.alive_nodes()[0]
        out = subprocess.run([REDIS_CLI, "-p", str(via.port), *auth_args(self.password),
                              "-2", "--json",
                              "CLUSTER", "SLOTS"], capture_output=True, text=True,
                             timeout=10)
        assert out.returncode == 0, out.stderr
        ranges = []
        for entry in json.loads(out.stdout):
            lo, hi, master, *replicas = entry
            ranges.append((int(lo), int(hi), self.by_port(master[1]),
                           [self.by_port(r[1]) for r in replicas]))
        return ranges

    def owner_of_slot(self, slot, via=None):
        """The master serving a slot, from CLUSTER SLOTS (None: nobody)."""
        for lo, hi, master, _ in self.slot_ranges(via):
            if lo <= slot <= hi:
                return master
        return None

    def owner_of_key(self, key, via=None):
        return self.owner_of_slot(self.keyslot(key), via)

    def keys(self, pattern="*"):
        """Every key matching pattern on the live masters: {key: master node}."""
        found = {}
        for m in self.masters():
            if m.alive():
                for k in m.keys(pattern):
                    found[k] = m
        return found

    # waiting ----------------------------------------------------------------------------
    def wait_ok(self, timeout=30):
        """cluster_state:ok on every live node, and all of them agreeing on which master
        serves every one of the 16384 slots."""
        def ok():
            live = self.alive_nodes()
            if not all(n.state_ok() for n in live):
                return False
            views = []
            for n in live:
                try:
                    rows = self.cluster_nodes(n)
                except (AssertionError, subprocess.TimeoutExpired):
                    return False
                owners = {}
                for r in rows:
                    if "master" in r["flags"] and "fail" not in r["flags"]:
                        for s in r["slots"]:
                            owners[s] = r["id"]
                views.append(owners)
            return all(v == views[0] for v in views)
        wait_until(ok, timeout, "cluster_state:ok and one slot map on every node",
                   interval=0.1)

    def wait_replicas_in_sync(self, timeout=30, expect=0):
        """Every live replica in sync with its master, and at least `expect` replicas in
        the view (just after creation the gossip may not show them all yet: with none
        shown there would be nothing to wait for)."""
        def synced():
            rows = self.cluster_nodes()
            if sum(1 for r in rows if r["master"] is not None) < expect:
                return False
            for r in rows:
                if r["master"] is None:
                    continue
                rep = self.by_id(r["id"])
                if not rep.alive():
                    continue
                mst = self.by_id(r["master"])
                if not mst.alive():
                    continue
                ri, mi = rep.info("replication"), mst.info("replication")
                if ri.get("master_link_status") != "up":
                    return False
                if ri.get("slave_repl_offset") != mi.get("master_repl_offset"):
                    return False
            return True
        wait_until(synced, timeout, "every replica in sync with its master", interval=0.1)

    def wait_failover(self, old_master, timeout=30):
        """After old_master died: its replica serves its slots as a master and the live
        nodes agree on it with cluster_state:ok.  Returns the new master."""
        live = [n for n in self.alive_nodes() if n is not old_master]
        rows = self.cluster_nodes(live[0])
        replica = next(self.by_id(r["id"]) for r in rows if r["master"] == old_master.id)
        wait_until(lambda: replica.role() == "master", timeout,
                   f"{replica} promoted in place of {old_master}", interval=0.1)
        self.wait_ok(timeout)
        return replica

    # faults -----------------------------------------------------------------------------
    def kill(self, node):
        node.kill()

    def kill_master(self, master):
        """SIGKILL a master once its replica has everything it acknowledged."""
        self.wait_replicas_in_sync()
        master.kill()

    def restart(self, node, wait=True, timeout=30):
        """Start a killed server again from its own directory (nodes.conf keeps its ID)."""
        node.start()
        if wait:
            self.wait_ok(timeout)
        return node

    def lose_slot_range(self, master):
        """Kill a master and its replica: its slots are served by nobody.  Returns the
        two nodes killed (restart them with restore())."""
        replica = self.replica_of(master)
        replica.kill()
        master.kill()
        return [master, replica]

    def restore(self, nodes, timeout=30):
        for n in nodes:
            n.start()
        # the restarted nodes are known again (no fail flag) by every live node
        def known():
            for v in self.alive_nodes():
                for r in self.cluster_nodes(v):
                    if r["id"] in {n.id for n in nodes} and (
                            r["flags"] & {"fail", "fail?"} or not r["connected"]):
                        return False
            return True
        wait_until(known, timeout, f"{nodes} known again by every node", interval=0.1)
        self.wait_ok(timeout)
        self.wait_replicas_in_sync(timeout)

    # slot migration ---------------------------------------------------------------------
    def reshard_args(self, src, dst, count):
        return [REDIS_CLI, *auth_args(self.password), "--cluster", "reshard", src.address,
                "--cluster-from", src.id, "--cluster-to", dst.id,
                "--cluster-slots", str(count), "--cluster-yes"]

    def reshard(self, src, dst, count, background=False):
        """Move `count` slots from src to dst with redis-cli (the lowest-numbered slots
        src serves).  background=True returns the running Popen (its output in
        reshard.log); otherwise waits, checks, and waits for one slot map again."""
        logf = open(self.dir / "reshard.log", "ab")
        try:
            p = subprocess.Popen(self.reshard_args(src, dst, count), stdin=subprocess.DEVNULL,
                                 stdout=logf, stderr=subprocess.STDOUT)
        finally:
            logf.close()
        if background:
            return p
        rc = p.wait(300)
        assert rc == 0, f"reshard exited {rc}:\n{self.reshard_log()}"
        self.wait_ok()
        return p

    def reshard_log(self):
        try:
            return (self.dir / "reshard.log").read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""

    def slots_to_move(self, src, slot):
        """How many slots `redis-cli --cluster reshard --cluster-from src` must move so
        that `slot` is among them (it takes src's slots lowest first)."""
        own = sorted(self.slots_of(src))
        return own.index(slot) + 1

    def migrate_slot(self, slot, src, dst, between=None):
        """Move one slot by hand, the way redis-cli does it, in steps: IMPORTING on dst,
        MIGRATING on src, the keys moved, then the new owner told to every master.

        between(stage) is called after each step ("migrating": the slot is half moved and
        its keys still on src; "moved": keys on dst, the slot still MIGRATING, so src
        answers ASK), so a test can make decisions at each stage."""
        dst.cli("CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
        src.cli("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
        if between:
            between("migrating")
        while True:
            keys = src.cli("CLUSTER", "GETKEYSINSLOT", slot, 100).splitlines()
            keys = [k for k in keys if k]
            if not keys:
                break
            auth = ["AUTH", self.password] if self.password else []
            out = src.cli("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, *auth, "KEYS", *keys)
            assert out in ("OK", "NOKEY"), out
        if between:
            between("moved")
        for n in (dst, src):
            n.cli("CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        for m in self.masters():
            if m not in (src, dst) and m.alive():
                m.cli("CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        self.wait_ok()
