/*
 * smtp_out -- the outgoing SMTP client (see smtp_out.h): one connection as a state machine
 * on a libevent loop.  This room is the session and the interface: it reads the replies
 * and dispatches them by phase, sets the session up and ends it, and hands the
 * transaction's phases (MAIL to DOT) to smtp_out_tx.c; the rooms are listed in
 * smtp_out_int.h.
 *
 * Phases (c->phase: what the connection waits for), and the stage an error there has:
 *
 *   CONNECT    the non-blocking connect() (own EV_WRITE event)       connect
 *   GREETING   the server's 220                                       greeting
 *   EHLO/HELO  the reply to EHLO, or HELO after a refused EHLO        ehlo (starttls once
 *                                                                     TLS is up)
 *   STARTTLS   the reply to STARTTLS                                  starttls
 *   HANDSHAKE  the TLS handshake (bufferevent_openssl filter)         starttls
 *   AUTH       a SASL exchange (334 challenges until 235)             auth
 *   READY      nothing outstanding: the session is set up             mail (a new transaction)
 *   MAIL       the reply to MAIL (the RCPTs follow it with PIPELINING) mail
 *   RCPT       the replies to RCPT, in order                          rcpt
 *   DATA       the reply to DATA (354)                                data
 *   BODY       the body going out as the output drains                data, dot once the final
 *                                                                     dot is queued
 *   DOT        the reply after the final dot                          dot
 *   RSET       the reply to RSET after a failed transaction           rset
 *   QUIT       the reply to QUIT; then the connection frees itself    quit
 *   CLOSED     no socket any more
 *
 * Invariants:
 *  - done() is called only from smtp_out_report(), only inside a libevent callback of this
 *    connection (never from smtp_out_send/quit/free), and once per accepted send.
 *  - While a callback runs (c->in_cb > 0), smtp_out_free() only tears the I/O down; the
 *    struct is freed when the outermost callback returns (c->free_pending).  Code that
 *    called smtp_out_report() or smtp_out_fail() returns at once without touching c's I/O again.
 *  - The body is copied into the output piece by piece, refilled when the output drains
 *    to BODY_LOW_WATER, never past BODY_PENDING_MAX (plus the dots stuffed into the last
 *    piece); under TLS at most TLS_UNDER_HIGH more wait as ciphertext.  The caller's
 *    message is never referenced by a buffer, so it may be freed in done() whatever
 *    happened.
 *  - Input is bounded: a read high watermark, and smtp_reply_read's line and line-count
 *    limits (every complete reply is consumed at once).
 *  - Never AUTH without TLS unless the configuration allows it; never plaintext after a
 *    STARTTLS was accepted (a failed handshake ends the connection).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <gsasl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "smtp_out_int.h"
#include "util.h"

/* ---- small helpers ---- */

static void *mem_free(void *p)
{
	free(p);
	return NULL;
}

/* Connections left to finish their QUIT by themselves, so that a loop being shut down can
 * free them (smtp_out_abandon_quitting).  Process-wide, under a lock: loops of several
 * threads may quit connections. */
static pthread_mutex_t quitting_lock = PTHREAD_MUTEX_INITIALIZER;
static struct smtp_out *quitting_head;

static void quit_list_remove(struct smtp_out *c)
{
	pthread_mutex_lock(&quitting_lock);
	if (c->on_quit_list) {
		if (c->q_prev)
			c->q_prev->q_next = c->q_next;
		else
			quitting_head = c->q_next;
		if (c->q_next)
			c->q_next->q_prev = c->q_prev;
		c->on_quit_list = false;
	}
	pthread_mutex_unlock(&quitting_lock);
}

static void destroy(struct smtp_out *c)
{
	quit_list_remove(c);
	smtp_out_close_io(c);
	if (c->timer)
		event_free(c->timer);
	if (c->kick)
		event_free(c->kick);
	free(c->rcpt);
	void (*freed)(void *) = c->freed;
	void *arg = c->freed_arg;
	free(c);
	if (freed)
		freed(arg);
}

static void enter(struct smtp_out *c)
{
	c->in_cb++;
}

static void leave(struct smtp_out *c)
{
	if (--c->in_cb == 0 && c->free_pending)
		destroy(c);
}

/* ---- session set-up ---- */

static void send_quit(struct smtp_out *c)
{
	if (smtp_out_send_cmd(c, "QUIT") < 0) {
		smtp_out_release(c);
		return;
	}
	c->phase = PH_QUIT;
	smtp_out_arm_quit(c);
}

/* Nothing outstanding: start the pending transaction, or QUIT, or (the session just set
 * up, nothing waiting) tell the relay. */
static void become_ready(struct smtp_out *c)
{
	bool first = !c->session_ready;
	c->phase = PH_READY;
	c->session_ready = true;
	evtimer_del(c->timer);
	if (c->quitting)
		send_quit(c);
	else if (c->msg && !c->unusable)
		smtp_out_start_transaction(c);
	else if (first && !c->msg && c->ready)
		c->ready(c->ready_arg, c, NULL);
}

static void send_ehlo(struct smtp_out *c, const char *verb)
{
	struct evbuffer *o = smtp_out_out_buf(c);
	const char *helo = c->conf->helo;
	if (evbuffer_add_printf(o, "%s %s\r\n", verb, helo) < 0) {
		smtp_out_fail_nomem(c);
		return;
	}
	memset(&c->seen, 0, sizeof(c->seen));
	c->phase = verb[0] == 'E' ? PH_EHLO : PH_HELO;
	smtp_out_arm(c);
}

/* The complete lines p[0..n) of the EHLO reply being read (the first line names the
 * server; the others are keywords). */
static void ehlo_scan(struct smtp_out *c, const char *p, size_t n)
{
	while (n > 0) {
		const char *lf = memchr(p, '\n', n);
		if (!lf)
			return;
		size_t len = (size_t)(lf - p);
		size_t tl = len > 0 && p[len - 1] == '\r' ? len - 1 : len;
		if (c->reply_lines++ > 0 && tl > 4 && p[0] == '2')
			smtp_ehlo_line(&c->seen, str_make(p + 4, tl - 4));
		n -= len + 1;
		p = lf + 1;
	}
}


/* After a successful EHLO/HELO: STARTTLS, then AUTH, then ready. */
static void after_hello(struct smtp_out *c)
{
	const struct smtp_out_conf *cf = c->conf;
	if (!c->tls && cf->tls != SMTP_TLS_NONE) {
		if (c->ehlo.ext & SMTP_EHLO_STARTTLS) {
			if (smtp_out_send_cmd(c, "STARTTLS") < 0) {
				smtp_out_fail_nomem(c);
				return;
			}
			c->phase = PH_STARTTLS;
			smtp_out_arm(c);
			return;
		}
		if (cf->tls != SMTP_TLS_MAY) {
			smtp_out_fail(c, SMTP_STAGE_STARTTLS, -EPERM,
				      "TLS is required and STARTTLS is not offered", NULL, false);
			return;
		}
	}
	if (cf->auth_user && !c->authenticated) {
		smtp_out_start_auth(c);
		return;
	}
	become_ready(c);
}

/* ---- the session's replies ---- */

/*
 * Every complete reply, by the phase it answers: the session's own (greeting, EHLO or
 * HELO, STARTTLS, AUTH, RSET, QUIT) here; the transaction's (MAIL to the final dot) go to
 * smtp_out_tx.c.  A 421, or a reply once smtp_out_quit() was called, ends the session in
 * any phase.
 */
static void on_reply(struct smtp_out *c, const struct smtp_reply *r)
{
	if (r->code == 421 && c->phase != PH_QUIT) { /* the server is closing the connection */
		smtp_out_fail(c, smtp_out_stage_of(c), 0, "", r, true);
		return;
	}
	if (c->quitting && c->phase != PH_QUIT) {
		/* QUIT where a command could follow; elsewhere just close */
		if (c->phase == PH_GREETING || c->phase == PH_EHLO || c->phase == PH_HELO ||
		    c->phase == PH_RSET)
			send_quit(c);
		else
			smtp_out_release(c);
		return;
	}
	switch (c->phase) {
	case PH_GREETING:
		if (r->code == 220)
			send_ehlo(c, "EHLO");
		else if (smtp_out_is_refusal(r))
			smtp_out_fail(c, SMTP_STAGE_GREETING, 0, "", r, false);
		else
			smtp_out_fail_proto(c, "an unexpected greeting");
		return;
	case PH_EHLO:
		if (smtp_out_is_2xx(r)) {
			c->ehlo = c->seen;
			after_hello(c);
		} else if (!c->tls && (r->code == 500 || r->code == 502 || r->code == 504 ||
				       r->code == 550)) {
			send_ehlo(c, "HELO");
		} else if (smtp_out_is_refusal(r)) {
			smtp_out_fail(c, smtp_out_stage_of(c), 0, "", r, false);
		} else {
			smtp_out_fail_proto(c, "an unexpected reply to EHLO");
		}
		return;
	case PH_HELO:
		if (smtp_out_is_2xx(r)) {
			memset(&c->ehlo, 0, sizeof(c->ehlo));
			after_hello(c);
		} else if (smtp_out_is_refusal(r)) {
			smtp_out_fail(c, SMTP_STAGE_EHLO, 0, "", r, false);
		} else {
			smtp_out_fail_proto(c, "an unexpected reply to HELO");
		}
		return;
	case PH_STARTTLS:
		if (r->code == 220) {
			/* anything after the 220 was sent in clear before the handshake: an
			 * injection (CVE-2011-0411), never to be read as if it came over TLS */
			if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) {
				smtp_out_fail_proto(c, "data after the reply to STARTTLS");
				return;
			}
			smtp_out_start_tls(c);
		} else if (smtp_out_is_refusal(r) && c->conf->tls == SMTP_TLS_MAY) {
			c->ehlo.ext &= ~(unsigned)SMTP_EHLO_STARTTLS; /* go on in clear */
			after_hello(c);
		} else if (smtp_out_is_refusal(r)) {
			smtp_out_fail(c, SMTP_STAGE_STARTTLS, 0, "", r, false);
		} else {
			smtp_out_fail_proto(c, "an unexpected reply to STARTTLS");
		}
		return;
	case PH_AUTH:
		if (smtp_out_on_auth_reply(c, r))
			after_hello(c);
		return;
	case PH_MAIL:
	case PH_RCPT:
	case PH_DATA:
	case PH_BODY:
	case PH_DOT:
		smtp_out_tx_on_reply(c, r); /* the transaction's own */
		return;
	case PH_RSET:
		if (smtp_out_is_2xx(r))
			become_ready(c);
		else
			smtp_out_fail(c, SMTP_STAGE_RSET, 0, "", r, !smtp_out_is_refusal(r));
		return;
	case PH_QUIT:
		smtp_out_release(c);
		return;
	default:
		smtp_out_fail_proto(c, "a reply when none was expected");
		return;
	}
}

/* Read every complete reply in the input. */
static void process_input(struct smtp_out *c)
{
	while (c->bev && !c->free_pending) {
		struct evbuffer *in = bufferevent_get_input(c->bev);
		size_t len = evbuffer_get_length(in);
		if (len == 0)
			return;
		if (c->phase == PH_HANDSHAKE || c->phase == PH_CLOSED || c->phase == PH_CONNECT)
			return;
		size_t n = len < READ_WINDOW ? len : READ_WINDOW;
		const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)n);
		if (!p) {
			smtp_out_fail_nomem(c);
			return;
		}
		struct smtp_reply r;
		size_t used = 0;
		const char *why = NULL;
		int k = smtp_reply_read(&c->rd, p, n, &r, &used, &why);
		if (k < 0) {
			smtp_out_fail_proto(c, why ? why : "a malformed reply");
			return;
		}
		if (c->phase == PH_EHLO)
			ehlo_scan(c, p, used);
		evbuffer_drain(in, used);
		if (k == 0) {
			if (used == 0)
				return; /* a partial line: wait for more */
			continue;
		}
		c->reply_lines = 0;
		on_reply(c, &r);
	}
}

/* ---- libevent callbacks ---- */

static void on_read(struct bufferevent *bev, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	process_input(c);
	leave(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	if (c->phase == PH_BODY) {
		if (c->body_done) {
			if (evbuffer_get_length(smtp_out_out_buf(c)) == 0) {
				c->phase = PH_DOT;
				smtp_out_arm(c);
			}
		} else if (smtp_out_body_fill(c) < 0) {
			smtp_out_fail_nomem(c);
		} else {
			/* progress: a new body write timeout.  XXX progress is seen when the output
			 * drains to BODY_LOW_WATER, not at every write: a peer slower than about
			 * 1 KiB/s over the whole timeout counts as stalled */
			smtp_out_arm(c);
		}
	}
	leave(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	if (what & BEV_EVENT_CONNECTED) {
		if (c->phase == PH_HANDSHAKE) {
			c->tls = true;
			c->tls_version = c->ssl ? SSL_get_version(c->ssl) : "";
			smtp_out_tls_done(c);
			/* RFC 3207 4.2: forget what was learnt in clear */
			memset(&c->ehlo, 0, sizeof(c->ehlo));
			send_ehlo(c, "EHLO");
		}
	} else if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
		if (c->phase == PH_HANDSHAKE) {
			long v = c->ssl ? SSL_get_verify_result(c->ssl) : X509_V_OK;
			c->tls_verify = v;
			if ((c->conf->tls == SMTP_TLS_VERIFY || c->conf->dane) && v != X509_V_OK)
				smtp_out_fail(c, SMTP_STAGE_STARTTLS, -EPERM, X509_verify_cert_error_string(v),
				     NULL, true);
			else
				smtp_out_fail(c, SMTP_STAGE_STARTTLS, -EPROTO, "the TLS handshake failed", NULL,
				     true);
		} else if (c->phase == PH_QUIT) {
			smtp_out_release(c);
		} else {
			/* the replies that came before the end count first */
			if (what & BEV_EVENT_EOF)
				process_input(c);
			if (c->bev && !c->free_pending)
				smtp_out_fail(c, smtp_out_stage_of(c), -ECONNRESET,
				     what & BEV_EVENT_EOF ? "the server closed the connection"
							  : "the connection broke",
				     NULL, true);
		}
	}
	leave(c);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	if (c->phase == PH_QUIT || c->quitting)
		smtp_out_release(c);
	else
		smtp_out_fail(c, smtp_out_stage_of(c), -ETIMEDOUT, "timed out", NULL, true);
	leave(c);
}

static void on_connected(evutil_socket_t fd, short what, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	int err = 0;
	socklen_t len = sizeof(err);
	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	event_free(c->conn_ev);
	c->conn_ev = NULL;
	if (err) {
		smtp_out_fail(c, SMTP_STAGE_CONNECT, -err, "the connection failed", NULL, true);
		goto out;
	}
	if (c->quitting) { /* nothing said yet: nothing to say QUIT after */
		smtp_out_release(c);
		goto out;
	}
	c->bev = bufferevent_socket_new(c->base, c->fd, BEV_OPT_CLOSE_ON_FREE |
							 BEV_OPT_DEFER_CALLBACKS);
	if (!c->bev) {
		smtp_out_fail_nomem(c);
		goto out;
	}
	c->fd = -1;
	bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, INPUT_MAX);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	c->phase = PH_GREETING;
	smtp_out_arm(c);
out:
	leave(c);
}

/* Deferred work of smtp_out_send(): report a stored set-up failure, or start. */
static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	if (!c->msg && c->fail_pending && c->ready) { /* failed in smtp_out_new() */
		c->fail_pending = false;
		smtp_out_report_ready_failure(c, c->fail_stage, c->fail_error, c->fail_why,
				     c->fail_error == 0 ? &c->fail_reply : NULL);
	} else if (c->msg && !c->active) {
		if (c->fail_pending) {
			c->fail_pending = false;
			smtp_out_report(c, c->fail_stage, c->fail_error, c->fail_why,
			       c->fail_error == 0 ? &c->fail_reply : NULL);
		} else if (c->unusable) {
			smtp_out_report(c, smtp_out_stage_of(c), -ECONNRESET, "the connection is closed", NULL);
		} else if (c->phase == PH_READY) {
			smtp_out_start_transaction(c);
		} /* else: set-up or RSET under way; become_ready() starts it */
	}
	leave(c);
}

/* ---- the interface ---- */

static void make_peer(struct smtp_out *c, const char *name)
{
	if (name && fmt_fixed(c->peer, sizeof(c->peer), "%.255s%s", name, c->peer_addr) == 0)
		return;
	fmt_fixed(c->peer, sizeof(c->peer), "%s", c->peer_addr);
}

struct smtp_out *smtp_out_new(struct event_base *base, const struct smtp_out_conf *conf,
			      const struct sockaddr *addr, socklen_t addrlen,
			      const struct sockaddr *source, socklen_t sourcelen)
{
	if (!base || !conf || !conf->helo || !conf->helo[0] ||
	    strpbrk(conf->helo, " \t\r\n") || strlen(conf->helo) > 255 || !addr || addrlen == 0 ||
	    addrlen > sizeof(struct sockaddr_storage) ||
	    (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) {
		errno = EINVAL;
		return NULL;
	}
	struct smtp_out *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->base = base;
	c->conf = conf;
	c->fd = -1;
	c->phase = PH_CONNECT;
	smtp_reply_reader_init(&c->rd);
	c->timer = evtimer_new(base, on_timeout, c);
	c->kick = event_new(base, -1, 0, on_kick, c);
	if (!c->timer || !c->kick) {
		destroy(c);
		errno = ENOMEM;
		return NULL;
	}
	char host[INET6_ADDRSTRLEN + 8] = "?", serv[8] = "?";
	if (getnameinfo(addr, addrlen, host, sizeof(host), serv, sizeof(serv),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		memcpy(host, "?", 2);
		memcpy(serv, "?", 2);
	}
	fmt_fixed(c->peer_addr, sizeof(c->peer_addr), "[%s]:%s", host, serv);
	make_peer(c, NULL);

	/* every failure from here on is the connection's, reported to the first send */
	c->fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		smtp_out_fail(c, SMTP_STAGE_CONNECT, -errno, "no socket", NULL, true);
		return c;
	}
	/* commands and body are gathered in the output buffer and leave in as few writes as
	 * the socket takes: Nagle would only hold back the last small one (a final dot, a
	 * pipelined group) for a delayed ACK */
	int one = 1;
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (source && sourcelen && bind(c->fd, source, sourcelen) < 0) {
		smtp_out_fail(c, SMTP_STAGE_CONNECT, -errno, "the source address cannot be bound", NULL, true);
		return c;
	}
	if (connect(c->fd, addr, addrlen) < 0 && errno != EINPROGRESS) {
		smtp_out_fail(c, SMTP_STAGE_CONNECT, -errno, "the connection failed", NULL, true);
		return c;
	}
	c->conn_ev = event_new(base, c->fd, EV_WRITE, on_connected, c);
	if (!c->conn_ev) {
		destroy(c);
		errno = ENOMEM;
		return NULL;
	}
	event_add(c->conn_ev, NULL);
	smtp_out_arm(c);
	return c;
}

int smtp_out_send(struct smtp_out *c, const struct smtp_out_msg *m, smtp_out_done_fn *done,
		  void *arg)
{
	if (!m || !done || m->nrcpt == 0 || m->nrcpt > SMTP_OUT_RCPT_MAX || !m->rcpt ||
	    (m->nbody && !m->body) || !smtp_out_addr_ok(m->sender))
		return -EINVAL;
	for (size_t i = 0; i < m->nrcpt; i++)
		if (m->rcpt[i].len == 0 || !smtp_out_addr_ok(m->rcpt[i]))
			return -EINVAL;
	if (c->msg)
		return -EBUSY;
	if (c->quitting || c->free_pending || (c->unusable && !c->fail_pending))
		return -ENOTCONN;
	free(c->rcpt);
	c->rcpt = calloc(m->nrcpt, sizeof(*c->rcpt));
	if (!c->rcpt)
		return -ENOMEM;
	c->msg = m;
	c->done = done;
	c->arg = arg;
	c->active = false;
	const char *why;
	if (c->phase == PH_READY && !c->unusable && !c->fail_pending && smtp_out_tx_check(c, m, &why) == 0) {
		/* MAIL goes into the output now: the relay counts a send when it makes it */
		if (smtp_out_tx_write_mail(c) < 0) {
			c->msg = NULL;
			c->done = NULL;
			c->active = false;
			c->rcpt = mem_free(c->rcpt);
			smtp_out_close_io(c);
			return -ENOMEM;
		}
		return 0;
	}
	/* set-up or RSET under way, or an end to report: from the loop, never from here */
	event_active(c->kick, 0, 0);
	return 0;
}

void smtp_out_set_ready(struct smtp_out *c, smtp_out_ready_fn *fn, void *arg)
{
	c->ready = fn;
	c->ready_arg = arg;
	if (fn && c->fail_pending && !c->msg)
		event_active(c->kick, 0, 0); /* smtp_out_new() failed already */
}

bool smtp_out_usable(const struct smtp_out *c)
{
	return !c->unusable && !c->quitting && !c->free_pending && !c->msg;
}

unsigned smtp_out_transactions(const struct smtp_out *c)
{
	return c->ntrans;
}

const char *smtp_out_peer(const struct smtp_out *c)
{
	return c->peer;
}

void smtp_out_set_peer_name(struct smtp_out *c, const char *name)
{
	make_peer(c, name);
}

void smtp_out_quit(struct smtp_out *c)
{
	if (!c || c->quitting || c->free_pending)
		return;
	c->quitting = true;
	pthread_mutex_lock(&quitting_lock);
	c->q_prev = NULL;
	c->q_next = quitting_head;
	if (quitting_head)
		quitting_head->q_prev = c;
	quitting_head = c;
	c->on_quit_list = true;
	pthread_mutex_unlock(&quitting_lock);
	/* a transaction waiting or under way is dropped, silently; under way (MAIL to DOT)
	 * means closing at once below, since QUIT cannot follow there */
	c->msg = NULL;
	c->done = NULL;
	c->active = false;
	switch (c->phase) {
	case PH_READY:
		send_quit(c);
		break;
	case PH_GREETING:
	case PH_EHLO:
	case PH_HELO:
	case PH_RSET:
		/* QUIT once the reply awaited is in, within the QUIT time */
		smtp_out_arm_quit(c);
		break;
	case PH_QUIT:
		return;
	default:
		smtp_out_release(c);
		break;
	}
	if (c->free_pending && c->in_cb == 0)
		destroy(c);
}

struct smtp_out *smtp_out_free(struct smtp_out *c)
{
	if (!c)
		return NULL;
	smtp_out_release(c);
	if (c->in_cb == 0)
		destroy(c);
	return NULL;
}

void smtp_out_abandon_quitting(struct event_base *base)
{
	for (;;) {
		pthread_mutex_lock(&quitting_lock);
		struct smtp_out *c = quitting_head;
		while (c && c->base != base)
			c = c->q_next;
		pthread_mutex_unlock(&quitting_lock);
		if (!c)
			return;
		/* not inside any of its callbacks: the caller's loop is not running */
		destroy(c);
	}
}

void smtp_out_set_freed(struct smtp_out *c, void (*freed)(void *arg), void *arg)
{
	c->freed = freed;
	c->freed_arg = arg;
}
