/*
 * gcra -- the generic cell rate algorithm on one window (the rules are in store.h).
 *
 * Pure arithmetic, shared by the store backends and checked by the unit tests.  Counts
 * and bursts go up to 10^15 and periods up to 366 days in ns (3.2e16), so c*T and B*T
 * reach 3e31: every product is taken in 128 bits, and a result that does not fit in 64
 * bits saturates at UINT64_MAX (a TAT in the year 2554 is as good as "never"), it never
 * wraps.  A count or period of 0 (rejected by the parser) is not divided by.
 */
#include <stdbool.h>
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

/* used with T known; T = 0 (period 0) restores everything at once */
static inline uint64_t used_at(uint64_t t, uint64_t tat, uint64_t now)
{
	return tat > now && t ? div_ceil(tat - now, t) : 0;
}

uint64_t gcra_used(const struct rate_window *w, uint64_t tat, uint64_t now)
{
	return used_at(gcra_interval(w), tat, now);
}

/*
 * On every decision's path: one division for T, one for used, and 64-bit arithmetic
 * unless a product does not fit (then 128 bits).
 */
void gcra_check(const struct rate_window *w, uint64_t tat, uint64_t now, uint64_t cost,
		struct gcra_result *ret)
{
	uint64_t t = gcra_interval(w);
	uint64_t base = tat > now ? tat : now;
	uint64_t ahead = base - now;
	uint64_t inc, limit, need, new_tat;
	bool ok;
	/* cost 0 is checked as 1 */
	if (!__builtin_mul_overflow(cost ? cost : 1, t, &inc) &&
	    !__builtin_mul_overflow(w->burst, t, &limit) &&
	    !__builtin_add_overflow(ahead, inc, &need)) {
		ok = need <= limit;
		ret->retry_ns = ok ? 0 : need - limit;
		if (__builtin_add_overflow(base, inc, &new_tat))
			new_tat = UINT64_MAX;
	} else {
		u128 need128 = (u128)ahead + (u128)(cost ? cost : 1) * t;
		u128 limit128 = (u128)w->burst * t;
		ok = need128 <= limit128;
		ret->retry_ns = ok ? 0 : sat64(need128 - limit128);
		new_tat = sat64((u128)base + (u128)cost * t);
	}
	ret->ok = ok;
	/* cost 0 charges nothing: the TAT stays what it was */
	ret->new_tat = cost ? new_tat : tat;
	ret->used = used_at(t, ok ? ret->new_tat : tat, now);
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
