/*
 * sessions -- count = "sessions" rules: SMTP sessions at once per (rule, key).
 *
 * The counters live apart from any rule set, in one registry keyed by the (rule, key)
 * hash, so that a reload keeps them and a session that took a slot under an old rule set
 * gives it back to the same counter (as host classes do, class.c).  The registry is
 * SESS_SHARDS hash tables, each behind its own mutex; an entry exists while its count is
 * above 0, so the registry holds at most one entry per slot held.  At most
 * SESS_MAX_KEYS entries: past it a new key is not counted (the caller lets the session
 * through: a limit that cannot be kept must not refuse mail) and sessions_stats() says so.
 *
 * A session's slots are listed in its struct policy_sessions (owned by the session, see
 * policy.h), so that each is given back exactly once, when the session ends.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sessions.h"
#include "util.h"

#define SESS_SHARDS 64
#define SESS_MAX_KEYS 1000000u

struct sess_entry {
	uint64_t key_hash;
	unsigned count;
	struct sess_entry *next;
};

struct sess_shard {
	pthread_mutex_t lock;
	struct sess_entry **buckets;
	size_t nbuckets; /* a power of 2, or 0 before the first entry */
	size_t count;
} __attribute__((aligned(64)));

static struct sess_shard shards[SESS_SHARDS];
static pthread_once_t shards_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t total;
static _Atomic uint64_t overflows;

static void shards_init(void)
{
	for (size_t i = 0; i < SESS_SHARDS; i++)
		pthread_mutex_init(&shards[i].lock, NULL);
}

static struct sess_shard *shard_of(uint64_t h)
{
	pthread_once(&shards_once, shards_init);
	return &shards[h >> 58];
}

static struct sess_entry **find(struct sess_shard *sh, uint64_t h)
{
	if (!sh->nbuckets)
		return NULL;
	struct sess_entry **pp = &sh->buckets[h & (sh->nbuckets - 1)];
	while (*pp && (*pp)->key_hash != h)
		pp = &(*pp)->next;
	return pp;
}

/* Double the buckets at load 1 (a failure keeps the old table: chains just get longer). */
static void grow(struct sess_shard *sh)
{
	size_t nb = sh->nbuckets ? sh->nbuckets * 2 : 16;
	struct sess_entry **b = calloc(nb, sizeof(*b));
	if (!b)
		return;
	for (size_t i = 0; i < sh->nbuckets; i++)
		for (struct sess_entry *e = sh->buckets[i], *next; e; e = next) {
			next = e->next;
			e->next = b[e->key_hash & (nb - 1)];
			b[e->key_hash & (nb - 1)] = e;
		}
	free(sh->buckets);
	sh->buckets = b;
	sh->nbuckets = nb;
}

int sessions_take(uint64_t key_hash, unsigned max, bool force, unsigned *ret_count)
{
	struct sess_shard *sh = shard_of(key_hash);
	int rc = 1;
	pthread_mutex_lock(&sh->lock);
	struct sess_entry **pp = find(sh, key_hash);
	struct sess_entry *e = pp ? *pp : NULL;
	if (e) {
		if (e->count >= max && !force) {
			rc = 0;
		} else {
			e->count++;
		}
		*ret_count = e->count;
		pthread_mutex_unlock(&sh->lock);
		return rc;
	}
	if (max == 0 && !force) {
		*ret_count = 0;
		pthread_mutex_unlock(&sh->lock);
		return 0;
	}
	if (atomic_fetch_add(&total, 1) >= SESS_MAX_KEYS || !(e = malloc(sizeof(*e)))) {
		atomic_fetch_sub(&total, 1);
		atomic_fetch_add(&overflows, 1);
		pthread_mutex_unlock(&sh->lock);
		return -ENOMEM;
	}
	if (sh->count >= sh->nbuckets)
		grow(sh);
	if (!sh->nbuckets) {
		free(e);
		atomic_fetch_sub(&total, 1);
		atomic_fetch_add(&overflows, 1);
		pthread_mutex_unlock(&sh->lock);
		return -ENOMEM;
	}
	e->key_hash = key_hash;
	e->count = 1;
	size_t b = key_hash & (sh->nbuckets - 1);
	e->next = sh->buckets[b];
	sh->buckets[b] = e;
	sh->count++;
	*ret_count = 1;
	pthread_mutex_unlock(&sh->lock);
	return 1;
}

void sessions_give(uint64_t key_hash)
{
	struct sess_shard *sh = shard_of(key_hash);
	pthread_mutex_lock(&sh->lock);
	struct sess_entry **pp = find(sh, key_hash);
	struct sess_entry *e = pp ? *pp : NULL;
	if (e && --e->count == 0) {
		*pp = e->next;
		free(e);
		sh->count--;
		atomic_fetch_sub(&total, 1);
	}
	pthread_mutex_unlock(&sh->lock);
}

unsigned sessions_count(uint64_t key_hash)
{
	struct sess_shard *sh = shard_of(key_hash);
	pthread_mutex_lock(&sh->lock);
	struct sess_entry **pp = find(sh, key_hash);
	unsigned n = pp && *pp ? (*pp)->count : 0;
	pthread_mutex_unlock(&sh->lock);
	return n;
}

size_t sessions_list(uint64_t *ret_hash, unsigned *ret_count, size_t max)
{
	size_t n = 0;
	pthread_once(&shards_once, shards_init);
	for (size_t s = 0; s < SESS_SHARDS && n < max; s++) {
		struct sess_shard *sh = &shards[s];
		pthread_mutex_lock(&sh->lock);
		for (size_t b = 0; b < sh->nbuckets && n < max; b++)
			for (struct sess_entry *e = sh->buckets[b]; e && n < max; e = e->next) {
				ret_hash[n] = e->key_hash;
				ret_count[n++] = e->count;
			}
		pthread_mutex_unlock(&sh->lock);
	}
	return n;
}

void sessions_stats(uint64_t *ret_keys, uint64_t *ret_overflows)
{
	*ret_keys = atomic_load(&total);
	*ret_overflows = atomic_load(&overflows);
}
