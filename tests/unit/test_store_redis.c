/*
 * test_store_redis -- the Redis store's own logic, without a Redis: the configuration it
 * refuses, and what on_failure answers (a thread with no event loop has no connection,
 * so every decision there is answered as while Redis is away) -- and that lanes, which
 * have no on_failure, are refused then.  Decisions through a real
 * redis-server are in tests/func/test_redis.py, lanes in test_store_slide.c; the scripts in
 * test_redis_scripts.py.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "store.h"
#include "store_redis_int.h"
#include "util.h"

#define SEC 1000000000ULL

static struct store *make(const char *server, enum store_failure f, unsigned nodes,
			  char *err, size_t errlen)
{
	struct store_redis_conf c = { .server = server, .on_failure = f, .nodes = nodes,
				      .timeout_ms = 50, .local_max_keys = 1000 };
	return store_redis_new(&c, err, errlen);
}

static void test_bad_addresses(void **state)
{
	(void)state;
	static const struct {
		const char *server, *why;
	} cases[] = {
		{ "127.0.0.1:0", "bad port" },
		{ "127.0.0.1:65536", "bad port" },
		{ "127.0.0.1:x", "bad port" },
		{ "[::1", "expected [v6]:port" },
		{ "[::1]x", "expected [v6]:port" },
		{ "::1:6379", "expected host:port" },
		{ ":6379", "expected host:port" },
		{ "unix:", "bad socket path" },
		{ "no-such-host.invalid:6379", "cannot resolve" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		char err[256] = "";
		struct store *s = make(cases[i].server, STORE_FAIL_LOCAL, 1, err, sizeof(err));
		if (s || !strstr(err, cases[i].why))
			fail_msg("%s: %s", cases[i].server, s ? "accepted" : err);
	}
	static const char *const good[] = { "127.0.0.1:6379", "[::1]:6379", "localhost",
					    "unix:/run/redis.sock", "/run/redis.sock" };
	for (size_t i = 0; i < ARRAY_SIZE(good); i++) {
		char err[256] = "";
		struct store *s = make(good[i], STORE_FAIL_LOCAL, 1, err, sizeof(err));
		if (!s)
			fail_msg("%s: %s", good[i], err);
		assert_true(store_is_shared(s));
		assert_string_equal(s->type, "redis");
		store_free(s);
	}
	struct store_redis_conf c = { .sentinels = (const char *const[]){ "127.0.0.1:26379" },
				      .nsentinels = 1 };
	char err[256] = "";
	assert_null(store_redis_new(&c, err, sizeof(err)));
	assert_non_null(strstr(err, "master_name"));
}

static struct store_item item(struct store *s, const char *key, const struct rate_limits *l)
{
	struct store_item it = { .rule = str_cstr("r"), .key = str_cstr(key), .limits = l,
				 .cost = 1, .flags = STORE_BLOCKING };
	it.key_hash = store_key_hash(s, it.rule, it.key);
	return it;
}

/* Decide one item through store_decide_start(): with no loop it must answer at once. */
static int decide_now(struct store *s, struct store_item *it)
{
	struct store_call c = { .items = it, .n = 1, .mode = STORE_CHECK, .now = realtime_ns() };
	int rc = store_decide_start(s, &c);
	assert_int_not_equal(rc, STORE_PENDING);
	return rc;
}

static void test_on_failure_local_share(void **state)
{
	(void)state;
	char err[256];
	/* 10/1m over 3 nodes: each node 3 (rounded down), burst 3 */
	struct store *s = make("127.0.0.1:6379", STORE_FAIL_LOCAL, 3, err, sizeof(err));
	assert_non_null(s);
	struct rate_limits l = { 1, { { .count = 10, .period_ns = 60 * SEC, .burst = 10 } } };
	int ok = 0;
	for (int i = 0; i < 10; i++) {
		struct store_item it = item(s, "k", &l);
		ok += decide_now(s, &it) == 1;
		if (i >= 3)
			assert_true(!it.ok && it.retry_ns > 0);
		/* the caller's limits are given back as they were */
		assert_ptr_equal(it.limits, &l);
	}
	assert_int_equal(ok, 3);
	assert_true(l.w[0].count == 10 && l.w[0].burst == 10);
	/* a share never goes below 1 */
	struct rate_limits one = { 1, { { .count = 1, .period_ns = 60 * SEC, .burst = 1 } } };
	struct store_item it = item(s, "k2", &one);
	assert_int_equal(decide_now(s, &it), 1);
	it = item(s, "k2", &one);
	assert_int_equal(decide_now(s, &it), 0);
	struct store_stats st;
	s->ops->stats(s->ctx, &st);
	assert_true(st.shared && !st.up);
	assert_true(st.fallbacks == 12 && st.decisions == 12);
	assert_non_null(strstr(st.state, "not connected yet"));
	/* slots: this node's share of inbound = 4 over 3 nodes is 1 */
	struct store_slot_call sc = { .cls = "c", .cap = 4, .local_used = 1 };
	assert_int_equal(store_slot_enter(s, &sc), 1);
	sc.local_used = 2;
	assert_int_equal(store_slot_enter(s, &sc), 0);
	store_free(s);
}

static void test_on_failure_accept_and_tempfail(void **state)
{
	(void)state;
	char err[256];
	struct rate_limits l = { 1, { { .count = 1, .period_ns = 60 * SEC, .burst = 1 } } };
	struct store *s = make("127.0.0.1:6379", STORE_FAIL_ACCEPT, 2, err, sizeof(err));
	assert_non_null(s);
	for (int i = 0; i < 5; i++) {
		struct store_item it = item(s, "k", &l);
		assert_int_equal(decide_now(s, &it), 1);
		assert_true(it.ok && !it.charged);
	}
	struct store_slot_call sc = { .cls = "c", .cap = 1, .local_used = 100 };
	assert_int_equal(store_slot_enter(s, &sc), 1);
	store_free(s);
	s = make("127.0.0.1:6379", STORE_FAIL_TEMPFAIL, 2, err, sizeof(err));
	assert_non_null(s);
	struct store_item it = item(s, "k", &l);
	assert_int_equal(decide_now(s, &it), STORE_TEMPFAIL);
	assert_false(it.charged);
	sc.local_used = 1;
	sc.fallback = false;
	/* no verdict: a class takes it as full, a sessions rule as the store's tempfail */
	assert_int_equal(store_slot_enter(s, &sc), STORE_TEMPFAIL);
	assert_true(sc.fallback);
	/* a reset cannot reach Redis: nothing is claimed */
	struct store_call rc = { .items = &it, .n = 1, .mode = STORE_RESET };
	assert_int_equal(store_decide_start(s, &rc), 0);
	store_free(s);
}

static void never_done(struct store_slide_call *c, int rc, uint64_t wait_ns)
{
	(void)c;
	(void)rc;
	(void)wait_ns;
	fail_msg("a lane answered without a loop");
}

/* A lane is never answered by on_failure: while Redis cannot be asked it is not admitted,
 * whatever on_failure says for rate limits (store.h says why). */
static void test_lanes_have_no_on_failure(void **state)
{
	(void)state;
	static const enum store_failure modes[] = { STORE_FAIL_LOCAL, STORE_FAIL_ACCEPT,
						    STORE_FAIL_TEMPFAIL };
	for (size_t i = 0; i < ARRAY_SIZE(modes); i++) {
		char err[256];
		struct store *s = make("127.0.0.1:6379", modes[i], 2, err, sizeof(err));
		assert_non_null(s);
		struct store_slide_call c = { .name = "isp", .nwin = 1, .n = { 8 },
					      .window_ns = { 60 * SEC }, .take = true,
					      .done = never_done };
		assert_int_equal(store_slide_start(s, &c), -EAGAIN);
		assert_null(c.req);
		c.take = false;
		assert_int_equal(store_slide_start(s, &c), -EAGAIN);
		struct store_stats st;
		s->ops->stats(s->ctx, &st);
		assert_true(st.fallbacks == 0);
		store_free(s);
	}
}

/* Redis Cluster's key hash: CRC16/XMODEM mod 16384, as CLUSTER KEYSLOT gives. */
static void test_cluster_key_slot(void **state)
{
	(void)state;
	static const struct {
		const char *tag;
		unsigned slot;
	} cases[] = {
		{ "123456789", 0x31c3 }, /* the CRC16/XMODEM check value: 12739 */
		{ "foo", 12182 }, { "bar", 5061 }, { "", 0 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
		assert_int_equal(redis_key_slot(cases[i].tag, strlen(cases[i].tag)), cases[i].slot);
	/* every slot is below 16384 */
	char key[16];
	for (unsigned v = 0; v < 100000; v++) {
		int n = snprintf(key, sizeof(key), "k%u", v);
		assert_true(redis_key_slot(key, (size_t)n) < REDIS_SLOTS);
	}
}

static void test_cluster_redirects(void **state)
{
	(void)state;
	static const struct {
		const char *text;
		int rc;
		unsigned slot;
		const char *host;
		int port;
	} cases[] = {
		{ "MOVED 3999 127.0.0.1:6381", 0, 3999, "127.0.0.1", 6381 },
		{ "ASK 12182 [::1]:7002", 0, 12182, "::1", 7002 },
		{ "ASK 0 ::1:7002", 0, 0, "::1", 7002 },
		{ "MOVED 16383 10.0.0.5:7000", 0, 16383, "10.0.0.5", 7000 },
		{ "MOVED 16384 10.0.0.5:7000", -EPROTO, 0, NULL, 0 },
		{ "MOVED 1 10.0.0.5:0", -EPROTO, 0, NULL, 0 },
		{ "MOVED 1 10.0.0.5:65536", -EPROTO, 0, NULL, 0 },
		{ "MOVED 1 :7000", -EPROTO, 0, NULL, 0 },
		{ "MOVED x 10.0.0.5:7000", -EPROTO, 0, NULL, 0 },
		{ "MOVED 1", -EPROTO, 0, NULL, 0 },
		{ "MOVED", -EPROTO, 0, NULL, 0 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		unsigned slot = 99999;
		struct addr a = { .port = -1 };
		int rc = redis_redirect_parse(cases[i].text, &slot, &a);
		if (rc != cases[i].rc)
			fail_msg("%s: %d", cases[i].text, rc);
		if (rc < 0) {
			assert_int_equal(slot, 99999);
			assert_int_equal(a.port, -1);
			continue;
		}
		assert_int_equal(slot, cases[i].slot);
		assert_string_equal(a.host, cases[i].host);
		assert_int_equal(a.port, cases[i].port);
	}
}

static redisReply *reply_of(const char *wire)
{
	redisReader *rd = redisReaderCreate();
	void *r = NULL;
	assert_int_equal(redisReaderFeed(rd, wire, strlen(wire)), REDIS_OK);
	assert_int_equal(redisReaderGetReply(rd, &r), REDIS_OK);
	assert_non_null(r);
	redisReaderFree(rd);
	return r;
}

static void test_cluster_slots(void **state)
{
	(void)state;
	struct addr asked = { .host = "192.0.2.7", .port = 7000 };
	struct redis_slot_range r[4];
	/* three masters, one with a replica; the third announced with an empty host */
	redisReply *rep = reply_of("*3\r\n"
		"*3\r\n:0\r\n:5460\r\n*3\r\n$8\r\n10.0.0.5\r\n:7000\r\n$2\r\nid\r\n"
		"*4\r\n:5461\r\n:10922\r\n*2\r\n$8\r\n10.0.0.6\r\n:7001\r\n"
		"*2\r\n$8\r\n10.0.0.9\r\n:7004\r\n"
		"*3\r\n:10923\r\n:16383\r\n*2\r\n$0\r\n\r\n:7002\r\n");
	assert_int_equal(redis_slots_parse(rep, &asked, r, 4), 3);
	assert_int_equal(r[0].first, 0);
	assert_int_equal(r[0].last, 5460);
	assert_string_equal(r[0].master.host, "10.0.0.5");
	assert_int_equal(r[1].master.port, 7001); /* the master, not its replica */
	assert_string_equal(r[2].master.host, "192.0.2.7");
	assert_int_equal(r[2].last, 16383);
	assert_int_equal(redis_slots_parse(rep, &asked, r, 2), -EPROTO); /* over max */
	freeReplyObject(rep);
	static const char *const bad[] = {
		"*1\r\n*3\r\n:10\r\n:5\r\n*2\r\n$1\r\nh\r\n:1\r\n",       /* first > last */
		"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",     /* past the slots */
		"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:0\r\n",         /* port 0 */
		"*1\r\n*2\r\n:0\r\n:1\r\n",                                     /* no master */
		"-ERR This instance has cluster support disabled\r\n",
		":5\r\n",
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		rep = reply_of(bad[i]);
		assert_int_equal(redis_slots_parse(rep, &asked, r, 4), -EPROTO);
		freeReplyObject(rep);
	}
}

static void test_cluster_configuration(void **state)
{
	(void)state;
	const char *const seeds[] = { "127.0.0.1:1" };
	char err[512] = "";
	struct store_redis_conf c = { .seeds = seeds, .nseeds = 1, .server = "127.0.0.1:6379" };
	assert_null(store_redis_new(&c, err, sizeof(err)));
	assert_non_null(strstr(err, "neither server nor sentinels"));
	c = (struct store_redis_conf){ .seeds = seeds, .nseeds = 1, .prefix = "s{x}:" };
	assert_null(store_redis_new(&c, err, sizeof(err)));
	assert_non_null(strstr(err, "prefix"));
	/* nothing listens on port 1: the probe says so, naming the seed */
	c = (struct store_redis_conf){ .seeds = seeds, .nseeds = 1, .probe = true };
	assert_null(store_redis_new(&c, err, sizeof(err)));
	assert_non_null(strstr(err, "no cluster seed answered"));
	assert_non_null(strstr(err, "127.0.0.1:1"));
	/* without the probe (sluiced -t) the store is made; decisions then use on_failure */
	c.probe = false;
	struct store *s = store_redis_new(&c, err, sizeof(err));
	assert_non_null(s);
	store_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_addresses),
		cmocka_unit_test(test_on_failure_local_share),
		cmocka_unit_test(test_on_failure_accept_and_tempfail),
		cmocka_unit_test(test_lanes_have_no_on_failure),
		cmocka_unit_test(test_cluster_key_slot),
		cmocka_unit_test(test_cluster_redirects),
		cmocka_unit_test(test_cluster_slots),
		cmocka_unit_test(test_cluster_configuration),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
