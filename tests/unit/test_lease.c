/*
 * test_lease -- the renewal of the node's leases in a shared store: one list of (name,
 * count) pairs over the host classes and the sessions rules' keys, in chunks, named by
 * policy_sessions_key(), and a key that is gone renewed once more with 0.
 *
 * A fake store records each call to slots_renew; the sessions registry is the real one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "lease.h"
#include "policy.h"
#include "sessions.h"
#include "store.h"

#define MAX_SEEN 1024

static struct {
	size_t calls;
	size_t n;
	size_t call_size[8];
	char name[MAX_SEEN][64];
	unsigned count[MAX_SEEN];
} seen;

static void fake_renew(void *ctx, const char *const *cls, const unsigned *counts, size_t n)
{
	(void)ctx;
	assert_true(seen.calls < 8);
	seen.call_size[seen.calls++] = n;
	for (size_t i = 0; i < n; i++) {
		assert_true(seen.n < MAX_SEEN);
		snprintf(seen.name[seen.n], sizeof(seen.name[0]), "%s", cls[i]);
		seen.count[seen.n++] = counts[i];
	}
}

static const struct store_ops shared_ops = { .slots_renew = fake_renew };
static const struct store_ops local_ops = { 0 };

static void reset(void)
{
	memset(&seen, 0, sizeof(seen));
}

/* The count renewed for key_hash, or -1 when it was not renewed. */
static long renewed(uint64_t key_hash)
{
	char want[POLICY_SESSIONS_KEY];
	policy_sessions_key(key_hash, want);
	for (size_t i = 0; i < seen.n; i++)
		if (strcmp(seen.name[i], want) == 0)
			return (long)seen.count[i];
	return -1;
}

static void take(uint64_t key_hash, unsigned times)
{
	unsigned count;
	for (unsigned i = 0; i < times; i++)
		assert_int_equal(sessions_take(key_hash, 100, false, &count), 1);
}

static void give(uint64_t key_hash, unsigned times)
{
	for (unsigned i = 0; i < times; i++)
		sessions_give(key_hash);
}

static void test_key_name(void **state)
{
	(void)state;
	char name[POLICY_SESSIONS_KEY];
	policy_sessions_key(0x0123456789abcdefull, name);
	assert_string_equal(name, "s:0123456789abcdef");
	policy_sessions_key(0, name);
	assert_string_equal(name, "s:0000000000000000");
}

static void test_no_shared_slots(void **state)
{
	(void)state;
	struct store s = { .type = "memory", .ops = &local_ops };
	struct lease l = { 0 };
	take(7, 1);
	reset();
	lease_renew(&l, &s);
	assert_int_equal(seen.calls, 0);
	assert_int_equal(l.nrenewed, 0);
	give(7, 1);
	lease_clear(&l);
}

static void test_nothing_held_still_calls(void **state)
{
	(void)state;
	struct store s = { .type = "redis", .ops = &shared_ops };
	struct lease l = { 0 };
	reset();
	lease_renew(&l, &s);
	/* the main loop's connection is made by this call, with nothing to renew */
	assert_int_equal(seen.calls, 1);
	assert_int_equal(seen.call_size[0], 0);
	lease_clear(&l);
}

static void test_held_then_gone(void **state)
{
	(void)state;
	struct store s = { .type = "redis", .ops = &shared_ops };
	struct lease l = { 0 };
	take(0xa1, 2);
	take(0xb2, 1);
	reset();
	lease_renew(&l, &s);
	assert_int_equal(seen.calls, 1);
	assert_int_equal(seen.n, 2);
	assert_int_equal(renewed(0xa1), 2);
	assert_int_equal(renewed(0xb2), 1);

	/* a gone: renewed once with 0, then no more */
	give(0xa1, 2);
	reset();
	lease_renew(&l, &s);
	assert_int_equal(seen.n, 2);
	assert_int_equal(renewed(0xa1), 0);
	assert_int_equal(renewed(0xb2), 1);
	reset();
	lease_renew(&l, &s);
	assert_int_equal(seen.n, 1);
	assert_int_equal(renewed(0xa1), -1);
	assert_int_equal(renewed(0xb2), 1);

	give(0xb2, 1);
	reset();
	lease_renew(&l, &s);
	assert_int_equal(seen.n, 1);
	assert_int_equal(renewed(0xb2), 0);
	reset();
	lease_renew(&l, &s);
	assert_int_equal(seen.calls, 1);
	assert_int_equal(seen.n, 0);
	lease_clear(&l);
}

static void test_chunks(void **state)
{
	(void)state;
	struct store s = { .type = "redis", .ops = &shared_ops };
	struct lease l = { 0 };
	for (uint64_t k = 1; k <= 300; k++)
		take(k << 20, 1);
	reset();
	lease_renew(&l, &s);
	assert_int_equal(seen.calls, 2);
	assert_int_equal(seen.call_size[0], 256);
	assert_int_equal(seen.call_size[1], 44);
	for (uint64_t k = 1; k <= 300; k++)
		assert_int_equal(renewed(k << 20), 1);
	for (uint64_t k = 1; k <= 300; k++)
		give(k << 20, 1);
	lease_clear(&l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_name),
		cmocka_unit_test(test_no_shared_slots),
		cmocka_unit_test(test_nothing_held_still_calls),
		cmocka_unit_test(test_held_then_gone),
		cmocka_unit_test(test_chunks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
