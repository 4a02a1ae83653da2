"""The peers the functional tests start or imitate around sluiced, apart from the tests.

* ``smarthost``: an aiosmtpd relay that behaves like an ISP's (rate limits, bans, TLS,
  AUTH, dropped replies); also a script for manual use and benchmarks.
* ``smtp_sink``: Postfix's smtp-sink started on a loopback port.
* ``milter_wire``: a milter client speaking the wire protocol, as an MTA does.
* ``queuefile``: an independent reader (and writer) of sluice's queue files.
* ``redis_cluster``: a Redis Cluster of redis-server processes, with failovers.
* ``dnssec``: a signed zone served by NSD behind a validating Unbound.
* ``journald_ns``: a script run in private namespaces with a real systemd-journald.
* ``forgetdisk``: the power-cut tests' FUSE disk (tests/powercut/forgetdisk.c).

The tests import them as ``from peers import milter_wire`` or ``from peers.smarthost
import smarthost``: pytest puts tests/func, where conftest.py is, on sys.path.
"""
