/*
 * store -- what every backend shares: the (rule, key) identity hash, store_free(), and the
 * entry points that check a call before the backend sees it.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* for XXH3_state_t on the stack: the library is a system package of one version */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "store.h"
#include "util.h"

/*
 * XXH3 over rule, a 0 byte, key, keyed with the store's seed.  The separator keeps
 * ("ab", "c") apart from ("a", "bc"); a rule name holds no NUL (the configuration parser
 * sees to that), so the boundary is unambiguous.  Short inputs are hashed in one call
 * from a stack copy; longer ones (keys of header values, say) with the streaming API.
 */
uint64_t store_key_hash(const struct store *s, struct str rule, struct str key)
{
	return store_key_hash_seed(s->seed, rule, key);
}

uint64_t store_key_hash_seed(uint64_t seed, struct str rule, struct str key)
{
	char tmp[256];
	if (rule.len + 1 + key.len <= sizeof(tmp)) {
		if (rule.len)
			memcpy(tmp, rule.ptr, rule.len);
		tmp[rule.len] = '\0';
		if (key.len)
			memcpy(tmp + rule.len + 1, key.ptr, key.len);
		return XXH3_64bits_withSeed(tmp, rule.len + 1 + key.len, seed);
	}
	XXH3_state_t st;
	XXH3_64bits_reset_withSeed(&st, seed);
	XXH3_64bits_update(&st, rule.ptr, rule.len);
	XXH3_64bits_update(&st, "", 1);
	XXH3_64bits_update(&st, key.ptr, key.len);
	return XXH3_64bits_digest(&st);
}

struct store *store_free(struct store *s)
{
	if (!s)
		return NULL;
	if (s->ops && s->ops->destroy)
		s->ops->destroy(s->ctx);
	store_ov_free(s->ov);
	free(s);
	return NULL;
}

/* One answered decision into the metrics: two relaxed increments and a bucket. */
static void observe(struct store *s, int rc, uint64_t started_ns)
{
	uint64_t ns = now_ns() - started_ns;
	unsigned k = thread_shard();
	struct store_metrics *m = &s->m[k];
	counter_add(&m->decisions, k, 1);
	if (rc < 0)
		counter_add(&m->errors, k, 1);
	counter_add(&m->latency[stat_hist_index((double)ns / 1e9)], k, 1);
	counter_add(&m->latency_sum_ns, k, ns);
}

int store_decide(struct store *s, struct store_item *items, size_t n, enum store_mode mode,
		 uint64_t now)
{
	uint64_t t0 = now_ns();
	int rc = s->ops->decide(s->ctx, items, n, mode, now);
	observe(s, rc, t0);
	return rc;
}

void store_metrics_get(const struct store *s, uint64_t *ret_decisions, uint64_t *ret_errors,
		       struct stat_hist *ret_latency)
{
	struct stat_hist h = { 0 };
	uint64_t decisions = 0, errors = 0, sum_ns = 0;
	for (unsigned k = 0; k < THREAD_SHARDS; k++) {
		const struct store_metrics *m = &s->m[k];
		for (unsigned i = 0; i < STAT_HIST_BUCKETS; i++)
			h.bucket[i] += atomic_load_explicit(&m->latency[i], memory_order_relaxed);
		sum_ns += atomic_load_explicit(&m->latency_sum_ns, memory_order_relaxed);
		decisions += atomic_load_explicit(&m->decisions, memory_order_relaxed);
		errors += atomic_load_explicit(&m->errors, memory_order_relaxed);
	}
	h.sum = (double)sum_ns / 1e9;
	*ret_decisions = decisions;
	*ret_errors = errors;
	*ret_latency = h;
}

/* A pending call's answer: counted, then given to the caller. */
static void call_done(struct store_call *c, int rc)
{
	c->done = c->caller_done;
	observe(c->store, rc, c->started_ns);
	c->done(c, rc);
}

int store_decide_start(struct store *s, struct store_call *c)
{
	c->req = NULL;
	if (s->ops->decide_start) {
		/* the backend answers later through c->done: put ourselves in between */
		c->caller_done = c->done;
		c->store = s;
		c->started_ns = now_ns();
		c->done = call_done;
		int rc = s->ops->decide_start(s->ctx, c);
		if (rc != STORE_PENDING) {
			c->done = c->caller_done;
			observe(s, rc, c->started_ns);
		}
		return rc;
	}
	if (c->mode == STORE_RESET) {
		int any = 0;
		for (size_t i = 0; i < c->n; i++)
			any |= s->ops->reset(s->ctx, c->items[i].key_hash, c->items[i].limits) > 0;
		return any;
	}
	return store_decide(s, c->items, c->n, c->mode, c->now);
}

void store_call_cancel(struct store *s, struct store_call *c)
{
	if (c->req && s->ops->cancel)
		s->ops->cancel(s->ctx, c);
	c->req = NULL;
}

int store_slot_enter(struct store *s, struct store_slot_call *c)
{
	c->req = NULL;
	return s->ops->slot_enter ? s->ops->slot_enter(s->ctx, c) : 1;
}

void store_slot_cancel(struct store *s, struct store_slot_call *c)
{
	if (c->req && s->ops->slot_cancel)
		s->ops->slot_cancel(s->ctx, c);
	c->req = NULL;
}

void store_slot_release(struct store *s, const char *cls)
{
	if (s->ops->slot_release)
		s->ops->slot_release(s->ctx, cls);
}

bool store_is_shared(const struct store *s)
{
	return s->ops->slot_enter != NULL;
}

int store_slide_start(struct store *s, struct store_slide_call *c)
{
	c->req = NULL;
	if (!s->ops->slide_start)
		return -ENOTSUP;
	if (!c->name || !c->name[0] || strlen(c->name) > STORE_SLIDE_NAME || c->nwin == 0 ||
	    c->nwin > RATE_MAX_WINDOWS || !c->done)
		return -EINVAL;
	return s->ops->slide_start(s->ctx, c);
}

void store_slide_cancel(struct store *s, struct store_slide_call *c)
{
	if (c->req && s->ops->slide_cancel)
		s->ops->slide_cancel(s->ctx, c);
	c->req = NULL;
}
