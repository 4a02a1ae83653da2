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
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define OUT_CAP    2048u        /* one request; the longest we build is about 1 KiB */
#define LINE_HEAD  64u          /* bytes kept of each reply line */
#define REPLY_MAX  65536u       /* largest reply accepted (Postfix: 4 x 8192 per value) */
#define RETRY_BUSY_NS  1000000u /* retry delay when the listen backlog is full */
#define RETRY_ERR_NS  10000000u /* pause of a slot after a failed request */

#define NS_PER_S 1000000000ull

#define CHECK(x) do { if (!(x)) check_failed(#x, __FILE__, __LINE__); } while (0)

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

enum err {
	ERR_UNEXPECTED = 0, /* reply bytes while no request was outstanding */
	ERR_MISSING,        /* no reply within the timeout */
	ERR_NOACTION,       /* a reply without an action attribute */
	ERR_CLOSED,         /* the server closed the connection */
	ERR_CONNECT,        /* connect failed or timed out */
	ERR_IO,             /* read or write error */
	ERR__MAX,
};

static const char *const err_names[ERR__MAX] = {
	"unexpected", "missing", "noaction", "closed", "connect", "io",
};

enum phase {
	PH_WARMUP = 0,
	PH_MEASURE,
	PH_DRAIN,
	PH_DONE,
};

struct opts {
	const char *target;
	const char *label;
	unsigned concurrency;
	uint64_t requests;      /* 0: limited by duration */
	double duration;        /* 0: limited by requests */
	double warmup;
	unsigned rcpts;         /* recipients (requests) per simulated SMTP session */
	unsigned domains;       /* recipient domains */
	unsigned per_conn;      /* requests per connection, 0: no limit */
	double timeout;
	long pid;               /* server process to watch in /proc, 0: none */
	bool json;
};

/* Latency histogram: exact below 256 ns, then 128 buckets per power of two (<1% error). */
#define HIST_SUB     128u
#define HIST_OCTAVES 40u
#define HIST_BUCKETS (2u * HIST_SUB + HIST_OCTAVES * HIST_SUB)

struct hist {
	uint64_t count;
	uint64_t max;
	double sum;
	uint64_t bucket[HIST_BUCKETS];
};

struct conn {
	int fd;
	unsigned id;
	enum conn_state state;
	uint64_t retry_at;
	struct conn *retry_next;
	unsigned on_conn;       /* requests answered on this connection */

	/* the simulated SMTP session */
	uint64_t sess;          /* session number: client, HELO, sender, instance */
	unsigned rcpt;          /* recipients already asked about in this session */

	/* the request */
	bool waiting;           /* a request is outstanding */
	bool measured;
	uint64_t t_start;
	uint64_t since;         /* last progress, for the timeout */
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

struct bench {
	int ep;
	int family;
	struct sockaddr_storage addr;
	socklen_t addrlen;

	struct conn *conns;
	struct conn *retry_head;

	enum phase phase;
	uint64_t now;
	uint64_t t_warm_end;
	uint64_t t0;            /* start of the measurement */
	uint64_t t_stop;        /* end of launching with -t */
	uint64_t t_end;         /* last measured request answered */
	uint64_t timeout_ns;
	uint64_t next_tick;
	uint64_t rng;

	unsigned active;        /* slots not retired */
	uint64_t sess;
	uint64_t launched;      /* measured requests started */
	uint64_t completed;     /* measured requests answered */
	uint64_t failed;        /* measured requests abandoned on an error */
	uint64_t completed_all; /* requests answered, warm-up included */
	uint64_t actions[A__MAX];
	uint64_t errors[ERR__MAX];
	uint64_t connects;
	uint64_t connect_retries;
	bool ever_connected;

	struct hist hist;

	/* the server process (--pid), from /proc */
	double cpu_start;
	double cpu_end;
	long rss_kb_start;
	long rss_kb_max;
	long threads_max;
	bool proc_ok;
};

static struct opts o = {
	.concurrency = 100,
	.warmup = 1.0,
	.rcpts = 3,
	.domains = 7,
	.timeout = 30.0,
};
static struct bench b;
static char rbuf[65536];
static volatile sig_atomic_t interrupted;

static void conn_fail(struct conn *c, enum err e, const char *why);
static void slot_next(struct conn *c);
static _Noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void out_fmt(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static _Noreturn void check_failed(const char *expr, const char *file, int line)
{
	fprintf(stderr, "policy_load: internal error: %s failed at %s:%d\n", expr, file, line);
	abort();
}

static _Noreturn void fatal(const char *fmt, ...)
{
	va_list ap;

	fputs("policy_load: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

/* A malformed reply: the server does not speak the policy protocol, so stop the run. */
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
{
	va_list ap;
	char why[256];

	/* A message: truncation is harmless here. */
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	fatal("malformed reply from the server on connection %u: %s; stopping", c->id, why);
}

static uint64_t clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* xorshift64*: the run is the same every time (fixed seed). */
static uint32_t rnd(void)
{
	b.rng ^= b.rng >> 12;
	b.rng ^= b.rng << 25;
	b.rng ^= b.rng >> 27;
	return (uint32_t)((b.rng * 2685821657736338717ull) >> 32);
}

/* ---- histogram (as milter_load's) -------------------------------------------------- */

static unsigned hist_index(uint64_t v)
{
	unsigned msb, shift, top, idx;

	if (v < 2 * HIST_SUB)
		return (unsigned)v;
	msb = 63u - (unsigned)__builtin_clzll(v);
	shift = msb - 7u;
	top = (unsigned)(v >> shift);
	idx = 2 * HIST_SUB + (shift - 1) * HIST_SUB + (top - HIST_SUB);
	return idx < HIST_BUCKETS ? idx : HIST_BUCKETS - 1;
}

/* Middle of bucket idx, in the unit of the recorded values. */
static double hist_mid(unsigned idx)
{
	unsigned k, shift, top;

	if (idx < 2 * HIST_SUB)
		return idx;
	k = idx - 2 * HIST_SUB;
	shift = k / HIST_SUB + 1;
	top = k % HIST_SUB + HIST_SUB;
	return (double)((uint64_t)top << shift) + (double)((1ull << shift) - 1) / 2.0;
}

static void hist_add(struct hist *h, uint64_t v)
{
	h->count++;
	h->sum += (double)v;
	if (v > h->max)
		h->max = v;
	h->bucket[hist_index(v)]++;
}

static double hist_quantile(const struct hist *h, double q)
{
	uint64_t want, seen = 0;
	double v;

	if (h->count == 0)
		return 0;
	want = (uint64_t)ceil(q * (double)h->count);
	if (want < 1)
		want = 1;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= want) {
			v = hist_mid(i);
			return v > (double)h->max ? (double)h->max : v;
		}
	}
	return (double)h->max;
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
	CHECK(n >= 0 && (size_t)n < room);
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
	CHECK(n > 0 && (size_t)n < sizeof addr);
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
	out_fmt(c, "instance=%x.%" PRIx64 ".%x.0\n", 4096u + c->id, 0x67000000u + s,
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
		conn_fail(c, ERR_NOACTION, "a reply without action=");
		return;
	}
	b.completed_all++;
	c->on_conn++;
	if (!c->measured)
		return;
	c->measured = false;
	b.completed++;
	b.actions[c->action]++;
	hist_add(&b.hist, b.now - c->t_start);
	if (b.now > b.t_end)
		b.t_end = b.now;
}

/* Feeds received bytes to the resumable reply parser.  Returns 0, or -EPROTO if the
 * connection failed (it is then closed). */
static int conn_feed(struct conn *c, const char *p, size_t n)
{
	const char *nl;
	size_t take, keep;

	while (n > 0) {
		if (!c->waiting) {
			conn_fail(c, ERR_UNEXPECTED, "reply bytes while no request was outstanding");
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
			if (c->fd < 0)
				return -EPROTO;
			continue;
		}
		reply_line(c);
		c->line_len = 0;
	}
	return 0;
}

/* ---- connections ------------------------------------------------------------------- */

static bool launch_allowed(void)
{
	if (interrupted)
		return false;
	if (b.phase == PH_WARMUP)
		return true;
	if (b.phase != PH_MEASURE)
		return false;
	if (o.requests > 0 && b.launched >= o.requests)
		return false;
	if (o.duration > 0 && b.now >= b.t_stop)
		return false;
	return true;
}

/* Parks a slot until delay_ns from now.  retry_run() then reconnects for the request
 * still outstanding (c->waiting), or starts the next request. */
static void retry_push(struct conn *c, uint64_t delay_ns)
{
	c->state = CS_RETRY;
	c->retry_at = b.now + delay_ns;
	c->retry_next = b.retry_head;
	b.retry_head = c;
}

static void conn_close(struct conn *c)
{
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
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
	ssize_t n;

	while (c->out_off < c->out_len) {
		n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return -EAGAIN;
			conn_fail(c, errno == EPIPE || errno == ECONNRESET ? ERR_CLOSED : ERR_IO,
			    strerror(errno));
			return -EPIPE;
		}
		c->out_off += (size_t)n;
		c->since = b.now;
	}
	return 0;
}

static void conn_connected(struct conn *c)
{
	b.ever_connected = true;
	b.connects++;
	c->state = CS_READY;
	c->since = b.now;
	(void)conn_flush(c);
}

/* Opens a connection for the request already built in c->out. */
static void conn_connect(struct conn *c)
{
	struct epoll_event ev;
	int fd, one = 1, err;

	fd = socket(b.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fatal("socket: %s%s", strerror(errno),
		    errno == EMFILE ? " (raise the open files limit: ulimit -n)" : "");
	if (b.family != AF_UNIX)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
	ev.data.ptr = c;
	if (epoll_ctl(b.ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		fatal("epoll_ctl: %s", strerror(errno));
	c->fd = fd;
	if (connect(fd, (struct sockaddr *)&b.addr, b.addrlen) == 0) {
		conn_connected(c);
		return;
	}
	err = errno;
	if (err == EINPROGRESS) {
		c->state = CS_CONNECTING;
		c->since = b.now;
		return;
	}
	conn_close(c);
	if (err == EAGAIN) {
		/* A unix socket's listen backlog is full.  Try again shortly; the wait is
		 * part of the request's latency. */
		b.connect_retries++;
		retry_push(c, RETRY_BUSY_NS);
		return;
	}
	if (!b.ever_connected)
		fatal("cannot connect to %s: %s", o.target, strerror(err));
	conn_fail(c, ERR_CONNECT, strerror(err));
}

/* Starts the next request of a slot (on a new connection if it has none), or retires
 * the slot. */
static void slot_next(struct conn *c)
{
	if (!launch_allowed()) {
		conn_close(c);
		c->state = CS_RETIRED;
		b.active--;
		return;
	}
	if (o.per_conn > 0 && c->on_conn >= o.per_conn)
		conn_close(c);
	b.now = clock_ns();
	request_build(c);
	c->waiting = true;
	c->t_start = b.now;
	c->since = b.now;
	c->measured = b.phase == PH_MEASURE;
	if (c->measured)
		b.launched++;
	if (c->fd < 0) {
		conn_connect(c);
		return;
	}
	c->state = CS_READY;
	(void)conn_flush(c);
}

/* Abandons the request after an error: close, and start over on a new connection
 * after a pause (Postfix waits retry_delay, 1 s, and tries again). */
static void conn_fail(struct conn *c, enum err e, const char *why)
{
	static uint64_t reported;

	b.errors[e]++;
	if (reported++ < 5)
		fprintf(stderr, "policy_load: connection %u: %s error: %s\n", c->id, err_names[e],
		    why);
	conn_close(c);
	c->waiting = false;
	if (c->measured) {
		c->measured = false;
		b.failed++;
		if (b.now > b.t_end)
			b.t_end = b.now;
	}
	c->sess = 0;            /* the next request starts a new simulated session */
	retry_push(c, RETRY_ERR_NS);
}

/* Reads and parses what arrived.  hup: the event reported the peer's close, whose
 * edge is consumed with this event, so read on to EOF even after a short read. */
static void conn_read(struct conn *c, bool hup)
{
	ssize_t n;

	for (;;) {
		n = read(c->fd, rbuf, sizeof rbuf);
		if (n > 0) {
			c->since = b.now;
			if (conn_feed(c, rbuf, (size_t)n) < 0)
				return;
			if ((size_t)n < sizeof rbuf && !hup)
				return;
			continue;
		}
		if (n == 0 && !c->waiting && o.per_conn > 0 && c->on_conn >= o.per_conn) {
			/* We were about to close it ourselves (-l): not an error. */
			conn_close(c);
			c->state = CS_FREE;
			return;
		}
		if (n == 0) {
			conn_fail(c, ERR_CLOSED, c->waiting ?
			    "the server closed the connection before its reply" :
			    "the server closed the connection between requests");
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN)
			return;
		conn_fail(c, errno == ECONNRESET ? ERR_CLOSED : ERR_IO, strerror(errno));
		return;
	}
}

static void conn_event(struct conn *c, uint32_t ev)
{
	int err = 0;
	socklen_t len = sizeof err;

	b.now = clock_ns();
	if (c->state == CS_CONNECTING) {
		if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err != 0) {
			if (!b.ever_connected)
				fatal("cannot connect to %s: %s", o.target, strerror(err));
			conn_fail(c, ERR_CONNECT, strerror(err));
			return;
		}
		conn_connected(c);
		if (c->fd < 0)
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
	if (c->state == CS_FREE || (c->fd >= 0 && c->state == CS_READY && !c->waiting))
		slot_next(c);
}

/* ---- the server process, from /proc (--pid), as milter_load --------------------- */

/* utime+stime of all the process's threads, in seconds; -1 if unreadable. */
static double proc_cpu(long pid)
{
	char path[64], buf[1024];
	unsigned long long ut, st;
	const char *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -1;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* comm may hold spaces and parentheses: the fields start after the last ')'. */
	p = strrchr(buf, ')');
	if (p == NULL)
		return -1;
	if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Threads and VmRSS (kB) of the process.  Returns 0 or a negative errno. */
static int proc_status(long pid, long *ret_threads, long *ret_rss_kb)
{
	char path[64], line[256];
	long threads = -1, rss = -1;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%ld/status", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -errno;
	while (fgets(line, sizeof line, f) != NULL) {
		if (strncmp(line, "Threads:", 8) == 0)
			threads = strtol(line + 8, NULL, 10);
		else if (strncmp(line, "VmRSS:", 6) == 0)
			rss = strtol(line + 6, NULL, 10);
	}
	fclose(f);
	if (threads < 0 || rss < 0)
		return -ENODATA;
	*ret_threads = threads;
	*ret_rss_kb = rss;
	return 0;
}

static void proc_sample(void)
{
	long threads, rss;

	if (o.pid <= 0 || proc_status(o.pid, &threads, &rss) < 0)
		return;
	if (threads > b.threads_max)
		b.threads_max = threads;
	if (rss > b.rss_kb_max)
		b.rss_kb_max = rss;
}

/* ---- run control ----------------------------------------------------------------- */

static void retry_run(void)
{
	struct conn *list = b.retry_head, *c;

	b.retry_head = NULL;
	while (list != NULL) {
		c = list;
		list = c->retry_next;
		if (b.now < c->retry_at) {
			c->retry_next = b.retry_head;
			b.retry_head = c;
			continue;
		}
		if (!c->waiting) {
			c->state = CS_FREE;
			slot_next(c);
		} else {
			conn_connect(c);
		}
	}
}

/* Every 100 ms: requests that made no progress within the timeout. */
static void timeouts_run(void)
{
	struct conn *c;
	char why[64];

	for (unsigned i = 0; i < o.concurrency; i++) {
		c = &b.conns[i];
		if (c->state != CS_CONNECTING && c->state != CS_READY)
			continue;
		if (b.now - c->since < b.timeout_ns)
			continue;
		if (c->state == CS_CONNECTING) {
			conn_fail(c, ERR_CONNECT, "connect timed out");
		} else if (c->out_off < c->out_len) {
			conn_fail(c, ERR_IO, "the server stopped reading");
		} else {
			snprintf(why, sizeof why, "no reply within %.1f s", o.timeout);
			conn_fail(c, ERR_MISSING, why);
		}
	}
}

static void phase_run(void)
{
	switch (b.phase) {
	case PH_WARMUP:
		if (b.now < b.t_warm_end && !interrupted)
			return;
		b.phase = PH_MEASURE;
		b.t0 = b.now;
		b.t_stop = b.t0 + (uint64_t)(o.duration * NS_PER_S);
		return;
	case PH_MEASURE:
		if (launch_allowed())
			return;
		b.phase = PH_DRAIN;
		/* fall through */
	case PH_DRAIN:
		if (b.active > 0)
			return;
		b.phase = PH_DONE;
		return;
	default:
		return;
	}
}

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void run(void)
{
	struct epoll_event evs[256];
	int n, wait_ms;

	b.now = clock_ns();
	if (o.pid > 0) {
		long threads;

		b.cpu_start = proc_cpu(o.pid);
		if (b.cpu_start >= 0 && proc_status(o.pid, &threads, &b.rss_kb_start) == 0) {
			b.proc_ok = true;
			b.threads_max = threads;
			b.rss_kb_max = b.rss_kb_start;
		}
	}
	b.phase = o.warmup > 0 ? PH_WARMUP : PH_MEASURE;
	b.t_warm_end = b.now + (uint64_t)(o.warmup * NS_PER_S);
	b.t0 = b.now;
	b.t_stop = b.t0 + (uint64_t)(o.duration * NS_PER_S);
	b.active = o.concurrency;
	for (unsigned i = 0; i < o.concurrency; i++)
		slot_next(&b.conns[i]);

	b.next_tick = clock_ns();
	while (b.phase != PH_DONE) {
		b.now = clock_ns();
		if (b.retry_head != NULL)
			wait_ms = 1;
		else
			wait_ms = b.now >= b.next_tick ? 0 : (int)((b.next_tick - b.now) / 1000000u) + 1;
		n = epoll_wait(b.ep, evs, (int)(sizeof evs / sizeof evs[0]), wait_ms);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			fatal("epoll_wait: %s", strerror(errno));
		}
		for (int i = 0; i < n; i++)
			conn_event(evs[i].data.ptr, evs[i].events);
		b.now = clock_ns();
		if (b.retry_head != NULL)
			retry_run();
		if (b.now >= b.next_tick) {
			b.next_tick = b.now + 100000000u;
			timeouts_run();
			proc_sample();
		}
		phase_run();
	}
	if (b.proc_ok) {
		proc_sample();
		b.cpu_end = proc_cpu(o.pid);
		if (b.cpu_end < 0)
			b.proc_ok = false;
	}
}

/* ---- setup and report -------------------------------------------------------------- */

static void parse_target(const char *t)
{
	struct addrinfo hints, *res;
	char host[256], port[32];
	const char *rest, *at, *colon;
	int r;

	if (strncmp(t, "unix:", 5) == 0 || strncmp(t, "local:", 6) == 0 || t[0] == '/') {
		struct sockaddr_un *sun = (struct sockaddr_un *)&b.addr;
		const char *path = t[0] == '/' ? t : strchr(t, ':') + 1;

		if (strlen(path) >= sizeof sun->sun_path)
			fatal("socket path too long: %s", path);
		memset(sun, 0, sizeof *sun);
		sun->sun_family = AF_UNIX;
		memcpy(sun->sun_path, path, strlen(path) + 1);
		b.family = AF_UNIX;
		b.addrlen = sizeof *sun;
		return;
	}
	if (strncmp(t, "inet:", 5) == 0)
		rest = t + 5;
	else if (strncmp(t, "inet6:", 6) == 0)
		rest = t + 6;
	else
		fatal("bad socket %s (unix:/path, inet:host:port or inet:port@host)", t);
	at = strchr(rest, '@');
	if (at != NULL) {               /* libmilter's inet:port@host */
		r = snprintf(port, sizeof port, "%.*s", (int)(at - rest), rest);
		if (r < 0 || (size_t)r >= sizeof port)
			fatal("bad socket %s", t);
		r = snprintf(host, sizeof host, "%s", at + 1);
	} else {                        /* inet:host:port, inet6:[addr]:port */
		colon = strrchr(rest, ':');
		if (colon == NULL)
			fatal("bad socket %s (no port)", t);
		if (rest[0] == '[' && colon > rest && colon[-1] == ']')
			r = snprintf(host, sizeof host, "%.*s", (int)(colon - rest - 2), rest + 1);
		else
			r = snprintf(host, sizeof host, "%.*s", (int)(colon - rest), rest);
		if (r >= 0 && (size_t)r < sizeof host)
			r = snprintf(port, sizeof port, "%s", colon + 1);
	}
	if (r < 0 || (size_t)r >= sizeof host)
		fatal("bad socket %s", t);
	memset(&hints, 0, sizeof hints);
	hints.ai_socktype = SOCK_STREAM;
	r = getaddrinfo(host, port, &hints, &res);
	if (r != 0)
		fatal("cannot resolve %s: %s", t, gai_strerror(r));
	memcpy(&b.addr, res->ai_addr, res->ai_addrlen);
	b.addrlen = res->ai_addrlen;
	b.family = res->ai_family;
	freeaddrinfo(res);
}

static void raise_nofile(rlim_t need)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		fatal("getrlimit: %s", strerror(errno));
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			fatal("setrlimit: %s", strerror(errno));
	}
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
		fatal("%u connections need %llu descriptors; the hard limit is %llu (ulimit -Hn)",
		    o.concurrency, (unsigned long long)need, (unsigned long long)rl.rlim_cur);
}

static void json_string(const char *s)
{
	putchar('"');
	for (; *s != '\0'; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static uint64_t errors_total(void)
{
	uint64_t t = 0;

	for (int i = 0; i < ERR__MAX; i++)
		t += b.errors[i];
	return t;
}

static void report(void)
{
	double elapsed = b.t_end > b.t0 ? (double)(b.t_end - b.t0) / NS_PER_S : 0;
	double rate = elapsed > 0 ? (double)b.completed / elapsed : 0;
	double p50 = hist_quantile(&b.hist, 0.50) / 1e6, p90 = hist_quantile(&b.hist, 0.90) / 1e6;
	double p99 = hist_quantile(&b.hist, 0.99) / 1e6, max = (double)b.hist.max / 1e6;
	double mean = b.hist.count ? b.hist.sum / (double)b.hist.count / 1e6 : 0;
	double cpu = b.proc_ok ? b.cpu_end - b.cpu_start : 0;
	double cpu_per = b.completed_all ? cpu * 1e6 / (double)b.completed_all : 0;
	bool first;

	if (o.json) {
		printf("{\"label\":");
		json_string(o.label != NULL ? o.label : "");
		printf(",\"target\":");
		json_string(o.target);
		printf(",\"concurrency\":%u,\"rcpts\":%u,\"domains\":%u,\"requests_per_conn\":%u,"
		    "\"warmup_s\":%.3f,\"elapsed_s\":%.6f,\"requests\":%" PRIu64
		    ",\"failed\":%" PRIu64 ",\"requests_per_s\":%.1f,",
		    o.concurrency, o.rcpts, o.domains, o.per_conn, o.warmup, elapsed, b.completed,
		    b.failed, rate);
		printf("\"latency_ms\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f,"
		    "\"mean\":%.3f},\"actions\":{", p50, p90, p99, max, mean);
		for (int i = 0; i < A__MAX; i++)
			printf("%s\"%s\":%" PRIu64, i ? "," : "", action_names[i], b.actions[i]);
		printf("},\"errors\":{\"total\":%" PRIu64, errors_total());
		for (int i = 0; i < ERR__MAX; i++)
			printf(",\"%s\":%" PRIu64, err_names[i], b.errors[i]);
		printf("},\"connects\":%" PRIu64 ",\"connect_retries\":%" PRIu64, b.connects,
		    b.connect_retries);
		if (b.proc_ok)
			printf(",\"server\":{\"pid\":%ld,\"threads_max\":%ld,\"rss_kb_start\":%ld,"
			    "\"rss_kb_max\":%ld,\"cpu_s\":%.3f,\"requests_all\":%" PRIu64
			    ",\"cpu_us_per_request\":%.1f}", o.pid, b.threads_max, b.rss_kb_start,
			    b.rss_kb_max, cpu, b.completed_all, cpu_per);
		printf("}\n");
		fflush(stdout);
		return;
	}
	printf("%-12s %s\n", "target", o.target);
	printf("%-12s concurrency %u; %u rcpt/session, %u recipient domains; %s\n", "load",
	    o.concurrency, o.rcpts, o.domains,
	    o.per_conn ? "new connection after -l requests" : "connections kept");
	printf("%-12s %" PRIu64 " answered, %" PRIu64 " failed, in %.3f s (after %.1f s warm-up)\n",
	    "requests", b.completed, b.failed, elapsed, o.warmup);
	printf("%-12s %.1f requests/s\n", "rate", rate);
	printf("%-12s p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f\n", "latency ms",
	    p50, p90, p99, max, mean);
	printf("%-12s", "actions");
	first = true;
	for (int i = 0; i < A__MAX; i++) {
		if (b.actions[i] == 0 && i != A_DUNNO)
			continue;
		printf("%s %s %" PRIu64, first ? "" : ",", action_names[i], b.actions[i]);
		first = false;
	}
	printf("\n%-12s %" PRIu64, "errors", errors_total());
	if (errors_total() > 0) {
		printf(" (");
		for (int i = 0; i < ERR__MAX; i++)
			printf("%s %s %" PRIu64, i ? "," : "", err_names[i], b.errors[i]);
		printf(" )");
	}
	printf("\n");
	if (b.proc_ok)
		printf("%-12s pid %ld: threads max %ld; RSS %ld kB at start, %ld kB max; "
		    "CPU %.3f s for %" PRIu64 " requests = %.1f us/request\n", "server", o.pid,
		    b.threads_max, b.rss_kb_start, b.rss_kb_max, cpu, b.completed_all, cpu_per);
	if (b.connect_retries > 0 || b.connects > o.concurrency)
		printf("%-12s %" PRIu64 " connections opened; %" PRIu64
		    " connect retries (backlog full)\n", "notes", b.connects, b.connect_retries);
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

static unsigned long long parse_num(const char *s, unsigned long long min,
    unsigned long long max, const char *what)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v < min || v > max)
		fatal("bad %s: %s (%llu..%llu)", what, s, min, max);
	return v;
}

static double parse_secs(const char *s, const char *what)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !(v >= 0) || v > 86400)
		fatal("bad %s: %s (seconds)", what, s);
	return v;
}

static void parse_args(int argc, char **argv)
{
	enum { OPT_JSON = 256, OPT_LABEL, OPT_PID };
	static const struct option longs[] = {
		{ "json", no_argument, NULL, OPT_JSON },
		{ "label", required_argument, NULL, OPT_LABEL },
		{ "pid", required_argument, NULL, OPT_PID },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "c:d:hl:n:p:r:t:T:w:", longs, NULL)) != -1) {
		switch (ch) {
		case 'c': o.concurrency = (unsigned)parse_num(optarg, 1, 1000000, "concurrency"); break;
		case 'd': o.domains = (unsigned)parse_num(optarg, 1, 100000000, "domains"); break;
		case 'l': o.per_conn = (unsigned)parse_num(optarg, 0, 1000000000, "requests per connection"); break;
		case 'n': o.requests = parse_num(optarg, 1, UINT64_MAX / 2, "requests"); break;
		case 'p': o.target = optarg; break;
		case 'r': o.rcpts = (unsigned)parse_num(optarg, 1, 100000, "recipients"); break;
		case 't': o.duration = parse_secs(optarg, "duration"); break;
		case 'T': o.timeout = parse_secs(optarg, "timeout"); break;
		case 'w': o.warmup = parse_secs(optarg, "warm-up"); break;
		case OPT_JSON: o.json = true; break;
		case OPT_LABEL: o.label = optarg; break;
		case OPT_PID: o.pid = (long)parse_num(optarg, 1, 1u << 30, "pid"); break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind < argc && o.target == NULL)
		o.target = argv[optind++];
	if (optind != argc || o.target == NULL) {
		usage(stderr);
		exit(2);
	}
	if (o.requests == 0 && o.duration == 0)
		o.duration = 5;
	if (o.timeout <= 0)
		fatal("the timeout must be above 0");
}

int main(int argc, char **argv)
{
	struct sigaction sa;

	parse_args(argc, argv);
	parse_target(o.target);
	raise_nofile((rlim_t)o.concurrency + 16);

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	if (o.pid > 0) {
		long threads, rss;

		if (proc_status(o.pid, &threads, &rss) < 0)
			fatal("--pid %ld: cannot read /proc/%ld/status", o.pid, o.pid);
	}
	b.ep = epoll_create1(EPOLL_CLOEXEC);
	if (b.ep < 0)
		fatal("epoll_create1: %s", strerror(errno));
	b.conns = calloc(o.concurrency, sizeof *b.conns);
	if (b.conns == NULL)
		fatal("out of memory");
	for (unsigned i = 0; i < o.concurrency; i++) {
		b.conns[i].fd = -1;
		b.conns[i].id = i;
		b.conns[i].state = CS_FREE;
	}
	b.timeout_ns = (uint64_t)(o.timeout * NS_PER_S);
	b.rng = 0x9E3779B97F4A7C15ull;

	run();
	report();

	for (unsigned i = 0; i < o.concurrency; i++)
		conn_close(&b.conns[i]);
	free(b.conns);
	close(b.ep);
	return errors_total() > 0 ? 1 : 0;
}
