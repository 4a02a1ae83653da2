/*
 * slide -- the exact sliding window of slide.h: a sorted ring of send times.
 *
 * The ring never holds more than cap sends and only sends that counted when they were
 * taken: a take first forgets what no longer counts, then adds one only below n <= cap.
 * Arithmetic is in whole microseconds, exactly as slide.lua does it, so both return the
 * same answer, wait included, for the same sequence of calls.  Sends arrive in time order
 * except after a clock step, so the sorted insert costs O(1) almost always.
 */
#include <errno.h>
#include <stdlib.h>

#include "slide.h"

static inline uint64_t div_ceil(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

/* The slot of the i-th oldest send (64-bit sum: head + i may pass 2^32). */
static inline uint64_t *ring_slot(const struct slide *s, uint32_t i)
{
	return &s->at[((uint64_t)s->head + i) % s->cap];
}

static inline uint64_t ring_at(const struct slide *s, uint32_t i)
{
	return *ring_slot(s, i);
}

int slide_init(struct slide *s, uint32_t cap)
{
	if (cap == 0)
		return -EINVAL;
	uint64_t *at = calloc(cap, sizeof(*at));
	if (!at)
		return -ENOMEM;
	*s = (struct slide){ .at = at, .cap = cap };
	return 0;
}

void slide_reset(struct slide *s)
{
	s->head = 0;
	s->len = 0;
}

void slide_done(struct slide *s)
{
	free(s->at);
	*s = (struct slide){ 0 };
}

/* The sends that no longer count are a prefix: the ring is sorted. */
static uint32_t gone_prefix(const struct slide *s, uint64_t w_us, uint64_t now_floor)
{
	uint32_t k = 0;
	while (k < s->len && ring_at(s, k) + w_us <= now_floor)
		k++;
	return k;
}

/*
 * The shared decision: count is the number of sends that count, first the index of the
 * oldest of them.  Admitted iff count < n; otherwise the (count - n)-th of them must
 * leave, at (at + w) us, which is after now (it counts: at + w > floor(now / 1000)).
 */
static bool decide(const struct slide *s, uint64_t n, uint64_t w_us, uint64_t now,
		   uint32_t first, uint32_t count, uint64_t *ret_wait_ns)
{
	uint64_t wait;
	bool ok = count < n;
	if (ok) {
		wait = 0;
	} else if (n == 0) {
		wait = UINT64_MAX;
	} else {
		uint64_t leaves_us = ring_at(s, first + (uint32_t)(count - n)) + w_us;
		uint64_t ahead_us = leaves_us - now / 1000;
		if (__builtin_mul_overflow(ahead_us, 1000, &wait))
			wait = UINT64_MAX;
		else
			wait -= now % 1000;
	}
	if (ret_wait_ns)
		*ret_wait_ns = wait;
	return ok;
}

bool slide_peek(const struct slide *s, uint64_t n, uint64_t window_ns, uint64_t now,
		uint64_t *ret_wait_ns)
{
	uint64_t w_us = div_ceil(window_ns, 1000);
	uint32_t gone = gone_prefix(s, w_us, now / 1000);
	if (n > s->cap)
		n = s->cap;
	return decide(s, n, w_us, now, gone, s->len - gone, ret_wait_ns);
}

uint64_t slide_count(const struct slide *s, uint64_t window_ns, uint64_t now)
{
	return s->len - gone_prefix(s, div_ceil(window_ns, 1000), now / 1000);
}

/* Drop the sends that no longer count at now (ns). */
static void forget_gone(struct slide *s, uint64_t w_us, uint64_t now)
{
	uint32_t gone = gone_prefix(s, w_us, now / 1000);
	s->head = (uint32_t)(((uint64_t)s->head + gone) % s->cap);
	s->len -= gone;
}

/* Remember a send at t (us) in order, from the newest end; len < cap. */
static void insert(struct slide *s, uint64_t t)
{
	uint32_t i = s->len;
	while (i > 0 && ring_at(s, i - 1) > t) {
		*ring_slot(s, i) = ring_at(s, i - 1);
		i--;
	}
	*ring_slot(s, i) = t;
	s->len++;
}

bool slide_take(struct slide *s, uint64_t n, uint64_t window_ns, uint64_t now,
		uint64_t *ret_wait_ns)
{
	uint64_t w_us = div_ceil(window_ns, 1000);
	forget_gone(s, w_us, now);
	if (n > s->cap)
		n = s->cap;
	if (!decide(s, n, w_us, now, 0, s->len, ret_wait_ns))
		return false;
	/* len < n <= cap: there is room */
	insert(s, div_ceil(now, 1000));
	return true;
}

bool slide_restamp(struct slide *s, uint64_t from, uint64_t to)
{
	uint64_t f = div_ceil(from, 1000), t = div_ceil(to, 1000);
	if (t < f)
		return false;
	uint32_t i = s->len;
	while (i > 0 && ring_at(s, i - 1) != f)
		i--;
	if (i == 0)
		return false;
	/* out from where it was, in again in order from there (later sends move back) */
	i--;
	while (i + 1 < s->len && ring_at(s, i + 1) <= t) {
		*ring_slot(s, i) = ring_at(s, i + 1);
		i++;
	}
	*ring_slot(s, i) = t;
	return true;
}

void slide_remember(struct slide *s, uint64_t window_ns, uint64_t t_ns)
{
	forget_gone(s, div_ceil(window_ns, 1000), t_ns);
	uint64_t t = div_ceil(t_ns, 1000);
	if (s->len == s->cap) {
		if (t <= ring_at(s, 0))
			return; /* older than every kept send: the newest cap stay */
		s->head = (s->head + 1) % s->cap;
		s->len--;
	}
	insert(s, t);
}
