/*
 * test_relay_flush -- the flusher (src/relay/relay_flush.c), the helper thread that
 * fdatasyncs the status bytes a transaction wrote, in the harness of relay_harness.h: a
 * finished message is removed only once its statuses are on disk, never on trust.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "relay_harness.h"

static void test_removed_once_flushed(void **state)
{
	(void)state;
	struct harness h;
	harness_init(&h);
	harness_open(&h);
	struct relay *r = h.r;
	const char *rc = "a@flush.test";
	char id[QUEUE_ID_LEN + 1];
	harness_put(&h, "s@sender.test", &rc, 1, id);
	struct smtp_out *c = harness_busy(&h);
	assert_non_null(c);
	/* a flusher that has not begun yet: the statuses handed to it wait */
	r->flusher_started = true;
	harness_reply(&h, c, 250, "2.0.0", NULL, "ok");
	struct rmsg *m = msg_find(r, id);
	assert_non_null(m); /* delivered, but not yet known to be on disk */
	assert_int_equal(m->flushing, 1);
	assert_int_equal(harness_disk_status(&h, id, 0), QUEUE_DELIVERED);
	harness_run(&h);
	assert_non_null(msg_find(r, id)); /* however long the disk takes */
	assert_int_equal(pthread_create(&r->flusher, NULL, flush_main, r), 0);
	for (int i = 0; i < 500 && msg_find(r, id); i++) {
		harness_run(&h);
		usleep(2000);
	}
	assert_null(msg_find(r, id));
	assert_int_equal(harness_disk_status(&h, id, 0), 0); /* its file is gone */
	harness_close(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_removed_once_flushed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
