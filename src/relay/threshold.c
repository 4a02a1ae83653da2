/*
 * threshold -- the count of matching replies behind a signal's `after` and `within`
 * (threshold.h).  The ring holds at most after - 1 times in the order they came; a hit
 * drops the ones that left the window from its head, so each hit costs O(1) amortised.
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

bool threshold_hit(struct threshold *th, unsigned after, uint64_t within_ns, uint64_t now)
{
	if (after <= 1)
		return true;
	if (after > THRESHOLD_AFTER_MAX)
		after = THRESHOLD_AFTER_MAX;
	if (th->cap != after - 1) {
		/* a new threshold (a reload): the count starts over */
		uint64_t *t = realloc(th->t, (after - 1) * sizeof(*t));
		if (!t) {
			threshold_clear(th);
			return true;
		}
		th->t = t;
		th->cap = after - 1;
		th->n = th->head = 0;
	}
	drop_old(th, within_ns, now);
	if (th->n + 1 >= after) {
		th->n = th->head = 0;
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
	th->cap = th->n = th->head = 0;
}
