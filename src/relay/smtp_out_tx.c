/*
 * smtp_out_tx -- one transaction of the SMTP client (smtp_out.h): MAIL FROM with its
 * parameters, the RCPTs (pipelined when offered), DATA and the body copied piece by
 * piece as the output drains (dots stuffed), the final dot, and the replies to each,
 * which the session (smtp_out.c) reads and hands over (see smtp_out.c for the phases and
 * the invariants).  A refused transaction ends with RSET, whose reply is the session's.
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

#include "smtp.h"
#include "smtp_out_int.h"
#include "util.h"

/* ---- the transaction ---- */

/* Addresses go into command lines: no line breaks, NUL or brackets, bounded. */
bool smtp_out_addr_ok(struct str a)
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

/* " KEY=" and v xtext-encoded, when that is at most max characters; else nothing. */
static int add_xtext(struct evbuffer *o, const char *key, struct str prefix, struct str v,
		     size_t max)
{
	char x[3 * SMTP_DSN_ORCPT_MAX];
	size_t n;
	if (v.len > SMTP_DSN_ORCPT_MAX || smtp_xtext_encode(v, x, sizeof(x), &n) < 0 ||
	    prefix.len + n > max)
		return 0; /* XXX dropped: the next hop would refuse it, and it is only a hint */
	if (evbuffer_add_printf(o, " %s=%.*s%.*s", key, (int)prefix.len, prefix.ptr, (int)n, x) < 0)
		return -ENOMEM;
	return 0;
}

/* The DSN parameters of RCPT i (RFC 3461 4.1, 4.2), when the server offers DSN. */
static int add_rcpt_dsn(struct smtp_out *c, struct evbuffer *o, size_t i)
{
	const struct smtp_out_rcpt_dsn *d = c->msg->rcpt_dsn ? &c->msg->rcpt_dsn[i] : NULL;
	if (!d || !(c->ehlo.ext & SMTP_EHLO_DSN))
		return 0;
	if (d->notify) {
		static const struct { unsigned bit; const char *word; } words[] = {
			{ SMTP_NOTIFY_NEVER, "NEVER" }, { SMTP_NOTIFY_SUCCESS, "SUCCESS" },
			{ SMTP_NOTIFY_FAILURE, "FAILURE" }, { SMTP_NOTIFY_DELAY, "DELAY" },
		};
		char v[40];
		size_t n = 0;
		for (size_t k = 0; k < sizeof(words) / sizeof(words[0]); k++)
			if (d->notify & words[k].bit)
				n += (size_t)snprintf(v + n, sizeof(v) - n, "%s%s", n ? "," : "",
						      words[k].word);
		if (n && evbuffer_add_printf(o, " NOTIFY=%s", v) < 0)
			return -ENOMEM;
	}
	const char *semi = d->orcpt.len ? memchr(d->orcpt.ptr, ';', d->orcpt.len) : NULL;
	if (semi && semi > d->orcpt.ptr) {
		size_t tl = (size_t)(semi - d->orcpt.ptr) + 1;
		/* the addr-type goes as it is (the loader checked it an atom): never a byte
		 * that would end or split the command */
		for (size_t k = 0; k + 1 < tl; k++)
			if (d->orcpt.ptr[k] <= ' ' || d->orcpt.ptr[k] > '~' || d->orcpt.ptr[k] == '=')
				return 0;
		return add_xtext(o, "ORCPT", str_make(d->orcpt.ptr, tl),
				 str_make(semi + 1, d->orcpt.len - tl), SMTP_DSN_ORCPT_MAX);
	}
	return 0;
}

static int send_rcpt(struct smtp_out *c, size_t i)
{
	struct evbuffer *o = smtp_out_out_buf(c);
	if (add_path(o, "RCPT TO:<", c->msg->rcpt[i]) < 0 || add_rcpt_dsn(c, o, i) < 0 ||
	    evbuffer_add(o, "\r\n", 2) < 0)
		return -ENOMEM;
	return 0;
}

/* What ends a transaction before anything is sent: 0, or the error with *why. */
int smtp_out_tx_check(const struct smtp_out *c, const struct smtp_out_msg *m, const char **why)
{
	if (c->ehlo.size_max && m->size > c->ehlo.size_max) {
		*why = "the message is larger than the server's SIZE";
		return -EMSGSIZE;
	}
	if (m->smtputf8 && !(c->ehlo.ext & SMTP_EHLO_SMTPUTF8)) {
		*why = "the message needs SMTPUTF8 and the server does not offer it";
		return -EPROTONOSUPPORT;
	}
	return 0;
}

/*
 * The reverse-path to give: the null one when the server does not offer DSN and every
 * recipient of the transaction asked NOTIFY=NEVER (RFC 3461 6.2, as sendmail does): the
 * server cannot be told NEVER, and a bounce it made would reach the sender who asked for
 * none.  A transaction that mixes NEVER with other recipients keeps the sender.
 */
static struct str reverse_path(const struct smtp_out *c, const struct smtp_out_msg *m)
{
	if ((c->ehlo.ext & SMTP_EHLO_DSN) || !m->rcpt_dsn || m->nrcpt == 0)
		return m->sender;
	for (size_t i = 0; i < m->nrcpt; i++)
		if (m->rcpt_dsn[i].notify != SMTP_NOTIFY_NEVER)
			return m->sender;
	return STR_NULL;
}

/* MAIL, and every RCPT with PIPELINING, into the output; the phase becomes MAIL.  0 or
 * -ENOMEM (part of a command may be in the output then: the connection is lost). */
int smtp_out_tx_write_mail(struct smtp_out *c)
{
	const struct smtp_out_msg *m = c->msg;
	c->active = true;
	c->rcpt_got = c->rcpt_ok = 0;
	c->mail_failed = false;
	struct evbuffer *o = smtp_out_out_buf(c);
	int r = add_path(o, "MAIL FROM:<", reverse_path(c, m));
	if (r == 0 && (c->ehlo.ext & SMTP_EHLO_SIZE))
		r = evbuffer_add_printf(o, " SIZE=%llu", (unsigned long long)m->size) < 0 ? -ENOMEM : 0;
	/* XXX an 8-bit message to a server without 8BITMIME goes as it is (no conversion to
	 * 7 bit, RFC 6152 3): nearly every server takes it */
	if (r == 0 && m->eightbit && (c->ehlo.ext & SMTP_EHLO_8BITMIME))
		r = evbuffer_add(o, " BODY=8BITMIME", 14);
	if (r == 0 && m->smtputf8)
		r = evbuffer_add(o, " SMTPUTF8", 9);
	if (r == 0 && (c->ehlo.ext & SMTP_EHLO_DSN)) {
		if (m->ret == SMTP_RET_FULL || m->ret == SMTP_RET_HDRS)
			r = evbuffer_add_printf(o, " RET=%s", m->ret == SMTP_RET_FULL ? "FULL" : "HDRS") < 0
				    ? -ENOMEM : 0;
		if (r == 0 && m->envid.len)
			r = add_xtext(o, "ENVID", STR_NULL, m->envid, SMTP_DSN_ENVID_MAX);
	}
	if (r == 0)
		r = evbuffer_add(o, "\r\n", 2);
	if (r == 0 && (c->ehlo.ext & SMTP_EHLO_PIPELINING))
		for (size_t i = 0; i < m->nrcpt && r == 0; i++)
			r = send_rcpt(c, i);
	if (r < 0)
		return -ENOMEM;
	c->phase = PH_MAIL;
	smtp_out_arm(c);
	return 0;
}

void smtp_out_start_transaction(struct smtp_out *c)
{
	const char *why = NULL;
	int e = smtp_out_tx_check(c, c->msg, &why);
	if (e < 0) {
		c->active = true;
		smtp_out_report(c, SMTP_STAGE_MAIL, e, why, NULL);
		return;
	}
	if (smtp_out_tx_write_mail(c) < 0)
		smtp_out_fail_nomem(c);
}

/* A transaction refused at MAIL, RCPT or DATA: RSET (the connection stays for the next
 * one), then smtp_out_report(). */
static void end_with_rset(struct smtp_out *c, enum smtp_out_stage st, const struct smtp_reply *r)
{
	struct smtp_reply copy = *r; /* r may be c->end_reply */
	if (smtp_out_send_cmd(c, "RSET") < 0) {
		smtp_out_fail_nomem(c);
		return;
	}
	c->phase = PH_RSET;
	smtp_out_arm(c);
	smtp_out_report(c, st, 0, "", &copy);
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
int smtp_out_body_fill(struct smtp_out *c)
{
	const struct smtp_out_msg *m = c->msg;
	struct evbuffer *o = smtp_out_out_buf(c);
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
	if (smtp_out_body_fill(c) < 0) {
		smtp_out_fail_nomem(c);
		return;
	}
	smtp_out_arm(c);
}

static void on_rcpt_reply(struct smtp_out *c, const struct smtp_reply *r)
{
	const struct smtp_out_msg *m = c->msg;
	if (!smtp_out_is_2xx(r) && !smtp_out_is_refusal(r)) {
		smtp_out_fail_proto(c, "an unexpected reply to RCPT");
		return;
	}
	size_t i = c->rcpt_got++;
	if (!c->mail_failed) {
		c->rcpt[i] = *r;
		if (smtp_out_is_2xx(r))
			c->rcpt_ok++;
		else
			c->end_reply = *r;
	}
	if (c->rcpt_got < m->nrcpt) {
		if (!(c->ehlo.ext & SMTP_EHLO_PIPELINING) && send_rcpt(c, c->rcpt_got) < 0) {
			smtp_out_fail_nomem(c);
			return;
		}
		smtp_out_arm(c);
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
	if (smtp_out_send_cmd(c, "DATA") < 0) {
		smtp_out_fail_nomem(c);
		return;
	}
	c->phase = PH_DATA;
	smtp_out_arm(c);
}

/* A reply in the transaction's phases (PH_MAIL to PH_DOT), dispatched by the session
 * (smtp_out.c). */
void smtp_out_tx_on_reply(struct smtp_out *c, const struct smtp_reply *r)
{
	switch (c->phase) {
	case PH_MAIL:
		if (!smtp_out_is_2xx(r) && !smtp_out_is_refusal(r)) {
			smtp_out_fail_proto(c, "an unexpected reply to MAIL");
			return;
		}
		if (c->ehlo.ext & SMTP_EHLO_PIPELINING) {
			/* the RCPTs' replies follow; after a refused MAIL they say nothing about
			 * the recipients and are not reported */
			if (!smtp_out_is_2xx(r)) {
				c->mail_failed = true;
				c->end_reply = *r;
			}
			c->phase = PH_RCPT;
			smtp_out_arm(c);
			return;
		}
		if (!smtp_out_is_2xx(r)) {
			end_with_rset(c, SMTP_STAGE_MAIL, r);
			return;
		}
		if (send_rcpt(c, 0) < 0) {
			smtp_out_fail_nomem(c);
			return;
		}
		c->phase = PH_RCPT;
		smtp_out_arm(c);
		return;
	case PH_RCPT:
		on_rcpt_reply(c, r);
		return;
	case PH_DATA:
		if (r->code == 354)
			start_body(c);
		else if (smtp_out_is_refusal(r))
			end_with_rset(c, SMTP_STAGE_DATA, r);
		else
			smtp_out_fail_proto(c, "an unexpected reply to DATA");
		return;
	case PH_BODY:
		if (!c->body_done) {
			/* a reply before the end of the data: the server stopped reading it, and
			 * the rest of our stream would be taken for commands */
			if (smtp_out_is_refusal(r))
				smtp_out_fail(c, SMTP_STAGE_DATA, 0, "", r, true);
			else
				smtp_out_fail_proto(c, "a reply before the end of the data");
			return;
		}
		/* the dot was queued, and this is its reply */
		__attribute__((fallthrough));
	case PH_DOT:
		if (!smtp_out_is_2xx(r) && !smtp_out_is_refusal(r)) {
			smtp_out_fail_proto(c, "an unexpected reply after the data");
			return;
		}
		c->ntrans++;
		c->phase = PH_READY;
		evtimer_del(c->timer);
		smtp_out_report(c, SMTP_STAGE_DOT, 0, "", r);
		return;
	default:
		smtp_out_fail_proto(c, "a reply when none was expected");
		return;
	}
}
