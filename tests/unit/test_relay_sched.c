/*
 * test_relay_sched -- the relay's scheduler (src/relay/relay_sched.c): the oldest due item first,
 * waiting items due exactly at their time, lanes woken in order, and a lane's decision.
 * The heaps are checked against a naive model (a plain array scanned at every step) over
 * thousands of random operations.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "relay_sched.h"

#define S UINT64_C(1000000000)
#define T0 (UINT64_C(1800000000) * S)

static void test_oldest_due_first(void **state)
{
	struct sched_lane l;
	sched_lane_init(&l);
	struct sched_item it[4] = {
		{ .arrival = 30 }, { .arrival = 10 }, { .arrival = 20 }, { .arrival = 10, .seq = 1 },
	};
	for (int i = 0; i < 4; i++)
		assert_int_equal(sched_item_set(&l, &it[i], 0, T0), 0);
	assert_ptr_equal(sched_next(&l, T0), &it[1]);
	sched_item_remove(&l, &it[1]);
	assert_ptr_equal(sched_next(&l, T0), &it[3]); /* same arrival: the sequence */
	sched_item_remove(&l, &it[3]);
	assert_ptr_equal(sched_next(&l, T0), &it[2]);
	/* the oldest one waits: the next oldest is served meanwhile */
	assert_int_equal(sched_item_set(&l, &it[2], T0 + 5 * S, T0), 0);
	assert_ptr_equal(sched_next(&l, T0), &it[0]);
	sched_item_remove(&l, &it[0]);
	assert_null(sched_next(&l, T0));
	assert_int_equal(sched_lane_next_due(&l), T0 + 5 * S);
	assert_null(sched_next(&l, T0 + 5 * S - 1)); /* never before its moment */
	assert_ptr_equal(sched_next(&l, T0 + 5 * S), &it[2]);
	assert_int_equal(sched_lane_next_due(&l), 0);
	/* SCHED_NEVER: nowhere */
	assert_int_equal(sched_item_set(&l, &it[2], SCHED_NEVER, T0), 0);
	assert_int_equal(it[2].where, SCHED_NONE);
	assert_int_equal(sched_lane_items(&l), 0);
	assert_int_equal(sched_lane_next_due(&l), SCHED_NEVER);
	sched_lane_done(&l);
}

/* A message that came back after a retry takes its place by arrival, before newer ones. */
static void test_retry_keeps_arrival_order(void **state)
{
	struct sched_lane l;
	sched_lane_init(&l);
	struct sched_item old = { .arrival = 1 }, young = { .arrival = 2 };
	assert_int_equal(sched_item_set(&l, &old, T0 + S, T0), 0);
	assert_int_equal(sched_item_set(&l, &young, 0, T0), 0);
	assert_ptr_equal(sched_next(&l, T0), &young);
	assert_ptr_equal(sched_next(&l, T0 + S), &old);
	sched_lane_done(&l);
	assert_int_equal(old.where, SCHED_NONE);
}

/* ---- the naive model ---- */

struct model_item {
	bool in;
	uint64_t due;
};

static uint64_t model_next_due(struct model_item *m, size_t n, uint64_t now)
{
	uint64_t best = SCHED_NEVER;
	for (size_t i = 0; i < n; i++) {
		if (!m[i].in)
			continue;
		if (m[i].due <= now)
			return 0;
		if (m[i].due < best)
			best = m[i].due;
	}
	return best;
}

/*
 * 20,000 random steps over 400 items in two lanes: put an item (due now, later, or
 * never), take one out, serve the oldest due one (as a transaction: it then waits or
 * leaves), let time pass.  After every step the heaps answer what the model answers.
 */
static void test_random_against_model(void **state)
{
	enum { N = 400, STEPS = 20000 };
	struct sched_lane lanes[2];
	struct sched_item *items = calloc(N, sizeof(*items));
	struct model_item *model = calloc(N, sizeof(*model));
	assert_non_null(items);
	assert_non_null(model);
	sched_lane_init(&lanes[0]);
	sched_lane_init(&lanes[1]);
	srandom(15);
	for (size_t i = 0; i < N; i++)
		items[i] = (struct sched_item){ .arrival = (uint64_t)(random() % 50),
						.seq = i };
	uint64_t now = T0;
	size_t served = 0;
	for (int step = 0; step < STEPS; step++) {
		size_t i = (size_t)random() % N;
		struct sched_lane *l = &lanes[i % 2];
		switch (random() % 6) {
		case 0:
		case 1: {
			long r = random() % 4;
			uint64_t due = r == 0 ? 0 : r == 1 ? SCHED_NEVER
					   : now + (uint64_t)(random() % 20) * (S / 4) -
						     (r == 2 ? S : 0);
			assert_int_equal(sched_item_set(l, &items[i], due, now), 0);
			model[i] = (struct model_item){ .in = due != SCHED_NEVER, .due = due };
			break;
		}
		case 2:
			sched_item_remove(l, &items[i]);
			model[i].in = false;
			break;
		case 3: {
			for (int k = 0; k < 2; k++) {
				struct sched_item *got = sched_next(&lanes[k], now);
				/* the model of lane k: items of its parity */
				struct sched_item *want = NULL;
				for (size_t j = (size_t)k; j < N; j += 2) {
					if (!model[j].in || model[j].due > now)
						continue;
					if (!want || items[j].arrival < want->arrival ||
					    (items[j].arrival == want->arrival &&
					     items[j].seq < want->seq))
						want = &items[j];
				}
				assert_ptr_equal(got, want);
				if (got) {
					size_t j = (size_t)(got - items);
					uint64_t due = random() % 2 ? SCHED_NEVER
								    : now + (uint64_t)(random() % 8) * S;
					assert_int_equal(sched_item_set(&lanes[k], got, due, now), 0);
					model[j] = (struct model_item){ .in = due != SCHED_NEVER,
									.due = due };
					served++;
				}
			}
			break;
		}
		case 4:
			now += (uint64_t)(random() % 3) * (S / 2);
			break;
		case 5: {
			/* both lanes' next due times, as the model sees them */
			for (int k = 0; k < 2; k++) {
				struct model_item sub[N / 2];
				for (size_t j = 0; j < N / 2; j++)
					sub[j] = model[2 * j + (size_t)k];
				uint64_t want = model_next_due(sub, N / 2, now);
				uint64_t got = sched_lane_next_due(&lanes[k]);
				/* the lane promotes lazily: items due by now may still sit in
				 * wait, so "0" is what it says once sched_next() has run */
				if (want == 0) {
					sched_next(&lanes[k], now);
					got = sched_lane_next_due(&lanes[k]);
				}
				assert_int_equal(got, want);
			}
			break;
		}
		}
		size_t in = 0;
		for (size_t j = 0; j < N; j++)
			in += model[j].in;
		assert_int_equal(sched_lane_items(&lanes[0]) + sched_lane_items(&lanes[1]), in);
	}
	/* the run served a good many transactions, or the test proved little */
	assert_true(served > 1000);
	sched_lane_done(&lanes[0]);
	sched_lane_done(&lanes[1]);
	free(items);
	free(model);
}

/* 5,000 random steps over 300 lanes' wake-ups against the model. */
static void test_wakeups_against_model(void **state)
{
	enum { N = 300, STEPS = 5000 };
	struct sched s;
	sched_init(&s);
	struct sched_lane *lanes = calloc(N, sizeof(*lanes));
	uint64_t *model = calloc(N, sizeof(*model));
	assert_non_null(lanes);
	for (size_t i = 0; i < N; i++) {
		sched_lane_init(&lanes[i]);
		model[i] = SCHED_NEVER;
	}
	srandom(16);
	uint64_t now = T0;
	size_t popped = 0;
	for (int step = 0; step < STEPS; step++) {
		size_t i = (size_t)random() % N;
		switch (random() % 4) {
		case 0:
		case 1: {
			uint64_t at = random() % 5 == 0 ? SCHED_NEVER
							: now + (uint64_t)(random() % 100) * (S / 10);
			assert_int_equal(sched_wake(&s, &lanes[i], at), 0);
			model[i] = at;
			break;
		}
		case 2:
			now += (uint64_t)(random() % 10) * (S / 10);
			break;
		case 3: {
			struct sched_lane *l;
			while ((l = sched_pop(&s, now))) {
				size_t j = (size_t)(l - lanes);
				assert_true(model[j] <= now);
				/* no lane due earlier is left behind */
				for (size_t k = 0; k < N; k++)
					assert_true(model[k] >= model[j]);
				model[j] = SCHED_NEVER;
				popped++;
			}
			for (size_t k = 0; k < N; k++)
				assert_true(model[k] > now);
			break;
		}
		}
		uint64_t want = SCHED_NEVER;
		for (size_t k = 0; k < N; k++)
			if (model[k] < want)
				want = model[k];
		assert_int_equal(sched_next_wake(&s), want);
	}
	assert_true(popped > 500);
	sched_done(&s);
	free(lanes);
	free(model);
}

/* Many items, one lane: each is served once, oldest first, whatever order they came in. */
static void test_many_items_in_arrival_order(void **state)
{
	enum { N = 100000 };
	struct sched_lane l;
	sched_lane_init(&l);
	struct sched_item *items = calloc(N, sizeof(*items));
	assert_non_null(items);
	srandom(17);
	for (size_t i = 0; i < N; i++) {
		items[i].arrival = (uint64_t)random();
		items[i].seq = i;
		/* half of them wait for a retry an hour away */
		assert_int_equal(sched_item_set(&l, &items[i], i % 2 ? T0 + 3600 * S : 0, T0), 0);
	}
	uint64_t last = 0;
	size_t n = 0;
	struct sched_item *it;
	while ((it = sched_next(&l, T0))) {
		assert_true(it->arrival >= last);
		last = it->arrival;
		sched_item_remove(&l, it);
		n++;
	}
	assert_int_equal(n, N / 2);
	assert_int_equal(sched_lane_next_due(&l), T0 + 3600 * S);
	sched_lane_done(&l);
	free(items);
}

static void test_decide(void **state)
{
	static const struct {
		struct sched_lane_state st;
		enum sched_action action;
		uint64_t wake;
		bool close_idle;
	} cases[] = {
		/* suspended: sleep to the end, idle connections go */
		{ { .work_due = true, .suspended_until = T0 + 9 * S, .idle = 1 }, SCHED_SLEEP,
		  T0 + 9 * S, true },
		/* a suspension that ended is no suspension */
		{ { .work_due = true, .suspended_until = T0, .idle = 1 }, SCHED_SEND, SCHED_NEVER,
		  false },
		/* nothing due: the earliest retry */
		{ { .next_due = T0 + 60 * S, .idle = 1 }, SCHED_SLEEP, T0 + 60 * S, false },
		{ { .next_due = SCHED_NEVER }, SCHED_SLEEP, SCHED_NEVER, false },
		/* an idle connection: send (its budget is the caller's to take) */
		{ { .work_due = true, .idle = 1, .conns = 1, .budget_wait = 5 * S }, SCHED_SEND,
		  SCHED_NEVER, false },
		/* no idle one, no budget: no connection opens to wait for it */
		{ { .work_due = true, .budget_wait = 5 * S, .max_conns = 2 }, SCHED_SLEEP,
		  T0 + 5 * S, false },
		/* a shared budget is asked at send time: connect */
		{ { .work_due = true, .budget_wait = 5 * S, .budget_shared = true, .max_conns = 2 },
		  SCHED_CONNECT, SCHED_NEVER, false },
		{ { .work_due = true, .max_conns = 2, .conns = 1 }, SCHED_CONNECT, SCHED_NEVER, false },
		/* one opening already, or the lane is full: wait for a connection's event */
		{ { .work_due = true, .max_conns = 2, .conns = 1, .connecting = 1 }, SCHED_HOLD,
		  SCHED_NEVER, false },
		{ { .work_due = true, .max_conns = 2, .conns = 2 }, SCHED_HOLD, SCHED_NEVER, false },
		/* max 0 means one */
		{ { .work_due = true }, SCHED_CONNECT, SCHED_NEVER, false },
		{ { .work_due = true, .conns = 1 }, SCHED_HOLD, SCHED_NEVER, false },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sched_decision d;
		sched_decide(&cases[i].st, T0, &d);
		assert_int_equal(d.action, cases[i].action);
		if (d.action == SCHED_SLEEP)
			assert_int_equal(d.wake, cases[i].wake);
		assert_int_equal(d.close_idle, cases[i].close_idle);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_oldest_due_first),
		cmocka_unit_test(test_retry_keeps_arrival_order),
		cmocka_unit_test(test_random_against_model),
		cmocka_unit_test(test_wakeups_against_model),
		cmocka_unit_test(test_many_items_in_arrival_order),
		cmocka_unit_test(test_decide),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
