/*
 * queue_walk -- what operators see of the index, at any size (queue.h): `sluice queue`
 * listings, selections for hold, release, delete, flush and bounce, and the summary by
 * domain and age.  Each walks the index in batches: ix_lock is held for one batch at a
 * time, entries are copied out, and formatting (and reading attempt logs) happens outside
 * the lock, so that a listing of a million messages never stalls the committer or the
 * relay.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "queue_int.h"
#include "queue_journal.h"
#include "queue_retry.h"
#include "queue_select.h"
#include "queue_table.h"
#include "util.h"

/* ---- formatting for listings ---- */

static void queue_format_time(uint64_t us, char *out, size_t len)
{
	time_t t = (time_t)(us / 1000000);
	struct tm tm;
	if (!gmtime_r(&t, &tm) || strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(out, len, "?");
}

/*
 * The reply of each recipient's last line in an attempt log ("ts=... rcpt=I status=...
 * reply=TEXT"): ret[i] points into log, or is empty when the log has no line for i.
 */
static void queue_last_replies(struct str log, size_t nrcpt, struct str *ret)
{
	for (size_t i = 0; i < nrcpt; i++)
		ret[i] = STR_NULL;
	const char *p = log.ptr, *end = log.ptr + log.len;
	while (p && p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *eol = nl ? nl : end;
		const char *r = memmem(p, (size_t)(eol - p), " rcpt=", 6);
		const char *t = memmem(p, (size_t)(eol - p), " reply=", 7);
		if (r && t && r < t) {
			size_t i = 0;
			bool digits = false;
			for (r += 6; r < eol && *r >= '0' && *r <= '9' && i < nrcpt; r++) {
				i = i * 10 + (size_t)(*r - '0');
				digits = true;
			}
			if (digits && i < nrcpt)
				ret[i] = str_make(t + 7, (size_t)(eol - t - 7));
		}
		p = nl ? nl + 1 : NULL;
	}
}

/* How a recipient stands: "deferred: next attempt in 1h52m, 3 attempts". */
static void queue_rcpt_state(char status, uint64_t next_us, uint32_t attempts,
			     uint64_t now_us, char *out, size_t len)
{
	if (status == QUEUE_DELIVERED || status == QUEUE_FAILED || status == QUEUE_RELAYED) {
		snprintf(out, len, "%s", status == QUEUE_DELIVERED ? "delivered"
					 : status == QUEUE_FAILED  ? "failed"
								   : "delivered, relayed notice owed");
		return;
	}
	char when[32] = "now";
	if (next_us > now_us) {
		char rel[24];
		fmt_duration(rel, sizeof(rel), (next_us - now_us) / 1000, DURATION_BRIEF);
		snprintf(when, sizeof(when), "in %s", rel);
	}
	const char *name = status == QUEUE_UNCERTAIN ? "uncertain"
			   : next_us > now_us	     ? "deferred"
						     : "to do";
	if (attempts)
		snprintf(out, len, "%s: next attempt %s, %" PRIu32 " attempt%s", name, when,
			 attempts, attempts == 1 ? "" : "s");
	else
		snprintf(out, len, "%s: next attempt %s", name, when);
}

static int queue_list_entry(const struct qentry *e, const struct str *last,
			    uint64_t now_us, bool json, struct buf *out)
{
	char when[32];
	queue_format_time(e->arrival_us, when, sizeof(when));
	const char *status = qentry_status(e);
	const struct qrcpt *rc = qentry_rcpt(e);
	int r;
	if (json) {
		r = buf_printf(out, "{\"id\":\"%s\",\"size\":%" PRIu64 ",\"arrival\":\"%s\","
			       "\"arrival_us\":%" PRIu64 ",\"held\":%s,\"sender\":", e->id, e->size,
			       when, e->arrival_us,
			       e->control[QUEUE_CTL_HOLD] == 'H' ? "true" : "false");
		if (r == 0)
			r = buf_append_json_string(out, qentry_sender(e));
		if (r == 0)
			r = buf_append_cstr(out, ",\"recipients\":[");
		for (size_t i = 0; r == 0 && i < e->nrcpt; i++) {
			r = buf_printf(out, "%s{\"address\":", i ? "," : "");
			if (r == 0)
				r = buf_append_json_string(out, qentry_addr(e, i));
			if (r == 0)
				r = buf_printf(out, ",\"status\":\"%c\",\"next_attempt_us\":%" PRIu64
					       ",\"attempts\":%" PRIu32 ",\"last_reply\":", status[i],
					       rc[i].next_us, rc[i].attempts);
			if (r == 0 && last[i].len) {
				char *t = strndup(last[i].ptr, last[i].len);
				r = t ? buf_append_json_string(out, t) : -ENOMEM;
				free(t);
			} else if (r == 0) {
				r = buf_append_cstr(out, "null");
			}
			if (r == 0)
				r = buf_append_byte(out, '}');
		}
		return r == 0 ? buf_append_cstr(out, "]}\n") : r;
	}
	r = buf_printf(out, "%s%c %10" PRIu64 "  %s  <%s>\n", e->id,
		       e->control[QUEUE_CTL_HOLD] == 'H' ? '!' : ' ', e->size, when,
		       qentry_sender(e));
	for (size_t i = 0; r == 0 && i < e->nrcpt; i++) {
		char st[96];
		queue_rcpt_state(status[i], rc[i].next_us, rc[i].attempts, now_us, st, sizeof(st));
		r = buf_printf(out, "    %c <%s>  %s\n", status[i], qentry_addr(e, i), st);
		if (r == 0 && last[i].len)
			r = buf_printf(out, "        last reply: %.*s\n", (int)last[i].len,
				       last[i].ptr);
	}
	return r;
}

/* ---- walks of the index, in batches ---- */

/*
 * Under ix_lock: visit the messages after the cursor that sel selects, until max were
 * visited or QUEUE_WALK_SCAN were looked at, and move the cursor past the last one looked
 * at (c->done at the end).  visit() returns <0 to stop (the walk then returns it; the
 * cursor stays on the message it refused).
 */
static int walk(struct queue *q, const struct queue_select *sel, uint64_t now_us, size_t max,
		struct queue_cursor *c, int (*visit)(void *arg, const struct qentry *e),
		void *arg)
{
	size_t seen = 0, taken = 0;
	if (sel->ids) {
		while (c->next_id < sel->nids && taken < max && seen < QUEUE_WALK_SCAN) {
			const struct qentry *e = queue_ix_get(q, sel->ids[c->next_id]);
			seen++;
			if (e && queue_select_match(sel, e, now_us)) {
				int r = visit(arg, e);
				if (r < 0)
					return r;
				taken++;
			} else if (!e) {
				c->missing++;
			}
			c->next_id++;
		}
		c->done = c->next_id >= sel->nids;
		return 0;
	}
	const struct qentry *e = c->last[0] ? queue_table_after(&q->ix, c->last)
					    : queue_table_first(&q->ix);
	for (; e && taken < max && seen < QUEUE_WALK_SCAN; e = queue_table_next(e)) {
		seen++;
		if (queue_select_match(sel, e, now_us)) {
			int r = visit(arg, e);
			if (r < 0)
				return r;
			taken++;
		}
		memcpy(c->last, e->id, sizeof(c->last));
	}
	c->done = e == NULL;
	return 0;
}

struct copies {
	struct qentry **v;
	size_t n;
};

static int copy_entry(void *arg, const struct qentry *e)
{
	struct copies *cp = arg;
	size_t len = qentry_bytes(e);
	struct qentry *c = malloc(len);
	if (!c)
		return -ENOMEM;
	memcpy(c, e, len); /* its forward pointers are stale: only read, never followed */
	cp->v[cp->n++] = c;
	return 0;
}

int queue_list_step(struct queue *q, const struct queue_select *sel, uint64_t now_us,
		    bool json, size_t max, struct queue_cursor *c,
		    struct queue_list_totals *tot, struct buf *out)
{
	if (max == 0 || max > QUEUE_WALK_SCAN)
		max = QUEUE_WALK_SCAN;
	struct copies cp = { .v = calloc(max, sizeof(cp.v[0])) };
	if (!cp.v)
		return -ENOMEM;
	struct queue_cursor before = *c;
	pthread_mutex_lock(&q->ix_lock);
	int r = walk(q, sel, now_us, max, c, copy_entry, &cp);
	pthread_mutex_unlock(&q->ix_lock);
	if (r < 0) {
		*c = before; /* the batch again, next time */
		goto out;
	}
	struct buf log;
	buf_init(&log, QUEUE_LIST_LOG_MAX + 1);
	for (size_t k = 0; r == 0 && k < cp.n; k++) {
		const struct qentry *e = cp.v[k];
		struct str *last = calloc(e->nrcpt ? e->nrcpt : 1, sizeof(*last));
		if (!last) {
			r = -ENOMEM;
			break;
		}
		/* the log only of a message something was tried for, as mailq reads only
		 * the defer logs */
		bool tried = false;
		for (size_t i = 0; i < e->nrcpt; i++)
			tried |= qentry_rcpt(e)[i].attempts || qentry_status(e)[i] != QUEUE_TODO;
		buf_reset(&log);
		if (tried && queue_log_read(q->qd, e->id, &log, QUEUE_LIST_LOG_MAX) == 0)
			queue_last_replies(buf_str(&log), e->nrcpt, last);
		r = queue_list_entry(e, last, now_us, json, out);
		free(last);
		tot->messages++;
		tot->bytes += e->size;
		for (size_t i = 0; i < e->nrcpt; i++)
			tot->recipients += qentry_status(e)[i] == QUEUE_TODO ||
					   qentry_status(e)[i] == QUEUE_UNCERTAIN;
	}
	buf_done(&log);
out:
	for (size_t k = 0; k < cp.n; k++)
		free(cp.v[k]);
	free(cp.v);
	return r;
}

struct id_list {
	char (*v)[QUEUE_ID_LEN + 1];
	size_t n;
};

static int copy_id(void *arg, const struct qentry *e)
{
	struct id_list *l = arg;
	memcpy(l->v[l->n++], e->id, QUEUE_ID_LEN + 1);
	return 0;
}

int queue_select_ids(struct queue *q, const struct queue_select *sel, uint64_t now_us,
		     size_t max, struct queue_cursor *c, char (*ret)[QUEUE_ID_LEN + 1],
		     size_t *ret_n)
{
	struct id_list l = { .v = ret };
	pthread_mutex_lock(&q->ix_lock);
	walk(q, sel, now_us, max, c, copy_id, &l);
	pthread_mutex_unlock(&q->ix_lock);
	*ret_n = l.n;
	return 0;
}

struct summing {
	const struct queue_select *sel;
	uint64_t now_us;
	bool by_sender;
	struct queue_summary *sum;
	int error;
};

static int count_entry(void *arg, const struct qentry *e)
{
	struct summing *s = arg;
	uint64_t age = s->now_us > e->arrival_us ? s->now_us - e->arrival_us : 0;
	const char *sender = qentry_sender(e);
	const char *sdom = sender[0] ? queue_addr_domain(sender) : "<>";
	bool rsel = s->sel->domain || s->sel->state != QUEUE_SEL_ANY;
	for (size_t i = 0; i < e->nrcpt; i++) {
		char st = qentry_status(e)[i];
		if (st != QUEUE_TODO && st != QUEUE_UNCERTAIN)
			continue;
		/* with a recipient selector, only the recipients it picks */
		if (rsel && !queue_select_rcpt_match(s->sel, e, i, s->now_us))
			continue;
		int r = queue_summary_add(s->sum, s->by_sender ? sdom
						    : queue_addr_domain(qentry_addr(e, i)), age);
		if (r < 0)
			s->error = r;
	}
	return 0;
}

int queue_summary_step(struct queue *q, const struct queue_select *sel, uint64_t now_us,
		       bool by_sender, struct queue_cursor *c, struct queue_summary *sum)
{
	struct summing s = { sel, now_us, by_sender, sum, 0 };
	pthread_mutex_lock(&q->ix_lock);
	walk(q, sel, now_us, QUEUE_WALK_SCAN, c, count_entry, &s);
	pthread_mutex_unlock(&q->ix_lock);
	return s.error;
}

bool queue_loading(struct queue *q, uint64_t *ret_done, uint64_t *ret_total)
{
	pthread_mutex_lock(&q->ix_lock);
	bool loading = q->loading;
	*ret_done = q->load_done;
	*ret_total = q->load_total;
	pthread_mutex_unlock(&q->ix_lock);
	return loading;
}

int queue_show(struct queue *q, const char *id, bool json, struct buf *out)
{
	if (!queue_id_valid(str_cstr(id)))
		return -ENOENT;
	struct queue_msg m;
	const char *why = NULL;
	int r = queue_msg_open(q->qd, id, &m, &why);
	if (r < 0)
		return r;
	const struct queue_envelope *env = &m.ix.env;
	char when[32];
	queue_format_time(env->arrival_us, when, sizeof(when));
	struct buf log;
	buf_init(&log, 65536 + 1);
	queue_log_read(q->qd, id, &log, 65536);
	char *sender = strndup(env->sender.ptr ? env->sender.ptr : "", env->sender.len);
	char *client = strndup(env->client.ptr ? env->client.ptr : "", env->client.len);
	char *helo = strndup(env->helo.ptr ? env->helo.ptr : "", env->helo.len);
	char *logtext = strndup(log.ptr ? log.ptr : "", log.len);
	size_t nr = m.ix.nrcpt ? m.ix.nrcpt : 1;
	uint64_t *next = calloc(nr, sizeof(*next));
	uint32_t *attempts = calloc(nr, sizeof(*attempts));
	struct str *last = calloc(nr, sizeof(*last));
	r = sender && client && helo && logtext && next && attempts && last ? 0 : -ENOMEM;
	if (r == 0) {
		/* a message the loader has not reached yet shows no retry state */
		queue_get_retry(q, id, m.ix.nrcpt, next, attempts);
		queue_last_replies(str_make(logtext, log.len), m.ix.nrcpt, last);
	}
	uint64_t now_us = realtime_ns() / 1000;
	if (r == 0 && json) {
		r = buf_printf(out, "{\"id\":\"%s\",\"arrival\":\"%s\",\"size\":%" PRIu64
			       ",\"declared_size\":%" PRIu64 ",\"8bitmime\":%s,\"smtputf8\":%s,"
			       "\"held\":%s,\"bounce\":\"%c\",\"control\":\"%.8s\",\"sender\":",
			       env->id, when, m.ix.body_len, env->size,
			       env->flags & QUEUE_8BITMIME ? "true" : "false",
			       env->flags & QUEUE_SMTPUTF8 ? "true" : "false",
			       m.ix.control[QUEUE_CTL_HOLD] == 'H' ? "true" : "false",
			       m.ix.control[QUEUE_CTL_BOUNCE], m.ix.control);
		if (r == 0)
			r = buf_append_json_string(out, sender);
		if (r == 0)
			r = buf_append_cstr(out, ",\"client\":");
		if (r == 0)
			r = buf_append_json_string(out, client);
		if (r == 0)
			r = buf_append_cstr(out, ",\"helo\":");
		if (r == 0)
			r = buf_append_json_string(out, helo);
		if (r == 0)
			r = buf_append_cstr(out, ",\"recipients\":[");
		for (size_t i = 0; r == 0 && i < m.ix.nrcpt; i++) {
			char *a = strndup(m.ix.rcpt[i].addr.ptr, m.ix.rcpt[i].addr.len);
			r = a ? buf_printf(out, "%s{\"address\":", i ? "," : "") : -ENOMEM;
			if (r == 0)
				r = buf_append_json_string(out, a);
			if (r == 0)
				r = buf_printf(out, ",\"status\":\"%c\",\"next_attempt_us\":%" PRIu64
					       ",\"attempts\":%" PRIu32 ",\"last_reply\":",
					       m.ix.rcpt[i].status, next[i], attempts[i]);
			free(a);
			a = last[i].len ? strndup(last[i].ptr, last[i].len) : NULL;
			if (r == 0)
				r = a ? buf_append_json_string(out, a) : buf_append_cstr(out, "null");
			if (r == 0)
				r = buf_append_byte(out, '}');
			free(a);
		}
		if (r == 0)
			r = buf_append_cstr(out, "],\"log\":");
		if (r == 0)
			r = buf_append_json_string(out, logtext);
		if (r == 0)
			r = buf_append_cstr(out, "}\n");
	} else if (r == 0) {
		char owed[64] = "";
		if (m.relayed)
			(void)fmt_fixed(owed, sizeof(owed), " (%zu owed a relayed notice)", m.relayed);
		r = buf_printf(out, "id:        %s%s\narrival:   %s\nsize:      %" PRIu64
			       " bytes\nsender:    <%s>\nclient:    %s\nhelo:      %s\n"
			       "flags:     %s%s\ncontrol:   %.8s (hold %c, bounce %c)\n"
			       "recipients (%zu: %zu to do, %zu uncertain, %zu delivered%s, %zu "
			       "failed):\n",
			       env->id, m.ix.control[QUEUE_CTL_HOLD] == 'H' ? " (held)" : "", when,
			       m.ix.body_len, sender, client, helo,
			       env->flags & QUEUE_8BITMIME ? "8BITMIME " : "",
			       env->flags & QUEUE_SMTPUTF8 ? "SMTPUTF8" : "", m.ix.control,
			       m.ix.control[QUEUE_CTL_HOLD], m.ix.control[QUEUE_CTL_BOUNCE],
			       m.ix.nrcpt, m.todo, m.uncertain, m.delivered + m.relayed, owed,
			       m.failed);
		for (size_t i = 0; r == 0 && i < m.ix.nrcpt; i++) {
			char st[96];
			queue_rcpt_state(m.ix.rcpt[i].status, next[i], attempts[i], now_us, st,
				   sizeof(st));
			r = buf_printf(out, "  %c <%.*s>  %s\n", m.ix.rcpt[i].status,
				       (int)m.ix.rcpt[i].addr.len, m.ix.rcpt[i].addr.ptr, st);
			if (r == 0 && last[i].len)
				r = buf_printf(out, "      last reply: %.*s\n", (int)last[i].len,
					       last[i].ptr);
		}
		if (r == 0)
			r = buf_printf(out, "attempts:\n%s", log.len ? logtext : "  (none yet)\n");
	}
	free(sender);
	free(client);
	free(helo);
	free(logtext);
	free(next);
	free(attempts);
	free(last);
	buf_done(&log);
	queue_msg_close(&m);
	return r;
}

/*
 * XXX hold, release and show run on the control session's worker: each reads the whole
 * file through once (queue_msg_open checks it) and hold flushes it, so `hold --all` on a
 * deep queue holds up that worker's other sessions for as long.  They belong on a helper
 * thread answering through worker_call(), with hold writing at the control offset kept
 * in the index.
 */
int queue_hold(struct queue *q, const char *id, bool hold)
{
	/* only a message in the index: one the loader has not reached is not touched */
	pthread_mutex_lock(&q->ix_lock);
	bool known = queue_ix_get(q, id) != NULL;
	pthread_mutex_unlock(&q->ix_lock);
	if (!known)
		return -ENOENT;
	struct queue_msg m;
	int r = queue_msg_open(q->qd, id, &m, NULL);
	if (r < 0)
		return r;
	r = queue_set_control(q, &m, QUEUE_CTL_HOLD, hold ? 'H' : '-');
	if (r == 0)
		r = queue_msg_sync(&m);
	queue_msg_close(&m);
	if (r == 0)
		queue_notify(q, hold ? QUEUE_EV_HOLD : QUEUE_EV_RELEASE, id);
	return r;
}

int queue_delete(struct queue *q, const char *id)
{
	/* only a message in the index: one the loader has not reached yet could otherwise
	 * be put in the index after its file is gone */
	pthread_mutex_lock(&q->ix_lock);
	bool known = queue_ix_get(q, id) != NULL;
	pthread_mutex_unlock(&q->ix_lock);
	if (!known)
		return -ENOENT;
	int r = queue_remove_message(q, id);
	if (r == 0)
		queue_notify(q, QUEUE_EV_DELETE, id);
	return r;
}

int queue_bounce(struct queue *q, const char *id)
{
	pthread_mutex_lock(&q->ix_lock);
	bool known = queue_ix_get(q, id) != NULL;
	pthread_mutex_unlock(&q->ix_lock);
	if (!known)
		return -ENOENT;
	queue_notify(q, QUEUE_EV_BOUNCE, id);
	return 0;
}

/* Under ix_lock: append records (whole ones, at most 64) in one write. */
static int journal_append(struct queue *q, const unsigned char *p, size_t n)
{
	int r = queue_journal_append(q->jr, p, n * QUEUE_RETRY_RECORD);
	if (r == 0)
		q->jr_records += n;
	return r;
}

int queue_flush(struct queue *q, const char *id)
{
	unsigned char buf[64 * QUEUE_RETRY_RECORD];
	size_t n = 0;
	int r = 0;
	pthread_mutex_lock(&q->ix_lock);
	struct qentry *e = queue_ix_get(q, id);
	struct qrcpt *rc = e ? qentry_rcpt(e) : NULL;
	for (size_t i = 0; e && i < e->nrcpt; i++) {
		if (!rc[i].next_us)
			continue;
		queue_table_set_retry(&q->ix, e, i, 0, rc[i].attempts);
		struct queue_retry_rec rec = { .kind = QUEUE_RETRY_STATE, .rcpt = (uint32_t)i,
					       .attempts = rc[i].attempts };
		memcpy(rec.id, e->id, sizeof(rec.id));
		queue_retry_encode(&rec, buf + n * QUEUE_RETRY_RECORD);
		if (++n == 64) {
			int w = journal_append(q, buf, n);
			r = r ? r : w;
			n = 0;
		}
	}
	if (n) {
		int w = journal_append(q, buf, n);
		r = r ? r : w;
	}
	if (e)
		queue_maybe_compact(q);
	pthread_mutex_unlock(&q->ix_lock);
	if (!e)
		return -ENOENT;
	/* a failed append: the index is right, the journal has the old time (kept until
	 * the next start, where it means a late retry at worst) */
	queue_notify(q, QUEUE_EV_FLUSH, id);
	return r;
}

int queue_set_retry(struct queue *q, const char *id, size_t rcpt, uint64_t next_us,
		    uint32_t attempts)
{
	struct queue_retry_rec rec = { .kind = QUEUE_RETRY_STATE, .rcpt = (uint32_t)rcpt,
				       .attempts = attempts, .next_us = next_us };
	unsigned char b[QUEUE_RETRY_RECORD];
	if (!id || strnlen(id, QUEUE_ID_LEN + 1) != QUEUE_ID_LEN)
		return -ENOENT;
	memcpy(rec.id, id, sizeof(rec.id));
	if (rcpt >= QUEUE_MAX_RECIPIENTS)
		return -EINVAL;
	if (queue_retry_encode(&rec, b) < 0)
		return -ENOENT; /* not a QID */
	pthread_mutex_lock(&q->ix_lock);
	struct qentry *e = queue_table_get(&q->ix, id);
	int r = !e ? -ENOENT : rcpt >= e->nrcpt ? -EINVAL : 0;
	if (r == 0) {
		queue_table_set_retry(&q->ix, e, rcpt, next_us, attempts);
		r = journal_append(q, b, 1);
		queue_maybe_compact(q);
	}
	pthread_mutex_unlock(&q->ix_lock);
	return r;
}

int queue_get_retry(struct queue *q, const char *id, size_t nrcpt, uint64_t *ret_next_us,
		    uint32_t *ret_attempts)
{
	pthread_mutex_lock(&q->ix_lock);
	const struct qentry *e = queue_ix_get(q, id);
	if (!e) {
		pthread_mutex_unlock(&q->ix_lock);
		return -ENOENT;
	}
	const struct qrcpt *rc = qentry_rcpt(e);
	for (size_t i = 0; i < nrcpt; i++) {
		if (ret_next_us)
			ret_next_us[i] = i < e->nrcpt ? rc[i].next_us : 0;
		if (ret_attempts)
			ret_attempts[i] = i < e->nrcpt ? rc[i].attempts : 0;
	}
	pthread_mutex_unlock(&q->ix_lock);
	return 0;
}

int queue_ids(struct queue *q, char (**ret)[QUEUE_ID_LEN + 1], size_t *ret_n)
{
	pthread_mutex_lock(&q->ix_lock);
	size_t n = q->ix.n;
	char(*ids)[QUEUE_ID_LEN + 1] = malloc((n ? n : 1) * sizeof(*ids));
	if (!ids) {
		pthread_mutex_unlock(&q->ix_lock);
		return -ENOMEM;
	}
	size_t i = 0;
	for (const struct qentry *e = queue_table_first(&q->ix); e; e = queue_table_next(e))
		memcpy(ids[i++], e->id, QUEUE_ID_LEN + 1);
	*ret_n = n;
	pthread_mutex_unlock(&q->ix_lock);
	*ret = ids;
	return 0;
}
