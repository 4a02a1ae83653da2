/*
 * test_relay_signal -- the signals' thresholds in a lane (src/relay/relay_signal.c) in
 * the harness of relay_harness.h: a signal with `after = 3; within = 1m` acts on its third
 * matching reply within the minute (before it, the reply only retries the recipient:
 * never a bounce, law 5), a transaction counts once however many of its replies match,
 * the window forgets, and `sluice lanes` shows the count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "relay_harness.h"

#define MS UINT64_C(1000000)

static struct harness h;
static struct lane *l;

static int setup(void **state)
{
	(void)state;
	harness_init(&h);
	struct route_conf *rc = &h.conf.routes[0];
	rc->signals = calloc(1, sizeof(*rc->signals));
	assert_non_null(rc->signals);
	rc->signals[0] = (struct classify_signal_conf){ .match = strdup("over quota"),
							.action = CLASSIFY_SUSPEND,
							.for_ms = 600000, .after = 3,
							.within_ms = 60000 };
	rc->nsignals = 1;
	harness_open(&h);
	h.auto_ready = false;
	const char *r = "a@s.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &r, 1, id);
	l = lane_find(h.r, "r");
	assert_non_null(l);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	harness_close(&h);
	return 0;
}

static const struct smtp_reply quota = { .code = 452, .enh_class = 4, .enh_subject = 2,
					 .enh_detail = 2, .lines = 1,
					 .text_len = sizeof("4.2.2 mailbox over quota") - 1,
					 .text = "4.2.2 mailbox over quota" };

static enum classify_verdict reply(struct signal_once *once)
{
	struct classify_result cr;
	signal_classify(l, l->rt->cls, SMTP_STAGE_RCPT, 0, &quota, once, &cr);
	return cr.verdict;
}

static void view(char *out, size_t len)
{
	struct buf b;
	buf_init(&b, 1 << 16);
	signal_view(l, false, &b, h.now);
	snprintf(out, len, "%.*s", (int)b.len, b.ptr ? b.ptr : "");
	buf_done(&b);
}

static void test_acts_on_the_third_within_its_window(void **state)
{
	(void)state;
	char v[512];
	assert_int_equal(reply(NULL), CLASSIFY_RETRY);
	h.now += 10000 * MS;
	assert_int_equal(reply(NULL), CLASSIFY_RETRY);
	view(v, sizeof(v));
	assert_non_null(strstr(v, "threshold    2 of 3 within 1m"));
	assert_non_null(strstr(v, "over quota"));
	h.now += 10000 * MS;
	struct classify_result cr;
	signal_classify(l, l->rt->cls, SMTP_STAGE_RCPT, 0, &quota, NULL, &cr);
	assert_int_equal(cr.verdict, CLASSIFY_SUSPEND);
	assert_int_equal(cr.for_ms, 600000);
}

static void test_one_transaction_counts_once(void **state)
{
	(void)state;
	struct signal_once once = { 0 };
	for (int i = 0; i < 5; i++)
		assert_int_equal(reply(&once), CLASSIFY_RETRY);
	signal_once_clear(&once);
	char v[512];
	view(v, sizeof(v));
	assert_non_null(strstr(v, "threshold    1 of 3"));
}

static void test_the_window_forgets(void **state)
{
	(void)state;
	assert_int_equal(reply(NULL), CLASSIFY_RETRY);
	assert_int_equal(reply(NULL), CLASSIFY_RETRY);
	h.now += 61000 * MS;
	assert_int_equal(reply(NULL), CLASSIFY_RETRY); /* the first two no longer count */
	char v[512];
	view(v, sizeof(v));
	assert_non_null(strstr(v, "threshold    1 of 3"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_acts_on_the_third_within_its_window, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_one_transaction_counts_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_the_window_forgets, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
