/*
 * test_ebr -- lib/ebr's contract, then a stress against it.
 *
 * The contract: an object retired while a reader is inside a section is not freed until
 * that reader leaves; readers that entered after the retire, threads that never read,
 * and threads that ended do not hold anything; sections nest; readers past EBR_SLOTS
 * (the overflow counter) are waited for too.  The stress: readers read every byte of the
 * current object while a writer swaps and retires as fast as it can; a use after free is
 * caught by ASan in the sanitizer build, and by the poisoned bytes in the other.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ebr.h"

static _Atomic int freed;

static void count_free(void *p)
{
	(void)p;
	freed++;
}

/* ---- a thread that sits inside a read section until told to leave ------------------- */

enum { H_START = 0, H_INSIDE, H_LEAVE, H_DONE };

struct holder {
	pthread_t th;
	_Atomic int state;
	bool read; /* false: never enters (an unregistered thread) */
};

static void *holder_main(void *arg)
{
	struct holder *h = arg;
	if (h->read)
		ebr_enter();
	h->state = H_INSIDE;
	while (h->state != H_LEAVE)
		sched_yield();
	if (h->read)
		ebr_exit();
	h->state = H_DONE;
	return NULL;
}

static void holder_start(struct holder *h, bool read)
{
	h->state = H_START;
	h->read = read;
	assert_int_equal(pthread_create(&h->th, NULL, holder_main, h), 0);
	while (h->state != H_INSIDE)
		sched_yield();
}

static void holder_release(struct holder *h)
{
	h->state = H_LEAVE;
	assert_int_equal(pthread_join(h->th, NULL), 0);
}

/* retire and collect from a thread of their own: the writer is not the reader */
static void *retire_main(void *arg)
{
	ebr_retire(arg, count_free);
	return (void *)(uintptr_t)ebr_collect();
}

static size_t retire_on_thread(void *obj)
{
	pthread_t th;
	void *ret;
	assert_int_equal(pthread_create(&th, NULL, retire_main, obj), 0);
	assert_int_equal(pthread_join(th, &ret), 0);
	return (size_t)(uintptr_t)ret;
}

static void *collect_main(void *arg)
{
	(void)arg;
	return (void *)(uintptr_t)ebr_collect();
}

static size_t collect_on_thread(void)
{
	pthread_t th;
	void *ret;
	assert_int_equal(pthread_create(&th, NULL, collect_main, NULL), 0);
	assert_int_equal(pthread_join(th, &ret), 0);
	return (size_t)(uintptr_t)ret;
}

/* ---- the contract ------------------------------------------------------------------- */

static void test_no_reader(void **state)
{
	(void)state;
	int a, b;
	freed = 0;
	ebr_retire(NULL, count_free); /* nothing */
	assert_int_equal(ebr_pending(), 0);
	ebr_retire(&a, count_free);
	ebr_retire(&b, count_free);
	assert_int_equal(ebr_pending(), 2);
	assert_int_equal(freed, 0); /* retire alone frees nothing */
	assert_int_equal(ebr_collect(), 2);
	assert_int_equal(freed, 2);
	assert_int_equal(ebr_pending(), 0);
	assert_int_equal(ebr_collect(), 0);
	/* a section entered and left by this thread holds nothing afterwards */
	ebr_enter();
	ebr_exit();
	ebr_retire(&a, count_free);
	assert_int_equal(ebr_collect(), 1);
}

static void test_reader_holds(void **state)
{
	(void)state;
	int x, y;
	struct holder a, b;
	freed = 0;
	holder_start(&a, true);
	ebr_retire(&x, count_free);
	assert_int_equal(ebr_collect(), 0); /* a may hold x */
	assert_int_equal(ebr_pending(), 1);
	/* b enters after x was retired: it cannot hold x, and does not keep it */
	holder_start(&b, true);
	assert_int_equal(ebr_collect(), 0);
	holder_release(&a);
	assert_int_equal(ebr_collect(), 1);
	assert_int_equal(freed, 1);
	/* but b holds what is retired while it is inside */
	ebr_retire(&y, count_free);
	assert_int_equal(collect_on_thread(), 0);
	holder_release(&b);
	assert_int_equal(collect_on_thread(), 1);
	assert_int_equal(freed, 2);
	assert_int_equal(ebr_pending(), 0);
}

static void test_nested(void **state)
{
	(void)state;
	int x;
	freed = 0;
	ebr_enter();
	ebr_enter();
	assert_int_equal(retire_on_thread(&x), 0);
	ebr_exit(); /* the inner exit: still inside */
	assert_int_equal(collect_on_thread(), 0);
	ebr_exit();
	assert_int_equal(collect_on_thread(), 1);
	assert_int_equal(freed, 1);
	/* an inner enter does not announce afresh: what was retired between the outer and
	 * the inner enter waits for the outer exit */
	ebr_enter();
	assert_int_equal(retire_on_thread(&x), 0);
	ebr_enter();
	ebr_exit();
	assert_int_equal(collect_on_thread(), 0);
	ebr_exit();
	assert_int_equal(ebr_collect(), 1);
	assert_int_equal(freed, 2);
}

static void test_unregistered_threads(void **state)
{
	(void)state;
	int x;
	struct holder h;
	freed = 0;
	unsigned used = ebr_slots_used();
	/* a thread that never reads holds nothing and takes no slot */
	holder_start(&h, false);
	assert_int_equal(ebr_slots_used(), used);
	ebr_retire(&x, count_free);
	assert_int_equal(ebr_collect(), 1);
	holder_release(&h);
	/* a reader takes a slot, and gives it back when it ends */
	holder_start(&h, true);
	assert_int_equal(ebr_slots_used(), used + 1);
	holder_release(&h);
	assert_int_equal(ebr_slots_used(), used);
}

static void test_overflow(void **state)
{
	(void)state;
	enum { N = EBR_SLOTS + 3 };
	struct holder *h = calloc(N, sizeof(*h));
	assert_non_null(h);
	int x, y;
	freed = 0;
	unsigned used = ebr_slots_used();
	for (size_t i = 0; i < N; i++)
		holder_start(&h[i], true);
	assert_int_equal(ebr_slots_used(), EBR_SLOTS); /* the last ones overflowed */
	ebr_retire(&x, count_free);
	/* let every slot holder go: the overflow readers alone still hold x */
	for (size_t i = 0; i < N; i++)
		if (i < EBR_SLOTS - used)
			holder_release(&h[i]);
	assert_int_equal(ebr_collect(), 0);
	for (size_t i = EBR_SLOTS - used; i < N; i++)
		holder_release(&h[i]);
	assert_int_equal(ebr_collect(), 1);
	assert_int_equal(ebr_slots_used(), used);
	/* slots given back are taken again */
	holder_start(&h[0], true);
	assert_int_equal(ebr_slots_used(), used + 1);
	ebr_retire(&y, count_free);
	assert_int_equal(ebr_collect(), 0);
	holder_release(&h[0]);
	assert_int_equal(ebr_collect(), 1);
	assert_int_equal(freed, 2);
	free(h);
}

static void test_shutdown(void **state)
{
	(void)state;
	int x;
	struct holder h;
	freed = 0;
	holder_start(&h, true);
	ebr_retire(&x, count_free);
	assert_int_equal(ebr_collect(), 0);
	holder_release(&h);
	/* shutdown frees what is left whether or not it could be seen */
	ebr_retire(malloc(16), free);
	assert_int_equal(ebr_shutdown(), 2);
	assert_int_equal(ebr_pending(), 0);
	assert_int_equal(freed, 1);
}

/* ---- stress: readers against a writer swapping as fast as it can -------------------- */

#define STRESS_READERS 4
#define STRESS_NS 1200000000ULL
#define BLOB_MAX 4096

struct blob {
	size_t len;
	unsigned char fill; /* every byte of bytes[]; never 0 (poisoned bytes are 0) */
	unsigned char bytes[];
};

static _Atomic(struct blob *) current;
static _Atomic bool stop;
static _Atomic unsigned long bad_reads;

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct blob *blob_new(size_t len, unsigned char fill)
{
	struct blob *b = malloc(sizeof(*b) + len);
	assert_non_null(b);
	b->len = len;
	b->fill = fill;
	memset(b->bytes, fill, len);
	return b;
}

/* poison first: without ASan, a reader of a freed blob sees bytes that are not its fill */
static void blob_free(void *p)
{
	struct blob *b = p;
	memset(b->bytes, 0, b->len);
	b->fill = 0;
	free(b);
}

static void *stress_reader(void *arg)
{
	unsigned long *reads = arg;
	while (!stop) {
		ebr_enter();
		const struct blob *b = atomic_load_explicit(&current, memory_order_acquire);
		unsigned char fill = b->fill;
		size_t len = b->len;
		for (size_t i = 0; i < len; i++)
			if (b->bytes[i] != fill || fill == 0) {
				bad_reads++;
				break;
			}
		ebr_exit();
		(*reads)++;
	}
	return NULL;
}

static void test_stress(void **state)
{
	(void)state;
	pthread_t th[STRESS_READERS];
	unsigned long reads[STRESS_READERS] = { 0 };
	unsigned long swaps = 0, collected = 0;
	stop = false;
	bad_reads = 0;
	atomic_store(&current, blob_new(64, 1));
	for (size_t i = 0; i < STRESS_READERS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, stress_reader, &reads[i]), 0);
	uint64_t x = 88172645463325252ULL; /* xorshift: sizes from 1 to BLOB_MAX */
	uint64_t end = mono_ns() + STRESS_NS;
	while (mono_ns() < end) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		struct blob *b = blob_new(1 + x % BLOB_MAX, (unsigned char)(1 + swaps % 255));
		ebr_retire(atomic_exchange(&current, b), blob_free);
		collected += ebr_collect();
		swaps++;
	}
	stop = true;
	unsigned long total = 0;
	for (size_t i = 0; i < STRESS_READERS; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		total += reads[i];
	}
	collected += ebr_collect(); /* no reader left: everything goes */
	assert_int_equal(ebr_pending(), 0);
	assert_int_equal(collected, swaps);
	blob_free(atomic_exchange(&current, NULL));
	print_message("ebr stress: %lu swaps, %lu reads by %d readers, %lu bad\n", swaps,
		      total, STRESS_READERS, (unsigned long)bad_reads);
	assert_int_equal(bad_reads, 0);
	assert_true(swaps > 0);
	for (size_t i = 0; i < STRESS_READERS; i++)
		assert_true(reads[i] > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_reader),
		cmocka_unit_test(test_reader_holds),
		cmocka_unit_test(test_nested),
		cmocka_unit_test(test_unregistered_threads),
		cmocka_unit_test(test_overflow),
		cmocka_unit_test(test_shutdown),
		cmocka_unit_test(test_stress),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
