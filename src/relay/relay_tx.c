/*
 * relay_tx -- one transaction on the relay's thread: which recipients of which message a
 * lane sends next, the budget taken for it, and each recipient's outcome from the
 * server's replies (delivered, failed, deferred, uncertain, or the lane's throttling,
 * which changes no recipient).
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
#include "smtp.h"
#include "util.h"

/* ---- transactions ---- */

static void tx_done(void *arg, struct smtp_out *c, const struct smtp_out_result *res);

struct tx *tx_free(struct tx *t)
{
	if (t) {
		if (t->parked)
			TAILQ_REMOVE(&t->lane->r->hist_wait, t, hist_link);
		free(t->idx);
		free(t->addrs);
		free(t->dsn);
		free(t->body.part);
		free(t);
	}
	return NULL;
}

/*
 * A transaction about to send: true when it must wait for the history to be flushed (it
 * is parked, and tx_hist_synced() sends it once its line is on disk), false when it may
 * go now (without the flusher the history was flushed here).
 */
static bool tx_must_wait(struct relay *r, struct tx *t)
{
	if (!hist_pending(r))
		return false;
	t->hist_seq = r->hist_seq;
	t->parked = true;
	TAILQ_INSERT_TAIL(&r->hist_wait, t, hist_link);
	hist_sync(r);
	if (r->hist_synced < t->hist_seq)
		return true;
	TAILQ_REMOVE(&r->hist_wait, t, hist_link);
	t->parked = false;
	return false;
}

/*
 * Start a transaction on the idle connection rc.  budget_taken: a shared lane's budget
 * was already granted for one send.  Returns false when nothing was started and the
 * lane must wait (its timer is armed), true otherwise.
 */
bool tx_start(struct lane *l, struct lane_conn *rc, uint64_t now, bool budget_taken)
{
	struct relay *r = l->r;
	const struct route_conf *conf = l->rt->conf;
	size_t max = conf->recipients_per_message ? conf->recipients_per_message : 100;
	struct tx *t = calloc(1, sizeof(*t));
	if (!t || !(t->idx = calloc(max, sizeof(*t->idx)))) {
		tx_free(t);
		return false;
	}
	uint64_t next = UINT64_MAX;
	struct lane_item *it = lane_pick(l, now, max, t->idx, &t->n, &next);
	if (!it) {
		tx_free(t);
		lane_arm(l, next == UINT64_MAX ? UINT64_MAX : next - now);
		return false;
	}
	if (!budget_taken) {
		uint64_t want = conf->count == ROUTE_COUNT_RECIPIENTS ? t->n : 1, wait = 0;
		uint64_t got = lane_budget_take(&l->b, want, now, &wait);
		if (got == 0) {
				tx_free(t);
			lane_arm(l, wait);
			return false;
		}
		for (uint64_t k = 0; k < got; k++)
			hist_append(r, l->name, now);
		t->t_counted = now;
		t->ncounted = got;
		if (conf->count == ROUTE_COUNT_RECIPIENTS)
			t->n = got;
	}
	struct rmsg *m = it->m;
	if (msg_open_file(r, m) < 0) {
		/* gone (deleted behind the relay's back) or unreadable: forget it */
		tx_free(t);
		if (m->busy == 0)
			msg_free(r, m);
		else
			m->deleted = true;
		return true;
	}
	t->body.part = calloc(m->qm->ix.nbody ? m->qm->ix.nbody : 1, sizeof(*t->body.part));
	t->addrs = calloc(t->n, sizeof(*t->addrs));
	t->dsn = calloc(t->n, sizeof(*t->dsn));
	if (!t->body.part || !t->addrs || !t->dsn ||
	    queue_file_body(m->qm->map, m->qm->size, &m->qm->ix, msg_body_collect, &t->body) < 0) {
		tx_free(t);
		msg_close_file(r, m);
		return false;
	}
	for (size_t k = 0; k < t->n; k++) {
		t->addrs[k] = str_cstr(m->addr[t->idx[k]]);
		/* the queue's NOTIFY bits are the codec's (intake_service.c checks) */
		t->dsn[k] = (struct smtp_out_rcpt_dsn){ .notify = m->r[t->idx[k]].notify,
							.orcpt = m->qm->ix.rcpt[t->idx[k]].orcpt };
		msg_rcpt_take(m, t->idx[k]);
	}
	/* the rest of the message in this lane: still due, waiting, or nothing */
	msg_item_schedule(r, it);
	m->busy++;
	t->m = m;
	t->lane = l;
	t->rc = rc;
	t->msg = (struct smtp_out_msg){
		.sender = str_cstr(m->sender),
		.rcpt = t->addrs,
		.nrcpt = t->n,
		.body = t->body.part,
		.nbody = t->body.n,
		.size = m->size,
		.eightbit = (m->flags & QUEUE_8BITMIME) != 0,
		.smtputf8 = (m->flags & QUEUE_SMTPUTF8) != 0,
		.ret = m->qm->ix.env.ret == QUEUE_RET_FULL ? SMTP_RET_FULL :
		       m->qm->ix.env.ret == QUEUE_RET_HDRS ? SMTP_RET_HDRS : SMTP_RET_NONE,
		.envid = m->qm->ix.env.envid,
		.rcpt_dsn = t->dsn,
	};
	evtimer_del(rc->idle_timer);
	rc->st = RC_BUSY;
	l->nidle--;
	rc->tx = t;
	l->transactions++;
	r->st.transactions++;
	if (!tx_must_wait(r, t))
		tx_send(t);
	return true;
}

/* The history is on disk up to r->hist_synced: the transactions parked for it go. */
void tx_hist_synced(struct relay *r)
{
	struct tx *t;
	while ((t = TAILQ_FIRST(&r->hist_wait)) && t->hist_seq <= r->hist_synced) {
		TAILQ_REMOVE(&r->hist_wait, t, hist_link);
		t->parked = false;
		tx_send(t);
	}
	if (!TAILQ_EMPTY(&r->hist_wait))
		hist_sync(r);
}

/*
 * The transaction's first command goes out: its send is in the history on disk.  When the
 * flush took more than half the route's guard, the next hop counts the send later than
 * the lane did, and could see one more than the rate once the lane's window moves on: the
 * send is counted again at the time it goes out (in memory, and by a new line of the
 * history, flushed like the first; the first stays, and only holds the budget longer
 * after a restart), up to TX_RECOUNTS times; then it goes, and a line says so.
 */
#define TX_RECOUNTS 3

void tx_send(struct tx *t)
{
	struct lane *l = t->lane;
	struct relay *r = l->r;
	if (t->t_counted && l->rt) {
		uint64_t now = relay_now(r);
		uint64_t half_guard = (uint64_t)l->rt->conf->guard_ms * 500000u;
		if (now > t->t_counted + half_guard) {
			if (t->recounts < TX_RECOUNTS) {
				for (uint64_t k = 0; k < t->ncounted; k++) {
					lane_budget_restamp(&l->b, t->t_counted, now);
					hist_append(r, l->name, now);
				}
				t->t_counted = now;
				t->recounts++;
				if (tx_must_wait(r, t))
					return;
			} else if (now > r->late_logged_ns + 10000000000ull) {
				r->late_logged_ns = now;
				base_logf(r, LOG_LEVEL_WARNING,
					  "lane=%s a send went out %" PRIu64 " ms after it was counted, "
					  "more than half the route's guard (%" PRId64 " ms): its next hop may "
					  "count one more than the rate (flushes of %s/%s are slow: raise "
					  "guard)", l->name, (now - t->t_counted) / 1000000,
					  l->rt->conf->guard_ms, r->crt->conf.state_dir, HISTORY_FILE);
			}
		}
	}
	struct lane_conn *rc = t->rc;
	base_logf(r, LOG_LEVEL_DEBUG, "qid=%s lane=%s mta=%s transaction: %zu recipient(s)",
		  t->m->id, l->name, smtp_out_peer(rc->c), t->n);
	int e = smtp_out_send(rc->c, &t->msg, tx_done, t);
	if (e < 0) {
		struct smtp_out_result res = { .stage = SMTP_STAGE_MAIL, .error = e,
					       .why = "the connection cannot be used" };
		tx_done(t, rc->c, &res);
	}
}

/*
 * Recipient k of t learned its fate: cr classified its reply rep (text: the reply, for
 * the logs).  The lane's throttling is kept in sig (a suspension over a slow-down) for
 * the lane to act on once every recipient is done.
 */
static void rcpt_outcome(struct relay *r, struct tx *t, size_t k, const struct classify_result *cr,
			 const struct smtp_reply *rep, const char *text, const char *mta,
			 struct classify_result *sig, char *sigtext, size_t siglen)
{
	size_t i = t->idx[k];
	struct outcome o;
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = cr, .rep = rep,
					     .relayed = t->m->r[i].relayed }, &o);
	msg_rcpt_settle(r, t->m, i, t->lane, mta, &o, text);
	if (o.lane_signal && sig->verdict != CLASSIFY_SUSPEND) {
		*sig = *cr;
		snprintf(sigtext, siglen, "%s", text);
	}
}

/* Recipient k of t was not tried: due again at once, nothing said. */
static void rcpt_not_tried(struct relay *r, struct tx *t, size_t k)
{
	struct outcome o;
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_NOT_TRIED }, &o);
	msg_rcpt_settle(r, t->m, t->idx[k], t->lane, "", &o, NULL);
}

/* Recipient k's RCPT reply (code 0: none). */
static const struct smtp_reply *rcpt_reply(const struct smtp_out_result *res, size_t k)
{
	static const struct smtp_reply none;
	return res->rcpt ? &res->rcpt[k] : &none;
}

static void tx_done(void *arg, struct smtp_out *c, const struct smtp_out_result *res)
{
	struct tx *t = arg;
	struct lane_conn *rc = t->rc;
	struct lane *l = t->lane;
	struct rmsg *m = t->m;
	struct relay *r = rc->r;
	const struct relay_conf *conf = &r->crt->conf;
	char mta[300];
	snprintf(mta, sizeof(mta), "%s", c ? smtp_out_peer(c) : "-");
	for (char *p = mta; *p; p++)
		if (*p == ' ')
			*p = '_';
	char text[1200];
	struct classify_result sig = { 0 };
	char sigtext[1200] = "";
	bool success = false;
	unsigned prior = c ? smtp_out_transactions(c) : 0;
	struct signal_once once = { 0 };

	if (res->error == 0 && res->stage == SMTP_STAGE_DOT && res->reply.code / 100 == 2) {
		/* the message went: each recipient the server took is delivered */
		success = true;
		for (size_t k = 0; k < t->n; k++) {
			const struct smtp_reply *rep = rcpt_reply(res, k);
			struct classify_result cr;
			if (rep->code / 100 == 2) {
				cr = (struct classify_result){ .verdict = CLASSIFY_OK, .for_ms = -1 };
				base_reply_text(res, &res->reply, text, sizeof(text));
			} else {
				signal_classify(l, rc->cls, SMTP_STAGE_RCPT, 0, rep, &once, &cr);
				base_reply_text(res, rep, text, sizeof(text));
			}
			/* RFC 3461 6.2.2: NOTIFY=SUCCESS that the next hop cannot carry on is
			 * answered here, with a "relayed" notice once the message is done */
			struct rrcpt *rr = &m->r[t->idx[k]];
			rr->relayed = cr.verdict == CLASSIFY_OK && !res->dsn &&
				      (rr->notify & QUEUE_NOTIFY_SUCCESS) && *m->sender;
			rcpt_outcome(r, t, k, &cr, cr.verdict == CLASSIFY_OK ? &res->reply : rep, text,
				     mta, &sig, sigtext, sizeof(sigtext));
		}
	} else if (res->stage == SMTP_STAGE_DOT && res->error < 0) {
		/* the uncertain window: the server may have taken the message */
		base_reply_text(res, NULL, text, sizeof(text));
		for (size_t k = 0; k < t->n; k++) {
			const struct smtp_reply *rep = rcpt_reply(res, k);
			size_t i = t->idx[k];
			if (rep->code / 100 != 2) {
				struct classify_result cr;
				char rt[1200];
				signal_classify(l, rc->cls, SMTP_STAGE_RCPT, 0, rep, &once, &cr);
				base_reply_text(res, rep, rt, sizeof(rt));
				rcpt_outcome(r, t, k, &cr, rep, rt, mta, &sig, sigtext, sizeof(sigtext));
				continue;
			}
			struct outcome o;
			outcome_decide(&(struct outcome_in){
					       .ev = OUTCOME_UNCERTAIN,
					       .hold = conf->uncertain == RELAY_UNCERTAIN_HOLD }, &o);
			msg_rcpt_settle(r, m, i, l, mta, &o, text);
		}
		if (conf->uncertain == RELAY_UNCERTAIN_HOLD) {
			/* written, so that `sluice queue` shows it and a restart keeps it */
			m->held = true;
			queue_set_control(r->q, m->qm, QUEUE_CTL_HOLD, 'H');
			m->dirty = true;
		}
	} else if (res->error == 0 && res->reply.code && res->stage >= SMTP_STAGE_RCPT) {
		/* refused at RCPT (every recipient), DATA or the final dot */
		struct classify_result whole;
		/* at RCPT the whole's reply is the last recipient's, classified (and counted
		 * toward a threshold) with it below */
		if (res->stage == SMTP_STAGE_RCPT)
			classify_reply(rc->cls, res->stage, 0, &res->reply, &whole);
		else
			signal_classify(l, rc->cls, res->stage, 0, &res->reply, &once, &whole);
		char wtext[1200];
		base_reply_text(res, &res->reply, wtext, sizeof(wtext));
		for (size_t k = 0; k < t->n; k++) {
			const struct smtp_reply *rep = rcpt_reply(res, k);
			struct classify_result cr;
			if (res->stage != SMTP_STAGE_RCPT && rep->code / 100 == 2) {
				rcpt_outcome(r, t, k, &whole, &res->reply, wtext, mta, &sig, sigtext,
					     sizeof(sigtext));
				continue;
			}
			if (!rep->code) {
				rcpt_not_tried(r, t, k);
				continue;
			}
			signal_classify(l, rc->cls, SMTP_STAGE_RCPT, 0, rep, &once, &cr);
			base_reply_text(res, rep, text, sizeof(text));
			rcpt_outcome(r, t, k, &cr, rep, text, mta, &sig, sigtext, sizeof(sigtext));
		}
	} else {
		/* before any recipient: the session, MAIL FROM, or a connection lost before
		 * the dot */
		base_reply_text(res, res->reply.code ? &res->reply : NULL, text, sizeof(text));
		bool stale = res->error < 0 && prior > 0 && res->stage <= SMTP_STAGE_MAIL;
		struct classify_result cr;
		if (stale) {
			/* a reused connection the server had closed: not the lane's fault */
			cr = (struct classify_result){ .verdict = CLASSIFY_SUSPEND, .for_ms = -1 };
			for (size_t k = 0; k < t->n; k++)
				rcpt_not_tried(r, t, k);
		} else if (res->error == -EMSGSIZE) {
			cr = (struct classify_result){ .verdict = CLASSIFY_FAIL, .for_ms = -1 };
			snprintf(text, sizeof(text), "552 5.3.4 message of %" PRIu64 " bytes exceeds "
				 "the server's limit of %" PRIu64, m->size, res->size_limit);
		} else if (res->error == -EPROTONOSUPPORT) {
			cr = (struct classify_result){ .verdict = CLASSIFY_FAIL, .for_ms = -1 };
			snprintf(text, sizeof(text), "553 5.6.7 the server does not support "
				 "SMTPUTF8, which the message needs");
		} else {
			signal_classify(l, rc->cls, res->stage, res->error,
				       res->reply.code ? &res->reply : NULL, &once, &cr);
		}
		struct smtp_reply synth = { 0 };
		const struct smtp_reply *rep = res->reply.code ? &res->reply : &synth;
		if (res->error == -EMSGSIZE)
			synth = (struct smtp_reply){ .code = 552, .enh_class = 5, .enh_subject = 3,
						     .enh_detail = 4 };
		else if (res->error == -EPROTONOSUPPORT)
			synth = (struct smtp_reply){ .code = 553, .enh_class = 5, .enh_subject = 6,
						     .enh_detail = 7 };
		if (!stale) {
			for (size_t k = 0; k < t->n; k++)
				rcpt_outcome(r, t, k, &cr, rep, text, mta, &sig, sigtext,
					     sizeof(sigtext));
		}
	}

	signal_once_clear(&once);
	for (size_t k = 0; k < t->n; k++)
		msg_rcpt_release(m, t->idx[k]);
	m->busy--;
	/* its recipients' new retry times (or none left) place the items again: in every
	 * lane they are routed to now (l's domain may have joined a group meanwhile, or a
	 * reload moved them out of l's group: relay_group.c); only the lanes of this
	 * transaction's recipients, not every lane of the message (law 8) */
	struct lane **moved = NULL; /* those lanes, kicked at the end (rare: a reload) */
	size_t nmoved = 0;
	struct lane_item *placed = NULL;
	for (size_t k = 0; k < t->n; k++) {
		struct lane_item *it = msg_rcpt_item(m, t->idx[k]);
		if (!it || it == placed)
			continue;
		msg_item_schedule(r, it);
		placed = it;
		struct lane *to = it->lane;
		if (to == l || (nmoved && moved[nmoved - 1] == to))
			continue;
		if (!moved && !(moved = calloc(t->n, sizeof(*moved))))
			continue; /* XXX it waits for its message's next change */
		moved[nmoved++] = to;
	}
	flush_post(r, m);
	if (sig.signal || sig.verdict == CLASSIFY_SUSPEND || sig.verdict == CLASSIFY_SLOW)
		lane_signal(l, &sig, sigtext);
	else if (success)
		lane_budget_success(&l->b);

	rc->tx = NULL;
	/* not reused: one made under the settings before a reload, or one whose MX or TLSA
	 * answers (DANE) are over */
	bool keep = c && smtp_out_usable(c) && !r->stopping && rc->crt == r->crt &&
		    (!l->rt || !l->rt->conf->messages_per_connection ||
		     smtp_out_transactions(c) < l->rt->conf->messages_per_connection) &&
		    !lane_budget_suspended(&l->b, relay_now(r)) && dane_reusable(rc, relay_now(r));
	if (keep)
		conn_idle(rc);
	else
		conn_close(rc, true);
	tx_free(t);
	if (m->busy == 0) {
		msg_close_file(r, m);
		if (m->bounce_asked)
			bounce_by_operator(r, m);
		else
			bounce_check(r, m); /* waits for the flush */
	}
	lane_kick(l);
	if (l->fwd)
		lane_kick(l->fwd);
	for (size_t k = 0; k < nmoved; k++)
		lane_kick(moved[k]);
	free(moved);
}
