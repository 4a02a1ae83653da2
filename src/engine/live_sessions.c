/*
 * live_sessions -- the SMTP sessions the milter and the policy service serve (see the
 * header).
 *
 * A key hashes to one stripe of LIVE_SESSIONS_MAX / LIVE_SESSIONS_STRIPES entries; an
 * entry is a key, how many sessions of each side hold it (two MTAs may serve clients with
 * the same address and port at once), and whether it was counted as a double use.  An
 * entry that no side holds is free.  A lock is held for one scan of one stripe.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "live_sessions.h"

#define PER_STRIPE (LIVE_SESSIONS_MAX / LIVE_SESSIONS_STRIPES)

struct entry {
	struct live_session_key key;
	unsigned holders[LIVE_SIDES]; /* all 0: free */
	bool counted;                 /* both sides held it at once: counted */
};

static struct stripe {
	pthread_mutex_t lock;
	struct entry e[PER_STRIPE];
} stripes[LIVE_SESSIONS_STRIPES];

static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_uint recorded[LIVE_SIDES];
static atomic_uint_fast64_t doubles;
static atomic_bool warned;

static void init(void)
{
	for (size_t i = 0; i < LIVE_SESSIONS_STRIPES; i++)
		pthread_mutex_init(&stripes[i].lock, NULL);
}

int live_sessions_key(struct str addr, unsigned port, struct live_session_key *ret)
{
	struct live_session_key k;
	memset(&k, 0, sizeof(k));
	if (port == 0 || port > 65535 || ipaddr_parse(addr, &k.ip) < 0)
		return -EINVAL;
	k.port = (uint16_t)port;
	*ret = k;
	return 0;
}

static bool used(const struct entry *e)
{
	for (int s = 0; s < LIVE_SIDES; s++)
		if (e->holders[s])
			return true;
	return false;
}

static bool same(const struct live_session_key *a, const struct live_session_key *b)
{
	return a->port == b->port && a->ip.family == b->ip.family &&
	       memcmp(a->ip.b, b->ip.b, sizeof(a->ip.b)) == 0;
}

static struct stripe *stripe_of(const struct live_session_key *k)
{
	/* FNV-1a over the family, the address and the port */
	uint32_t h = 2166136261u;
	h = (h ^ k->ip.family) * 16777619u;
	for (size_t i = 0; i < sizeof(k->ip.b); i++)
		h = (h ^ k->ip.b[i]) * 16777619u;
	h = (h ^ (k->port & 0xff)) * 16777619u;
	h = (h ^ (k->port >> 8)) * 16777619u;
	pthread_once(&once, init);
	return &stripes[h % LIVE_SESSIONS_STRIPES];
}

/* The entry of k in s, or NULL (under s->lock). */
static struct entry *find(struct stripe *s, const struct live_session_key *k)
{
	for (size_t i = 0; i < PER_STRIPE; i++)
		if (used(&s->e[i]) && same(&s->e[i].key, k))
			return &s->e[i];
	return NULL;
}

int live_sessions_enter(const struct live_session_key *k, enum live_side side)
{
	struct stripe *s = stripe_of(k);
	int r = 0;
	pthread_mutex_lock(&s->lock);
	struct entry *e = find(s, k);
	for (size_t i = 0; i < PER_STRIPE && !e; i++)
		if (!used(&s->e[i])) {
			e = &s->e[i];
			memset(e, 0, sizeof(*e));
			e->key = *k;
		}
	if (!e) {
		r = -ENOSPC;
	} else {
		e->holders[side]++;
		if (!e->counted && e->holders[LIVE_MILTER] && e->holders[LIVE_POLICY]) {
			e->counted = true;
			r = 1;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (r >= 0)
		atomic_fetch_add(&recorded[side], 1);
	if (r == 1)
		atomic_fetch_add(&doubles, 1);
	return r;
}

void live_sessions_leave(const struct live_session_key *k, enum live_side side)
{
	struct stripe *s = stripe_of(k);
	bool found = false;
	pthread_mutex_lock(&s->lock);
	struct entry *e = find(s, k);
	if (e && e->holders[side]) {
		e->holders[side]--; /* an entry nobody holds is free (counted is reset on reuse) */
		found = true;
	}
	pthread_mutex_unlock(&s->lock);
	if (found)
		atomic_fetch_sub(&recorded[side], 1);
}

bool live_sessions_has(const struct live_session_key *k, enum live_side side)
{
	struct stripe *s = stripe_of(k);
	pthread_mutex_lock(&s->lock);
	struct entry *e = find(s, k);
	bool r = e && e->holders[side];
	pthread_mutex_unlock(&s->lock);
	return r;
}

unsigned live_sessions_count(enum live_side side)
{
	return atomic_load(&recorded[side]);
}

uint64_t live_sessions_doubles(void)
{
	return atomic_load(&doubles);
}

bool live_sessions_claim_warning(void)
{
	return !atomic_exchange(&warned, true);
}
