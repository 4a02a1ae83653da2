/*
 * policy_load.c -- a Postfix SMTPD access policy delegation load generator: the smtpd
 * side of the policy protocol (MILTER-PROTOCOL.md part B).
 *
 * It keeps C connections busy with policy requests shaped like the ones Postfix's
 * smtpd sends from check_policy_service at RCPT time, and reports the request rate,
 * the request latency distribution, the replies by action word and every protocol
 * error it saw.
 *
 * Invariants:
 *  - One thread, one epoll set, edge-triggered.  Each connection is a state machine in
 *    struct conn; nothing blocks.
 *  - As with Postfix, each connection has at most one request outstanding and is reused
 *    for the next request (a connection is one smtpd process); -l N closes it after N
 *    requests, like smtpd_policy_service_request_limit.
 *  - The requests on one connection follow simulated SMTP sessions: one client, HELO and
 *    sender per session, then -r recipients, one request each, sharing the `instance`.
 *    Recipient domains are drawn from -d domains.
 *  - Bounded memory: the reply parser is resumable and keeps only the first LINE_HEAD
 *    bytes of each line (enough for the action word); a reply is at most REPLY_MAX bytes.
 *  - A reply that is not made of name=value lines (a line without '=', a NUL byte, a
 *    reply above REPLY_MAX) stops the whole run: a server that speaks another protocol
 *    gives meaningless numbers.  A reply without `action`, a close, a timeout or bytes
 *    with no request outstanding are counted; the connection is closed (Postfix does
 *    the same, and retries on a new connection).
 *
 * Timing: a request starts when it is queued for writing (or when its connection is
 * opened, if it needs a new one) and ends when the empty line that ends its reply is
 * read.  Requests started during the warm-up are run but not measured.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "loadgen.h"

#define OUT_CAP    2048u        /* one request; the longest we build is about 1 KiB */
#define LINE_HEAD  64u          /* bytes kept of each reply line */
#define REPLY_MAX  65536u       /* largest reply accepted (Postfix: 4 x 8192 per value) */
#define RETRY_BUSY_NS  1000000u /* retry delay when the listen backlog is full */
#define RETRY_ERR_NS  10000000u /* pause of a slot after a failed request */

enum conn_state {
	CS_FREE = 0,    /* needs its next request */
	CS_RETRY,       /* waiting in the retry list */
	CS_CONNECTING,  /* non-blocking connect in progress */
	CS_READY,       /* connected: a request is being sent or awaited */
	CS_RETIRED,     /* finished for good */
};

/* The first word of the action, as Postfix's smtpd_check reads it (access(5)). */
enum action {
	A_OK = 0,
	A_DUNNO,
	A_REJECT,
	A_DEFER,
	A_DEFER_IF_REJECT,
	A_DEFER_IF_PERMIT,
	A_4XX,                  /* "4NN text" */
	A_5XX,                  /* "5NN text" */
	A_NUMERIC,              /* all digits: Postfix takes it as OK (pitfall 13) */
	A_HOLD,
	A_DISCARD,
	A_FILTER,
	A_REDIRECT,
	A_BCC,
	A_PREPEND,
	A_WARN,
	A_INFO,
	A_OTHER,                /* a restriction name, or anything else */
	A__MAX,
};

static const char *const action_names[A__MAX] = {
	"OK", "DUNNO", "REJECT", "DEFER", "DEFER_IF_REJECT", "DEFER_IF_PERMIT", "4xx", "5xx",
	"numeric", "HOLD", "DISCARD", "FILTER", "REDIRECT", "BCC", "PREPEND", "WARN", "INFO",
	"other",
};

/* The error kinds of loadgen.h; "noaction" is a reply without an action attribute. */
static const char *const err_names[LOADGEN_ERR__MAX] = {
	"unexpected", "missing", "noaction", "closed", "connect", "io",
};

/* The options of policy_load alone; the common ones are in lg.opt. */
struct opts {
	unsigned rcpts;         /* recipients (requests) per simulated SMTP session */
	unsigned domains;       /* recipient domains */
	unsigned per_conn;      /* requests per connection, 0: no limit */
};

struct conn {
	struct loadgen_conn lc;
	enum conn_state state;
	unsigned on_conn;       /* requests answered on this connection */

	/* the simulated SMTP session */
	uint64_t sess;          /* session number: client, HELO, sender, instance */
	unsigned rcpt;          /* recipients already asked about in this session */

	/* the request */
	bool waiting;           /* a request is outstanding */
	bool measured;
	uint64_t t_start;
	char out[OUT_CAP];
	size_t out_off;
	size_t out_len;

	/* the reply parser */
	size_t reply_len;
	size_t line_len;
	char line[LINE_HEAD];
	bool have_action;
	enum action action;
};

/* What policy_load counts beside the run state in lg. */
struct bench {
	struct conn *conns;
	uint64_t rng;
	uint64_t sess;
	uint64_t actions[A__MAX];
	uint64_t errors[LOADGEN_ERR__MAX];
	uint64_t connects;
};

static struct loadgen lg = {
	.opt = { .concurrency = 100, .warmup = 1.0, .timeout = 30.0 },
};
static struct opts o = {
	.rcpts = 3,
	.domains = 7,
};
static struct bench b;

static void conn_fail(struct conn *c, enum loadgen_err e, const char *why);
static void slot_next(struct conn *c);
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void out_fmt(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static struct conn *conn_of(struct loadgen_conn *lc)
{
	return (struct conn *)((char *)lc - offsetof(struct conn, lc));
}

/* A malformed reply: the server does not speak the policy protocol, so stop the run. */
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
{
	char head[96];
	va_list ap;

	/* A message: truncation is harmless here. */
	snprintf(head, sizeof head, "malformed reply from the server on connection %u",
	    c->lc.id);
	va_start(ap, fmt);
	loadgen_vstop(head, fmt, ap);
}

/* xorshift64*: the run is the same every time (fixed seed). */
static uint32_t rnd(void)
{
	b.rng ^= b.rng >> 12;
	b.rng ^= b.rng << 25;
	b.rng ^= b.rng >> 27;
	return (uint32_t)((b.rng * 2685821657736338717ull) >> 32);
}

/* ---- the request -------------------------------------------------------------------- */

/* Appends formatted text to the output; the request always fits (CHECKed). */
static void out_fmt(struct conn *c, const char *fmt, ...)
{
	va_list ap;
	size_t room = OUT_CAP - c->out_len;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(c->out + c->out_len, room, fmt, ap);
	va_end(ap);
	LOADGEN_CHECK(n >= 0 && (size_t)n < room);
	c->out_len += (size_t)n;
}

/*
 * Queues the next request of the connection's simulated SMTP session: what Postfix
 * 3.7 smtpd sends at RCPT time (smtpd_check.c check_policy_service), in its order.
 * Sessions vary the client (address, name, port), HELO, sender, TLS (every other
 * session) and SASL (every tenth); recipients are drawn from o.domains domains.
 */
static void request_build(struct conn *c)
{
	uint64_t s;
	uint32_t a;
	bool tls, sasl;
	char addr[32];
	int n;

	if (c->rcpt >= o.rcpts || c->sess == 0) {
		c->sess = ++b.sess;
		c->rcpt = 0;
	}
	s = c->sess;
	a = (uint32_t)(s % 0xFFFFFEu) + 1u;
	n = snprintf(addr, sizeof addr, "10.%u.%u.%u", a >> 16 & 0xFFu, a >> 8 & 0xFFu, a & 0xFFu);
	LOADGEN_CHECK(n > 0 && (size_t)n < sizeof addr);
	tls = s % 2 == 0;
	sasl = s % 10 == 0;

	c->out_off = 0;
	c->out_len = 0;
	out_fmt(c, "request=smtpd_access_policy\nprotocol_state=RCPT\nprotocol_name=ESMTP\n");
	out_fmt(c, "helo_name=client%" PRIu64 ".bench.test\n", s);
	/* The queue ID exists once the first recipient was accepted. */
	if (c->rcpt == 0)
		out_fmt(c, "queue_id=\n");
	else
		out_fmt(c, "queue_id=%010" PRIX64 "\n", s & (uint64_t)0xFFFFFFFFFF);
	out_fmt(c, "sender=sender%" PRIu64 "@bench.test\n", s);
	out_fmt(c, "recipient=user%u@dom%u.bench.test\n", rnd() % 1000u, rnd() % o.domains);
	out_fmt(c, "recipient_count=0\n");
	out_fmt(c, "client_address=%s\n", addr);
	if (s % 5 == 0)
		out_fmt(c, "client_name=unknown\nreverse_client_name=unknown\n");
	else
		out_fmt(c, "client_name=client%" PRIu64 ".bench.test\n"
		    "reverse_client_name=client%" PRIu64 ".bench.test\n", s, s);
	/* smtpd's pid, the session's start time and a counter, in hex. */
	out_fmt(c, "instance=%x.%" PRIx64 ".%x.0\n", 4096u + c->lc.id, 0x67000000u + s,
	    (unsigned)(s * 7919u % 1000000u));
	if (sasl)
		out_fmt(c, "sasl_method=PLAIN\nsasl_username=user%" PRIu64 "\nsasl_sender=\n", s);
	else
		out_fmt(c, "sasl_method=\nsasl_username=\nsasl_sender=\n");
	out_fmt(c, "size=%u\n", 2048u + (unsigned)(s * 131u % 60000u));
	out_fmt(c, "ccert_subject=\nccert_issuer=\nccert_fingerprint=\n"
	    "ccert_pubkey_fingerprint=\n");
	if (tls)
		out_fmt(c, "encryption_protocol=TLSv1.3\n"
		    "encryption_cipher=TLS_AES_256_GCM_SHA384\nencryption_keysize=256\n");
	else
		out_fmt(c, "encryption_protocol=\nencryption_cipher=\nencryption_keysize=0\n");
	out_fmt(c, "etrn_domain=\nstress=\nclient_port=%u\npolicy_context=\n"
	    "server_address=192.0.2.25\nserver_port=25\ncompatibility_level=3.6\n"
	    "mail_version=3.7.11\n\n", 1024u + (unsigned)(s % 60000u));
	c->rcpt++;
}

/* ---- the reply ---------------------------------------------------------------------- */

static bool word_is(const char *w, size_t len, const char *name)
{
	return strlen(name) == len && strncasecmp(w, name, len) == 0;
}

/*
 * Classifies an action value by its first word.  v holds the first have bytes of a
 * value of total bytes.
 */
static enum action action_of(const char *v, size_t have, size_t total)
{
	static const struct { const char *name; enum action a; } words[] = {
		{ "OK", A_OK }, { "RELAY", A_OK }, { "DUNNO", A_DUNNO }, { "REJECT", A_REJECT },
		{ "DEFER", A_DEFER }, { "DEFER_IF_REJECT", A_DEFER_IF_REJECT },
		{ "DEFER_IF_PERMIT", A_DEFER_IF_PERMIT }, { "HOLD", A_HOLD },
		{ "DISCARD", A_DISCARD }, { "FILTER", A_FILTER }, { "REDIRECT", A_REDIRECT },
		{ "BCC", A_BCC }, { "PREPEND", A_PREPEND }, { "WARN", A_WARN }, { "INFO", A_INFO },
	};
	size_t i = 0, len;
	bool digits = true;

	while (i < have && (v[i] == ' ' || v[i] == '\t'))
		i++;
	v += i;
	have -= i;
	total -= i;
	for (len = 0; len < have && v[len] != ' ' && v[len] != '\t'; len++)
		if (v[len] < '0' || v[len] > '9')
			digits = false;
	if (len == 0)
		return A_OTHER;
	if (digits && len == total)
		return A_NUMERIC;
	if (digits && len == 3 && v[0] == '4')
		return A_4XX;
	if (digits && len == 3 && v[0] == '5')
		return A_5XX;
	for (i = 0; i < sizeof words / sizeof words[0]; i++)
		if (word_is(v, len, words[i].name))
			return words[i].a;
	return A_OTHER;
}

/* One complete reply line (without its LF): its first LINE_HEAD bytes are in c->line. */
static void reply_line(struct conn *c)
{
	size_t have = c->line_len < LINE_HEAD ? c->line_len : LINE_HEAD;
	const char *eq = memchr(c->line, '=', have);

	/* Attribute names are short: one without '=' in LINE_HEAD bytes is garbage. */
	if (eq == NULL || eq == c->line)
		framing(c, "a line that is not name=value: \"%.*s\"", (int)have, c->line);
	if (c->have_action || (size_t)(eq - c->line) != 6 || memcmp(c->line, "action", 6) != 0)
		return;                 /* Postfix reads only the first action */
	c->have_action = true;
	c->action = action_of(eq + 1, have - 7, c->line_len - 7);
}

/* The empty line ended the reply: record it, and free the connection for the next. */
static void reply_done(struct conn *c)
{
	bool ok = c->have_action;

	c->waiting = false;
	c->reply_len = 0;
	c->have_action = false;
	if (!ok) {
		conn_fail(c, LOADGEN_ERR_PROTO, "a reply without action=");
		return;
	}
	lg.completed_all++;
	c->on_conn++;
	if (!c->measured)
		return;
	c->measured = false;
	b.actions[c->action]++;
	loadgen_done(&lg, c->t_start, lg.now);
}

/* Feeds received bytes to the resumable reply parser.  Returns 0, or -EPROTO if the
 * connection failed (it is then closed). */
static int conn_feed(struct loadgen_conn *lc, const void *data, size_t n)
{
	struct conn *c = conn_of(lc);
	const char *p = data, *nl;
	size_t take, keep;

	while (n > 0) {
		if (!c->waiting) {
			conn_fail(c, LOADGEN_ERR_UNEXPECTED, "reply bytes while no request was outstanding");
			return -EPROTO;
		}
		nl = memchr(p, '\n', n);
		take = nl != NULL ? (size_t)(nl - p) : n;
		if (memchr(p, '\0', take) != NULL)
			framing(c, "a NUL byte in the reply");
		if (c->line_len < LINE_HEAD) {
			keep = LINE_HEAD - c->line_len;
			memcpy(c->line + c->line_len, p, take < keep ? take : keep);
		}
		c->line_len += take;
		c->reply_len += take + (nl != NULL);
		if (c->reply_len > REPLY_MAX)
			framing(c, "no end of reply within %u bytes", REPLY_MAX);
		if (nl == NULL)
			return 0;
		p += take + 1;
		n -= take + 1;
		if (c->line_len == 0) {
			reply_done(c);
			if (c->lc.fd < 0)
				return -EPROTO;
			continue;
		}
		reply_line(c);
		c->line_len = 0;
	}
	return 0;
}

/* ---- connections ------------------------------------------------------------------- */

/* Parks a slot until delay_ns from now.  retry_run() then reconnects for the request
 * still outstanding (c->waiting), or starts the next request. */
static void retry_push(struct conn *c, uint64_t delay_ns)
{
	c->state = CS_RETRY;
	loadgen_retry_push(&lg, &c->lc, delay_ns);
}

static void conn_close(struct conn *c)
{
	if (c->lc.fd >= 0) {
		close(c->lc.fd);
		c->lc.fd = -1;
	}
	c->on_conn = 0;
	c->reply_len = 0;
	c->line_len = 0;
	c->have_action = false;
}

/* Writes the queued request.  Returns 0 when all is written, -EAGAIN when the socket
 * is full, -EPIPE when the connection failed (it is then closed). */
static int conn_flush(struct conn *c)
{
	return loadgen_write(&lg, &c->lc, c->out, &c->out_off, &c->out_len);
}

static void conn_connected(struct conn *c)
{
	b.connects++;
	c->state = CS_READY;
	c->lc.since = lg.now;
	(void)conn_flush(c);
}

/* Opens a connection for the request already built in c->out. */
static void conn_connect(struct conn *c)
{
	int r = loadgen_connect(&lg, &c->lc);

	if (r == 0) {
		conn_connected(c);
	} else if (r == -EINPROGRESS) {
		c->state = CS_CONNECTING;
	} else if (r == -EAGAIN) {
		/* The request is still to be sent: it waits on the retry list. */
		conn_close(c);
		retry_push(c, RETRY_BUSY_NS);
	}
}

/* Starts the next request of a slot (on a new connection if it has none), or retires
 * the slot. */
static void slot_next(struct conn *c)
{
	if (!loadgen_launch_allowed(&lg)) {
		conn_close(c);
		c->state = CS_RETIRED;
		lg.active--;
		return;
	}
	if (o.per_conn > 0 && c->on_conn >= o.per_conn)
		conn_close(c);
	lg.now = loadgen_clock_ns();
	request_build(c);
	c->waiting = true;
	c->t_start = lg.now;
	c->lc.since = lg.now;
	c->measured = loadgen_begin(&lg);
	if (c->lc.fd < 0) {
		conn_connect(c);
		return;
	}
	c->state = CS_READY;
	(void)conn_flush(c);
}

/* Abandons the request after an error: close, and start over on a new connection
 * after a pause (Postfix waits retry_delay, 1 s, and tries again). */
static void conn_fail(struct conn *c, enum loadgen_err e, const char *why)
{
	static uint64_t reported;

	b.errors[e]++;
	if (reported++ < 5)
		fprintf(stderr, "policy_load: connection %u: %s error: %s\n", c->lc.id, err_names[e],
		    why);
	conn_close(c);
	c->waiting = false;
	if (c->measured) {
		c->measured = false;
		loadgen_failed(&lg);
	}
	c->sess = 0;            /* the next request starts a new simulated session */
	retry_push(c, RETRY_ERR_NS);
}

/* Reads and parses what arrived; see loadgen_read(). */
static void conn_read(struct conn *c, bool hup)
{
	int r = loadgen_read(&lg, &c->lc, hup);

	if (r == LOADGEN_EOF && !c->waiting && o.per_conn > 0 && c->on_conn >= o.per_conn) {
		/* We were about to close it ourselves (-l): not an error. */
		conn_close(c);
		c->state = CS_FREE;
	} else if (r == LOADGEN_EOF) {
		conn_fail(c, LOADGEN_ERR_CLOSED, c->waiting ?
		    "the server closed the connection before its reply" :
		    "the server closed the connection between requests");
	}
}

static void conn_event(struct loadgen_conn *lc, uint32_t ev)
{
	struct conn *c = conn_of(lc);
	int r;

	if (c->state == CS_CONNECTING) {
		r = loadgen_connect_result(&lg, &c->lc, ev);
		if (r < 0)
			return;
		conn_connected(c);
		if (c->lc.fd < 0)
			return;
	}
	if (c->state != CS_READY)
		return;
	if (ev & EPOLLOUT) {
		if (conn_flush(c) == -EPIPE)
			return;
	}
	if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		conn_read(c, (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
	/* Answered and still connected: send the next request at once, as smtpd does
	 * for the next recipient. */
	if (c->state == CS_FREE || (c->lc.fd >= 0 && c->state == CS_READY && !c->waiting))
		slot_next(c);
}

/* ops->fail: connecting, writing or reading failed. */
static void conn_io_fail(struct loadgen_conn *lc, enum loadgen_err e, const char *why)
{
	conn_fail(conn_of(lc), e, why);
}

/* ---- run control ----------------------------------------------------------------- */

static void slot_start(unsigned i)
{
	slot_next(&b.conns[i]);
}

static void conn_retry(struct loadgen_conn *lc)
{
	struct conn *c = conn_of(lc);

	if (!c->waiting) {
		c->state = CS_FREE;
		slot_next(c);
	} else {
		conn_connect(c);
	}
}

/* Every 100 ms: requests that made no progress within the timeout. */
static void timeouts_run(void)
{
	struct conn *c;
	char why[64];

	for (unsigned i = 0; i < lg.opt.concurrency; i++) {
		c = &b.conns[i];
		if (c->state != CS_CONNECTING && c->state != CS_READY)
			continue;
		if (!loadgen_timed_out(&lg, &c->lc))
			continue;
		if (c->state == CS_CONNECTING) {
			conn_fail(c, LOADGEN_ERR_CONNECT, "connect timed out");
		} else if (c->out_off < c->out_len) {
			conn_fail(c, LOADGEN_ERR_IO, "the server stopped reading");
		} else {
			snprintf(why, sizeof why, "no reply within %.1f s", lg.opt.timeout);
			conn_fail(c, LOADGEN_ERR_MISSING, why);
		}
	}
}

/* ---- setup and report -------------------------------------------------------------- */

static void report(void)
{
	struct loadgen_summary s;
	bool first;

	loadgen_summarize(&lg, &s);
	if (lg.opt.json) {
		loadgen_json_begin(&lg);
		printf(",\"concurrency\":%u,\"rcpts\":%u,\"domains\":%u,\"requests_per_conn\":%u,"
		    "\"warmup_s\":%.3f,\"elapsed_s\":%.6f,\"requests\":%" PRIu64
		    ",\"failed\":%" PRIu64 ",\"requests_per_s\":%.1f,",
		    lg.opt.concurrency, o.rcpts, o.domains, o.per_conn, lg.opt.warmup, s.elapsed,
		    lg.completed, lg.failed, s.rate);
		loadgen_json_latency(&s);
		printf(",");
		loadgen_json_counts("actions", action_names, b.actions, A__MAX);
		printf(",");
		loadgen_json_errors(err_names, b.errors);
		printf(",\"connects\":%" PRIu64 ",\"connect_retries\":%" PRIu64, b.connects,
		    lg.connect_retries);
		if (lg.proc.ok)
			printf(",\"server\":{\"pid\":%ld,\"threads_max\":%ld,\"rss_kb_start\":%ld,"
			    "\"rss_kb_max\":%ld,\"cpu_s\":%.3f,\"requests_all\":%" PRIu64
			    ",\"cpu_us_per_request\":%.1f}", lg.opt.pid, lg.proc.threads_max,
			    lg.proc.rss_kb_load, lg.proc.rss_kb_max, s.cpu, lg.completed_all, s.cpu_per);
		loadgen_json_end();
		return;
	}
	printf("%-12s %s\n", "target", lg.opt.target);
	printf("%-12s concurrency %u; %u rcpt/session, %u recipient domains; %s\n", "load",
	    lg.opt.concurrency, o.rcpts, o.domains,
	    o.per_conn ? "new connection after -l requests" : "connections kept");
	printf("%-12s %" PRIu64 " answered, %" PRIu64 " failed, in %.3f s (after %.1f s warm-up)\n",
	    "requests", lg.completed, lg.failed, s.elapsed, lg.opt.warmup);
	printf("%-12s %.1f requests/s\n", "rate", s.rate);
	loadgen_print_latency(&s);
	printf("%-12s", "actions");
	first = true;
	for (int i = 0; i < A__MAX; i++) {
		if (b.actions[i] == 0 && i != A_DUNNO)
			continue;
		printf("%s %s %" PRIu64, first ? "" : ",", action_names[i], b.actions[i]);
		first = false;
	}
	printf("\n");
	loadgen_print_errors(err_names, b.errors);
	if (lg.proc.ok)
		printf("%-12s pid %ld: threads max %ld; RSS %ld kB at start, %ld kB max; "
		    "CPU %.3f s for %" PRIu64 " requests = %.1f us/request\n", "server", lg.opt.pid,
		    lg.proc.threads_max, lg.proc.rss_kb_load, lg.proc.rss_kb_max, s.cpu,
		    lg.completed_all, s.cpu_per);
	if (lg.connect_retries > 0 || b.connects > lg.opt.concurrency)
		printf("%-12s %" PRIu64 " connections opened; %" PRIu64
		    " connect retries (backlog full)\n", "notes", b.connects, lg.connect_retries);
}

static void usage(FILE *f)
{
	fputs("usage: policy_load [options] SOCKET\n"
	    "Sends Postfix SMTPD access policy requests, as smtpd does at RCPT time, to a\n"
	    "policy server and measures it.\n"
	    "  SOCKET          unix:/path, inet:host:port, inet:port@host, inet6:[addr]:port\n"
	    "  -c N            concurrent connections, one request outstanding on each\n"
	    "                  (default 100)\n"
	    "  -n N            measure N requests\n"
	    "  -t SECONDS      measure for SECONDS (default 5 unless -n is given)\n"
	    "  -w SECONDS      warm-up before measuring (default 1)\n"
	    "  -r N            recipients (requests) per simulated SMTP session (default 3)\n"
	    "  -d N            recipient domains to choose from (default 7)\n"
	    "  -l N            requests per connection, then reconnect (default 0: keep it,\n"
	    "                  like smtpd_policy_service_request_limit)\n"
	    "  -T SECONDS      reply timeout (default 30)\n"
	    "  --json          print one JSON line instead of the table\n"
	    "  --label TEXT    label copied into the JSON line\n"
	    "  --pid PID       also report the server process's threads and RSS (peak, from\n"
	    "                  /proc/PID/status) and CPU time per request (/proc/PID/stat\n"
	    "                  utime+stime over the run, warm-up included, divided by the\n"
	    "                  requests answered in it)\n"
	    "Exit status: 0 ok, 1 protocol errors were counted, 2 usage error or a reply\n"
	    "that is not name=value lines.\n", f);
}

/* The options of policy_load's own; loadgen_parse_args() adds the common ones. */
static const struct loadgen_arg args[] = {
	{ 'd', NULL, LOADGEN_ARG_UNSIGNED, &o.domains, 1, 100000000, "domains" },
	{ 'l', NULL, LOADGEN_ARG_UNSIGNED, &o.per_conn, 0, 1000000000, "requests per connection" },
	{ 'r', NULL, LOADGEN_ARG_UNSIGNED, &o.rcpts, 1, 100000, "recipients" },
};

int main(int argc, char **argv)
{
	static const struct loadgen_ops ops = {
		.event = conn_event,
		.retry = conn_retry,
		.tick = timeouts_run,
		.start = slot_start,
		.feed = conn_feed,
		.fail = conn_io_fail,
	};
	int rc;

	loadgen_prog = "policy_load";
	loadgen_parse_args(&lg.opt, argc, argv, args, sizeof args / sizeof args[0], "requests",
	    usage);
	loadgen_init(&lg, &ops, lg.opt.concurrency);
	b.conns = calloc(lg.opt.concurrency, sizeof *b.conns);
	if (b.conns == NULL)
		loadgen_fatal("out of memory");
	for (unsigned i = 0; i < lg.opt.concurrency; i++) {
		b.conns[i].lc.fd = -1;
		b.conns[i].lc.id = i;
		b.conns[i].state = CS_FREE;
	}
	b.rng = 0x9E3779B97F4A7C15ull;

	loadgen_run(&lg);
	report();

	rc = loadgen_total(b.errors, LOADGEN_ERR__MAX) > 0 ? 1 : 0;
	for (unsigned i = 0; i < lg.opt.concurrency; i++)
		conn_close(&b.conns[i]);
	free(b.conns);
	loadgen_fini(&lg);
	return rc;
}
