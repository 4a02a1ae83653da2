/*
 * relay_sched -- the relay's scheduler (relay_sched.h): binary heaps of items per lane, and of lanes
 * by wake-up.  Pure: no I/O, no clock.
 *
 * The heaps are indexed (each element knows its position), so an element moves or leaves
 * in O(log n) wherever it is.  One heap implementation serves the three orders; the order
 * and the position field are given by a small table per kind.
 */
#include <errno.h>
#include <stdlib.h>

#include "relay_sched.h"

struct heap_kind {
	bool (*less)(const void *a, const void *b);
	void (*set_pos)(void *e, uint32_t pos);
};

static bool due_less(const void *a, const void *b)
{
	const struct sched_item *x = a, *y = b;
	return x->arrival != y->arrival ? x->arrival < y->arrival : x->seq < y->seq;
}

static bool wait_less(const void *a, const void *b)
{
	const struct sched_item *x = a, *y = b;
	return x->due != y->due ? x->due < y->due : due_less(a, b);
}

static void item_pos(void *e, uint32_t pos)
{
	((struct sched_item *)e)->pos = pos;
}

static bool lane_less(const void *a, const void *b)
{
	return ((const struct sched_lane *)a)->wake < ((const struct sched_lane *)b)->wake;
}

static void lane_pos(void *e, uint32_t pos)
{
	((struct sched_lane *)e)->pos = pos;
}

static const struct heap_kind DUE = { due_less, item_pos };
static const struct heap_kind WAIT = { wait_less, item_pos };
static const struct heap_kind LANES = { lane_less, lane_pos };

static void heap_place(struct sched_heap *h, const struct heap_kind *k, uint32_t i, void *e)
{
	h->v[i] = e;
	k->set_pos(e, i);
}

static void heap_up(struct sched_heap *h, const struct heap_kind *k, uint32_t i)
{
	void *e = h->v[i];
	while (i > 0) {
		uint32_t parent = (i - 1) / 2;
		if (!k->less(e, h->v[parent]))
			break;
		heap_place(h, k, i, h->v[parent]);
		i = parent;
	}
	heap_place(h, k, i, e);
}

static void heap_down(struct sched_heap *h, const struct heap_kind *k, uint32_t i)
{
	void *e = h->v[i];
	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && k->less(h->v[c + 1], h->v[c]))
			c++;
		if (!k->less(h->v[c], e))
			break;
		heap_place(h, k, i, h->v[c]);
		i = c;
	}
	heap_place(h, k, i, e);
}

static int heap_push(struct sched_heap *h, const struct heap_kind *k, void *e)
{
	if (h->n == h->cap) {
		uint32_t cap = h->cap ? h->cap * 2 : 4;
		if (cap <= h->cap)
			return -ENOMEM;
		void **v = realloc(h->v, (size_t)cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	h->v[h->n] = e;
	heap_up(h, k, h->n++);
	return 0;
}

static void heap_remove(struct sched_heap *h, const struct heap_kind *k, uint32_t i)
{
	void *last = h->v[--h->n];
	if (i == h->n)
		return;
	/* the last element fills the hole, then goes up or down as its order asks */
	heap_place(h, k, i, last);
	if (i > 0 && k->less(last, h->v[(i - 1) / 2]))
		heap_up(h, k, i);
	else
		heap_down(h, k, i);
}

static void heap_free(struct sched_heap *h)
{
	free(h->v);
	*h = (struct sched_heap){ 0 };
}

/* ---- items ---- */

void sched_lane_init(struct sched_lane *l)
{
	*l = (struct sched_lane){ .wake = SCHED_NEVER };
}

void sched_lane_done(struct sched_lane *l)
{
	for (uint32_t i = 0; i < l->due.n; i++)
		((struct sched_item *)l->due.v[i])->where = SCHED_NONE;
	for (uint32_t i = 0; i < l->wait.n; i++)
		((struct sched_item *)l->wait.v[i])->where = SCHED_NONE;
	heap_free(&l->due);
	heap_free(&l->wait);
}

size_t sched_lane_items(const struct sched_lane *l)
{
	return (size_t)l->due.n + l->wait.n;
}

void sched_item_remove(struct sched_lane *l, struct sched_item *it)
{
	if (it->where == SCHED_DUE)
		heap_remove(&l->due, &DUE, it->pos);
	else if (it->where == SCHED_WAIT)
		heap_remove(&l->wait, &WAIT, it->pos);
	it->where = SCHED_NONE;
}

int sched_item_set(struct sched_lane *l, struct sched_item *it, uint64_t due, uint64_t now)
{
	enum sched_where to = due == SCHED_NEVER ? SCHED_NONE : due <= now ? SCHED_DUE : SCHED_WAIT;
	if (it->where == to && to == SCHED_DUE) {
		it->due = due; /* the due heap's order does not depend on it */
		return 0;
	}
	if (it->where == to && to == SCHED_WAIT) {
		it->due = due;
		heap_up(&l->wait, &WAIT, it->pos);
		heap_down(&l->wait, &WAIT, it->pos);
		return 0;
	}
	sched_item_remove(l, it);
	it->due = due;
	if (to == SCHED_NONE)
		return 0;
	int e = to == SCHED_DUE ? heap_push(&l->due, &DUE, it) : heap_push(&l->wait, &WAIT, it);
	if (e < 0)
		return e;
	it->where = (uint8_t)to;
	return 0;
}

struct sched_item *sched_next(struct sched_lane *l, uint64_t now)
{
	while (l->wait.n) {
		struct sched_item *it = l->wait.v[0];
		if (it->due > now)
			break;
		heap_remove(&l->wait, &WAIT, 0);
		it->where = SCHED_NONE;
		/* due's heap has room for one more or grows; on failure the item stays in
		 * wait, where it is found again next time */
		if (heap_push(&l->due, &DUE, it) < 0) {
			heap_push(&l->wait, &WAIT, it);
			it->where = SCHED_WAIT;
			break;
		}
		it->where = SCHED_DUE;
	}
	return l->due.n ? l->due.v[0] : NULL;
}

uint64_t sched_lane_next_due(const struct sched_lane *l)
{
	if (l->due.n)
		return 0;
	return l->wait.n ? ((const struct sched_item *)l->wait.v[0])->due : SCHED_NEVER;
}

/* ---- lanes' wake-ups ---- */

void sched_init(struct sched *s)
{
	*s = (struct sched){ 0 };
}

void sched_done(struct sched *s)
{
	for (uint32_t i = 0; i < s->lanes.n; i++)
		((struct sched_lane *)s->lanes.v[i])->wake = SCHED_NEVER;
	heap_free(&s->lanes);
}

int sched_wake(struct sched *s, struct sched_lane *l, uint64_t at)
{
	if (l->wake != SCHED_NEVER) {
		if (at != SCHED_NEVER) {
			l->wake = at;
			heap_up(&s->lanes, &LANES, l->pos);
			heap_down(&s->lanes, &LANES, l->pos);
			return 0;
		}
		heap_remove(&s->lanes, &LANES, l->pos);
		l->wake = SCHED_NEVER;
		return 0;
	}
	if (at == SCHED_NEVER)
		return 0;
	l->wake = at;
	int e = heap_push(&s->lanes, &LANES, l);
	if (e < 0)
		l->wake = SCHED_NEVER;
	return e;
}

struct sched_lane *sched_pop(struct sched *s, uint64_t now)
{
	if (!s->lanes.n)
		return NULL;
	struct sched_lane *l = s->lanes.v[0];
	if (l->wake > now)
		return NULL;
	heap_remove(&s->lanes, &LANES, 0);
	l->wake = SCHED_NEVER;
	return l;
}

uint64_t sched_next_wake(const struct sched *s)
{
	return s->lanes.n ? ((const struct sched_lane *)s->lanes.v[0])->wake : SCHED_NEVER;
}

/* ---- a lane's decision ---- */

void sched_decide(const struct sched_lane_state *st, uint64_t now, struct sched_decision *ret)
{
	*ret = (struct sched_decision){ .action = SCHED_SLEEP, .wake = SCHED_NEVER };
	if (st->suspended_until > now) {
		ret->wake = st->suspended_until;
		ret->close_idle = true;
		return;
	}
	if (!st->work_due) {
		ret->wake = st->next_due;
		return;
	}
	if (st->idle) {
		ret->action = SCHED_SEND;
		return;
	}
	uint64_t wait = st->budget_shared ? 0 : st->budget_wait;
	if (wait) {
		ret->wake = now + wait;
		return;
	}
	unsigned cap = st->max_conns ? st->max_conns : 1;
	ret->action = st->conns < cap && st->connecting == 0 ? SCHED_CONNECT : SCHED_HOLD;
}
