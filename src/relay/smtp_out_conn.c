/*
 * smtp_out_conn -- the floor of the SMTP client (smtp_out.h, smtp_out_int.h): what every
 * room does to a connection, and how its work ends.  The stage of each phase, the timer
 * for what the connection waits for, commands into the output; closing the I/O, and the
 * reports: smtp_out_report() (the transaction's done(), once), smtp_out_fail() (the
 * connection takes no further transaction) and the relay's ready(failure).  It calls no
 * other room: the session (smtp_out.c), TLS and AUTH (smtp_out_tls.c) and the transaction
 * (smtp_out_tx.c) call it.  The phases and the invariants are in smtp_out.c.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <gsasl.h>

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

/* The timer for QUIT's reply (or, while a reply is awaited, for the QUIT to follow). */
void smtp_out_arm_quit(struct smtp_out *c)
{
	arm_ms(c, timeout_ms(c, SMTP_STAGE_QUIT));
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

void smtp_out_close_io(struct smtp_out *c)
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

/* Close, and free the struct when the running callback returns (the public functions,
 * which may run outside any callback, free it themselves when none runs). */
void smtp_out_release(struct smtp_out *c)
{
	smtp_out_close_io(c);
	c->msg = NULL;
	c->done = NULL;
	c->free_pending = true;
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
void smtp_out_report_ready_failure(struct smtp_out *c, enum smtp_out_stage st, int error,
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
		smtp_out_close_io(c);
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
		smtp_out_report_ready_failure(c, st, error, why, reply);
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
