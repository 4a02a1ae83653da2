/*
 * test_relay_msg -- the relay's message room (src/relay/relay_msg.c) in the harness
 * (relay_harness.h): the one writer of a recipient's fate against every outcome kind
 * (status byte on disk, attempts, next try, log lines, counters), the index's order by
 * arrival whatever the order of loading, the operator's flush, and the end of a message.
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

/* A message whose recipients wait (its connection never gets ready): the room is
 * driven by hand. */
static struct rmsg *quiet_message(struct harness *h, const char *const *rcpts, size_t n,
				  char id[QUEUE_ID_LEN + 1])
{
	h->auto_ready = false;
	unsigned notify[8] = { 0 };
	notify[1] = QUEUE_NOTIFY_SUCCESS | QUEUE_NOTIFY_FAILURE; /* a relayed notice possible */
	harness_put_dsn(h, "alice@sender.test", rcpts, n > 1 ? notify : NULL, n, id);
	struct rmsg *m = msg_find(h->r, id);
	assert_non_null(m);
	return m;
}

static void settle(struct harness *h, struct rmsg *m, size_t i, const struct outcome_in *in,
		   const char *text)
{
	struct outcome o;
	outcome_decide(in, &o);
	msg_rcpt_settle(h->r, m, i, m->r[i].lane, "mx.peer.test[192.0.2.1]:25", &o, text);
}

/* Every kind of outcome, each written by msg_rcpt_settle alone. */
static void test_one_writer_every_outcome(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	const char *rcpts[] = { "d@a.test", "n@a.test", "f@a.test", "r@a.test", "s@a.test",
				"u@a.test", "m@a.test" };
	char id[QUEUE_ID_LEN + 1];
	struct rmsg *m = quiet_message(&h, rcpts, 7, id);
	struct lane *l = m->r[0].lane;
	assert_non_null(l);
	assert_int_equal(m->npending, 7);
	assert_int_equal(l->waiting, 7);
	assert_int_equal(msg_open_file(h.r, m), 0);
	for (size_t i = 0; i < 7; i++)
		m->r[i].attempts = 2; /* as if tried twice */

	struct smtp_reply ok = { .code = 250, .enh_class = 2, .enh_subject = 0, .enh_detail = 0 };
	struct smtp_reply no = { .code = 550, .enh_class = 5, .enh_subject = 1, .enh_detail = 1 };
	struct smtp_reply later = { .code = 451, .enh_class = 4, .enh_subject = 3, .enh_detail = 0 };
	struct smtp_reply slow = { .code = 421, .enh_class = 4, .enh_subject = 7, .enh_detail = 0 };
	struct classify_result cok = { .verdict = CLASSIFY_OK, .for_ms = -1 };
	struct classify_result cfail = { .verdict = CLASSIFY_FAIL, .for_ms = -1 };
	struct classify_result cretry = { .verdict = CLASSIFY_RETRY, .for_ms = 120000 };
	struct classify_result csusp = { .verdict = CLASSIFY_SUSPEND, .for_ms = -1 };
	uint64_t delivered = h.r->st.delivered, failed = h.r->st.failed;
	uint64_t deferred = h.r->st.deferred, uncertain = h.r->st.uncertain;

	settle(&h, m, 0, &(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = &cok, .rep = &ok }, "250 ok");
	settle(&h, m, 1, &(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = &cok, .rep = &ok,
					       .relayed = true }, "250 ok");
	settle(&h, m, 2, &(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = &cfail, .rep = &no },
	       "550 5.1.1 no such user");
	settle(&h, m, 3, &(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = &cretry, .rep = &later },
	       "451 4.3.0 later");
	settle(&h, m, 4, &(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = &csusp, .rep = &slow },
	       "421 4.7.0 slow down");
	settle(&h, m, 5, &(struct outcome_in){ .ev = OUTCOME_UNCERTAIN }, "dot: connection reset");
	settle(&h, m, 6, &(struct outcome_in){ .ev = OUTCOME_NOT_TRIED }, NULL);
	flush_post(h.r, m);

	/* in memory */
	const char want[] = { QUEUE_DELIVERED, QUEUE_RELAYED, QUEUE_FAILED, QUEUE_TODO,
			      QUEUE_TODO, QUEUE_UNCERTAIN, QUEUE_TODO };
	for (size_t i = 0; i < 7; i++)
		assert_int_equal(m->r[i].status, want[i]);
	assert_int_equal(m->npending, 4);   /* r, s, u and m are still to do */
	assert_int_equal(l->waiting, 4);
	/* on disk, as written in place */
	for (size_t i = 0; i < 7; i++)
		assert_int_equal(harness_disk_status(&h, id, i), want[i]);
	/* attempts: unchanged, but the lane's throttling does not count */
	assert_int_equal(m->r[0].attempts, 2);
	assert_int_equal(m->r[3].attempts, 2);
	assert_int_equal(m->r[4].attempts, 1);
	assert_int_equal(m->r[6].attempts, 2);
	/* next try: the server's wait for the retry, the backoff for the uncertain one, at
	 * once for the throttled and the untried */
	assert_true(m->r[3].next_try >= h.now + 108000 * MS && m->r[3].next_try <= h.now + 132000 * MS);
	uint64_t min = (uint64_t)h.conf.retry_min_ms * MS;
	assert_true(m->r[5].next_try >= h.now + min && m->r[5].next_try <= h.now + 2 * 2 * min);
	assert_int_equal(m->r[4].next_try, 0);
	assert_int_equal(m->r[6].next_try, 0);
	/* counters: the relay's and the lane's */
	assert_int_equal(h.r->st.delivered - delivered, 2);
	assert_int_equal(h.r->st.failed - failed, 1);
	assert_int_equal(h.r->st.deferred - deferred, 2); /* the retry, and the uncertain */
	assert_int_equal(h.r->st.uncertain - uncertain, 1);
	assert_int_equal(l->delivered, 2);
	assert_int_equal(l->failed, 1);
	assert_int_equal(l->deferred, 2);
	/* the administrator's lines */
	assert_true(harness_logged(&h, "delivery", "rcpt=<d@a.test>", "status=sent", "dsn=2.0.0", NULL));
	assert_true(harness_logged(&h, "rcpt=<f@a.test>", "status=bounced", "dsn=5.1.1", NULL));
	assert_true(harness_logged(&h, "rcpt=<r@a.test>", "status=deferred", "dsn=4.3.0", NULL));
	assert_true(harness_logged(&h, "rcpt=<s@a.test>", "status=suspended", "throttling", NULL));
	assert_true(harness_logged(&h, "rcpt=<u@a.test>", "status=uncertain", "dsn=4.4.2", NULL));
	assert_false(harness_logged(&h, "rcpt=<m@a.test>", NULL));
	/* the message's attempt log (`sluice queue`) */
	char log[8192];
	harness_attempts(&h, id, log, sizeof(log));
	assert_non_null(strstr(log, "rcpt=0 status=sent"));
	assert_non_null(strstr(log, "rcpt=1 status=relayed"));
	assert_non_null(strstr(log, "rcpt=2 status=failed"));
	assert_non_null(strstr(log, "dsn=5.1.1 reply=550 5.1.1 no such user"));
	assert_non_null(strstr(log, "rcpt=3 status=deferred"));
	assert_null(strstr(log, "rcpt=4 "));  /* throttling is the lane's, not an attempt */
	assert_non_null(strstr(log, "rcpt=5 status=uncertain"));
	assert_null(strstr(log, "rcpt=6 "));
	msg_close_file(h.r, m);
	harness_close(&h);
}

/* The index is in arrival order whatever order messages are loaded in (msg_insert). */
static void test_index_in_arrival_order(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	h.auto_ready = false;
	const char *rc[] = { "x@b.test" };
	char ids[5][QUEUE_ID_LEN + 1];
	for (int i = 0; i < 5; i++)
		harness_put(&h, "s@sender.test", rc, 1, ids[i]);
	/* forget them all, and load them again in another order */
	for (int i = 0; i < 5; i++)
		msg_free(h.r, msg_find(h.r, ids[i]));
	assert_true(TAILQ_EMPTY(&h.r->msgs));
	const int order[] = { 3, 0, 4, 2, 1 };
	for (int k = 0; k < 5; k++) {
		struct rmsg *m = NULL;
		assert_int_equal(msg_load(h.r, ids[order[k]], &m), 1);
		assert_non_null(m);
		assert_int_equal(msg_load(h.r, ids[order[k]], &m), 0); /* once */
	}
	int k = 0;
	struct rmsg *m, *prev = NULL;
	TAILQ_FOREACH(m, &h.r->msgs, link) {
		assert_string_equal(m->id, ids[k]);
		if (prev)
			assert_true(prev->arrival_us < m->arrival_us ||
				    (prev->arrival_us == m->arrival_us && prev->seq < m->seq));
		prev = m;
		k++;
	}
	assert_int_equal(k, 5);
	harness_close(&h);
}

/* The operator's flush makes every recipient due at once, and nothing else. */
static void test_flush_now(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	const char *rcpts[] = { "a@c.test", "b@c.test" };
	char id[QUEUE_ID_LEN + 1];
	struct rmsg *m = quiet_message(&h, rcpts, 2, id);
	m->r[0].next_try = h.now + 3600 * 1000 * MS;
	m->r[0].attempts = 3;
	m->r[1].next_try = h.now + 60 * 1000 * MS;
	msg_flush_now(h.r, m);
	assert_int_equal(m->r[0].next_try, 0);
	assert_int_equal(m->r[1].next_try, 0);
	assert_int_equal(m->r[0].attempts, 3);
	assert_int_equal(m->r[0].status, QUEUE_TODO);
	harness_close(&h);
}

/* A message whose every recipient is done is removed once its statuses are on disk;
 * one with a failure reports its bounce due. */
static void test_end_of_a_message(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	const char *rc[] = { "a@d.test" };
	char id1[QUEUE_ID_LEN + 1], id2[QUEUE_ID_LEN + 1];
	struct rmsg *m1 = quiet_message(&h, rc, 1, id1);
	struct rmsg *m2 = quiet_message(&h, rc, 1, id2);
	struct outcome sent, failed;
	struct classify_result cok = { .verdict = CLASSIFY_OK, .for_ms = -1 };
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_REPLY, .cr = &cok }, &sent);
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_FAIL, .dsn = "5.1.2" }, &failed);

	assert_int_equal(msg_open_file(h.r, m1), 0);
	msg_rcpt_settle(h.r, m1, 0, m1->r[0].lane, "", &sent, "250 ok");
	msg_close_file(h.r, m1);
	assert_false(msg_check_done(h.r, m1)); /* removed: no bounce */
	assert_null(msg_find(h.r, id1));
	assert_int_equal(harness_disk_status(&h, id1, 0), 0); /* its file is gone */
	assert_true(harness_logged(&h, id1, "removed: finished", NULL));

	assert_int_equal(msg_open_file(h.r, m2), 0);
	msg_rcpt_settle(h.r, m2, 0, m2->r[0].lane, "", &failed, "no such domain");
	msg_close_file(h.r, m2);
	assert_true(msg_check_done(h.r, m2)); /* its bounce is due, and marked so */
	assert_int_equal(m2->bounce, 'P');
	assert_non_null(msg_find(h.r, id2));
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_writer_every_outcome),
		cmocka_unit_test(test_index_in_arrival_order),
		cmocka_unit_test(test_flush_now),
		cmocka_unit_test(test_end_of_a_message),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
