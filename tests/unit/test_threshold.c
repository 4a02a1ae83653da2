/*
 * test_threshold -- a signal's "after N matching replies within W" (src/relay/threshold.c):
 * the N-th hit within the window acts and not one before, the count starts over after it
 * acts, hits older than the window do not count; checked against a naive model (every
 * hit kept, counted at each step) over random sequences, with several thresholds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "threshold.h"

#define S UINT64_C(1000000000)
#define T0 (UINT64_C(1800000000) * S)

static void test_acts_on_the_nth(void **state)
{
	(void)state;
	struct threshold th = { 0 };
	/* after = 3 within 10 s: hits at 0, 1 count; the one at 2 acts */
	assert_false(threshold_hit(&th, 3, 10 * S, T0));
	assert_int_equal(threshold_count(&th, 10 * S, T0), 1);
	assert_false(threshold_hit(&th, 3, 10 * S, T0 + 1 * S));
	assert_int_equal(threshold_count(&th, 10 * S, T0 + 1 * S), 2);
	assert_true(threshold_hit(&th, 3, 10 * S, T0 + 2 * S));
	/* it starts over */
	assert_int_equal(threshold_count(&th, 10 * S, T0 + 2 * S), 0);
	assert_false(threshold_hit(&th, 3, 10 * S, T0 + 3 * S));
	assert_false(threshold_hit(&th, 3, 10 * S, T0 + 4 * S));
	/* the first of those left the window (a hit at t counts while t + W > now) */
	assert_int_equal(threshold_count(&th, 10 * S, T0 + 13 * S), 1);
	assert_false(threshold_hit(&th, 3, 10 * S, T0 + 13 * S));
	assert_true(threshold_hit(&th, 3, 10 * S, T0 + 13 * S + 1));
	/* spaced further apart than the window: never */
	for (int i = 0; i < 50; i++)
		assert_false(threshold_hit(&th, 2, 10 * S, T0 + 100 * S + (uint64_t)i * 10 * S));
	/* after 1 (no threshold): at once, always */
	assert_true(threshold_hit(&th, 1, 10 * S, T0));
	assert_true(threshold_hit(&th, 0, 10 * S, T0));
	threshold_clear(&th);
	threshold_clear(&th);
}

/* The naive model: every hit since the last action, counted at each hit. */
struct model {
	uint64_t t[4096];
	size_t n;
};

static bool model_hit(struct model *m, unsigned after, uint64_t w, uint64_t now)
{
	if (after <= 1)
		return true;
	m->t[m->n++] = now;
	unsigned k = 0;
	for (size_t i = 0; i < m->n; i++)
		if (m->t[i] + w > now)
			k++;
	if (k >= after) {
		m->n = 0;
		return true;
	}
	return false;
}

static void test_random_against_model(void **state)
{
	(void)state;
	srand(19);
	static const unsigned afters[] = { 2, 3, 5, 17, 100 };
	for (size_t a = 0; a < sizeof(afters) / sizeof(afters[0]); a++) {
		unsigned total = 0;
		for (int round = 0; round < 20; round++) {
			struct threshold th = { 0 };
			struct model *m = calloc(1, sizeof(*m));
			assert_non_null(m);
			uint64_t w = (uint64_t)(1 + rand() % 60) * S, now = T0;
			unsigned acted = 0;
			for (int i = 0; i < 4000; i++) {
				now += (uint64_t)(rand() % 3) * S / 2 + (uint64_t)(rand() % 1000);
				bool got = threshold_hit(&th, afters[a], w, now);
				bool want = model_hit(m, afters[a], w, now);
				if (got != want)
					fail_msg("after %u within %llu s, step %d: got %d, want %d",
						 afters[a], (unsigned long long)(w / S), i, got, want);
				acted += got;
				if (m->n == sizeof(m->t) / sizeof(m->t[0]))
					m->n = 0, threshold_clear(&th);
			}
			total += acted;
			free(m);
			threshold_clear(&th);
		}
		assert_true(total > 0); /* the model acted, and so did the counter */
	}
}

/* A new threshold (a reload) starts the count over. */
static void test_new_threshold_starts_over(void **state)
{
	(void)state;
	struct threshold th = { 0 };
	assert_false(threshold_hit(&th, 3, 10 * S, T0));
	assert_false(threshold_hit(&th, 3, 10 * S, T0 + 1));
	assert_false(threshold_hit(&th, 4, 10 * S, T0 + 2));
	assert_int_equal(threshold_count(&th, 10 * S, T0 + 2), 1);
	/* beyond the maximum: capped, memory bounded, and no bigger than the hits need */
	assert_false(threshold_hit(&th, 100000, 10 * S, T0 + 3));
	assert_true(th.cap <= 4);
	for (unsigned i = 1; i < THRESHOLD_AFTER_MAX - 1; i++)
		assert_false(threshold_hit(&th, 100000, 10 * S, T0 + 4 + i));
	assert_int_equal(th.cap, THRESHOLD_AFTER_MAX - 1);
	assert_int_equal(threshold_count(&th, 10 * S, T0 + 4 + THRESHOLD_AFTER_MAX),
			 THRESHOLD_AFTER_MAX - 1);
	assert_true(threshold_hit(&th, 100000, 10 * S, T0 + 5 + THRESHOLD_AFTER_MAX));
	threshold_clear(&th);
}

/* One hit costs a few entries, not after's worth (a lane per domain and one reply each:
 * the memory follows the replies, not the configuration); the ring keeps its order as
 * it grows while its head has moved. */
static void test_ring_grows_with_the_hits(void **state)
{
	(void)state;
	struct threshold th = { 0 };
	assert_false(threshold_hit(&th, 1000, 10 * S, T0));
	assert_true(th.cap > 0 && th.cap <= 4);
	/* move the head: hits that leave the window, then more than the ring holds */
	for (unsigned i = 1; i <= 3; i++)
		assert_false(threshold_hit(&th, 1000, 10 * S, T0 + i * S));
	for (unsigned i = 0; i < 20; i++)
		assert_false(threshold_hit(&th, 1000, 10 * S, T0 + 14 * S + i));
	/* the hits at 0..3 s left; those at 14 s stay */
	assert_int_equal(threshold_count(&th, 10 * S, T0 + 14 * S + 20), 20);
	assert_true(th.cap >= 20 && th.cap < 64);
	assert_int_equal(threshold_count(&th, 10 * S, T0 + 25 * S), 0);
	threshold_clear(&th);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_acts_on_the_nth),
		cmocka_unit_test(test_random_against_model),
		cmocka_unit_test(test_new_threshold_starts_over),
		cmocka_unit_test(test_ring_grows_with_the_hits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
