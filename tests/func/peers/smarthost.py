"""A test smarthost that behaves like an ISP's relay, for the relay's functional tests.

It is an aiosmtpd server run by a Controller in its own thread (its own event loop), on
127.0.0.1 and a free port (or a given one).  It accepts mail and keeps every message in
memory, and it can be told to misbehave the way ISP relays do:

Rate limit: ``rate=(X, Y)`` (or ``"X/Y"``, ``"8/1m"``): at most X messages per Y seconds,
over a sliding window.  What is counted, and when:

* ``count_at='mail'`` (default; relays count attempts): a message counts when its MAIL FROM
  is accepted, whether or not it is delivered afterwards.
* ``count_at='data'``: a message counts when its final dot is accepted.
* ``count='messages'`` (default) or ``count='recipients'``: with recipients, each accepted
  RCPT counts one (count_at='mail') or the final dot counts len(recipients) (count_at='data').

An event at time t counts while it is in (now - Y, now].  Commands refused by the limit are
not counted.  The command that would go over the limit gets, depending on ``mode``:

* ``'ban'``: ``550 5.7.1 Account suspended for sending too much mail``, and from then on
  every MAIL FROM (and the counting point of transactions under way) gets that same 550 for
  ``ban_seconds``; each ban is recorded (``bans``, ``ban_events()``).
* ``'tempfail'``: ``450 4.2.1 Rate limit exceeded, try again in N seconds``, N being the
  whole seconds until the window has room again.
* ``'none'``: everything is accepted; going over is only recorded (``overs()``) and logged.

Other behaviours, each off by default:

* ``reject_rcpts`` (addresses, case-insensitive) and ``reject_rcpt_regex`` (re.search,
  case-insensitive): ``550 5.1.1 <addr>: Recipient address rejected: User unknown``.
* ``rcpt_tempfail_p``: probability of ``451 4.3.0 Temporary local problem`` at each RCPT,
  from an RNG seeded with ``seed`` (same seed, same sequence of answers).
* ``max_connections``: a connection beyond that many at once is greeted with
  ``421 4.7.0 Too many connections`` and closed.
* ``tls_cert``/``tls_key``: STARTTLS (``require_starttls``: nothing but EHLO, NOOP,
  STARTTLS and QUIT before it).  ``make_test_certs()`` makes a test CA and server
  certificate (python3-cryptography) into a directory, at test time.
* ``auth_user``/``auth_password``: AUTH PLAIN, LOGIN and SCRAM-SHA-256 (RFC 5802/7677, no
  channel binding; the server-final message is a 334 challenge, answered with an empty
  line, then 235).  ``auth_mechanisms`` limits the offer, ``auth_required`` refuses MAIL
  before AUTH (530), ``auth_require_tls`` (default: True when TLS is configured) offers AUTH
  only after STARTTLS.  Without auth_user, AUTH is neither offered nor accepted.
* ``drop_after_dot_first=K`` / ``drop_after_dot_p=p``: the first K messages that would be
  accepted (then each with probability p) get no reply to their final dot; the connection
  is closed (``drop_how='close'``), reset (``'reset'``) or left hanging (``'hang'``).  Such
  a message is in ``dropped()``; with ``drop_delivers=True`` it is also in ``accepted()``
  (the relay delivered it but the reply was lost).  It counts toward the rate limit either
  way (the sender cannot know whether it went).
* ``greeting_delay=S``: each connection is greeted S seconds after it is accepted (a slow
  or busy relay); ``data_reply_delay=S``: the 250 to a final dot is sent S seconds after
  the message is recorded (it is in ``accepted()`` from the dot on, while the client still
  waits for the reply).
* ``suspend()`` / ``unsuspend()``: every MAIL FROM gets ``550 5.7.1 Service suspended``;
  ``set_rate()``, ``set_mode()`` and ``unban()`` change the limit at run time.

Every accepted message is recorded as a ``Message`` (time.time() at MAIL acceptance, at each
RCPT and at the final dot, envelope, size, raw content, TLS, SASL user), optionally also
written to a maildir-ish ``maildir`` (new/NAME plus one JSON line per message in
envelopes.jsonl).  Analysis: ``max_in_window(W)`` is the most messages (or recipients) counted
in any half-open window [t, t+W), ``windows_over(limit, W)`` lists the windows that hold more
than limit; ``bans``, ``rejections`` (every 4xx/5xx reply sent, by code), ``connections()``.
All accessors are thread-safe (the server runs in the Controller's thread).

As a module (pytest):

    from peers.smarthost import Smarthost, make_test_certs
    with Smarthost(rate="3/2", mode="ban", ban_seconds=5) as sh:
        ...send through sh.port...
        assert sh.max_in_window(2) <= 3 and sh.bans == 0

or with the fixtures defined at the end of this file (import them into the test module):
``smarthost(**kwargs)`` (a factory; every instance is stopped at teardown and the test fails
if the smarthost itself raised) and ``tls_certs`` (a Certs in the test's directory).

As a script (manual use, benchmarks), it logs each event to stderr and prints a JSON summary
on SIGINT/SIGTERM or after --duration seconds:

    /usr/bin/python3 tests/func/peers/smarthost.py --port 2525 --rate 8/10 --mode ban
    /usr/bin/python3 tests/func/peers/smarthost.py --make-certs /tmp/certs
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import dataclasses
import datetime
import email
import email.policy
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import pathlib
import random
import re
import signal
import socket
import ssl
import struct
import sys
import threading
import time

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import (MISSING, SMTP, AuthResult, LoginPassword, TLSSetupException,
                           syntax)

log = logging.getLogger("smarthost")

MODES = ("ban", "tempfail", "none")
COUNT_AT = ("mail", "data")
COUNT_UNITS = ("messages", "recipients")
DROP_HOW = ("close", "reset", "hang")
MECHANISMS = ("PLAIN", "LOGIN", "SCRAM-SHA-256")

BAN_REPLY = "550 5.7.1 Account suspended for sending too much mail"
SUSPEND_REPLY = "550 5.7.1 Service suspended"
TEMPFAIL_REPLY = "450 4.2.1 Rate limit exceeded, try again in {} seconds"
UNKNOWN_RCPT_REPLY = "550 5.1.1 <{}>: Recipient address rejected: User unknown"
RANDOM_TEMPFAIL_REPLY = "451 4.3.0 Temporary local problem"
TOO_MANY_CONNECTIONS_REPLY = "421 4.7.0 Too many connections"
NO_AUTH_REPLY = "503 5.5.1 Error: authentication not enabled"
INTERNAL_ERROR_REPLY = "451 4.3.0 Smarthost internal error"

class _DropDeprecated(logging.Filter):
    def filter(self, record):
        return "login_data is deprecated" not in record.getMessage()


logging.getLogger("mail.log").addFilter(_DropDeprecated())


def parse_rate(rate):
    """(X, Y seconds) from None, (x, y), "X/Y", "X/Ys", "X/Ym", "X/Yh" ("8/1m" = 8 per 60s)."""
    if rate is None:
        return None
    if isinstance(rate, str):
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", rate)
        if not m:
            raise ValueError(f"bad rate {rate!r} (want X/Y, Y in seconds or with s/m/h)")
        x, y = int(m.group(1)), float(m.group(2)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(3)]
    else:
        x, y = rate
        x, y = int(x), float(y)
    if x < 0 or y <= 0:
        raise ValueError(f"bad rate {rate!r}")
    return x, y


def max_in_window_of(events, window):
    """Largest total weight of the (time, weight) events in any half-open [t, t+window)."""
    events = sorted(events)
    best = total = 0
    j = 0
    for i, (t, _) in enumerate(events):
        while j < len(events) and events[j][0] < t + window:
            total += events[j][1]
            j += 1
        best = max(best, total)
        total -= events[i][1]
    return best


def windows_over_of(events, limit, window):
    """[(t, total)] for each window [t, t+window) starting at an event whose total > limit."""
    events = sorted(events)
    out = []
    total = 0
    j = 0
    for i, (t, _) in enumerate(events):
        while j < len(events) and events[j][0] < t + window:
            total += events[j][1]
            j += 1
        if total > limit and (not out or out[-1][0] != t):
            out.append((t, total))
        total -= events[i][1]
    return out


# ---------------------------------------------------------------------------------------
# records

@dataclasses.dataclass(frozen=True)
class Message:
    """One message the smarthost accepted (or dropped after its final dot)."""
    seq: int                # 1, 2, ... in order of the final dot (clear() keeps counting)
    queue_id: str           # given in the 250 reply to the final dot
    conn: int               # Connection.id
    t_mail: float           # time.time() when MAIL FROM was accepted
    t_rcpts: tuple          # time.time() of each accepted RCPT, in order
    t_data: float           # time.time() when the final dot was accepted
    sender: str             # '' for the null sender <>
    rcpts: tuple
    size: int               # len(content)
    content: bytes          # as received, dot-stuffing undone, CRLF line ends
    tls: bool
    auth_user: str | None
    helo: str | None
    dropped: bool = False   # no reply was sent to the dot (drop_after_dot_*)

    def parsed(self):
        return email.message_from_bytes(self.content, policy=email.policy.default)

    def header(self, name):
        return self.parsed().get(name)


@dataclasses.dataclass
class Connection:
    id: int
    peer: tuple
    t_open: float
    t_close: float | None = None
    refused: bool = False   # got the 421 for max_connections
    helo: str | None = None
    tls: bool = False
    auth_user: str | None = None
    messages: int = 0       # accepted on this connection


@dataclasses.dataclass(frozen=True)
class Reply:
    """A 4xx or 5xx reply the smarthost sent (first line)."""
    t: float
    conn: int | None
    code: int
    text: str


# ---------------------------------------------------------------------------------------
# SCRAM-SHA-256 (RFC 5802 / RFC 7677), shared by the server and the self-test's client

def _hmac(key, msg):
    return hmac.new(key, msg, hashlib.sha256).digest()


def scram_keys(password, salt, iterations):
    """(StoredKey, ServerKey, ClientKey) for a password (no SASLprep: ASCII test passwords)."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key"), client_key


def scram_escape(name):
    return name.replace("=", "=3D").replace(",", "=2C")


def scram_unescape(name):
    if re.search(r"=(?!2C|3D)", name):
        raise ValueError("bad escape in SCRAM username")
    return name.replace("=2C", ",").replace("=3D", "=")


def _scram_attrs(text):
    attrs = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ValueError(f"bad SCRAM attribute {part!r}")
        attrs.append((part[0], part[2:]))
    return attrs


# ---------------------------------------------------------------------------------------
# the aiosmtpd handler and protocol

class _Handler:
    """aiosmtpd hooks; keeps no state (the Smarthost does).  No properties here: aiosmtpd
    inspects every attribute of the handler for auth_* methods on each connection."""

    def __init__(self, sh):
        self._sh = sh

    async def handle_HELO(self, server, session, envelope, hostname):
        session.host_name = hostname
        self._sh._note_helo(server, hostname)
        return f"250 {server.hostname}"

    async def handle_EHLO(self, server, session, envelope, hostname, responses):
        session.host_name = hostname
        self._sh._note_helo(server, hostname)
        out = [r for r in responses
               if self._sh._auth_enabled or not r[4:].upper().startswith("AUTH")]
        if self._sh.pipelining:
            out.insert(len(out) - 1, "250-PIPELINING")
        return out

    async def handle_AUTH(self, server, session, envelope, args):
        return MISSING if self._sh._auth_enabled else NO_AUTH_REPLY

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        status = self._sh._on_mail(server, address)
        if status is None:
            envelope.mail_from = address
            envelope.mail_options.extend(mail_options)
            envelope.sh_t_mail = time.time()
            envelope.sh_t_rcpts = []
            return "250 2.1.0 Ok"
        return status

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        status = self._sh._on_rcpt(server, address)
        if status is None:
            envelope.rcpt_tos.append(address)
            envelope.rcpt_options.extend(rcpt_options)
            envelope.sh_t_rcpts.append(time.time())
            return "250 2.1.5 Ok"
        return status

    async def handle_DATA(self, server, session, envelope):
        action, value = self._sh._on_data(server, envelope)
        if action == "reply":
            if self._sh.data_reply_delay and value.startswith("250"):
                await asyncio.sleep(self._sh.data_reply_delay)
            return value
        # drop: no reply to the dot
        if value == "reset":
            sock = server.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            server.transport.abort()
        elif value == "close":
            server.transport.close()
        # connection_lost() cancels this task; 'hang' waits for the client (or the timeout)
        await asyncio.sleep(24 * 3600)
        return "451 4.3.0 not reached"

    async def handle_exception(self, error):
        if isinstance(error, TLSSetupException):       # the client's handshake failed
            log.info("TLS handshake failed: %r", error.__cause__)
            return "454 4.7.0 TLS handshake failed"    # not sent: aiosmtpd closes
        self._sh._note_error(error)
        return INTERNAL_ERROR_REPLY

    async def auth_SCRAM__SHA__256(self, server, args):
        """SCRAM-SHA-256 server side, RFC 5802 section 5, without channel binding."""
        sh = self._sh
        if len(args) > 1:
            try:
                first = base64.b64decode(args[1], validate=True)
            except ValueError:
                await server.push("501 5.5.2 Can't decode base64")
                return AuthResult(success=False, handled=True)
        else:
            first = await server.challenge_auth("")
            if first is MISSING:
                return AuthResult(success=False, handled=True)
        try:
            first = first.decode()
            cbind, authzid, bare = first.split(",", 2)
            if cbind not in ("n", "y"):         # 'p=...': channel binding not supported
                raise ValueError("channel binding not supported")
            if authzid and not authzid.startswith("a="):
                raise ValueError("bad authzid")
            attrs = _scram_attrs(bare)
            if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
                raise ValueError("client-first-message wants n= and r=")
            user = scram_unescape(attrs[0][1])
            cnonce = attrs[1][1]
        except ValueError as e:
            await server.push(f"501 5.5.2 Bad SCRAM client-first-message: {e}")
            return AuthResult(success=False, handled=True)

        salt, iterations = sh._scram_salt, sh.scram_iterations
        nonce = cnonce + (sh.scram_nonce or base64.b64encode(os.urandom(18)).decode())
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        final = await server.challenge_auth(server_first)
        if final is MISSING:
            return AuthResult(success=False, handled=True)
        try:
            final = final.decode()
            without_proof, sep, proof_b64 = final.rpartition(",p=")
            if not sep:
                raise ValueError("no proof")
            attrs = dict(_scram_attrs(without_proof))
            gs2_header = (cbind + "," + authzid + ",").encode()
            if base64.b64decode(attrs.get("c", ""), validate=True) != gs2_header:
                raise ValueError("channel binding data differs from the GS2 header")
            if attrs.get("r") != nonce:
                raise ValueError("nonce differs")
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError as e:
            await server.push(f"501 5.5.2 Bad SCRAM client-final-message: {e}")
            return AuthResult(success=False, handled=True)

        auth_message = f"{bare},{server_first},{without_proof}".encode()
        stored_key, server_key, _ = sh._scram_keys
        ok = False
        if user == sh.auth_user and len(proof) == len(stored_key):
            signature = _hmac(stored_key, auth_message)
            client_key = bytes(a ^ b for a, b in zip(proof, signature))
            ok = hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key)
        authz = authzid[2:] if authzid else ""
        if ok and authz and authz != user:
            ok = False
        sh._note_auth(server, "SCRAM-SHA-256", user, ok)
        if not ok:
            return AuthResult(success=False, handled=False)
        server_final = "v=" + base64.b64encode(_hmac(server_key, auth_message)).decode()
        if await server.challenge_auth(server_final) is MISSING:
            return AuthResult(success=False, handled=True)
        return AuthResult(success=True, auth_data=LoginPassword(user.encode(), b""))


class _SMTP(SMTP):
    """aiosmtpd's SMTP with connection accounting and reply recording."""

    def __init__(self, handler, sh, probe, auth_required=False, **kwargs):
        self._sh = sh
        self._sh_probe = probe       # the Controller's start-up connection: not counted
        self._sh_conn = None
        super().__init__(handler, **kwargs)
        # set here, not passed: aiosmtpd warns about AUTH required without TLS, which the
        # tests do on purpose
        self._auth_required = auth_required

    def connection_made(self, transport):
        first = self._sh_conn is None and self._original_transport is None
        super().connection_made(transport)
        if first and not self._sh_probe:
            self._sh_conn = self._sh._conn_open(self.session.peer)
        elif not first and self._sh_conn is not None:
            self._sh._note_tls(self._sh_conn)

    def connection_lost(self, error):
        if self._sh_conn is not None:
            self._sh._conn_close(self._sh_conn)
        super().connection_lost(error)

    @syntax("MAIL FROM: <address>", extended=" [SP <mail-parameters>]")
    async def smtp_MAIL(self, arg):
        # MAIL FROM:<a> AUTH=<b> (RFC 4954): accepted when AUTH is offered; aiosmtpd
        # would answer 555 to a parameter it does not know.
        if arg and self._sh._auth_enabled:
            arg = re.sub(r"(?i)\s+AUTH=\S+", "", arg)
        await super().smtp_MAIL(arg)

    async def _handle_client(self):
        if self._sh_conn is not None and self._sh_conn.refused:
            await self.push(TOO_MANY_CONNECTIONS_REPLY)
            self.transport.close()
            return
        if self._sh.greeting_delay and not self._sh_probe:
            await asyncio.sleep(self._sh.greeting_delay)
        await super()._handle_client()

    async def push(self, status):
        text = status.decode("utf-8", "replace") if isinstance(status, bytes) else status
        if text[:1] in ("4", "5") and text[:3].isdigit():
            self._sh._note_reply(self._sh_conn, text)
        await super().push(status)


class _Controller(Controller):
    def __init__(self, sh, handler, **kwargs):
        self._sh = sh
        super().__init__(handler, **kwargs)

    def factory(self):
        return _SMTP(self.handler, self._sh, not self._sh._started, **self.SMTP_kwargs)

    def _trigger_server(self):
        self.port = self.server.sockets[0].getsockname()[1]    # port 0: the one bound
        super()._trigger_server()


# ---------------------------------------------------------------------------------------
# the smarthost

class Smarthost:
    """An ISP-like SMTP relay for tests; see the module docstring for the behaviours."""

    def __init__(self, host="127.0.0.1", port=0, *,
                 rate=None, mode="none", ban_seconds=60.0,
                 count_at="mail", count="messages",
                 reject_rcpts=(), reject_rcpt_regex=None,
                 rcpt_tempfail_p=0.0, seed=0,
                 max_connections=None,
                 tls_cert=None, tls_key=None, require_starttls=False,
                 auth_user=None, auth_password=None, auth_required=False,
                 auth_require_tls=None, auth_mechanisms=MECHANISMS,
                 scram_iterations=4096, scram_salt=None, scram_nonce=None,
                 drop_after_dot_first=0, drop_after_dot_p=0.0, drop_how="close",
                 drop_delivers=False, greeting_delay=0.0, data_reply_delay=0.0,
                 maildir=None, keep_content=True,
                 hostname="smtp.isp.test", size_limit=32 * 1024 * 1024,
                 pipelining=True, smtputf8=True, timeout=300):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} not in {MODES}")
        if count_at not in COUNT_AT:
            raise ValueError(f"count_at {count_at!r} not in {COUNT_AT}")
        if count not in COUNT_UNITS:
            raise ValueError(f"count {count!r} not in {COUNT_UNITS}")
        if drop_how not in DROP_HOW:
            raise ValueError(f"drop_how {drop_how!r} not in {DROP_HOW}")
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("tls_cert and tls_key go together")
        if (auth_user is None) != (auth_password is None):
            raise ValueError("auth_user and auth_password go together")
        if require_starttls and not tls_cert:
            raise ValueError("require_starttls needs tls_cert and tls_key")
        if auth_required and auth_user is None:
            raise ValueError("auth_required needs auth_user and auth_password")
        unknown = set(auth_mechanisms) - set(MECHANISMS)
        if unknown:
            raise ValueError(f"unknown mechanisms {sorted(unknown)}; known: {MECHANISMS}")

        self.host = host
        self.port = port
        self.hostname = hostname
        self.count_at = count_at
        self.count = count
        self.pipelining = pipelining
        self.auth_user = auth_user
        self.auth_password = auth_password
        self.scram_iterations = scram_iterations
        self.scram_nonce = scram_nonce
        self.maildir = pathlib.Path(maildir) if maildir else None
        self.keep_content = keep_content
        self.tls_cert, self.tls_key = tls_cert, tls_key
        self._auth_enabled = auth_user is not None
        self._scram_salt = scram_salt or os.urandom(16)
        if self._auth_enabled:
            self._scram_keys = scram_keys(auth_password, self._scram_salt, scram_iterations)

        self._lock = threading.Lock()
        self._rate = parse_rate(rate)
        self._mode = mode
        self._ban_seconds = float(ban_seconds)
        self._reject_rcpts = {a.lower() for a in reject_rcpts}
        self._reject_re = re.compile(reject_rcpt_regex, re.I) if reject_rcpt_regex else None
        self._rcpt_tempfail_p = float(rcpt_tempfail_p)
        self._rcpt_rng = random.Random(f"{seed}:rcpt")
        self._drop_rng = random.Random(f"{seed}:drop")
        self._max_connections = max_connections
        self._drop_first = int(drop_after_dot_first)
        self._drop_p = float(drop_after_dot_p)
        self._drop_how = drop_how
        self._drop_delivers = drop_delivers
        self.greeting_delay = float(greeting_delay)
        self.data_reply_delay = float(data_reply_delay)
        self._suspended = None          # the reply while suspended
        self._ban_until = None          # time.monotonic()
        self._window = collections.deque()   # (time.monotonic(), weight) counted events
        self._horizon = self._rate[1] if self._rate else 0.0
        self._started = False
        self._controller = None
        self._dots = 0              # final dots that passed the limit (drop candidates)
        self._seq = 0               # messages numbered for the whole life (clear() too)
        self._reset_records()

        if self.maildir:
            for sub in ("tmp", "new", "cur"):
                (self.maildir / sub).mkdir(parents=True, exist_ok=True)

        tls_context = None
        if tls_cert:
            tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls_context.load_cert_chain(str(tls_cert), str(tls_key))
        if auth_require_tls is None:
            auth_require_tls = tls_context is not None
        self._smtp_kwargs = dict(
            server_hostname=hostname,
            ident="ESMTP sluice test smarthost",
            tls_context=tls_context,
            require_starttls=bool(require_starttls and tls_context),
            auth_required=auth_required,
            auth_require_tls=auth_require_tls,
            auth_exclude_mechanism=[m for m in MECHANISMS if m not in auth_mechanisms],
            authenticator=self._authenticate,
            data_size_limit=size_limit,
            enable_SMTPUTF8=smtputf8,
            timeout=timeout,
        )

    def _reset_records(self):
        self._messages = []
        self._dropped = []
        self._attempts = []         # time.time() of each accepted MAIL FROM
        self._ban_events = []
        self._overs = []
        self._replies = []
        self._auth_log = []
        self._errors = []
        self._conns = []
        self._active = 0
        self._max_active = 0

    # lifecycle ------------------------------------------------------------------------
    def start(self):
        if self._controller is not None:
            raise RuntimeError("smarthost already running")
        self._started = False
        ctl = _Controller(self, _Handler(self), hostname=self.host, port=self.port,
                          **self._smtp_kwargs)
        ctl.start()
        self._controller = ctl
        self.port = ctl.port
        self._started = True
        log.info("smarthost listening on %s:%d", self.host, self.port)
        return self

    def stop(self):
        ctl, self._controller = self._controller, None
        if ctl is not None:
            ctl.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def running(self):
        return self._controller is not None

    @property
    def address(self):
        return (self.host, self.port)

    @property
    def relayhost(self):
        """"[127.0.0.1]:PORT", as a route's smarthost or Postfix's relayhost wants it."""
        return f"[{self.host}]:{self.port}"

    # run-time switches ----------------------------------------------------------------
    def suspend(self, reply=SUSPEND_REPLY):
        """Every MAIL FROM gets `reply` (default 550 5.7.1 Service suspended)."""
        with self._lock:
            self._suspended = reply

    def unsuspend(self):
        with self._lock:
            self._suspended = None

    def set_rate(self, x, y=None):
        """set_rate(8, 10), set_rate("8/10"), or set_rate(None) for no limit."""
        rate = parse_rate(x if y is None else (x, y))
        with self._lock:
            self._rate = rate
            if rate:
                self._horizon = max(self._horizon, rate[1])

    def set_mode(self, mode, ban_seconds=None):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} not in {MODES}")
        with self._lock:
            self._mode = mode
            if ban_seconds is not None:
                self._ban_seconds = float(ban_seconds)

    def unban(self):
        with self._lock:
            self._ban_until = None

    def set_drop(self, first=0, p=0.0, how=None):
        """Drop the connection after the dot for the next `first` messages / with p."""
        with self._lock:
            self._drop_first = self._dots + int(first)
            self._drop_p = float(p)
            if how is not None:
                if how not in DROP_HOW:
                    raise ValueError(f"drop_how {how!r} not in {DROP_HOW}")
                self._drop_how = how

    def clear(self):
        """Forget the records (messages, replies, bans...); the window and ban stay."""
        with self._lock:
            still_open = [c for c in self._conns if c.t_close is None]
            active = self._active
            self._reset_records()
            self._conns, self._active, self._max_active = still_open, active, active

    # accessors ------------------------------------------------------------------------
    def accepted(self):
        """The accepted messages (list of Message, in order of the final dot)."""
        with self._lock:
            return list(self._messages)

    def dropped(self):
        """Messages whose final dot got no reply (drop_after_dot_*)."""
        with self._lock:
            return list(self._dropped)

    def attempts(self):
        """time.time() of every accepted MAIL FROM (delivered or not)."""
        with self._lock:
            return list(self._attempts)

    @property
    def mode(self):
        with self._lock:
            return self._mode

    @property
    def rate(self):
        with self._lock:
            return self._rate

    @property
    def banned(self):
        with self._lock:
            return self._banned_locked(time.monotonic())

    def ban_remaining(self):
        with self._lock:
            if not self._banned_locked(time.monotonic()):
                return 0.0
            return self._ban_until - time.monotonic()

    @property
    def bans(self):
        """How many bans started."""
        with self._lock:
            return len(self._ban_events)

    def ban_events(self):
        """time.time() at which each ban started."""
        with self._lock:
            return list(self._ban_events)

    def overs(self):
        """[(time.time(), count)] each time mode 'none' let a message over the limit."""
        with self._lock:
            return list(self._overs)

    @property
    def rejections(self):
        """{code: how many} of every 4xx/5xx reply sent (ours and aiosmtpd's own)."""
        with self._lock:
            return dict(collections.Counter(r.code for r in self._replies))

    def replies(self):
        """Every 4xx/5xx reply sent, as Reply(t, conn, code, text)."""
        with self._lock:
            return list(self._replies)

    def auth_log(self):
        """[(time.time(), conn, mechanism, user, success)]."""
        with self._lock:
            return list(self._auth_log)

    @property
    def errors(self):
        """Exceptions raised inside the smarthost's hooks (should stay empty)."""
        with self._lock:
            return list(self._errors)

    def connections(self):
        """Every connection (copies of Connection), refused ones included."""
        with self._lock:
            return [dataclasses.replace(c) for c in self._conns]

    @property
    def active_connections(self):
        with self._lock:
            return self._active

    @property
    def max_concurrent(self):
        """The most connections open at once (refused ones not counted)."""
        with self._lock:
            return self._max_active

    @property
    def refused_connections(self):
        with self._lock:
            return sum(1 for c in self._conns if c.refused)

    def _events(self, unit, at):
        unit = unit or self.count
        at = at or self.count_at
        if unit not in COUNT_UNITS or at not in COUNT_AT:
            raise ValueError(f"unit {unit!r} / at {at!r}")
        events = []
        for m in self.accepted():
            if at == "data":
                events.append((m.t_data, 1 if unit == "messages" else len(m.rcpts)))
            elif unit == "messages":
                events.append((m.t_mail, 1))
            else:
                events += [(t, 1) for t in m.t_rcpts]
        return events

    def max_in_window(self, window_seconds, unit=None, at=None):
        """The most messages (unit='messages') or recipients accepted in any half-open
        window [t, t+W), timed at MAIL (RCPT for recipients) or at the dot (at='data');
        unit and at default to the smarthost's count and count_at."""
        return max_in_window_of(self._events(unit, at), window_seconds)

    def windows_over(self, limit, window_seconds, unit=None, at=None):
        """[(t, count)] for each window [t, t+W) starting at a counted event that holds
        more than `limit` (empty: the limit was kept)."""
        return windows_over_of(self._events(unit, at), limit, window_seconds)

    def wait_accepted(self, n, timeout=10.0):
        """Wait until at least n messages were accepted; returns accepted()."""
        deadline = time.monotonic() + timeout
        while True:
            msgs = self.accepted()
            if len(msgs) >= n:
                return msgs
            if time.monotonic() >= deadline:
                raise AssertionError(f"smarthost: {len(msgs)} messages accepted after "
                                     f"{timeout}s, waited for {n}")
            time.sleep(0.02)

    def summary(self):
        """A dict for logs and the script's report."""
        rate = self.rate
        s = {"port": self.port, "rate": f"{rate[0]}/{rate[1]:g}" if rate else None,
             "mode": self.mode, "count_at": self.count_at, "count": self.count,
             "accepted": len(self.accepted()), "dropped": len(self.dropped()),
             "attempts": len(self.attempts()), "bans": self.bans, "overs": len(self.overs()),
             "rejections": {str(k): v for k, v in sorted(self.rejections.items())},
             "connections": len(self.connections()), "max_concurrent": self.max_concurrent,
             "refused_connections": self.refused_connections, "errors": len(self.errors)}
        if rate:
            s["max_in_window"] = self.max_in_window(rate[1])
            s["windows_over"] = len(self.windows_over(rate[0], rate[1]))
        return s

    # called in the server's thread ----------------------------------------------------
    def _conn_open(self, peer):
        with self._lock:
            c = Connection(id=len(self._conns) + 1, peer=peer, t_open=time.time())
            self._conns.append(c)
            if self._max_connections is not None and self._active >= self._max_connections:
                c.refused = True
            else:
                self._active += 1
                self._max_active = max(self._max_active, self._active)
        log.info("conn %d from %s%s", c.id, peer, " refused (too many)" if c.refused else "")
        return c

    def _conn_close(self, c):
        with self._lock:
            if c.t_close is None:
                c.t_close = time.time()
                if not c.refused:
                    self._active -= 1

    def _note_tls(self, conn):
        with self._lock:
            conn.tls = True
        log.info("conn %d STARTTLS done", conn.id)

    def _note_helo(self, server, hostname):
        if server._sh_conn is not None:
            with self._lock:
                server._sh_conn.helo = hostname

    def _note_reply(self, conn, text):
        reply = Reply(time.time(), conn.id if conn else None, int(text[:3]), text)
        with self._lock:
            self._replies.append(reply)
        log.info("conn %s << %s", reply.conn, text)

    def _note_error(self, error):
        with self._lock:
            self._errors.append(error)
        log.error("smarthost hook raised %r", error, exc_info=error)

    def _note_auth(self, server, mechanism, user, ok):
        conn = server._sh_conn
        with self._lock:
            self._auth_log.append((time.time(), conn.id if conn else None, mechanism, user, ok))
            if ok and conn is not None:
                conn.auth_user = user
        log.info("conn %s AUTH %s %s: %s", conn.id if conn else None, mechanism, user,
                 "ok" if ok else "failed")

    def _authenticate(self, server, session, envelope, mechanism, auth_data):
        user = auth_data.login.decode("utf-8", "replace")
        ok = (user == self.auth_user and
              hmac.compare_digest(auth_data.password, self.auth_password.encode()))
        self._note_auth(server, mechanism, user, ok)
        return AuthResult(success=ok, handled=False)

    def _banned_locked(self, now):
        return self._ban_until is not None and now < self._ban_until

    def _charge_locked(self, weight, what):
        """Count `weight` units now; None if allowed, else the reply for going over."""
        if self._rate is None:
            return None
        x, y = self._rate
        now = time.monotonic()
        while self._window and self._window[0][0] <= now - self._horizon:
            self._window.popleft()
        in_window = [(t, w) for t, w in self._window if t > now - y]
        used = sum(w for _, w in in_window)
        if used + weight <= x:
            self._window.append((now, weight))
            return None
        if self._mode == "none":
            self._overs.append((time.time(), used + weight))
            self._window.append((now, weight))
            log.warning("over the limit %d/%gs at %s: %d (mode none: accepted)",
                        x, y, what, used + weight)
            return None
        if self._mode == "ban":
            self._ban_until = now + self._ban_seconds
            self._ban_events.append(time.time())
            log.warning("over the limit %d/%gs at %s: banned for %gs",
                        x, y, what, self._ban_seconds)
            return BAN_REPLY
        # tempfail: seconds until enough of the window has expired
        need = used + weight - x
        retry = y
        if weight <= x:
            freed = 0
            for t, w in in_window:
                freed += w
                if freed >= need:
                    retry = t + y - now
                    break
        return TEMPFAIL_REPLY.format(max(1, math.ceil(retry)))

    def _on_mail(self, server, address):
        with self._lock:
            if self._suspended:
                return self._suspended
            if self._banned_locked(time.monotonic()):
                return BAN_REPLY
            if self.count_at == "mail" and self.count == "messages":
                status = self._charge_locked(1, "MAIL")
                if status:
                    return status
            self._attempts.append(time.time())
        return None

    def _on_rcpt(self, server, address):
        with self._lock:
            if address.lower() in self._reject_rcpts or (
                    self._reject_re is not None and self._reject_re.search(address)):
                return UNKNOWN_RCPT_REPLY.format(address)
            if self._rcpt_tempfail_p and self._rcpt_rng.random() < self._rcpt_tempfail_p:
                return RANDOM_TEMPFAIL_REPLY
            if self.count_at == "mail" and self.count == "recipients":
                if self._banned_locked(time.monotonic()):
                    return BAN_REPLY
                return self._charge_locked(1, "RCPT")
        return None

    def _on_data(self, server, envelope):
        t_data = time.time()
        conn = server._sh_conn
        with self._lock:
            if self.count_at == "data":
                if self._banned_locked(time.monotonic()):
                    return "reply", BAN_REPLY
                weight = 1 if self.count == "messages" else len(envelope.rcpt_tos)
                status = self._charge_locked(weight, "end of DATA")
                if status:
                    return "reply", status
            self._dots += 1
            drop = self._dots <= self._drop_first or (
                self._drop_p > 0 and self._drop_rng.random() < self._drop_p)
            how = self._drop_how
            self._seq += 1
            sender = "" if envelope.mail_from == "<>" else envelope.mail_from
            content = bytes(envelope.original_content)
            msg = Message(
                seq=self._seq, queue_id=f"{self._seq:010X}", conn=conn.id if conn else 0,
                t_mail=envelope.sh_t_mail, t_rcpts=tuple(envelope.sh_t_rcpts), t_data=t_data,
                sender=sender, rcpts=tuple(envelope.rcpt_tos), size=len(content),
                content=content if self.keep_content else b"",
                tls=server._tls_protocol is not None,
                auth_user=conn.auth_user if conn else None,
                helo=server.session.host_name, dropped=drop)
            if drop:
                self._dropped.append(msg)
            if not drop or self._drop_delivers:
                self._messages.append(msg)
                if conn:
                    conn.messages += 1
        if not drop or self._drop_delivers:
            self._write_maildir(msg, content)
        log.info("conn %s %s #%d from=<%s> to=%s size=%d", msg.conn,
                 f"dropped ({how}) after the dot:" if drop else "accepted", msg.seq,
                 msg.sender, ",".join(msg.rcpts), msg.size)
        if drop:
            return "drop", how
        return "reply", f"250 2.0.0 Ok: queued as {msg.queue_id}"

    def _write_maildir(self, msg, content):
        if not self.maildir:
            return
        name = f"{int(msg.t_data)}.{msg.seq:06d}.smarthost"
        tmp = self.maildir / "tmp" / name
        tmp.write_bytes(content)
        os.rename(tmp, self.maildir / "new" / name)
        env = {"file": name, "seq": msg.seq, "queue_id": msg.queue_id, "sender": msg.sender,
               "rcpts": list(msg.rcpts), "t_mail": msg.t_mail, "t_data": msg.t_data,
               "size": msg.size, "dropped": msg.dropped}
        with open(self.maildir / "envelopes.jsonl", "a") as f:
            f.write(json.dumps(env) + "\n")


# ---------------------------------------------------------------------------------------
# test certificates

@dataclasses.dataclass(frozen=True)
class Certs:
    """Paths of a test CA and of a server certificate it signed (PEM)."""
    dir: pathlib.Path
    ca_cert: pathlib.Path
    ca_key: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path

    def client_context(self, check_hostname=True):
        """An SSLContext trusting only the test CA."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.check_hostname = check_hostname
        return ctx

    def server_context(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx


def make_test_certs(directory, hostnames=("localhost", "smtp.isp.test"),
                    ips=("127.0.0.1", "::1"), days=30, expired=False, key_type="ec",
                    ca_name="sluice test CA"):
    """Make ca.pem/ca.key and server.pem/server.key (CN and SANs: hostnames, ips) in
    directory (created).  expired=True makes a server certificate that expired yesterday;
    key_type 'ec' (P-256, fast) or 'rsa' (2048).  Returns a Certs."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def new_key():
        if key_type == "rsa":
            return rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if key_type == "ec":
            return ec.generate_private_key(ec.SECP256R1())
        raise ValueError(f"key_type {key_type!r}")

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = new_key()
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name),
                            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sluice tests")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (x509.CertificateBuilder()
               .subject_name(ca_subject).issuer_name(ca_subject)
               .public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=2))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=True,
                                            crl_sign=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(ca_ski, critical=False)
               .sign(ca_key, hashes.SHA256()))

    key = new_key()
    sans = [x509.DNSName(h) for h in hostnames] + \
           [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cn = hostnames[0] if hostnames else (ips[0] if ips else "localhost")
    if expired:
        not_before, not_after = now - datetime.timedelta(days=2), now - datetime.timedelta(days=1)
    else:
        not_before, not_after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=days)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
               .issuer_name(ca_subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(not_before).not_valid_after(not_after)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=key_type == "rsa",
                                            data_encipherment=False, key_agreement=False,
                                            key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False),
                              critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                   ca_ski), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())

    def write(path, data, mode):
        path.write_bytes(data)
        os.chmod(path, mode)
        return path

    def key_pem(k):
        return k.private_bytes(serialization.Encoding.PEM,
                               serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    return Certs(
        dir=d,
        ca_cert=write(d / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM), 0o644),
        ca_key=write(d / "ca.key", key_pem(ca_key), 0o600),
        cert=write(d / "server.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644),
        key=write(d / "server.key", key_pem(key), 0o600))


# ---------------------------------------------------------------------------------------
# pytest fixtures (import them into a test module: `from smarthost import smarthost`)

try:
    import pytest
except ImportError:        # script use without pytest
    pytest = None

if pytest is not None:
    @pytest.fixture
    def smarthost():
        """Factory: smarthost(**Smarthost kwargs) -> a started Smarthost.  Every instance is
        stopped at teardown, and the test fails if one of them raised in its hooks."""
        instances = []

        def factory(**kwargs):
            sh = Smarthost(**kwargs)
            instances.append(sh)
            return sh.start()

        yield factory
        for sh in instances:
            sh.stop()
        errors = [(sh.port, e) for sh in instances for e in sh.errors]
        assert not errors, f"smarthost hooks raised: {errors}"

    @pytest.fixture
    def tls_certs(workdir):
        """A test CA and a server certificate for localhost/127.0.0.1 (conftest's workdir)."""
        return make_test_certs(workdir / "certs")


# ---------------------------------------------------------------------------------------
# script

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=2525, help="0: any free port (printed)")
    p.add_argument("--rate", help="X/Y: X messages per Y seconds (Y may end in s, m, h)")
    p.add_argument("--mode", choices=MODES, default="none")
    p.add_argument("--ban-seconds", type=float, default=60.0)
    p.add_argument("--count-at", choices=COUNT_AT, default="mail")
    p.add_argument("--count", choices=COUNT_UNITS, default="messages")
    p.add_argument("--reject-rcpt", action="append", default=[], metavar="ADDR")
    p.add_argument("--reject-rcpt-regex")
    p.add_argument("--rcpt-tempfail-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-connections", type=int)
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--require-starttls", action="store_true")
    p.add_argument("--auth-user")
    p.add_argument("--auth-password")
    p.add_argument("--auth-required", action="store_true")
    p.add_argument("--drop-first", type=int, default=0, help="drop after the dot, K first")
    p.add_argument("--drop-p", type=float, default=0.0, help="drop after the dot, probability")
    p.add_argument("--drop-how", choices=DROP_HOW, default="close")
    p.add_argument("--maildir", help="also write each message there")
    p.add_argument("--no-keep", action="store_true", help="do not keep contents in memory")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.add_argument("--make-certs", metavar="DIR",
                   help="make a test CA and server certificate in DIR, print paths, exit")
    args = p.parse_args(argv)

    if args.make_certs:
        c = make_test_certs(args.make_certs)
        print(json.dumps({k: str(v) for k, v in dataclasses.asdict(c).items()}, indent=1))
        return 0

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    sh = Smarthost(args.host, args.port, rate=args.rate, mode=args.mode,
                   ban_seconds=args.ban_seconds, count_at=args.count_at, count=args.count,
                   reject_rcpts=args.reject_rcpt, reject_rcpt_regex=args.reject_rcpt_regex,
                   rcpt_tempfail_p=args.rcpt_tempfail_p, seed=args.seed,
                   max_connections=args.max_connections, tls_cert=args.tls_cert,
                   tls_key=args.tls_key, require_starttls=args.require_starttls,
                   auth_user=args.auth_user, auth_password=args.auth_password,
                   auth_required=args.auth_required, drop_after_dot_first=args.drop_first,
                   drop_after_dot_p=args.drop_p, drop_how=args.drop_how,
                   maildir=args.maildir, keep_content=not args.no_keep)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sh.start()
    print(f"listening {sh.host}:{sh.port}", file=sys.stderr, flush=True)
    stop.wait(args.duration)
    sh.stop()
    print(json.dumps(sh.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
