/*
 * store_ov -- run-time per-key limits: the table every decision asks first (store.h,
 * "run-time per-key limits").
 *
 * Readers (every decision, on the worker threads) look a (rule, key) up by its key_hash
 * without a lock: the table in use is immutable and published through one atomic pointer,
 * NULL while it is empty, so that a store without run-time limits costs a decision one
 * atomic load.  A reader that finds a table brackets the lookup and the copy of the limits
 * in ebr_enter() ... ebr_exit() and keeps no pointer into it (policy_overrides.c keeps
 * the overrides files' tables the same way).
 *
 * Writers (operator commands, the Redis sync thread, the snapshot loader) are rare: each
 * change builds a whole new table under the mutex (copy + change, O(n); entries expired by
 * then are dropped), publishes it, and ebr_retire()s the old one, which is freed once no
 * reader section that could have loaded it is still running.  The current table is freed
 * directly by store_ov_free(), when no reader can be left.
 *
 * A table is one allocation: a header, an open-addressing index over the key_hashes
 * (linear probing, at most half full), the records, and their rule and key texts.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ebr.h"
#include "store.h"

struct ov_rec {
	uint64_t key_hash;
	uint64_t until_ns;
	struct rate_limits limits;
	uint32_t text;          /* offset of the rule's bytes, the key's follow */
	uint16_t rule_len;
	uint16_t key_len;
};

struct ov_table {
	size_t n;
	size_t mask;            /* index slots - 1 */
	uint32_t *index;        /* record + 1, 0: empty */
	struct ov_rec *recs;
	char *text;
	size_t text_len;
};

struct store_ov {
	_Atomic(struct ov_table *) cur;  /* NULL: no entry */
	pthread_mutex_t lock;            /* writers */
};

static inline bool live(const struct ov_rec *r, uint64_t now)
{
	return r->until_ns == 0 || r->until_ns > now;
}

static void table_free(void *p)
{
	free(p);
}

static long table_find(const struct ov_table *t, uint64_t key_hash)
{
	for (size_t i = (size_t)(key_hash ^ key_hash >> 29) & t->mask;; i = (i + 1) & t->mask) {
		uint32_t v = t->index[i];
		if (v == 0)
			return -1;
		if (t->recs[v - 1].key_hash == key_hash)
			return (long)(v - 1);
	}
}

bool store_ov_entry_valid(const struct store_ov_entry *e)
{
	if (e->rule.len == 0 || e->rule.len > STORE_OV_RULE || e->key.len == 0 ||
	    e->key.len > RATE_MAX_OVERRIDE_KEY || e->limits.n > RATE_MAX_WINDOWS)
		return false;
	if (memchr(e->rule.ptr, '\0', e->rule.len) || memchr(e->rule.ptr, ' ', e->rule.len))
		return false;
	for (unsigned i = 0; i < e->limits.n; i++)
		if (e->limits.w[i].count == 0 || e->limits.w[i].period_ns == 0 ||
		    e->limits.w[i].burst == 0)
			return false;
	return true;
}

/*
 * A new table of the live entries of old (may be NULL) but the one of skip_hash, plus
 * add[0..nadd) (later ones replace earlier ones and old's of the same key_hash).  0 and
 * *ret (NULL when nothing is left), -E2BIG past STORE_OV_MAX, -ENOMEM.
 */
static int table_build(const struct ov_table *old, uint64_t skip_hash, bool skip,
		       const struct store_ov_entry *add, size_t nadd, uint64_t now,
		       struct ov_table **ret)
{
	size_t n = 0, text = 0;
	if (old)
		for (size_t i = 0; i < old->n; i++) {
			const struct ov_rec *r = &old->recs[i];
			if (!live(r, now) || (skip && r->key_hash == skip_hash))
				continue;
			n++;
			text += (size_t)r->rule_len + r->key_len;
		}
	for (size_t i = 0; i < nadd; i++) {
		n++;
		text += add[i].rule.len + add[i].key.len;
	}
	if (n == 0) {
		*ret = NULL;
		return 0;
	}
	size_t slots = 16;
	while (slots < 2 * n)
		slots *= 2;
	size_t size = sizeof(struct ov_table) + slots * sizeof(uint32_t);
	size = (size + 15) & ~(size_t)15;
	size_t recs_off = size;
	size += n * sizeof(struct ov_rec);
	size_t text_off = size;
	size += text + 1;
	struct ov_table *t = calloc(1, size);
	if (!t)
		return -ENOMEM;
	t->mask = slots - 1;
	t->index = (uint32_t *)(t + 1);
	t->recs = (struct ov_rec *)((char *)t + recs_off);
	t->text = (char *)t + text_off;
	/* adds first, last one winning, so that old's entries of the same hash are skipped */
	for (size_t k = nadd; k-- > 0;) {
		const struct store_ov_entry *e = &add[k];
		if (table_find(t, e->key_hash) >= 0)
			continue;
		struct ov_rec *r = &t->recs[t->n];
		*r = (struct ov_rec){ .key_hash = e->key_hash, .until_ns = e->until_ns,
				      .limits = e->limits, .text = (uint32_t)t->text_len,
				      .rule_len = (uint16_t)e->rule.len,
				      .key_len = (uint16_t)e->key.len };
		memcpy(t->text + t->text_len, e->rule.ptr, e->rule.len);
		memcpy(t->text + t->text_len + e->rule.len, e->key.ptr, e->key.len);
		t->text_len += e->rule.len + e->key.len;
		size_t i = (size_t)(e->key_hash ^ e->key_hash >> 29) & t->mask;
		while (t->index[i])
			i = (i + 1) & t->mask;
		t->index[i] = (uint32_t)++t->n;
	}
	if (old)
		for (size_t j = 0; j < old->n; j++) {
			const struct ov_rec *o = &old->recs[j];
			if (!live(o, now) || (skip && o->key_hash == skip_hash) ||
			    table_find(t, o->key_hash) >= 0)
				continue;
			struct ov_rec *r = &t->recs[t->n];
			*r = *o;
			r->text = (uint32_t)t->text_len;
			memcpy(t->text + t->text_len, old->text + o->text,
			       (size_t)o->rule_len + o->key_len);
			t->text_len += (size_t)o->rule_len + o->key_len;
			size_t i = (size_t)(o->key_hash ^ o->key_hash >> 29) & t->mask;
			while (t->index[i])
				i = (i + 1) & t->mask;
			t->index[i] = (uint32_t)++t->n;
		}
	if (t->n > STORE_OV_MAX) {
		free(t);
		return -E2BIG;
	}
	if (t->n == 0) {
		free(t);
		t = NULL;
	}
	*ret = t;
	return 0;
}

struct store_ov *store_ov_new(void)
{
	struct store_ov *ov = calloc(1, sizeof(*ov));
	if (!ov)
		return NULL;
	pthread_mutex_init(&ov->lock, NULL);
	return ov;
}

struct store_ov *store_ov_free(struct store_ov *ov)
{
	if (!ov)
		return NULL;
	/* no reader is left: the current table goes now, retired ones with the ebr list */
	free(atomic_load(&ov->cur));
	pthread_mutex_destroy(&ov->lock);
	free(ov);
	return NULL;
}

int store_ov_find(const struct store_ov *ov, uint64_t key_hash, uint64_t now,
		  struct rate_limits *ret, uint64_t *ret_until)
{
	if (!ov)
		return 0;
	struct store_ov *w = (struct store_ov *)ov;
	/* the common case, no run-time limit at all: one load, no section */
	if (!atomic_load_explicit(&w->cur, memory_order_relaxed))
		return 0;
	int found = 0;
	ebr_enter();
	const struct ov_table *t = atomic_load_explicit(&w->cur, memory_order_acquire);
	long i = t ? table_find(t, key_hash) : -1;
	if (i >= 0 && live(&t->recs[i], now)) {
		*ret = t->recs[i].limits;
		if (ret_until)
			*ret_until = t->recs[i].until_ns;
		found = 1;
	}
	ebr_exit();
	return found;
}

/* Publish t (may be NULL) and retire the old table; under the lock. */
static void publish(struct store_ov *ov, struct ov_table *t)
{
	struct ov_table *old = atomic_exchange(&ov->cur, t);
	if (old)
		ebr_retire(old, table_free);
}

int store_ov_put(struct store_ov *ov, const struct store_ov_entry *e, uint64_t now)
{
	if (!store_ov_entry_valid(e))
		return -EINVAL;
	pthread_mutex_lock(&ov->lock);
	struct ov_table *t;
	int rc = table_build(atomic_load(&ov->cur), 0, false, e, 1, now, &t);
	if (rc == 0)
		publish(ov, t);
	pthread_mutex_unlock(&ov->lock);
	ebr_collect();
	return rc;
}

int store_ov_del(struct store_ov *ov, uint64_t key_hash, uint64_t now)
{
	pthread_mutex_lock(&ov->lock);
	const struct ov_table *cur = atomic_load(&ov->cur);
	long i = cur ? table_find(cur, key_hash) : -1;
	int had = i >= 0 && live(&cur->recs[i], now);
	struct ov_table *t;
	int rc = i >= 0 ? table_build(cur, key_hash, true, NULL, 0, now, &t) : 0;
	if (i >= 0 && rc == 0)
		publish(ov, t);
	pthread_mutex_unlock(&ov->lock);
	ebr_collect();
	return rc < 0 ? rc : had;
}

int store_ov_replace(struct store_ov *ov, const struct store_ov_entry *e, size_t n,
		     uint64_t now)
{
	size_t k = 0;
	struct store_ov_entry *live_e = malloc((n ? n : 1) * sizeof(*live_e));
	if (!live_e)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (!store_ov_entry_valid(&e[i])) {
			free(live_e);
			return -EINVAL;
		}
		if (e[i].until_ns == 0 || e[i].until_ns > now)
			live_e[k++] = e[i];
	}
	struct ov_table *t;
	int rc = table_build(NULL, 0, false, live_e, k, now, &t);
	free(live_e);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&ov->lock);
	publish(ov, t);
	pthread_mutex_unlock(&ov->lock);
	ebr_collect();
	return 0;
}

int store_ov_list(struct store_ov *ov, uint64_t now, struct store_ov_entry **ret,
		  size_t *ret_n)
{
	/* under the writers' lock: the table cannot be retired while it is copied */
	pthread_mutex_lock(&ov->lock);
	const struct ov_table *t = atomic_load(&ov->cur);
	size_t n = t ? t->n : 0, text = t ? t->text_len : 0;
	struct store_ov_entry *e = malloc(n * sizeof(*e) + text + 1);
	if (!e) {
		pthread_mutex_unlock(&ov->lock);
		return -ENOMEM;
	}
	char *tx = (char *)(e + n);
	if (text)
		memcpy(tx, t->text, text);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const struct ov_rec *r = &t->recs[i];
		if (!live(r, now))
			continue;
		e[k++] = (struct store_ov_entry){
			.key_hash = r->key_hash, .until_ns = r->until_ns, .limits = r->limits,
			.rule = str_make(tx + r->text, r->rule_len),
			.key = str_make(tx + r->text + r->rule_len, r->key_len) };
	}
	pthread_mutex_unlock(&ov->lock);
	*ret = e;
	*ret_n = k;
	return 0;
}

size_t store_ov_count(struct store_ov *ov, uint64_t now)
{
	if (!ov || !atomic_load_explicit(&ov->cur, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&ov->lock);
	const struct ov_table *t = atomic_load(&ov->cur);
	size_t k = 0;
	for (size_t i = 0; t && i < t->n; i++)
		k += live(&t->recs[i], now);
	pthread_mutex_unlock(&ov->lock);
	return k;
}

int store_ov_change(struct store *s, struct store_ov_call *c)
{
	if (!s->ov)
		return -ENOTSUP;
	if (!c->unset && !store_ov_entry_valid(&c->e))
		return -EINVAL;
	if (s->ops->ov_change)
		return s->ops->ov_change(s->ctx, c);
	uint64_t now = realtime_ns();
	if (c->unset)
		return store_ov_del(s->ov, c->e.key_hash, now);
	return store_ov_put(s->ov, &c->e, now);
}
