/*
 * test_relay_bounce -- the end of a message (src/relay/relay_bounce.c, and the sweep of
 * relay.c that drives it) in the harness of relay_harness.h: a message whose lifetime
 * ended fails and is bounced, the operator's bounce now or when its transaction ends, a
 * delay notice once, and a bounce never bounced again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "relay_harness.h"

#define MS UINT64_C(1000000)

/* The sweep's timer fires (as it does every 30 s, or a quarter of the lifetime). */
static void sweep(struct harness *h)
{
	event_active(h->r->sweep, EV_TIMEOUT, 1);
	harness_run(h);
}

/* The DSNs the relay queued (from <>, made by this relay). */
static size_t dsns(struct harness *h, struct rmsg **ret)
{
	size_t n = 0;
	struct rmsg *m;
	TAILQ_FOREACH(m, &h->r->msgs, link)
		if (m->is_dsn) {
			n++;
			if (ret)
				*ret = m;
		}
	return n;
}

/* Wait for the DSN's commit (the committer's thread answers through the mailbox). */
static void wait_dsn(struct harness *h, size_t want)
{
	for (int i = 0; i < 500 && dsns(h, NULL) < want; i++) {
		harness_run(h);
		usleep(2000);
	}
	assert_int_equal(dsns(h, NULL), want);
}

/* A relay whose messages live a minute (lifetime_ms), or are late after one (delay_ms),
 * with one message from sender to the n recipients, its connection never ready. */
static void waiting_message(struct harness *h, int64_t lifetime_ms, int64_t delay_ms,
			    const char *sender, const char *const *rc, size_t n,
			    char id[QUEUE_ID_LEN + 1])
{
	harness_init(h);
	if (lifetime_ms)
		h->conf.lifetime_ms = lifetime_ms;
	h->conf.delay_warning_ms = delay_ms;
	harness_open(h);
	h->auto_ready = false;
	harness_put(h, sender, rc, n, id);
}

static void test_lifetime_ends_in_a_bounce(void **state)
{
	(void)state;
	struct harness h;
	const char *rc[] = { "a@old.test", "b@old.test" };
	char id[QUEUE_ID_LEN + 1];
	waiting_message(&h, 60 * 1000, 0, "alice@sender.test", rc, 2, id);
	sweep(&h);
	assert_non_null(msg_find(h.r, id)); /* not yet */
	h.now += 61 * 1000 * MS;
	sweep(&h);
	assert_int_equal(harness_disk_status(&h, id, 0), QUEUE_FAILED);
	assert_int_equal(harness_disk_status(&h, id, 1), QUEUE_FAILED);
	assert_true(harness_logged(&h, "rcpt=<a@old.test>", "status=bounced", "dsn=4.4.7",
				   "delivery time expired", NULL));
	struct lane *l = lane_find(h.r, "r");
	assert_int_equal(l->failed, 2);
	wait_dsn(&h, 1);
	/* the bounce is sent, and the message goes once its DSN is committed */
	assert_null(msg_find(h.r, id));
	struct rmsg *d = NULL;
	dsns(&h, &d);
	assert_string_equal(d->sender, "");
	assert_string_equal(d->addr[0], "alice@sender.test");
	harness_close(&h);
}

static void test_operator_bounce_waits_for_the_transaction(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	const char *rc[] = { "x@busy.test", "y@busy.test" };
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "bob@sender.test", rc, 2, id);
	struct smtp_out *c = harness_busy(&h);
	assert_non_null(c);
	struct rmsg *m = msg_find(h.r, id);
	bounce_by_operator(h.r, m);
	/* in a transaction: nothing changes until it ends */
	assert_true(m->bounce_asked);
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	/* the first is delivered, the second deferred: the bounce then fails the second */
	const int rcpt[] = { 250, 451 };
	harness_reply(&h, c, 250, "2.0.0", rcpt, "ok");
	assert_int_equal(harness_disk_status(&h, id, 0), QUEUE_DELIVERED);
	assert_int_equal(harness_disk_status(&h, id, 1), QUEUE_FAILED);
	assert_true(harness_logged(&h, "rcpt=<y@busy.test>", "status=bounced", "dsn=5.0.0",
				   "returned by the administrator", NULL));
	wait_dsn(&h, 1);
	assert_null(msg_find(h.r, id));
	harness_close(&h);
}

static void test_a_bounce_is_not_bounced(void **state)
{
	(void)state;
	struct harness h;
	const char *rc[] = { "a@old.test" };
	char id[QUEUE_ID_LEN + 1];
	waiting_message(&h, 60 * 1000, 0, "alice@sender.test", rc, 1, id);
	h.now += 61 * 1000 * MS;
	sweep(&h);
	wait_dsn(&h, 1);
	struct rmsg *d = NULL;
	dsns(&h, &d);
	char did[QUEUE_ID_LEN + 1];
	snprintf(did, sizeof(did), "%s", d->id);
	/* the bounce's own lifetime ends: it fails, and no bounce of it is made */
	h.now += 61 * 1000 * MS;
	sweep(&h);
	assert_null(msg_find(h.r, did));
	assert_int_equal(dsns(&h, NULL), 0);
	assert_true(harness_logged(&h, did, "bounce not sent", "null <>", NULL));
	assert_true(harness_logged(&h, did, "removed", NULL));
	harness_close(&h);
}

static void test_delay_notice_once(void **state)
{
	(void)state;
	struct harness h;
	const char *rc[] = { "slow@late.test" };
	char id[QUEUE_ID_LEN + 1];
	waiting_message(&h, 0, 60 * 1000, "carol@sender.test", rc, 1, id);
	h.now += 61 * 1000 * MS;
	sweep(&h);
	wait_dsn(&h, 1);
	struct rmsg *m = msg_find(h.r, id);
	assert_non_null(m); /* still queued: a delay is no failure */
	assert_true(m->warned);
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	h.now += 61 * 1000 * MS;
	sweep(&h);
	harness_run(&h);
	assert_int_equal(dsns(&h, NULL), 1); /* once */
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lifetime_ends_in_a_bounce),
		cmocka_unit_test(test_operator_bounce_waits_for_the_transaction),
		cmocka_unit_test(test_a_bounce_is_not_bounced),
		cmocka_unit_test(test_delay_notice_once),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
