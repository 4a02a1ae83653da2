/*
 * test_relay_conn -- a lane's connections and DNS (src/relay/relay_conn.c) in the harness
 * of relay_harness.h: no more connections than the route allows, a connection reused for
 * the next message, a server that cannot be reached (the next MX host first, then the
 * lane waits: nobody's mail fails), and a DNS failure that suspends the lane until its
 * next lookup.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "relay_harness.h"

static void test_connections_within_the_routes_limit(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	h.conf.routes[0].connections = 2;
	harness_open(&h);
	const char *rc = "a@c.test";
	char id[3][QUEUE_ID_LEN + 1];
	for (int i = 0; i < 3; i++)
		harness_put(&h, "s@sender.test", &rc, 1, id[i]);
	assert_int_equal(h.opened, 2);
	struct lane *l = lane_find(h.r, "r");
	assert_int_equal(l->nconns, 2);
	struct smtp_out *c = harness_busy(&h);
	assert_non_null(c);
	harness_reply(&h, c, 250, "2.0.0", NULL, "ok");
	/* the third message goes on the connection that is free: no third connection */
	assert_int_equal(h.opened, 2);
	assert_int_equal(c->transactions, 1);
	assert_non_null(c->done); /* its next transaction */
	assert_string_equal(c->msg->rcpt[0].ptr, "a@c.test");
	harness_close(&h);
}

static const struct smtp_out_result refused = {
	.stage = SMTP_STAGE_CONNECT, .error = -ECONNREFUSED, .why = "", .tls_version = "",
	.auth_mech = ""
};

static void test_unreachable_smarthost_suspends_the_lane(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	h.auto_ready = false;
	const char *rc = "a@c.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, id);
	assert_int_equal(h.opened, 1);
	harness_ready(&h, h.conns, &refused);
	struct lane *l = lane_find(h.r, "r");
	assert_true(lane_budget_suspended(&l->b, h.now));
	assert_int_equal(l->nconns, 0);
	struct rmsg *m = msg_find(h.r, id);
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	assert_int_equal(m->r[0].attempts, 0);
	assert_true(harness_logged(&h, "lane=r", "session failed at connect", NULL));
	harness_close(&h);
}

/* An mx route, and a message to rcpt whose domain's lookup waits for the test. */
static void mx_message(struct harness *h, const char *rcpt, char id[QUEUE_ID_LEN + 1])
{
	harness_init(h);
	h->conf.routes[0].mx = true;
	harness_open(h);
	h->auto_ready = false;
	harness_put(h, "s@sender.test", &rcpt, 1, id);
}

static void test_next_mx_host_before_the_lane_waits(void **state)
{
	(void)state;
	struct harness h;
	char id[QUEUE_ID_LEN + 1];
	mx_message(&h, "a@two.test", id);
	const char *mx[] = { "mx1.two.test", "mx2.two.test" };
	harness_dns_answer(&h, "two.test", mx, 2, false, 300, 0);
	assert_int_equal(h.opened, 1);
	assert_string_equal(h.conns->host, "mx1.two.test");
	harness_ready(&h, h.conns, &refused);
	assert_int_equal(h.opened, 2); /* at once, the next one */
	assert_string_equal(h.conns->host, "mx2.two.test");
	struct lane *l = lane_find(h.r, "r:two.test");
	assert_false(lane_budget_suspended(&l->b, h.now));
	harness_ready(&h, h.conns, &refused);
	assert_true(lane_budget_suspended(&l->b, h.now)); /* every one tried */
	assert_int_equal(msg_find(h.r, id)->r[0].status, QUEUE_TODO);
	harness_close(&h);
}

static void test_dns_failure_suspends_until_the_next_lookup(void **state)
{
	(void)state;
	struct harness h;
	char id[QUEUE_ID_LEN + 1];
	mx_message(&h, "a@flaky.test", id);
	harness_dns_answer(&h, "flaky.test", NULL, 0, false, 0, -EAGAIN);
	struct lane *l = lane_find(h.r, "r:flaky.test");
	assert_true(lane_budget_suspended(&l->b, h.now));
	assert_false(harness_dns_waits(&h, "flaky.test", false));
	assert_int_equal(msg_find(h.r, id)->r[0].status, QUEUE_TODO);
	assert_true(harness_logged(&h, "cannot look up flaky.test: temporary DNS failure", NULL));
	/* relay.dns_retry_min later it is looked up again */
	harness_advance(&h, (uint64_t)h.conf.dns_retry_min_ms * 2);
	assert_true(harness_dns_waits(&h, "flaky.test", false));
	const char *mx[] = { "mx.flaky.test" };
	harness_dns_answer(&h, "flaky.test", mx, 1, false, 300, 0);
	assert_int_equal(h.opened, 1);
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_connections_within_the_routes_limit),
		cmocka_unit_test(test_unreachable_smarthost_suspends_the_lane),
		cmocka_unit_test(test_next_mx_host_before_the_lane_waits),
		cmocka_unit_test(test_dns_failure_suspends_until_the_next_lookup),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
