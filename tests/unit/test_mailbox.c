/*
 * test_mailbox -- unit tests of the cross-thread mailbox (src/lib/mailbox.c).
 *
 * A loop on the test's thread receives what several threads post at once: every item
 * arrives once, each thread's items in the order it posted them, in batches.  Then what
 * was posted before the loop was attached, items of pointer size, a shut mailbox
 * (-ESHUTDOWN, what was posted before stays to be taken), and freeing with items left.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <event2/event.h>

#include "mailbox.h"

#define THREADS 4
#define PER_THREAD 20000

struct item {
	unsigned thread;
	unsigned seq;
	char pad[24]; /* not a power of two in all: items are copied whole */
};

struct sink {
	struct event_base *base;
	unsigned next[THREADS]; /* the seq each thread's next item must have */
	size_t got, want, batches;
};

static void on_items(void *items, size_t n, void *arg)
{
	struct sink *k = arg;
	struct item *it = items;
	assert_true(n >= 1);
	k->batches++;
	for (size_t i = 0; i < n; i++) {
		assert_true(it[i].thread < THREADS);
		assert_int_equal(it[i].seq, k->next[it[i].thread]);
		k->next[it[i].thread]++;
	}
	k->got += n;
	if (k->got == k->want)
		event_base_loopbreak(k->base);
}

static void on_too_long(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopbreak(arg);
	fail_msg("the items did not all arrive");
}

struct poster {
	struct mailbox *mb;
	unsigned thread;
};

static void *post_many(void *arg)
{
	struct poster *p = arg;
	for (unsigned i = 0; i < PER_THREAD; i++) {
		struct item it = { .thread = p->thread, .seq = i };
		assert_int_equal(mailbox_post(p->mb, &it), 0);
	}
	return NULL;
}

static struct event *deadline(struct event_base *base)
{
	struct event *t = evtimer_new(base, on_too_long, base);
	struct timeval tv = { 20, 0 };
	evtimer_add(t, &tv);
	return t;
}

static void test_threads(void **state)
{
	(void)state;
	struct event_base *base = event_base_new();
	struct mailbox mb;
	struct sink k = { .base = base, .want = THREADS * PER_THREAD };
	mailbox_init(&mb, sizeof(struct item));
	assert_int_equal(mailbox_attach(&mb, base, on_items, &k), 0);
	struct event *t = deadline(base);
	pthread_t th[THREADS];
	struct poster p[THREADS];
	for (unsigned i = 0; i < THREADS; i++) {
		p[i] = (struct poster){ &mb, i };
		assert_int_equal(pthread_create(&th[i], NULL, post_many, &p[i]), 0);
	}
	event_base_dispatch(base);
	for (unsigned i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(k.got, k.want);
	for (unsigned i = 0; i < THREADS; i++)
		assert_int_equal(k.next[i], PER_THREAD);
	assert_true(k.batches >= 1 && k.batches <= k.want); /* never more batches than items */
	size_t n;
	assert_null(mailbox_take(&mb, &n));
	assert_int_equal(n, 0);
	event_free(t);
	mailbox_done(&mb);
	event_base_free(base);
}

static void test_posted_before_attach(void **state)
{
	(void)state;
	struct event_base *base = event_base_new();
	struct mailbox mb;
	struct sink k = { .base = base, .want = 3 };
	mailbox_init(&mb, sizeof(struct item));
	for (unsigned i = 0; i < 3; i++)
		assert_int_equal(mailbox_post(&mb, &(struct item){ .thread = 0, .seq = i }), 0);
	assert_int_equal(mailbox_attach(&mb, base, on_items, &k), 0);
	struct event *t = deadline(base);
	event_base_dispatch(base);
	assert_int_equal(k.got, 3);
	assert_int_equal(k.batches, 1);
	event_free(t);
	mailbox_done(&mb);
	event_base_free(base);
}

static void on_pointers(void *items, size_t n, void *arg)
{
	int **p = items;
	struct event_base *base = arg;
	for (size_t i = 0; i < n; i++)
		(*p[i])++;
	event_base_loopbreak(base);
}

static void test_pointers(void **state)
{
	(void)state;
	struct event_base *base = event_base_new();
	struct mailbox mb;
	int a = 0, b = 10;
	int *pa = &a, *pb = &b;
	mailbox_init(&mb, sizeof(int *));
	assert_int_equal(mailbox_attach(&mb, base, on_pointers, base), 0);
	assert_int_equal(mailbox_post(&mb, &pa), 0);
	assert_int_equal(mailbox_post(&mb, &pb), 0);
	struct event *t = deadline(base);
	event_base_dispatch(base);
	assert_int_equal(a, 1);
	assert_int_equal(b, 11);
	event_free(t);
	mailbox_done(&mb);
	event_base_free(base);
}

static void test_shut_and_take(void **state)
{
	(void)state;
	struct mailbox mb;
	mailbox_init(&mb, sizeof(struct item));
	for (unsigned i = 0; i < 100; i++)
		assert_int_equal(mailbox_post(&mb, &(struct item){ .seq = i }), 0);
	mailbox_shut(&mb);
	assert_int_equal(mailbox_post(&mb, &(struct item){ .seq = 100 }), -ESHUTDOWN);
	size_t n;
	struct item *it = mailbox_take(&mb, &n);
	assert_int_equal(n, 100);
	for (unsigned i = 0; i < 100; i++)
		assert_int_equal(it[i].seq, i);
	free(it);
	assert_int_equal(mailbox_post(&mb, &(struct item){ .seq = 101 }), -ESHUTDOWN);
	mailbox_done(&mb);
}

static void test_done_with_items(void **state)
{
	(void)state;
	struct event_base *base = event_base_new();
	struct mailbox mb;
	struct sink k = { .base = base };
	mailbox_init(&mb, sizeof(struct item));
	assert_int_equal(mailbox_attach(&mb, base, on_items, &k), 0);
	assert_int_equal(mailbox_post(&mb, &(struct item){ .seq = 0 }), 0);
	mailbox_done(&mb); /* frees what is left (the sanitizers check) */
	assert_int_equal(mb.fd, -1);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_posted_before_attach),
		cmocka_unit_test(test_pointers),
		cmocka_unit_test(test_shut_and_take),
		cmocka_unit_test(test_done_with_items),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
