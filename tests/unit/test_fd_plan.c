/*
 * test_fd_plan -- the share-out of file descriptors: what each part of a configuration
 * holds back, the reserve, and what the sessions need at least and at most.
 *
 * Table-driven: a configuration built field by field, and the plan it must give.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "daemon_config.h"
#include "fd_plan.h"
#include "relay.h"

enum part { MILTER = 1, POLICY = 2, INTAKE = 4, ROUTE = 8, MX = 16, METRICS = 32, REDIS = 64 };

struct plan_case {
	unsigned parts, workers, open;
	unsigned max_milter, max_policy, max_intake;
	/* expected */
	unsigned listeners;
	bool queue, relay, metrics, store;
	uint64_t sessions_min, sessions_max;
};

static void build(const struct plan_case *t, struct daemon_config *dc, struct route_conf *r)
{
	memset(dc, 0, sizeof(*dc));
	struct sluice_config *c = &dc->conf;
	c->control.n = 1;
	if (t->parts & MILTER) {
		c->milter.listen.n = 1;
		c->milter.max_sessions = t->max_milter;
	}
	if (t->parts & POLICY) {
		c->policy.listen.n = 2;
		c->policy.max_sessions = t->max_policy;
	}
	if (t->parts & INTAKE) {
		c->intake.enabled = true;
		c->intake.listen.n = 1;
		c->intake.max_sessions = t->max_intake;
	}
	if (t->parts & ROUTE) {
		memset(r, 0, sizeof(*r));
		r->mx = t->parts & MX;
		r->connections = 3;
		dc->relay.routes = r;
		dc->relay.nroutes = 1;
	}
	if (t->parts & METRICS) {
		c->metrics.enabled = true;
		c->metrics.max_connections = 4;
	}
	c->store.redis = t->parts & REDIS;
}

static void test_plans(void **state)
{
	(void)state;
	static const struct plan_case cases[] = {
		/* milter alone: sessions one each, at most its max_sessions */
		{ MILTER, 2, 5, 100, 0, 0, 2, false, false, false, false, 1, 100 },
		/* a max_sessions of 0 is no limit */
		{ MILTER | POLICY, 2, 5, 0, 10, 0, 4, false, false, false, false, 2, UINT64_MAX },
		/* the intake's sessions count twice (socket and message file); a queue */
		{ INTAKE, 4, 7, 0, 0, 50, 2, true, false, false, false, 2, 100 },
		/* a relay without an intake still opens the queue */
		{ ROUTE, 1, 5, 0, 0, 0, 1, true, true, false, false, 0, 0 },
		{ ROUTE | MX | INTAKE | METRICS | REDIS, 2, 5, 0, 0, 10, 2, true, true, true, true,
		  2, 20 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct plan_case *t = &cases[i];
		struct daemon_config c;
		struct route_conf r;
		build(t, &c, &r);
		struct fd_plan p;
		fd_plan_make(&c, t->workers, t->open, &p);
		assert_int_equal(p.open, t->open);
		assert_int_equal(p.listeners, t->listeners);
		assert_true((p.queue > 64) == t->queue);   /* msg/ and log/: 32 directories each */
		assert_true((p.relay > 64 + 3) == t->relay); /* idle files and its connections */
		if (t->relay && (t->parts & MX))
			assert_true(p.relay >= 64 + 3 + 64);   /* other lanes of an mx route */
		assert_true((p.metrics >= 4) == t->metrics);
		assert_true((p.store >= t->workers) == t->store);
		assert_true(p.threads >= 4 * t->workers);
		assert_int_equal(p.reserve, FD_PLAN_RESERVE);
		assert_int_equal(p.held, p.open + p.threads + p.listeners + p.queue + p.relay +
						 p.metrics + p.store + p.reserve);
		assert_int_equal(p.sessions_min, t->sessions_min);
		assert_true(p.sessions_max == t->sessions_max);
	}
}

static void test_more_workers_hold_more(void **state)
{
	(void)state;
	struct plan_case t = { MILTER, 1, 5, 10, 0, 0, 2, false, false, false, false, 1, 10 };
	struct daemon_config c;
	struct route_conf r;
	build(&t, &c, &r);
	struct fd_plan one, eight;
	fd_plan_make(&c, 1, 5, &one);
	fd_plan_make(&c, 8, 5, &eight);
	assert_int_equal(eight.held - one.held, 7 * 4);
}

static void test_format_names_every_part_and_the_sum(void **state)
{
	(void)state;
	struct fd_plan p = { .open = 1, .threads = 2, .listeners = 3, .queue = 4, .relay = 5,
			     .metrics = 6, .store = 7, .reserve = 8, .held = 36 };
	char out[400];
	fd_plan_format(&p, out, sizeof(out));
	assert_string_equal(out, "1 open at start + 2 for the event loops + 3 listeners + 4 for "
				 "the queue + 5 for the relay + 6 for metrics + 7 for Redis + 8 "
				 "kept in reserve = 36");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plans),
		cmocka_unit_test(test_more_workers_hold_more),
		cmocka_unit_test(test_format_names_every_part_and_the_sum),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
