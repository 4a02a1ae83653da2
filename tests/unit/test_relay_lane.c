/*
 * test_relay_lane -- lanes (src/relay/relay_lane.c) in the harness of relay_harness.h:
 * the oldest due item first (lane_pick), a lane's exact budget under the test's clock, a
 * lane failing or deferring its due recipients (through the message room's one writer),
 * and a lane made for each route.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "relay_harness.h"

#define MS UINT64_C(1000000)

static void quiet(struct harness *h, const char *rcpt, char id[QUEUE_ID_LEN + 1])
{
	h->auto_ready = false;
	harness_put(h, "s@sender.test", &rcpt, 1, id);
}

/* lane_pick: the oldest item whose recipients are due; busy and waiting ones passed over. */
static void test_pick_the_oldest_due(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1], c[QUEUE_ID_LEN + 1];
	quiet(&h, "1@p.test", a);
	quiet(&h, "2@p.test", b);
	quiet(&h, "3@p.test", c);
	struct rmsg *ma = msg_find(h.r, a), *mb = msg_find(h.r, b), *mc = msg_find(h.r, c);
	struct lane *l = ma->r[0].lane;
	assert_ptr_equal(l, mc->r[0].lane);
	size_t idx[4], n = 0;
	uint64_t next = UINT64_MAX;
	struct lane_item *it = lane_pick(l, h.now, 4, idx, &n, &next);
	assert_non_null(it);
	assert_ptr_equal(it->m, ma);
	assert_int_equal(n, 1);
	/* the oldest waits for its retry, the next one is busy: the third is picked */
	ma->r[0].next_try = h.now + 5000 * MS;
	msg_schedule(h.r, ma);
	mb->r[0].busy = true;
	msg_schedule(h.r, mb);
	it = lane_pick(l, h.now, 4, idx, &n, &next);
	assert_non_null(it);
	assert_ptr_equal(it->m, mc);
	/* nothing due: when the next one will be */
	mc->r[0].busy = true;
	msg_schedule(h.r, mc);
	next = UINT64_MAX;
	assert_null(lane_pick(l, h.now, 4, idx, &n, &next));
	assert_int_equal(next, h.now + 5000 * MS);
	/* at its moment, the oldest again */
	it = lane_pick(l, h.now + 5000 * MS, 4, idx, &n, &next);
	assert_non_null(it);
	assert_ptr_equal(it->m, ma);
	/* of a message's recipients, the one in a transaction is not taken again */
	const char *two[] = { "4@p.test", "5@p.test" };
	char d[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", two, 2, d);
	struct rmsg *md = msg_find(h.r, d);
	ma->r[0].busy = true;
	msg_schedule(h.r, ma);
	md->r[0].busy = true;
	it = lane_pick(l, h.now + 5000 * MS, 4, idx, &n, &next);
	assert_non_null(it);
	assert_ptr_equal(it->m, md);
	assert_int_equal(n, 1);
	assert_int_equal(idx[0], 1);
	ma->r[0].busy = mb->r[0].busy = mc->r[0].busy = md->r[0].busy = false;
	harness_close(&h);
}

/* A lane of 2 per minute sends the third message exactly when the window lets it. */
static void test_exact_budget(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	char err[128];
	assert_int_equal(rate_window_parse(str_cstr("2/1m"), &h.conf.routes[0].rate.w[0], err,
					   sizeof(err)), 0);
	h.conf.routes[0].rate.n = 1;
	harness_open(&h);
	char id[3][QUEUE_ID_LEN + 1];
	const char *rc = "b@q.test";
	for (int i = 0; i < 3; i++) {
		harness_put(&h, "s@sender.test", &rc, 1, id[i]);
		struct smtp_out *c = harness_busy(&h);
		if (i < 2) {
			assert_non_null(c);
			harness_reply(&h, c, 250, "2.0.0", NULL, "ok");
			h.now += 10 * 1000 * MS; /* 10 s between them */
		} else {
			assert_null(c); /* two in the last minute */
		}
	}
	/* the first send was 20 s ago: the window lets the third go 40 s from now, not a
	 * microsecond earlier */
	harness_advance_us(&h, 40 * 1000 * 1000 - 1);
	assert_null(harness_busy(&h));
	harness_advance_us(&h, 1);
	assert_non_null(harness_busy(&h));
	harness_close(&h);
}

/* A lane's domain takes no mail: its due recipients fail, those in a transaction wait. */
static void test_fail_all(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1];
	quiet(&h, "1@f.test", a);
	quiet(&h, "2@f.test", b);
	struct rmsg *ma = msg_find(h.r, a), *mb = msg_find(h.r, b);
	struct lane *l = ma->r[0].lane;
	mb->r[0].busy = true; /* as if in a transaction */
	mb->busy = 1;
	lane_fail_all(l, "5.1.10", "f.test does not accept mail (null MX)");
	assert_int_equal(ma->r[0].status, QUEUE_FAILED);
	assert_int_equal(harness_disk_status(&h, a, 0), QUEUE_FAILED);
	assert_int_equal(mb->r[0].status, QUEUE_TODO);
	assert_int_equal(l->failed, 1);
	assert_true(harness_logged(&h, "rcpt=<1@f.test>", "status=bounced", "dsn=5.1.10",
				   "null MX", NULL));
	mb->r[0].busy = false;
	mb->busy = 0;
	harness_close(&h);
}

/* Deferred without a transaction (DANE's verdict): one more attempt, the backoff, the
 * reason in the attempt log, and one line for the lane. */
static void test_defer_due(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	char a[QUEUE_ID_LEN + 1];
	quiet(&h, "1@g.test", a);
	struct rmsg *m = msg_find(h.r, a);
	struct lane *l = m->r[0].lane;
	lane_defer_due(l, "mx.g.test", "4.7.5", "DANE", "no usable TLSA record");
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	assert_int_equal(m->r[0].attempts, 1);
	assert_true(m->r[0].next_try >= h.now + (uint64_t)h.conf.retry_min_ms * MS * 9 / 10);
	assert_int_equal(l->deferred, 1);
	char log[4096];
	harness_attempts(&h, a, log, sizeof(log));
	assert_non_null(strstr(log, "status=deferred"));
	assert_non_null(strstr(log, "dsn=4.7.5"));
	assert_true(harness_logged(&h, "lane=r", "mta=mx.g.test", "DANE: no usable TLSA record",
				   "1 recipient(s) deferred", NULL));
	assert_true(harness_logged(&h, "rcpt=<1@g.test>", "status=deferred", "(DANE)", NULL));
	/* not due again before its retry */
	size_t idx[1], n;
	uint64_t next = UINT64_MAX;
	assert_null(lane_pick(l, h.now, 1, idx, &n, &next));
	harness_close(&h);
}

/* Each route has its lane; a domain is routed by the first route that matches it. */
static void test_routes_make_lanes(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_route(&h, "special", "special.test");
	harness_open(&h);
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1];
	quiet(&h, "1@special.test", a);
	quiet(&h, "2@other.test", b);
	struct lane *la = msg_find(h.r, a)->r[0].lane, *lb = msg_find(h.r, b)->r[0].lane;
	assert_string_equal(la->name, "special");
	assert_string_equal(lb->name, "r");
	assert_ptr_equal(lane_find(h.r, "special"), la);
	assert_int_equal(la->waiting, 1);
	assert_int_equal(lb->waiting, 1);
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pick_the_oldest_due),
		cmocka_unit_test(test_exact_budget),
		cmocka_unit_test(test_fail_all),
		cmocka_unit_test(test_defer_due),
		cmocka_unit_test(test_routes_make_lanes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
