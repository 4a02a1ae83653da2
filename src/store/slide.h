/*
 * slide -- an exact sliding window: never more than N sends in any window of length W.
 *
 * For the outbound relay lanes, where a provider's published limit ("at most 100
 * connections per minute") is a hard rule and a GCRA burst would break it.  This is the
 * in-process twin of src/store/redis/slide.lua and follows the same rule to the
 * nanosecond, so that a lane decides the same way whichever store holds it:
 *
 *   A send is remembered as s = ceil(now / 1000) microseconds (the Redis sorted set keeps
 *   scores as doubles, exact only below 2^53: microseconds since the epoch are, ns are
 *   not).  The window is w = ceil(W / 1000) us.  A remembered send still counts at now
 *   iff  s + w > floor(now / 1000).
 *   A send is admitted iff fewer than N remembered sends count.
 *   When it is not, wait_ns is the exact time until enough have left for one more to be
 *   admitted: the (count - N + 1)-th oldest leaves at (s + w) * 1000 ns.
 *
 * Why it never admits N+1 within W.  Windows are half-open, [a, a + W): a send at t and
 * one at t + W are in no common window, so the second is admitted.  Take any N + 1
 * admitted sends at true times t_0..t_N (ns) within one window, and let t_x be the one
 * admitted last.  For each other t_i: s_i * 1000 >= t_i, w * 1000 >= W and t_i + W > t_x
 * (they share a window), so (s_i + w) * 1000 > t_x >= floor(t_x / 1000) * 1000: all N of
 * them counted when t_x was decided, and t_x was refused -- a contradiction.  Rounding
 * only ever holds a send longer than W, by less than 2 us: with times and W on whole
 * microseconds the rule is exactly "a send at t leaves at t + W".
 *
 * A take forgets the sends that no longer count; the argument needs only that no
 * forgotten send would count again.  That holds while the clock does not step back.
 * XXX: after the wall clock steps back, sends forgotten at the later time no longer
 * count, so the bound then holds in real elapsed time but not on the stepped clock (the
 * Redis sorted set forgets the same way).  A send at now may be earlier than a
 * remembered one; the ring is kept sorted, as the sorted set is, so "the k-th oldest"
 * means the same in both.
 *
 * Not thread-safe: a lane belongs to one thread, or its owner locks.
 */
#ifndef SLUICE_SLIDE_H
#define SLUICE_SLIDE_H

#include <stdbool.h>
#include <stdint.h>

struct slide {
	uint64_t *at;       /* remembered sends (us), ascending: at[(head + i) % cap], i < len */
	uint32_t cap;       /* the largest N this lane can enforce */
	uint32_t head;
	uint32_t len;
};

/* Room for a limit of up to cap sends (cap >= 1).  0, or -ENOMEM / -EINVAL (s untouched). */
int slide_init(struct slide *s, uint32_t cap);
/* Forget every send; the ring stays for reuse. */
void slide_reset(struct slide *s);
/* Free the ring; s may then be initialised again.  Accepts a zeroed or freed s. */
void slide_done(struct slide *s);

/*
 * Admit one send at now (CLOCK_REALTIME ns) under "n per window_ns", and remember it.
 * Returns true when admitted (*ret_wait_ns = 0), false with *ret_wait_ns the exact wait
 * until it would be (UINT64_MAX when n is 0: never).  ret_wait_ns may be NULL.
 * XXX: an n above the ring's cap is taken as cap -- the ring cannot remember more sends,
 * so it enforces the lower limit rather than admit past what it can count; the lane
 * re-initialises its slide when its configured limit grows.
 */
bool slide_take(struct slide *s, uint64_t n, uint64_t window_ns, uint64_t now,
		uint64_t *ret_wait_ns);
/* The same decision, remembering nothing (explain, `sluice test`). */
bool slide_peek(const struct slide *s, uint64_t n, uint64_t window_ns, uint64_t now,
		uint64_t *ret_wait_ns);
/* How many remembered sends count at now. */
uint64_t slide_count(const struct slide *s, uint64_t window_ns, uint64_t now);

/*
 * Remember a send made at t (ns) without deciding anything (a history read back at
 * start, a send a shared store admitted), forgetting first the sends that no longer
 * count at t.  A full ring keeps the newest cap sends: they are the last to leave, so
 * "fewer than n count" is decided as with every send (n <= cap).
 */
void slide_remember(struct slide *s, uint64_t window_ns, uint64_t t);

/*
 * A send remembered at from (ns) went out later, at to (ns, >= from): it is remembered
 * at to from now on, so that it leaves the window when the next hop forgets it.  Moving a
 * send later only ever counts it longer.  false when no send is remembered at from (it
 * has left the window, or never was).
 */
bool slide_restamp(struct slide *s, uint64_t from, uint64_t to);

#endif
