/*
 * relay_msg -- the relay's view of the queue: a struct rmsg per message with work left,
 * found by id in a hash table, each recipient routed to a lane; recipient statuses and
 * retry times; expiry, delay notices and the periodic sweep.
 *
 * Runs on the relay's thread.  Statuses on disk change only through queue_set_status()
 * on the message's open file (a pwrite into the page cache: a killed daemon loses none),
 * flushed by the flusher (relay_flush.c); a message is removed, or its bounce queued,
 * only after its flushes are done.
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

static void table_remove(struct relay *r, struct rmsg *m);

/* ---- messages ---- */

static void idle_remove(struct relay *r, struct rmsg *m)
{
	if (m->open_idle) {
		TAILQ_REMOVE(&r->open_idle, m, idle_link);
		r->nopen_idle--;
		r->open_idle_bytes -= m->qm->size;
		m->open_idle = false;
	}
}

static void msg_really_close(struct relay *r, struct rmsg *m)
{
	idle_remove(r, m);
	/* written and not flushed (a failed flush): try again before the fd goes, and keep
	 * dirty if that fails too, so that msg_check_done() does not remove m on trust */
	if (m->open && m->dirty && queue_msg_sync(m->qm) == 0)
		m->dirty = false;
	if (m->open) {
		queue_msg_close(m->qm);
		free(m->qm);
		m->qm = NULL;
		m->open = false;
	}
}

/* m's file is not needed until its next transaction: it stays open among the
 * MSG_OPEN_IDLE_MAX most recently used, within MSG_OPEN_IDLE_BYTES of files (a post to
 * many domains is read and checked once, not once per domain), and the least recently
 * used beyond them are closed.  A message on the list is in no transaction:
 * msg_open_file() takes it off before one starts. */
void msg_close_file(struct relay *r, struct rmsg *m)
{
	if (!m->open || m->busy != 0 || m->open_idle)
		return;
	if (m->qm->size > MSG_OPEN_IDLE_BYTES) {
		msg_really_close(r, m); /* it would push every other one out */
		return;
	}
	TAILQ_INSERT_TAIL(&r->open_idle, m, idle_link);
	m->open_idle = true;
	r->nopen_idle++;
	r->open_idle_bytes += m->qm->size;
	while (r->nopen_idle > MSG_OPEN_IDLE_MAX || r->open_idle_bytes > MSG_OPEN_IDLE_BYTES) {
		struct rmsg *old = TAILQ_FIRST(&r->open_idle);
		ASSERT(old->busy == 0);
		msg_really_close(r, old);
	}
}

static void item_free_rcpts(struct lane_item *it)
{
	if (it->ri_cap)
		free(it->ri_many);
	it->ri_cap = it->nri = 0;
	it->scan = 0;
}

void msg_forget_lanes(struct rmsg *m)
{
	for (size_t i = 0; i < m->nitems; i++)
		item_free_rcpts(&m->items[i]);
	m->nitems = 0;
}

/* Room for want recipients in it's list.  0 or -ENOMEM (it unchanged). */
static int item_reserve(struct lane_item *it, size_t want)
{
	if (want > UINT32_MAX)
		return -ENOMEM;
	if (want <= 1 && !it->ri_cap)
		return 0;
	if (want <= it->ri_cap)
		return 0;
	size_t nc = it->ri_cap ? it->ri_cap : 4;
	while (nc < want)
		nc = nc > UINT32_MAX / 2 ? UINT32_MAX : nc * 2;
	uint32_t *n = realloc(it->ri_cap ? it->ri_many : NULL, nc * sizeof(*n));
	if (!n)
		return -ENOMEM;
	if (!it->ri_cap && it->nri)
		n[0] = it->ri_one;
	it->ri_many = n;
	it->ri_cap = (uint32_t)nc;
	return 0;
}

/* Recipient i joins it's list.  0 or -ENOMEM (it unchanged). */
static int item_push(struct lane_item *it, size_t i)
{
	if (item_reserve(it, (size_t)it->nri + 1) < 0)
		return -ENOMEM;
	item_rcpts(it)[it->nri++] = (uint32_t)i;
	return 0;
}

void msg_free(struct relay *r, struct rmsg *m)
{
	for (size_t i = 0; i < m->nitems; i++) {
		struct lane_item *it = &m->items[i];
		if (it->lane) {
			TAILQ_REMOVE(&it->lane->items, it, link);
			sched_item_remove(&it->lane->s, &it->s);
			it->lane->waiting -= it->pending;
		}
	}
	for (size_t i = 0; i < m->nitems; i++)
		item_free_rcpts(&m->items[i]);
	msg_really_close(r, m);
	table_remove(r, m);
	if (r->insert_hint == m)
		r->insert_hint = NULL;
	if (r->warned_upto == m)
		r->warned_upto = TAILQ_PREV(m, rmsg_list, link);
	TAILQ_REMOVE(&r->msgs, m, link);
	free(m->items);
	free(m->r);
	free(m->addr);
	free(m->block);
	free(m);
}

static uint64_t id_hash(struct relay *r, const char *id)
{
	return htab_hash(&r->msg_idx, id, strlen(id));
}

struct rmsg *msg_find(struct relay *r, const char *id)
{
	uint64_t h = id_hash(r, id);
	for (struct htab_node *n = htab_chain(&r->msg_idx, h); n; n = n->next) {
		struct rmsg *m = HTAB_ENTRY(n, struct rmsg, hnode);
		if (n->hash == h && strcmp(m->id, id) == 0)
			return m;
	}
	return NULL;
}

static int table_add(struct relay *r, struct rmsg *m)
{
	return htab_add(&r->msg_idx, &m->hnode, id_hash(r, m->id));
}

static void table_remove(struct relay *r, struct rmsg *m)
{
	htab_remove(&r->msg_idx, &m->hnode);
}

static const char *addr_domain(const char *a)
{
	const char *at = strrchr(a, '@');
	return at ? at + 1 : "";
}

static void item_unlink(struct lane_item *it)
{
	TAILQ_REMOVE(&it->lane->items, it, link);
	sched_item_remove(&it->lane->s, &it->s);
	it->lane->waiting -= it->pending;
}

/*
 * m's item in l, or NULL.  A message has at most one item per lane, so the slot l was
 * last found at in some message is checked first: routing a post's recipients (several
 * to one lane, one after the other) and moving a post's domains into a group one by one
 * find it there, and only a miss walks m's items.
 */
static struct lane_item *msg_item(struct rmsg *m, struct lane *l)
{
	if (l->item_hint < m->nitems && m->items[l->item_hint].lane == l)
		return &m->items[l->item_hint];
	for (size_t i = 0; i < m->nitems; i++)
		if (m->items[i].lane == l) {
			l->item_hint = (uint32_t)i;
			return &m->items[i];
		}
	return NULL;
}

struct lane_item *msg_rcpt_item(struct rmsg *m, size_t i)
{
	const struct rrcpt *rr = &m->r[i];
	if (!rr->lane)
		return NULL;
	if (rr->item < m->nitems && m->items[rr->item].lane == rr->lane)
		return &m->items[rr->item];
	return msg_item(m, rr->lane);
}

/* Route every unfinished recipient to its lane and link m into those lanes (in arrival
 * order: messages are routed in arrival order, and a reload routes them again in the
 * same order).  -ENOMEM when a recipient found no lane (out of memory, or MAX_LANES
 * lanes): it is left without one, and the others are routed and linked all the same,
 * so that m stays whole (every item linked) for whoever frees or routes it next. */
int msg_route(struct relay *r, struct rmsg *m)
{
	int err = 0;
	for (size_t i = 0; i < m->nitems; i++) {
		if (m->items[i].lane)
			item_unlink(&m->items[i]);
		item_free_rcpts(&m->items[i]);
	}
	free(m->items);
	m->items = NULL;
	m->nitems = 0;
	size_t cap = 0;
	/* m's items are made here: a lane without route_gen == gen has none yet (no walk
	 * over them per recipient) */
	uint64_t gen = ++r->route_gen;
	for (size_t i = 0; i < m->nrcpt; i++) {
		struct rrcpt *rr = &m->r[i];
		rr->lane = NULL;
		if (rr->status != QUEUE_TODO && rr->status != QUEUE_UNCERTAIN)
			continue;
		char dom[256];
		snprintf(dom, sizeof(dom), "%s", addr_domain(m->addr[i]));
		for (char *p = dom; *p; p++)
			if (*p >= 'A' && *p <= 'Z')
				*p = (char)(*p - 'A' + 'a');
		bool routed = true;
		struct lane *l = r->up.lane_for(r, dom, &routed);
		if (!routed)
			continue;
		if (!l) {
			err = -ENOMEM;
			continue;
		}
		if (l->route_gen == gen) {
			struct lane_item *have = &m->items[l->item_hint];
			if (item_push(have, i) < 0) {
				err = -ENOMEM;
				continue;
			}
			rr->lane = l;
			rr->item = (uint32_t)(have - m->items);
			continue;
		}
		if (m->nitems == cap) {
			size_t nc = cap ? cap * 2 : 2;
			struct lane_item *it = realloc(m->items, nc * sizeof(*it));
			if (!it) {
				err = -ENOMEM;
				continue;
			}
			/* items are linked into lanes by address: relink after a move */
			m->items = it;
			cap = nc;
		}
		rr->lane = l;
		rr->item = (uint32_t)m->nitems;
		l->item_hint = rr->item;
		l->route_gen = gen;
		m->items[m->nitems++] = (struct lane_item){
			.s = { .arrival = m->arrival_us, .seq = m->seq },
			.m = m,
			.lane = l,
			.nri = 1,
			.ri_one = (uint32_t)i,
		};
	}
	for (size_t i = 0; i < m->nrcpt; i++)
		if (m->r[i].lane) {
			m->items[m->r[i].item].pending++;
			m->r[i].lane->waiting++;
		}
	/* The lane's list is for walking its items (views, a domain that fails whole); the
	 * scheduler orders them by arrival itself. */
	for (size_t i = 0; i < m->nitems; i++)
		TAILQ_INSERT_TAIL(&m->items[i].lane->items, &m->items[i], link);
	msg_schedule(r, m);
	return err;
}

void msg_move_lane(struct relay *r, struct rmsg *m, struct lane *from, struct lane *to)
{
	struct lane_item *src = msg_item(m, from), *dst = msg_item(m, to);
	if (!src || from == to)
		return;
	if (dst && item_reserve(dst, (size_t)dst->nri + src->nri) < 0) {
		/* XXX they stay where they are until the next reload routes them again */
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s cannot move from lane %s to %s: out of "
			  "memory", m->id, from->name, to->name);
		return;
	}
	item_unlink(src);
	to->waiting += src->pending;
	uint32_t *sr = item_rcpts(src);
	if (!dst) {
		/* the item itself moves */
		for (size_t k = 0; k < src->nri; k++)
			if (m->r[sr[k]].lane == from)
				m->r[sr[k]].lane = to;
		src->lane = to;
		TAILQ_INSERT_TAIL(&to->items, src, link);
		msg_item_schedule(r, src);
		return;
	}
	size_t si = (size_t)(src - m->items), di = (size_t)(dst - m->items), last = m->nitems - 1;
	/* appended after dst's scan: those before it stay done */
	for (size_t k = 0; k < src->nri; k++) {
		struct rrcpt *rr = &m->r[sr[k]];
		if (rr->lane != from)
			continue;
		rr->lane = to;
		rr->item = (uint32_t)di;
		item_rcpts(dst)[dst->nri++] = sr[k];
	}
	dst->pending += src->pending;
	item_free_rcpts(src);
	/* the emptied item leaves the array: the last one takes its place (items are linked
	 * by address: the moved one is linked again) */
	if (si != last) {
		struct lane_item *lt = &m->items[last];
		struct lane *ll = lt->lane;
		TAILQ_REMOVE(&ll->items, lt, link);
		sched_item_remove(&ll->s, &lt->s);
		m->items[si] = *lt;
		struct lane_item *moved = &m->items[si];
		TAILQ_INSERT_TAIL(&ll->items, moved, link);
		uint32_t *mr = item_rcpts(moved);
		for (size_t k = 0; k < moved->nri; k++)
			if (m->r[mr[k]].lane && m->r[mr[k]].item == last)
				m->r[mr[k]].item = (uint32_t)si;
		m->nitems--;
		ll->item_hint = (uint32_t)si; /* its next move finds it without a walk */
		if (di == last)
			dst = moved;
		else
			msg_item_schedule(r, moved);
	} else {
		m->nitems--;
	}
	msg_item_schedule(r, dst);
}

/*
 * When each item of m is due: the earliest retry time of its recipients that are T or U
 * and not in a transaction; never while m is held, deleted or being bounced, or when it
 * has no such recipient.  One pass over the recipients for all items.
 */
static bool msg_parked(const struct rmsg *m)
{
	return m->held || m->deleted || m->bouncing;
}

/* A recipient that a lane will send: routed, T or U, and not in a transaction. */
static bool rcpt_waits(const struct rrcpt *rr)
{
	return rr->lane && !rr->busy &&
	       (rr->status == QUEUE_TODO || rr->status == QUEUE_UNCERTAIN);
}

static void items_due(const struct rmsg *m, uint64_t *due)
{
	for (size_t k = 0; k < m->nitems; k++)
		due[k] = SCHED_NEVER;
	for (size_t i = 0; i < m->nrcpt && !msg_parked(m); i++) {
		const struct rrcpt *rr = &m->r[i];
		if (rcpt_waits(rr) && rr->next_try < due[rr->item])
			due[rr->item] = rr->next_try;
	}
}

static void item_place(struct relay *r, struct lane_item *it, uint64_t due, uint64_t now)
{
	if (sched_item_set(&it->lane->s, &it->s, due, now) < 0)
		/* XXX without memory for the heap the item waits for the next change of its
		 * message (a retry, a release, a restart) */
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s lane=%s cannot be scheduled: out of memory",
			  it->m->id, it->lane->name);
}

void msg_schedule(struct relay *r, struct rmsg *m)
{
	uint64_t one, *due = m->nitems <= 1 ? &one : malloc(m->nitems * sizeof(*due));
	if (!due) {
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s cannot be scheduled: out of memory", m->id);
		return;
	}
	items_due(m, due);
	uint64_t now = relay_now(r);
	for (size_t k = 0; k < m->nitems; k++)
		item_place(r, &m->items[k], due[k], now);
	if (due != &one)
		free(due);
}

void msg_item_schedule(struct relay *r, struct lane_item *it)
{
	struct rmsg *m = it->m;
	uint64_t due = SCHED_NEVER, now = relay_now(r);
	const uint32_t *ri = item_rcpts(it);
	/* one due now is as early as it gets: most of a fresh post stops at its first */
	for (size_t k = it->scan; k < it->nri && !msg_parked(m) && due > now; k++) {
		const struct rrcpt *rr = &m->r[ri[k]];
		if (rr->lane == it->lane && rcpt_waits(rr) && rr->next_try < due)
			due = rr->next_try;
	}
	item_place(r, it, due, now);
}

void msg_schedule_lane(struct relay *r, struct rmsg *m, struct lane *l)
{
	struct lane_item *it = msg_item(m, l);
	if (it)
		msg_item_schedule(r, it);
}

static bool msg_before(const struct rmsg *a, const struct rmsg *b)
{
	return a->arrival_us != b->arrival_us ? a->arrival_us < b->arrival_us
					      : strcmp(a->id, b->id) < 0;
}

/*
 * Link m into r->msgs in arrival order, so that expiry and delay notices walk only the
 * messages whose time has come.  New mail is the newest (an append); the queue's loader
 * hands over the older messages in order while new mail arrives, so each goes right after
 * the one inserted before it (the hint): O(1) either way, a walk back only after the hint
 * went away.
 */
static void msg_insert(struct relay *r, struct rmsg *m)
{
	struct rmsg *last = TAILQ_LAST(&r->msgs, rmsg_list);
	struct rmsg *h = r->insert_hint;
	if (!last || !msg_before(m, last)) {
		TAILQ_INSERT_TAIL(&r->msgs, m, link);
	} else if (h && !msg_before(m, h) && TAILQ_NEXT(h, link) &&
		   msg_before(m, TAILQ_NEXT(h, link))) {
		TAILQ_INSERT_AFTER(&r->msgs, h, m, link);
	} else {
		struct rmsg *p = last;
		while (p && msg_before(m, p))
			p = TAILQ_PREV(p, rmsg_list, link);
		if (p)
			TAILQ_INSERT_AFTER(&r->msgs, p, m, link);
		else
			TAILQ_INSERT_HEAD(&r->msgs, m, link);
	}
	r->insert_hint = m;
	/* older than where the delay notices' walk is: it must see this one */
	if (r->warned_upto && msg_before(m, r->warned_upto))
		r->warned_upto = TAILQ_PREV(m, rmsg_list, link);
}

/* The retry times and attempt counts the queue kept for m's recipients (doc/QUEUE.md,
 * "Retry times"): after a restart nothing deferred is due before its time. */
static void load_retry(struct relay *r, struct rmsg *m)
{
	uint64_t next_one, *next = m->nrcpt <= 1 ? &next_one : calloc(m->nrcpt, sizeof(*next));
	uint32_t att_one, *att = m->nrcpt <= 1 ? &att_one : calloc(m->nrcpt, sizeof(*att));
	if (next && att && queue_get_retry(r->q, m->id, m->nrcpt, next, att) == 0)
		for (size_t i = 0; i < m->nrcpt; i++) {
			m->r[i].next_try = next[i] * 1000;
			m->r[i].attempts = att[i];
		}
	if (next != &next_one)
		free(next);
	if (att != &att_one)
		free(att);
}

int msg_load(struct relay *r, const char *id, struct rmsg **ret_m)
{
	struct rmsg *have = msg_find(r, id);
	if (have) {
		if (ret_m)
			*ret_m = have;
		return 0;
	}
	struct queue_msg qm;
	const char *why = NULL;
	int rc = queue_msg_open(r->qd, id, &qm, &why);
	if (rc < 0) {
		if (rc != -ENOENT)
			base_logf(r, LOG_LEVEL_ERROR, "qid=%s cannot be opened for delivery: %s", id,
			     why ? why : strerror(-rc));
		return rc;
	}
	const struct queue_index *ix = &qm.ix;
	struct rmsg *m = calloc(1, sizeof(*m));
	size_t blen = ix->env.sender.len + 1;
	for (size_t i = 0; i < ix->nrcpt; i++)
		blen += ix->rcpt[i].addr.len + 1;
	if (m) {
		m->block = malloc(blen);
		m->addr = calloc(ix->nrcpt, sizeof(*m->addr));
		m->r = calloc(ix->nrcpt, sizeof(*m->r));
	}
	if (!m || !m->block || !m->addr || !m->r) {
		if (m) {
			free(m->block);
			free(m->addr);
			free(m->r);
			free(m);
		}
		queue_msg_close(&qm);
		return -ENOMEM;
	}
	snprintf(m->id, sizeof(m->id), "%s", ix->env.id);
	m->arrival_us = ix->env.arrival_us;
	m->size = ix->body_len;
	m->flags = ix->env.flags;
	char *p = m->block;
	memcpy(p, ix->env.sender.ptr, ix->env.sender.len);
	p[ix->env.sender.len] = '\0';
	m->sender = p;
	p += ix->env.sender.len + 1;
	m->nrcpt = ix->nrcpt;
	for (size_t i = 0; i < ix->nrcpt; i++) {
		memcpy(p, ix->rcpt[i].addr.ptr, ix->rcpt[i].addr.len);
		p[ix->rcpt[i].addr.len] = '\0';
		m->addr[i] = p;
		p += ix->rcpt[i].addr.len + 1;
		m->r[i].status = ix->rcpt[i].status;
		m->npending += m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN;
		m->r[i].notify = ix->rcpt[i].notify;
	}
	m->held = ix->control[QUEUE_CTL_HOLD] == 'H';
	m->bounce = ix->control[QUEUE_CTL_BOUNCE];
	m->warned = ix->control[QUEUE_CTL_WARNED] == 'W';
	m->is_dsn = ix->env.sender.len == 0 && ix->env.client.len == strlen(DSN_CLIENT) &&
		    memcmp(ix->env.client.ptr, DSN_CLIENT, ix->env.client.len) == 0;
	queue_msg_close(&qm);
	m->seq = r->msg_seq++;
	load_retry(r, m);
	msg_insert(r, m);
	rc = table_add(r, m);
	if (rc < 0) {
		msg_free(r, m);
		return rc;
	}
	if (ret_m)
		*ret_m = m;
	if (msg_route(r, m) < 0) {
		/* XXX its recipients without a lane wait for the next reload, which routes every
		 * message again */
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s some recipients cannot be routed: out of "
			  "memory or %u lanes; they wait for the next reload", m->id, MAX_LANES);
		return 1;
	}
	for (size_t i = 0; i < m->nrcpt; i++)
		if ((m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN) &&
		    !m->r[i].lane) {
			base_logf(r, LOG_LEVEL_WARNING, "qid=%s rcpt=<%.200s> no route matches its domain: "
			     "it stays queued", m->id, m->addr[i]);
		}
	return 1;
}


/* queue_file_body()'s callback: the pieces of m's body into a struct msg_body. */
int msg_body_collect(void *arg, struct str chunk)
{
	struct msg_body *b = arg;
	b->part[b->n++] = chunk;
	return 0;
}

/* ---- attempts and statuses ---- */

int msg_open_file(struct relay *r, struct rmsg *m)
{
	if (m->open) {
		if (!m->open_idle)
			return 0; /* in use */
		idle_remove(r, m);
		/* kept open since its last use: removed behind the relay's back since (`sluice
		 * queue delete` unlinks before the relay hears of it) is as gone as unopenable */
		struct stat st;
		if (fstat(m->qm->fd, &st) == 0 && st.st_nlink > 0)
			return 0;
		msg_really_close(r, m);
		return -ENOENT;
	}
	const char *why = NULL;
	/* the open file's index costs more than the rest of the message: only while open */
	struct queue_msg *qm = malloc(sizeof(*qm));
	if (!qm)
		return -ENOMEM;
	int rc = queue_msg_open(r->qd, m->id, qm, &why);
	if (rc < 0) {
		free(qm);
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s cannot be opened: %s", m->id, why ? why : strerror(-rc));
		return rc;
	}
	m->qm = qm;
	m->open = true;
	return 0;
}

/* One line of the attempt history: "ts=US rcpt=I status=S lane=L mta=M dsn=X.Y.Z reply=..."
 * -- the reply last, as it may hold anything but a newline.  The DSN reads these back. */
static void attempt_log(struct relay *r, struct rmsg *m, size_t i, const char *status,
			const char *lane, const char *mta, const char *dsn, const char *reply)
{
	char line[1600];
	int n = snprintf(line, sizeof(line), "ts=%" PRIu64 " rcpt=%zu status=%s lane=%s mta=%s "
			 "dsn=%s reply=%s", relay_now(r) / 1000, i, status, lane,
			 mta && *mta ? mta : "-", dsn && *dsn ? dsn : "-", reply ? reply : "");
	if (n > 0)
		queue_log_append(r->qd, m->id, str_make(line, (size_t)n < sizeof(line) ? (size_t)n
								   : sizeof(line) - 1));
}

/*
 * The administrator's line for one recipient's attempt (sluiced(8), LOGGING), like
 * Postfix's "status=sent" lines:
 *   delivery qid=Q rcpt=<A> lane=L relay=NAME[IP]:PORT status=S dsn=X.Y.Z reply="..."
 *            delay=1.2s attempts=N
 * status: sent, deferred, bounced, suspended, uncertain.  The address and the reply are
 * quoted (log_quote): the reply is the relay's text, the address came from a client.
 */
static void delivery_log(struct relay *r, enum log_level level, const struct rmsg *m, size_t i,
			 const char *lane, const char *relay, const char *status, const char *dsn,
			 const char *reply, const char *note)
{
	char addr[820], text[1300];
	log_quote(addr, sizeof(addr), str_cstr(m->addr[i]), 200);
	log_quote(text, sizeof(text), str_cstr(reply ? reply : ""), 300);
	uint64_t now_us = relay_now(r) / 1000;
	double delay = m->arrival_us && now_us > m->arrival_us
			       ? (double)(now_us - m->arrival_us) / 1e6 : 0.0;
	base_logf(r, level, "delivery qid=%s rcpt=<%s> lane=%s relay=%s status=%s dsn=%s reply=\"%s\" "
	     "delay=%.1fs attempts=%u%s%s", m->id, addr, lane && *lane ? lane : "-",
	     relay && *relay ? relay : "-", status, dsn && *dsn ? dsn : "-", text, delay,
	     (unsigned)m->r[i].attempts, note ? " " : "", note ? note : "");
}

static void set_status(struct relay *r, struct rmsg *m, size_t i, char st)
{
	struct rrcpt *rr = &m->r[i];
	bool was_pending = rr->status == QUEUE_TODO || rr->status == QUEUE_UNCERTAIN;
	int rc = m->open ? queue_set_status(r->q, m->qm, i, st) : -EBADF;
	m->dirty |= rc == 0;
	if (rc < 0) {
		/* the byte is not on disk: the recipient is sent again after a restart */
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s rcpt=%zu status %c cannot be written: %s", m->id, i, st,
		     strerror(-rc));
	}
	rr->status = st;
	bool pending = st == QUEUE_TODO || st == QUEUE_UNCERTAIN;
	if (pending && !was_pending)
		m->npending++;
	else if (was_pending && !pending)
		m->npending--;
	if (was_pending && !pending && rr->lane) {
		struct lane_item *it = msg_rcpt_item(m, i);
		if (it && it->pending) {
			it->pending--;
			rr->lane->waiting--;
		}
	}
}

static void rcpt_retry(struct relay *r, struct rmsg *m, size_t i, int64_t hint_ms)
{
	struct rrcpt *rr = &m->r[i];
	const struct relay_conf *c = &r->crt->conf;
	uint64_t d;
	if (hint_ms > 0) {
		d = (uint64_t)hint_ms * 1000000u;
	} else {
		d = (uint64_t)c->retry_min_ms * 1000000u;
		for (uint32_t k = 1; k < rr->attempts && d < (uint64_t)c->retry_max_ms * 1000000u; k++)
			d *= 2;
		if (d > (uint64_t)c->retry_max_ms * 1000000u)
			d = (uint64_t)c->retry_max_ms * 1000000u;
	}
	rr->next_try = relay_now(r) + jitter(d, 10, 10); /* refused together, retried apart */
	/* kept by the queue (one record appended), so that a restart keeps the backoff;
	 * rounded up: never due earlier than here */
	int e = queue_set_retry(r->q, m->id, i, (rr->next_try + 999) / 1000, rr->attempts);
	if (e < 0)
		base_logf(r, LOG_LEVEL_WARNING, "qid=%s rcpt=%zu retry time cannot be kept: %s "
			  "(after a restart it is due at once)", m->id, i, strerror(-e));
}

/*
 * The one writer of a recipient's fate: recipient i of m becomes what o says (its
 * status byte written in place, its attempts, its next try kept in the retry journal),
 * its attempt-log and delivery lines are written, and the counters move (the relay's,
 * and those of l, the lane that acted, or NULL).  mta: the server's name ("" none);
 * text: the reply or the reason.  m's file must be open for the status byte to be
 * written (else the error is logged: the recipient is sent again after a restart); the
 * caller hands the bytes to the flusher (flush_post) once it has written them all.
 */
void msg_rcpt_settle(struct relay *r, struct rmsg *m, size_t i, struct lane *l, const char *mta,
		     const struct outcome *o, const char *text)
{
	struct rrcpt *rr = &m->r[i];
	const char *lane = l ? l->name : "-";
	if (o->attempts < 0 && rr->attempts)
		rr->attempts--;
	else if (o->attempts > 0)
		rr->attempts++;
	if (o->status)
		set_status(r, m, i, o->status);
	if (o->next == OUTCOME_NEXT_NOW) {
		rr->next_try = 0;
	} else if (o->next == OUTCOME_NEXT_BACKOFF) {
		rcpt_retry(r, m, i, o->hint_ms);
		r->st.deferred++;
		if (l)
			l->deferred++;
	}
	if (o->attempt)
		attempt_log(r, m, i, o->attempt, lane, mta, o->attempt_dsn ? o->dsn : "", text);
	if (o->word)
		delivery_log(r, o->level, m, i, lane, mta, o->word, o->dsn, text, o->note);
	switch (o->count) {
	case OUTCOME_COUNT_NONE:
		break;
	case OUTCOME_COUNT_DELIVERED:
		r->st.delivered++;
		if (l)
			l->delivered++;
		break;
	case OUTCOME_COUNT_FAILED:
		r->st.failed++;
		if (l)
			l->failed++;
		break;
	case OUTCOME_COUNT_UNCERTAIN:
		r->st.uncertain++;
		break;
	}
}

/* The operator's `sluice queue flush`: every recipient of m is due at once. */
void msg_flush_now(struct relay *r, struct rmsg *m)
{
	struct outcome o;
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_DUE_NOW }, &o);
	for (size_t i = 0; i < m->nrcpt; i++)
		msg_rcpt_settle(r, m, i, m->r[i].lane, "", &o, NULL);
}

/* Recipient i of m is taken by a transaction: busy, and one more attempt. */
void msg_rcpt_take(struct rmsg *m, size_t i)
{
	m->r[i].busy = true;
	m->r[i].attempts++;
}

/* Its transaction is over (its outcome was settled before). */
void msg_rcpt_release(struct rmsg *m, size_t i)
{
	m->r[i].busy = false;
}

/* ---- the end of a message ---- */

void msg_recheck_later(struct relay *r, struct rmsg *m)
{
	if (m->recheck)
		return;
	if (r->nrecheck == r->recheck_cap) {
		size_t cap = r->recheck_cap ? r->recheck_cap * 2 : 16;
		char (*n)[QUEUE_ID_LEN + 1] = realloc(r->recheck, cap * sizeof(*n));
		if (!n)
			return; /* XXX it waits for the next start */
		r->recheck = n;
		r->recheck_cap = cap;
	}
	memcpy(r->recheck[r->nrecheck++], m->id, QUEUE_ID_LEN + 1);
	m->recheck = true;
}

bool msg_check_done(struct relay *r, struct rmsg *m)
{
	if (m->busy || m->bouncing || m->flushing)
		return false;
	if (m->deleted) {
		msg_free(r, m);
		return false;
	}
	if (m->npending)
		return false; /* not one walk over the recipients per transaction */
	bool failed = false, notice = false;
	for (size_t i = 0; i < m->nrcpt; i++) {
		char s = m->r[i].status;
		failed |= s == QUEUE_FAILED;
		notice |= (s == QUEUE_FAILED && rcpt_notify_wants(&m->r[i], QUEUE_NOTIFY_FAILURE)) ||
			  (s == QUEUE_RELAYED && *m->sender);
	}
	if (failed && !notice && m->bounce != 'S')
		base_logf(r, LOG_LEVEL_INFO, "qid=%s bounce not sent: the failed recipients asked "
			  "for none (NOTIFY); they are in the attempt log", m->id);
	if (notice && m->bounce != 'S') {
		if (m->bounce != 'P' && msg_open_file(r, m) == 0) {
			/* the bounce is due (doc/QUEUE.md): recovery queues it if we crash */
			queue_set_control(r->q, m->qm, QUEUE_CTL_BOUNCE, 'P');
			queue_msg_sync(m->qm);
			m->bounce = 'P';
			msg_close_file(r, m);
		}
		return true; /* its bounce is due: the caller starts it (bounce_check) */
	}
	/* finished, and every status byte is on disk (flushed where it was written) */
	if (m->dirty && (msg_open_file(r, m) < 0 || queue_msg_sync(m->qm) < 0)) {
		base_logf(r, LOG_LEVEL_ERROR, "qid=%s finished, but its statuses cannot be "
			  "flushed: it stays until they are", m->id);
		msg_recheck_later(r, m);
		return false;
	}
	queue_remove_finished(r->q, m->id);
	base_logf(r, LOG_LEVEL_INFO, "qid=%s removed: finished", m->id);
	msg_free(r, m);
	return false;
}
