/*
 * test_relay_tx -- one transaction (src/relay/relay_tx.c) against the scripted peer of
 * relay_harness.h: what it takes, and what each recipient becomes from the server's
 * replies -- delivered, refused, deferred, too many recipients for one transaction, the
 * lane's throttling, and the connection lost after the final dot.
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

static struct harness h;

static int setup(void **state)
{
	(void)state;
	harness_init(&h);
	harness_open(&h);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	harness_close(&h);
	return 0;
}

/* A message of n recipients queued: its transaction is with the peer. */
static struct smtp_out *send_one(const char *const *rcpts, size_t n, char id[QUEUE_ID_LEN + 1])
{
	harness_put(&h, "alice@sender.test", rcpts, n, id);
	struct smtp_out *c = harness_busy(&h);
	assert_non_null(c);
	assert_int_equal(c->msg->nrcpt, n);
	return c;
}

static void test_delivered(void **state)
{
	(void)state;
	const char *rc[] = { "a@x.test", "b@x.test" };
	char id[QUEUE_ID_LEN + 1];
	struct smtp_out *c = send_one(rc, 2, id);
	assert_string_equal(c->msg->sender.ptr, "alice@sender.test");
	assert_string_equal(c->msg->rcpt[1].ptr, "b@x.test");
	struct rmsg *m = msg_find(h.r, id);
	assert_true(m->r[0].busy && m->r[1].busy);
	assert_int_equal(m->r[0].attempts, 1);
	harness_reply(&h, c, 250, "2.0.0", NULL, "queued as 1234");
	/* both delivered: the message is finished and removed */
	assert_null(msg_find(h.r, id));
	assert_true(harness_logged(&h, "rcpt=<a@x.test>", "status=sent", "queued as 1234", NULL));
	assert_true(harness_logged(&h, "rcpt=<b@x.test>", "status=sent", NULL));
	assert_true(harness_logged(&h, id, "removed: finished", NULL));
	assert_int_equal(h.r->st.transactions, 1);
	/* the connection is kept for the next message */
	assert_non_null(h.conns);
	assert_true(smtp_out_usable(h.conns));
}

static void test_each_recipient_its_own_fate(void **state)
{
	(void)state;
	const char *rc[] = { "ok@x.test", "gone@x.test", "later@x.test" };
	char id[QUEUE_ID_LEN + 1];
	struct smtp_out *c = send_one(rc, 3, id);
	const int rcpt[] = { 250, 550, 451 };
	harness_reply(&h, c, 250, "2.0.0", rcpt, "ok");
	struct rmsg *m = msg_find(h.r, id);
	assert_non_null(m); /* the deferred one waits */
	assert_int_equal(harness_disk_status(&h, id, 0), QUEUE_DELIVERED);
	assert_int_equal(harness_disk_status(&h, id, 1), QUEUE_FAILED);
	assert_int_equal(harness_disk_status(&h, id, 2), QUEUE_TODO);
	assert_false(m->r[2].busy);
	assert_true(m->r[2].next_try > h.now);
	assert_int_equal(m->r[2].attempts, 1);
	assert_true(harness_logged(&h, "rcpt=<gone@x.test>", "status=bounced", "dsn=5.1.1", NULL));
	assert_true(harness_logged(&h, "rcpt=<later@x.test>", "status=deferred", NULL));
	/* the failure's bounce waits for the message's end (the deferred recipient) */
	assert_int_equal(m->bounce, '-');
}

static void test_too_many_recipients_go_in_the_next_transaction(void **state)
{
	(void)state;
	const char *rc[] = { "one@y.test", "two@y.test" };
	char id[QUEUE_ID_LEN + 1];
	struct smtp_out *c = send_one(rc, 2, id);
	const int rcpt[] = { 250, 452 };
	harness_reply(&h, c, 250, "2.0.0", rcpt, "ok");
	/* at once, not after a backoff: the next transaction carries the second */
	struct smtp_out *c2 = harness_busy(&h);
	assert_non_null(c2);
	assert_int_equal(c2->msg->nrcpt, 1);
	assert_string_equal(c2->msg->rcpt[0].ptr, "two@y.test");
	struct rmsg *m = msg_find(h.r, id);
	assert_int_equal(m->r[1].attempts, 1); /* the refused attempt did not count */
	harness_reply(&h, c2, 250, "2.0.0", NULL, "ok");
	assert_null(msg_find(h.r, id));
}

static void test_throttling_suspends_the_lane_and_keeps_the_mail(void **state)
{
	(void)state;
	const char *rc[] = { "a@z.test", "b@z.test" };
	char id[QUEUE_ID_LEN + 1];
	struct smtp_out *c = send_one(rc, 2, id);
	struct rmsg *m = msg_find(h.r, id);
	struct lane *l = m->r[0].lane;
	/* refused at MAIL FROM with a rate-limit reply (built-in signal: suspend) */
	struct smtp_out_result res = { .stage = SMTP_STAGE_MAIL, .why = "", .tls_version = "",
				       .auth_mech = "" };
	res.reply = (struct smtp_reply){ .code = 421, .enh_class = 4, .enh_subject = 7,
					 .enh_detail = 0, .lines = 1 };
	snprintf(res.reply.text, sizeof(res.reply.text), "Too many messages, slow down");
	harness_result(&h, c, &res);
	assert_true(lane_budget_suspended(&l->b, h.now));
	for (int i = 0; i < 2; i++) {
		assert_int_equal(m->r[i].status, QUEUE_TODO);
		assert_int_equal(harness_disk_status(&h, id, (size_t)i), QUEUE_TODO);
		assert_int_equal(m->r[i].attempts, 0); /* law 5: not the recipients' failure */
		assert_int_equal(m->r[i].next_try, 0);
	}
	assert_int_equal(h.r->st.failed, 0);
	assert_null(harness_busy(&h)); /* nothing is sent while suspended */
	assert_true(harness_logged(&h, "lane=r", "suspended", NULL));
	/* past the suspension the lane sends again */
	harness_advance(&h, (uint64_t)h.conf.suspend_max_ms + 1000);
	assert_non_null(harness_busy(&h));
}

static void test_lost_after_the_dot_is_uncertain(void **state)
{
	(void)state;
	const char *rc[] = { "u@w.test" };
	char id[QUEUE_ID_LEN + 1];
	struct smtp_out *c = send_one(rc, 1, id);
	struct smtp_reply r250 = { .code = 250, .lines = 1 };
	struct smtp_out_result res = { .stage = SMTP_STAGE_DOT, .error = -ECONNRESET,
				       .why = "connection reset", .rcpt = &r250, .tls_version = "",
				       .auth_mech = "" };
	harness_result(&h, c, &res);
	struct rmsg *m = msg_find(h.r, id);
	assert_non_null(m);
	assert_int_equal(harness_disk_status(&h, id, 0), QUEUE_UNCERTAIN);
	assert_true(m->r[0].next_try > h.now);
	assert_int_equal(h.r->st.uncertain, 1);
	assert_true(harness_logged(&h, "rcpt=<u@w.test>", "status=uncertain", "dsn=4.4.2", NULL));
	/* the connection that broke is not kept */
	assert_null(h.conns);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_delivered, setup, teardown),
		cmocka_unit_test_setup_teardown(test_each_recipient_its_own_fate, setup, teardown),
		cmocka_unit_test_setup_teardown(test_too_many_recipients_go_in_the_next_transaction,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_throttling_suspends_the_lane_and_keeps_the_mail,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_lost_after_the_dot_is_uncertain, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
