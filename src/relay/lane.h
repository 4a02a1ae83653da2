/*
 * lane -- one lane's budget: exact sliding windows (slide.h), adaptive shaping, and
 * suspension with exponential backoff.  What the scheduler asks before each send.
 *
 * A lane's limit is the route's rate: windows "N per W"; each window is enforced with
 * its own slide, lengthened by the guard.  A send is admitted only when every window
 * admits it, and then it is remembered in all of them (peek all, then take all: a
 * refusal charges nothing).  Adaptive shaping scales every N by factor (parts per
 * million, never above 1 000 000, never an N below 1): a `slow` signal halves it; every
 * run of successes as long as the current N of the first window raises it by a quarter
 * of the configured rate, up to the configured rate.
 *
 * Suspension: until a time (CLOCK_REALTIME ns), with a reason; without a hint the length
 * doubles from min to max with each suspension in a row, and a success resets it.
 *
 * Not thread-safe: a lane belongs to the relay's thread.  No I/O, no clock: times are
 * given (CLOCK_REALTIME ns).
 */
#ifndef SLUICE_LANE_H
#define SLUICE_LANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rate.h"
#include "slide.h"

#define LANE_FACTOR_FULL 1000000u
#define LANE_FACTOR_MIN (LANE_FACTOR_FULL / 64)

struct lane_budget {
	struct rate_limits rate;     /* as configured (burst ignored) */
	uint64_t guard_ns;
	struct slide win[RATE_MAX_WINDOWS];
	uint32_t factor;             /* adaptive: parts per million of the configured rate */
	uint32_t successes;          /* since the last change of factor */
	uint64_t suspended_until;    /* 0: not suspended */
	char why[256];               /* the reason of the current or last suspension */
	unsigned level;              /* suspensions in a row */
	uint64_t sends;              /* admitted since start */
};

/* A budget for rate (n = 0: unlimited).  0 or -ENOMEM. */
int lane_budget_init(struct lane_budget *b, const struct rate_limits *rate, uint64_t guard_ns);
/* A new rate (reload): the history of sends is kept (a window whose length changed keeps
 * the sends of the old one that still fall inside it).  0 or -ENOMEM (b unchanged). */
int lane_budget_set_rate(struct lane_budget *b, const struct rate_limits *rate,
			 uint64_t guard_ns);
void lane_budget_done(struct lane_budget *b);

/* The current N of window i (after adaptive shaping). */
uint64_t lane_budget_limit(const struct lane_budget *b, unsigned i);
/* The window length of i with the guard. */
uint64_t lane_budget_window(const struct lane_budget *b, unsigned i);
/*
 * Admit up to want sends at now: returns how many were admitted (0..want), each
 * remembered in every window.  When fewer than want, *ret_wait_ns (may be NULL) is the
 * exact wait until the next one would be.  Suspension is not checked here.
 */
uint64_t lane_budget_take(struct lane_budget *b, uint64_t want, uint64_t now,
			  uint64_t *ret_wait_ns);
/* Would one send be admitted at now?  0, or the exact wait. */
uint64_t lane_budget_wait(const struct lane_budget *b, uint64_t now);
/* Remember a send made at t (history loaded at start); no limit is checked. */
void lane_budget_remember(struct lane_budget *b, uint64_t t);
/* A send counted at from went out at to (>= from): counted from to in every window. */
void lane_budget_restamp(struct lane_budget *b, uint64_t from, uint64_t to);
/* Sends counted at now in window i. */
uint64_t lane_budget_used(const struct lane_budget *b, unsigned i, uint64_t now);

/* Adaptive shaping. */
void lane_budget_slow(struct lane_budget *b);
void lane_budget_success(struct lane_budget *b);

/*
 * Suspend until now + for_ns, or (for_ns < 0) by the backoff: min_ns doubled per
 * suspension in a row, at most max_ns.  A later end never moves earlier.  Returns the
 * length applied.
 */
uint64_t lane_budget_suspend(struct lane_budget *b, uint64_t now, int64_t for_ns,
			     uint64_t min_ns, uint64_t max_ns, const char *why);
void lane_budget_resume(struct lane_budget *b);
/* Suspended at now?  (An expired suspension is cleared.) */
bool lane_budget_suspended(struct lane_budget *b, uint64_t now);

#endif
