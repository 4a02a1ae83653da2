/*
 * test_store_ov -- run-time per-key limits (store_ov.c, store.h): the table (put, del,
 * expiry, list, replace, its bound), readers that never lock while a writer changes it,
 * the memory store's snapshot with its section of run-time limits (round trip, version 1
 * files still loading, a corrupt section set aside), and the Redis value and reply
 * decoders of store_redis_ov.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>
#include <xxhash.h>

#include "ebr.h"
#include "store.h"
#include "store_redis_int.h"
#include "util.h"

#define SEC 1000000000ULL
#define T0 (1700000000ULL * SEC)

static struct rate_limits lim(uint64_t count, uint64_t period_s)
{
	struct rate_limits l = { .n = 1 };
	l.w[0] = (struct rate_window){ count, period_s * SEC, count };
	return l;
}

static struct store_ov_entry entry(const struct store *s, const char *rule, const char *key,
				   struct rate_limits l, uint64_t until)
{
	struct store_ov_entry e = { .until_ns = until, .limits = l, .rule = str_cstr(rule),
				    .key = str_cstr(key) };
	e.key_hash = store_key_hash(s, e.rule, e.key);
	return e;
}

static struct store *mem(const char *snapshot, uint64_t now)
{
	char warn[400];
	struct store_memory_conf c = { .max_keys = 0, .snapshot = snapshot };
	struct store *s = store_memory_new(&c, now, warn, sizeof(warn));
	assert_non_null(s);
	assert_non_null(s->ov);
	return s;
}

static void test_table(void **state)
{
	(void)state;
	struct store *s = mem(NULL, T0);
	struct rate_limits got;
	uint64_t until = 7;
	struct store_ov_entry a = entry(s, "r", "a.example", lim(5, 60), 0);
	struct store_ov_entry b = entry(s, "r", "b.example", lim(0, 0), T0 + 10 * SEC);
	b.limits.n = 0; /* unlimited */
	assert_int_equal(store_ov_find(s->ov, a.key_hash, T0, &got, &until), 0);
	assert_int_equal(store_ov_find(NULL, a.key_hash, T0, &got, NULL), 0);
	assert_int_equal(store_ov_put(s->ov, &a, T0), 0);
	assert_int_equal(store_ov_put(s->ov, &b, T0), 0);
	assert_int_equal(store_ov_find(s->ov, a.key_hash, T0, &got, &until), 1);
	assert_true(got.n == 1 && got.w[0].count == 5 && until == 0);
	assert_int_equal(store_ov_find(s->ov, b.key_hash, T0, &got, &until), 1);
	assert_true(got.n == 0 && until == T0 + 10 * SEC);
	assert_int_equal(store_ov_count(s->ov, T0), 2);
	/* replaced in place */
	a.limits = lim(9, 3600);
	assert_int_equal(store_ov_put(s->ov, &a, T0), 0);
	assert_int_equal(store_ov_find(s->ov, a.key_hash, T0, &got, NULL), 1);
	assert_true(got.w[0].count == 9);
	assert_int_equal(store_ov_count(s->ov, T0), 2);
	/* b expires at its until: ignored by lookups, dropped at the next change */
	assert_int_equal(store_ov_find(s->ov, b.key_hash, T0 + 10 * SEC, &got, NULL), 0);
	assert_int_equal(store_ov_count(s->ov, T0 + 10 * SEC), 1);
	struct store_ov_entry *l;
	size_t n;
	assert_int_equal(store_ov_list(s->ov, T0, &l, &n), 0);
	assert_int_equal(n, 2);
	free(l);
	assert_int_equal(store_ov_list(s->ov, T0 + 10 * SEC, &l, &n), 0);
	assert_int_equal(n, 1);
	assert_true(str_eq_cstr(l[0].rule, "r") && str_eq_cstr(l[0].key, "a.example"));
	free(l);
	assert_int_equal(store_ov_del(s->ov, b.key_hash, T0 + 10 * SEC), 0);
	assert_int_equal(store_ov_del(s->ov, a.key_hash, T0), 1);
	assert_int_equal(store_ov_del(s->ov, a.key_hash, T0), 0);
	assert_int_equal(store_ov_count(s->ov, T0), 0);
	/* bad entries */
	struct store_ov_entry bad = a;
	bad.rule = str_cstr("has space");
	assert_int_equal(store_ov_put(s->ov, &bad, T0), -EINVAL);
	bad = a;
	bad.key = STR_NULL;
	assert_int_equal(store_ov_put(s->ov, &bad, T0), -EINVAL);
	bad = a;
	bad.limits.w[0].burst = 0;
	assert_int_equal(store_ov_put(s->ov, &bad, T0), -EINVAL);
	bad = a;
	bad.limits.n = RATE_MAX_WINDOWS + 1;
	assert_int_equal(store_ov_put(s->ov, &bad, T0), -EINVAL);
	/* through the store: the memory store's table is the truth */
	struct store_ov_call c = { .e = a };
	assert_int_equal(store_ov_change(s, &c), 0);
	assert_int_equal(store_ov_find(s->ov, a.key_hash, T0, &got, NULL), 1);
	c.unset = true;
	assert_int_equal(store_ov_change(s, &c), 1);
	assert_int_equal(store_ov_change(s, &c), 0);
	store_free(s);
}

static void test_bound(void **state)
{
	(void)state;
	struct store *s = mem(NULL, T0);
	struct store_ov_entry *e = calloc(STORE_OV_MAX + 1, sizeof(*e));
	char (*keys)[16] = calloc(STORE_OV_MAX + 1, 16);
	assert_true(e && keys);
	for (size_t i = 0; i <= STORE_OV_MAX; i++) {
		snprintf(keys[i], 16, "k%zu", i);
		e[i] = entry(s, "r", keys[i], lim(i + 1, 60), 0);
	}
	assert_int_equal(store_ov_replace(s->ov, e, STORE_OV_MAX + 1, T0), -E2BIG);
	assert_int_equal(store_ov_count(s->ov, T0), 0);
	assert_int_equal(store_ov_replace(s->ov, e, STORE_OV_MAX, T0), 0);
	assert_int_equal(store_ov_count(s->ov, T0), STORE_OV_MAX);
	/* full: a new key is refused, a key already there may change */
	assert_int_equal(store_ov_put(s->ov, &e[STORE_OV_MAX], T0), -E2BIG);
	assert_int_equal(store_ov_put(s->ov, &e[7], T0), 0);
	struct rate_limits got;
	for (size_t i = 0; i < STORE_OV_MAX; i += 997) {
		assert_int_equal(store_ov_find(s->ov, e[i].key_hash, T0, &got, NULL), 1);
		assert_true(got.w[0].count == i + 1);
	}
	/* entries expired at now are not counted against the bound */
	e[0].until_ns = T0 + SEC;
	assert_int_equal(store_ov_put(s->ov, &e[0], T0), 0);
	assert_int_equal(store_ov_put(s->ov, &e[STORE_OV_MAX], T0 + SEC), 0);
	free(e);
	free(keys);
	store_free(s);
}

/* ---- readers while a writer changes the table ---- */

struct race {
	struct store *s;
	struct store_ov_entry e[64];
	char keys[64][16];
	atomic_bool stop;
	atomic_ulong found;
};

static void *reader(void *arg)
{
	struct race *r = arg;
	unsigned long found = 0;
	while (!atomic_load(&r->stop)) {
		for (size_t i = 0; i < 64; i++) {
			struct rate_limits got;
			if (store_ov_find(r->s->ov, r->e[i].key_hash, T0, &got, NULL) == 1) {
				/* never a torn or foreign entry: key i always has count i + 1 */
				assert_true(got.n == 1 && got.w[0].count == i + 1);
				found++;
				if (found % 64 == 0)
					atomic_fetch_add(&r->found, 64);
			}
		}
	}
	atomic_fetch_add(&r->found, found % 64);
	return NULL;
}

static void test_readers_while_writing(void **state)
{
	(void)state;
	static struct race r;
	r.s = mem(NULL, T0);
	for (size_t i = 0; i < 64; i++) {
		snprintf(r.keys[i], 16, "key%zu", i);
		r.e[i] = entry(r.s, "r", r.keys[i], lim(i + 1, 60), 0);
	}
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL, reader, &r), 0);
	uint64_t t0 = now_ns();
	/* at least 3000 changes, and on until the readers found entries many times (or 5 s) */
	for (int round = 0; round < 3000 || (atomic_load(&r.found) < 10000 &&
					      now_ns() - t0 < 5 * SEC); round++) {
		size_t i = (size_t)round % 64;
		if (round % 3 == 2)
			assert_true(store_ov_del(r.s->ov, r.e[i].key_hash, T0) >= 0);
		else
			assert_int_equal(store_ov_put(r.s->ov, &r.e[i], T0), 0);
		if (round % 500 == 0)
			assert_int_equal(store_ov_replace(r.s->ov, r.e, 32, T0), 0);
	}
	atomic_store(&r.stop, true);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	assert_true(atomic_load(&r.found) > 0);
	store_free(r.s);
	ebr_collect();
}

/* ---- snapshots ---- */

static char tmpdir[256];

static size_t read_file(const char *path, unsigned char *buf, size_t max)
{
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	ssize_t n = read(fd, buf, max);
	close(fd);
	assert_true(n >= 0 && (size_t)n < max);
	return (size_t)n;
}

static void write_file(const char *path, const void *p, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_true(write(fd, p, n) == (ssize_t)n);
	close(fd);
}

static void test_snapshot(void **state)
{
	(void)state;
	char path[300], aside[320], err[400], warn[400];
	snprintf(path, sizeof(path), "%s/ov.snap", tmpdir);
	snprintf(aside, sizeof(aside), "%s.corrupt", path);
	uint64_t now = realtime_ns();
	struct store *a = mem(path, now);
	struct rate_limits two = { .n = 2 };
	two.w[0] = (struct rate_window){ 100, 60 * SEC, 150 };
	two.w[1] = (struct rate_window){ 5000, 86400 * SEC, 5000 };
	struct store_ov_entry e[3] = {
		entry(a, "per-domain", "example.com", two, 0),
		entry(a, "per-domain", "bulk.example.org", lim(1, 1), now + 3600 * SEC),
		entry(a, "other", "soon.example", lim(3, 60), now + 2 * SEC),
	};
	e[1].limits.n = 0;
	for (int i = 0; i < 3; i++)
		assert_int_equal(store_ov_put(a->ov, &e[i], now), 0);
	assert_int_equal(a->ops->save(a->ctx, err, sizeof(err)), 0);
	static unsigned char img[4096];
	size_t n = read_file(path, img, sizeof(img));
	uint32_t version;
	memcpy(&version, img + 12, 4);
	assert_int_equal(version, 2);

	/* loaded again: the same table, the same seed */
	struct store *b = mem(path, now);
	assert_true(b->seed == a->seed);
	assert_int_equal(store_ov_count(b->ov, now), 3);
	struct rate_limits got;
	uint64_t until;
	assert_int_equal(store_ov_find(b->ov, e[0].key_hash, now, &got, &until), 1);
	assert_memory_equal(&got, &two, sizeof(two));
	assert_true(until == 0);
	assert_int_equal(store_ov_find(b->ov, e[1].key_hash, now, &got, &until), 1);
	assert_true(got.n == 0 && until == now + 3600 * SEC);
	store_free(b);
	/* loaded after the third expired: skipped */
	b = mem(path, now + 2 * SEC);
	assert_int_equal(store_ov_count(b->ov, now + 2 * SEC), 2);
	assert_int_equal(store_ov_find(b->ov, e[2].key_hash, now + 2 * SEC, &got, NULL), 0);
	store_free(b);

	/* every byte of the section matters: a change anywhere is refused whole, even with
	 * its checksum made right again */
	size_t records_end = 32 + 16 * (size_t)img[24];
	for (size_t off = records_end; off < n - 16; off++) {
		static unsigned char bad[4096];
		memcpy(bad, img, n);
		bad[off] ^= 0x41;
		uint64_t sum = XXH64(bad, n - 16, 0); /* little-endian host */
		memcpy(bad + n - 8, &sum, 8);
		struct store *t = mem(NULL, now);
		int rc = store_memory_load_buffer(t, bad, n, now);
		/* a flipped byte of a rule or key text that keeps it valid is caught by the key
		 * hash; a flipped until or window may still be a valid entry of another value */
		if (rc == 0) {
			assert_true(store_ov_count(t->ov, now) <= 3);
		} else {
			assert_int_equal(rc, -EINVAL);
			assert_int_equal(store_ov_count(t->ov, now), 0);
		}
		store_free(t);
	}
	/* a key hash that is not its (rule, key)'s: refused, the file set aside */
	static unsigned char bad[4096];
	memcpy(bad, img, n);
	bad[records_end + 8] ^= 1; /* the first entry's key_hash */
	uint64_t sum = XXH64(bad, n - 16, 0);
	memcpy(bad + n - 8, &sum, 8);
	write_file(path, bad, n);
	unlink(aside);
	char w2[400];
	struct store_memory_conf c = { .snapshot = path };
	struct store *t = store_memory_new(&c, now, w2, sizeof(w2));
	assert_non_null(t);
	assert_non_null(strstr(w2, "key hash does not match"));
	assert_int_equal(store_ov_count(t->ov, now), 0);
	assert_int_equal(access(aside, F_OK), 0);
	store_free(t);
	/* truncated inside the section */
	struct store *u = mem(NULL, now);
	assert_int_equal(store_memory_load_buffer(u, img, n - 20, now), -EINVAL);
	store_free(u);
	store_free(a);
	unlink(path);
	unlink(aside);
	(void)warn;
}

/* A version 1 file (no section) still loads. */
static void test_snapshot_v1(void **state)
{
	(void)state;
	uint64_t now = realtime_ns();
	unsigned char img[32 + 16 + 16];
	memcpy(img, "SLUICESNAP1\n", 12);
	uint32_t v = 1;
	memcpy(img + 12, &v, 4);
	uint64_t seed = 0x1234, count = 1, hash = 0xabcdef, tat = now + 60 * SEC, zero = 0;
	memcpy(img + 16, &seed, 8);
	memcpy(img + 24, &count, 8);
	memcpy(img + 32, &hash, 8);
	memcpy(img + 40, &tat, 8);
	memcpy(img + 48, &zero, 8);
	uint64_t sum = XXH64(img, 48, 0);
	memcpy(img + 56, &sum, 8);
	struct store *s = mem(NULL, now);
	assert_int_equal(store_memory_load_buffer(s, img, sizeof(img), now), 0);
	assert_true(s->seed == 0x1234);
	struct store_stats st;
	s->ops->stats(s->ctx, &st);
	assert_true(st.keys == 1);
	assert_int_equal(store_ov_count(s->ov, now), 0);
	store_free(s);
	/* version 3 is nobody's */
	v = 3;
	memcpy(img + 12, &v, 4);
	sum = XXH64(img, 48, 0);
	memcpy(img + 56, &sum, 8);
	s = mem(NULL, now);
	assert_int_equal(store_memory_load_buffer(s, img, sizeof(img), now), -EINVAL);
	store_free(s);
}

/* ---- the Redis value and reply ---- */

static void test_redis_value(void **state)
{
	(void)state;
	struct store *s = mem(NULL, T0);
	struct rate_limits two = { .n = 2 };
	two.w[0] = (struct rate_window){ 100, 60 * SEC, 150 };
	two.w[1] = (struct rate_window){ 5000, 86400 * SEC, 5000 };
	struct store_ov_entry e = entry(s, "per-domain", "a key with spaces", two, T0);
	char buf[2048], field[17];
	int n = redis_ov_format(&e, buf, sizeof(buf));
	assert_true(n > 0);
	assert_string_equal(buf, "1 1700000000000000000 100/60000000000/150,"
			    "5000/86400000000000/5000 per-domain a key with spaces");
	snprintf(field, sizeof(field), "%016llx", (unsigned long long)e.key_hash);
	struct store_ov_entry back;
	assert_int_equal(store_redis_ov_parse_entry(str_cstr(field), str_make(buf, (size_t)n),
						    &back), 0);
	assert_true(back.key_hash == e.key_hash && back.until_ns == e.until_ns);
	assert_memory_equal(&back.limits, &e.limits, sizeof(e.limits));
	assert_true(str_eq(back.rule, e.rule) && str_eq(back.key, e.key));
	/* unlimited */
	e.limits.n = 0;
	n = redis_ov_format(&e, buf, sizeof(buf));
	assert_string_equal(buf, "1 1700000000000000000 0 per-domain a key with spaces");
	assert_int_equal(store_redis_ov_parse_entry(str_cstr(field), str_make(buf, (size_t)n),
						    &back), 0);
	assert_true(back.limits.n == 0);
	static const char *const bad[] = {
		"", "1", "2 0 0 r k", "1 0 0 r", "1 0 0 r ", "1 x 0 r k", "1 0 1/2 r k",
		"1 0 1/2/3, r k", "1 0 0/1/1 r k", "1 0 1/1/1,1/1/1,1/1/1,1/1/1,1/1/1 r k",
		"1 99999999999999999999 0 r k", "1 0 1/1/1", "1  0 0 r k",
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		if (store_redis_ov_parse_entry(str_cstr(field), str_cstr(bad[i]), &back) != -EPROTO)
			fail_msg("accepted \"%s\"", bad[i]);
	assert_int_equal(store_redis_ov_parse_entry(str_cstr("0123"), str_cstr("1 0 0 r k"),
						    &back), -EPROTO);
	assert_int_equal(store_redis_ov_parse_entry(str_cstr("0123456789abcdeX"),
						    str_cstr("1 0 0 r k"), &back), -EPROTO);
	store_free(s);
}

static void *reply_of(const char *resp)
{
	redisReader *rd = redisReaderCreate();
	assert_int_equal(redisReaderFeed(rd, resp, strlen(resp)), REDIS_OK);
	void *r = NULL;
	assert_int_equal(redisReaderGetReply(rd, &r), REDIS_OK);
	assert_non_null(r);
	redisReaderFree(rd);
	return r;
}

static void test_redis_reply(void **state)
{
	(void)state;
	void *r = reply_of("*2\r\n$1\r\n7\r\n*4\r\n$16\r\n00000000000000ab\r\n$9\r\n1 0 0 r k\r\n"
			   "$3\r\nbad\r\n$5\r\nvalue\r\n");
	uint64_t v;
	struct store_ov_entry *e;
	size_t n, skipped;
	assert_int_equal(store_redis_ov_parse(r, &v, &e, &n, &skipped), 0);
	assert_true(v == 7 && n == 1 && skipped == 1);
	assert_true(e[0].key_hash == 0xab && str_eq_cstr(e[0].key, "k"));
	free(e);
	freeReplyObject(r);
	/* an empty hash before any change */
	r = reply_of("*2\r\n$1\r\n0\r\n*0\r\n");
	assert_int_equal(store_redis_ov_parse(r, &v, &e, &n, &skipped), 0);
	assert_true(v == 0 && n == 0);
	free(e);
	freeReplyObject(r);
	static const char *const wrong[] = {
		"+OK\r\n", "*1\r\n$1\r\n0\r\n", "*2\r\n$1\r\nx\r\n*0\r\n",
		"*2\r\n$1\r\n0\r\n*1\r\n$1\r\na\r\n", "*2\r\n$1\r\n0\r\n$1\r\na\r\n",
		"-ERR x\r\n",
	};
	for (size_t i = 0; i < ARRAY_SIZE(wrong); i++) {
		r = reply_of(wrong[i]);
		assert_int_equal(store_redis_ov_parse(r, &v, &e, &n, &skipped), -EPROTO);
		freeReplyObject(r);
	}
}

static int setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_store_ov.XXXXXX");
	assert_non_null(mkdtemp(tmpdir));
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	rmdir(tmpdir);
	ebr_shutdown();
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_bound),
		cmocka_unit_test(test_readers_while_writing),
		cmocka_unit_test(test_snapshot),
		cmocka_unit_test(test_snapshot_v1),
		cmocka_unit_test(test_redis_value),
		cmocka_unit_test(test_redis_reply),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
