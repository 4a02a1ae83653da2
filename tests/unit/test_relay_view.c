/*
 * test_relay_view -- what the relay shows (src/relay/relay_view.c) and its top room's
 * reload (src/relay/relay.c), in the harness of relay_harness.h: `sluice lanes` in text
 * and JSON with a lane's budget, waiting mail and counters, the operator's suspend and
 * resume, the metrics' lanes, and a reload that routes the waiting mail again.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "relay_harness.h"

static void lanes(struct harness *h, bool json, char *out, size_t len)
{
	struct buf b;
	buf_init(&b, 1 << 20);
	assert_int_equal(relay_lanes(h->r, json, &b), 0);
	snprintf(out, len, "%.*s", (int)b.len, b.ptr ? b.ptr : "");
	buf_done(&b);
}

static void test_lanes_text_and_json(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	char err[128];
	assert_int_equal(rate_window_parse(str_cstr("8/1m"), &h.conf.routes[0].rate.w[0], err,
					   sizeof(err)), 0);
	h.conf.routes[0].rate.n = 1;
	harness_open(&h);
	const char *rc[] = { "a@v.test", "b@v.test" };
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", rc, 2, id);
	const int rcpt[] = { 250, 550 };
	harness_reply(&h, harness_busy(&h), 250, "2.0.0", rcpt, "ok");
	char out[8192];
	lanes(&h, false, out, sizeof(out));
	assert_non_null(strstr(out, "r (route r)"));
	assert_non_null(strstr(out, "window 8/1m         used 1/8"));
	assert_non_null(strstr(out, "sends 1, delivered 1, deferred 0, failed 1"));
	assert_non_null(strstr(out, "state        active"));
	lanes(&h, true, out, sizeof(out));
	assert_non_null(strstr(out, "{\"lane\": \"r\", \"route\": \"r\", \"windows\": [{\"limit\": 8"));
	assert_non_null(strstr(out, "\"used\": 1}"));
	assert_non_null(strstr(out, "\"delivered\": 1"));
	assert_non_null(strstr(out, "\"failed\": 1"));
	struct relay_lane_metrics lm[4];
	size_t n = 0;
	struct relay_stats st;
	assert_int_equal(relay_lane_metrics(h.r, lm, 4, &n, &st), 0);
	assert_int_equal(n, 1);
	assert_string_equal(lm[0].name, "r");
	assert_int_equal(lm[0].used[0], 1);
	assert_int_equal(lm[0].configured[0], 8);
	assert_int_equal(st.delivered, 1);
	assert_int_equal(st.failed, 1);
	harness_close(&h);
}

static void test_operator_suspends_and_resumes(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	const char *rc = "a@v.test";
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, a);
	harness_reply(&h, harness_busy(&h), 250, "2.0.0", NULL, "ok");
	assert_int_equal(relay_lane_suspend(h.r, "nosuch", 0), -ENOENT);
	assert_int_equal(relay_lane_suspend(h.r, "r", 0), 0);
	harness_put(&h, "s@sender.test", &rc, 1, b);
	assert_null(harness_busy(&h));
	char out[8192];
	lanes(&h, false, out, sizeof(out));
	assert_non_null(strstr(out, "suspended"));
	assert_int_equal(relay_lane_resume(h.r, "r"), 0);
	harness_run(&h);
	assert_non_null(harness_busy(&h));
	harness_close(&h);
}

/* A reload that gives a domain a route of its own moves its waiting mail there. */
static void test_reload_routes_again(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	h.auto_ready = false;
	const char *rc = "a@moved.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, id);
	assert_string_equal(msg_find(h.r, id)->r[0].lane->name, "r");
	harness_route(&h, "own", "moved.test");
	assert_int_equal(relay_reconfigure(h.r, &h.conf, NULL), 0);
	harness_run(&h);
	struct rmsg *m = msg_find(h.r, id);
	assert_non_null(m->r[0].lane);
	assert_string_equal(m->r[0].lane->name, "own");
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lanes_text_and_json),
		cmocka_unit_test(test_operator_suspends_and_resumes),
		cmocka_unit_test(test_reload_routes_again),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
