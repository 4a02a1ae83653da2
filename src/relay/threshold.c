/*
 * threshold -- the count of matching replies behind a signal's `after` and `within`
 * (threshold.h).  The ring holds at most after - 1 times in the order they came (it
 * grows by doubling as they come); a hit drops the ones that left the window from its
 * head, so each hit costs O(1) amortised.
 */
#include <stdlib.h>

#include "threshold.h"

static void drop_old(struct threshold *th, uint64_t within_ns, uint64_t now)
{
	while (th->n && th->t[th->head] + within_ns <= now) {
		th->head = (th->head + 1) % th->cap;
		th->n--;
	}
}

/* Room for one more hit: the ring grows by doubling, up to after - 1 entries, so a lane
 * that sees one matching reply holds a few bytes, not after's worth. */
static bool grow(struct threshold *th, unsigned after)
{
	if (th->n < th->cap)
		return true;
	unsigned cap = th->cap ? th->cap * 2 : 4;
	if (cap > after - 1)
		cap = after - 1;
	uint64_t *t = malloc(cap * sizeof(*t));
	if (!t)
		return false;
	for (unsigned i = 0; i < th->n; i++)
		t[i] = th->t[(th->head + i) % th->cap];
	free(th->t);
	th->t = t;
	th->cap = cap;
	th->head = 0;
	return true;
}

bool threshold_hit(struct threshold *th, unsigned after, uint64_t within_ns, uint64_t now)
{
	if (after <= 1)
		return true;
	if (after > THRESHOLD_AFTER_MAX)
		after = THRESHOLD_AFTER_MAX;
	if (th->after != after) {
		/* a new threshold (a reload): the count starts over */
		threshold_clear(th);
		th->after = after;
	}
	if (th->n)
		drop_old(th, within_ns, now);
	if (th->n + 1 >= after) {
		th->n = th->head = 0;
		return true;
	}
	if (!grow(th, after)) {
		threshold_clear(th);
		return true;
	}
	th->t[(th->head + th->n) % th->cap] = now;
	th->n++;
	return false;
}

unsigned threshold_count(const struct threshold *th, uint64_t within_ns, uint64_t now)
{
	unsigned k = 0;
	for (unsigned i = 0; i < th->n; i++)
		if (th->t[(th->head + i) % th->cap] + within_ns > now)
			k++;
	return k;
}

void threshold_clear(struct threshold *th)
{
	free(th->t);
	th->t = NULL;
	th->cap = th->n = th->head = th->after = 0;
}
