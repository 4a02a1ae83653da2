/*
 * test_queue_retry -- recipients' retry state (src/queue/queue_retry.c, queue_journal.c,
 * queue.c): the record's codec, set and get, what a restart keeps, a torn or damaged
 * journal, compaction while the relay appends, records of removed messages dropped,
 * flush; and the loader announcing each message it puts in the index.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture.h"
#include "queue.h"
#include "queue_retry.h"

static char dir[64];

static int setup(void **state)
{
	(void)state;
	return fixture_dir_make(dir, sizeof(dir), "test_queue_retry");
}

static int teardown(void **state)
{
	(void)state;
	return fixture_dir_remove(dir);
}

static struct queue *open_queue(uint64_t compact_min)
{
	struct queue_conf qc = { .dir = dir, .commit_batch = 64, .retry_compact_min = compact_min };
	struct queue *q = NULL;
	char err[256];
	if (queue_open(&qc, NULL, NULL, &q, err, sizeof(err)) < 0)
		fail_msg("queue_open: %s", err);
	assert_int_equal(queue_start(q), 0);
	assert_int_equal(queue_wait_loaded(q), 0);
	return q;
}

static void on_done(void *arg, int r)
{
	assert_int_equal(r, 0);
	waiter_done(arg, r);
}

/* Queue n messages of nrcpt recipients each; their IDs into ids (in order). */
static void put(struct queue *q, size_t n, size_t nrcpt, char (*ids)[QUEUE_ID_LEN + 1])
{
	struct waiter w = WAITER_INIT;
	for (size_t k = 0; k < n; k++) {
		struct queue_envelope env = { .sender = str_cstr("s@example.net"),
					      .client = str_cstr("[127.0.0.1]"),
					      .helo = str_cstr("client.test") };
		struct queue_new *nw = NULL;
		assert_int_equal(queue_new_begin(q, &env, &nw), 0);
		memcpy(ids[k], queue_new_id(nw), QUEUE_ID_LEN + 1);
		for (size_t i = 0; i < nrcpt; i++) {
			char a[64];
			snprintf(a, sizeof(a), "user%zu@example.org", i);
			assert_int_equal(queue_new_rcpt(nw, str_cstr(a)), 0);
		}
		assert_int_equal(queue_new_body(nw, str_cstr("Subject: x\r\n\r\nbody\r\n")), 0);
		assert_int_equal(queue_new_commit(nw, on_done, &w), 0);
	}
	waiter_wait(&w, (int)n);
}

/* ---- the codec ---- */

static void test_codec(void **state)
{
	(void)state;
	static const struct {
		struct queue_retry_rec rec;
		int encode;
	} cases[] = {
		{ { QUEUE_RETRY_STATE, "0123456789ABCDEF", 0, 0, 0 }, 0 },
		{ { QUEUE_RETRY_STATE, "0123456789ABCDEF", 7, 3, 1795621433044806u }, 0 },
		{ { QUEUE_RETRY_STATE, "ZZZZZZZZZZZZZZZZ", QUEUE_MAX_RECIPIENTS - 1, UINT32_MAX,
		    UINT64_MAX }, 0 },
		{ { QUEUE_RETRY_SNAPSHOT, "", 0, 0, 42 }, 0 },
		{ { QUEUE_RETRY_STATE, "0123456789ABCDE", 0, 0, 0 }, -EINVAL },     /* short */
		{ { QUEUE_RETRY_STATE, "0123456789ABCDEU", 0, 0, 0 }, -EINVAL },    /* U */
		{ { QUEUE_RETRY_STATE, "0123456789ABCDEF", QUEUE_MAX_RECIPIENTS, 0, 0 }, -EINVAL },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		unsigned char b[QUEUE_RETRY_RECORD];
		int r = queue_retry_encode(&cases[i].rec, b);
		assert_int_equal(r, cases[i].encode);
		if (r < 0)
			continue;
		struct queue_retry_rec d;
		assert_int_equal(queue_retry_decode(b, sizeof(b), &d), 0);
		assert_int_equal(d.kind, cases[i].rec.kind);
		assert_string_equal(d.id, cases[i].rec.id);
		assert_int_equal(d.rcpt, cases[i].rec.rcpt);
		assert_int_equal(d.attempts, cases[i].rec.attempts);
		assert_true(d.next_us == cases[i].rec.next_us);
		assert_int_equal(queue_retry_decode(b, sizeof(b) - 1, &d), -EINVAL);
		/* any byte changed is refused */
		for (size_t k = 0; k < sizeof(b); k++) {
			b[k] ^= 0x20;
			assert_int_equal(queue_retry_decode(b, sizeof(b), &d), -EINVAL);
			b[k] ^= 0x20;
		}
	}
}

static int count_rec(void *arg, const struct queue_retry_rec *r, size_t off)
{
	(void)r;
	(void)off;
	(*(size_t *)arg)++;
	return 0;
}

static void test_scan(void **state)
{
	(void)state;
	/* five records; then cut, garbage and damage in several places */
	unsigned char img[5 * QUEUE_RETRY_RECORD + 64];
	for (uint32_t i = 0; i < 5; i++) {
		struct queue_retry_rec r = { QUEUE_RETRY_STATE, "0123456789ABCDEF", i, i, i };
		assert_int_equal(queue_retry_encode(&r, img + i * QUEUE_RETRY_RECORD), 0);
	}
	static const struct {
		const char *what;
		size_t cut;          /* image length */
		size_t insert_at;    /* garbage inserted here (SIZE_MAX: none) */
		size_t insert_len;
		size_t flip;         /* byte changed (SIZE_MAX: none) */
		size_t records;
	} cases[] = {
		{ "whole", 5 * QUEUE_RETRY_RECORD, SIZE_MAX, 0, SIZE_MAX, 5 },
		{ "torn last", 5 * QUEUE_RETRY_RECORD - 7, SIZE_MAX, 0, SIZE_MAX, 4 },
		{ "garbage in the middle", 5 * QUEUE_RETRY_RECORD, 2 * QUEUE_RETRY_RECORD, 13,
		  SIZE_MAX, 5 },
		{ "garbage inside a record", 5 * QUEUE_RETRY_RECORD, 2 * QUEUE_RETRY_RECORD + 20,
		  5, SIZE_MAX, 4 },
		{ "a damaged record", 5 * QUEUE_RETRY_RECORD, SIZE_MAX, 0, 3 * QUEUE_RETRY_RECORD + 30,
		  4 },
		{ "empty", 0, SIZE_MAX, 0, SIZE_MAX, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		unsigned char b[sizeof(img) + 64];
		size_t n = 0;
		for (size_t k = 0; k < cases[i].cut; k++) {
			if (k == cases[i].insert_at)
				for (size_t g = 0; g < cases[i].insert_len; g++)
					b[n++] = (unsigned char)(g * 37 + 'S');
			b[n++] = img[k];
		}
		if (cases[i].flip != SIZE_MAX)
			b[cases[i].flip + (cases[i].insert_at < cases[i].flip ? cases[i].insert_len : 0)] ^= 1;
		size_t got = 0;
		struct queue_retry_scan_stats st;
		assert_int_equal(queue_retry_scan(b, n, count_rec, &got, &st), 0);
		if (got != cases[i].records)
			fail_msg("%s: %zu records, want %zu", cases[i].what, got, cases[i].records);
		assert_int_equal(st.records, got);
	}
	/* a torn record followed by whole ones (a crash mid-write, appends after the
	 * restart): the whole ones are found */
	unsigned char b[3 * QUEUE_RETRY_RECORD];
	memcpy(b, img, 20);
	memcpy(b + 20, img, 2 * QUEUE_RETRY_RECORD);
	size_t got = 0;
	assert_int_equal(queue_retry_scan(b, 20 + 2 * QUEUE_RETRY_RECORD, count_rec, &got, NULL), 0);
	assert_int_equal(got, 2);
}

/* ---- the journal through the queue ---- */

static void check_retry(struct queue *q, const char *id, size_t i, uint64_t next,
			uint32_t attempts)
{
	uint64_t nx[8];
	uint32_t at[8];
	assert_int_equal(queue_get_retry(q, id, i + 1, nx, at), 0);
	if (nx[i] != next || at[i] != attempts)
		fail_msg("%s rcpt %zu: next %llu attempts %u, want %llu %u", id, i,
			 (unsigned long long)nx[i], at[i], (unsigned long long)next, attempts);
}

/* The newest generation file's path. */
static void newest_gen(char *path, size_t len)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	unsigned long long best = 0;
	for (struct dirent *de; (de = readdir(d));) {
		unsigned long long g;
		if (sscanf(de->d_name, "retry.%llu", &g) == 1 && g > best)
			best = g;
	}
	closedir(d);
	assert_true(best > 0);
	snprintf(path, len, "%s/retry.%llu", dir, best);
}

static void append_bytes(const char *path, const void *p, size_t n)
{
	int fd = open(path, O_WRONLY | O_APPEND);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

static void test_set_get_restart(void **state)
{
	(void)state;
	struct queue *q = open_queue(0);
	char ids[3][QUEUE_ID_LEN + 1];
	put(q, 3, 3, ids);
	static const struct {
		size_t msg, rcpt;
		uint64_t next;
		uint32_t attempts;
	} sets[] = {
		{ 0, 0, 1000, 1 }, { 0, 0, 2000, 2 }, { 0, 2, 5000, 1 }, { 1, 1, 7000, 4 },
		{ 2, 0, 0, 9 },
	};
	for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++)
		assert_int_equal(queue_set_retry(q, ids[sets[i].msg], sets[i].rcpt, sets[i].next,
						 sets[i].attempts), 0);
	assert_int_equal(queue_set_retry(q, ids[0], 3, 1, 1), -EINVAL);
	assert_int_equal(queue_set_retry(q, "0000000000000000", 0, 1, 1), -ENOENT);
	assert_int_equal(queue_set_retry(q, "bad", 0, 1, 1), -ENOENT);
	assert_int_equal(queue_get_retry(q, "0000000000000000", 1, NULL, NULL), -ENOENT);
	for (int round = 0; round < 2; round++) {
		check_retry(q, ids[0], 0, 2000, 2);
		check_retry(q, ids[0], 1, 0, 0);
		check_retry(q, ids[0], 2, 5000, 1);
		check_retry(q, ids[1], 1, 7000, 4);
		check_retry(q, ids[2], 0, 0, 9);
		struct queue_stats st;
		queue_stats(q, &st);
		assert_int_equal(st.retry_live, 4);
		/* a restart (as after kill -9: nothing is flushed on the way) */
		q = queue_free(q);
		q = open_queue(0);
	}

	/* a torn last record, then garbage: skipped, the rest kept */
	char path[128];
	newest_gen(path, sizeof(path));
	assert_int_equal(queue_set_retry(q, ids[1], 0, 8000, 1), 0);
	q = queue_free(q);
	unsigned char rec[QUEUE_RETRY_RECORD];
	struct queue_retry_rec r = { QUEUE_RETRY_STATE, "", 1, 99, 99 };
	memcpy(r.id, ids[1], sizeof(r.id));
	assert_int_equal(queue_retry_encode(&r, rec), 0);
	append_bytes(path, rec, 30); /* torn */
	q = open_queue(0);
	check_retry(q, ids[1], 0, 8000, 1);
	check_retry(q, ids[1], 1, 7000, 4); /* not the torn 99 */
	/* appends after a torn tail are read */
	assert_int_equal(queue_set_retry(q, ids[1], 2, 123, 5), 0);
	q = queue_free(q);
	append_bytes(path, "garbage in the middle of the journal", 36);
	q = open_queue(0);
	assert_int_equal(queue_set_retry(q, ids[2], 1, 456, 6), 0);
	q = queue_free(q);
	q = open_queue(0);
	check_retry(q, ids[1], 2, 123, 5);
	check_retry(q, ids[2], 1, 456, 6);
	check_retry(q, ids[0], 0, 2000, 2);

	/* flush: every next attempt 0, the attempts kept, also after a restart */
	assert_int_equal(queue_flush(q, ids[0]), 0);
	check_retry(q, ids[0], 0, 0, 2);
	check_retry(q, ids[0], 2, 0, 1);
	q = queue_free(q);
	q = open_queue(0);
	check_retry(q, ids[0], 0, 0, 2);
	check_retry(q, ids[0], 2, 0, 1);
	check_retry(q, ids[1], 1, 7000, 4);
	queue_free(q);
}

/* Records of every journal file, by message. */
struct census {
	const char *id;
	size_t of_id, total, snapshots;
};

static int census_rec(void *arg, const struct queue_retry_rec *r, size_t off)
{
	struct census *c = arg;
	(void)off;
	c->total++;
	c->snapshots += r->kind == QUEUE_RETRY_SNAPSHOT;
	c->of_id += c->id && strcmp(r->id, c->id) == 0;
	return 0;
}

static void take_census(struct census *c, bool *ret_tmp)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	c->of_id = c->total = c->snapshots = 0;
	*ret_tmp = false;
	for (struct dirent *de; (de = readdir(d));) {
		if (strcmp(de->d_name, "retry.tmp") == 0)
			*ret_tmp = true;
		if (strncmp(de->d_name, "retry.", 6) != 0 || strcmp(de->d_name, "retry.tmp") == 0)
			continue;
		char path[512];
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		FILE *f = fopen(path, "rb");
		if (!f)
			continue; /* unlinked by a compaction since the readdir */
		static unsigned char b[1 << 24];
		size_t n = fread(b, 1, sizeof(b), f);
		fclose(f);
		queue_retry_scan(b, n, census_rec, c, NULL);
	}
	closedir(d);
}

/* Wait until a compaction has left a snapshot, nothing else is under way and the
 * journal holds fewer than `bound` records (appends made during one compaction may
 * start another). */
static void wait_compacted(struct census *c, size_t bound)
{
	for (int i = 0; i < 500; i++) {
		bool tmp;
		take_census(c, &tmp);
		if (c->snapshots && !tmp && c->total < bound)
			return;
		usleep(10000);
	}
	fail_msg("no compaction");
}

struct appender {
	struct queue *q;
	char (*ids)[QUEUE_ID_LEN + 1];
	size_t n, rounds;
	uint32_t tag;
};

static void *append_main(void *arg)
{
	struct appender *a = arg;
	for (size_t round = 1; round <= a->rounds; round++)
		for (size_t i = 0; i < a->n; i++)
			assert_int_equal(queue_set_retry(a->q, a->ids[i], a->tag, round * 1000 + i,
							 (uint32_t)round), 0);
	return NULL;
}

static void test_compaction(void **state)
{
	(void)state;
	enum { N = 200, ROUNDS = 40 };
	struct queue *q = open_queue(1000);
	static char ids[N][QUEUE_ID_LEN + 1];
	put(q, N, 2, ids);
	/* two threads append while compactions run (16,000 records, 400 live) */
	struct appender a[2] = { { q, ids, N, ROUNDS, 0 }, { q, ids, N, ROUNDS, 1 } };
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&t[i], NULL, append_main, &a[i]), 0);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	struct census c = { 0 };
	wait_compacted(&c, 4 * 2 * N + 1000);
	struct queue_stats st;
	queue_stats(q, &st);
	assert_int_equal(st.retry_live, 2 * N);
	assert_true(c.total < 4 * 2 * N + 1000);
	for (int round = 0; round < 2; round++) {
		for (size_t i = 0; i < N; i++) {
			check_retry(q, ids[i], 0, ROUNDS * 1000 + i, ROUNDS);
			check_retry(q, ids[i], 1, ROUNDS * 1000 + i, ROUNDS);
		}
		q = queue_free(q);
		q = open_queue(1000);
	}

	/* records of removed messages are dropped: by the load, and by the next snapshot */
	assert_int_equal(queue_delete(q, ids[0]), 0);
	assert_int_equal(queue_get_retry(q, ids[0], 1, NULL, NULL), -ENOENT);
	for (size_t round = 0; round < 20; round++)
		for (size_t i = 1; i < N; i++)
			assert_int_equal(queue_set_retry(q, ids[i], 0, round + 1, 1), 0);
	c.id = ids[0];
	wait_compacted(&c, SIZE_MAX);
	for (int i = 0; i < 500 && c.of_id; i++) {
		bool tmp;
		usleep(10000);
		take_census(&c, &tmp);
	}
	assert_int_equal(c.of_id, 0);
	q = queue_free(q);
	q = open_queue(1000);
	check_retry(q, ids[5], 0, 20, 1);
	check_retry(q, ids[5], 1, ROUNDS * 1000 + 5, ROUNDS);
	queue_free(q);
}

/* ---- the loader ---- */

struct seen {
	pthread_mutex_t lock;
	size_t news;
	char last[QUEUE_ID_LEN + 1];
	bool ordered;
};

static void on_event(void *arg, enum queue_event ev, const char *id)
{
	struct seen *s = arg;
	if (ev != QUEUE_EV_NEW)
		return;
	pthread_mutex_lock(&s->lock);
	s->news++;
	if (strcmp(id, s->last) <= 0)
		s->ordered = false;
	memcpy(s->last, id, sizeof(s->last));
	pthread_mutex_unlock(&s->lock);
}

static void test_loader(void **state)
{
	(void)state;
	enum { N = 300 };
	struct queue *q = open_queue(0);
	static char ids[N][QUEUE_ID_LEN + 1];
	put(q, N, 1, ids);
	assert_int_equal(queue_set_retry(q, ids[N - 1], 0, 77, 7), 0);
	q = queue_free(q);

	struct queue_conf qc = { .dir = dir };
	char err[256];
	assert_int_equal(queue_open(&qc, NULL, NULL, &q, err, sizeof(err)), 0);
	struct queue_stats st;
	queue_stats(q, &st);
	assert_true(st.loading);
	assert_int_equal(st.messages, 0);
	struct seen s = { PTHREAD_MUTEX_INITIALIZER, 0, "", true };
	queue_set_listener(q, on_event, &s);
	assert_int_equal(queue_start(q), 0);
	assert_int_equal(queue_wait_loaded(q), 0);
	queue_stats(q, &st);
	assert_false(st.loading);
	assert_int_equal(st.messages, N);
	assert_int_equal(st.load_total, N);
	assert_int_equal(st.load_done, N);
	assert_int_equal(s.news, N); /* every one announced, in order of arrival */
	assert_true(s.ordered);
	check_retry(q, ids[N - 1], 0, 77, 7);
	char (*list)[QUEUE_ID_LEN + 1];
	size_t n;
	assert_int_equal(queue_ids(q, &list, &n), 0);
	assert_int_equal(n, N);
	for (size_t i = 0; i < N; i++)
		assert_string_equal(list[i], ids[i]);
	free(list);
	queue_free(q);

	/* stopped half-way: what it did not reach waits for the next start */
	assert_int_equal(queue_open(&qc, NULL, NULL, &q, err, sizeof(err)), 0);
	assert_int_equal(queue_start(q), 0);
	queue_drain(q);
	queue_free(q);
	q = open_queue(0);
	queue_stats(q, &st);
	assert_int_equal(st.messages, N);
	queue_free(q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codec),
		cmocka_unit_test(test_scan),
		cmocka_unit_test_setup_teardown(test_set_get_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(test_compaction, setup, teardown),
		cmocka_unit_test_setup_teardown(test_loader, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
