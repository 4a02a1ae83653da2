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
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loadgen.h"

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
	CS_HOLD,        /* idle connection parked after CONNECT (--idle-mail: after RCPT) */
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

/* The error kinds of loadgen.h; "badstep" is a reply not legal at its step. */
static const char *const err_names[LOADGEN_ERR__MAX] = {
	"unexpected", "missing", "badstep", "closed", "connect", "io",
};

/* The options of milter_load alone; the common ones are in lg.opt. */
struct opts {
	unsigned rcpts;
	unsigned messages;
	unsigned headers;
	size_t body;
	unsigned idle;
	bool idle_mail;         /* idle connections stop after RCPT, mid-transaction */
	bool reuse;
	bool fast_close;
};

struct conn {
	struct loadgen_conn lc;
	bool idle;              /* an idle holder, not a load slot */
	enum conn_state state;

	/* negotiated on this connection */
	uint32_t version;
	uint32_t proto;

	/* session */
	uint64_t seq;           /* session number, varies the client address */
	uint64_t t_start;
	uint64_t t_last_reply;
	bool measured;
	uint32_t tally[V__MAX]; /* verdicts of this session, committed when it completes */
	uint32_t tally_mods;
	bool quit_sent;
	bool close_now;         /* CONNECT/HELO ended the session: close without QUIT */
	bool new_session;       /* the retry starts a new session, not a new connect */

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

/* What milter_load counts beside the run state in lg. */
struct bench {
	struct conn *conns;     /* concurrency load slots, then o.idle holders */
	unsigned nconns;

	unsigned idle_next;
	unsigned idle_inflight;
	unsigned idle_held;
	unsigned idle_failed;
	unsigned idle_lost;

	uint64_t seq;
	uint64_t messages;      /* messages decided in completed measured sessions */
	uint64_t mods;          /* modification replies at EOB in those sessions */
	uint64_t verdicts[V__MAX];
	uint64_t errors[LOADGEN_ERR__MAX];

	bool neg_known;
	uint32_t neg_version;
	uint32_t neg_actions;
	uint32_t neg_proto;
	uint64_t neg_mismatch;
};

static struct loadgen lg = {
	.opt = { .concurrency = 10, .warmup = 1.0, .timeout = 30.0 },
};
static struct opts o = {
	.rcpts = 3,
	.messages = 1,
	.headers = 8,
	.body = 4096,
};
static struct bench b;
static uint8_t body_pattern[CHUNK_MAX];

static void conn_fail(struct conn *c, enum loadgen_err e, const char *why);
static void conn_progress(struct conn *c);
static void slot_next(struct conn *c);
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void pkt_fmt(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static struct conn *conn_of(struct loadgen_conn *lc)
{
	return (struct conn *)((char *)lc - offsetof(struct conn, lc));
}

/* A framing error: the filter does not speak the protocol we do, so stop the run. */
static _Noreturn void framing(const struct conn *c, const char *fmt, ...)
{
	char head[128];
	va_list ap;

	/* A message: truncation is harmless here, as in every snprintf into "why". */
	snprintf(head, sizeof head, "framing error from the filter on connection %u (step %s)",
	    c->lc.id, step_names[c->wait]);
	va_start(ap, fmt);
	loadgen_vstop(head, fmt, ap);
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

	LOADGEN_CHECK(OUT_CAP - c->out_len >= 5);
	c->out[c->out_len + 4] = code;
	c->out_len += 5;
	return start;
}

static void pkt_bytes(struct conn *c, const void *p, size_t n)
{
	LOADGEN_CHECK(OUT_CAP - c->out_len >= n);
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
	LOADGEN_CHECK(n >= 0 && (size_t)n < room);
	c->out_len += (size_t)n + 1;
}

static void pkt_end(struct conn *c, size_t start)
{
	size_t len = c->out_len - start - 4;

	LOADGEN_CHECK(len >= 1 && len <= UINT32_MAX);
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

	LOADGEN_CHECK(n > 0 && (size_t)n < len);
}

/* ---- the generator ---------------------------------------------------------------
 * gen_one() queues the next command of the session (with its MACRO) and advances
 * c->next; when the command expects a reply it sets c->wait and the caller stops. */

static void msg_verdict(struct conn *c, uint8_t code);
static void session_finish(struct conn *c);
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
	c->next = c->idle && !o.idle_mail ? STEP_DONE : STEP_HELO;
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
		if (c->idle) {
			/* --idle-mail: park between the last RCPT and DATA, as an MTA does
			 * while its client is slow to send the message. */
			c->next = STEP_DONE;
		} else if (c->rcpt_ok == 0) {
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
	if (o.reuse && loadgen_launch_allowed(&lg)) {
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
	default:           LOADGEN_CHECK(!"generator past the end of the session");
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
		c->lc.since = lg.now;
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

/* Resets the per-session state and counts the session if it is measured. */
static void session_reset(struct conn *c)
{
	c->seq = ++b.seq;
	c->t_start = lg.now;
	c->t_last_reply = lg.now;
	c->lc.since = lg.now;
	c->measured = loadgen_begin(&lg);
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
	if (lg.phase != LOADGEN_SETUP)
		lg.completed_all++;
	if (!c->measured)
		return;
	c->measured = false;
	for (int i = 0; i < V__MAX; i++) {
		b.verdicts[i] += c->tally[i];
		b.messages += c->tally[i];
	}
	b.mods += c->tally_mods;
	loadgen_done(&lg, c->t_start, c->t_last_reply);
}

static void retry_push(struct conn *c, uint64_t delay_ns, bool new_session)
{
	c->state = CS_RETRY;
	c->new_session = new_session;
	loadgen_retry_push(&lg, &c->lc, delay_ns);
}

static void conn_close(struct conn *c)
{
	if (c->lc.fd >= 0) {
		close(c->lc.fd);
		c->lc.fd = -1;
	}
	c->rx_hdr_have = 0;
	c->rx_have = 0;
	c->rx_len = 0;
	c->out_off = 0;
	c->out_len = 0;
}

static void conn_connected(struct conn *c)
{
	c->state = CS_SESSION;
	c->lc.since = lg.now;
	c->next = STEP_OPTNEG;
	c->wait = STEP_NONE;
	conn_progress(c);
}

/* Opens the connection of a new session (or retries it when the backlog was full). */
static void conn_connect(struct conn *c)
{
	int r;

	if (c->out == NULL) {
		c->out = malloc(OUT_CAP);
		if (c->out == NULL)
			loadgen_fatal("out of memory");
	}
	r = loadgen_connect(&lg, &c->lc);
	if (r == 0) {
		conn_connected(c);
	} else if (r == -EINPROGRESS) {
		c->state = CS_CONNECTING;
	} else if (r == -EAGAIN) {
		conn_close(c);
		retry_push(c, RETRY_BUSY_NS, false);
	}
}

/* Starts the next session of a load slot, or retires the slot. */
static void slot_next(struct conn *c)
{
	if (!loadgen_launch_allowed(&lg)) {
		c->state = CS_RETIRED;
		lg.active--;
		free(c->out);
		c->out = NULL;
		return;
	}
	lg.now = loadgen_clock_ns();
	session_reset(c);
	conn_connect(c);
}

/* Abandons the session after a protocol or I/O error: close, as Postfix does. */
static void conn_fail(struct conn *c, enum loadgen_err e, const char *why)
{
	static uint64_t reported;

	b.errors[e]++;
	if (reported++ < 5)
		fprintf(stderr, "milter_load: connection %u, step %s: %s error: %s\n", c->lc.id,
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
		loadgen_failed(&lg);
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
	if (shutdown(c->lc.fd, SHUT_WR) < 0) {
		conn_close(c);
		c->state = CS_FREE;
		return;
	}
	c->state = CS_CLOSING;
	c->lc.since = lg.now;
}

/* Writes queued output.  Returns 0 when all is written, -EAGAIN when the socket is
 * full, -EPIPE when the connection failed (it is then closed). */
static int conn_flush(struct conn *c)
{
	return loadgen_write(&lg, &c->lc, c->out, &c->out_off, &c->out_len);
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
		conn_fail(c, LOADGEN_ERR_UNEXPECTED, why);
		return;
	}
	if (code == 'p')                /* PROGRESS: keep waiting, the timer restarts */
		return;
	if (s == STEP_OPTNEG) {
		if (code != SMFIC_OPTNEG) {
			snprintf(why, sizeof why, "reply '%c' to OPTNEG", code);
			conn_fail(c, LOADGEN_ERR_PROTO, why);
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
		conn_fail(c, LOADGEN_ERR_PROTO, why);
		return;
	}
	if (is_modification(code)) {
		c->tally_mods++;
		return;
	}
	/* A final reply. */
	c->wait = STEP_NONE;
	c->t_last_reply = lg.now;
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
		LOADGEN_CHECK(!"reply awaited at an impossible step");
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
			conn_fail(c, LOADGEN_ERR_PROTO, "malformed REPLYCODE (needs \"4xx text\" or \"5xx text\")");
			return false;
		}
	}
	return true;
}

/* Feeds received bytes to the resumable packet parser.  Returns 0, or -EPROTO if
 * the connection failed on a protocol error (it is then closed). */
static int conn_feed(struct loadgen_conn *lc, const void *data, size_t n)
{
	struct conn *c = conn_of(lc);
	const uint8_t *p = data;
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
		if (c->lc.fd < 0)
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
		conn_fail(c, LOADGEN_ERR_CLOSED, "the filter closed an idle connection");
		return;
	default:
		conn_fail(c, LOADGEN_ERR_CLOSED, "the filter closed the connection");
		return;
	}
}

/* Reads and parses what arrived; see loadgen_read(). */
static void conn_read(struct conn *c, bool hup)
{
	if (loadgen_read(&lg, &c->lc, hup) == LOADGEN_EOF)
		conn_eof(c);
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
	if (c->lc.fd >= 0 && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
		conn_read(c, (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
	if (c->lc.fd >= 0 && c->state == CS_SESSION)
		conn_progress(c);
	if (c->state == CS_FREE)
		slot_next(c);
}

/* ops->fail: connecting, writing or reading failed. */
static void conn_io_fail(struct loadgen_conn *lc, enum loadgen_err e, const char *why)
{
	conn_fail(conn_of(lc), e, why);
}

/* ---- run control --------------------------------------------------------------- */

static void idle_open_more(void)
{
	struct conn *c;

	while (b.idle_next < o.idle && b.idle_inflight < IDLE_BATCH) {
		c = &b.conns[lg.opt.concurrency + b.idle_next++];
		b.idle_inflight++;
		lg.now = loadgen_clock_ns();
		session_reset(c);
		conn_connect(c);
	}
}

/* The setup phase: the idle connections are opened before the load starts. */
static bool idle_setup(void)
{
	if (loadgen_interrupted()) {
		b.idle_failed += o.idle - b.idle_next;
		b.idle_next = o.idle;
	}
	idle_open_more();
	return b.idle_held + b.idle_failed >= o.idle;
}

static void slot_start(unsigned i)
{
	slot_next(&b.conns[i]);
}

static void conn_retry(struct loadgen_conn *lc)
{
	struct conn *c = conn_of(lc);

	if (c->new_session) {
		c->state = CS_FREE;
		slot_next(c);
	} else {
		conn_connect(c);
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
		if (!loadgen_timed_out(&lg, &c->lc))
			continue;
		if (c->state == CS_CONNECTING) {
			c->state = CS_SESSION;
			conn_fail(c, LOADGEN_ERR_CONNECT, "connect timed out");
		} else if (c->state == CS_CLOSING) {
			conn_fail(c, LOADGEN_ERR_MISSING, "the filter did not close after QUIT");
		} else if (c->wait != STEP_NONE) {
			snprintf(why, sizeof why, "no reply to %s within %.1f s",
			    step_names[c->wait], lg.opt.timeout);
			conn_fail(c, LOADGEN_ERR_MISSING, why);
		} else {
			conn_fail(c, LOADGEN_ERR_IO, "the filter stopped reading");
		}
	}
}

/* Releases the idle connections the way an MTA ends a session. */
static void idle_release(void)
{
	for (unsigned i = lg.opt.concurrency; i < b.nconns; i++) {
		struct conn *c = &b.conns[i];

		if (c->state == CS_HOLD) {
			static const uint8_t quit[5] = { 0, 0, 0, 1, SMFIC_QUIT };

			(void)send(c->lc.fd, quit, sizeof quit, MSG_NOSIGNAL);
			conn_close(c);
		}
		c->state = CS_RETIRED;
	}
}

/* ---- setup and report ------------------------------------------------------------ */

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
		LOADGEN_CHECK(n > 0 && (size_t)n < sizeof buf);
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

static void report(void)
{
	struct loadgen_summary s;
	double mrate;
	char flags[256];

	loadgen_summarize(&lg, &s);
	mrate = s.elapsed > 0 ? (double)b.messages / s.elapsed : 0;
	flag_names(b.neg_proto, flags, sizeof flags);
	if (lg.opt.json) {
		loadgen_json_begin(&lg);
		printf(",\"concurrency\":%u,\"idle\":%u,\"idle_held\":%u,\"idle_lost\":%u,"
		    "\"idle_failed\":%u,\"reuse\":%s,\"rcpts\":%u,\"messages_per_session\":%u,"
		    "\"headers\":%u,\"body\":%zu,\"warmup_s\":%.3f,\"elapsed_s\":%.6f,"
		    "\"sessions\":%" PRIu64 ",\"failed\":%" PRIu64 ",\"messages\":%" PRIu64
		    ",\"sessions_per_s\":%.1f,\"messages_per_s\":%.1f,",
		    lg.opt.concurrency, o.idle, b.idle_held, b.idle_lost, b.idle_failed,
		    o.reuse ? "true" : "false", o.rcpts, o.messages, o.headers, o.body, lg.opt.warmup,
		    s.elapsed, lg.completed, lg.failed, b.messages, s.rate, mrate);
		loadgen_json_latency(&s);
		printf(",");
		loadgen_json_counts("verdicts", verdict_names, b.verdicts, V__MAX);
		printf(",");
		loadgen_json_errors(err_names, b.errors);
		printf(",\"modifications\":%" PRIu64 ",\"connect_retries\":%" PRIu64
		    ",\"negotiated\":{\"version\":%" PRIu32 ",\"actions\":%" PRIu32
		    ",\"protocol\":%" PRIu32 ",\"mismatch\":%" PRIu64 "}", b.mods,
		    lg.connect_retries, b.neg_version, b.neg_actions, b.neg_proto, b.neg_mismatch);
		if (lg.proc.ok)
			printf(",\"server\":{\"pid\":%ld,\"threads_max\":%ld,\"rss_kb_start\":%ld,"
			    "\"rss_kb_load_start\":%ld,\"rss_kb_max\":%ld,\"cpu_s\":%.3f,"
			    "\"sessions_all\":%" PRIu64 ",\"cpu_us_per_session\":%.1f}", lg.opt.pid,
			    lg.proc.threads_max, lg.proc.rss_kb_before, lg.proc.rss_kb_load,
			    lg.proc.rss_kb_max, s.cpu, lg.completed_all, s.cpu_per);
		loadgen_json_end();
		return;
	}
	printf("%-12s %s\n", "target", lg.opt.target);
	printf("%-12s version %" PRIu32 ", actions 0x%08" PRIx32 ", protocol 0x%08" PRIx32
	    "%s\n", "negotiated", b.neg_version, b.neg_actions, b.neg_proto,
	    b.neg_mismatch ? " (differs between connections!)" : "");
	printf("%-12s %s\n", "", flags);
	printf("%-12s concurrency %u; %u msg/session, %u rcpt, %u headers, %zu body bytes; %s\n",
	    "load", lg.opt.concurrency, o.messages, o.rcpts, o.headers, o.body,
	    o.reuse ? "connection reused (QUIT_NC)" : "new connection per session");
	if (o.idle > 0)
		printf("%-12s %u requested, %u held to the end, %u lost, %u failed to set up\n",
		    "idle", o.idle, b.idle_held, b.idle_lost, b.idle_failed);
	printf("%-12s %" PRIu64 " completed, %" PRIu64 " failed, in %.3f s (after %.1f s warm-up)\n",
	    "sessions", lg.completed, lg.failed, s.elapsed, lg.opt.warmup);
	printf("%-12s %.1f sessions/s, %.1f messages/s\n", "rate", s.rate, mrate);
	loadgen_print_latency(&s);
	printf("%-12s", "verdicts");
	for (int i = 0; i < V__MAX; i++)
		printf(" %s %" PRIu64 "%s", verdict_names[i], b.verdicts[i], i + 1 < V__MAX ? "," : "\n");
	loadgen_print_errors(err_names, b.errors);
	if (lg.proc.ok)
		printf("%-12s pid %ld: threads max %ld; RSS %ld kB before, %ld kB at load start, "
		    "%ld kB max; CPU %.3f s for %" PRIu64 " sessions = %.1f us/session\n",
		    "server", lg.opt.pid, lg.proc.threads_max, lg.proc.rss_kb_before,
		    lg.proc.rss_kb_load, lg.proc.rss_kb_max, s.cpu, lg.completed_all, s.cpu_per);
	if (b.mods > 0 || lg.connect_retries > 0)
		printf("%-12s %" PRIu64 " modification replies; %" PRIu64
		    " connect retries (backlog full)\n", "notes", b.mods, lg.connect_retries);
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
	    "  --idle-mail     idle connections also send HELO, MAIL and the RCPTs, and wait\n"
	    "                  in the middle of the transaction (before DATA)\n"
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

/* The options of milter_load's own; loadgen_parse_args() adds the common ones. */
static const struct loadgen_arg args[] = {
	{ 'b', NULL, LOADGEN_ARG_SIZE, &o.body, 0, 64u << 20, "body size" },
	{ 'i', NULL, LOADGEN_ARG_UNSIGNED, &o.idle, 0, 1000000, "idle count" },
	{ 'k', NULL, LOADGEN_ARG_UNSIGNED, &o.headers, 0, 10000, "header count" },
	{ 'm', NULL, LOADGEN_ARG_UNSIGNED, &o.messages, 1, 100000, "messages" },
	{ 'r', NULL, LOADGEN_ARG_UNSIGNED, &o.rcpts, 1, 100000, "recipients" },
	{ 0, "idle-mail", LOADGEN_ARG_FLAG, &o.idle_mail, 0, 0, NULL },
	{ 0, "reuse", LOADGEN_ARG_FLAG, &o.reuse, 0, 0, NULL },
	{ 0, "fast-close", LOADGEN_ARG_FLAG, &o.fast_close, 0, 0, NULL },
};

int main(int argc, char **argv)
{
	static const struct loadgen_ops ops = {
		.event = conn_event,
		.retry = conn_retry,
		.tick = timeouts_run,
		.setup = idle_setup,
		.start = slot_start,
		.feed = conn_feed,
		.fail = conn_io_fail,
	};
	int rc;

	loadgen_prog = "milter_load";
	loadgen_parse_args(&lg.opt, argc, argv, args, sizeof args / sizeof args[0], "sessions",
	    usage);
	loadgen_init(&lg, &ops, (unsigned long long)lg.opt.concurrency + o.idle);
	fill_body_pattern();
	b.nconns = lg.opt.concurrency + o.idle;
	b.conns = calloc(b.nconns, sizeof *b.conns);
	if (b.conns == NULL)
		loadgen_fatal("out of memory");
	for (unsigned i = 0; i < b.nconns; i++) {
		b.conns[i].lc.fd = -1;
		b.conns[i].lc.id = i;
		b.conns[i].idle = i >= lg.opt.concurrency;
		b.conns[i].state = CS_RETIRED;
	}

	loadgen_run(&lg);
	idle_release();
	report();

	rc = loadgen_total(b.errors, LOADGEN_ERR__MAX) > 0 || b.neg_mismatch > 0 ? 1 : 0;
	for (unsigned i = 0; i < b.nconns; i++)
		free(b.conns[i].out);
	free(b.conns);
	loadgen_fini(&lg);
	return rc;
}
