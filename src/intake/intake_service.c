/*
 * intake_service -- the SMTP intake (intake_service.h): sessions, the command state
 * machine, DATA into the queue, and the wait for the commit.
 *
 * A session reads commands with smtp_line_next(), answers each in order (replies of a
 * pipelined group are gathered and written together), and after "354" feeds the data
 * through smtp_data_decode() straight into the queue file.  At the end of the data it
 * hands the file to the committer and pauses until the result comes back through
 * worker_call(); only then does it answer and read the next command.
 *
 * Line ends (RFC 5321 §2.3.8: CR and LF appear only together, as CRLF).  A command line
 * cut by a bare LF is answered 500 and the session closed, as Postfix does with
 * smtpd_forbid_bare_newline = reject: the client meant the line to end somewhere else,
 * so nothing more it sent can be trusted to be the command it looks like (a "MAIL
 * ...\nRCPT TO:<x>" would otherwise give the next hop a recipient nobody asked for).  A
 * command line with a bare CR ended in CRLF, so it is refused whole and the session goes
 * on.  In DATA a bare line end is stored as CRLF, or with bare_newline = "reject" the
 * message is refused at its end; the end itself is only ever CRLF "." CRLF.
 */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "intake_service.h"
#include "smtp.h"
#include "util.h"

#define REPLY_MAX 8192          /* the reply buffer's hard limit */
#define REPLY_FLUSH 4096        /* replies gathered before a write */
#define DATA_OUT 65536          /* decoded bytes gathered before queue_new_body() */
#define HELO_MAX SMTP_MAX_DOMAIN
#define CLIENT_MAX 128

/* NOTIFY bits go into the queue as the codec gives them; a decoded value is never
 * longer than it was sent */
static_assert((int)SMTP_NOTIFY_NEVER == (int)QUEUE_NOTIFY_NEVER &&
	      (int)SMTP_NOTIFY_SUCCESS == (int)QUEUE_NOTIFY_SUCCESS &&
	      (int)SMTP_NOTIFY_FAILURE == (int)QUEUE_NOTIFY_FAILURE &&
	      (int)SMTP_NOTIFY_DELAY == (int)QUEUE_NOTIFY_DELAY, "NOTIFY bits differ");
static_assert(SMTP_DSN_ENVID_MAX <= QUEUE_MAX_ENVID && SMTP_DSN_ORCPT_MAX <= QUEUE_MAX_ORCPT,
	      "DSN limits differ");

/* Settings shared by sessions; replaced whole on reload (sessions keep theirs). */
struct iconf {
	_Atomic unsigned refs;
	struct ip_prefix *allow;
	size_t nallow;
	uint64_t max_message_size;
	uint64_t min_free;
	unsigned max_recipients;
	unsigned max_errors;
	size_t max_line;
	struct request_bound data;
	struct request_bound line;
	bool reject_bare_newline;
	char hostname[256];
};

struct intake {
	struct queue *q;
	pthread_mutex_t lock;
	struct iconf *conf;
	_Atomic uint64_t messages, recipients, bytes, refused, rejected, bare_eol, bare_command;
	atomic_bool low_space; /* MAIL refused for want of space: logged when it starts, ends */
};

enum istate {
	IS_COMMAND = 0,
	IS_DATA,        /* after 354 */
	IS_COMMIT,      /* the final dot came; waiting for the committer */
	IS_CLOSING,     /* QUIT, too many errors */
	IS_REFUSED,     /* 554 at connect: only QUIT is served (RFC 5321 3.1) */
};

struct commit_wait;

struct isession {
	struct session *s;
	struct intake *in;
	struct iconf *conf;
	enum istate state;
	struct smtp_line_reader lr;
	struct buf reply;
	unsigned errors;
	bool ehlo;                        /* EHLO (not HELO): extensions may be used */
	char helo[HELO_MAX + 1];          /* empty: no HELO/EHLO yet */
	char client[CLIENT_MAX];          /* "[192.0.2.1]", "[IPv6:...]", or the unix peer */
	/* the transaction */
	bool in_mail;
	struct buf sender;
	struct smtp_mail mail;            /* sender slice not kept: see sender */
	/* each recipient: its address, NUL, its NOTIFY bits (one byte), its ORCPT decoded
	 * ("type;address", maybe empty), NUL */
	struct buf rcpts;
	char envid[QUEUE_MAX_ENVID];      /* the transaction's ENVID, decoded */
	size_t envid_len;
	size_t nrcpt;
	/* DATA */
	struct smtp_data dd;
	struct queue_new *qn;
	char *out;                        /* DATA_OUT bytes */
	size_t out_len;
	bool too_big, long_line;
	bool bare;                        /* a bare line end under reject_bare_newline */
	bool long_line_req;               /* discarding a long command line: timed */
	int write_err;                    /* first error writing the file, 0 if none */
	struct commit_wait *wait;
};

/* A commit in flight: shared by the session and the committer, freed by the worker's
 * callback.  is is cleared when the session goes first. */
struct commit_wait {
	struct isession *is;
	struct worker *w;
	int result;
	char id[QUEUE_ID_LEN + 1];
	size_t nrcpt;
	uint64_t size;
};

/* ---- settings ---- */

static struct iconf *iconf_unref(struct iconf *c)
{
	if (c && atomic_fetch_sub(&c->refs, 1) == 1) {
		free(c->allow);
		free(c);
	}
	return NULL;
}

static struct iconf *iconf_make(const struct intake_conf *conf)
{
	struct iconf *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	atomic_store(&c->refs, 1);
	c->allow = calloc(conf->nallow ? conf->nallow : 1, sizeof(*c->allow));
	if (!c->allow) {
		free(c);
		return NULL;
	}
	if (conf->nallow)
		memcpy(c->allow, conf->allow, conf->nallow * sizeof(*c->allow));
	c->nallow = conf->nallow;
	c->max_message_size = conf->max_message_size;
	c->min_free = conf->min_free;
	c->max_recipients = conf->max_recipients;
	c->max_errors = conf->max_errors;
	c->max_line = conf->max_line;
	c->data = conf->data;
	c->line = conf->line;
	c->reject_bare_newline = conf->reject_bare_newline;
	if (conf->hostname)
		snprintf(c->hostname, sizeof(c->hostname), "%s", conf->hostname);
	else if (gethostname(c->hostname, sizeof(c->hostname)) < 0 || !c->hostname[0])
		snprintf(c->hostname, sizeof(c->hostname), "localhost");
	c->hostname[sizeof(c->hostname) - 1] = '\0';
	return c;
}

static struct iconf *iconf_get(struct intake *in)
{
	pthread_mutex_lock(&in->lock);
	struct iconf *c = in->conf;
	atomic_fetch_add(&c->refs, 1);
	pthread_mutex_unlock(&in->lock);
	return c;
}

/* ---- replies ---- */

static void flush_replies(struct isession *is);

/* Replies of a pipelined group are gathered and written together; a long group (a client
 * that pipelines a thousand RCPTs) is written REPLY_FLUSH bytes at a time, so the buffer
 * never fills: every reply is far shorter than REPLY_MAX - REPLY_FLUSH. */
static void vreply(struct isession *is, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));
static void vreply(struct isession *is, const char *fmt, va_list ap)
{
	int r = buf_vprintf(&is->reply, fmt, ap);
	if (r == 0)
		r = buf_append(&is->reply, "\r\n", 2);
	ASSERT(r == 0);
	if (is->reply.len >= REPLY_FLUSH)
		flush_replies(is);
}

static void reply(struct isession *is, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reply(struct isession *is, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreply(is, fmt, ap);
	va_end(ap);
}

static void flush_replies(struct isession *is)
{
	if (is->reply.len) {
		session_write(is->s, is->reply.ptr, is->reply.len);
		buf_reset(&is->reply);
	}
}

/* A client error: counted; too many end the session (RFC 5321 leaves the number to us). */
static void client_error(struct isession *is)
{
	if (++is->errors >= is->conf->max_errors) {
		reply(is, "421 4.7.0 %s Error: too many errors", is->conf->hostname);
		session_log(is->s, LOG_LEVEL_NOTICE, "too many errors (%u), closing", is->errors);
		is->state = IS_CLOSING;
	}
}

/* A reply to a client's mistake: counted by client_error(). */
static void refuse(struct isession *is, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(struct isession *is, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreply(is, fmt, ap);
	va_end(ap);
	client_error(is);
}

/* The reply to a MAIL or RCPT argument the codec refused (smtp.h's table); bad_path is
 * the reply for a path that is not an address. */
static void refuse_path(struct isession *is, int r, const char *why, const char *bad_path)
{
	switch (r) {
	case -EILSEQ: refuse(is, "553 5.6.7 %s", why); break;
	case -EPROTO: refuse(is, "501 5.5.4 %s", why); break;
	case -ENOTSUP: refuse(is, "555 5.5.4 %s", why); break;
	default: refuse(is, "%s: %s", bad_path, why); break;
	}
}

/* ---- the transaction ---- */

static void transaction_reset(struct isession *is)
{
	is->in_mail = false;
	buf_reset(&is->sender);
	buf_reset(&is->rcpts);
	is->nrcpt = 0;
	queue_new_abort(is->qn);
	is->qn = NULL;
	is->out_len = 0;
	is->too_big = is->long_line = is->bare = false;
	is->write_err = 0;
}

/* ---- access ---- */

static bool peer_allowed(struct isession *is)
{
	const struct sockaddr *sa = session_peer_addr(is->s);
	char text[INET6_ADDRSTRLEN];
	if (sa->sa_family == AF_UNIX) {
		snprintf(is->client, sizeof(is->client), "%s", session_peer(is->s));
		return true;
	}
	if (sa->sa_family == AF_INET) {
		inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, text,
			  sizeof(text));
	} else if (sa->sa_family == AF_INET6) {
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
			  text, sizeof(text));
	} else {
		snprintf(is->client, sizeof(is->client), "unknown");
		return false;
	}
	struct ipaddr a;
	if (ipaddr_parse(str_cstr(text), &a) < 0) {
		snprintf(is->client, sizeof(is->client), "[%s]", text);
		return false;
	}
	char norm[IPADDR_TEXT_MAX];
	ipaddr_format(&a, a.family == 4 ? 32 : 128, norm, sizeof(norm));
	snprintf(is->client, sizeof(is->client), a.family == 4 ? "[%s]" : "[IPv6:%s]", norm);
	for (size_t i = 0; i < is->conf->nallow; i++)
		if (ipaddr_in_prefix(&a, &is->conf->allow[i].addr, is->conf->allow[i].bits))
			return true;
	return false;
}

/* ---- commands ---- */

static void cmd_helo(struct isession *is, const struct smtp_command *c, bool ehlo)
{
	if (smtp_check_helo(c->arg, NULL) < 0) {
		refuse(is, "501 5.5.4 Syntax: %s hostname", ehlo ? "EHLO" : "HELO");
		return;
	}
	transaction_reset(is); /* RFC 5321 4.1.4: EHLO/HELO reset the transaction */
	memcpy(is->helo, c->arg.ptr, c->arg.len);
	is->helo[c->arg.len] = '\0';
	is->ehlo = ehlo;
	const struct iconf *cf = is->conf;
	if (!ehlo) {
		reply(is, "250 %s", cf->hostname);
		return;
	}
	reply(is, "250-%s", cf->hostname);
	reply(is, "250-PIPELINING");
	reply(is, "250-SIZE %" PRIu64, cf->max_message_size);
	reply(is, "250-8BITMIME");
	reply(is, "250-ENHANCEDSTATUSCODES");
	reply(is, "250-DSN");
	reply(is, "250 SMTPUTF8");
}

/*
 * Is there room in the queue for a message of `size` bytes (its SIZE, 0 if not given)
 * with queue.min_free left over?  Asked at MAIL, so that a client is told before it
 * sends the message; DATA's end still answers 452 4.3.1 if the disk fills meanwhile.
 * The first refusal of an episode is logged, and the first MAIL admitted after it.
 * XXX: one statvfs per MAIL, on the session's loop; it does not touch the disk on a
 * local file system, but could wait on a network one.
 */
static bool space_for(struct isession *is, uint64_t size)
{
	uint64_t avail;
	if (is->conf->min_free == 0 && size == 0)
		return true;
	if (queue_free_space(is->in->q, &avail) < 0)
		return true; /* unknown: the writes will tell */
	uint64_t need = is->conf->min_free + size;
	bool low = avail < need;
	if (low != atomic_load(&is->in->low_space) &&
	    atomic_exchange(&is->in->low_space, low) != low) {
		if (low)
			session_log(is->s, LOG_LEVEL_WARNING,
				    "queue disk full: %" PRIu64 " bytes free, under queue.min_free "
				    "(%" PRIu64 ") + SIZE (%" PRIu64 "): answering MAIL with 452 "
				    "4.3.1 until there is room",
				    avail, is->conf->min_free, size);
		else
			session_log(is->s, LOG_LEVEL_NOTICE,
				    "queue disk has room again: %" PRIu64 " bytes free", avail);
	}
	return !low;
}

static void cmd_mail(struct isession *is, const struct smtp_command *c)
{
	if (!is->helo[0]) {
		refuse(is, "503 5.5.1 Error: send HELO/EHLO first");
		return;
	}
	if (is->in_mail) {
		refuse(is, "503 5.5.1 Error: nested MAIL command");
		return;
	}
	if (c->bad_form) {
		refuse(is, "501 5.5.4 Syntax: MAIL FROM:<address>");
		return;
	}
	struct smtp_mail m;
	const char *why = "bad syntax";
	int r = smtp_parse_mail(c->arg, is->ehlo, &m, &why);
	if (r == 0 && !is->ehlo &&
	    (m.has_size || m.body != SMTP_BODY_NONE || m.ret != SMTP_RET_NONE || m.envid.len)) {
		r = -ENOTSUP; /* RFC 5321 4.1.1.11: parameters need EHLO */
		why = "parameters need EHLO";
	}
	if (r < 0) {
		refuse_path(is, r, why, "501 5.1.7 Bad sender address syntax");
		return;
	}
	if (m.has_size && m.size > is->conf->max_message_size) {
		reply(is, "552 5.3.4 Message size exceeds fixed limit");
		return;
	}
	if (!space_for(is, m.has_size ? m.size : 0)) {
		reply(is, "452 4.3.1 Insufficient system storage");
		return;
	}
	buf_reset(&is->sender);
	if (buf_append_str(&is->sender, m.addr) < 0 || buf_append_byte(&is->sender, 0) < 0) {
		reply(is, "452 4.3.1 Insufficient system resources");
		return;
	}
	/* checked by the codec: decodes to printable ASCII, no longer than it was sent */
	if (m.envid.len && smtp_xtext_decode(m.envid, is->envid, sizeof(is->envid),
					     &is->envid_len) < 0) {
		refuse(is, "501 5.5.4 Bad ENVID value");
		return;
	}
	if (!m.envid.len)
		is->envid_len = 0;
	is->mail = m;
	is->mail.addr = STR_NULL;
	is->mail.envid = STR_NULL;
	is->in_mail = true;
	reply(is, "250 2.1.0 Ok");
}

static void cmd_rcpt(struct isession *is, const struct smtp_command *c)
{
	if (!is->in_mail) {
		refuse(is, "503 5.5.1 Error: need MAIL command");
		return;
	}
	if (c->bad_form) {
		refuse(is, "501 5.5.4 Syntax: RCPT TO:<address>");
		return;
	}
	struct smtp_rcpt rc;
	const char *why = "bad syntax";
	int r = smtp_parse_rcpt(c->arg, is->mail.smtputf8, &rc, &why);
	if (r == 0 && !is->ehlo && (rc.notify || rc.orcpt_type.len)) {
		r = -ENOTSUP; /* RFC 5321 4.1.1.11: parameters need EHLO */
		why = "parameters need EHLO";
	}
	if (r < 0) {
		refuse_path(is, r, why, "501 5.1.3 Bad recipient address syntax");
		return;
	}
	if (is->nrcpt >= is->conf->max_recipients) {
		reply(is, "452 4.5.3 Error: too many recipients");
		return;
	}
	/* ORCPT decoded: its type, ';', the address (never longer than sent) */
	char orcpt[SMTP_DSN_ORCPT_MAX];
	size_t olen = 0;
	if (rc.orcpt_type.len) {
		memcpy(orcpt, rc.orcpt_type.ptr, rc.orcpt_type.len);
		orcpt[rc.orcpt_type.len] = ';';
		olen = rc.orcpt_type.len + 1;
		size_t al;
		if (smtp_xtext_decode(rc.orcpt, orcpt + olen, sizeof(orcpt) - olen, &al) < 0) {
			refuse(is, "501 5.5.4 Bad ORCPT value");
			return;
		}
		olen += al;
	}
	size_t mark = is->rcpts.len;
	if (buf_append_str(&is->rcpts, rc.addr) < 0 || buf_append_byte(&is->rcpts, 0) < 0 ||
	    buf_append_byte(&is->rcpts, (unsigned char)rc.notify) < 0 ||
	    buf_append(&is->rcpts, orcpt, olen) < 0 || buf_append_byte(&is->rcpts, 0) < 0) {
		buf_truncate(&is->rcpts, mark);
		reply(is, "452 4.3.1 Insufficient system resources");
		return;
	}
	is->nrcpt++;
	reply(is, "250 2.1.5 Ok");
}

static void format_date(char *out, size_t len)
{
	time_t t = time(NULL);
	struct tm tm;
	fmt_rfc5322_date(out, len, t, localtime_r(&t, &tm) ? tm.tm_gmtoff : 0);
}

/* RFC 5321 4.4 trace header, first in the stored message. */
static int write_received(struct isession *is)
{
	char date[64];
	format_date(date, sizeof(date));
	const char *with = is->mail.smtputf8 ? "UTF8SMTP" : is->ehlo ? "ESMTP" : "SMTP";
	struct buf h;
	buf_init(&h, 4096);
	int r = buf_printf(&h, "Received: from %s (%s)\r\n\tby %s (sluice) with %s id %s", is->helo,
			   is->client, is->conf->hostname, with, queue_new_id(is->qn));
	/* "for" names a lone recipient, unless its line would pass 998 octets */
	if (r == 0 && is->nrcpt == 1 && strlen(is->rcpts.ptr) < 900)
		r = buf_printf(&h, "\r\n\tfor <%s>", is->rcpts.ptr);
	if (r == 0)
		r = buf_printf(&h, "; %s\r\n", date);
	if (r == 0)
		r = queue_new_body(is->qn, buf_str(&h));
	buf_done(&h);
	return r;
}

/* The queue's file system is out of space or quota (RFC 3463 4.3.1). */
static bool disk_full(int r)
{
	return r == -ENOSPC || r == -EDQUOT;
}

static void reply_queue_error(struct isession *is, int r)
{
	if (disk_full(r))
		reply(is, "452 4.3.1 Insufficient system storage");
	else if (r == -ESHUTDOWN)
		reply(is, "451 4.3.2 Service shutting down, try again later");
	else
		reply(is, "451 4.3.0 Error: queue file write error");
}

static void cmd_data(struct isession *is, const struct smtp_command *c)
{
	if (!is->in_mail) {
		refuse(is, "503 5.5.1 Error: need MAIL command");
		return;
	}
	if (is->nrcpt == 0) {
		refuse(is, "554 5.5.1 Error: no valid recipients");
		return;
	}
	if (c->arg.len) {
		refuse(is, "501 5.5.4 Syntax: DATA");
		return;
	}
	struct queue_envelope env = {
		.sender = str_make(is->sender.ptr, is->sender.len - 1),
		.client = str_cstr(is->client),
		.helo = str_cstr(is->helo),
		.flags = (is->mail.body == SMTP_BODY_8BITMIME ? QUEUE_8BITMIME : 0) |
			 (is->mail.smtputf8 ? QUEUE_SMTPUTF8 : 0),
		.size = is->mail.has_size ? is->mail.size : 0,
		/* the codec's values are the queue's (smtp.h, queue_file.h) */
		.ret = is->mail.ret == SMTP_RET_FULL ? QUEUE_RET_FULL :
		       is->mail.ret == SMTP_RET_HDRS ? QUEUE_RET_HDRS : QUEUE_RET_NONE,
		.envid = str_make(is->envid, is->envid_len),
	};
	/* a file without DSN parameters is written in version 1 (doc/QUEUE.md: a downgrade
	 * still reads it): does any recipient have NOTIFY or ORCPT? */
	const char *p = is->rcpts.ptr;
	for (size_t i = 0; i < is->nrcpt && !env.rcpt_dsn; i++) {
		size_t len = strlen(p);
		env.rcpt_dsn = p[len + 1] || p[len + 2];
		p += len + 2 + strlen(p + len + 2) + 1;
	}
	int r = queue_new_begin(is->in->q, &env, &is->qn);
	p = is->rcpts.ptr;
	for (size_t i = 0; r == 0 && i < is->nrcpt; i++) {
		size_t len = strlen(p);
		unsigned notify = (unsigned char)p[len + 1];
		const char *o = p + len + 2;
		size_t olen = strlen(o);
		r = queue_new_rcpt_dsn(is->qn, str_make(p, len), notify, str_make(o, olen));
		p = o + olen + 1;
	}
	if (r == 0)
		r = write_received(is);
	if (r < 0) {
		session_log(is->s, LOG_LEVEL_ERROR, "cannot create a queue file: %s", strerror(-r));
		reply_queue_error(is, r);
		transaction_reset(is);
		return;
	}
	smtp_data_init(&is->dd);
	is->out_len = 0;
	is->state = IS_DATA;
	/* the data is consumed as it comes: its deadline is the service's to keep */
	session_request_begin(is->s, &is->conf->data);
	reply(is, "354 End data with <CR><LF>.<CR><LF>");
}

static void on_command(struct isession *is, struct str line)
{
	struct smtp_command c;
	const char *why = NULL;
	int r = smtp_command_parse(line, &c, &why);
	if (r == -EBADMSG) {
		atomic_fetch_add(&is->in->bare_command, 1);
		refuse(is, "500 5.5.2 Error: bare <CR> received");
		return;
	}
	if (r < 0) {
		refuse(is, "500 5.5.2 Error: bad syntax");
		return;
	}
	if (is->state == IS_REFUSED) {
		/* RFC 5321 3.1: after a 554 greeting, wait for QUIT and answer 503 to the
		 * rest; max_errors ends a client that never quits */
		if (c.verb == SMTP_VERB_QUIT) {
			reply(is, "221 2.0.0 Bye");
			is->state = IS_CLOSING;
		} else {
			refuse(is, "503 5.7.1 Error: access denied for %s", is->client);
		}
		return;
	}
	switch (c.verb) {
	case SMTP_VERB_HELO: cmd_helo(is, &c, false); break;
	case SMTP_VERB_EHLO: cmd_helo(is, &c, true); break;
	case SMTP_VERB_MAIL: cmd_mail(is, &c); break;
	case SMTP_VERB_RCPT: cmd_rcpt(is, &c); break;
	case SMTP_VERB_DATA: cmd_data(is, &c); break;
	case SMTP_VERB_RSET:
		transaction_reset(is);
		reply(is, "250 2.0.0 Ok");
		break;
	case SMTP_VERB_NOOP: reply(is, "250 2.0.0 Ok"); break;
	case SMTP_VERB_QUIT:
		reply(is, "221 2.0.0 Bye");
		is->state = IS_CLOSING;
		break;
	case SMTP_VERB_VRFY:
		reply(is, "252 2.0.0 Cannot VRFY user, but will accept message and attempt delivery");
		break;
	case SMTP_VERB_HELP:
		reply(is, "214 2.0.0 Commands: EHLO HELO MAIL RCPT DATA RSET NOOP QUIT VRFY HELP");
		break;
	case SMTP_VERB_EXPN:
	case SMTP_VERB_STARTTLS:
	case SMTP_VERB_AUTH:
	case SMTP_VERB_BDAT:
	case SMTP_VERB_ETRN:
		refuse(is, "502 5.5.1 Error: command not implemented");
		break;
	case SMTP_VERB_UNKNOWN:
	default:
		refuse(is, "500 5.5.2 Error: command not recognized");
		break;
	}
}

/* ---- DATA ---- */

static void data_write(struct isession *is)
{
	if (is->out_len && !is->write_err && !is->too_big && !is->long_line && !is->bare) {
		int r = queue_new_body(is->qn, str_make(is->out, is->out_len));
		if (r < 0) {
			is->write_err = r;
			session_log(is->s, LOG_LEVEL_ERROR, "queue file %s: write: %s",
				    queue_new_id(is->qn), strerror(-r));
		}
	}
	is->out_len = 0;
}

static void on_committed(void *arg);

static void commit_done(void *arg, int r)
{
	struct commit_wait *cw = arg;
	cw->result = r;
	/* Back to the session's worker.  XXX if even that allocation fails the session
	 * waits for its command timeout; the message itself is settled either way. */
	if (worker_call(cw->w, on_committed, cw) < 0)
		return;
}

/* The final dot came: refuse, or hand the file to the committer and wait. */
static void data_end(struct isession *is)
{
	session_request_end(is->s);
	data_write(is);
	if (is->dd.bare_eol)
		atomic_fetch_add(&is->in->bare_eol, 1);
	if (is->bare || is->too_big || is->long_line || is->write_err) {
		/* first the broken framing, as Postfix answers it before its other errors */
		if (is->bare)
			reply(is, "550 5.5.2 Error: %s", smtp_data_bare_why(&is->dd));
		else if (is->too_big)
			reply(is, "552 5.3.4 Message size exceeds fixed limit");
		else if (is->long_line)
			reply(is, "550 5.6.0 Message has a line over %zu octets (RFC 5321 4.5.3.1.6)",
			      is->conf->max_line);
		else
			reply_queue_error(is, is->write_err);
		char from[SMTP_MAX_ADDR * 4 + 8];
		log_quote(from, sizeof(from), str_cstr(is->sender.ptr ? is->sender.ptr : ""), 200);
		session_log(is->s, LOG_LEVEL_NOTICE, "refused reason=%s from=<%s> client=%s",
			    is->bare                   ? "bare-newline"
			    : is->too_big              ? "too-big"
			    : is->long_line            ? "line-too-long"
			    : disk_full(is->write_err) ? "disk-full"
			                               : "write-error",
			    from, is->client);
		atomic_fetch_add(&is->in->rejected, 1);
		transaction_reset(is);
		is->state = IS_COMMAND;
		return;
	}
	struct commit_wait *cw = calloc(1, sizeof(*cw));
	if (!cw) {
		reply(is, "451 4.3.0 Error: out of memory");
		transaction_reset(is);
		is->state = IS_COMMAND;
		return;
	}
	cw->is = is;
	cw->w = session_worker(is->s);
	cw->nrcpt = is->nrcpt;
	cw->size = queue_new_size(is->qn);
	memcpy(cw->id, queue_new_id(is->qn), sizeof(cw->id));
	struct queue_new *qn = is->qn;
	is->qn = NULL;
	int r = queue_new_commit(qn, commit_done, cw);
	if (r < 0) {
		session_log(is->s, LOG_LEVEL_ERROR, "qid=%s cannot end the queue file: %s", cw->id,
			    strerror(-r));
		free(cw);
		reply_queue_error(is, r);
		atomic_fetch_add(&is->in->rejected, 1);
		transaction_reset(is);
		is->state = IS_COMMAND;
		return;
	}
	is->wait = cw;
	is->state = IS_COMMIT;
	session_pause(is->s);
}

static void on_committed(void *arg)
{
	struct commit_wait *cw = arg;
	struct isession *is = cw->is;
	if (!is) { /* the session is gone; the message is committed or removed regardless */
		free(cw);
		return;
	}
	is->wait = NULL;
	if (cw->result == 0) {
		reply(is, "250 2.0.0 Ok: queued as %s", cw->id);
		char from[SMTP_MAX_ADDR * 4 + 8];
		log_quote(from, sizeof(from), str_cstr(is->sender.ptr ? is->sender.ptr : ""), 200);
		session_log(is->s, LOG_LEVEL_INFO, "queued qid=%s from=<%s> nrcpt=%zu size=%" PRIu64
			    " client=%s", cw->id, from, cw->nrcpt, cw->size, is->client);
		atomic_fetch_add(&is->in->messages, 1);
		atomic_fetch_add(&is->in->recipients, cw->nrcpt);
		atomic_fetch_add(&is->in->bytes, cw->size);
	} else {
		session_log(is->s, LOG_LEVEL_ERROR, "qid=%s commit failed: %s", cw->id,
			    strerror(-cw->result));
		reply_queue_error(is, cw->result);
		atomic_fetch_add(&is->in->rejected, 1);
	}
	free(cw);
	transaction_reset(is);
	is->state = IS_COMMAND;
	flush_replies(is);
	session_resume(is->s);
}

/* Feed the data that came; returns the bytes consumed. */
static size_t on_data(struct isession *is, const char *p, size_t n)
{
	size_t used = 0;
	while (used < n && is->state == IS_DATA) {
		size_t consumed, produced;
		int done = smtp_data_decode(&is->dd, p + used, n - used, is->out + is->out_len,
					    DATA_OUT - is->out_len, &consumed, &produced);
		used += consumed;
		is->out_len += produced;
		if (is->dd.size > is->conf->max_message_size)
			is->too_big = true;
		if (is->dd.max_line > is->conf->max_line)
			is->long_line = true;
		/* from the first bare line end nothing more is written: the message will be
		 * refused, and the decoder still reads on to the real end of the data */
		if (is->dd.bare_eol && is->conf->reject_bare_newline)
			is->bare = true;
		if (done) {
			data_end(is);
			break;
		}
		if (DATA_OUT - is->out_len < SMTP_DATA_MIN_OUT || is->out_len >= DATA_OUT / 2)
			data_write(is);
	}
	/* Write what is gathered before waiting for more, so memory stays at DATA_OUT. */
	if (is->state == IS_DATA && is->out_len >= DATA_OUT / 2)
		data_write(is);
	return used;
}

/* ---- the service ---- */

/* The longest line (CRLF included) a command may be: MAIL up to SMTP_DSN_MAIL_LINE_MAX,
 * RCPT up to SMTP_DSN_LINE_MAX (RFC 3461 5: 100 and 500 characters more, and NOTIFY
 * beside a whole ORCPT), the rest SMTP_LINE_MAX. */
static size_t dsn_line_max(struct str line)
{
	size_t i = 0;
	while (i < line.len && (line.ptr[i] == ' ' || line.ptr[i] == '\t'))
		i++;
	if (line.len - i > 5 && strncasecmp(line.ptr + i, "mail ", 5) == 0)
		return SMTP_DSN_MAIL_LINE_MAX;
	if (line.len - i > 5 && strncasecmp(line.ptr + i, "rcpt ", 5) == 0)
		return SMTP_DSN_LINE_MAX;
	return SMTP_LINE_MAX;
}

static void is_input(struct session *s, struct evbuffer *in)
{
	struct isession *is = session_data(s);
	while (evbuffer_get_length(in) &&
	       (is->state == IS_COMMAND || is->state == IS_DATA || is->state == IS_REFUSED)) {
		if (is->state == IS_DATA) {
			struct evbuffer_iovec v;
			if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
				break;
			size_t used = on_data(is, v.iov_base, v.iov_len);
			evbuffer_drain(in, used);
			continue;
		}
		size_t avail = evbuffer_get_length(in);
		/* DSN is advertised: its parameters lengthen MAIL and RCPT (RFC 3461 5) */
		size_t take = avail < SMTP_DSN_LINE_MAX + 1 ? avail : SMTP_DSN_LINE_MAX + 1;
		const char *p = (const char *)evbuffer_pullup(in, (ssize_t)take);
		struct str line;
		size_t used = 0;
		enum smtp_line_status st = smtp_line_next(&is->lr, p, take, SMTP_DSN_LINE_MAX, &line,
							  &used);
		/* A line too long is consumed as it comes, so the engine would see no partial
		 * request: its deadline is kept here, from the start of the discarding to the
		 * line's end. */
		if (is->lr.discarding && !is->long_line_req) {
			session_request_begin(s, &is->conf->line);
			is->long_line_req = true;
		} else if (!is->lr.discarding && is->long_line_req) {
			session_request_end(s);
			is->long_line_req = false;
		}
		if (st == SMTP_LINE_OK && is->lr.bare_lf) {
			/* (smtp.h) the line's end is in doubt: answer and stop reading */
			atomic_fetch_add(&is->in->bare_command, 1);
			reply(is, "500 5.5.2 Error: bare <LF> received");
			session_log(s, LOG_LEVEL_NOTICE, "bare <LF> in a command, closing client=%s",
				    is->client);
			is->state = IS_CLOSING;
		} else if (st == SMTP_LINE_OK && line.len > SMTP_LINE_MAX - 2 &&
			   line.len > dsn_line_max(line) - 2) {
			refuse(is, "500 5.5.2 Error: line too long");
		} else if (st == SMTP_LINE_OK) {
			on_command(is, line);
		} else if (st == SMTP_LINE_TOO_LONG) {
			refuse(is, "500 5.5.2 Error: line too long");
		}
		evbuffer_drain(in, used);
		if (st == SMTP_LINE_MORE && used == 0) /* discarding a long line: go on */
			break;
	}
	flush_replies(is);
	if (is->state == IS_CLOSING)
		session_close(s);
}

static int is_open(struct session *s)
{
	struct intake *in = service_arg(session_service(s));
	struct isession *is = calloc(1, sizeof(*is));
	if (!is)
		return -ENOMEM;
	is->out = malloc(DATA_OUT);
	if (!is->out) {
		free(is);
		return -ENOMEM;
	}
	is->s = s;
	is->in = in;
	is->conf = iconf_get(in);
	smtp_line_reader_init(&is->lr);
	buf_init(&is->reply, REPLY_MAX);
	buf_init(&is->sender, SMTP_MAX_ADDR + 1);
	buf_init(&is->rcpts, (size_t)is->conf->max_recipients * (SMTP_MAX_ADDR + 3 +
								  SMTP_DSN_ORCPT_MAX));
	session_set_data(s, is);
	if (!peer_allowed(is)) {
		atomic_fetch_add(&in->refused, 1);
		session_log(s, LOG_LEVEL_NOTICE, "client %s not in intake allow: refused",
			    is->client);
		reply(is, "554 5.7.1 %s Error: %s may not queue mail here", is->conf->hostname,
		      is->client);
		flush_replies(is);
		is->state = IS_REFUSED;
		return 0;
	}
	reply(is, "220 %s ESMTP sluice", is->conf->hostname);
	flush_replies(is);
	return 0;
}

static void is_timeout(struct session *s)
{
	struct isession *is = session_data(s);
	if (!is)
		return;
	reply(is, "421 4.4.2 %s Error: timeout exceeded", is->conf->hostname);
	flush_replies(is);
}

static void is_close(struct session *s)
{
	struct isession *is = session_data(s);
	if (!is)
		return;
	if (is->wait)
		is->wait->is = NULL; /* the commit goes on; its callback frees the wait */
	transaction_reset(is);
	buf_done(&is->reply);
	buf_done(&is->sender);
	buf_done(&is->rcpts);
	free(is->out);
	iconf_unref(is->conf);
	free(is);
	session_set_data(s, NULL);
}

static void intake_free_arg(void *arg)
{
	struct intake *in = arg;
	iconf_unref(in->conf);
	pthread_mutex_destroy(&in->lock);
	free(in);
}

static const struct service_ops intake_ops = {
	.open = is_open,
	.input = is_input,
	.close = is_close,
	.timeout = is_timeout,
	.refuse_msg = "421 4.3.2 Too many connections, try again later\r\n",
	.free_arg = intake_free_arg,
};

struct service *intake_service_new(struct engine *e, struct queue *q,
				   const struct intake_conf *conf)
{
	struct intake *in = calloc(1, sizeof(*in));
	if (!in)
		return NULL;
	in->q = q;
	pthread_mutex_init(&in->lock, NULL);
	if (!(in->conf = iconf_make(conf))) {
		intake_free_arg(in);
		return NULL;
	}
	struct service *svc = service_new(e, "intake", &intake_ops, in);
	if (!svc)
		intake_free_arg(in);
	return svc;
}

int intake_service_set_conf(struct service *svc, const struct intake_conf *conf)
{
	struct intake *in = service_arg(svc);
	struct iconf *c = iconf_make(conf);
	if (!c)
		return -ENOMEM;
	pthread_mutex_lock(&in->lock);
	struct iconf *old = in->conf;
	in->conf = c;
	pthread_mutex_unlock(&in->lock);
	iconf_unref(old);
	return 0;
}

void intake_service_stats(struct service *svc, struct intake_stats *ret)
{
	struct intake *in = service_arg(svc);
	ret->messages = atomic_load(&in->messages);
	ret->recipients = atomic_load(&in->recipients);
	ret->bytes = atomic_load(&in->bytes);
	ret->refused = atomic_load(&in->refused);
	ret->rejected = atomic_load(&in->rejected);
	ret->bare_eol = atomic_load(&in->bare_eol);
	ret->bare_command = atomic_load(&in->bare_command);
}
