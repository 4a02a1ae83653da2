/*
 * milter_load.c -- a milter load generator: the MTA side of the milter protocol v6.
 *
 * It keeps C connections busy with complete milter sessions, shaped like the ones
 * Postfix's smtpd/cleanup send (MILTER-PROTOCOL.md 5.4), and reports the session rate,
 * the session latency distribution, the verdicts and every protocol error it saw.
 * It can also hold IDLE extra connections open (negotiated, CONNECT sent) to measure
 * what a filter pays for connections that are merely waiting, as most of them are on a
 * real MTA.
 *
 * Invariants:
 *  - One thread, one epoll set, edge-triggered.  Each connection is a state machine in
 *    struct conn; nothing blocks.
 *  - At most one command that expects a reply is outstanding per connection, as with
 *    Postfix, which reads each reply before it sends the next command.  So every reply
 *    is the answer to exactly c->wait, and a reply that arrives while c->wait is
 *    STEP_NONE answered a step that expects no reply: an error.
 *  - The steps and replies follow what the filter negotiated: skipped steps (SMFIP_NO*)
 *    are not sent, no-reply steps (SMFIP_NR_*) are not waited for.
 *  - Bounded memory: the input parser is resumable and keeps only the first RX_HEAD
 *    bytes of a payload; output goes through one OUT_CAP buffer per active connection,
 *    filled by a resumable generator that streams body chunks into it.  Idle connections
 *    release their buffer once parked.
 *  - A framing error (bad length, unknown reply code, malformed payload, bad OPTNEG)
 *    stops the whole run: numbers measured against a peer that speaks another protocol
 *    mean nothing.  Protocol errors (a reply missing, unexpected, or not legal at that
 *    step) are counted; the session is abandoned as Postfix would (close, no resync).
 *
 * Timing: a session starts when its connection is opened (or, with --reuse, when its
 * CONNECT is queued) and ends at the last reply the filter owes it, normally the final
 * reply to the last end-of-message.  Sessions launched during the warm-up are run but
 * not measured.
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
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Commands (MTA to filter). */
#define SMFIC_ABORT   'A'
#define SMFIC_BODY    'B'
#define SMFIC_CONNECT 'C'
#define SMFIC_MACRO   'D'
#define SMFIC_BODYEOB 'E'
#define SMFIC_HELO    'H'
#define SMFIC_QUIT_NC 'K'
#define SMFIC_HEADER  'L'
#define SMFIC_MAIL    'M'
#define SMFIC_EOH     'N'
#define SMFIC_OPTNEG  'O'
#define SMFIC_QUIT    'Q'
#define SMFIC_RCPT    'R'
#define SMFIC_DATA    'T'

/* Protocol flags. */
#define SMFIP_NOCONNECT 0x00000001u
#define SMFIP_NOHELO    0x00000002u
#define SMFIP_NOMAIL    0x00000004u
#define SMFIP_NORCPT    0x00000008u
#define SMFIP_NOBODY    0x00000010u
#define SMFIP_NOHDRS    0x00000020u
#define SMFIP_NOEOH     0x00000040u
#define SMFIP_NR_HDR    0x00000080u
#define SMFIP_NOUNKNOWN 0x00000100u
#define SMFIP_NODATA    0x00000200u
#define SMFIP_NR_CONN   0x00001000u
#define SMFIP_NR_HELO   0x00002000u
#define SMFIP_NR_MAIL   0x00004000u
#define SMFIP_NR_RCPT   0x00008000u
#define SMFIP_NR_DATA   0x00010000u
#define SMFIP_NR_UNKN   0x00020000u
#define SMFIP_NR_EOH    0x00040000u
#define SMFIP_NR_BODY   0x00080000u
#define SMFIF_SETSYMLIST 0x00000100u

/* What we offer: Postfix >= 2.6 with milter_protocol = 6. */
#define MTA_VERSION  6u
#define MTA_ACTIONS  0x000001FFu
#define MTA_PROTOCOL 0x001FFFFFu

#define OUT_CAP     16384u      /* output buffer of an active connection */
#define SMALL_MAX   1024u       /* bound on any command but BODY, with its MACRO */
#define CHUNK_MAX   65535u      /* MILTER_CHUNK_SIZE */
#define RX_LEN_MAX  1048576u    /* largest reply packet (code + data) we accept */
#define RX_HEAD     16u         /* payload bytes kept per reply */
#define IDLE_BATCH  256u        /* idle connections being set up at once */
#define RETRY_BUSY_NS  1000000u /* retry delay when the listen backlog is full */
#define RETRY_ERR_NS  10000000u /* pause of a slot after a failed session */

#define NS_PER_S 1000000000ull

#define CHECK(x) do { if (!(x)) check_failed(#x, __FILE__, __LINE__); } while (0)

enum step {
	STEP_NONE = 0,
	STEP_OPTNEG,
	STEP_CONNECT,
	STEP_HELO,
	STEP_MAIL,
	STEP_RCPT,
	STEP_DATA,
	STEP_HEADER,
	STEP_EOH,
	STEP_BODY,
	STEP_EOB,
	STEP_ABORT,
	STEP_END,       /* QUIT, or QUIT_NC and the next session */
	STEP_DONE,      /* nothing more to send */
};

static const char *const step_names[] = {
	"none", "optneg", "connect", "helo", "mail", "rcpt", "data", "header",
	"eoh", "body", "eob", "abort", "quit", "done",
};

enum conn_state {
	CS_FREE = 0,    /* no socket; the slot needs its next session */
	CS_RETRY,       /* waiting in the retry list */
	CS_CONNECTING,  /* non-blocking connect in progress */
	CS_SESSION,     /* exchanging commands and replies */
	CS_CLOSING,     /* QUIT sent and write side shut; waiting for the filter's EOF */
	CS_HOLD,        /* idle connection parked after CONNECT */
	CS_RETIRED,     /* finished for good */
};

enum verdict {
	V_CONTINUE = 0,
	V_ACCEPT,
	V_REJECT,
	V_TEMPFAIL,
	V_DISCARD,
	V_REPLYCODE,
	V_OTHER,
	V__MAX,
};

static const char *const verdict_names[V__MAX] = {
	"continue", "accept", "reject", "tempfail", "discard", "replycode", "other",
};

enum err {
	ERR_UNEXPECTED = 0, /* a reply where no reply was expected */
	ERR_MISSING,        /* no reply (or no close after QUIT) within the timeout */
	ERR_BADSTEP,        /* a reply that is not legal at this step */
	ERR_CLOSED,         /* the filter closed the connection in mid-session */
	ERR_CONNECT,        /* connect failed or timed out */
	ERR_IO,             /* read or write error */
	ERR__MAX,
};

static const char *const err_names[ERR__MAX] = {
	"unexpected", "missing", "badstep", "closed", "connect", "io",
};

enum phase {
	PH_IDLE_SETUP = 0,
	PH_WARMUP,
	PH_MEASURE,
	PH_DRAIN,
	PH_DONE,
};

struct opts {
	const char *target;
	const char *label;
	unsigned concurrency;
	uint64_t sessions;      /* 0: limited by duration */
	double duration;        /* 0: limited by sessions */
	double warmup;
	unsigned rcpts;
	unsigned messages;
	unsigned headers;
	size_t body;
	unsigned idle;
	double timeout;
	long pid;               /* server process to watch in /proc, 0: none */
	bool reuse;
	bool fast_close;
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
	bool idle;              /* an idle holder, not a load slot */
	enum conn_state state;

	/* negotiated on this connection */
	uint32_t version;
	uint32_t proto;

	/* session */
	uint64_t seq;           /* session number, varies the client address */
	uint64_t t_start;
	uint64_t t_last_reply;
	uint64_t since;         /* last progress, for the timeout */
	bool measured;
	uint32_t tally[V__MAX]; /* verdicts of this session, committed when it completes */
	uint32_t tally_mods;
	bool quit_sent;
	bool close_now;         /* CONNECT/HELO ended the session: close without QUIT */
	bool new_session;       /* the retry starts a new session, not a new connect */
	uint64_t retry_at;
	struct conn *retry_next;

	/* generator */
	enum step next;
	enum step wait;
	unsigned msg;
	unsigned rcpt;
	unsigned rcpt_ok;
	unsigned hdr;
	uint8_t refusal;        /* last RCPT refusal, the verdict if all are refused */
	bool msg_decided;
	bool eob_replied;       /* the message got its final end-of-message reply */
	size_t body_left;       /* message body bytes not yet framed into a chunk */
	size_t chunk_left;      /* payload bytes of the current BODY not yet queued */
	size_t chunk_off;

	/* output */
	uint8_t *out;
	size_t out_off;
	size_t out_len;

	/* input parser */
	uint8_t rx_hdr[5];
	unsigned rx_hdr_have;
	uint8_t rx_code;
	uint32_t rx_len;        /* payload bytes (code excluded) */
	uint32_t rx_have;
	uint8_t rx_head[RX_HEAD];
	uint8_t rx_last;
};

struct bench {
	int ep;
	int family;
	struct sockaddr_storage addr;
	socklen_t addrlen;

	struct conn *conns;     /* o.concurrency load slots, then o.idle holders */
	unsigned nconns;
	struct conn *retry_head;

	enum phase phase;
	uint64_t now;
	uint64_t t_warm_end;
	uint64_t t0;            /* start of the measurement */
	uint64_t t_stop;        /* end of launching with -t */
	uint64_t t_end;         /* last measured session finished */
	uint64_t timeout_ns;
	uint64_t next_tick;

	unsigned active;        /* load slots not retired */
	unsigned idle_next;
	unsigned idle_inflight;
	unsigned idle_held;
	unsigned idle_failed;
	unsigned idle_lost;

	uint64_t seq;
	uint64_t launched;      /* measured sessions started */
	uint64_t completed;     /* measured sessions finished */
	uint64_t failed;        /* measured sessions abandoned on an error */
	uint64_t messages;      /* messages decided in completed measured sessions */
	uint64_t mods;          /* modification replies at EOB in those sessions */
	uint64_t verdicts[V__MAX];
	uint64_t errors[ERR__MAX];
	uint64_t connect_retries;
	bool ever_connected;

	bool neg_known;
	uint32_t neg_version;
	uint32_t neg_actions;
	uint32_t neg_proto;
	uint64_t neg_mismatch;

	struct hist hist;

	/* the server process (--pid), from /proc */
	uint64_t completed_all; /* sessions completed in the load phase, warm-up included */
	double cpu_start;       /* utime+stime at the start of the load phase, seconds */
	double cpu_end;
	long rss_kb_start;      /* before any connection */
	long rss_kb_load;       /* at the start of the load phase, idle connections held */
	long rss_kb_max;        /* peak during the load phase */
	long threads_max;
	bool proc_ok;
};

static struct opts o = {
	.concurrency = 10,
	.warmup = 1.0,
	.rcpts = 3,
	.messages = 1,
	.headers = 8,
	.body = 4096,
	.timeout = 30.0,
};
static struct bench b;
static uint8_t body_pattern[CHUNK_MAX];
static uint8_t rbuf[65536];
static volatile sig_atomic_t interrupted;

static void conn_fail(struct conn *c, enum err e, const char *why);
static void conn_progress(struct conn *c);
static void slot_next(struct conn *c);
static _Noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void pkt_fmt(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static _Noreturn void check_failed(const char *expr, const char *file, int line)
{
	fprintf(stderr, "milter_load: internal error: %s failed at %s:%d\n", expr, file, line);
	abort();
}

static _Noreturn void fatal(const char *fmt, ...)
{
	va_list ap;

	fputs("milter_load: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

/* A framing error: the filter does not speak the protocol we do, so stop the run. */
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
{
	va_list ap;
	char why[256];

	/* A message: truncation is harmless here, as in every snprintf into "why". */
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	fatal("framing error from the filter on connection %u (step %s): %s; stopping",
	    c->id, step_names[c->wait], why);
}

static uint64_t clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* ---- histogram ---------------------------------------------------------------- */

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

/* ---- negotiated behaviour ------------------------------------------------------ */

/* Whether the MTA sends command s on this connection (not skipped by SMFIP_NO*). */
static bool sends(const struct conn *c, enum step s)
{
	switch (s) {
	case STEP_CONNECT: return !(c->proto & SMFIP_NOCONNECT);
	case STEP_HELO:    return !(c->proto & SMFIP_NOHELO);
	case STEP_MAIL:    return !(c->proto & SMFIP_NOMAIL);
	case STEP_RCPT:    return !(c->proto & SMFIP_NORCPT);
	/* Postfix sends no DATA to a filter that answered version 2 or 3. */
	case STEP_DATA:    return !(c->proto & SMFIP_NODATA) && c->version >= 4;
	case STEP_HEADER:  return !(c->proto & SMFIP_NOHDRS);
	case STEP_EOH:     return !(c->proto & SMFIP_NOEOH);
	case STEP_BODY:    return !(c->proto & SMFIP_NOBODY);
	default:           return true;
	}
}

/* Whether command s expects a reply on this connection (no SMFIP_NR_*). */
static bool replies(const struct conn *c, enum step s)
{
	switch (s) {
	case STEP_OPTNEG:  return true;
	case STEP_CONNECT: return !(c->proto & SMFIP_NR_CONN);
	case STEP_HELO:    return !(c->proto & SMFIP_NR_HELO);
	case STEP_MAIL:    return !(c->proto & SMFIP_NR_MAIL);
	case STEP_RCPT:    return !(c->proto & SMFIP_NR_RCPT);
	case STEP_DATA:    return !(c->proto & SMFIP_NR_DATA);
	case STEP_HEADER:  return !(c->proto & SMFIP_NR_HDR);
	case STEP_EOH:     return !(c->proto & SMFIP_NR_EOH);
	case STEP_BODY:    return !(c->proto & SMFIP_NR_BODY);
	case STEP_EOB:     return true;
	default:           return false;
	}
}

/* ---- packet building ------------------------------------------------------------
 * Callers guarantee SMALL_MAX free bytes before building a command other than a
 * BODY payload; the CHECKs catch a generator that breaks that promise. */

static size_t pkt_begin(struct conn *c, uint8_t code)
{
	size_t start = c->out_len;

	CHECK(OUT_CAP - c->out_len >= 5);
	c->out[c->out_len + 4] = code;
	c->out_len += 5;
	return start;
}

static void pkt_bytes(struct conn *c, const void *p, size_t n)
{
	CHECK(OUT_CAP - c->out_len >= n);
	memcpy(c->out + c->out_len, p, n);
	c->out_len += n;
}

static void pkt_u16(struct conn *c, uint16_t v)
{
	uint8_t p[2] = { (uint8_t)(v >> 8), (uint8_t)v };

	pkt_bytes(c, p, 2);
}

static void pkt_u32(struct conn *c, uint32_t v)
{
	uint8_t p[4];

	put_be32(p, v);
	pkt_bytes(c, p, 4);
}

/* Appends a NUL-terminated formatted string. */
static void pkt_fmt(struct conn *c, const char *fmt, ...)
{
	va_list ap;
	size_t room = OUT_CAP - c->out_len;
	int n;

	va_start(ap, fmt);
	n = vsnprintf((char *)c->out + c->out_len, room, fmt, ap);
	va_end(ap);
	CHECK(n >= 0 && (size_t)n < room);
	c->out_len += (size_t)n + 1;
}

static void pkt_end(struct conn *c, size_t start)
{
	size_t len = c->out_len - start - 4;

	CHECK(len >= 1 && len <= UINT32_MAX);
	put_be32(c->out + start, (uint32_t)len);
}

static void pkt_empty(struct conn *c, uint8_t code)
{
	pkt_end(c, pkt_begin(c, code));
}

/* MACRO packet header; the caller appends name/value pairs and calls pkt_end. */
static size_t pkt_macro(struct conn *c, uint8_t stage)
{
	size_t start = pkt_begin(c, SMFIC_MACRO);

	pkt_bytes(c, &stage, 1);
	return start;
}

/* The queue ID Postfix would show in macro i. */
static void pkt_qid(struct conn *c)
{
	pkt_fmt(c, "i");
	pkt_fmt(c, "%010" PRIX64 "%X", c->seq & (uint64_t)0xFFFFFFFFFF, c->msg & 0xFu);
}

static void client_addr(const struct conn *c, char *buf, size_t len)
{
	uint32_t a = (uint32_t)(c->seq % 0xFFFFFEu) + 1u;
	int n = snprintf(buf, len, "10.%u.%u.%u", a >> 16 & 0xFFu, a >> 8 & 0xFFu, a & 0xFFu);

	CHECK(n > 0 && (size_t)n < len);
}

/* ---- the generator ---------------------------------------------------------------
 * gen_one() queues the next command of the session (with its MACRO) and advances
 * c->next; when the command expects a reply it sets c->wait and the caller stops. */

static void msg_verdict(struct conn *c, uint8_t code);
static void session_finish(struct conn *c);
static bool launch_allowed(void);
static void session_reset(struct conn *c);

static void gen_optneg(struct conn *c)
{
	size_t p = pkt_begin(c, SMFIC_OPTNEG);

	pkt_u32(c, MTA_VERSION);
	pkt_u32(c, MTA_ACTIONS);
	pkt_u32(c, MTA_PROTOCOL);
	pkt_end(c, p);
	c->wait = STEP_OPTNEG;
	c->next = STEP_CONNECT;
}

static void gen_connect(struct conn *c)
{
	char addr[32];
	size_t p;

	client_addr(c, addr, sizeof addr);
	/* Postfix's default milter_connect_macros; the MACRO goes even if CONNECT is skipped. */
	p = pkt_macro(c, SMFIC_CONNECT);
	pkt_fmt(c, "j");
	pkt_fmt(c, "mx.bench.test");
	pkt_fmt(c, "{daemon_name}");
	pkt_fmt(c, "mx.bench.test");
	pkt_fmt(c, "{daemon_addr}");
	pkt_fmt(c, "192.0.2.25");
	pkt_fmt(c, "v");
	pkt_fmt(c, "Postfix 3.7.11");
	pkt_fmt(c, "_");
	pkt_fmt(c, "unknown [%s]", addr);
	pkt_end(c, p);
	if (sends(c, STEP_CONNECT)) {
		p = pkt_begin(c, SMFIC_CONNECT);
		pkt_fmt(c, "[%s]", addr);
		pkt_bytes(c, "4", 1);
		pkt_u16(c, (uint16_t)(1024u + c->seq % 60000u));
		pkt_fmt(c, "%s", addr);
		pkt_end(c, p);
		if (replies(c, STEP_CONNECT))
			c->wait = STEP_CONNECT;
	}
	c->next = c->idle ? STEP_DONE : STEP_HELO;
}

static void gen_helo(struct conn *c)
{
	size_t p;

	/* No TLS, so Postfix's milter_helo_macros are all empty: a MACRO with no pairs. */
	pkt_end(c, pkt_macro(c, SMFIC_HELO));
	if (sends(c, STEP_HELO)) {
		p = pkt_begin(c, SMFIC_HELO);
		pkt_fmt(c, "client%" PRIu64 ".bench.test", c->seq);
		pkt_end(c, p);
		if (replies(c, STEP_HELO))
			c->wait = STEP_HELO;
	}
	c->next = STEP_MAIL;
}

static void gen_mail(struct conn *c)
{
	size_t p;

	c->rcpt = 0;
	c->rcpt_ok = 0;
	c->hdr = 0;
	c->refusal = 0;
	c->msg_decided = false;
	c->eob_replied = false;
	c->body_left = 0;
	c->chunk_left = 0;
	/* i is not known before the first recipient is accepted (Postfix). */
	p = pkt_macro(c, SMFIC_MAIL);
	pkt_fmt(c, "{mail_addr}");
	pkt_fmt(c, "sender%" PRIu64 "@bench.test", c->seq);
	pkt_end(c, p);
	if (sends(c, STEP_MAIL)) {
		p = pkt_begin(c, SMFIC_MAIL);
		pkt_fmt(c, "<sender%" PRIu64 "@bench.test>", c->seq);
		pkt_fmt(c, "SIZE=%zu", o.body + 64u * o.headers);
		pkt_fmt(c, "BODY=8BITMIME");
		pkt_end(c, p);
		if (replies(c, STEP_MAIL))
			c->wait = STEP_MAIL;
	}
	c->next = STEP_RCPT;
}

static void gen_rcpt(struct conn *c)
{
	size_t p;

	if (c->rcpt >= o.rcpts) {
		if (c->rcpt_ok == 0) {
			/* Every recipient refused: Postfix ends the transaction before DATA. */
			msg_verdict(c, c->refusal);
			c->next = STEP_ABORT;
		} else {
			c->next = STEP_DATA;
		}
		return;
	}
	p = pkt_macro(c, SMFIC_RCPT);
	if (c->rcpt > 0)
		pkt_qid(c);
	pkt_fmt(c, "{rcpt_addr}");
	pkt_fmt(c, "user%u@dom%u.bench.test", c->rcpt, c->rcpt % 7u);
	pkt_fmt(c, "{rcpt_host}");
	pkt_fmt(c, "dom%u.bench.test", c->rcpt % 7u);
	pkt_fmt(c, "{rcpt_mailer}");
	pkt_fmt(c, "smtp");
	pkt_end(c, p);
	if (sends(c, STEP_RCPT)) {
		p = pkt_begin(c, SMFIC_RCPT);
		pkt_fmt(c, "<user%u@dom%u.bench.test>", c->rcpt, c->rcpt % 7u);
		pkt_end(c, p);
		if (replies(c, STEP_RCPT))
			c->wait = STEP_RCPT;
		else
			c->rcpt_ok++;
	} else {
		c->rcpt_ok++;
	}
	c->rcpt++;
}

static void gen_data(struct conn *c)
{
	size_t p = pkt_macro(c, SMFIC_DATA);

	pkt_qid(c);
	pkt_end(c, p);
	if (sends(c, STEP_DATA)) {
		pkt_empty(c, SMFIC_DATA);
		if (replies(c, STEP_DATA))
			c->wait = STEP_DATA;
	}
	c->next = STEP_HEADER;
}

static void gen_header(struct conn *c)
{
	static const char *const names[] = {
		"Received", "From", "To", "Subject", "Date", "Message-ID", "MIME-Version",
		"Content-Type",
	};
	char addr[32];
	unsigned k = c->hdr;
	size_t p;

	if (!sends(c, STEP_HEADER) || k >= o.headers) {
		c->next = STEP_EOH;
		return;
	}
	p = pkt_macro(c, SMFIC_HEADER);
	pkt_qid(c);
	pkt_end(c, p);
	p = pkt_begin(c, SMFIC_HEADER);
	if (k < sizeof names / sizeof names[0])
		pkt_fmt(c, "%s", names[k]);
	else
		pkt_fmt(c, "X-Bench-%u", k);
	switch (k) {
	case 0:
		client_addr(c, addr, sizeof addr);
		/* A folded value: continuation lines are joined by a bare LF. */
		pkt_fmt(c, "from client%" PRIu64 ".bench.test (unknown [%s])\n"
		    "\tby mx.bench.test (Postfix) with ESMTP; Thu, 1 Jan 2026 00:00:00 +0000",
		    c->seq, addr);
		break;
	case 1: pkt_fmt(c, "Sender <sender%" PRIu64 "@bench.test>", c->seq); break;
	case 2: pkt_fmt(c, "user0@dom0.bench.test"); break;
	case 3: pkt_fmt(c, "bench message %u of session %" PRIu64, c->msg, c->seq); break;
	case 4: pkt_fmt(c, "Thu, 1 Jan 2026 00:00:00 +0000"); break;
	case 5: pkt_fmt(c, "<%" PRIu64 ".%u@bench.test>", c->seq, c->msg); break;
	case 6: pkt_fmt(c, "1.0"); break;
	case 7: pkt_fmt(c, "text/plain; charset=us-ascii"); break;
	default: pkt_fmt(c, "value %u", k); break;
	}
	pkt_end(c, p);
	c->hdr++;
	if (replies(c, STEP_HEADER))
		c->wait = STEP_HEADER;
}

static void gen_eoh(struct conn *c)
{
	size_t p;

	if (sends(c, STEP_EOH)) {
		p = pkt_macro(c, SMFIC_EOH);
		pkt_qid(c);
		pkt_end(c, p);
		pkt_empty(c, SMFIC_EOH);
		if (replies(c, STEP_EOH))
			c->wait = STEP_EOH;
	}
	c->body_left = sends(c, STEP_BODY) ? o.body : 0;
	c->chunk_left = 0;
	c->next = STEP_BODY;
}

/* Frames and streams BODY chunks; a chunk may take several calls if the buffer fills. */
static void gen_body(struct conn *c)
{
	size_t p, n, room;

	if (c->chunk_left == 0) {
		if (c->body_left == 0) {
			c->next = STEP_EOB;
			return;
		}
		p = pkt_macro(c, SMFIC_BODY);
		pkt_qid(c);
		pkt_end(c, p);
		n = c->body_left < CHUNK_MAX ? c->body_left : CHUNK_MAX;
		p = pkt_begin(c, SMFIC_BODY);
		put_be32(c->out + p, (uint32_t)(n + 1));
		c->body_left -= n;
		c->chunk_left = n;
		c->chunk_off = 0;
	}
	room = OUT_CAP - c->out_len;
	n = c->chunk_left < room ? c->chunk_left : room;
	pkt_bytes(c, body_pattern + c->chunk_off, n);
	c->chunk_off += n;
	c->chunk_left -= n;
	if (c->chunk_left == 0 && replies(c, STEP_BODY))
		c->wait = STEP_BODY;
}

static void gen_eob(struct conn *c)
{
	size_t p = pkt_macro(c, SMFIC_BODYEOB);

	pkt_qid(c);
	pkt_end(c, p);
	pkt_empty(c, SMFIC_BODYEOB);
	c->wait = STEP_EOB;
	c->next = STEP_ABORT;
}

static void gen_abort(struct conn *c)
{
	bool last = c->msg + 1 >= o.messages;

	/* Postfix ends every transaction with ABORT, whatever its outcome.  With --reuse
	 * a session that ends with a complete message goes EOB, QUIT_NC as Sendmail's
	 * would: libmilter's state table has no way out of ABORT to QUIT_NC or to the
	 * CONNECT after it (NX_ABRT is empty, and its fallback via HELO reaches neither),
	 * so it drops both silently and the next session would hang. */
	if (!(o.reuse && last && c->eob_replied))
		pkt_empty(c, SMFIC_ABORT);
	c->msg++;
	c->next = c->msg < o.messages ? STEP_MAIL : STEP_END;
}

static void gen_end(struct conn *c)
{
	session_finish(c);
	if (o.reuse && launch_allowed()) {
		pkt_empty(c, SMFIC_QUIT_NC);
		session_reset(c);
		c->next = STEP_CONNECT;
		return;
	}
	pkt_empty(c, SMFIC_QUIT);
	c->quit_sent = true;
	c->next = STEP_DONE;
}

static void gen_one(struct conn *c)
{
	switch (c->next) {
	case STEP_OPTNEG:  gen_optneg(c); break;
	case STEP_CONNECT: gen_connect(c); break;
	case STEP_HELO:    gen_helo(c); break;
	case STEP_MAIL:    gen_mail(c); break;
	case STEP_RCPT:    gen_rcpt(c); break;
	case STEP_DATA:    gen_data(c); break;
	case STEP_HEADER:  gen_header(c); break;
	case STEP_EOH:     gen_eoh(c); break;
	case STEP_BODY:    gen_body(c); break;
	case STEP_EOB:     gen_eob(c); break;
	case STEP_ABORT:   gen_abort(c); break;
	case STEP_END:     gen_end(c); break;
	default:           CHECK(!"generator past the end of the session");
	}
}

/* Queues commands until one expects a reply, the session has nothing more to send,
 * or the buffer is too full for the next command. */
static void gen_fill(struct conn *c)
{
	size_t need;

	while (c->wait == STEP_NONE && c->next != STEP_DONE) {
		need = (c->next == STEP_BODY && c->chunk_left > 0) ? 1 : SMALL_MAX;
		if (OUT_CAP - c->out_len < need && c->out_off > 0) {
			memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
			c->out_len -= c->out_off;
			c->out_off = 0;
		}
		if (OUT_CAP - c->out_len < need)
			return;
		gen_one(c);
	}
	if (c->wait != STEP_NONE)
		c->since = b.now;
}

/* ---- sessions and accounting ----------------------------------------------------- */

static enum verdict verdict_of(uint8_t code)
{
	switch (code) {
	case 'c': return V_CONTINUE;
	case 'a': return V_ACCEPT;
	case 'r': return V_REJECT;
	case 't': return V_TEMPFAIL;
	case 'd': return V_DISCARD;
	case 'y': return V_REPLYCODE;
	default:  return V_OTHER;
	}
}

/* Records the reply that decided the current message (once per message). */
static void msg_verdict(struct conn *c, uint8_t code)
{
	if (c->msg_decided)
		return;
	c->msg_decided = true;
	c->tally[verdict_of(code)]++;
}

static bool launch_allowed(void)
{
	if (interrupted)
		return false;
	if (b.phase == PH_WARMUP)
		return true;
	if (b.phase != PH_MEASURE)
		return false;
	if (o.sessions > 0 && b.launched >= o.sessions)
		return false;
	if (o.duration > 0 && b.now >= b.t_stop)
		return false;
	return true;
}

/* Resets the per-session state and counts the session if it is measured. */
static void session_reset(struct conn *c)
{
	c->seq = ++b.seq;
	c->t_start = b.now;
	c->t_last_reply = b.now;
	c->since = b.now;
	c->measured = b.phase == PH_MEASURE;
	if (c->measured)
		b.launched++;
	memset(c->tally, 0, sizeof c->tally);
	c->tally_mods = 0;
	c->quit_sent = false;
	c->close_now = false;
	c->msg = 0;
	c->msg_decided = false;
	c->wait = STEP_NONE;
}

/* The filter owes this session nothing more: record its latency. */
static void session_finish(struct conn *c)
{
	if (b.phase != PH_IDLE_SETUP)
		b.completed_all++;
	if (!c->measured)
		return;
	c->measured = false;
	b.completed++;
	for (int i = 0; i < V__MAX; i++) {
		b.verdicts[i] += c->tally[i];
		b.messages += c->tally[i];
	}
	b.mods += c->tally_mods;
	hist_add(&b.hist, c->t_last_reply - c->t_start);
	if (c->t_last_reply > b.t_end)
		b.t_end = c->t_last_reply;
}

static void retry_push(struct conn *c, uint64_t delay_ns, bool new_session)
{
	c->state = CS_RETRY;
	c->retry_at = b.now + delay_ns;
	c->new_session = new_session;
	c->retry_next = b.retry_head;
	b.retry_head = c;
}

static void conn_close(struct conn *c)
{
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	c->rx_hdr_have = 0;
	c->rx_have = 0;
	c->rx_len = 0;
	c->out_off = 0;
	c->out_len = 0;
}

static void conn_connected(struct conn *c)
{
	b.ever_connected = true;
	c->state = CS_SESSION;
	c->since = b.now;
	c->next = STEP_OPTNEG;
	c->wait = STEP_NONE;
	conn_progress(c);
}

/* Opens the connection of a new session (or retries it when the backlog was full). */
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
	if (c->out == NULL) {
		c->out = malloc(OUT_CAP);
		if (c->out == NULL)
			fatal("out of memory");
	}
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
		/* A unix socket's listen backlog is full: the filter is not accepting fast
		 * enough.  Try again shortly; the wait is part of the session's latency. */
		b.connect_retries++;
		retry_push(c, RETRY_BUSY_NS, false);
		return;
	}
	if (!b.ever_connected)
		fatal("cannot connect to %s: %s", o.target, strerror(err));
	c->state = CS_SESSION;
	c->wait = STEP_NONE;
	conn_fail(c, ERR_CONNECT, strerror(err));
}

/* Starts the next session of a load slot, or retires the slot. */
static void slot_next(struct conn *c)
{
	if (!launch_allowed()) {
		c->state = CS_RETIRED;
		b.active--;
		free(c->out);
		c->out = NULL;
		return;
	}
	b.now = clock_ns();
	session_reset(c);
	conn_connect(c);
}

/* Abandons the session after a protocol or I/O error: close, as Postfix does. */
static void conn_fail(struct conn *c, enum err e, const char *why)
{
	static uint64_t reported;

	b.errors[e]++;
	if (reported++ < 5)
		fprintf(stderr, "milter_load: connection %u, step %s: %s error: %s\n", c->id,
		    step_names[c->wait != STEP_NONE ? c->wait : c->next], err_names[e], why);
	conn_close(c);
	if (c->idle) {
		if (c->state == CS_HOLD) {
			b.idle_lost++;
			b.idle_held--;
		} else {
			b.idle_failed++;
			b.idle_inflight--;
		}
		c->state = CS_RETIRED;
		free(c->out);
		c->out = NULL;
		return;
	}
	if (c->measured) {
		c->measured = false;
		b.failed++;
		if (b.now > b.t_end)
			b.t_end = b.now;
	}
	retry_push(c, RETRY_ERR_NS, true);
}

/* Called with the whole session sent and nothing awaited. */
static void conn_session_done(struct conn *c)
{
	if (c->idle && c->close_now) {
		/* The filter refused the idle connection's CONNECT. */
		conn_close(c);
		c->state = CS_RETIRED;
		free(c->out);
		c->out = NULL;
		b.idle_inflight--;
		b.idle_failed++;
		return;
	}
	if (c->idle) {
		c->state = CS_HOLD;
		free(c->out);
		c->out = NULL;
		b.idle_inflight--;
		b.idle_held++;
		return;
	}
	if (c->close_now || o.fast_close) {
		conn_close(c);
		c->state = CS_FREE;
		return;
	}
	/* Wait for the filter to close after QUIT, so that a reply it still sends (to a
	 * step that needed none) is seen and counted. */
	if (shutdown(c->fd, SHUT_WR) < 0) {
		conn_close(c);
		c->state = CS_FREE;
		return;
	}
	c->state = CS_CLOSING;
	c->since = b.now;
}

/* Writes queued output.  Returns 0 when all is written, -EAGAIN when the socket is
 * full, -EPIPE when the connection failed (it is then closed). */
static int conn_flush(struct conn *c)
{
	ssize_t n;
	size_t want;

	while (c->out_off < c->out_len) {
		want = c->out_len - c->out_off;
		n = send(c->fd, c->out + c->out_off, want, MSG_NOSIGNAL);
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
		if ((size_t)n < want)
			return -EAGAIN;
	}
	c->out_off = 0;
	c->out_len = 0;
	return 0;
}

/* Sends what the session has to send next; see gen_fill(). */
static void conn_progress(struct conn *c)
{
	while (c->state == CS_SESSION) {
		gen_fill(c);
		if (conn_flush(c) != 0)
			return;
		if (c->wait != STEP_NONE)
			return;
		if (c->next == STEP_DONE) {
			conn_session_done(c);
			return;
		}
	}
}

/* ---- replies ------------------------------------------------------------------- */

static void reply_optneg(struct conn *c)
{
	uint32_t version = get_be32(c->rx_head);
	uint32_t actions = get_be32(c->rx_head + 4);
	uint32_t proto = get_be32(c->rx_head + 8);

	if (version < 2 || version > MTA_VERSION)
		framing(c, "OPTNEG version %" PRIu32 " (we offered %u)", version, MTA_VERSION);
	if (actions & ~MTA_ACTIONS)
		framing(c, "OPTNEG actions 0x%08" PRIx32 " beyond the offer 0x%08x", actions,
		    MTA_ACTIONS);
	if (proto & ~MTA_PROTOCOL)
		framing(c, "OPTNEG protocol 0x%08" PRIx32 " beyond the offer 0x%08x", proto,
		    MTA_PROTOCOL);
	if (c->rx_len > 12 && !(actions & SMFIF_SETSYMLIST))
		framing(c, "OPTNEG carries macro lists without SMFIF_SETSYMLIST");
	c->version = version;
	c->proto = proto;
	if (!b.neg_known) {
		b.neg_known = true;
		b.neg_version = version;
		b.neg_actions = actions;
		b.neg_proto = proto;
	} else if (version != b.neg_version || actions != b.neg_actions ||
	    proto != b.neg_proto) {
		b.neg_mismatch++;
	}
}

static bool is_modification(uint8_t code)
{
	switch (code) {
	case 'h': case 'i': case 'm': case '+': case '2': case '-': case 'e': case 'b':
		return true;
	default:
		return false;
	}
}

/* Replies whose payload ends with a NUL-terminated string. */
static bool ends_in_string(uint8_t code)
{
	switch (code) {
	case 'y': case 'q': case 'h': case 'i': case 'm': case '+': case '2': case '-': case 'e':
		return true;
	default:
		return false;
	}
}

/* Handles one complete reply packet.  The packet is well framed (see rx_check). */
static void conn_reply(struct conn *c)
{
	uint8_t code = c->rx_code;
	enum step s = c->wait;
	char why[64];

	if (s == STEP_NONE) {
		snprintf(why, sizeof why, "reply '%c' while no reply was due", code);
		conn_fail(c, ERR_UNEXPECTED, why);
		return;
	}
	if (code == 'p')                /* PROGRESS: keep waiting, the timer restarts */
		return;
	if (s == STEP_OPTNEG) {
		if (code != SMFIC_OPTNEG) {
			snprintf(why, sizeof why, "reply '%c' to OPTNEG", code);
			conn_fail(c, ERR_BADSTEP, why);
			return;
		}
		reply_optneg(c);
		c->wait = STEP_NONE;
		return;
	}
	if (code == 'q')                /* QUARANTINE is not final */
		return;
	if (code == SMFIC_OPTNEG || (is_modification(code) && s != STEP_EOB) ||
	    (code == 's' && s != STEP_BODY) || code == 'f') {
		snprintf(why, sizeof why, "reply '%c' is not legal at %s", code, step_names[s]);
		conn_fail(c, ERR_BADSTEP, why);
		return;
	}
	if (is_modification(code)) {
		c->tally_mods++;
		return;
	}
	/* A final reply. */
	c->wait = STEP_NONE;
	c->t_last_reply = b.now;
	switch (s) {
	case STEP_CONNECT:
	case STEP_HELO:
		/* Postfix ignores DISCARD here; anything else but CONTINUE ends the filter's
		 * part in the session and Postfix closes the socket without QUIT. */
		if (code == 'c' || code == 'd')
			return;
		msg_verdict(c, code);
		session_finish(c);
		c->close_now = true;
		c->next = STEP_DONE;
		return;
	case STEP_RCPT:
		if (code == 'c') {
			c->rcpt_ok++;
		} else if (code == 'r' || code == 't' || code == 'y' || code == '4') {
			c->refusal = code;      /* this recipient only */
		} else {
			msg_verdict(c, code);   /* accept or discard: done with the message */
			c->next = STEP_ABORT;
		}
		return;
	case STEP_BODY:
		if (code == 's') {
			c->body_left = 0;
			return;
		}
		/* fall through */
	case STEP_MAIL:
	case STEP_DATA:
	case STEP_HEADER:
	case STEP_EOH:
		if (code != 'c') {
			msg_verdict(c, code);
			c->next = STEP_ABORT;
		}
		return;
	case STEP_EOB:
		c->eob_replied = true;
		msg_verdict(c, code);
		return;
	default:
		CHECK(!"reply awaited at an impossible step");
	}
}

/* Checks one reply's framing once its header is known.  Exits on a framing error. */
static void rx_check_header(struct conn *c)
{
	uint32_t len = get_be32(c->rx_hdr);
	uint8_t code = c->rx_hdr[4];
	uint32_t data;

	if (len == 0)
		framing(c, "packet length 0");
	if (len > RX_LEN_MAX)
		framing(c, "packet length %" PRIu32 " above %u", len, RX_LEN_MAX);
	data = len - 1;
	switch (code) {
	case 'c': case 'a': case 'r': case 't': case 'd': case 's': case 'p': case '4':
	case 'f':
		if (data != 0)
			framing(c, "reply '%c' carries %" PRIu32 " data bytes; it must have none",
			    code, data);
		break;
	case 'O':
		if (data < 12)
			framing(c, "OPTNEG reply of %" PRIu32 " data bytes, fewer than 12", data);
		break;
	case 'y': case 'q': case '+': case '-': case '2': case 'e':
		if (data < 1)
			framing(c, "reply '%c' without its string", code);
		break;
	case 'h':
		if (data < 2)
			framing(c, "ADDHEADER too short");
		break;
	case 'i': case 'm':
		if (data < 6)
			framing(c, "reply '%c' too short", code);
		break;
	case 'b':
		break;
	default:
		if (code >= 0x20 && code < 0x7F)
			framing(c, "unknown reply code '%c'", code);
		framing(c, "unknown reply code 0x%02x", code);
	}
	c->rx_code = code;
	c->rx_len = data;
	c->rx_have = 0;
}

/* Checks a complete payload: strings must end in NUL, a REPLYCODE must hold a code. */
static bool rx_check_payload(struct conn *c)
{
	uint8_t code = c->rx_code;
	const uint8_t *h = c->rx_head;

	if (ends_in_string(code) && c->rx_last != 0)
		framing(c, "reply '%c': string not NUL-terminated", code);
	if (code == 'y') {
		if (c->rx_len < 5 || (h[0] != '4' && h[0] != '5') || h[1] < '0' || h[1] > '9' ||
		    h[2] < '0' || h[2] > '9' || (h[3] != ' ' && h[3] != '-')) {
			conn_fail(c, ERR_BADSTEP, "malformed REPLYCODE (needs \"4xx text\" or \"5xx text\")");
			return false;
		}
	}
	return true;
}

/* Feeds received bytes to the resumable packet parser.  Returns 0, or -EPROTO if
 * the connection failed on a protocol error (it is then closed). */
static int conn_feed(struct conn *c, const uint8_t *p, size_t n)
{
	size_t take;

	while (n > 0) {
		if (c->rx_hdr_have < 5) {
			take = 5 - c->rx_hdr_have;
			if (take > n)
				take = n;
			memcpy(c->rx_hdr + c->rx_hdr_have, p, take);
			c->rx_hdr_have += (unsigned)take;
			p += take;
			n -= take;
			if (c->rx_hdr_have < 5)
				return 0;
			rx_check_header(c);
		}
		take = c->rx_len - c->rx_have;
		if (take > n)
			take = n;
		if (c->rx_have < RX_HEAD) {
			size_t keep = RX_HEAD - c->rx_have;

			memcpy(c->rx_head + c->rx_have, p, take < keep ? take : keep);
		}
		if (take > 0)
			c->rx_last = p[take - 1];
		c->rx_have += (uint32_t)take;
		p += take;
		n -= take;
		if (c->rx_have < c->rx_len)
			return 0;
		c->rx_hdr_have = 0;
		if (!rx_check_payload(c))
			return -EPROTO;
		conn_reply(c);
		if (c->fd < 0)
			return -EPROTO;
	}
	return 0;
}

static void conn_eof(struct conn *c)
{
	switch (c->state) {
	case CS_CLOSING:
		conn_close(c);
		c->state = CS_FREE;
		return;
	case CS_HOLD:
		conn_fail(c, ERR_CLOSED, "the filter closed an idle connection");
		return;
	default:
		conn_fail(c, ERR_CLOSED, "the filter closed the connection");
		return;
	}
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
			/* A short read emptied the socket; edge-triggered epoll reports new
			 * data (and a later EOF) with a new event. */
			if ((size_t)n < sizeof rbuf && !hup)
				return;
			continue;
		}
		if (n == 0) {
			conn_eof(c);
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
			c->state = CS_SESSION;
			conn_fail(c, ERR_CONNECT, strerror(err));
			return;
		}
		conn_connected(c);
		if (c->fd < 0)
			return;
	}
	if (c->fd >= 0 && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
		conn_read(c, (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
	if (c->fd >= 0 && c->state == CS_SESSION)
		conn_progress(c);
	if (c->state == CS_FREE)
		slot_next(c);
}

/* ---- the server process, from /proc (--pid) ------------------------------------- */

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
	/* state is field 3; utime and stime are fields 14 and 15. */
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

/* ---- run control --------------------------------------------------------------- */

static void idle_open_more(void)
{
	struct conn *c;

	while (b.idle_next < o.idle && b.idle_inflight < IDLE_BATCH) {
		c = &b.conns[o.concurrency + b.idle_next++];
		b.idle_inflight++;
		b.now = clock_ns();
		session_reset(c);
		conn_connect(c);
	}
}

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
		if (c->new_session) {
			c->state = CS_FREE;
			slot_next(c);
		} else {
			conn_connect(c);
		}
	}
}

/* Every 100 ms: connections that made no progress within the timeout. */
static void timeouts_run(void)
{
	struct conn *c;
	char why[64];

	for (unsigned i = 0; i < b.nconns; i++) {
		c = &b.conns[i];
		if (c->state != CS_CONNECTING && c->state != CS_SESSION && c->state != CS_CLOSING)
			continue;
		if (b.now - c->since < b.timeout_ns)
			continue;
		if (c->state == CS_CONNECTING) {
			c->state = CS_SESSION;
			conn_fail(c, ERR_CONNECT, "connect timed out");
		} else if (c->state == CS_CLOSING) {
			conn_fail(c, ERR_MISSING, "the filter did not close after QUIT");
		} else if (c->wait != STEP_NONE) {
			snprintf(why, sizeof why, "no reply to %s within %.1f s",
			    step_names[c->wait], o.timeout);
			conn_fail(c, ERR_MISSING, why);
		} else {
			conn_fail(c, ERR_IO, "the filter stopped reading");
		}
	}
}

static void phase_run(void)
{
	switch (b.phase) {
	case PH_IDLE_SETUP:
		if (interrupted) {
			b.idle_failed += o.idle - b.idle_next;
			b.idle_next = o.idle;
		}
		idle_open_more();
		if (b.idle_held + b.idle_failed < o.idle)
			return;
		if (o.pid > 0) {
			long threads;

			b.cpu_start = proc_cpu(o.pid);
			if (b.cpu_start >= 0 && proc_status(o.pid, &threads, &b.rss_kb_load) == 0) {
				b.proc_ok = true;
				b.threads_max = threads;
				b.rss_kb_max = b.rss_kb_load;
			}
		}
		b.phase = o.warmup > 0 ? PH_WARMUP : PH_MEASURE;
		b.t_warm_end = b.now + (uint64_t)(o.warmup * NS_PER_S);
		b.t0 = b.now;
		b.t_stop = b.t0 + (uint64_t)(o.duration * NS_PER_S);
		b.active = o.concurrency;
		for (unsigned i = 0; i < o.concurrency; i++)
			slot_next(&b.conns[i]);
		return;
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
			if (b.phase != PH_IDLE_SETUP)
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
	/* Release the idle connections the way an MTA ends a session. */
	for (unsigned i = o.concurrency; i < b.nconns; i++) {
		struct conn *c = &b.conns[i];

		if (c->state == CS_HOLD) {
			static const uint8_t quit[5] = { 0, 0, 0, 1, SMFIC_QUIT };

			(void)send(c->fd, quit, sizeof quit, MSG_NOSIGNAL);
			conn_close(c);
		}
		c->state = CS_RETIRED;
	}
}

/* ---- setup and report ------------------------------------------------------------ */

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
		fatal("%llu connections need %llu descriptors; the hard limit is %llu (ulimit -Hn)",
		    (unsigned long long)(o.concurrency + o.idle), (unsigned long long)need,
		    (unsigned long long)rl.rlim_cur);
}

static void fill_body_pattern(void)
{
	size_t i = 0;
	unsigned line = 0;
	char buf[96];
	int n;

	while (i < sizeof body_pattern) {
		n = snprintf(buf, sizeof buf,
		    "%05u The quick brown fox jumps over the lazy dog; 0123456789 abcdefghij\r\n",
		    line++ % 100000u);
		CHECK(n > 0 && (size_t)n < sizeof buf);
		for (int k = 0; k < n && i < sizeof body_pattern; k++)
			body_pattern[i++] = (uint8_t)buf[k];
	}
}

static void flag_names(uint32_t proto, char *buf, size_t len)
{
	static const struct { uint32_t bit; const char *name; } skip[] = {
		{ SMFIP_NOCONNECT, "connect" }, { SMFIP_NOHELO, "helo" },
		{ SMFIP_NOMAIL, "mail" }, { SMFIP_NORCPT, "rcpt" }, { SMFIP_NODATA, "data" },
		{ SMFIP_NOHDRS, "header" }, { SMFIP_NOEOH, "eoh" }, { SMFIP_NOBODY, "body" },
		{ SMFIP_NOUNKNOWN, "unknown" },
	}, nr[] = {
		{ SMFIP_NR_CONN, "connect" }, { SMFIP_NR_HELO, "helo" },
		{ SMFIP_NR_MAIL, "mail" }, { SMFIP_NR_RCPT, "rcpt" }, { SMFIP_NR_DATA, "data" },
		{ SMFIP_NR_HDR, "header" }, { SMFIP_NR_EOH, "eoh" }, { SMFIP_NR_BODY, "body" },
		{ SMFIP_NR_UNKN, "unknown" },
	};
	size_t used = 0;
	bool any;
	int n;

	buf[0] = '\0';
	for (int pass = 0; pass < 2; pass++) {
		const char *title = pass == 0 ? "skipped:" : "; no reply:";

		n = snprintf(buf + used, len - used, "%s", title);
		if (n < 0 || (size_t)n >= len - used)
			return;
		used += (size_t)n;
		any = false;
		for (size_t i = 0; i < 9; i++) {
			uint32_t bit = pass == 0 ? skip[i].bit : nr[i].bit;

			if (!(proto & bit))
				continue;
			n = snprintf(buf + used, len - used, " %s", pass == 0 ? skip[i].name : nr[i].name);
			if (n < 0 || (size_t)n >= len - used)
				return;
			used += (size_t)n;
			any = true;
		}
		if (!any) {
			n = snprintf(buf + used, len - used, " none");
			if (n < 0 || (size_t)n >= len - used)
				return;
			used += (size_t)n;
		}
	}
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
	double mrate = elapsed > 0 ? (double)b.messages / elapsed : 0;
	double p50 = hist_quantile(&b.hist, 0.50) / 1e6, p90 = hist_quantile(&b.hist, 0.90) / 1e6;
	double p99 = hist_quantile(&b.hist, 0.99) / 1e6, max = (double)b.hist.max / 1e6;
	double mean = b.hist.count ? b.hist.sum / (double)b.hist.count / 1e6 : 0;
	double cpu = b.proc_ok ? b.cpu_end - b.cpu_start : 0;
	double cpu_per = b.completed_all ? cpu * 1e6 / (double)b.completed_all : 0;
	char flags[256];

	flag_names(b.neg_proto, flags, sizeof flags);
	if (o.json) {
		printf("{\"label\":");
		json_string(o.label != NULL ? o.label : "");
		printf(",\"target\":");
		json_string(o.target);
		printf(",\"concurrency\":%u,\"idle\":%u,\"idle_held\":%u,\"idle_lost\":%u,"
		    "\"idle_failed\":%u,\"reuse\":%s,\"rcpts\":%u,\"messages_per_session\":%u,"
		    "\"headers\":%u,\"body\":%zu,\"warmup_s\":%.3f,\"elapsed_s\":%.6f,"
		    "\"sessions\":%" PRIu64 ",\"failed\":%" PRIu64 ",\"messages\":%" PRIu64
		    ",\"sessions_per_s\":%.1f,\"messages_per_s\":%.1f,",
		    o.concurrency, o.idle, b.idle_held, b.idle_lost, b.idle_failed,
		    o.reuse ? "true" : "false", o.rcpts, o.messages, o.headers, o.body, o.warmup,
		    elapsed, b.completed, b.failed, b.messages, rate, mrate);
		printf("\"latency_ms\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f,"
		    "\"mean\":%.3f},\"verdicts\":{", p50, p90, p99, max, mean);
		for (int i = 0; i < V__MAX; i++)
			printf("%s\"%s\":%" PRIu64, i ? "," : "", verdict_names[i], b.verdicts[i]);
		printf("},\"errors\":{\"total\":%" PRIu64, errors_total());
		for (int i = 0; i < ERR__MAX; i++)
			printf(",\"%s\":%" PRIu64, err_names[i], b.errors[i]);
		printf("},\"modifications\":%" PRIu64 ",\"connect_retries\":%" PRIu64
		    ",\"negotiated\":{\"version\":%" PRIu32 ",\"actions\":%" PRIu32
		    ",\"protocol\":%" PRIu32 ",\"mismatch\":%" PRIu64 "}", b.mods,
		    b.connect_retries, b.neg_version, b.neg_actions, b.neg_proto, b.neg_mismatch);
		if (b.proc_ok)
			printf(",\"server\":{\"pid\":%ld,\"threads_max\":%ld,\"rss_kb_start\":%ld,"
			    "\"rss_kb_load_start\":%ld,\"rss_kb_max\":%ld,\"cpu_s\":%.3f,"
			    "\"sessions_all\":%" PRIu64 ",\"cpu_us_per_session\":%.1f}", o.pid,
			    b.threads_max, b.rss_kb_start, b.rss_kb_load, b.rss_kb_max, cpu,
			    b.completed_all, cpu_per);
		printf("}\n");
		fflush(stdout);
		return;
	}
	printf("%-12s %s\n", "target", o.target);
	printf("%-12s version %" PRIu32 ", actions 0x%08" PRIx32 ", protocol 0x%08" PRIx32
	    "%s\n", "negotiated", b.neg_version, b.neg_actions, b.neg_proto,
	    b.neg_mismatch ? " (differs between connections!)" : "");
	printf("%-12s %s\n", "", flags);
	printf("%-12s concurrency %u; %u msg/session, %u rcpt, %u headers, %zu body bytes; %s\n",
	    "load", o.concurrency, o.messages, o.rcpts, o.headers, o.body,
	    o.reuse ? "connection reused (QUIT_NC)" : "new connection per session");
	if (o.idle > 0)
		printf("%-12s %u requested, %u held to the end, %u lost, %u failed to set up\n",
		    "idle", o.idle, b.idle_held, b.idle_lost, b.idle_failed);
	printf("%-12s %" PRIu64 " completed, %" PRIu64 " failed, in %.3f s (after %.1f s warm-up)\n",
	    "sessions", b.completed, b.failed, elapsed, o.warmup);
	printf("%-12s %.1f sessions/s, %.1f messages/s\n", "rate", rate, mrate);
	printf("%-12s p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f\n", "latency ms",
	    p50, p90, p99, max, mean);
	printf("%-12s", "verdicts");
	for (int i = 0; i < V__MAX; i++)
		printf(" %s %" PRIu64 "%s", verdict_names[i], b.verdicts[i], i + 1 < V__MAX ? "," : "\n");
	printf("%-12s %" PRIu64, "errors", errors_total());
	if (errors_total() > 0) {
		printf(" (");
		for (int i = 0; i < ERR__MAX; i++)
			printf("%s %s %" PRIu64, i ? "," : "", err_names[i], b.errors[i]);
		printf(" )");
	}
	printf("\n");
	if (b.proc_ok)
		printf("%-12s pid %ld: threads max %ld; RSS %ld kB before, %ld kB at load start, "
		    "%ld kB max; CPU %.3f s for %" PRIu64 " sessions = %.1f us/session\n",
		    "server", o.pid, b.threads_max, b.rss_kb_start, b.rss_kb_load, b.rss_kb_max,
		    cpu, b.completed_all, cpu_per);
	if (b.mods > 0 || b.connect_retries > 0)
		printf("%-12s %" PRIu64 " modification replies; %" PRIu64
		    " connect retries (backlog full)\n", "notes", b.mods, b.connect_retries);
}

static void usage(FILE *f)
{
	fputs("usage: milter_load [options] SOCKET\n"
	    "Drives milter sessions, as Postfix sends them, against a filter and measures it.\n"
	    "  SOCKET          unix:/path, inet:host:port, inet:port@host, inet6:[addr]:port\n"
	    "  -c N            concurrent load connections (default 10)\n"
	    "  -n N            measure N sessions\n"
	    "  -t SECONDS      measure for SECONDS (default 5 unless -n is given)\n"
	    "  -w SECONDS      warm-up before measuring (default 1)\n"
	    "  -r N            recipients per message (default 3)\n"
	    "  -m N            messages per session (default 1)\n"
	    "  -k N            header fields per message (default 8)\n"
	    "  -b BYTES        body bytes per message (default 4096)\n"
	    "  -i N            idle connections held open (OPTNEG + CONNECT) during the run\n"
	    "  -T SECONDS      reply timeout (default 30)\n"
	    "  --reuse         keep the connection for the next session (QUIT_NC)\n"
	    "  --fast-close    write QUIT and close at once, like Postfix, instead of waiting\n"
	    "                  for the filter to close (a late stray reply then goes unseen)\n"
	    "  --json          print one JSON line instead of the table\n"
	    "  --label TEXT    label copied into the JSON line\n"
	    "  --pid PID       also report the filter process's threads and RSS (peak, from\n"
	    "                  /proc/PID/status) and CPU time per session (/proc/PID/stat\n"
	    "                  utime+stime over the load phase, warm-up included, divided\n"
	    "                  by the sessions completed in it)\n"
	    "Exit status: 0 ok, 1 protocol errors were counted, 2 usage or framing error.\n", f);
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
	enum { OPT_REUSE = 256, OPT_JSON, OPT_FAST_CLOSE, OPT_LABEL, OPT_PID };
	static const struct option longs[] = {
		{ "reuse", no_argument, NULL, OPT_REUSE },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "fast-close", no_argument, NULL, OPT_FAST_CLOSE },
		{ "label", required_argument, NULL, OPT_LABEL },
		{ "pid", required_argument, NULL, OPT_PID },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "b:c:hi:k:m:n:p:r:t:T:w:", longs, NULL)) != -1) {
		switch (ch) {
		case 'b': o.body = (size_t)parse_num(optarg, 0, 64u << 20, "body size"); break;
		case 'c': o.concurrency = (unsigned)parse_num(optarg, 1, 1000000, "concurrency"); break;
		case 'i': o.idle = (unsigned)parse_num(optarg, 0, 1000000, "idle count"); break;
		case 'k': o.headers = (unsigned)parse_num(optarg, 0, 10000, "header count"); break;
		case 'm': o.messages = (unsigned)parse_num(optarg, 1, 100000, "messages"); break;
		case 'n': o.sessions = parse_num(optarg, 1, UINT64_MAX / 2, "sessions"); break;
		case 'p': o.target = optarg; break;
		case 'r': o.rcpts = (unsigned)parse_num(optarg, 1, 100000, "recipients"); break;
		case 't': o.duration = parse_secs(optarg, "duration"); break;
		case 'T': o.timeout = parse_secs(optarg, "timeout"); break;
		case 'w': o.warmup = parse_secs(optarg, "warm-up"); break;
		case OPT_REUSE: o.reuse = true; break;
		case OPT_JSON: o.json = true; break;
		case OPT_FAST_CLOSE: o.fast_close = true; break;
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
	if (o.sessions == 0 && o.duration == 0)
		o.duration = 5;
	if (o.timeout <= 0)
		fatal("the timeout must be above 0");
}

int main(int argc, char **argv)
{
	struct sigaction sa;

	parse_args(argc, argv);
	parse_target(o.target);
	raise_nofile((rlim_t)o.concurrency + o.idle + 16);
	fill_body_pattern();

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	b.ep = epoll_create1(EPOLL_CLOEXEC);
	if (b.ep < 0)
		fatal("epoll_create1: %s", strerror(errno));
	b.nconns = o.concurrency + o.idle;
	b.conns = calloc(b.nconns, sizeof *b.conns);
	if (b.conns == NULL)
		fatal("out of memory");
	for (unsigned i = 0; i < b.nconns; i++) {
		b.conns[i].fd = -1;
		b.conns[i].id = i;
		b.conns[i].idle = i >= o.concurrency;
		b.conns[i].state = CS_RETIRED;
	}
	b.timeout_ns = (uint64_t)(o.timeout * NS_PER_S);
	if (o.pid > 0) {
		long threads;

		if (proc_status(o.pid, &threads, &b.rss_kb_start) < 0)
			fatal("--pid %ld: cannot read /proc/%ld/status", o.pid, o.pid);
	}
	b.phase = PH_IDLE_SETUP;
	b.now = clock_ns();

	run();
	report();

	for (unsigned i = 0; i < b.nconns; i++)
		free(b.conns[i].out);
	free(b.conns);
	close(b.ep);
	return errors_total() > 0 || b.neg_mismatch > 0 ? 1 : 0;
}
