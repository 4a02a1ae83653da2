/*
 * test_smtp_out -- the outgoing SMTP client (src/relay/smtp_out.c) against a scripted
 * server.
 *
 * The server is a thread on a loopback socket that plays a table of steps: expect this
 * exact line, send these bytes, read the data up to the final dot (and keep the exact
 * bytes), do the TLS handshake as a server (a self-signed certificate made here with the
 * OpenSSL API), run a SASL server exchange through GNU SASL.  It is blocking with receive
 * timeouts, so a client that stops talking fails the script instead of hanging it.  The
 * client runs on the test's event loop; done() records the result and, per test, frees,
 * quits or sends the next transaction from inside done().
 *
 * PIPELINING is checked by the script itself: the server reads MAIL and every RCPT before
 * it answers any, which only a pipelining client lets it do.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>
#include <gsasl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "smtp_out.h"

#define S(lit) { lit, sizeof(lit) - 1 }

/* ---- the scripted server ---- */

enum act {
	S_END = 0,
	S_SEND,      /* a: bytes to send */
	S_EXPECT,    /* a: the exact line expected, without CRLF */
	S_DATA,      /* read the data with its final dot line; a: the exact bytes, or NULL */
	S_TLS,       /* the TLS handshake as server; b: "fail" when it must fail (ends) */
	S_SASL,      /* a: the mechanism on the AUTH line; the exchange, then 235 or 535 */
	S_CLOSE,     /* close the connection (ends) */
	S_WAIT_EOF,  /* read until the client closes (ends) */
	S_SLEEP,     /* a: milliseconds */
};

struct step {
	enum act act;
	const char *a;
	const char *b;
};

struct server {
	int lfd;
	uint16_t port;
	pthread_t th;
	const struct step *script;
	int fd;
	SSL *ssl;
	char in[16384];
	size_t in_len;
	char err[512];
	char *data;
	size_t data_len, data_cap;
	int steps;                   /* steps done, for the client to wait on (atomic) */
};

static SSL_CTX *srv_ctx;         /* the server's certificate for mx.test */
static char ca_path[64];         /* that certificate as a PEM file, the client's CA */
static Gsasl *srv_sasl;          /* the server's own SASL context */

static void srv_fail(struct server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void srv_fail(struct server *s, const char *fmt, ...)
{
	if (s->err[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
}

static int srv_fill(struct server *s)
{
	size_t room = sizeof(s->in) - s->in_len;
	if (room == 0)
		return -1;
	ssize_t n = s->ssl ? SSL_read(s->ssl, s->in + s->in_len, (int)room)
			   : recv(s->fd, s->in + s->in_len, room, 0);
	if (n <= 0)
		return n == 0 ? 0 : -1;
	s->in_len += (size_t)n;
	return 1;
}

/* The next line with its CRLF: its length in *len, consumed by srv_consume(). */
static const char *srv_raw_line(struct server *s, size_t *len)
{
	for (;;) {
		char *lf = memchr(s->in, '\n', s->in_len);
		if (lf) {
			*len = (size_t)(lf - s->in) + 1;
			return s->in;
		}
		if (srv_fill(s) <= 0)
			return NULL;
	}
}

static void srv_consume(struct server *s, size_t n)
{
	memmove(s->in, s->in + n, s->in_len - n);
	s->in_len -= n;
}

/* A line without CRLF into out (NUL-terminated); false at EOF or an error. */
static bool srv_line(struct server *s, char *out, size_t outlen)
{
	size_t len;
	const char *p = srv_raw_line(s, &len);
	if (!p)
		return false;
	size_t tl = len - 1;
	if (tl && p[tl - 1] == '\r')
		tl--;
	if (tl >= outlen)
		tl = outlen - 1;
	memcpy(out, p, tl);
	out[tl] = '\0';
	srv_consume(s, len);
	return true;
}

static void srv_send(struct server *s, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = s->ssl ? SSL_write(s->ssl, p, (int)n) : send(s->fd, p, n, MSG_NOSIGNAL);
		if (w <= 0) {
			srv_fail(s, "send failed");
			return;
		}
		p += w;
		n -= (size_t)w;
	}
}

static void srv_sends(struct server *s, const char *str)
{
	srv_send(s, str, strlen(str));
}

static void srv_data_add(struct server *s, const char *p, size_t n)
{
	if (s->data_len + n > s->data_cap) {
		size_t cap = s->data_cap ? s->data_cap : 4096;
		while (cap < s->data_len + n)
			cap *= 2;
		char *d = realloc(s->data, cap);
		if (!d)
			abort();
		s->data = d;
		s->data_cap = cap;
	}
	memcpy(s->data + s->data_len, p, n);
	s->data_len += n;
}

static int srv_sasl_cb(Gsasl *ctx, Gsasl_session *sess, Gsasl_property prop)
{
	(void)ctx;
	if (prop == GSASL_PASSWORD) {
		const char *u = gsasl_property_fast(sess, GSASL_AUTHID);
		if (u && strcmp(u, "user") == 0)
			return gsasl_property_set(sess, GSASL_PASSWORD, "secret");
		return GSASL_NO_PASSWORD;
	}
	return GSASL_NO_CALLBACK;
}

/* "AUTH MECH [initial-response]", then challenges until the mechanism ends. */
static bool srv_sasl_exchange(struct server *s, const char *mech)
{
	char line[4096];
	if (!srv_line(s, line, sizeof(line))) {
		srv_fail(s, "EOF instead of AUTH %s", mech);
		return false;
	}
	size_t ml = strlen(mech);
	if (strncmp(line, "AUTH ", 5) != 0 || strncmp(line + 5, mech, ml) != 0 ||
	    (line[5 + ml] != '\0' && line[5 + ml] != ' ')) {
		srv_fail(s, "expected AUTH %s, got \"%s\"", mech, line);
		return false;
	}
	char input[4096] = "";
	if (line[5 + ml] == ' ' && strcmp(line + 6 + ml, "=") != 0)
		snprintf(input, sizeof(input), "%s", line + 6 + ml);
	Gsasl_session *sess;
	if (gsasl_server_start(srv_sasl, mech, &sess) != GSASL_OK) {
		srv_fail(s, "gsasl_server_start %s", mech);
		return false;
	}
	for (;;) {
		char *out = NULL;
		int r = gsasl_step64(sess, input, &out);
		if (r == GSASL_NEEDS_MORE || (r == GSASL_OK && out && out[0])) {
			char msg[4200];
			snprintf(msg, sizeof(msg), "334 %s\r\n", out ? out : "");
			srv_sends(s, msg);
			gsasl_free(out);
			if (!srv_line(s, input, sizeof(input))) {
				srv_fail(s, "EOF in the SASL exchange");
				break;
			}
			if (strcmp(input, "*") == 0) {
				srv_sends(s, "501 5.7.0 cancelled\r\n");
				break;
			}
			if (r == GSASL_OK) { /* the client's empty answer to our last data */
				srv_sends(s, input[0] ? "535 5.7.8 junk\r\n" : "235 2.7.0 ok\r\n");
				break;
			}
			continue;
		}
		gsasl_free(out);
		srv_sends(s, r == GSASL_OK ? "235 2.7.0 ok\r\n" : "535 5.7.8 bad credentials\r\n");
		break;
	}
	gsasl_finish(sess);
	return true;
}

static void *srv_main(void *arg)
{
	struct server *s = arg;
	struct pollfd pfd = { .fd = s->lfd, .events = POLLIN };
	if (poll(&pfd, 1, 8000) <= 0) {
		srv_fail(s, "no connection");
		return NULL;
	}
	s->fd = accept(s->lfd, NULL, NULL);
	if (s->fd < 0) {
		srv_fail(s, "accept");
		return NULL;
	}
	/* generous: a loaded machine (sanitizers, parallel runs) must not fail the script */
	struct timeval tv = { .tv_sec = 8 };
	setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int one = 1;
	setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	char line[4096];
	for (const struct step *st = s->script; st->act != S_END && !s->err[0]; st++) {
		switch (st->act) {
		case S_SEND:
			srv_sends(s, st->a);
			break;
		case S_EXPECT:
			if (!srv_line(s, line, sizeof(line)))
				srv_fail(s, "EOF while expecting \"%s\"", st->a);
			else if (strcmp(line, st->a) != 0)
				srv_fail(s, "expected \"%s\", got \"%s\"", st->a, line);
			break;
		case S_DATA: {
			s->data_len = 0; /* each transaction's data on its own */
			for (;;) {
				size_t len;
				const char *p = srv_raw_line(s, &len);
				if (!p) {
					srv_fail(s, "EOF in the data");
					break;
				}
				srv_data_add(s, p, len);
				bool dot = len == 3 && memcmp(p, ".\r\n", 3) == 0;
				srv_consume(s, len);
				if (dot)
					break;
			}
			if (st->a && !s->err[0] &&
			    (s->data_len != strlen(st->a) || memcmp(s->data, st->a, s->data_len) != 0))
				srv_fail(s, "data differs: got \"%.*s\"", (int)(s->data_len < 300 ? s->data_len : 300),
					 s->data);
			break;
		}
		case S_TLS: {
			if (s->in_len) {
				srv_fail(s, "bytes pipelined after STARTTLS");
				break;
			}
			s->ssl = SSL_new(srv_ctx);
			SSL_set_fd(s->ssl, s->fd);
			int r = SSL_accept(s->ssl);
			bool must_fail = st->b != NULL;
			if (r != 1) {
				ERR_clear_error();
				SSL_free(s->ssl);
				s->ssl = NULL;
				if (!must_fail)
					srv_fail(s, "the TLS handshake failed");
				goto end;
			}
			if (must_fail) {
				srv_fail(s, "the TLS handshake succeeded");
				goto end;
			}
			break;
		}
		case S_SASL:
			srv_sasl_exchange(s, st->a);
			break;
		case S_CLOSE:
			goto end;
		case S_WAIT_EOF:
			while (srv_fill(s) > 0)
				s->in_len = 0;
			goto end;
		case S_SLEEP:
			usleep((useconds_t)atoi(st->a) * 1000);
			break;
		case S_END:
			break;
		}
		__atomic_add_fetch(&s->steps, 1, __ATOMIC_SEQ_CST);
	}
end:
	if (s->ssl) {
		SSL_free(s->ssl);
		s->ssl = NULL;
	}
	close(s->fd);
	return NULL;
}

static void srv_start(struct server *s, const struct step *script)
{
	memset(s, 0, sizeof(*s));
	s->script = script;
	s->fd = -1;
	s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(s->lfd >= 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	assert_int_equal(bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(s->lfd, 4), 0);
	socklen_t len = sizeof(sa);
	assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&sa, &len), 0);
	s->port = ntohs(sa.sin_port);
	assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
}

/* Join the thread; the script must have run to its end.  The client's view, if any, is
 * shown with the server's error. */
static void srv_finish_with(struct server *s, const char *client)
{
	pthread_join(s->th, NULL);
	close(s->lfd);
	if (s->err[0])
		fail_msg("server: %s (client: %s)", s->err, client ? client : "-");
}

static void srv_finish(struct server *s)
{
	srv_finish_with(s, NULL);
}

/* ---- the client side ---- */

enum after { AFTER_NOTHING = 0, AFTER_FREE, AFTER_QUIT, AFTER_SEND };

struct outcome {
	enum smtp_out_stage stage;
	int error;
	char why[128];
	int code;
	char text[128];
	int rcpt[4];
	bool tls;
	char tls_version[16];
	char auth_mech[32];
	uint64_t size_limit;
	bool usable;
	unsigned transactions;
	int send_rc;                 /* AFTER_SEND: smtp_out_send's return */
};

struct run {
	struct event_base *base;
	struct event *guard;
	bool guard_fired;
	struct smtp_out *c;
	struct outcome out[4];
	int n;
	size_t nrcpt;                /* of the transaction under way */
	enum after after[4];         /* what the n-th done() does */
	const struct smtp_out_msg *next[4]; /* AFTER_SEND: the message */
};

static void on_done(void *arg, struct smtp_out *c, const struct smtp_out_result *r)
{
	struct run *run = arg;
	if (run->n >= 4 || c != run->c)
		abort();
	struct outcome *o = &run->out[run->n];
	o->stage = r->stage;
	o->error = r->error;
	snprintf(o->why, sizeof(o->why), "%s", r->why);
	o->code = r->reply.code;
	snprintf(o->text, sizeof(o->text), "%.100s", r->reply.text);
	for (size_t i = 0; i < run->nrcpt && i < 4; i++)
		o->rcpt[i] = r->rcpt[i].code;
	o->tls = r->tls;
	snprintf(o->tls_version, sizeof(o->tls_version), "%s", r->tls_version);
	snprintf(o->auth_mech, sizeof(o->auth_mech), "%s", r->auth_mech);
	o->size_limit = r->size_limit;
	o->usable = smtp_out_usable(c);
	o->transactions = smtp_out_transactions(c);
	enum after a = run->after[run->n];
	const struct smtp_out_msg *next = run->next[run->n];
	run->n++;
	switch (a) {
	case AFTER_FREE:
		run->c = smtp_out_free(c);
		break;
	case AFTER_QUIT:
		smtp_out_quit(c);
		run->c = NULL;
		break;
	case AFTER_SEND:
		run->nrcpt = next->nrcpt;
		o->send_rc = smtp_out_send(c, next, on_done, run);
		break;
	case AFTER_NOTHING:
		break;
	}
}

static const char *describe(const struct outcome *o, char *buf, size_t len)
{
	snprintf(buf, len, "stage %s error %d code %d why \"%s\" text \"%s\"",
		 smtp_out_stage_name(o->stage), o->error, o->code, o->why, o->text);
	return buf;
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	((struct run *)arg)->guard_fired = true;
}

static void run_init(struct run *run)
{
	memset(run, 0, sizeof(*run));
	run->base = event_base_new();
	assert_non_null(run->base);
	run->guard = evtimer_new(run->base, on_guard, run);
	struct timeval tv = { .tv_sec = 15 };
	evtimer_add(run->guard, &tv);
}

static void run_wait(struct run *run, int calls)
{
	while (run->n < calls && !run->guard_fired)
		event_base_loop(run->base, EVLOOP_ONCE);
	assert_int_equal(run->n, calls);
}

/* Quit (or free) what is left, and run the loop until the client has gone: the loop
 * returns only when no event is left, so a client that does not free itself hangs here
 * (alarm() ends the program). */
static void run_end(struct run *run, bool quit)
{
	event_free(run->guard);
	run->guard = NULL;
	if (run->c) {
		if (quit)
			smtp_out_quit(run->c);
		else
			smtp_out_free(run->c);
		run->c = NULL;
	}
	event_base_dispatch(run->base);
	event_base_free(run->base);
}

static int send_first(struct run *run, const struct smtp_out_msg *m)
{
	run->nrcpt = m->nrcpt;
	return smtp_out_send(run->c, m, on_done, run);
}

static struct smtp_out_conf conf_base(void)
{
	struct smtp_out_conf cf = { .helo = "client.test", .tls = SMTP_TLS_NONE };
	for (int i = 0; i < SMTP_STAGE_COUNT; i++)
		cf.timeout_ms[i] = 6000; /* the tests of timeouts set 150 ms where they look */
	return cf;
}

static struct smtp_out *connect_to(struct run *run, const struct smtp_out_conf *cf, uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	run->c = smtp_out_new(run->base, cf, (struct sockaddr *)&sa, sizeof(sa),
			      (struct sockaddr *)&src, sizeof(src));
	assert_non_null(run->c);
	return run->c;
}

/* One transaction against script: the server started, a client with cf connected to it,
 * m sent with done() doing after; the outcome into *ret_out and its description into desc;
 * the server finished (its script must have run to its end).  The caller frees
 * srv->data. */
static void run_one(struct server *srv, const struct step *script,
		    const struct smtp_out_conf *cf, const struct smtp_out_msg *m, enum after after,
		    struct outcome *ret_out, char *desc, size_t desclen)
{
	srv_start(srv, script);
	struct run run;
	run_init(&run);
	connect_to(&run, cf, srv->port);
	run.after[0] = after;
	assert_int_equal(send_first(&run, m), 0);
	run_wait(&run, 1);
	*ret_out = run.out[0];
	describe(ret_out, desc, desclen);
	run_end(&run, true);
	srv_finish_with(srv, desc);
}

/* ---- messages and script pieces ---- */

static const struct str rcpt3[] = { S("a@x.test"), S("b@x.test"), S("c@x.test"), S("") };
static const struct str body_hello[] = { S("Subject: t\r\n\r\nhello\r\n") };
#define HELLO_DATA "Subject: t\r\n\r\nhello\r\n.\r\n"

static const struct smtp_out_msg msg1 = {
	.sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 1, .body = body_hello, .nbody = 1,
	.size = 21, .eightbit = true,
};
static const struct smtp_out_msg msg_a = {
	.sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 1, .body = body_hello, .nbody = 1,
	.size = 21,
};
static const struct smtp_out_msg msg2 = {
	.sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 2, .body = body_hello, .nbody = 1,
	.size = 21,
};
static const struct smtp_out_msg msg3 = {
	.sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 3, .body = body_hello, .nbody = 1,
	.size = 21, .eightbit = true,
};
static const struct smtp_out_msg msg_big = { /* SIZE 5000 against the server's 1000 */
	.sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 1, .body = body_hello, .nbody = 1,
	.size = 5000,
};
static const struct smtp_out_msg msg_utf8 = {
	.sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 1, .body = body_hello, .nbody = 1,
	.size = 21, .smtputf8 = true,
};

#define GREET { S_SEND, "220 mx.test ESMTP\r\n", NULL }
#define EXPECT(l) { S_EXPECT, l, NULL }
#define SEND(b) { S_SEND, b, NULL }
#define EHLO_PIPE EXPECT("EHLO client.test"), \
	SEND("250-mx.test\r\n250-PIPELINING\r\n250-SIZE 100000\r\n250 8BITMIME\r\n")
#define EHLO_PLAIN EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250 8BITMIME\r\n")
#define QUIT_OK EXPECT("QUIT"), SEND("221 2.0.0 bye\r\n"), { S_WAIT_EOF, NULL, NULL }
#define WAIT_EOF { S_WAIT_EOF, NULL, NULL }
#define DATA_OK(d) EXPECT("DATA"), SEND("354 go\r\n"), { S_DATA, d, NULL }, \
	SEND("250 2.0.0 queued\r\n")
#define TX1 EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"), \
	SEND("250 ok\r\n250 ok\r\n"), DATA_OK(HELLO_DATA)

/* ---- table: one transaction, one script, one outcome ---- */

struct tcase {
	const char *name;
	const struct step *script;
	const struct smtp_out_msg *msg;
	enum smtp_out_tls tls;
	int timeout_stage;           /* >= 0: this stage's timeout is 150 ms */
	enum smtp_out_stage stage;
	int error;
	int code;
	int rcpt[4];
	bool usable;
	enum after after;
};

static const struct step sc_pipelining[] = {
	GREET, EHLO_PIPE,
	/* all four lines are read before any reply: only a pipelining client gets past */
	EXPECT("MAIL FROM:<s@x.test> SIZE=21 BODY=8BITMIME"),
	EXPECT("RCPT TO:<a@x.test>"), EXPECT("RCPT TO:<b@x.test>"), EXPECT("RCPT TO:<c@x.test>"),
	SEND("250 2.1.0 ok\r\n250 2.1.5 ok\r\n550 5.1.1 no such user\r\n251 2.1.5 forwarded\r\n"),
	DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_helo[] = {
	GREET, EXPECT("EHLO client.test"), SEND("502 5.5.2 what?\r\n"),
	EXPECT("HELO client.test"), SEND("250 mx.test\r\n"),
	/* no extensions: no SIZE=, no BODY=, one command at a time */
	EXPECT("MAIL FROM:<s@x.test>"), SEND("250 ok\r\n"),
	EXPECT("RCPT TO:<a@x.test>"), SEND("250 ok\r\n"),
	DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_size[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250-PIPELINING\r\n250 SIZE 1000\r\n"),
	QUIT_OK, { 0 } /* nothing of the message was sent */
};

static const struct step sc_utf8[] = { GREET, EHLO_PIPE, QUIT_OK, { 0 } };

static const struct step sc_greet421[] = {
	SEND("421 4.3.2 too busy\r\n"), WAIT_EOF, { 0 } /* the client closes by itself */
};

static const struct step sc_greet554[] = { SEND("554 5.7.1 go away\r\n"), QUIT_OK, { 0 } };

static const struct step sc_mail4xx[] = {
	GREET, EHLO_PLAIN, EXPECT("MAIL FROM:<s@x.test> BODY=8BITMIME"),
	SEND("451 4.3.0 try later\r\n"), EXPECT("RSET"), SEND("250 ok\r\n"), QUIT_OK, { 0 }
};

static const struct step sc_mail421[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	EXPECT("RCPT TO:<b@x.test>"), SEND("421 4.7.0 too many messages\r\n"), WAIT_EOF, { 0 }
};

static const struct step sc_mail5xx_pipe[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	EXPECT("RCPT TO:<b@x.test>"),
	SEND("553 5.1.8 bad sender\r\n503 5.5.1 need MAIL\r\n503 5.5.1 need MAIL\r\n"),
	EXPECT("RSET"), SEND("250 ok\r\n"), QUIT_OK, { 0 }
};

static const struct step sc_data5xx[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n250 ok\r\n"), EXPECT("DATA"), SEND("554 5.3.0 no data today\r\n"),
	EXPECT("RSET"), SEND("250 ok\r\n"), QUIT_OK, { 0 }
};

static const struct step sc_dot5xx[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n250 ok\r\n"), EXPECT("DATA"), SEND("354 go\r\n"),
	{ S_DATA, HELLO_DATA, NULL }, SEND("554 5.7.1 spam\r\n"), QUIT_OK, { 0 }
};

static const struct step sc_timeout_greeting[] = { WAIT_EOF, { 0 } };

static const struct step sc_timeout_rcpt[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n"), WAIT_EOF, { 0 }
};

static const struct step sc_timeout_dot[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n250 ok\r\n"), EXPECT("DATA"), SEND("354 go\r\n"),
	{ S_DATA, HELLO_DATA, NULL }, WAIT_EOF, { 0 }
};

static const struct step sc_malformed[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n25x broken\r\n"), WAIT_EOF, { 0 }
};

static const struct step sc_malformed_rcpt[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n250-a\r\n251 b\r\n"), WAIT_EOF, { 0 }
};

static const struct step sc_close_after_dot[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n250 ok\r\n"), EXPECT("DATA"), SEND("354 go\r\n"),
	{ S_DATA, HELLO_DATA, NULL }, { S_CLOSE, NULL, NULL }, { 0 }
};

static const struct step sc_close_at_ehlo[] = {
	GREET, EXPECT("EHLO client.test"), { S_CLOSE, NULL, NULL }, { 0 }
};

static const struct step sc_tls_not_offered[] = { GREET, EHLO_PIPE, QUIT_OK, { 0 } };

static const struct step sc_tls_refused_may[] = {
	GREET, EXPECT("EHLO client.test"),
	SEND("250-mx.test\r\n250-PIPELINING\r\n250 STARTTLS\r\n"), EXPECT("STARTTLS"),
	SEND("454 4.7.0 TLS not available\r\n"),
	/* MAY: on in clear */
	EXPECT("MAIL FROM:<s@x.test>"), EXPECT("RCPT TO:<a@x.test>"), SEND("250 ok\r\n250 ok\r\n"),
	DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_tls_injection[] = {
	GREET, EXPECT("EHLO client.test"),
	SEND("250-mx.test\r\n250-PIPELINING\r\n250 STARTTLS\r\n"), EXPECT("STARTTLS"),
	SEND("220 go ahead\r\n250 injected\r\n"), WAIT_EOF, { 0 }
};

/* The body cut into chunks anywhere, dots at line starts, a smuggling attempt: the
 * server's S_DATA compares the stuffed bytes. */
static const struct str body_dots[] = {
	S("Subject: dots\r\n\r\n"), S(".starts\r\n"), S("mid.dle\r\n"), S("a\r"), S("\n"),
	S(".x\r\n"), S("b\r\n"), S("."), S(".\r\n"), S(""), S("smuggle\r\n.\r\nMAIL FROM:<e@v>\r\n"),
	S("end"),
};
#define DOTS_DATA "Subject: dots\r\n\r\n..starts\r\nmid.dle\r\na\r\n..x\r\nb\r\n...\r\n" \
	"smuggle\r\n..\r\nMAIL FROM:<e@v>\r\nend\r\n.\r\n"

static const struct smtp_out_msg msg_dots = {
	.sender = { NULL, 0 }, .rcpt = rcpt3, .nrcpt = 1, .body = body_dots, .nbody = 12,
	.size = 81,
};

static const struct step sc_dots[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<> SIZE=81"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n250 ok\r\n"), DATA_OK(DOTS_DATA), QUIT_OK, { 0 }
};

static const struct tcase cases[] = {
	{ "pipelining, one RCPT refused", sc_pipelining, &msg3, SMTP_TLS_NONE, -1, SMTP_STAGE_DOT, 0,
	  250, { 250, 550, 251, 0 }, true, AFTER_QUIT },
	{ "HELO after a refused EHLO", sc_helo, &msg1, SMTP_TLS_NONE, -1, SMTP_STAGE_DOT, 0, 250,
	  { 250 }, true, AFTER_QUIT },
	{ "SIZE: not sent", sc_size, &msg_big, SMTP_TLS_NONE, -1, SMTP_STAGE_MAIL, -EMSGSIZE, 0,
	  { 0 }, true, AFTER_QUIT },
	{ "SMTPUTF8 not offered", sc_utf8, &msg_utf8, SMTP_TLS_NONE, -1, SMTP_STAGE_MAIL,
	  -EPROTONOSUPPORT, 0, { 0 }, true, AFTER_QUIT },
	{ "421 at the greeting", sc_greet421, &msg1, SMTP_TLS_NONE, -1, SMTP_STAGE_GREETING, 0, 421,
	  { 0 }, false, AFTER_FREE },
	{ "554 at the greeting", sc_greet554, &msg1, SMTP_TLS_NONE, -1, SMTP_STAGE_GREETING, 0, 554,
	  { 0 }, false, AFTER_QUIT },
	{ "4xx at MAIL, RSET", sc_mail4xx, &msg1, SMTP_TLS_NONE, -1, SMTP_STAGE_MAIL, 0, 451, { 0 },
	  true, AFTER_QUIT },
	{ "421 at MAIL (pipelined)", sc_mail421, &msg2, SMTP_TLS_NONE, -1, SMTP_STAGE_MAIL, 0, 421,
	  { 0 }, false, AFTER_NOTHING },
	{ "5xx at MAIL (pipelined): RCPT replies not reported", sc_mail5xx_pipe, &msg2,
	  SMTP_TLS_NONE, -1, SMTP_STAGE_MAIL, 0, 553, { 0, 0 }, true, AFTER_QUIT },
	{ "5xx at DATA, RSET", sc_data5xx, &msg_a, SMTP_TLS_NONE, -1, SMTP_STAGE_DATA, 0, 554,
	  { 250 }, true, AFTER_QUIT },
	{ "5xx after the dot", sc_dot5xx, &msg_a, SMTP_TLS_NONE, -1, SMTP_STAGE_DOT, 0, 554,
	  { 250 }, true, AFTER_QUIT },
	{ "timeout at the greeting", sc_timeout_greeting, &msg1, SMTP_TLS_NONE, SMTP_STAGE_GREETING,
	  SMTP_STAGE_GREETING, -ETIMEDOUT, 0, { 0 }, false, AFTER_FREE },
	{ "timeout at RCPT", sc_timeout_rcpt, &msg_a, SMTP_TLS_NONE, SMTP_STAGE_RCPT, SMTP_STAGE_RCPT,
	  -ETIMEDOUT, 0, { 0 }, false, AFTER_QUIT },
	{ "timeout after the dot", sc_timeout_dot, &msg_a, SMTP_TLS_NONE, SMTP_STAGE_DOT,
	  SMTP_STAGE_DOT, -ETIMEDOUT, 0, { 250 }, false, AFTER_FREE },
	{ "malformed EHLO reply", sc_malformed, &msg1, SMTP_TLS_NONE, -1, SMTP_STAGE_EHLO, -EPROTO,
	  0, { 0 }, false, AFTER_FREE },
	{ "malformed RCPT reply", sc_malformed_rcpt, &msg_a, SMTP_TLS_NONE, -1, SMTP_STAGE_RCPT,
	  -EPROTO, 0, { 0 }, false, AFTER_FREE },
	{ "closed after the dot", sc_close_after_dot, &msg_a, SMTP_TLS_NONE, -1, SMTP_STAGE_DOT,
	  -ECONNRESET, 0, { 250 }, false, AFTER_FREE },
	{ "closed at EHLO", sc_close_at_ehlo, &msg1, SMTP_TLS_NONE, -1, SMTP_STAGE_EHLO, -ECONNRESET,
	  0, { 0 }, false, AFTER_QUIT },
	{ "TLS required, STARTTLS not offered", sc_tls_not_offered, &msg1, SMTP_TLS_REQUIRE, -1,
	  SMTP_STAGE_STARTTLS, -EPERM, 0, { 0 }, false, AFTER_QUIT },
	{ "TLS may, STARTTLS refused: clear", sc_tls_refused_may, &msg_a, SMTP_TLS_MAY, -1,
	  SMTP_STAGE_DOT, 0, 250, { 250 }, true, AFTER_QUIT },
	{ "bytes injected after STARTTLS's 220", sc_tls_injection, &msg1, SMTP_TLS_REQUIRE, -1,
	  SMTP_STAGE_STARTTLS, -EPROTO, 0, { 0 }, false, AFTER_QUIT },
	{ "dot-stuffing, null sender", sc_dots, &msg_dots, SMTP_TLS_NONE, -1, SMTP_STAGE_DOT, 0,
	  250, { 250 }, true, AFTER_QUIT },
};

static void test_cases(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct tcase *t = &cases[i];
		print_message("case: %s\n", t->name);
		struct smtp_out_conf cf = conf_base();
		cf.tls = t->tls;
		if (t->timeout_stage >= 0)
			cf.timeout_ms[t->timeout_stage] = 150;
		struct server srv;
		struct outcome out;
		const struct outcome *o = &out;
		char desc[512];
		run_one(&srv, t->script, &cf, t->msg, t->after, &out, desc, sizeof(desc));
		if (o->stage != t->stage || o->error != t->error || o->code != t->code)
			fail_msg("%s: %s", t->name, desc);
		for (size_t k = 0; k < t->msg->nrcpt; k++)
			assert_int_equal(o->rcpt[k], t->rcpt[k]);
		assert_int_equal(o->usable, t->usable);
		if (t->error)
			assert_true(o->why[0] != '\0');
		if (t->error == -EPERM) /* what the operator reads in the log and the queue */
			assert_string_equal(o->why, "TLS is required and STARTTLS is not offered");
		if (t->error == -EMSGSIZE)
			assert_int_equal(o->size_limit, 1000);
		free(srv.data);
	}
}

/* ---- the body ---- */

/* A body of about 1.5 MB: one large chunk and thousands of small ones cut anywhere,
 * with dots at line starts; what the server gets is compared with a reference stuffing
 * of the whole. */
struct big_body {
	char *whole;
	size_t len;
	struct str *chunks;
	size_t n;
	char *expect;
	size_t expect_len;
};

static void big_body_make(struct big_body *b)
{
	size_t cap = 1600000;
	b->whole = malloc(cap);
	assert_non_null(b->whole);
	b->len = 0;
	unsigned seed = 12345;
	while (b->len < 1500000) {
		seed = seed * 1103515245u + 12345u;
		size_t ll = (seed >> 16) % 120;
		char *p = b->whole + b->len;
		for (size_t i = 0; i < ll; i++)
			p[i] = (char)('a' + (i + b->len) % 26);
		if (ll && (seed & 3) == 0)
			p[0] = '.';
		p[ll] = '\r';
		p[ll + 1] = '\n';
		b->len += ll + 2;
	}
	b->chunks = calloc(20000, sizeof(*b->chunks));
	assert_non_null(b->chunks);
	/* the first 1 MB in one chunk, the rest in pieces of 0..199 bytes */
	b->chunks[0] = str_make(b->whole, 1000000);
	b->n = 1;
	size_t off = 1000000;
	while (off < b->len) {
		seed = seed * 1103515245u + 12345u;
		size_t k = (seed >> 16) % 200;
		if (k > b->len - off)
			k = b->len - off;
		assert_true(b->n < 20000);
		b->chunks[b->n++] = str_make(b->whole + off, k);
		off += k;
	}
	b->expect = malloc(b->len * 2 + 8);
	assert_non_null(b->expect);
	size_t e = 0;
	for (size_t i = 0; i < b->len; i++) {
		if (b->whole[i] == '.' && (i == 0 || b->whole[i - 1] == '\n'))
			b->expect[e++] = '.';
		b->expect[e++] = b->whole[i];
	}
	memcpy(b->expect + e, ".\r\n", 3);
	b->expect_len = e + 3;
}

static void big_body_free(struct big_body *b)
{
	free(b->whole);
	free(b->chunks);
	free(b->expect);
}

static const struct step sc_big[] = {
	GREET, EHLO_PLAIN, EXPECT("MAIL FROM:<s@x.test>"), SEND("250 ok\r\n"),
	EXPECT("RCPT TO:<a@x.test>"), SEND("250 ok\r\n"), DATA_OK(NULL), QUIT_OK, { 0 }
};

static void test_big_body(void **state)
{
	(void)state;
	struct big_body b;
	big_body_make(&b);
	const struct smtp_out_msg m = { .sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 1,
					.body = b.chunks, .nbody = b.n, .size = b.len };
	struct smtp_out_conf cf = conf_base();
	struct server srv;
	struct outcome o;
	char desc[512];
	run_one(&srv, sc_big, &cf, &m, AFTER_QUIT, &o, desc, sizeof(desc));
	assert_int_equal(o.stage, SMTP_STAGE_DOT);
	assert_int_equal(o.code, 250);
	assert_int_equal(srv.data_len, b.expect_len);
	assert_memory_equal(srv.data, b.expect, b.expect_len);
	free(srv.data);
	big_body_free(&b);
}

/* ---- several transactions on one connection ---- */

/* The second transaction is sent from the first one's done(). */
static const struct step sc_reuse[] = {
	GREET, EHLO_PIPE, TX1, TX1, QUIT_OK, { 0 }
};

/* Every recipient refused: RSET, and the next transaction waits for its reply. */
static const struct step sc_all_refused[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	EXPECT("RCPT TO:<b@x.test>"),
	SEND("250 ok\r\n550 5.1.1 no a\r\n450 4.2.1 b later\r\n"), EXPECT("RSET"),
	SEND("250 ok\r\n"), TX1, QUIT_OK, { 0 }
};

/* RSET refused while the next transaction waits for it: that one ends at stage RSET. */
static const struct step sc_rset_refused[] = {
	GREET, EHLO_PLAIN, EXPECT("MAIL FROM:<s@x.test>"), SEND("452 4.3.1 full\r\n"),
	EXPECT("RSET"), SEND("502 5.5.1 no RSET here\r\n"), QUIT_OK, { 0 }
};

#define ANY INT_MIN /* an expectation not looked at */

/* What a done() reports; usable is 0, 1 or ANY; send_rc is the return of the send made
 * from that done(). */
struct expect {
	int stage, error, code;
	int rcpt[2];
	int usable;
	int transactions;
	int send_rc;
};

struct t2case {
	const char *name;
	const struct step *script;
	const struct smtp_out_msg *first, *second;
	struct expect want[2];
};

static const struct t2case t2cases[] = {
	{ "two transactions", sc_reuse, &msg_a, &msg_a,
	  { { SMTP_STAGE_DOT, ANY, 250, { ANY, ANY }, 1, 1, 0 },
	    { SMTP_STAGE_DOT, ANY, 250, { ANY, ANY }, ANY, 2, ANY } } },
	/* the second is sent while RSET is under way: it waits for its reply */
	{ "every RCPT refused, then a transaction", sc_all_refused, &msg2, &msg_a,
	  { { SMTP_STAGE_RCPT, 0, 450 /* the last refusal */, { 550, 450 }, 1, ANY, 0 },
	    { SMTP_STAGE_DOT, ANY, 250, { ANY, ANY }, ANY, ANY, ANY } } },
	{ "RSET refused under the next transaction", sc_rset_refused, &msg2, &msg2,
	  { { SMTP_STAGE_MAIL, ANY, 452, { ANY, ANY }, ANY, ANY, ANY },
	    { SMTP_STAGE_RSET, ANY, 502, { ANY, ANY }, 0, ANY, ANY } } },
};

static void expect_int(const char *name, int k, const char *what, int got, int want)
{
	if (want != ANY && got != want)
		fail_msg("%s, transaction %d: %s %d, want %d", name, k + 1, what, got, want);
}

static void test_transactions(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(t2cases) / sizeof(t2cases[0]); i++) {
		const struct t2case *t = &t2cases[i];
		print_message("transactions: %s\n", t->name);
		struct server srv;
		srv_start(&srv, t->script);
		struct run run;
		run_init(&run);
		struct smtp_out_conf cf = conf_base();
		connect_to(&run, &cf, srv.port);
		run.after[0] = AFTER_SEND;
		run.next[0] = t->second;
		run.after[1] = AFTER_QUIT;
		assert_int_equal(send_first(&run, t->first), 0);
		/* one transaction at a time */
		assert_int_equal(smtp_out_send(run.c, &msg_a, on_done, &run), -EBUSY);
		run_wait(&run, 2);
		for (int k = 0; k < 2; k++) {
			const struct outcome *o = &run.out[k];
			const struct expect *w = &t->want[k];
			expect_int(t->name, k, "stage", (int)o->stage, w->stage);
			expect_int(t->name, k, "error", o->error, w->error);
			expect_int(t->name, k, "code", o->code, w->code);
			expect_int(t->name, k, "rcpt[0]", o->rcpt[0], w->rcpt[0]);
			expect_int(t->name, k, "rcpt[1]", o->rcpt[1], w->rcpt[1]);
			expect_int(t->name, k, "usable", o->usable, w->usable);
			expect_int(t->name, k, "transactions", (int)o->transactions,
				   w->transactions);
			expect_int(t->name, k, "send_rc", o->send_rc, w->send_rc);
		}
		run_end(&run, true);
		srv_finish(&srv);
		free(srv.data);
	}
}

/* ---- connection failures, argument checks, peer names ---- */

static uint16_t closed_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	socklen_t len = sizeof(sa);
	getsockname(fd, (struct sockaddr *)&sa, &len);
	close(fd); /* bound, never listening, now closed: nothing there */
	return ntohs(sa.sin_port);
}

static void test_refused(void **state)
{
	(void)state;
	/* sent at once, and sent after the failure happened: both get the set-up failure */
	for (int late = 0; late < 2; late++) {
		struct run run;
		run_init(&run);
		struct smtp_out_conf cf = conf_base();
		connect_to(&run, &cf, closed_port());
		if (late) {
			for (int i = 0; i < 20; i++)
				event_base_loop(run.base, EVLOOP_NONBLOCK);
			assert_false(smtp_out_usable(run.c));
		}
		run.after[0] = AFTER_NOTHING;
		assert_int_equal(send_first(&run, &msg1), 0);
		assert_int_equal(run.n, 0); /* never from inside smtp_out_send */
		assert_int_equal(smtp_out_send(run.c, &msg1, on_done, &run), -EBUSY);
		run_wait(&run, 1);
		assert_int_equal(run.out[0].stage, SMTP_STAGE_CONNECT);
		assert_int_equal(run.out[0].error, -ECONNREFUSED);
		assert_false(run.out[0].usable);
		assert_int_equal(smtp_out_send(run.c, &msg1, on_done, &run), -ENOTCONN);
		run_end(&run, true);
	}
}

static void test_bad_messages(void **state)
{
	(void)state;
	struct run run;
	run_init(&run);
	struct smtp_out_conf cf = conf_base();
	connect_to(&run, &cf, closed_port());
	/* msg1 with one thing wrong: a recipient (rcpt non-NULL), nrcpt (>= 0), the sender */
	static const struct str bad_rcpt[] = { S("a@x.test\r\nRSET") };
	static const struct str nul_rcpt[] = { S("a\0@x") };
	static const struct str angle_rcpt[] = { S("a@x>") };
	static const struct str empty_rcpt[] = { S("") };
	static const struct {
		const char *what;
		const struct str *rcpt;
		long nrcpt;
		struct str sender;
	} bad[] = {
		{ "CR LF in a recipient", bad_rcpt, -1, { NULL, 0 } },
		{ "NUL in a recipient", nul_rcpt, -1, { NULL, 0 } },
		{ "> in a recipient", angle_rcpt, -1, { NULL, 0 } },
		{ "empty recipient", empty_rcpt, -1, { NULL, 0 } },
		{ "no recipient", NULL, 0, { NULL, 0 } },
		{ "too many recipients", NULL, SMTP_OUT_RCPT_MAX + 1, { NULL, 0 } },
		{ "LF in the sender", NULL, -1, S("s@x\n") },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct smtp_out_msg m = msg1;
		if (bad[i].rcpt)
			m.rcpt = bad[i].rcpt;
		if (bad[i].nrcpt >= 0)
			m.nrcpt = (size_t)bad[i].nrcpt;
		if (bad[i].sender.ptr)
			m.sender = bad[i].sender;
		if (smtp_out_send(run.c, &m, on_done, &run) != -EINVAL)
			fail_msg("%s: not refused with -EINVAL", bad[i].what);
	}
	assert_int_equal(run.n, 0);
	run_end(&run, false);
	/* smtp_out_new's own refusals */
	struct event_base *base = event_base_new();
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(25) };
	struct smtp_out_conf nohelo = conf_base();
	nohelo.helo = NULL;
	errno = 0;
	assert_null(smtp_out_new(base, &nohelo, (struct sockaddr *)&sa, sizeof(sa), NULL, 0));
	assert_int_equal(errno, EINVAL);
	assert_null(smtp_out_free(NULL));
	smtp_out_quit(NULL);
	event_base_free(base);
}

static void test_peer_and_names(void **state)
{
	(void)state;
	struct event_base *base = event_base_new();
	struct smtp_out_conf cf = conf_base();
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(closed_port()),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct smtp_out *c = smtp_out_new(base, &cf, (struct sockaddr *)&sa, sizeof(sa), NULL, 0);
	assert_non_null(c);
	char want[64];
	snprintf(want, sizeof(want), "[127.0.0.1]:%u", ntohs(sa.sin_port));
	assert_string_equal(smtp_out_peer(c), want);
	smtp_out_set_peer_name(c, "mx.example.org");
	snprintf(want, sizeof(want), "mx.example.org[127.0.0.1]:%u", ntohs(sa.sin_port));
	assert_string_equal(smtp_out_peer(c), want);
	smtp_out_quit(c); /* still connecting: closes and frees at once */
	struct sockaddr_in6 s6 = { .sin6_family = AF_INET6, .sin6_port = htons(25),
				   .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	c = smtp_out_new(base, &cf, (struct sockaddr *)&s6, sizeof(s6), NULL, 0);
	assert_non_null(c);
	assert_string_equal(smtp_out_peer(c), "[::1]:25");
	assert_null(smtp_out_free(c));
	event_base_dispatch(base); /* nothing left */
	event_base_free(base);

	static const char *const names[SMTP_STAGE_COUNT] = {
		"connect", "greeting", "ehlo", "starttls", "auth", "mail",
		"rcpt", "data", "dot", "rset", "quit",
	};
	for (int i = 0; i < SMTP_STAGE_COUNT; i++)
		assert_string_equal(smtp_out_stage_name((enum smtp_out_stage)i), names[i]);
}

/* ---- quit and free at other moments ---- */

/* Run the loop until the server has done n steps. */
static void run_until_steps(struct run *run, struct server *srv, int n)
{
	while (__atomic_load_n(&srv->steps, __ATOMIC_SEQ_CST) < n && !run->guard_fired) {
		event_base_loop(run->base, EVLOOP_NONBLOCK);
		usleep(1000);
	}
	assert_false(run->guard_fired);
}

static const struct step sc_quit_in_setup[] = {
	GREET, EXPECT("EHLO client.test"), { S_SLEEP, "100", NULL },
	SEND("250-mx.test\r\n250 PIPELINING\r\n"), QUIT_OK, { 0 }
};

static void test_quit_during_setup(void **state)
{
	(void)state;
	struct server srv;
	srv_start(&srv, sc_quit_in_setup);
	struct run run;
	run_init(&run);
	struct smtp_out_conf cf = conf_base();
	connect_to(&run, &cf, srv.port);
	assert_int_equal(send_first(&run, &msg_a), 0); /* dropped by the quit: no done() */
	run_until_steps(&run, &srv, 2);                /* EHLO is in; its reply is not */
	smtp_out_quit(run.c);                          /* QUIT follows the EHLO reply */
	run.c = NULL;
	run_end(&run, true);
	srv_finish(&srv);
	assert_int_equal(run.n, 0);
}

static const struct step sc_free_mid[] = {
	GREET, EHLO_PIPE, EXPECT("MAIL FROM:<s@x.test> SIZE=21"), EXPECT("RCPT TO:<a@x.test>"),
	WAIT_EOF, { 0 }
};

static void test_free_mid_transaction(void **state)
{
	(void)state;
	for (int quit = 0; quit < 2; quit++) {
		struct server srv;
		srv_start(&srv, sc_free_mid);
		struct run run;
		run_init(&run);
		struct smtp_out_conf cf = conf_base();
		connect_to(&run, &cf, srv.port);
		assert_int_equal(send_first(&run, &msg_a), 0);
		run_until_steps(&run, &srv, 5); /* MAIL and RCPT are in */
		/* inside a transaction both close at once, calling nothing */
		run_end(&run, quit);
		srv_finish(&srv);
		assert_int_equal(run.n, 0);
	}
}

/* ---- the ready callback (the relay's view of idle connections) ---- */

struct ready_rec {
	struct run *run;
	int ok_calls, fail_calls;
	struct outcome fail;
	const struct smtp_out_msg *send; /* sent from ready(NULL) */
	int send_rc;
	bool quit_on_fail;
};

static void on_ready(void *arg, struct smtp_out *c, const struct smtp_out_result *failure)
{
	struct ready_rec *rr = arg;
	if (c != rr->run->c)
		abort();
	if (!failure) {
		rr->ok_calls++;
		if (rr->send) {
			rr->run->nrcpt = rr->send->nrcpt;
			rr->send_rc = smtp_out_send(c, rr->send, on_done, rr->run);
		}
		return;
	}
	rr->fail_calls++;
	rr->fail.stage = failure->stage;
	rr->fail.error = failure->error;
	rr->fail.code = failure->reply.code;
	if (failure->rcpt)
		abort(); /* no transaction: no recipients */
	if (rr->quit_on_fail)
		smtp_out_quit(c);
	else
		smtp_out_free(c);
	rr->run->c = NULL;
}

static const struct step sc_ready_idle_close[] = {
	GREET, EHLO_PIPE, TX1, SEND("421 4.4.2 idle too long\r\n"), WAIT_EOF, { 0 }
};

static void test_ready_then_idle_close(void **state)
{
	(void)state;
	struct server srv;
	srv_start(&srv, sc_ready_idle_close);
	struct run run;
	run_init(&run);
	struct smtp_out_conf cf = conf_base();
	connect_to(&run, &cf, srv.port);
	struct ready_rec rr = { .run = &run, .send = &msg_a };
	smtp_out_set_ready(run.c, on_ready, &rr);
	run_wait(&run, 1); /* ready(NULL), the send from there, its done() */
	assert_int_equal(rr.ok_calls, 1);
	assert_int_equal(rr.send_rc, 0);
	assert_int_equal(run.out[0].stage, SMTP_STAGE_DOT);
	assert_int_equal(run.out[0].code, 250);
	assert_true(run.out[0].usable);
	/* idle now: the server's 421 is the relay's ready(failure) */
	while (rr.fail_calls == 0 && !run.guard_fired)
		event_base_loop(run.base, EVLOOP_ONCE);
	assert_int_equal(rr.ok_calls, 1); /* once, at set-up: not again after a transaction */
	assert_int_equal(rr.fail_calls, 1);
	assert_int_equal(rr.fail.stage, SMTP_STAGE_MAIL);
	assert_int_equal(rr.fail.error, 0);
	assert_int_equal(rr.fail.code, 421);
	run_end(&run, true);
	srv_finish(&srv);
	free(srv.data);
}

static const struct step sc_ready_ehlo_refused[] = {
	GREET, EXPECT("EHLO client.test"), SEND("554 5.7.1 not you\r\n"), QUIT_OK, { 0 }
};

static void test_ready_failures(void **state)
{
	(void)state;
	/* refused at EHLO: ready(failure), then QUIT is still said */
	struct server srv;
	srv_start(&srv, sc_ready_ehlo_refused);
	struct run run;
	run_init(&run);
	struct smtp_out_conf cf = conf_base();
	connect_to(&run, &cf, srv.port);
	struct ready_rec rr = { .run = &run, .quit_on_fail = true };
	smtp_out_set_ready(run.c, on_ready, &rr);
	while (rr.fail_calls == 0 && !run.guard_fired)
		event_base_loop(run.base, EVLOOP_ONCE);
	assert_int_equal(rr.ok_calls, 0);
	assert_int_equal(rr.fail.stage, SMTP_STAGE_EHLO);
	assert_int_equal(rr.fail.code, 554);
	run_end(&run, true);
	srv_finish(&srv);

	/* nothing listening: ready(failure) without any send (whether connect() failed at
	 * once, inside smtp_out_new, or later) */
	run_init(&run);
	connect_to(&run, &cf, closed_port());
	struct ready_rec rr2 = { .run = &run };
	smtp_out_set_ready(run.c, on_ready, &rr2);
	while (rr2.fail_calls == 0 && !run.guard_fired)
		event_base_loop(run.base, EVLOOP_ONCE);
	assert_int_equal(rr2.fail.stage, SMTP_STAGE_CONNECT);
	assert_int_equal(rr2.fail.error, -ECONNREFUSED);
	assert_null(run.c);
	run_end(&run, true);
	assert_int_equal(run.n, 0);

	/* a source address that is not ours: bind() fails inside smtp_out_new(), before the
	 * ready callback is set; it is still told, from the loop */
	for (int via_done = 0; via_done < 2; via_done++) {
		run_init(&run);
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(25),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		struct sockaddr_in src = { .sin_family = AF_INET };
		inet_pton(AF_INET, "192.0.2.1", &src.sin_addr);
		run.c = smtp_out_new(run.base, &cf, (struct sockaddr *)&sa, sizeof(sa),
				     (struct sockaddr *)&src, sizeof(src));
		assert_non_null(run.c);
		struct ready_rec rr3 = { .run = &run };
		if (via_done) {
			assert_int_equal(send_first(&run, &msg_a), 0);
			run_wait(&run, 1);
			assert_int_equal(run.out[0].stage, SMTP_STAGE_CONNECT);
			assert_int_equal(run.out[0].error, -EADDRNOTAVAIL);
		} else {
			smtp_out_set_ready(run.c, on_ready, &rr3);
			assert_int_equal(rr3.fail_calls, 0); /* not from inside set_ready */
			while (rr3.fail_calls == 0 && !run.guard_fired)
				event_base_loop(run.base, EVLOOP_ONCE);
			assert_int_equal(rr3.fail.stage, SMTP_STAGE_CONNECT);
			assert_int_equal(rr3.fail.error, -EADDRNOTAVAIL);
		}
		run_end(&run, false);
	}
}

/* ---- TLS ---- */

static void make_cert(void)
{
	EVP_PKEY *key = EVP_EC_gen("P-256");
	assert_non_null(key);
	X509 *x = X509_new();
	X509_set_version(x, 2);
	ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
	X509_gmtime_adj(X509_getm_notBefore(x), -3600);
	X509_gmtime_adj(X509_getm_notAfter(x), 86400);
	X509_set_pubkey(x, key);
	X509_NAME *name = X509_get_subject_name(x);
	X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"mx.test", -1,
				   -1, 0);
	X509_set_issuer_name(x, name);
	X509V3_CTX v3;
	X509V3_set_ctx_nodb(&v3);
	X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
	X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "DNS:mx.test");
	assert_non_null(ext);
	X509_add_ext(x, ext, -1);
	X509_EXTENSION_free(ext);
	assert_true(X509_sign(x, key, EVP_sha256()) > 0);

	srv_ctx = SSL_CTX_new(TLS_server_method());
	assert_int_equal(SSL_CTX_use_certificate(srv_ctx, x), 1);
	assert_int_equal(SSL_CTX_use_PrivateKey(srv_ctx, key), 1);

	snprintf(ca_path, sizeof(ca_path), "/tmp/test_smtp_out_ca.XXXXXX");
	int fd = mkstemp(ca_path);
	assert_true(fd >= 0);
	FILE *f = fdopen(fd, "w");
	PEM_write_X509(f, x);
	fclose(f);
	X509_free(x);
	EVP_PKEY_free(key);
}

#define STARTTLS_PRE EXPECT("EHLO client.test"), \
	SEND("250-mx.test\r\n250-SIZE 10\r\n250 STARTTLS\r\n"), EXPECT("STARTTLS"), \
	SEND("220 2.0.0 go ahead\r\n")

static const struct step sc_tls_big[] = {
	/* SIZE 10 before TLS, none after: the client must forget what it learnt in clear */
	GREET, STARTTLS_PRE, { S_TLS, NULL, NULL }, EXPECT("EHLO client.test"),
	SEND("250-mx.test\r\n250 PIPELINING\r\n"),
	EXPECT("MAIL FROM:<s@x.test>"), EXPECT("RCPT TO:<a@x.test>"), SEND("250 ok\r\n250 ok\r\n"),
	DATA_OK(NULL), QUIT_OK, { 0 }
};

static void test_starttls_require(void **state)
{
	(void)state;
	struct big_body b;
	big_body_make(&b);
	const struct smtp_out_msg m = { .sender = S("s@x.test"), .rcpt = rcpt3, .nrcpt = 1,
					.body = b.chunks, .nbody = b.n, .size = b.len };
	struct smtp_out_conf cf = conf_base();
	cf.tls = SMTP_TLS_REQUIRE;
	cf.server_name = "mx.test";
	struct server srv;
	struct outcome out;
	const struct outcome *o = &out;
	char desc[512];
	run_one(&srv, sc_tls_big, &cf, &m, AFTER_QUIT, &out, desc, sizeof(desc));
	if (o->stage != SMTP_STAGE_DOT || o->code != 250)
		fail_msg("%s", desc);
	assert_true(o->tls);
	assert_true(strncmp(o->tls_version, "TLSv1.", 6) == 0);
	assert_int_equal(o->size_limit, 0);
	assert_int_equal(srv.data_len, b.expect_len);
	assert_memory_equal(srv.data, b.expect, b.expect_len);
	free(srv.data);
	big_body_free(&b);
}

static const struct step sc_tls_ok[] = {
	GREET, STARTTLS_PRE, { S_TLS, NULL, NULL }, EXPECT("EHLO client.test"),
	SEND("250-mx.test\r\n250 PIPELINING\r\n"),
	EXPECT("MAIL FROM:<s@x.test>"), EXPECT("RCPT TO:<a@x.test>"), SEND("250 ok\r\n250 ok\r\n"),
	DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_tls_fail[] = {
	GREET, STARTTLS_PRE, { S_TLS, NULL, "fail" }, { 0 }
};

static void test_starttls_verify(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		bool use_ca;
		int error;
	} vcases[] = {
		{ "mx.test", true, 0 },
		{ "MX.test", true, 0 },
		{ "other.test", true, -EPERM },  /* wrong name */
		{ "x.mx.test", true, -EPERM },
		{ "mx.test", false, -EPERM },    /* not trusted: OpenSSL's default CAs */
	};
	for (size_t i = 0; i < sizeof(vcases) / sizeof(vcases[0]); i++) {
		print_message("verify: %s %s\n", vcases[i].name, vcases[i].use_ca ? "ca" : "default");
		struct smtp_out_conf cf = conf_base();
		cf.tls = SMTP_TLS_VERIFY;
		cf.server_name = vcases[i].name;
		cf.ca_file = vcases[i].use_ca ? ca_path : NULL;
		struct server srv;
		struct outcome out;
		const struct outcome *o = &out;
		char desc[512];
		run_one(&srv, vcases[i].error ? sc_tls_fail : sc_tls_ok, &cf, &msg1, AFTER_QUIT,
			&out, desc, sizeof(desc));
		if (vcases[i].error) {
			assert_int_equal(o->stage, SMTP_STAGE_STARTTLS);
			assert_int_equal(o->error, vcases[i].error);
			assert_true(o->why[0] != '\0');
			assert_false(o->usable);
		} else {
			if (o->stage != SMTP_STAGE_DOT || o->code != 250)
				fail_msg("%s", desc);
			assert_true(o->tls);
		}
		free(srv.data);
	}
}

/* ---- AUTH ---- */

static const struct step sc_auth_plain_tls[] = {
	GREET, STARTTLS_PRE, { S_TLS, NULL, NULL }, EXPECT("EHLO client.test"),
	SEND("250-mx.test\r\n250-PIPELINING\r\n250 AUTH PLAIN LOGIN\r\n"), { S_SASL, "PLAIN", NULL },
	EXPECT("MAIL FROM:<s@x.test>"), EXPECT("RCPT TO:<a@x.test>"), SEND("250 ok\r\n250 ok\r\n"),
	DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_auth_scram[] = {
	GREET, EXPECT("EHLO client.test"),
	SEND("250-mx.test\r\n250-AUTH=PLAIN\r\n250-AUTH LOGIN SCRAM-SHA-1 scram-sha-256\r\n"
	     "250 PIPELINING\r\n"),
	{ S_SASL, "SCRAM-SHA-256", NULL },
	EXPECT("MAIL FROM:<s@x.test>"), EXPECT("RCPT TO:<a@x.test>"), SEND("250 ok\r\n250 ok\r\n"),
	DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_auth_login[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250 AUTH=LOGIN\r\n"),
	{ S_SASL, "LOGIN", NULL },
	EXPECT("MAIL FROM:<s@x.test>"), SEND("250 ok\r\n"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n"), DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_auth_bad[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250 AUTH PLAIN\r\n"),
	{ S_SASL, "PLAIN", NULL }, QUIT_OK, { 0 }
};

static const struct step sc_auth_plaintext[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250 AUTH PLAIN\r\n"), QUIT_OK, { 0 }
};

static const struct step sc_auth_none_common[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250 AUTH GSSAPI\r\n"), QUIT_OK, { 0 }
};

static const struct step sc_auth_xoauth2[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250 AUTH PLAIN XOAUTH2\r\n"),
	/* base64 of "user=user^Aauth=Bearer tok^A^A" */
	EXPECT("AUTH XOAUTH2 dXNlcj11c2VyAWF1dGg9QmVhcmVyIHRvawEB"), SEND("235 2.7.0 ok\r\n"),
	EXPECT("MAIL FROM:<s@x.test>"), SEND("250 ok\r\n"), EXPECT("RCPT TO:<a@x.test>"),
	SEND("250 ok\r\n"), DATA_OK(HELLO_DATA), QUIT_OK, { 0 }
};

static const struct step sc_auth_xoauth2_bad[] = {
	GREET, EXPECT("EHLO client.test"), SEND("250-mx.test\r\n250 AUTH XOAUTH2\r\n"),
	EXPECT("AUTH XOAUTH2 dXNlcj11c2VyAWF1dGg9QmVhcmVyIHRvawEB"),
	SEND("334 eyJzdGF0dXMiOiI0MDEifQ==\r\n"), EXPECT(""), SEND("535 5.7.8 bad token\r\n"),
	QUIT_OK, { 0 }
};

static void test_auth(void **state)
{
	(void)state;
	static const struct {
		const char *what;
		const struct step *script;
		enum smtp_out_tls tls;
		const char *mechs, *password;
		bool plaintext;
		enum smtp_out_stage stage;
		int error, code;
		const char *mech;
	} acases[] = {
		{ "PLAIN over TLS", sc_auth_plain_tls, SMTP_TLS_REQUIRE, NULL, "secret", false,
		  SMTP_STAGE_DOT, 0, 250, "PLAIN" },
		{ "SCRAM-SHA-256 in clear, allowed", sc_auth_scram, SMTP_TLS_NONE, NULL, "secret", true,
		  SMTP_STAGE_DOT, 0, 250, "SCRAM-SHA-256" },
		{ "LOGIN", sc_auth_login, SMTP_TLS_NONE, "LOGIN", "secret", true, SMTP_STAGE_DOT, 0, 250,
		  "LOGIN" },
		{ "wrong password", sc_auth_bad, SMTP_TLS_NONE, NULL, "wrong", true, SMTP_STAGE_AUTH, 0,
		  535, "" },
		{ "AUTH in clear refused", sc_auth_plaintext, SMTP_TLS_NONE, NULL, "secret", false,
		  SMTP_STAGE_AUTH, -EPERM, 0, "" },
		{ "no mechanism in common", sc_auth_none_common, SMTP_TLS_NONE, NULL, "secret", true,
		  SMTP_STAGE_AUTH, -EPERM, 0, "" },
		{ "XOAUTH2", sc_auth_xoauth2, SMTP_TLS_NONE, "XOAUTH2 PLAIN", "tok", true,
		  SMTP_STAGE_DOT, 0, 250, "XOAUTH2" },
		{ "XOAUTH2 refused", sc_auth_xoauth2_bad, SMTP_TLS_NONE, "xoauth2", "tok", true,
		  SMTP_STAGE_AUTH, 0, 535, "" },
	};
	for (size_t i = 0; i < sizeof(acases) / sizeof(acases[0]); i++) {
		print_message("auth: %s\n", acases[i].what);
		struct smtp_out_conf cf = conf_base();
		cf.tls = acases[i].tls;
		cf.auth_user = "user";
		cf.auth_password = acases[i].password;
		cf.auth_mechanisms = acases[i].mechs;
		cf.auth_plaintext = acases[i].plaintext;
		struct server srv;
		struct outcome out;
		const struct outcome *o = &out;
		char desc[512];
		run_one(&srv, acases[i].script, &cf, &msg_a, AFTER_QUIT, &out, desc, sizeof(desc));
		if (o->stage != acases[i].stage || o->error != acases[i].error ||
		    o->code != acases[i].code)
			fail_msg("%s: %s", acases[i].what, desc);
		assert_string_equal(o->auth_mech, acases[i].mech);
		free(srv.data);
	}
}

static int setup_all(void **state)
{
	(void)state;
	make_cert();
	if (gsasl_init(&srv_sasl) != GSASL_OK)
		return -1;
	gsasl_callback_set(srv_sasl, srv_sasl_cb);
	return 0;
}

static int teardown_all(void **state)
{
	(void)state;
	SSL_CTX_free(srv_ctx);
	gsasl_done(srv_sasl);
	unlink(ca_path);
	smtp_out_tls_cleanup();
	return 0;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	alarm(120); /* a client that never frees itself hangs a loop: end it */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cases),
		cmocka_unit_test(test_big_body),
		cmocka_unit_test(test_transactions),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_bad_messages),
		cmocka_unit_test(test_peer_and_names),
		cmocka_unit_test(test_quit_during_setup),
		cmocka_unit_test(test_free_mid_transaction),
		cmocka_unit_test(test_ready_then_idle_close),
		cmocka_unit_test(test_ready_failures),
		cmocka_unit_test(test_starttls_require),
		cmocka_unit_test(test_starttls_verify),
		cmocka_unit_test(test_auth),
	};
	if (getenv("TEST_FILTER")) /* e.g. TEST_FILTER='test_auth' */
		cmocka_set_test_filter(getenv("TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
