/*
 * store -- what every backend shares: the (rule, key) identity hash and store_free().
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
