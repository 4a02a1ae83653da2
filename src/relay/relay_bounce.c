/*
 * relay_bounce -- delivery status notifications (RFC 3464) on the relay's thread: one DSN
 * per message for its failed recipients, or a delay notice for those still waiting,
 * committed to the queue like any message (the commit's answer comes back through the
 * mailbox).  A bounce of the relay's own DSN is never made (no loops).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "dsn.h"
#include "relay_int.h"
#include "util.h"

/* ---- bounces ---- */

struct dsn_done_ctx {
	struct relay *r;
	char id[QUEUE_ID_LEN + 1];
	bool delayed;
};

static void on_dsn_committed(void *arg, int rc)
{
	struct dsn_done_ctx *d = arg;
	struct mb_item *it = calloc(1, sizeof(*it));
	if (it) {
		it->kind = MB_DSN_DONE;
		it->rc = rc;
		it->delayed = d->delayed;
		snprintf(it->id, sizeof(it->id), "%s", d->id);
		if (base_post(d->r, it) < 0)
			free(it);
	}
	free(d);
}

struct fail_info {
	char mta[256];
	char dsn[16];
	char reply[1100];
	uint64_t ts;
};

/* The value of " key=" in an attempt log line, up to the next space; "-" is empty. */
static void log_field(const char *line, const char *key, char *out, size_t len)
{
	const char *q = strstr(line, key);
	out[0] = '\0';
	if (!q)
		return;
	q += strlen(key);
	size_t n = strcspn(q, " ");
	snprintf(out, len, "%.*s", (int)n, q);
	if (strcmp(out, "-") == 0)
		out[0] = '\0';
}

/* The last line with status (failed, deferred), or with status2 (relayed, or NULL), of
 * each recipient, from the attempt log: the details of the report (a recipient without
 * one is still reported, from its status byte). */
static void read_failures(struct relay *r, struct rmsg *m, struct fail_info *fi,
			  const char *status, const char *status2)
{
	char want[32], want2[32];
	snprintf(want, sizeof(want), " status=%s ", status);
	snprintf(want2, sizeof(want2), " status=%s ", status2 ? status2 : status);
	struct buf lb;
	buf_init(&lb, 8u << 20);
	if (queue_log_read(r->qd, m->id, &lb, 8u << 20) < 0 || lb.len == 0) {
		buf_done(&lb);
		return;
	}
	buf_append_byte(&lb, 0);
	for (char *line = lb.ptr, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		char *p = strstr(line, " rcpt=");
		bool second = p && status2 && strstr(line, want2);
		if (!p || (!second && !strstr(line, want)))
			continue;
		size_t i = strtoul(p + 6, NULL, 10);
		if (i >= m->nrcpt)
			continue;
		struct fail_info *f = &fi[i];
		f->ts = strtoull(line + 3, NULL, 10);
		log_field(line, " mta=", f->mta, sizeof(f->mta));
		log_field(line, " dsn=", f->dsn, sizeof(f->dsn));
		const char *q = strstr(line, " reply=");
		snprintf(f->reply, sizeof(f->reply), "%s", q ? q + 7 : "");
	}
	buf_done(&lb);
}

void bounce_done(struct relay *r, struct rmsg *m)
{
	if (msg_open_file(r, m) < 0) {
		msg_recheck_later(r, m);
		return;
	}
	queue_set_control(r->q, m->qm, QUEUE_CTL_BOUNCE, 'S');
	m->bounce = 'S';
	enum queue_msg_state st;
	int rc = queue_settle(r->q, m->qm, &st);
	m->bouncing = false;
	if (rc == 0 && st == QUEUE_MSG_FINISHED) {
		base_logf(r, LOG_LEVEL_INFO, "qid=%s removed: finished", m->id);
		msg_free(r, m);
	} else {
		msg_close_file(r, m);
	}
}

/*
 * Queue the DSN of m: of its failed recipients (all of them at once: one DSN per
 * message), or, delayed, a delay notice for the recipients still waiting.
 */
/* A DSN that could not be queued is tried again at the next sweep: a bounce through
 * bounce_check(), a delay notice by the notices' walk going back to it. */
static void retry_later(struct relay *r, struct rmsg *m, bool delayed)
{
	if (!delayed)
		msg_recheck_later(r, m);
	else /* the walk had just passed it */
		r->warned_upto = TAILQ_PREV(m, rmsg_list, link);
}

/*
 * What recipient i gets in the DSN being made, if anything: a delay notice goes to those
 * still waiting, a bounce to the failed ones and (not for mail from <>) the relayed
 * ones, each as its NOTIFY asks (RFC 3461 4.1).
 */
static bool rcpt_reported(const struct rmsg *m, size_t i, bool delayed, enum dsn_action *ret)
{
	const struct rrcpt *rr = &m->r[i];
	if (delayed) {
		*ret = DSN_DELAYED;
		return (rr->status == QUEUE_TODO || rr->status == QUEUE_UNCERTAIN) &&
		       rcpt_notify_wants(rr, QUEUE_NOTIFY_DELAY);
	}
	if (rr->status == QUEUE_FAILED) {
		*ret = DSN_FAILED;
		return rcpt_notify_wants(rr, QUEUE_NOTIFY_FAILURE);
	}
	*ret = DSN_RELAYED;
	return rr->status == QUEUE_RELAYED && *m->sender;
}

void bounce_start(struct relay *r, struct rmsg *m, bool delayed)
{
	const struct relay_conf *c = &r->crt->conf;
	const char *to = m->sender;
	size_t nf = 0;
	enum dsn_action act;
	for (size_t i = 0; i < m->nrcpt; i++)
		nf += rcpt_reported(m, i, delayed, &act);
	if (nf == 0) {
		/* NOTIFY asked for no notice of this kind from any of them */
		if (delayed)
			m->warned = true;
		else
			bounce_done(r, m);
		return;
	}
	if (!*to && delayed) {
		/* no delay notice for mail from <>, not even to the postmaster */
		m->warned = true;
		return;
	}
	if (!*to) {
		if (!c->postmaster || m->is_dsn) {
			base_logf(r, LOG_LEVEL_NOTICE, "qid=%s bounce not sent: the sender is null <>%s; "
			     "failed recipients are in the attempt log", m->id,
			     m->is_dsn ? " (it is a bounce itself)" : "");
			r->st.dsn_skipped++;
			bounce_done(r, m);
			return;
		}
		to = c->postmaster;
	}
	if (msg_open_file(r, m) < 0) {
		retry_later(r, m, delayed);
		return;
	}
	struct fail_info *fi = calloc(m->nrcpt, sizeof(*fi));
	struct dsn_rcpt *dr = calloc(nf ? nf : 1, sizeof(*dr));
	struct msg_body body = { 0 };
	body.part = calloc(m->qm->ix.nbody ? m->qm->ix.nbody : 1, sizeof(*body.part));
	struct buf out;
	buf_init(&out, DSN_MAX);
	int rc = fi && dr && body.part ? 0 : -ENOMEM;
	if (rc == 0) {
		read_failures(r, m, fi, delayed ? "deferred" : "failed", delayed ? NULL : "relayed");
		size_t k = 0;
		for (size_t i = 0; i < m->nrcpt && k < nf; i++) {
			if (!rcpt_reported(m, i, delayed, &act))
				continue;
			dr[k++] = (struct dsn_rcpt){
				.addr = str_cstr(m->addr[i]),
				.action = act,
				.orcpt = m->qm->ix.rcpt[i].orcpt,
				.status = str_cstr(fi[i].dsn),
				.remote_mta = str_cstr(fi[i].mta),
				.diagnostic = str_cstr(fi[i].reply),
				.last_attempt_us = fi[i].ts,
			};
		}
		rc = queue_file_body(m->qm->map, m->qm->size, &m->qm->ix, msg_body_collect, &body);
		struct dsn_info info = {
			.reporting_mta = str_cstr(c->hostname),
			.sender = str_cstr(to),
			.queue_id = str_cstr(m->id),
			.envid = m->qm->ix.env.envid,
			.full = m->qm->ix.env.ret == QUEUE_RET_FULL,
			.arrival_us = m->arrival_us,
			.now_us = relay_now(r) / 1000,
			.boundary_seed = str_cstr(m->id),
		};
		if (rc == 0)
			rc = dsn_format(&info, dr, k, body.part, body.n, &out);
	}
	struct queue_new *qn = NULL;
	if (rc == 0) {
		struct queue_envelope env = {
			.sender = STR_NULL,
			.client = str_cstr(DSN_CLIENT),
			.helo = str_cstr(c->hostname),
		};
		/* an address that needs SMTPUTF8, and 8-bit original headers (dsn.h): say so
		 * when sending */
		for (const char *p = to; *p; p++)
			if ((unsigned char)*p >= 0x80) {
				env.flags |= QUEUE_SMTPUTF8;
				break;
			}
		for (size_t i = 0; i < out.len; i++)
			if ((unsigned char)out.ptr[i] >= 0x80) {
				env.flags |= QUEUE_8BITMIME;
				break;
			}
		rc = queue_new_begin(r->q, &env, &qn);
		if (rc == 0)
			rc = queue_new_rcpt(qn, str_cstr(to));
		if (rc == 0)
			rc = queue_new_body(qn, str_make(out.ptr, out.len));
	}
	if (rc == 0) {
		struct dsn_done_ctx *d = calloc(1, sizeof(*d));
		if (!d) {
			rc = -ENOMEM;
		} else {
			d->r = r;
			d->delayed = delayed;
			snprintf(d->id, sizeof(d->id), "%s", m->id);
			char dsn_id[QUEUE_ID_LEN + 1];
			snprintf(dsn_id, sizeof(dsn_id), "%s", queue_new_id(qn));
			rc = queue_new_commit(qn, on_dsn_committed, d);
			qn = NULL;
			if (rc < 0) {
				free(d);
			} else {
				m->bouncing = true;
				base_logf(r, LOG_LEVEL_INFO, "qid=%s %s queued as %s to <%.200s>: %zu %s "
				     "recipient(s)", m->id, delayed ? "delay notice" : "bounce", dsn_id,
				     to, nf, delayed ? "waiting" : "failed");
			}
		}
	}
	queue_new_abort(qn);
	if (rc < 0) {
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s %s cannot be queued: %s (tried again later)",
			  m->id, delayed ? "delay notice" : "bounce", strerror(-rc));
		retry_later(r, m, delayed);
	}
	buf_done(&out);
	free(body.part);
	free(dr);
	free(fi);
	msg_close_file(r, m);
}

/* ---- the end of a message ---- */

/* msg_check_done(), and m's bounce started when it is due.  m may be freed. */
void bounce_check(struct relay *r, struct rmsg *m)
{
	if (msg_check_done(r, m))
		bounce_start(r, m, false);
}

/*
 * Every recipient of m still to do fails now with dsn and text (the end of its
 * lifetime, or the operator's `sluice queue bounce`), and its bounce follows.  m may be
 * freed.  -EBUSY while a transaction holds some of its recipients.
 */
int bounce_fail_pending(struct relay *r, struct rmsg *m, const char *dsn, const char *text)
{
	if (m->busy || m->bouncing)
		return -EBUSY;
	int e = msg_open_file(r, m);
	if (e < 0)
		return e;
	struct outcome o;
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_FAIL, .dsn = dsn }, &o);
	bool any = false;
	for (size_t i = 0; i < m->nrcpt; i++) {
		char s = m->r[i].status;
		if (s == QUEUE_TODO || s == QUEUE_UNCERTAIN) {
			msg_rcpt_settle(r, m, i, m->r[i].lane, "", &o, text);
			any = true;
		}
	}
	if (any)
		flush_post(r, m);
	msg_close_file(r, m);
	bounce_check(r, m); /* after the flush */
	return 0;
}

void bounce_by_operator(struct relay *r, struct rmsg *m)
{
	m->bounce_asked = true;
	if (m->busy || m->bouncing)
		return; /* the transaction's end or the notice's commit comes back here */
	m->bounce_asked = false;
	bounce_fail_pending(r, m, "5.0.0", "returned by the administrator");
}
