/*
 * smtp_out -- the outgoing SMTP client (see smtp_out.h): one connection as a state machine
 * on a libevent loop.
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

static const char *const stage_names[SMTP_STAGE_COUNT] = {
	[SMTP_STAGE_CONNECT] = "connect", [SMTP_STAGE_GREETING] = "greeting",
	[SMTP_STAGE_EHLO] = "ehlo",       [SMTP_STAGE_STARTTLS] = "starttls",
	[SMTP_STAGE_AUTH] = "auth",       [SMTP_STAGE_MAIL] = "mail",
	[SMTP_STAGE_RCPT] = "rcpt",       [SMTP_STAGE_DATA] = "data",
	[SMTP_STAGE_DOT] = "dot",         [SMTP_STAGE_RSET] = "rset",
	[SMTP_STAGE_QUIT] = "quit",
};

const char *smtp_out_stage_name(enum smtp_out_stage st)
{
	return (unsigned)st < SMTP_STAGE_COUNT ? stage_names[st] : "?";
}

/* ---- small helpers ---- */

static void *mem_free(void *p)
{
	free(p);
	return NULL;
}

bool smtp_out_is_2xx(const struct smtp_reply *r)
{
	return r->code / 100 == 2;
}

bool smtp_out_is_refusal(const struct smtp_reply *r)
{
	return r->code / 100 == 4 || r->code / 100 == 5;
}

enum smtp_out_stage smtp_out_stage_of(const struct smtp_out *c)
{
	switch (c->phase) {
	case PH_CONNECT: return SMTP_STAGE_CONNECT;
	case PH_GREETING: return SMTP_STAGE_GREETING;
	case PH_EHLO:
	case PH_HELO: return c->tls ? SMTP_STAGE_STARTTLS : SMTP_STAGE_EHLO;
	case PH_STARTTLS:
	case PH_HANDSHAKE: return SMTP_STAGE_STARTTLS;
	case PH_AUTH: return SMTP_STAGE_AUTH;
	case PH_READY:
	case PH_MAIL: return SMTP_STAGE_MAIL;
	case PH_RCPT: return SMTP_STAGE_RCPT;
	case PH_DATA: return SMTP_STAGE_DATA;
	case PH_BODY: return c->body_done ? SMTP_STAGE_DOT : SMTP_STAGE_DATA;
	case PH_DOT: return SMTP_STAGE_DOT;
	case PH_RSET: return SMTP_STAGE_RSET;
	case PH_QUIT:
	case PH_CLOSED: break;
	}
	return SMTP_STAGE_QUIT;
}

static uint64_t timeout_ms(const struct smtp_out *c, enum smtp_out_stage st)
{
	if (c->conf->timeout_ms[st])
		return c->conf->timeout_ms[st];
	switch (st) {
	case SMTP_STAGE_CONNECT: return 30000;
	case SMTP_STAGE_GREETING:
	case SMTP_STAGE_MAIL:
	case SMTP_STAGE_RCPT: return 300000;
	case SMTP_STAGE_DOT: return 600000;
	case SMTP_STAGE_QUIT: return QUIT_TIMEOUT_MS;
	default: return 120000;
	}
}

static void arm_ms(struct smtp_out *c, uint64_t ms)
{
	struct timeval tv = timeval_from_ms(ms);
	evtimer_add(c->timer, &tv);
}

/* The timer for what the connection now waits for. */
void smtp_out_arm(struct smtp_out *c)
{
	if (c->phase == PH_BODY && !c->body_done)
		arm_ms(c, c->conf->timeout_ms[SMTP_STAGE_DATA] ? c->conf->timeout_ms[SMTP_STAGE_DATA]
							     : BODY_TIMEOUT_MS);
	else
		arm_ms(c, timeout_ms(c, smtp_out_stage_of(c)));
}

struct evbuffer *smtp_out_out_buf(struct smtp_out *c)
{
	return bufferevent_get_output(c->bev);
}

/* Queue a command line (CRLF added).  0 or -ENOMEM. */
int smtp_out_send_cmd(struct smtp_out *c, const char *s)
{
	struct evbuffer *o = smtp_out_out_buf(c);
	if (evbuffer_add(o, s, strlen(s)) < 0 || evbuffer_add(o, "\r\n", 2) < 0)
		return -ENOMEM;
	return 0;
}

/* ---- teardown, failure, reporting ---- */

static void close_io(struct smtp_out *c)
{
	if (c->conn_ev) {
		event_free(c->conn_ev);
		c->conn_ev = NULL;
	}
	if (c->bev) {
		bufferevent_free(c->bev); /* the filter frees the socket's bufferevent and SSL */
		c->bev = NULL;
		c->ssl = NULL;
	}
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	if (c->timer)
		evtimer_del(c->timer);
	if (c->sasl) {
		gsasl_finish(c->sasl);
		c->sasl = NULL;
	}
	c->phase = PH_CLOSED;
	c->unusable = true;
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
	close_io(c);
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

/* Close, and free the struct when the running callback returns (the public functions,
 * which may run outside any callback, free it themselves when none runs). */
void smtp_out_release(struct smtp_out *c)
{
	close_io(c);
	c->msg = NULL;
	c->done = NULL;
	c->free_pending = true;
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

static void fill_result(const struct smtp_out *c, struct smtp_out_result *r,
			enum smtp_out_stage st, int error, const char *why,
			const struct smtp_reply *reply)
{
	memset(r, 0, sizeof(*r));
	r->stage = st;
	r->error = error;
	r->why = why ? why : "";
	if (reply && error == 0)
		r->reply = *reply;
	r->size_limit = c->ehlo.size_max;
	r->tls = c->tls;
	r->tls_version = c->tls && c->tls_version ? c->tls_version : "";
	r->auth_mech = c->authenticated ? c->auth_mech : "";
	r->dsn = (c->ehlo.ext & SMTP_EHLO_DSN) != 0;
}

/* The transaction is over: call done() once.  The caller returns at once afterwards. */
void smtp_out_report(struct smtp_out *c, enum smtp_out_stage st, int error, const char *why,
		   const struct smtp_reply *reply)
{
	struct smtp_out_result r;
	fill_result(c, &r, st, error, why, reply);
	struct smtp_reply *rcpt = c->rcpt; /* allocated by smtp_out_send(), zeroed */
	r.rcpt = rcpt;
	smtp_out_done_fn *fn = c->done;
	void *arg = c->arg;
	c->msg = NULL;
	c->done = NULL;
	c->arg = NULL;
	c->active = false;
	c->rcpt = NULL;
	if (fn)
		fn(arg, c, &r);
	free(rcpt);
}

/* No transaction waits and the connection became unusable: ready(failure), once.  The
 * caller returns at once afterwards. */
static void report_ready_failure(struct smtp_out *c, enum smtp_out_stage st, int error,
				 const char *why, const struct smtp_reply *reply)
{
	if (c->ready_failed)
		return;
	c->ready_failed = true;
	struct smtp_out_result r;
	fill_result(c, &r, st, error, why, reply);
	c->ready(c->ready_arg, c, &r);
}

/*
 * Something ended the session (or what the transaction was waiting for) other than a
 * transaction's ordinary end: the connection takes no further transaction.  broken: the
 * socket is closed too (otherwise it stays for QUIT).  The pending transaction, if any,
 * reports it; a set-up failure with none pending waits for the first smtp_out_send().
 */
void smtp_out_fail(struct smtp_out *c, enum smtp_out_stage st, int error, const char *why,
		 const struct smtp_reply *reply, bool broken)
{
	c->unusable = true;
	if (broken || c->quitting) {
		close_io(c);
	} else {
		c->phase = PH_READY;
		evtimer_del(c->timer);
		if (c->sasl) {
			gsasl_finish(c->sasl);
			c->sasl = NULL;
		}
	}
	if (c->quitting) {
		smtp_out_release(c);
		return;
	}
	if (c->msg) {
		smtp_out_report(c, st, error, why, reply);
		return;
	}
	if (c->ready) {
		report_ready_failure(c, st, error, why, reply);
		return;
	}
	if (!c->session_ready && !c->fail_pending) {
		c->fail_pending = true;
		c->fail_stage = st;
		c->fail_error = error;
		c->fail_why = why;
		if (reply && error == 0)
			c->fail_reply = *reply;
	}
}

void smtp_out_fail_nomem(struct smtp_out *c)
{
	smtp_out_fail(c, smtp_out_stage_of(c), -ENOMEM, "out of memory", NULL, true);
}

void smtp_out_fail_proto(struct smtp_out *c, const char *why)
{
	smtp_out_fail(c, smtp_out_stage_of(c), -EPROTO, why, NULL, true);
}

/* ---- session set-up ---- */


void smtp_out_send_quit(struct smtp_out *c)
{
	if (smtp_out_send_cmd(c, "QUIT") < 0) {
		smtp_out_release(c);
		return;
	}
	c->phase = PH_QUIT;
	arm_ms(c, timeout_ms(c, SMTP_STAGE_QUIT));
}

/* Nothing outstanding: start the pending transaction, or QUIT, or (the session just set
 * up, nothing waiting) tell the relay. */
void smtp_out_ready(struct smtp_out *c)
{
	bool first = !c->session_ready;
	c->phase = PH_READY;
	c->session_ready = true;
	evtimer_del(c->timer);
	if (c->quitting)
		smtp_out_send_quit(c);
	else if (c->msg && !c->unusable)
		smtp_out_start_transaction(c);
	else if (first && !c->msg && c->ready)
		c->ready(c->ready_arg, c, NULL);
}

void smtp_out_send_ehlo(struct smtp_out *c, const char *verb)
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
void smtp_out_ehlo_scan(struct smtp_out *c, const char *p, size_t n)
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
void smtp_out_after_hello(struct smtp_out *c)
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
	smtp_out_ready(c);
}

bool smtp_out_is_ip_literal(const char *s)
{
	unsigned char b[sizeof(struct in6_addr)];
	return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}


/* The server said 220 to STARTTLS: the handshake, over the socket's bufferevent. */
/* ---- libevent callbacks ---- */

void smtp_out_bev_read_cb(struct bufferevent *bev, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	smtp_out_process_input(c);
	leave(c);
}

void smtp_out_bev_write_cb(struct bufferevent *bev, void *arg)
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

void smtp_out_bev_event_cb(struct bufferevent *bev, short what, void *arg)
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
			smtp_out_send_ehlo(c, "EHLO");
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
				smtp_out_process_input(c);
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
	bufferevent_setcb(c->bev, smtp_out_bev_read_cb, smtp_out_bev_write_cb, smtp_out_bev_event_cb, c);
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
		report_ready_failure(c, c->fail_stage, c->fail_error, c->fail_why,
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
		} /* else: set-up or RSET under way; smtp_out_ready() starts it */
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
			close_io(c);
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
		smtp_out_send_quit(c);
		break;
	case PH_GREETING:
	case PH_EHLO:
	case PH_HELO:
	case PH_RSET:
		/* QUIT once the reply awaited is in, within the QUIT time */
		arm_ms(c, timeout_ms(c, SMTP_STAGE_QUIT));
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
