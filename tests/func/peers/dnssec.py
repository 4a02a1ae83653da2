"""A DNSSEC-signed zone on loopback for the relay's DNS tests: Debian's ldns-keygen and
ldns-signzone (ldnsutils) sign it, NSD serves it, and an Unbound started beside it
validates it (or, with validate=False, only resolves it).

    with SignedDNS(workdir, "example.test", records) as dns:
        ... relay { dns_servers = "127.0.0.1:{dns.port}"; } ...
        dns.update(new_records)      # signed again, NSD reloads it

records: zone file lines relative to the origin ("@ 60 IN MX 10 mx", "mx 60 IN A
127.0.0.1", "_25._tcp.mx 60 IN TLSA 3 1 1 ABCD...").  bogus: owner names whose RRSIGs are
spoiled after signing (the data of their TLSA, MX or A records changes, the signature
does not), which a validating resolver answers with SERVFAIL (and caches for 1s only).
log_queries: Unbound logs every query it gets (unbound.log), for counting lookups.  Unbound trusts the zone's own KSK (trust-anchor-file, a
DS) and refuses every other name: no network is used.
"""

import os
import pathlib
import signal
import subprocess
import time

from conftest import free_port, wait_until

NSD = "/usr/sbin/nsd"
UNBOUND = "/usr/sbin/unbound"
KEYGEN = "/usr/bin/ldns-keygen"
SIGNZONE = "/usr/bin/ldns-signzone"


def available():
    return all(os.access(p, os.X_OK) for p in (NSD, UNBOUND, KEYGEN, SIGNZONE))


def _run(args, cwd):
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


class SignedDNS:
    def __init__(self, directory, origin, records, validate=True, bogus=(), log_queries=False):
        self.dir = pathlib.Path(directory) / f"dns-{origin}-{'v' if validate else 'nv'}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.origin = origin.rstrip(".")
        self.validate = validate
        self.log_queries = log_queries
        self.nsd_port = free_port()
        self.port = free_port()
        self.serial = int(time.time())
        self.procs = []
        # a KSK (its DS is the trust anchor) and a ZSK
        self.ksk = _run([KEYGEN, "-a", "ECDSAP256SHA256", "-k", self.origin], self.dir)
        self.zsk = _run([KEYGEN, "-a", "ECDSAP256SHA256", self.origin], self.dir)
        self.write_zone(records, bogus)

    def write_zone(self, records, bogus=()):
        self.serial += 1
        o = self.origin + "."
        lines = [f"$ORIGIN {o}", "$TTL 60",
                 f"@ 60 IN SOA ns.{o} hostmaster.{o} {self.serial} 3600 600 86400 5",
                 f"@ 60 IN NS ns.{o}", "ns 60 IN A 127.0.0.1"]
        for k in (self.ksk, self.zsk):
            lines.append((self.dir / f"{k}.key").read_text().strip())
        lines += list(records)
        zone = self.dir / "zone"
        zone.write_text("\n".join(lines) + "\n")
        _run([SIGNZONE, "-n", "-f", str(self.dir / "zone.signed.tmp"), str(zone), self.ksk,
              self.zsk], self.dir)
        signed = (self.dir / "zone.signed.tmp").read_text().splitlines()
        if bogus:
            out = []
            for line in signed:
                f = line.split()
                if f and f[0].rstrip(".") in {f"{b}.{self.origin}" for b in bogus}:
                    # the data changes, its RRSIG does not
                    if f[3] == "TLSA":
                        f[-1] = f[-1][:-2] + ("00" if f[-1][-2:] != "00" else "11")
                    elif f[3] == "MX":
                        f[4] = str(int(f[4]) + 1)
                    elif f[3] == "A":
                        f[4] = f[4].rsplit(".", 1)[0] + ".99"
                    line = "\t".join(f)
                out.append(line)
            signed = out
        (self.dir / "zone.signed.tmp").write_text("\n".join(signed) + "\n")
        os.replace(self.dir / "zone.signed.tmp", self.dir / "zone.signed")

    def start(self):
        d = self.dir
        (d / "nsd.conf").write_text(f"""server:
  ip-address: 127.0.0.1@{self.nsd_port}
  database: ""
  zonelistfile: "{d}/zone.list"
  xfrdfile: "{d}/xfrd.state"
  pidfile: "{d}/nsd.pid"
  chroot: ""
  username: ""
  zonesdir: "{d}"
  logfile: "{d}/nsd.log"
  server-count: 1
  verbosity: 1
remote-control:
  control-enable: no
zone:
  name: "{self.origin}"
  zonefile: "{d}/zone.signed"
""")
        self.procs.append(subprocess.Popen([NSD, "-d", "-c", str(d / "nsd.conf")],
                                           stdout=subprocess.DEVNULL,
                                           stderr=open(d / "nsd.err", "w")))
        anchor = _run(["/usr/bin/ldns-key2ds", "-n", "-2", f"{self.ksk}.key"], d) \
            if os.access("/usr/bin/ldns-key2ds", os.X_OK) else None
        (d / "anchor.ds").write_text(anchor + "\n" if anchor else
                                     (d / f"{self.ksk}.ds").read_text())
        modules = "validator iterator" if self.validate else "iterator"
        (d / "unbound.conf").write_text(f"""server:
  interface: 127.0.0.1@{self.port}
  port: {self.port}
  do-ip6: no
  chroot: ""
  username: ""
  directory: "{d}"
  pidfile: "{d}/unbound.pid"
  use-syslog: no
  logfile: "{d}/unbound.log"
  verbosity: 1
  module-config: "{modules}"
  {"trust-anchor-file: " + repr(str(d / "anchor.ds")).replace("'", '"') if self.validate else ""}
  trust-anchor-signaling: no
  root-key-sentinel: no
  do-not-query-localhost: no
  local-zone: "test." nodefault
  local-zone: "." refuse
  local-zone: "{self.origin}." transparent
  val-log-level: 2
  val-bogus-ttl: 1
  log-queries: {"yes" if self.log_queries else "no"}
  cache-min-ttl: 0
  prefetch: no
  num-threads: 1
remote-control:
  control-enable: no
stub-zone:
  name: "{self.origin}."
  stub-addr: 127.0.0.1@{self.nsd_port}
""")
        self.procs.append(subprocess.Popen([UNBOUND, "-d", "-c", str(d / "unbound.conf")],
                                           stdout=subprocess.DEVNULL,
                                           stderr=open(d / "unbound.err", "w")))
        wait_until(lambda: self.query("ns", "A") is not None, 15, "unbound and nsd to answer")
        return self

    def update(self, records, bogus=()):
        """Sign the zone again with new records and have NSD read it."""
        self.write_zone(records, bogus)
        self.procs[0].send_signal(signal.SIGHUP)

    def query(self, name, rtype):
        """Ask Unbound (with the AD bit): (rcode, ad, [rdata text]) or None if no answer."""
        fqdn = f"{name}.{self.origin}" if name != "@" else self.origin
        try:
            out = subprocess.run(["/usr/bin/drill", "-p", str(self.port), "-o", "AD", fqdn,
                                  rtype, "@127.0.0.1"], capture_output=True, text=True,
                                 timeout=5).stdout
        except (subprocess.TimeoutExpired, FileNotFoundError):
            return None
        if "rcode:" not in out:
            return None
        rcode = out.split("rcode:")[1].split(",")[0].strip()
        flags = out.split("flags:")[1].split(";")[0].split() if "flags:" in out else []
        answer = []
        sect = False
        for line in out.splitlines():
            if line.startswith(";; ANSWER SECTION"):
                sect = True
            elif line.startswith(";;"):
                sect = False
            elif sect and line.strip():
                answer.append(line.split(None, 4)[-1])
        return rcode, "ad" in flags, answer

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
