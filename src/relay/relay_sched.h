/*
 * relay_sched -- the relay's scheduler: which work a lane sends next, and when each lane must
 * wake.  Pure: no I/O, no event loop, no clock (times are given, CLOCK_REALTIME ns), so
 * every decision is a function of its state and can be tested against a naive model
 * (tests/unit/test_sched.c).
 *
 * The unit of work is an item: the recipients of one message routed to one lane (the
 * relay's lane_item embeds a struct sched_item).  An item is due at a time (the earliest
 * retry time of its recipients that are waiting and not in a transaction).  Each lane
 * keeps its items in two binary heaps:
 *   - due:  items whose time has come, by arrival (then by a sequence number): the oldest
 *           message is always served first, so nothing starves;
 *   - wait: items whose time has not come, by due time.
 * sched_next() moves the items of wait whose time has come into due, then answers the
 * oldest.  Every operation costs O(log n) in the lane's items: nothing walks past the
 * recipients that wait for a retry (law 8, doc/ARCHITECTURE.md), however many there are.
 *
 * Lanes' wake-ups are in one more heap (struct sched), by time, so that the relay needs a
 * single timer however many lanes there are (direct MX delivery makes one per domain):
 * sched_wake() sets or moves a lane's wake-up, sched_pop() hands back the lanes whose
 * moment has come, and sched_next_wake() is when the relay's timer must fire.
 *
 * sched_decide() is a lane's decision, given its budget, its connections and the clock:
 * sleep until a moment, open a connection, or start a transaction on an idle one.
 *
 * Its names keep the short prefix sched_ (a file named sched.h would shadow the system's
 * <sched.h>, which the relay's include path would then hide).
 *
 * Not thread-safe: everything belongs to the relay's thread.  Heaps grow by doubling;
 * an allocation failure leaves the item where it was and returns -ENOMEM.
 */
#ifndef SLUICE_RELAY_SCHED_H
#define SLUICE_RELAY_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SCHED_NEVER UINT64_MAX

enum sched_where { SCHED_NONE = 0, SCHED_DUE, SCHED_WAIT };

struct sched_item {
	uint64_t arrival;            /* order among due items: older first */
	uint64_t seq;                /* then this (ties of arrival) */
	uint64_t due;                /* when it is due (0: at once); SCHED_NEVER: nowhere */
	uint32_t pos;                /* index in its heap */
	uint8_t where;               /* enum sched_where */
};

struct sched_heap {
	void **v;
	uint32_t n, cap;
};

struct sched_lane {
	struct sched_heap due;       /* of struct sched_item, by (arrival, seq) */
	struct sched_heap wait;      /* of struct sched_item, by (due, arrival, seq) */
	uint64_t wake;               /* SCHED_NEVER: none set */
	uint32_t pos;                /* in struct sched's heap, when wake is set */
};

struct sched {
	struct sched_heap lanes;     /* of struct sched_lane, by wake */
};

void sched_lane_init(struct sched_lane *l);
/* Frees the heaps; the items are the caller's (they are simply forgotten). */
void sched_lane_done(struct sched_lane *l);
/* Items in the lane's heaps. */
size_t sched_lane_items(const struct sched_lane *l);

/*
 * Put item it (arrival and seq set by the caller, never changed while it is in a heap)
 * in lane l due at `due`: in due when due <= now, in wait otherwise, nowhere for
 * SCHED_NEVER.  Moves it when it already is in l.  0 or -ENOMEM (it is then nowhere).
 */
int sched_item_set(struct sched_lane *l, struct sched_item *it, uint64_t due, uint64_t now);
/* Take it out of l's heaps (nothing when it is in none). */
void sched_item_remove(struct sched_lane *l, struct sched_item *it);

/*
 * The oldest item due at now (it stays in due: the caller moves or removes it), or NULL.
 * Items of wait whose time has come move into due first.
 */
struct sched_item *sched_next(struct sched_lane *l, uint64_t now);
/* When the next item of wait is due (SCHED_NEVER when none); 0 when due is not empty. */
uint64_t sched_lane_next_due(const struct sched_lane *l);

void sched_init(struct sched *s);
void sched_done(struct sched *s);
/* Wake l at `at` (SCHED_NEVER: do not wake it), replacing its wake-up.  0 or -ENOMEM. */
int sched_wake(struct sched *s, struct sched_lane *l, uint64_t at);
/* A lane whose wake-up is <= now, taken out of the heap (its wake is SCHED_NEVER), or
 * NULL. */
struct sched_lane *sched_pop(struct sched *s, uint64_t now);
/* The earliest wake-up set (SCHED_NEVER when none). */
uint64_t sched_next_wake(const struct sched *s);

/* ---- a lane's decision ---- */

enum sched_action {
	SCHED_SLEEP = 0,             /* nothing to do before `wake` (SCHED_NEVER: until told) */
	SCHED_CONNECT,               /* open a connection; its readiness asks again */
	SCHED_SEND,                  /* start a transaction on an idle connection */
	SCHED_HOLD,                  /* a connection is opening, or the lane is full: wait
				      * for a connection's event (no timer) */
};

struct sched_lane_state {
	bool work_due;               /* sched_next() has an item (not held, not stale) */
	uint64_t next_due;           /* else: sched_lane_next_due() */
	uint64_t suspended_until;    /* 0 or <= now: not suspended */
	uint64_t budget_wait;        /* ns until the budget admits a send (0: now) */
	bool budget_shared;          /* the budget is asked elsewhere at send time */
	unsigned idle, conns, connecting, max_conns;
};

struct sched_decision {
	enum sched_action action;
	uint64_t wake;               /* SCHED_SLEEP: the absolute moment */
	bool close_idle;             /* suspended: idle connections should go */
};

/*
 * What a lane in state st does at now, per the relay's rules: suspended -> sleep until the end (and
 * close idle connections); nothing due -> sleep until the earliest retry; an idle
 * connection -> send (a local budget is then taken by the caller, which sleeps exactly as
 * long as it says when it refuses); no idle connection -> open one only when the budget
 * would admit a send now (no connection idles waiting for budget) and the lane has room
 * and none is opening, else wait for the budget or for a connection's event.
 */
void sched_decide(const struct sched_lane_state *st, uint64_t now, struct sched_decision *ret);

#endif
