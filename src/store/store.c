/*
 * store -- what every backend shares: the (rule, key) identity hash, store_free(), and the
 * entry points that check a call before the backend sees it.
 */
#include <stdlib.h>
#include <string.h>

/* for XXH3_state_t on the stack: the library is a system package of one version */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "store.h"

/*
 * XXH3 over rule, a 0 byte, key, keyed with the store's seed.  The separator keeps
 * ("ab", "c") apart from ("a", "bc"); a rule name holds no NUL (the configuration parser
 * sees to that), so the boundary is unambiguous.  Short inputs are hashed in one call
 * from a stack copy; longer ones (keys of header values, say) with the streaming API.
 */
uint64_t store_key_hash(const struct store *s, struct str rule, struct str key)
{
	char tmp[256];
	if (rule.len + 1 + key.len <= sizeof(tmp)) {
		if (rule.len)
			memcpy(tmp, rule.ptr, rule.len);
		tmp[rule.len] = '\0';
		if (key.len)
			memcpy(tmp + rule.len + 1, key.ptr, key.len);
		return XXH3_64bits_withSeed(tmp, rule.len + 1 + key.len, s->seed);
	}
	XXH3_state_t st;
	XXH3_64bits_reset_withSeed(&st, s->seed);
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
	free(s);
	return NULL;
}

int store_decide_start(struct store *s, struct store_call *c)
{
	c->req = NULL;
	if (s->ops->decide_start)
		return s->ops->decide_start(s->ctx, c);
	if (c->mode == STORE_RESET) {
		int any = 0;
		for (size_t i = 0; i < c->n; i++)
			any |= s->ops->reset(s->ctx, c->items[i].key_hash, c->items[i].limits) > 0;
		return any;
	}
	return s->ops->decide(s->ctx, c->items, c->n, c->mode, c->now);
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
