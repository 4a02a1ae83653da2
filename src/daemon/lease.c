/*
 * lease -- this node's leases in the shared store (Redis): the slots it holds of host
 * classes and of the keys of sessions rules, renewed at every beat of the main loop's
 * timer with the node's own counts, so that a node that dies gives its slots back when
 * its leases expire.
 *
 * One renewal: the classes (class_registry_counts()) and the sessions rules' keys
 * (sessions_list(), named by policy_sessions_key()) make one list of (name, count)
 * pairs, sent to the store in chunks.  A key renewed at the last beat and gone now is
 * renewed once more with 0, so that a renewal that crossed its last release on another
 * connection cannot keep a phantom slot for a whole lease.
 *
 * XXX every key held is renewed at every beat: a cost in the number of keys held
 * (sessions at once), not in decisions.
 */
#include <stdlib.h>

#include "lease.h"
#include "policy.h"
#include "sessions.h"

#define LEASE_CHUNK 256           /* pairs per call to the store */
#define LEASE_CLASSES 256         /* host classes renewed (class_registry_counts) */
#define LEASE_SESSIONS_MAX 1000000u

struct lease_key {
	uint64_t hash;
	unsigned count;
};

static int lease_key_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct lease_key *)a)->hash, y = ((const struct lease_key *)b)->hash;
	return x < y ? -1 : x > y;
}

/*
 * The sessions rules' keys to renew: those held now, sorted (the first *ret_held), then
 * those renewed last time and gone now, with 0.  *ret_hash gets an array that can hold
 * the held ones' hashes for the next beat.  NULL (with *ret_n 0) when there are none or
 * memory is short (l is kept: the keys are renewed at the next beat).
 */
static struct lease_key *lease_sessions(const struct lease *l, size_t *ret_n, size_t *ret_held,
					uint64_t **ret_hash)
{
	*ret_n = 0;
	uint64_t held, lost;
	sessions_stats(&held, &lost);
	if (held == 0 && l->nrenewed == 0)
		return NULL;
	/* room for those that come while the list is made (later ones wait a beat) */
	size_t max = held + 64 < LEASE_SESSIONS_MAX ? (size_t)held + 64 : LEASE_SESSIONS_MAX;
	uint64_t *hash = malloc(max * sizeof(*hash));
	unsigned *count = malloc(max * sizeof(*count));
	struct lease_key *v = malloc((max + l->nrenewed) * sizeof(*v));
	if (!hash || !count || !v) {
		free(hash);
		free(count);
		free(v);
		return NULL;
	}
	size_t now_held = sessions_list(hash, count, max), n = now_held;
	for (size_t i = 0; i < now_held; i++)
		v[i] = (struct lease_key){ hash[i], count[i] };
	free(count);
	qsort(v, now_held, sizeof(*v), lease_key_cmp);
	for (size_t i = 0, k = 0; i < l->nrenewed; i++) {
		while (k < now_held && v[k].hash < l->renewed[i])
			k++;
		if (k == now_held || v[k].hash != l->renewed[i])
			v[n++] = (struct lease_key){ l->renewed[i], 0 };
	}
	*ret_n = n;
	*ret_held = now_held;
	*ret_hash = hash;
	return v;
}

void lease_renew(struct lease *l, struct store *s)
{
	if (!s->ops->slots_renew)
		return;
	char cls[LEASE_CLASSES][64];
	unsigned cls_count[LEASE_CLASSES];
	size_t ncls = class_registry_counts(cls, cls_count, LEASE_CLASSES);
	size_t nkeys = 0, held = 0;
	uint64_t *hash = NULL;
	struct lease_key *keys = lease_sessions(l, &nkeys, &held, &hash);
	size_t total = ncls + nkeys, at = 0;
	/* also with nothing to renew: the main loop's connection is made at start, so a Redis
	 * that cannot be reached or refuses the password is reported before any mail comes */
	do {
		char names[LEASE_CHUNK][POLICY_SESSIONS_KEY];
		const char *ptrs[LEASE_CHUNK];
		unsigned counts[LEASE_CHUNK];
		size_t k = total - at < LEASE_CHUNK ? total - at : LEASE_CHUNK;
		for (size_t i = 0; i < k; i++) {
			size_t j = at + i;
			if (j < ncls) {
				ptrs[i] = cls[j];
				counts[i] = cls_count[j];
				continue;
			}
			policy_sessions_key(keys[j - ncls].hash, names[i]);
			ptrs[i] = names[i];
			counts[i] = keys[j - ncls].count;
		}
		s->ops->slots_renew(s->ctx, ptrs, counts, k);
		at += k;
	} while (at < total);
	if (!keys)
		return;
	/* the keys renewed with a count, sorted, for the next beat */
	for (size_t i = 0; i < held; i++)
		hash[i] = keys[i].hash;
	free(keys);
	free(l->renewed);
	l->renewed = hash;
	l->nrenewed = held;
}

void lease_clear(struct lease *l)
{
	free(l->renewed);
	*l = (struct lease){ 0 };
}
