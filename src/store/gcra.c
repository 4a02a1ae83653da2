/*
 * gcra -- the generic cell rate algorithm on one window (the rules are in store.h).
 *
 * Pure arithmetic, shared by the store backends and checked by the unit tests.  Counts
 * and bursts go up to 10^15 and periods up to 366 days in ns (3.2e16), so c*T and B*T
 * reach 3e31: every product is taken in 128 bits, and a result that does not fit in 64
 * bits saturates at UINT64_MAX (a TAT in the year 2554 is as good as "never"), it never
 * wraps.  A count or period of 0 (rejected by the parser) is not divided by.
 */
#include <stdint.h>

#include "store.h"

__extension__ typedef unsigned __int128 u128; /* GCC and clang */

static inline uint64_t sat64(u128 v)
{
	return v > UINT64_MAX ? UINT64_MAX : (uint64_t)v;
}

static inline uint64_t div_ceil(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

uint64_t gcra_interval(const struct rate_window *w)
{
	uint64_t count = w->count ? w->count : 1;
	return div_ceil(w->period_ns, count);
}

uint64_t gcra_used(const struct rate_window *w, uint64_t tat, uint64_t now)
{
	if (tat <= now)
		return 0;
	uint64_t t = gcra_interval(w);
	/* T = 0 (period 0) restores everything at once */
	return t ? div_ceil(tat - now, t) : 0;
}

void gcra_check(const struct rate_window *w, uint64_t tat, uint64_t now, uint64_t cost,
		struct gcra_result *ret)
{
	uint64_t t = gcra_interval(w);
	uint64_t base = tat > now ? tat : now;
	u128 ahead = base - now;
	u128 inc = (u128)(cost ? cost : 1) * t; /* cost 0 is checked as 1 */
	u128 limit = (u128)w->burst * t;
	ret->ok = ahead + inc <= limit;
	ret->retry_ns = ret->ok ? 0 : sat64(ahead + inc - limit);
	/* cost 0 charges nothing: the TAT stays what it was */
	ret->new_tat = cost ? sat64((u128)base + (u128)cost * t) : tat;
	ret->used = gcra_used(w, ret->ok ? ret->new_tat : tat, now);
}

uint64_t gcra_refund(const struct rate_window *w, uint64_t tat, uint64_t now, uint64_t cost)
{
	if (tat <= now)
		return now;
	u128 back = (u128)cost * gcra_interval(w);
	if (back >= tat - now)
		return now;
	return tat - (uint64_t)back;
}
