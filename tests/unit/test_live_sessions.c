/*
 * test_live_sessions -- the SMTP sessions the milter and the policy service serve (src/engine/
 * live_sessions.c): keys from the MTAs' address forms, the two sides meeting in either
 * order and counted once per session, a fixed size that refuses instead of growing, and
 * several threads at once.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "live_sessions.h"

static struct live_session_key key(const char *addr, unsigned port)
{
	struct live_session_key k;
	assert_int_equal(live_sessions_key(str_cstr(addr), port, &k), 0);
	return k;
}

#define M LIVE_MILTER
#define P LIVE_POLICY

static void test_keys(void **state)
{
	(void)state;
	struct live_session_key k;
	/* what no session can be told by */
	assert_int_equal(live_sessions_key(str_cstr("192.0.2.1"), 0, &k), -EINVAL);
	assert_int_equal(live_sessions_key(str_cstr("192.0.2.1"), 65536, &k), -EINVAL);
	assert_int_equal(live_sessions_key(str_cstr("/var/run/socket"), 25, &k), -EINVAL);
	assert_int_equal(live_sessions_key(str_cstr(""), 25, &k), -EINVAL);
	/* one client, however the MTA writes it */
	struct live_session_key a = key("192.0.2.1", 40001);
	struct live_session_key b = key("::ffff:192.0.2.1", 40001);
	struct live_session_key c = key("[192.0.2.1]", 40001);
	assert_int_equal(live_sessions_enter(&a, M), 0);
	assert_true(live_sessions_has(&b, M));
	assert_true(live_sessions_has(&c, M));
	assert_false(live_sessions_has(&c, P));
	struct live_session_key v6 = key("IPv6:2001:db8::1", 40001);
	struct live_session_key v6b = key("2001:db8::1", 40001);
	assert_false(live_sessions_has(&v6, M));
	assert_int_equal(live_sessions_enter(&v6, M), 0);
	assert_true(live_sessions_has(&v6b, M));
	/* another port is another session */
	struct live_session_key other = key("192.0.2.1", 40002);
	assert_false(live_sessions_has(&other, M));
	assert_int_equal(live_sessions_count(M), 2);
	live_sessions_leave(&c, M);
	live_sessions_leave(&v6b, M);
	assert_false(live_sessions_has(&a, M));
	assert_int_equal(live_sessions_count(M), 0);
	/* leaving what is not there changes nothing */
	live_sessions_leave(&a, M);
	live_sessions_leave(&a, P);
	assert_int_equal(live_sessions_count(M), 0);
	assert_int_equal(live_sessions_count(P), 0);
	assert_int_equal(live_sessions_doubles(), 0);
}

static void test_doubles(void **state)
{
	(void)state;
	/* the policy service first (Postfix writes the milter's CONNECT with its RCPT) */
	struct live_session_key a = key("198.51.100.7", 2525);
	assert_int_equal(live_sessions_enter(&a, P), 0);
	assert_int_equal(live_sessions_enter(&a, M), 1);
	assert_int_equal(live_sessions_doubles(), 1);
	/* the milter first; and a session is counted once, however often both meet it */
	struct live_session_key b = key("198.51.100.7", 2526);
	assert_int_equal(live_sessions_enter(&b, M), 0);
	assert_int_equal(live_sessions_enter(&b, P), 1);
	live_sessions_leave(&b, P);
	assert_int_equal(live_sessions_enter(&b, P), 0);
	assert_int_equal(live_sessions_doubles(), 2);
	/* two MTAs serve one client endpoint at once: the key stays until both left */
	assert_int_equal(live_sessions_enter(&b, M), 0);
	live_sessions_leave(&b, M);
	assert_true(live_sessions_has(&b, M));
	live_sessions_leave(&b, M);
	assert_false(live_sessions_has(&b, M));
	assert_true(live_sessions_has(&b, P));
	live_sessions_leave(&b, P);
	live_sessions_leave(&a, P);
	live_sessions_leave(&a, M);
	/* a free entry forgets: the next session with that key is counted again */
	assert_int_equal(live_sessions_enter(&a, M), 0);
	assert_int_equal(live_sessions_enter(&a, P), 1);
	live_sessions_leave(&a, P);
	live_sessions_leave(&a, M);
	assert_int_equal(live_sessions_doubles(), 3);
	assert_int_equal(live_sessions_count(M), 0);
	assert_int_equal(live_sessions_count(P), 0);
	/* the warning is claimed once */
	assert_true(live_sessions_claim_warning());
	assert_false(live_sessions_claim_warning());
}

static void test_bounded(void **state)
{
	(void)state;
	/* more sessions than entries: the table fills its stripes and refuses the rest */
	static struct live_session_key keys[LIVE_SESSIONS_MAX + 512];
	static bool in[LIVE_SESSIONS_MAX + 512];
	unsigned entered = 0;
	for (unsigned i = 0; i < LIVE_SESSIONS_MAX + 512; i++) {
		char a[32];
		snprintf(a, sizeof(a), "10.%u.%u.1", i / 250, i % 250);
		keys[i] = key(a, 1024 + i % 50000);
		int r = live_sessions_enter(&keys[i], i % 2 ? M : P);
		assert_true(r == 0 || r == -ENOSPC);
		in[i] = r == 0;
		entered += in[i];
	}
	assert_true(entered <= LIVE_SESSIONS_MAX);
	assert_true(entered > LIVE_SESSIONS_MAX / 2); /* the hash spreads them */
	assert_int_equal(live_sessions_count(M) + live_sessions_count(P), entered);
	for (unsigned i = 0; i < LIVE_SESSIONS_MAX + 512; i++) {
		assert_int_equal(live_sessions_has(&keys[i], i % 2 ? M : P), in[i]);
		if (in[i])
			live_sessions_leave(&keys[i], i % 2 ? M : P);
	}
	assert_int_equal(live_sessions_count(M) + live_sessions_count(P), 0);
	/* room again */
	assert_int_equal(live_sessions_enter(&keys[0], M), 0);
	live_sessions_leave(&keys[0], M);
}

#define THREADS 8
#define ROUNDS 20000

static void *churn(void *arg)
{
	unsigned t = (unsigned)(uintptr_t)arg;
	char a[32];
	/* two threads per address, one per side: they meet on the same keys */
	snprintf(a, sizeof(a), "203.0.113.%u", t / 2 + 1);
	enum live_side side = t % 2 ? M : P;
	for (unsigned i = 0; i < ROUNDS; i++) {
		struct live_session_key k;
		if (live_sessions_key(str_cstr(a), 1 + i % 64, &k) < 0)
			return (void *)1;
		if (live_sessions_enter(&k, side) < 0)
			continue;
		if (!live_sessions_has(&k, side))
			return (void *)1;
		live_sessions_leave(&k, side);
	}
	return NULL;
}

static void test_threads(void **state)
{
	(void)state;
	pthread_t th[THREADS];
	for (uintptr_t i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, churn, (void *)i), 0);
	for (size_t i = 0; i < THREADS; i++) {
		void *r;
		pthread_join(th[i], &r);
		assert_null(r);
	}
	assert_int_equal(live_sessions_count(M), 0);
	assert_int_equal(live_sessions_count(P), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keys),
		cmocka_unit_test(test_doubles),
		cmocka_unit_test(test_bounded),
		cmocka_unit_test(test_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
