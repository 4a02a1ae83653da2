/*
 * test_relay_hist -- the send history, state_dir/relay.lanes (src/relay/relay_hist.c), in
 * the harness of relay_harness.h: each send is a line before its MAIL FROM goes out, and a
 * relay started again over the same directory keeps the budget its sends used and the
 * suspension it was under.
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

#define MS UINT64_C(1000000)

static size_t lines_of(struct harness *h, const char *prefix)
{
	char path[128], line[512];
	snprintf(path, sizeof(path), "%s/relay.lanes", h->dir);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = 0;
	while (fgets(line, sizeof(line), f))
		n += strncmp(line, prefix, strlen(prefix)) == 0;
	fclose(f);
	return n;
}

static void test_a_restart_keeps_the_budget(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	char err[128];
	assert_int_equal(rate_window_parse(str_cstr("1/1m"), &h.conf.routes[0].rate.w[0], err,
					   sizeof(err)), 0);
	h.conf.routes[0].rate.n = 1;
	harness_open(&h);
	const char *rc = "a@h.test";
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, a);
	struct smtp_out *c = harness_busy(&h);
	assert_non_null(c);
	assert_int_equal(lines_of(&h, "r "), 1); /* written before the transaction was sent */
	harness_reply(&h, c, 250, "2.0.0", NULL, "ok");
	h.now += 5000 * MS;
	harness_restart(&h);
	harness_put(&h, "s@sender.test", &rc, 1, b);
	assert_null(harness_busy(&h)); /* the send before the restart still counts */
	harness_advance(&h, 55 * 1000);
	assert_non_null(harness_busy(&h));
	assert_int_equal(lines_of(&h, "r "), 2);
	harness_close(&h);
}

static void test_a_restart_keeps_a_suspension(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	h.auto_ready = false;
	assert_int_equal(relay_lane_suspend(h.r, "r", 0), -ENOENT); /* no lane yet */
	const char *rc = "a@h.test";
	char a[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, a);
	assert_int_equal(relay_lane_suspend(h.r, "r", 3600 * 1000), 0);
	assert_int_equal(lines_of(&h, "S r "), 1);
	harness_restart(&h);
	struct lane *l = lane_find(h.r, "r");
	assert_non_null(l); /* made again for the message it holds */
	assert_true(lane_budget_suspended(&l->b, h.now));
	assert_true(l->b.suspended_until >= h.now + 3599 * 1000 * MS);
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_a_restart_keeps_the_budget),
		cmocka_unit_test(test_a_restart_keeps_a_suspension),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
