/*
 * test_lane -- a lane's budget (src/relay/lane.c): exact windows over several lengths,
 * all-or-nothing takes, history kept across a change of rate, adaptive shaping and
 * suspension backoff.  Times are given, so every case is exact.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lane.h"

#define S UINT64_C(1000000000)
#define T0 (UINT64_C(1800000000) * S)

static struct rate_limits limits(unsigned n, const uint64_t *count, const uint64_t *period_s)
{
	struct rate_limits l = { .n = n };
	for (unsigned i = 0; i < n; i++)
		l.w[i] = (struct rate_window){ .count = count[i], .period_ns = period_s[i] * S,
					       .burst = count[i] };
	return l;
}

/* Random send attempts as fast as admitted: never more than N in any window [t, t + W). */
static void test_never_over_any_window(void **state)
{
	uint64_t c[] = { 8, 20 }, p[] = { 10, 60 };
	struct rate_limits l = limits(2, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	uint64_t sent[1000];
	size_t n = 0;
	uint64_t now = T0;
	srandom(7);
	while (n < 100) {
		uint64_t wait;
		if (lane_budget_take(&b, 1, now, &wait) == 1) {
			sent[n++] = now;
			now += (uint64_t)(random() % 3) * (S / 10);
		} else {
			assert_true(wait > 0);
			/* one ns early is refused; the exact moment is admitted */
			assert_int_equal(lane_budget_take(&b, 1, now + wait - 1, NULL), 0);
			now += wait;
		}
	}
	for (size_t i = 0; i < n; i++) {
		size_t in10 = 0, in60 = 0;
		for (size_t j = i; j < n; j++) {
			in10 += sent[j] < sent[i] + 10 * S;
			in60 += sent[j] < sent[i] + 60 * S;
		}
		assert_true(in10 <= 8);
		assert_true(in60 <= 20);
	}
	/* and the limit is used: the 20 of each minute go in bursts of 8 */
	assert_true(sent[19] - sent[0] < 60 * S);
	lane_budget_done(&b);
}

/* A take of several (count = recipients) admits what fits and says how long to wait. */
static void test_partial_take(void **state)
{
	uint64_t c[] = { 5 }, p[] = { 10 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	uint64_t wait = 0;
	assert_int_equal(lane_budget_take(&b, 3, T0, &wait), 3);
	assert_int_equal(wait, 0);
	assert_int_equal(lane_budget_take(&b, 3, T0 + S, &wait), 2);
	assert_int_equal(wait, 9 * S);
	assert_int_equal(lane_budget_used(&b, 0, T0 + S), 5);
	assert_int_equal(lane_budget_wait(&b, T0 + 10 * S), 0);
	lane_budget_done(&b);
}

/* A refusal by one window charges none: the other window keeps its room. */
static void test_refusal_charges_nothing(void **state)
{
	uint64_t c[] = { 2, 3 }, p[] = { 1, 100 };
	struct rate_limits l = limits(2, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	assert_int_equal(lane_budget_take(&b, 2, T0, NULL), 2);
	for (int i = 0; i < 5; i++)
		assert_int_equal(lane_budget_take(&b, 1, T0 + (uint64_t)i * 1000, NULL), 0);
	assert_int_equal(lane_budget_used(&b, 1, T0), 2);
	assert_int_equal(lane_budget_take(&b, 1, T0 + S, NULL), 1);
	uint64_t wait;
	assert_int_equal(lane_budget_take(&b, 1, T0 + 2 * S, &wait), 0);
	assert_int_equal(wait, 98 * S); /* the long window is full until the first leaves */
	lane_budget_done(&b);
}

/* The guard lengthens every window. */
static void test_guard(void **state)
{
	uint64_t c[] = { 1 }, p[] = { 10 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, S / 10), 0);
	assert_int_equal(lane_budget_take(&b, 1, T0, NULL), 1);
	assert_int_equal(lane_budget_wait(&b, T0 + 10 * S), S / 10);
	assert_int_equal(lane_budget_wait(&b, T0 + 10 * S + S / 10), 0);
	lane_budget_done(&b);
}

/* A new rate keeps the sends already made: a reload cannot make room. */
static void test_set_rate_keeps_history(void **state)
{
	uint64_t c[] = { 10 }, p[] = { 60 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	assert_int_equal(lane_budget_take(&b, 10, T0, NULL), 10);
	uint64_t c2[] = { 4, 12 }, p2[] = { 60, 3600 };
	struct rate_limits l2 = limits(2, c2, p2);
	assert_int_equal(lane_budget_set_rate(&b, &l2, 0), 0);
	assert_int_equal(lane_budget_used(&b, 0, T0 + S), 4); /* the ring keeps the newest 4 */
	assert_int_equal(lane_budget_used(&b, 1, T0 + S), 10);
	assert_int_equal(lane_budget_take(&b, 1, T0 + S, NULL), 0);
	assert_int_equal(lane_budget_take(&b, 5, T0 + 61 * S, NULL), 2); /* 12 an hour */
	/* a larger limit: the history moves into a larger ring */
	uint64_t c3[] = { 100 }, p3[] = { 60 };
	struct rate_limits l3 = limits(1, c3, p3);
	assert_int_equal(lane_budget_set_rate(&b, &l3, 0), 0);
	assert_int_equal(lane_budget_used(&b, 0, T0 + 61 * S), 2);
	lane_budget_done(&b);
}

/* History loaded at start counts like sends made now. */
static void test_remember(void **state)
{
	uint64_t c[] = { 2 }, p[] = { 20 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	lane_budget_remember(&b, T0 - 5 * S);
	lane_budget_remember(&b, T0 - 4 * S);
	uint64_t wait;
	assert_int_equal(lane_budget_take(&b, 1, T0, &wait), 0);
	assert_int_equal(wait, 15 * S);
	lane_budget_done(&b);
}

/* More sends read back than the window holds (a send counted again when it went out
 * late is two lines of the history): the newest are kept, the last to leave, so the
 * lane waits for them and not for the oldest. */
static void test_remember_keeps_the_newest(void **state)
{
	uint64_t c[] = { 3 }, p[] = { 10 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	lane_budget_remember(&b, T0 - 9 * S);
	lane_budget_remember(&b, T0 - 8 * S);
	lane_budget_remember(&b, T0 - 7 * S);
	lane_budget_remember(&b, T0 - 1 * S);
	lane_budget_remember(&b, T0 - 9 * S - 1); /* older than all three kept: nothing */
	uint64_t wait;
	assert_int_equal(lane_budget_used(&b, 0, T0), 3);
	assert_int_equal(lane_budget_take(&b, 1, T0, &wait), 0);
	assert_int_equal(wait, 2 * S); /* T0 - 8 s leaves at T0 + 2 s */
	assert_int_equal(lane_budget_take(&b, 1, T0 + 2 * S, &wait), 1);
	lane_budget_done(&b);
}

/* A send counted earlier went out later: counted from then, in order among the others,
 * so it holds the window longer, never shorter; an unknown time changes nothing. */
static void test_restamp(void **state)
{
	uint64_t c[] = { 3 }, p[] = { 10 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	uint64_t wait;
	assert_int_equal(lane_budget_take(&b, 1, T0, &wait), 1);
	assert_int_equal(lane_budget_take(&b, 1, T0 + 1 * S, &wait), 1);
	assert_int_equal(lane_budget_take(&b, 1, T0 + 2 * S, &wait), 1);
	/* the first went out at T0 + 3 s, after the two others were counted */
	lane_budget_restamp(&b, T0, T0 + 3 * S);
	/* at T0 + 10 s the first would have left; it now leaves at T0 + 11 s, the second */
	assert_int_equal(lane_budget_take(&b, 1, T0 + 10 * S, &wait), 0);
	assert_int_equal(wait, 1 * S);
	assert_int_equal(lane_budget_take(&b, 1, T0 + 11 * S, &wait), 1);
	/* then T0 + 2 s leaves at 12 s, T0 + 3 s (the restamped one) at 13 s */
	assert_int_equal(lane_budget_take(&b, 1, T0 + 12 * S, &wait), 1);
	assert_int_equal(lane_budget_take(&b, 1, T0 + 12 * S + 1, &wait), 0);
	assert_int_equal(wait, 1 * S - 1);
	lane_budget_restamp(&b, T0 + 5 * S, T0 + 20 * S); /* never counted: nothing moves */
	assert_int_equal(lane_budget_take(&b, 1, T0 + 13 * S, &wait), 1);
	lane_budget_done(&b);
}

/* slow halves the rate (never below one), successes restore it step by step, never above. */
static void test_adaptive(void **state)
{
	uint64_t c[] = { 8 }, p[] = { 10 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	lane_budget_slow(&b);
	assert_int_equal(lane_budget_limit(&b, 0), 4);
	for (int i = 0; i < 10; i++)
		lane_budget_slow(&b);
	assert_int_equal(lane_budget_limit(&b, 0), 1);
	assert_int_equal(b.factor, LANE_FACTOR_MIN);
	unsigned steps = 0;
	while (b.factor < LANE_FACTOR_FULL && steps < 1000) {
		lane_budget_success(&b);
		steps++;
	}
	assert_int_equal(b.factor, LANE_FACTOR_FULL);
	assert_int_equal(lane_budget_limit(&b, 0), 8);
	assert_true(steps > 4); /* step by step, not at once */
	lane_budget_success(&b);
	assert_int_equal(lane_budget_limit(&b, 0), 8);
	lane_budget_done(&b);
}

static void test_suspend_backoff(void **state)
{
	uint64_t c[] = { 8 }, p[] = { 10 };
	struct rate_limits l = limits(1, c, p);
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	uint64_t min = 60 * S, max = 3600 * S;
	assert_int_equal(lane_budget_suspend(&b, T0, -1, min, max, "421"), 60 * S);
	assert_true(lane_budget_suspended(&b, T0 + 59 * S));
	assert_false(lane_budget_suspended(&b, T0 + 60 * S));
	assert_int_equal(lane_budget_suspend(&b, T0, -1, min, max, "421"), 120 * S);
	assert_int_equal(lane_budget_suspend(&b, T0, -1, min, max, "421"), 240 * S);
	for (int i = 0; i < 20; i++)
		lane_budget_suspend(&b, T0, -1, min, max, "421");
	assert_int_equal(lane_budget_suspend(&b, T0, -1, min, max, "421"), max);
	/* a hint wins, but never shortens a suspension under way */
	assert_int_equal(lane_budget_suspend(&b, T0, 92 * S, min, max, "try again in 92 s"),
			 92 * S);
	assert_true(lane_budget_suspended(&b, T0 + 100 * S));
	assert_string_equal(b.why, "try again in 92 s");
	lane_budget_success(&b);
	assert_int_equal(b.level, 0);
	lane_budget_resume(&b);
	assert_false(lane_budget_suspended(&b, T0));
	lane_budget_done(&b);
}

static void test_unlimited(void **state)
{
	struct rate_limits l = { .n = 0 };
	struct lane_budget b;
	assert_int_equal(lane_budget_init(&b, &l, 0), 0);
	assert_int_equal(lane_budget_take(&b, 1000, T0, NULL), 1000);
	assert_int_equal(lane_budget_wait(&b, T0), 0);
	lane_budget_done(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_never_over_any_window),
		cmocka_unit_test(test_partial_take),
		cmocka_unit_test(test_refusal_charges_nothing),
		cmocka_unit_test(test_guard),
		cmocka_unit_test(test_set_rate_keeps_history),
		cmocka_unit_test(test_remember),
		cmocka_unit_test(test_restamp),
		cmocka_unit_test(test_remember_keeps_the_newest),
		cmocka_unit_test(test_adaptive),
		cmocka_unit_test(test_suspend_backoff),
		cmocka_unit_test(test_unlimited),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
