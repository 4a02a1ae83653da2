/*
 * threshold -- "act on the Nth matching reply within a window": the counting behind a
 * signal's `after` and `within` (sluice.conf(5)), one counter per lane and signal.
 *
 * A pure module: no I/O, no clock (the caller passes now).  A counter keeps the times of
 * at most after - 1 hits, so its memory is bounded by the configuration (after <= 1000),
 * whatever the peer answers, and grows with the hits that count (not to after - 1 at the
 * first: many lanes with one hit each stay small).
 */
#ifndef SLUICE_THRESHOLD_H
#define SLUICE_THRESHOLD_H

#include <stdbool.h>
#include <stdint.h>

#define THRESHOLD_AFTER_MAX 1000

struct threshold {
	uint64_t *t;                  /* the hits that still count, oldest first (a ring) */
	unsigned cap, n, head;
	unsigned after;               /* the threshold counted for (0: none yet) */
};

/*
 * A matching reply at now: true when it is the after-th within within_ns (a hit at t
 * counts while t + within_ns > now), and the count starts over; false when it only
 * counts.  after <= 1 is always true.  Without memory for the count: true (the signal
 * acts at once, as without a threshold).
 */
bool threshold_hit(struct threshold *th, unsigned after, uint64_t within_ns, uint64_t now);
/* The hits that count at now (for `sluice lanes`). */
unsigned threshold_count(const struct threshold *th, uint64_t within_ns, uint64_t now);
void threshold_clear(struct threshold *th);

#endif
