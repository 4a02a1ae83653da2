/*
 * queue_table -- the queue's in-memory index: a skip list of entries (queue_table.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "queue_table.h"

/* Level 1 to QUEUE_TABLE_LEVELS, each further level with probability 1/4, from the ID's
 * hash: the same ID always gets the same level. */
static unsigned level_of(const char *id)
{
	uint64_t h = XXH64(id, QUEUE_ID_LEN, 0x51u);
	unsigned lv = 1;
	while (lv < QUEUE_TABLE_LEVELS && (h & 3) == 0) {
		lv++;
		h >>= 2;
	}
	return lv;
}

struct qentry *qentry_new(const char *id, uint64_t arrival_us, uint64_t size,
			  const char *names, size_t names_len, size_t nrcpt)
{
	if (nrcpt >= QUEUE_MAX_RECIPIENTS || names_len > UINT32_MAX)
		return NULL;
	unsigned lv = level_of(id);
	size_t head = sizeof(struct qentry) + lv * sizeof(struct qentry *);
	size_t total = head + nrcpt * (sizeof(struct qrcpt) + 1) + names_len;
	struct qentry *e = malloc(total);
	if (!e)
		return NULL;
	memset(e, 0, head);
	memcpy(e->id, id, QUEUE_ID_LEN);
	e->id[QUEUE_ID_LEN] = '\0';
	memset(e->control, '-', sizeof(e->control));
	e->level = (uint8_t)lv;
	e->nrcpt = (uint32_t)nrcpt;
	e->arrival_us = arrival_us;
	e->size = size;
	char *status = qentry_status(e);
	memcpy(status + nrcpt, names, names_len);
	struct qrcpt *r = qentry_rcpt(e);
	const char *end = names + names_len;
	const char *p = memchr(names, '\0', names_len);
	for (size_t i = 0; i < nrcpt; i++) {
		if (!p || p + 1 >= end) {
			free(e);
			return NULL;
		}
		p++;
		r[i] = (struct qrcpt){ .addr_off = (uint32_t)(p - names) };
		status[i] = QUEUE_TODO;
		p = memchr(p, '\0', (size_t)(end - p));
	}
	if (!p) {
		free(e);
		return NULL;
	}
	return e;
}

size_t qentry_bytes(const struct qentry *e)
{
	const char *s = qentry_sender(e);
	const char *last = e->nrcpt ? qentry_addr(e, e->nrcpt - 1) : s;
	return (size_t)(last + strlen(last) + 1 - (const char *)(const void *)e);
}

struct qentry *qentry_free(struct qentry *e)
{
	free(e);
	return NULL;
}

void queue_table_init(struct queue_table *t)
{
	memset(t, 0, sizeof(*t));
	t->levels = 1;
}

void queue_table_clear(struct queue_table *t)
{
	struct qentry *e = t->head[0];
	while (e) {
		struct qentry *next = e->fwd[0];
		free(e);
		e = next;
	}
	queue_table_init(t);
}

/* The forward pointer of level lv of node (NULL: the head). */
static struct qentry **fwd(struct queue_table *t, struct qentry *node, unsigned lv)
{
	return node ? &node->fwd[lv] : &t->head[lv];
}

/* For every level, the last node whose ID is below id (NULL: the head). */
static void find_before(struct queue_table *t, const char *id,
			struct qentry *before[QUEUE_TABLE_LEVELS])
{
	struct qentry *x = NULL;
	for (unsigned lv = t->levels; lv-- > 0;) {
		struct qentry *n;
		while ((n = *fwd(t, x, lv)) && memcmp(n->id, id, QUEUE_ID_LEN) < 0)
			x = n;
		before[lv] = x;
	}
}

static void count(struct queue_table *t, const struct qentry *e, int sign)
{
	uint64_t d = (uint64_t)(int64_t)sign; /* adds 1 or -1, modulo 2^64 */
	const char *st = qentry_status(e);
	const struct qrcpt *r = qentry_rcpt(e);
	for (size_t i = 0; i < e->nrcpt; i++) {
		switch (st[i]) {
		case QUEUE_TODO: t->rcpt_todo += d; break;
		case QUEUE_UNCERTAIN: t->rcpt_uncertain += d; break;
		case QUEUE_DELIVERED: case QUEUE_RELAYED: t->rcpt_delivered += d; break;
		case QUEUE_FAILED: t->rcpt_failed += d; break;
		}
		if (r[i].next_us || r[i].attempts)
			t->retry_live += d;
	}
	if (e->control[QUEUE_CTL_HOLD] == 'H')
		t->held += d;
	t->bytes += d * e->size;
	t->n += d;
}

int queue_table_insert(struct queue_table *t, struct qentry *e)
{
	struct qentry *before[QUEUE_TABLE_LEVELS];
	find_before(t, e->id, before);
	struct qentry *n = *fwd(t, before[0], 0);
	if (n && memcmp(n->id, e->id, QUEUE_ID_LEN) == 0)
		return -EEXIST;
	for (unsigned lv = t->levels; lv < e->level; lv++)
		before[lv] = NULL;
	if (e->level > t->levels)
		t->levels = e->level;
	for (unsigned lv = 0; lv < e->level; lv++) {
		struct qentry **p = fwd(t, before[lv], lv);
		e->fwd[lv] = *p;
		*p = e;
	}
	count(t, e, 1);
	return 0;
}

struct qentry *queue_table_get(const struct queue_table *t, const char *id)
{
	if (strnlen(id, QUEUE_ID_LEN + 1) != QUEUE_ID_LEN)
		return NULL;
	/* the last entry below id, then the one after it */
	const struct qentry *x = NULL;
	for (unsigned lv = t->levels; lv-- > 0;) {
		struct qentry *m;
		while ((m = x ? x->fwd[lv] : t->head[lv]) && memcmp(m->id, id, QUEUE_ID_LEN) < 0)
			x = m;
	}
	struct qentry *m = x ? x->fwd[0] : t->head[0];
	return m && memcmp(m->id, id, QUEUE_ID_LEN) == 0 ? m : NULL;
}

struct qentry *queue_table_remove(struct queue_table *t, const char *id)
{
	if (strnlen(id, QUEUE_ID_LEN + 1) != QUEUE_ID_LEN)
		return NULL;
	struct qentry *before[QUEUE_TABLE_LEVELS];
	find_before(t, id, before);
	struct qentry *e = *fwd(t, before[0], 0);
	if (!e || memcmp(e->id, id, QUEUE_ID_LEN) != 0)
		return NULL;
	for (unsigned lv = 0; lv < e->level; lv++)
		*fwd(t, before[lv], lv) = e->fwd[lv];
	while (t->levels > 1 && !t->head[t->levels - 1])
		t->levels--;
	count(t, e, -1);
	return e;
}

struct qentry *queue_table_first(const struct queue_table *t)
{
	return t->head[0];
}

struct qentry *queue_table_after(const struct queue_table *t, const char *id)
{
	const struct qentry *x = NULL;
	for (unsigned lv = t->levels; lv-- > 0;) {
		struct qentry *m;
		while ((m = x ? x->fwd[lv] : t->head[lv]) && memcmp(m->id, id, QUEUE_ID_LEN) <= 0)
			x = m;
	}
	return x ? x->fwd[0] : t->head[0];
}

void queue_table_set_status(struct queue_table *t, struct qentry *e, size_t i, char status)
{
	char *st = qentry_status(e);
	uint64_t *c[] = { &t->rcpt_todo, &t->rcpt_uncertain, &t->rcpt_delivered,
			  &t->rcpt_failed };
	const char k[] = { QUEUE_TODO, QUEUE_UNCERTAIN, QUEUE_DELIVERED, QUEUE_FAILED };
	/* N is counted as delivered */
	char was = st[i] == QUEUE_RELAYED ? QUEUE_DELIVERED : st[i];
	char now = status == QUEUE_RELAYED ? QUEUE_DELIVERED : status;
	for (size_t j = 0; j < 4; j++) {
		if (was == k[j])
			(*c[j])--;
		if (now == k[j])
			(*c[j])++;
	}
	st[i] = status;
}

void queue_table_set_control(struct queue_table *t, struct qentry *e, unsigned which,
			     char byte)
{
	if (which == QUEUE_CTL_HOLD)
		t->held += (byte == 'H') - (e->control[which] == 'H');
	e->control[which] = byte;
}

void queue_table_set_retry(struct queue_table *t, struct qentry *e, size_t i,
			   uint64_t next_us, uint32_t attempts)
{
	struct qrcpt *r = &qentry_rcpt(e)[i];
	bool was = r->next_us || r->attempts, is = next_us || attempts;
	t->retry_live += (uint64_t)is - (uint64_t)was;
	r->next_us = next_us;
	r->attempts = attempts;
}
