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
 *  - done() is called only from report(), only inside a libevent callback of this
 *    connection (never from smtp_out_send/quit/free), and once per accepted send.
 *  - While a callback runs (c->in_cb > 0), smtp_out_free() only tears the I/O down; the
 *    struct is freed when the outermost callback returns (c->free_pending).  Code that
 *    called report() or fail() returns at once without touching c's I/O again.
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

#include "smtp_out.h"
#include "util.h"

#define BODY_PENDING_MAX (256u * 1024) /* body bytes queued in the output, at most */
#define BODY_LOW_WATER (64u * 1024)    /* refill when the output is down to this */
#define TLS_UNDER_HIGH (64u * 1024)    /* ciphertext queued below the TLS filter */
#define INPUT_MAX (64u * 1024)         /* read high watermark */
#define READ_WINDOW (4u * SMTP_REPLY_LINE_MAX) /* bytes handed to the reader at a time */
#define AUTH_OFFERED_MAX 256           /* the AUTH mechanisms a server lists (rest dropped) */
#define PEER_MAX 320
#define QUIT_TIMEOUT_MS 10000
#define BODY_TIMEOUT_MS 180000

enum phase {
	PH_CONNECT = 0,
	PH_GREETING,
	PH_EHLO,
	PH_HELO,
	PH_STARTTLS,
	PH_HANDSHAKE,
	PH_AUTH,
	PH_READY,
	PH_MAIL,
	PH_RCPT,
	PH_DATA,
	PH_BODY,
	PH_DOT,
	PH_RSET,
	PH_QUIT,
	PH_CLOSED,
};

enum ext {
	EXT_PIPELINING = 1u << 0,
	EXT_SIZE = 1u << 1,
	EXT_8BITMIME = 1u << 2,
	EXT_SMTPUTF8 = 1u << 3,
	EXT_STARTTLS = 1u << 4,
	EXT_AUTH = 1u << 5,
};

/* What an EHLO reply advertises, gathered line by line while it is read. */
struct ehlo_ext {
	unsigned ext;
	uint64_t size_max;
	char auth[AUTH_OFFERED_MAX]; /* mechanisms, upper case, space-separated */
};

struct smtp_out {
	struct smtp_out *q_prev, *q_next; /* on the quitting list (smtp_out_quit) */
	bool on_quit_list;
	void (*freed)(void *arg);     /* smtp_out_set_freed */
	void *freed_arg;
	struct event_base *base;
	const struct smtp_out_conf *conf;
	int fd;                      /* until the bufferevent owns it */
	struct event *conn_ev;       /* connect() completion */
	struct bufferevent *bev;     /* the socket, or the TLS filter over it */
	SSL *ssl;                    /* owned by bev */
	struct event *timer;
	struct event *kick;          /* starts or reports a send outside smtp_out_send() */
	enum phase phase;
	struct smtp_reply_reader rd;
	size_t reply_lines;          /* lines of the reply being read (EHLO parsing) */

	/* the session */
	struct ehlo_ext ehlo, seen;  /* in force; being read */
	bool tls;
	const char *tls_version;
	bool authenticated;
	char auth_mech[GSASL_MAX_MECHANISM_SIZE + 1];
	Gsasl_session *sasl;
	bool sasl_finished;          /* the mechanism gave its last output */
	bool sasl_aborted;           /* "*" sent: the next reply ends AUTH */
	bool xoauth2;
	bool session_ready;          /* reached READY once */
	bool unusable;               /* no further transaction */
	bool quitting;
	bool fail_pending;           /* a set-up failure the first transaction reports */
	enum smtp_out_stage fail_stage;
	int fail_error;
	const char *fail_why;
	struct smtp_reply fail_reply;

	/* the relay's view of an idle connection (smtp_out_set_ready) */
	smtp_out_ready_fn *ready;
	void *ready_arg;
	bool ready_failed;           /* ready(failure) was called: never again */

	/* the transaction */
	const struct smtp_out_msg *msg; /* accepted by smtp_out_send, until done() */
	smtp_out_done_fn *done;
	void *arg;
	bool active;                 /* msg's commands are under way */
	struct smtp_reply *rcpt;     /* msg->nrcpt */
	size_t rcpt_got, rcpt_ok;
	bool mail_failed;
	struct smtp_reply end_reply; /* MAIL's refusal, or the last RCPT refusal */
	size_t body_i, body_off;
	bool at_line_start, body_any, body_done;
	char tail[2];                /* the body's last two bytes */
	unsigned ntrans;

	int in_cb;
	bool free_pending;
	char peer_addr[INET6_ADDRSTRLEN + 16]; /* "[addr]:port" */
	char peer[PEER_MAX];
};

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

/* ---- process-wide state: TLS contexts per CA file, the SASL library ---- */

struct tls_ctx_entry {
	struct tls_ctx_entry *next;
	char *ca_file;               /* NULL: OpenSSL's default paths */
	SSL_CTX *ctx;
};

static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tls_ctx_entry *tls_ctxs;
static Gsasl *sasl_ctx;

/* The client context for ca_file, made on first use; a reference the caller frees with
 * SSL_CTX_free (SSL_new takes its own).  0, -ENOMEM, or -EPERM (the CA file unreadable). */
static int tls_ctx_get(const char *ca_file, SSL_CTX **ret)
{
	int r = 0;
	pthread_mutex_lock(&global_lock);
	struct tls_ctx_entry *e;
	for (e = tls_ctxs; e; e = e->next)
		if ((!e->ca_file && !ca_file) || (e->ca_file && ca_file && !strcmp(e->ca_file, ca_file)))
			break;
	if (!e) {
		SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
		e = calloc(1, sizeof(*e));
		char *dup = ca_file ? strdup(ca_file) : NULL;
		if (!ctx || !e || (ca_file && !dup)) {
			r = -ENOMEM;
			goto fail;
		}
		/* XXX protocol versions and ciphers are OpenSSL's (system) defaults: under
		 * SMTP_TLS_MAY a server that only speaks TLS 1.0 fails the handshake and gets
		 * no mail on that connection rather than mail in clear; no session resumption */
		/* a server that closes without close_notify is an EOF, not a TLS error */
		SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
		SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
				      SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
		if ((ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
			     : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
			ERR_clear_error();
			r = -EPERM;
			goto fail;
		}
		e->ctx = ctx;
		e->ca_file = dup;
		e->next = tls_ctxs;
		tls_ctxs = e;
		goto found;
	fail:
		SSL_CTX_free(ctx);
		free(e);
		free(dup);
		pthread_mutex_unlock(&global_lock);
		return r;
	}
found:
	SSL_CTX_up_ref(e->ctx);
	*ret = e->ctx;
	pthread_mutex_unlock(&global_lock);
	return 0;
}

/* XXX the Gsasl context is shared by every thread once made: gsasl_client_start() only
 * reads it, and no callback is installed (properties are set per session). */
static Gsasl *sasl_get(void)
{
	pthread_mutex_lock(&global_lock);
	if (!sasl_ctx && gsasl_init(&sasl_ctx) != GSASL_OK)
		sasl_ctx = NULL;
	Gsasl *g = sasl_ctx;
	pthread_mutex_unlock(&global_lock);
	return g;
}

void smtp_out_tls_cleanup(void)
{
	pthread_mutex_lock(&global_lock);
	while (tls_ctxs) {
		struct tls_ctx_entry *e = tls_ctxs;
		tls_ctxs = e->next;
		SSL_CTX_free(e->ctx);
		free(e->ca_file);
		free(e);
	}
	if (sasl_ctx) {
		gsasl_done(sasl_ctx);
		sasl_ctx = NULL;
	}
	pthread_mutex_unlock(&global_lock);
}

/* ---- small helpers ---- */

static void *mem_free(void *p)
{
	free(p);
	return NULL;
}

static bool is_2xx(const struct smtp_reply *r)
{
	return r->code / 100 == 2;
}

static bool is_refusal(const struct smtp_reply *r)
{
	return r->code / 100 == 4 || r->code / 100 == 5;
}

static enum smtp_out_stage stage_of(const struct smtp_out *c)
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
static void arm(struct smtp_out *c)
{
	if (c->phase == PH_BODY && !c->body_done)
		arm_ms(c, c->conf->timeout_ms[SMTP_STAGE_DATA] ? c->conf->timeout_ms[SMTP_STAGE_DATA]
							     : BODY_TIMEOUT_MS);
	else
		arm_ms(c, timeout_ms(c, stage_of(c)));
}

static struct evbuffer *out_buf(struct smtp_out *c)
{
	return bufferevent_get_output(c->bev);
}

/* Queue a command line (CRLF added).  0 or -ENOMEM. */
static int send_cmd(struct smtp_out *c, const char *s)
{
	struct evbuffer *o = out_buf(c);
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
static void release(struct smtp_out *c)
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
}

/* The transaction is over: call done() once.  The caller returns at once afterwards. */
static void report(struct smtp_out *c, enum smtp_out_stage st, int error, const char *why,
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
static void fail(struct smtp_out *c, enum smtp_out_stage st, int error, const char *why,
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
		release(c);
		return;
	}
	if (c->msg) {
		report(c, st, error, why, reply);
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

static void fail_nomem(struct smtp_out *c)
{
	fail(c, stage_of(c), -ENOMEM, "out of memory", NULL, true);
}

static void fail_proto(struct smtp_out *c, const char *why)
{
	fail(c, stage_of(c), -EPROTO, why, NULL, true);
}

/* ---- session set-up ---- */

static void start_transaction(struct smtp_out *c);

static void send_quit(struct smtp_out *c)
{
	if (send_cmd(c, "QUIT") < 0) {
		release(c);
		return;
	}
	c->phase = PH_QUIT;
	arm_ms(c, timeout_ms(c, SMTP_STAGE_QUIT));
}

/* Nothing outstanding: start the pending transaction, or QUIT, or (the session just set
 * up, nothing waiting) tell the relay. */
static void ready(struct smtp_out *c)
{
	bool first = !c->session_ready;
	c->phase = PH_READY;
	c->session_ready = true;
	evtimer_del(c->timer);
	if (c->quitting)
		send_quit(c);
	else if (c->msg && !c->unusable)
		start_transaction(c);
	else if (first && !c->msg && c->ready)
		c->ready(c->ready_arg, c, NULL);
}

static void send_ehlo(struct smtp_out *c, const char *verb)
{
	struct evbuffer *o = out_buf(c);
	const char *helo = c->conf->helo;
	if (evbuffer_add_printf(o, "%s %s\r\n", verb, helo) < 0) {
		fail_nomem(c);
		return;
	}
	memset(&c->seen, 0, sizeof(c->seen));
	c->phase = verb[0] == 'E' ? PH_EHLO : PH_HELO;
	arm(c);
}

static bool word_eq(struct str w, const char *s)
{
	return w.len == strlen(s) && strncasecmp(w.ptr, s, w.len) == 0;
}

/* Next space-separated word of *s (advanced), or an empty str at the end. */
static struct str next_word(struct str *s)
{
	size_t i = 0;
	while (i < s->len && (s->ptr[i] == ' ' || s->ptr[i] == '\t'))
		i++;
	size_t j = i;
	while (j < s->len && s->ptr[j] != ' ' && s->ptr[j] != '\t')
		j++;
	struct str w = str_make(s->ptr + i, j - i);
	*s = str_make(s->ptr + j, s->len - j);
	return w;
}

static void add_auth_mechs(struct ehlo_ext *e, struct str rest)
{
	for (struct str w = next_word(&rest); w.len; w = next_word(&rest)) {
		size_t have = strlen(e->auth);
		if (w.len > GSASL_MAX_MECHANISM_SIZE || have + w.len + 2 > sizeof(e->auth))
			continue; /* not a mechanism we could name, or no room: dropped */
		if (have)
			e->auth[have++] = ' ';
		for (size_t i = 0; i < w.len; i++) {
			char ch = w.ptr[i];
			e->auth[have++] = ch >= 'a' && ch <= 'z' ? (char)(ch - 'a' + 'A') : ch;
		}
		e->auth[have] = '\0';
	}
	e->ext |= EXT_AUTH;
}

/* One EHLO keyword line (the text after "250-"). */
static void ehlo_line(struct ehlo_ext *e, struct str text)
{
	struct str rest = text;
	struct str kw = next_word(&rest);
	if (kw.len > 5 && strncasecmp(kw.ptr, "AUTH=", 5) == 0) { /* legacy "AUTH=LOGIN PLAIN" */
		struct str first = str_make(kw.ptr + 5, kw.len - 5);
		add_auth_mechs(e, first);
		add_auth_mechs(e, rest);
	} else if (word_eq(kw, "AUTH")) {
		add_auth_mechs(e, rest);
	} else if (word_eq(kw, "PIPELINING")) {
		e->ext |= EXT_PIPELINING;
	} else if (word_eq(kw, "8BITMIME")) {
		e->ext |= EXT_8BITMIME;
	} else if (word_eq(kw, "SMTPUTF8")) {
		e->ext |= EXT_SMTPUTF8;
	} else if (word_eq(kw, "STARTTLS")) {
		e->ext |= EXT_STARTTLS;
	} else if (word_eq(kw, "SIZE")) {
		e->ext |= EXT_SIZE;
		struct str n = next_word(&rest);
		uint64_t v = 0;
		for (size_t i = 0; i < n.len; i++) {
			if (n.ptr[i] < '0' || n.ptr[i] > '9' || v > (UINT64_MAX - 9) / 10) {
				v = 0; /* not a number: no limit known */
				break;
			}
			v = v * 10 + (uint64_t)(n.ptr[i] - '0');
		}
		e->size_max = v;
	}
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
			ehlo_line(&c->seen, str_make(p + 4, tl - 4));
		n -= len + 1;
		p = lf + 1;
	}
}

static void start_auth(struct smtp_out *c);

/* After a successful EHLO/HELO: STARTTLS, then AUTH, then ready. */
static void after_hello(struct smtp_out *c)
{
	const struct smtp_out_conf *cf = c->conf;
	if (!c->tls && cf->tls != SMTP_TLS_NONE) {
		if (c->ehlo.ext & EXT_STARTTLS) {
			if (send_cmd(c, "STARTTLS") < 0) {
				fail_nomem(c);
				return;
			}
			c->phase = PH_STARTTLS;
			arm(c);
			return;
		}
		if (cf->tls != SMTP_TLS_MAY) {
			fail(c, SMTP_STAGE_STARTTLS, -EPERM, "TLS is required and STARTTLS is not offered",
			     NULL, false);
			return;
		}
	}
	if (cf->auth_user && !c->authenticated) {
		start_auth(c);
		return;
	}
	ready(c);
}

static bool is_ip_literal(const char *s)
{
	unsigned char b[sizeof(struct in6_addr)];
	return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

static void bev_read_cb(struct bufferevent *bev, void *arg);
static void bev_write_cb(struct bufferevent *bev, void *arg);
static void bev_event_cb(struct bufferevent *bev, short what, void *arg);

/* The server said 220 to STARTTLS: the handshake, over the socket's bufferevent. */
static void start_tls(struct smtp_out *c)
{
	const struct smtp_out_conf *cf = c->conf;
	bool verify = cf->tls == SMTP_TLS_VERIFY;
	if (verify && !cf->server_name) {
		fail(c, SMTP_STAGE_STARTTLS, -EPERM, "tls verify without a server name to check",
		     NULL, true);
		return;
	}
	SSL_CTX *ctx;
	int r = tls_ctx_get(verify ? cf->ca_file : NULL, &ctx);
	if (r < 0) {
		fail(c, SMTP_STAGE_STARTTLS, r,
		     r == -EPERM ? "the CA file could not be loaded" : "out of memory", NULL, true);
		return;
	}
	SSL *ssl = SSL_new(ctx);
	SSL_CTX_free(ctx);
	if (!ssl) {
		fail_nomem(c);
		return;
	}
	bool ip = cf->server_name && is_ip_literal(cf->server_name);
	if (cf->server_name && !ip) /* RFC 6066: no IP literal in SNI */
		SSL_set_tlsext_host_name(ssl, cf->server_name);
	if (verify) {
		SSL_set_verify(ssl, SSL_VERIFY_PEER, NULL);
		SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), cf->server_name)
			    : SSL_set1_host(ssl, cf->server_name);
		if (ok != 1) {
			SSL_free(ssl);
			fail(c, SMTP_STAGE_STARTTLS, -EPERM, "the server name cannot be checked", NULL,
			     true);
			return;
		}
	} else {
		SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
	}
	/* the filter encrypts into the socket's output only up to TLS_UNDER_HIGH, so the
	 * body's bound holds over TLS too */
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, TLS_UNDER_HIGH);
	struct bufferevent *f = bufferevent_openssl_filter_new(
		c->base, c->bev, ssl, BUFFEREVENT_SSL_CONNECTING,
		BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
	if (!f) {
		/* XXX libevent frees the socket's bufferevent and the SSL on some of its failure
		 * paths and not on others (allocation): forget both rather than free twice */
		c->bev = NULL;
		fail(c, SMTP_STAGE_STARTTLS, -ENOMEM, "the TLS layer could not be set up", NULL, true);
		return;
	}
	c->bev = f;
	c->ssl = ssl;
	bufferevent_openssl_set_allow_dirty_shutdown(f, 1);
	bufferevent_setcb(f, bev_read_cb, bev_write_cb, bev_event_cb, c);
	bufferevent_setwatermark(f, EV_READ, 0, INPUT_MAX);
	bufferevent_enable(f, EV_READ | EV_WRITE);
	c->phase = PH_HANDSHAKE;
	arm(c);
}

/* Is mech (a word) among the server's offered mechanisms? */
static bool offered(const char *list, struct str mech)
{
	struct str s = str_cstr(list);
	for (struct str w = next_word(&s); w.len; w = next_word(&s))
		if (w.len == mech.len && strncasecmp(w.ptr, mech.ptr, w.len) == 0)
			return true;
	return false;
}

/* XOAUTH2 (not in GNU SASL 2.2): one initial response, base64 of
 * "user=U^Aauth=Bearer TOKEN^A^A", the password being the token. */
static int xoauth2_initial(const char *user, const char *token, char **ret)
{
	size_t ul = strlen(user), tl = strlen(token);
	size_t n = 5 + ul + 1 + 12 + tl + 2;
	char *raw = malloc(n);
	if (!raw)
		return -ENOMEM;
	char *p = raw;
	memcpy(p, "user=", 5), p += 5;
	memcpy(p, user, ul), p += ul;
	*p++ = '\x01';
	memcpy(p, "auth=Bearer ", 12), p += 12;
	memcpy(p, token, tl), p += tl;
	*p++ = '\x01';
	*p++ = '\x01';
	char *out = NULL;
	size_t outlen;
	int r = gsasl_base64_to(raw, n, &out, &outlen);
	OPENSSL_cleanse(raw, n);
	free(raw);
	if (r != GSASL_OK)
		return -ENOMEM;
	*ret = out;
	return 0;
}

static void start_auth(struct smtp_out *c)
{
	const struct smtp_out_conf *cf = c->conf;
	if (!c->tls && !cf->auth_plaintext) {
		fail(c, SMTP_STAGE_AUTH, -EPERM, "AUTH without TLS is not allowed", NULL, false);
		return;
	}
	if (!(c->ehlo.ext & EXT_AUTH)) {
		fail(c, SMTP_STAGE_AUTH, -EPERM, "the server does not offer AUTH", NULL, false);
		return;
	}
	Gsasl *g = sasl_get();
	if (!g) {
		fail_nomem(c);
		return;
	}
	struct str prefs = str_cstr(cf->auth_mechanisms ? cf->auth_mechanisms
							: "SCRAM-SHA-256 SCRAM-SHA-1 PLAIN LOGIN");
	struct str mech = STR_NULL;
	for (struct str w = next_word(&prefs); w.len; w = next_word(&prefs)) {
		if (w.len > GSASL_MAX_MECHANISM_SIZE || !offered(c->ehlo.auth, w))
			continue;
		char name[GSASL_MAX_MECHANISM_SIZE + 1];
		for (size_t i = 0; i < w.len; i++)
			name[i] = w.ptr[i] >= 'a' && w.ptr[i] <= 'z' ? (char)(w.ptr[i] - 'a' + 'A')
								    : w.ptr[i];
		name[w.len] = '\0';
		if (strcmp(name, "XOAUTH2") == 0 || gsasl_client_support_p(g, name)) {
			memcpy(c->auth_mech, name, w.len + 1);
			mech = w;
			break;
		}
	}
	if (!mech.len) {
		fail(c, SMTP_STAGE_AUTH, -EPERM, "no AUTH mechanism in common with the server", NULL,
		     false);
		return;
	}
	const char *password = cf->auth_password ? cf->auth_password : "";
	char *ir = NULL;
	bool send_ir = true;
	c->sasl_finished = false;
	c->sasl_aborted = false;
	c->xoauth2 = strcmp(c->auth_mech, "XOAUTH2") == 0;
	if (c->xoauth2) {
		if (xoauth2_initial(cf->auth_user, password, &ir) < 0) {
			fail_nomem(c);
			return;
		}
		c->sasl_finished = true;
	} else {
		if (gsasl_client_start(g, c->auth_mech, &c->sasl) != GSASL_OK) {
			c->sasl = NULL;
			fail_nomem(c);
			return;
		}
		if (gsasl_property_set(c->sasl, GSASL_AUTHID, cf->auth_user) != GSASL_OK ||
		    gsasl_property_set(c->sasl, GSASL_PASSWORD, password) != GSASL_OK) {
			fail_nomem(c);
			return;
		}
		if (strcmp(c->auth_mech, "LOGIN") == 0) {
			send_ir = false; /* servers prompt for the user name; many refuse it early */
		} else {
			int r = gsasl_step64(c->sasl, "", &ir);
			if (r == GSASL_OK)
				c->sasl_finished = true;
			else if (r != GSASL_NEEDS_MORE) {
				fail(c, SMTP_STAGE_AUTH, -EPROTO, "the SASL mechanism could not start",
				     NULL, false);
				return;
			}
			/* a mechanism that waits for the server's first challenge */
			if (r == GSASL_NEEDS_MORE && ir && !ir[0])
				send_ir = false;
		}
	}
	struct evbuffer *o = out_buf(c);
	int r;
	if (send_ir)
		r = evbuffer_add_printf(o, "AUTH %s %s\r\n", c->auth_mech, ir && ir[0] ? ir : "=");
	else
		r = evbuffer_add_printf(o, "AUTH %s\r\n", c->auth_mech);
	if (ir) {
		OPENSSL_cleanse(ir, strlen(ir));
		gsasl_free(ir);
	}
	if (r < 0) {
		fail_nomem(c);
		return;
	}
	c->phase = PH_AUTH;
	arm(c);
}

static void on_auth_reply(struct smtp_out *c, const struct smtp_reply *r)
{
	if (r->code == 235 && !c->sasl_aborted) {
		/* XXX a 235 before a SCRAM server's final message is taken as success: the server
		 * is not authenticated to us then, only we to it */
		c->authenticated = true;
		if (c->sasl) {
			gsasl_finish(c->sasl);
			c->sasl = NULL;
		}
		after_hello(c);
		return;
	}
	if (r->code == 334 && !c->sasl_aborted) {
		const char *answer = "";
		char *out = NULL;
		if (c->sasl && !c->sasl_finished) {
			int s = gsasl_step64(c->sasl, r->text, &out);
			if (s == GSASL_OK)
				c->sasl_finished = true;
			if (s == GSASL_OK || s == GSASL_NEEDS_MORE) {
				answer = out ? out : "";
			} else {
				answer = "*"; /* cancel (RFC 4954 4): the server answers 501 */
				c->sasl_aborted = true;
			}
		} else if (!c->xoauth2) {
			answer = "*"; /* a challenge after the mechanism's end */
			c->sasl_aborted = true;
		}
		/* XOAUTH2: the 334 carries the error; an empty line gets the final 5xx */
		int e = send_cmd(c, answer);
		if (out) {
			OPENSSL_cleanse(out, strlen(out));
			gsasl_free(out);
		}
		if (e < 0) {
			fail_nomem(c);
			return;
		}
		arm(c);
		return;
	}
	if (c->sasl_aborted) {
		fail(c, SMTP_STAGE_AUTH, -EPROTO,
		     "the SASL exchange failed (a challenge not understood or a wrong server proof)",
		     NULL, false);
		return;
	}
	if (is_refusal(r)) {
		fail(c, SMTP_STAGE_AUTH, 0, "", r, false);
		return;
	}
	fail_proto(c, "an unexpected reply to AUTH");
}

/* ---- the transaction ---- */

/* Addresses go into command lines: no line breaks, NUL or brackets, bounded. */
static bool addr_ok(struct str a)
{
	if (a.len > SMTP_OUT_ADDR_MAX)
		return false;
	for (size_t i = 0; i < a.len; i++) {
		unsigned char ch = (unsigned char)a.ptr[i];
		if (ch == '\r' || ch == '\n' || ch == '\0' || ch == '<' || ch == '>')
			return false;
	}
	return true;
}

static int add_path(struct evbuffer *o, const char *verb, struct str a)
{
	if (evbuffer_add(o, verb, strlen(verb)) < 0 || (a.len && evbuffer_add(o, a.ptr, a.len) < 0) ||
	    evbuffer_add(o, ">", 1) < 0)
		return -ENOMEM;
	return 0;
}

static int send_rcpt(struct smtp_out *c, size_t i)
{
	struct evbuffer *o = out_buf(c);
	if (add_path(o, "RCPT TO:<", c->msg->rcpt[i]) < 0 || evbuffer_add(o, "\r\n", 2) < 0)
		return -ENOMEM;
	return 0;
}

/* What ends a transaction before anything is sent: 0, or the error with *why. */
static int tx_check(const struct smtp_out *c, const struct smtp_out_msg *m, const char **why)
{
	if (c->ehlo.size_max && m->size > c->ehlo.size_max) {
		*why = "the message is larger than the server's SIZE";
		return -EMSGSIZE;
	}
	if (m->smtputf8 && !(c->ehlo.ext & EXT_SMTPUTF8)) {
		*why = "the message needs SMTPUTF8 and the server does not offer it";
		return -EPROTONOSUPPORT;
	}
	return 0;
}

/* MAIL, and every RCPT with PIPELINING, into the output; the phase becomes MAIL.  0 or
 * -ENOMEM (part of a command may be in the output then: the connection is lost). */
static int tx_write_mail(struct smtp_out *c)
{
	const struct smtp_out_msg *m = c->msg;
	c->active = true;
	c->rcpt_got = c->rcpt_ok = 0;
	c->mail_failed = false;
	struct evbuffer *o = out_buf(c);
	int r = add_path(o, "MAIL FROM:<", m->sender);
	if (r == 0 && (c->ehlo.ext & EXT_SIZE))
		r = evbuffer_add_printf(o, " SIZE=%llu", (unsigned long long)m->size) < 0 ? -ENOMEM : 0;
	/* XXX an 8-bit message to a server without 8BITMIME goes as it is (no conversion to
	 * 7 bit, RFC 6152 3): nearly every server takes it */
	if (r == 0 && m->eightbit && (c->ehlo.ext & EXT_8BITMIME))
		r = evbuffer_add(o, " BODY=8BITMIME", 14);
	if (r == 0 && m->smtputf8)
		r = evbuffer_add(o, " SMTPUTF8", 9);
	if (r == 0)
		r = evbuffer_add(o, "\r\n", 2);
	if (r == 0 && (c->ehlo.ext & EXT_PIPELINING))
		for (size_t i = 0; i < m->nrcpt && r == 0; i++)
			r = send_rcpt(c, i);
	if (r < 0)
		return -ENOMEM;
	c->phase = PH_MAIL;
	arm(c);
	return 0;
}

static void start_transaction(struct smtp_out *c)
{
	const char *why = NULL;
	int e = tx_check(c, c->msg, &why);
	if (e < 0) {
		c->active = true;
		report(c, SMTP_STAGE_MAIL, e, why, NULL);
		return;
	}
	if (tx_write_mail(c) < 0)
		fail_nomem(c);
}

/* A transaction refused at MAIL, RCPT or DATA: RSET (the connection stays for the next
 * one), then report. */
static void end_with_rset(struct smtp_out *c, enum smtp_out_stage st, const struct smtp_reply *r)
{
	struct smtp_reply copy = *r; /* r may be c->end_reply */
	if (send_cmd(c, "RSET") < 0) {
		fail_nomem(c);
		return;
	}
	c->phase = PH_RSET;
	arm(c);
	report(c, st, 0, "", &copy);
}

/* Copy k bytes of body at p into the output, dot-stuffed: a '.' at the start of a line
 * (after any LF, across chunk boundaries) gets another. */
static int stuff(struct smtp_out *c, struct evbuffer *o, const char *p, size_t k)
{
	size_t start = 0, i = 0;
	if (c->at_line_start && p[0] == '.' && evbuffer_add(o, ".", 1) < 0)
		return -ENOMEM;
	while (i < k) {
		const char *lf = memchr(p + i, '\n', k - i);
		if (!lf)
			break;
		i = (size_t)(lf - p) + 1;
		if (i < k && p[i] == '.') {
			if (evbuffer_add(o, p + start, i - start) < 0 || evbuffer_add(o, ".", 1) < 0)
				return -ENOMEM;
			start = i;
		}
	}
	if (evbuffer_add(o, p + start, k - start) < 0)
		return -ENOMEM;
	c->at_line_start = p[k - 1] == '\n';
	if (k >= 2) {
		c->tail[0] = p[k - 2];
		c->tail[1] = p[k - 1];
	} else {
		c->tail[0] = c->tail[1];
		c->tail[1] = p[0];
	}
	c->body_any = true;
	return 0;
}

/* Queue body up to BODY_PENDING_MAX, and the final dot after the last chunk. */
static int body_fill(struct smtp_out *c)
{
	const struct smtp_out_msg *m = c->msg;
	struct evbuffer *o = out_buf(c);
	while (!c->body_done) {
		size_t pend = evbuffer_get_length(o);
		if (pend >= BODY_PENDING_MAX)
			break;
		if (c->body_i == m->nbody) {
			bool crlf = !c->body_any || (c->tail[0] == '\r' && c->tail[1] == '\n');
			const char *fin = crlf ? ".\r\n" : "\r\n.\r\n";
			if (evbuffer_add(o, fin, strlen(fin)) < 0)
				return -ENOMEM;
			c->body_done = true;
			/* the write callback now says when all of it has left */
			bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
			break;
		}
		struct str ch = m->body[c->body_i];
		size_t left = ch.len - c->body_off;
		size_t room = BODY_PENDING_MAX - pend;
		size_t k = left < room ? left : room;
		if (k && stuff(c, o, ch.ptr + c->body_off, k) < 0)
			return -ENOMEM;
		c->body_off += k;
		if (c->body_off == ch.len) {
			c->body_i++;
			c->body_off = 0;
		}
	}
	return 0;
}

static void start_body(struct smtp_out *c)
{
	c->phase = PH_BODY;
	c->body_i = c->body_off = 0;
	c->at_line_start = true;
	c->body_any = c->body_done = false;
	c->tail[0] = c->tail[1] = 0;
	bufferevent_setwatermark(c->bev, EV_WRITE, BODY_LOW_WATER, 0);
	if (body_fill(c) < 0) {
		fail_nomem(c);
		return;
	}
	arm(c);
}

static void on_rcpt_reply(struct smtp_out *c, const struct smtp_reply *r)
{
	const struct smtp_out_msg *m = c->msg;
	if (!is_2xx(r) && !is_refusal(r)) {
		fail_proto(c, "an unexpected reply to RCPT");
		return;
	}
	size_t i = c->rcpt_got++;
	if (!c->mail_failed) {
		c->rcpt[i] = *r;
		if (is_2xx(r))
			c->rcpt_ok++;
		else
			c->end_reply = *r;
	}
	if (c->rcpt_got < m->nrcpt) {
		if (!(c->ehlo.ext & EXT_PIPELINING) && send_rcpt(c, c->rcpt_got) < 0) {
			fail_nomem(c);
			return;
		}
		arm(c);
		return;
	}
	if (c->mail_failed) {
		end_with_rset(c, SMTP_STAGE_MAIL, &c->end_reply);
		return;
	}
	if (c->rcpt_ok == 0) {
		end_with_rset(c, SMTP_STAGE_RCPT, &c->end_reply);
		return;
	}
	if (send_cmd(c, "DATA") < 0) {
		fail_nomem(c);
		return;
	}
	c->phase = PH_DATA;
	arm(c);
}

static void on_reply(struct smtp_out *c, const struct smtp_reply *r)
{
	if (r->code == 421 && c->phase != PH_QUIT) { /* the server is closing the connection */
		fail(c, stage_of(c), 0, "", r, true);
		return;
	}
	if (c->quitting && c->phase != PH_QUIT) {
		/* QUIT where a command could follow; elsewhere just close */
		if (c->phase == PH_GREETING || c->phase == PH_EHLO || c->phase == PH_HELO ||
		    c->phase == PH_RSET)
			send_quit(c);
		else
			release(c);
		return;
	}
	switch (c->phase) {
	case PH_GREETING:
		if (r->code == 220)
			send_ehlo(c, "EHLO");
		else if (is_refusal(r))
			fail(c, SMTP_STAGE_GREETING, 0, "", r, false);
		else
			fail_proto(c, "an unexpected greeting");
		return;
	case PH_EHLO:
		if (is_2xx(r)) {
			c->ehlo = c->seen;
			after_hello(c);
		} else if (!c->tls && (r->code == 500 || r->code == 502 || r->code == 504 ||
				       r->code == 550)) {
			send_ehlo(c, "HELO");
		} else if (is_refusal(r)) {
			fail(c, stage_of(c), 0, "", r, false);
		} else {
			fail_proto(c, "an unexpected reply to EHLO");
		}
		return;
	case PH_HELO:
		if (is_2xx(r)) {
			memset(&c->ehlo, 0, sizeof(c->ehlo));
			after_hello(c);
		} else if (is_refusal(r)) {
			fail(c, SMTP_STAGE_EHLO, 0, "", r, false);
		} else {
			fail_proto(c, "an unexpected reply to HELO");
		}
		return;
	case PH_STARTTLS:
		if (r->code == 220) {
			/* anything after the 220 was sent in clear before the handshake: an
			 * injection (CVE-2011-0411), never to be read as if it came over TLS */
			if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) {
				fail_proto(c, "data after the reply to STARTTLS");
				return;
			}
			start_tls(c);
		} else if (is_refusal(r) && c->conf->tls == SMTP_TLS_MAY) {
			c->ehlo.ext &= ~(unsigned)EXT_STARTTLS; /* go on in clear */
			after_hello(c);
		} else if (is_refusal(r)) {
			fail(c, SMTP_STAGE_STARTTLS, 0, "", r, false);
		} else {
			fail_proto(c, "an unexpected reply to STARTTLS");
		}
		return;
	case PH_AUTH:
		on_auth_reply(c, r);
		return;
	case PH_MAIL:
		if (!is_2xx(r) && !is_refusal(r)) {
			fail_proto(c, "an unexpected reply to MAIL");
			return;
		}
		if (c->ehlo.ext & EXT_PIPELINING) {
			/* the RCPTs' replies follow; after a refused MAIL they say nothing about
			 * the recipients and are not reported */
			if (!is_2xx(r)) {
				c->mail_failed = true;
				c->end_reply = *r;
			}
			c->phase = PH_RCPT;
			arm(c);
			return;
		}
		if (!is_2xx(r)) {
			end_with_rset(c, SMTP_STAGE_MAIL, r);
			return;
		}
		if (send_rcpt(c, 0) < 0) {
			fail_nomem(c);
			return;
		}
		c->phase = PH_RCPT;
		arm(c);
		return;
	case PH_RCPT:
		on_rcpt_reply(c, r);
		return;
	case PH_DATA:
		if (r->code == 354)
			start_body(c);
		else if (is_refusal(r))
			end_with_rset(c, SMTP_STAGE_DATA, r);
		else
			fail_proto(c, "an unexpected reply to DATA");
		return;
	case PH_BODY:
		if (!c->body_done) {
			/* a reply before the end of the data: the server stopped reading it, and
			 * the rest of our stream would be taken for commands */
			if (is_refusal(r))
				fail(c, SMTP_STAGE_DATA, 0, "", r, true);
			else
				fail_proto(c, "a reply before the end of the data");
			return;
		}
		/* the dot was queued, and this is its reply */
		__attribute__((fallthrough));
	case PH_DOT:
		if (!is_2xx(r) && !is_refusal(r)) {
			fail_proto(c, "an unexpected reply after the data");
			return;
		}
		c->ntrans++;
		c->phase = PH_READY;
		evtimer_del(c->timer);
		report(c, SMTP_STAGE_DOT, 0, "", r);
		return;
	case PH_RSET:
		if (is_2xx(r))
			ready(c);
		else
			fail(c, SMTP_STAGE_RSET, 0, "", r, !is_refusal(r));
		return;
	case PH_QUIT:
		release(c);
		return;
	default:
		fail_proto(c, "a reply when none was expected");
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
			fail_nomem(c);
			return;
		}
		struct smtp_reply r;
		size_t used = 0;
		const char *why = NULL;
		int k = smtp_reply_read(&c->rd, p, n, &r, &used, &why);
		if (k < 0) {
			fail_proto(c, why ? why : "a malformed reply");
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

static void bev_read_cb(struct bufferevent *bev, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	process_input(c);
	leave(c);
}

static void bev_write_cb(struct bufferevent *bev, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	if (c->phase == PH_BODY) {
		if (c->body_done) {
			if (evbuffer_get_length(out_buf(c)) == 0) {
				c->phase = PH_DOT;
				arm(c);
			}
		} else if (body_fill(c) < 0) {
			fail_nomem(c);
		} else {
			/* progress: a new body write timeout.  XXX progress is seen when the output
			 * drains to BODY_LOW_WATER, not at every write: a peer slower than about
			 * 1 KiB/s over the whole timeout counts as stalled */
			arm(c);
		}
	}
	leave(c);
}

static void bev_event_cb(struct bufferevent *bev, short what, void *arg)
{
	struct smtp_out *c = arg;
	enter(c);
	if (what & BEV_EVENT_CONNECTED) {
		if (c->phase == PH_HANDSHAKE) {
			c->tls = true;
			c->tls_version = c->ssl ? SSL_get_version(c->ssl) : "";
			/* RFC 3207 4.2: forget what was learnt in clear */
			memset(&c->ehlo, 0, sizeof(c->ehlo));
			send_ehlo(c, "EHLO");
		}
	} else if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
		if (c->phase == PH_HANDSHAKE) {
			long v = c->ssl ? SSL_get_verify_result(c->ssl) : X509_V_OK;
			if (c->conf->tls == SMTP_TLS_VERIFY && v != X509_V_OK)
				fail(c, SMTP_STAGE_STARTTLS, -EPERM, X509_verify_cert_error_string(v),
				     NULL, true);
			else
				fail(c, SMTP_STAGE_STARTTLS, -EPROTO, "the TLS handshake failed", NULL,
				     true);
		} else if (c->phase == PH_QUIT) {
			release(c);
		} else {
			/* the replies that came before the end count first */
			if (what & BEV_EVENT_EOF)
				process_input(c);
			if (c->bev && !c->free_pending)
				fail(c, stage_of(c), -ECONNRESET,
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
		release(c);
	else
		fail(c, stage_of(c), -ETIMEDOUT, "timed out", NULL, true);
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
		fail(c, SMTP_STAGE_CONNECT, -err, "the connection failed", NULL, true);
		goto out;
	}
	if (c->quitting) { /* nothing said yet: nothing to say QUIT after */
		release(c);
		goto out;
	}
	c->bev = bufferevent_socket_new(c->base, c->fd, BEV_OPT_CLOSE_ON_FREE |
							 BEV_OPT_DEFER_CALLBACKS);
	if (!c->bev) {
		fail_nomem(c);
		goto out;
	}
	c->fd = -1;
	bufferevent_setcb(c->bev, bev_read_cb, bev_write_cb, bev_event_cb, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, INPUT_MAX);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	c->phase = PH_GREETING;
	arm(c);
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
			report(c, c->fail_stage, c->fail_error, c->fail_why,
			       c->fail_error == 0 ? &c->fail_reply : NULL);
		} else if (c->unusable) {
			report(c, stage_of(c), -ECONNRESET, "the connection is closed", NULL);
		} else if (c->phase == PH_READY) {
			start_transaction(c);
		} /* else: set-up or RSET under way; ready() starts it */
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
		fail(c, SMTP_STAGE_CONNECT, -errno, "no socket", NULL, true);
		return c;
	}
	/* commands and body are gathered in the output buffer and leave in as few writes as
	 * the socket takes: Nagle would only hold back the last small one (a final dot, a
	 * pipelined group) for a delayed ACK */
	int one = 1;
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (source && sourcelen && bind(c->fd, source, sourcelen) < 0) {
		fail(c, SMTP_STAGE_CONNECT, -errno, "the source address cannot be bound", NULL, true);
		return c;
	}
	if (connect(c->fd, addr, addrlen) < 0 && errno != EINPROGRESS) {
		fail(c, SMTP_STAGE_CONNECT, -errno, "the connection failed", NULL, true);
		return c;
	}
	c->conn_ev = event_new(base, c->fd, EV_WRITE, on_connected, c);
	if (!c->conn_ev) {
		destroy(c);
		errno = ENOMEM;
		return NULL;
	}
	event_add(c->conn_ev, NULL);
	arm(c);
	return c;
}

int smtp_out_send(struct smtp_out *c, const struct smtp_out_msg *m, smtp_out_done_fn *done,
		  void *arg)
{
	if (!m || !done || m->nrcpt == 0 || m->nrcpt > SMTP_OUT_RCPT_MAX || !m->rcpt ||
	    (m->nbody && !m->body) || !addr_ok(m->sender))
		return -EINVAL;
	for (size_t i = 0; i < m->nrcpt; i++)
		if (m->rcpt[i].len == 0 || !addr_ok(m->rcpt[i]))
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
	if (c->phase == PH_READY && !c->unusable && !c->fail_pending && tx_check(c, m, &why) == 0) {
		/* MAIL goes into the output now: the relay counts a send when it makes it */
		if (tx_write_mail(c) < 0) {
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
		send_quit(c);
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
		release(c);
		break;
	}
	if (c->free_pending && c->in_cb == 0)
		destroy(c);
}

struct smtp_out *smtp_out_free(struct smtp_out *c)
{
	if (!c)
		return NULL;
	release(c);
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
