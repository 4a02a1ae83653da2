/*
 * test_queue -- the running queue (src/queue/queue.c): new messages through the
 * committer thread, the index, hold/release/delete, abort, drain, and the index rebuilt
 * by recovery at the next open; the selections of `sluice queue` (queue_select.c) as a
 * table, the summary's buckets, and the walks in batches.
 */
#include <dirent.h>
#include <inttypes.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture.h"
#include "queue.h"
#include "queue_select.h"
#include "queue_table.h"
#include "util.h"

static void on_done(void *arg, int r)
{
	waiter_done(arg, r);
}

static char dir[64];

static int setup(void **state)
{
	(void)state;
	return fixture_dir_make(dir, sizeof(dir), "test_queue");
}

static int teardown(void **state)
{
	(void)state;
	return fixture_dir_remove(dir);
}

static struct queue *open_queue(void)
{
	struct queue_conf qc = { .dir = dir, .commit_batch = 8 };
	struct queue *q = NULL;
	char err[256];
	int r = queue_open(&qc, NULL, NULL, &q, err, sizeof(err));
	if (r < 0)
		fail_msg("queue_open: %s", err);
	assert_int_equal(queue_start(q), 0);
	assert_int_equal(queue_wait_loaded(q), 0);
	return q;
}

static size_t count_files(const char *sub)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/%s", dir, sub);
	DIR *d = opendir(path);
	assert_non_null(d);
	size_t n = 0;
	for (struct dirent *de; (de = readdir(d));)
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* Queue one message with nrcpt recipients and body; returns its ID in id. */
static void put(struct queue *q, const char *sender, size_t nrcpt, const char *body,
		char id[QUEUE_ID_LEN + 1], struct waiter *w, int expect_done)
{
	struct queue_envelope env = { .sender = str_cstr(sender), .client = str_cstr("[127.0.0.1]"),
				      .helo = str_cstr("client.test") };
	struct queue_new *n = NULL;
	assert_int_equal(queue_new_begin(q, &env, &n), 0);
	memcpy(id, queue_new_id(n), QUEUE_ID_LEN + 1);
	for (size_t i = 0; i < nrcpt; i++) {
		char a[64];
		snprintf(a, sizeof(a), "user%zu@example.org", i);
		assert_int_equal(queue_new_rcpt(n, str_cstr(a)), 0);
	}
	assert_int_equal(queue_new_body(n, str_cstr(body)), 0);
	assert_int_equal(queue_new_commit(n, on_done, w), 0);
	waiter_wait(w, expect_done);
	assert_int_equal(w->result, 0);
}

/* The whole listing of the queue (or of one ID), walked 3 messages at a time as the
 * control command walks it.  -ENOENT when id is given and not in the queue. */
static int list_all(struct queue *q, const char *id, bool json, struct buf *out,
		    struct queue_list_totals *ret_tot)
{
	char ids[1][QUEUE_ID_LEN + 1];
	struct queue_select sel = { 0 };
	if (id) {
		snprintf(ids[0], sizeof(ids[0]), "%s", id);
		sel.ids = (const char(*)[QUEUE_ID_LEN + 1])ids;
		sel.nids = 1;
	}
	struct queue_cursor c = { 0 };
	struct queue_list_totals tot = { 0 };
	while (!c.done) {
		int r = queue_list_step(q, &sel, realtime_ns() / 1000, json, 3, &c, &tot, out);
		if (r < 0)
			return r;
	}
	if (ret_tot)
		*ret_tot = tot;
	return id && c.missing ? -ENOENT : 0;
}

static void test_commit_list_reopen(void **state)
{
	(void)state;
	struct waiter w = WAITER_INIT;
	struct queue *q = open_queue();
	char a[QUEUE_ID_LEN + 1], b[QUEUE_ID_LEN + 1];
	put(q, "s@example.net", 2, "Subject: one\r\n\r\nbody\r\n", a, &w, 1);
	put(q, "", 1, "Subject: two\r\n\r\nbody\r\n", b, &w, 2);
	assert_true(strcmp(a, b) < 0); /* IDs sort by arrival */
	assert_int_equal(count_files("tmp"), 0);

	struct queue_stats st;
	queue_stats(q, &st);
	assert_int_equal(st.messages, 2);
	assert_int_equal(st.recipients, 3);
	assert_int_equal(st.commits, 2);
	assert_true(st.batches >= 1 && st.batches <= 2);

	struct buf out;
	buf_init(&out, 1 << 20);
	struct queue_list_totals tot;
	assert_int_equal(list_all(q, NULL, false, &out, &tot), 0);
	assert_non_null(strstr(out.ptr, a));
	assert_non_null(strstr(out.ptr, "<s@example.net>"));
	assert_non_null(strstr(out.ptr, "T <user1@example.org>  to do: next attempt now"));
	assert_true(tot.messages == 2 && tot.recipients == 3);
	buf_reset(&out);
	assert_int_equal(list_all(q, b, true, &out, NULL), 0);
	assert_non_null(strstr(out.ptr, "\"sender\":\"\""));
	buf_reset(&out);

	/* hold: the index and the file's control byte */
	assert_int_equal(queue_hold(q, a, true), 0);
	assert_int_equal(queue_show(q, a, false, &out), 0);
	assert_non_null(strstr(out.ptr, "(held)"));
	buf_reset(&out);
	assert_int_equal(list_all(q, a, false, &out, NULL), 0);
	assert_non_null(strstr(out.ptr, "!"));
	buf_reset(&out);
	queue_stats(q, &st);
	assert_int_equal(st.held, 1);
	assert_int_equal(queue_hold(q, "0000000000000000", true), -ENOENT);
	assert_int_equal(queue_flush(q, b), 0);
	assert_int_equal(queue_flush(q, "not an id"), -ENOENT);
	q = queue_free(q);

	/* a new process: recovery rebuilds the index, the hold survives */
	q = open_queue();
	queue_stats(q, &st);
	assert_int_equal(st.messages, 2);
	assert_int_equal(st.held, 1);
	assert_int_equal(queue_delete(q, b), 0);
	assert_int_equal(queue_delete(q, b), -ENOENT);
	queue_stats(q, &st);
	assert_int_equal(st.messages, 1);
	assert_int_equal(queue_show(q, b, false, &out), -ENOENT);
	buf_done(&out);
	queue_free(q);
}

static void test_abort_and_drain(void **state)
{
	(void)state;
	struct queue *q = open_queue();
	struct queue_envelope env = { .sender = str_cstr("s@example.net") };
	struct queue_new *n = NULL;
	assert_int_equal(queue_new_begin(q, &env, &n), 0);
	assert_int_equal(queue_new_rcpt(n, str_cstr("r@example.org")), 0);
	assert_int_equal(count_files("tmp"), 1);
	queue_new_abort(n);
	assert_int_equal(count_files("tmp"), 0);

	/* no recipient: the commit is refused and nothing is left */
	assert_int_equal(queue_new_begin(q, &env, &n), 0);
	assert_int_equal(queue_new_commit(n, on_done, NULL), -EINVAL);
	assert_int_equal(count_files("tmp"), 0);

	/* recipients after the body are refused */
	assert_int_equal(queue_new_begin(q, &env, &n), 0);
	assert_int_equal(queue_new_rcpt(n, str_cstr("r@example.org")), 0);
	assert_int_equal(queue_new_body(n, str_cstr("x\r\n")), 0);
	assert_int_equal(queue_new_rcpt(n, str_cstr("late@example.org")), -EINVAL);
	queue_new_abort(n);

	/* after queue_drain() no commit is taken */
	queue_drain(q);
	assert_int_equal(queue_new_begin(q, &env, &n), 0);
	assert_int_equal(queue_new_rcpt(n, str_cstr("r@example.org")), 0);
	assert_int_equal(queue_new_commit(n, on_done, NULL), -ESHUTDOWN);
	assert_int_equal(count_files("tmp"), 0);
	queue_free(q);
}

/* A list post: 20,000 recipients and a 1 MB body through queue_new, listed and reloaded
 * (linear costs: this runs in well under a second). */
static void test_many_recipients(void **state)
{
	(void)state;
	struct waiter w = WAITER_INIT;
	struct queue *q = open_queue();
	size_t blen = 1 << 20;
	char *body = malloc(blen + 1);
	assert_non_null(body);
	for (size_t i = 0; i < blen; i++)
		body[i] = (i % 80 == 78) ? '\r' : (i % 80 == 79) ? '\n' : 'a' + (char)(i % 26);
	body[blen] = '\0';
	char id[QUEUE_ID_LEN + 1];
	put(q, "list@example.net", 20000, body, id, &w, 1);
	free(body);
	struct queue_stats st;
	queue_stats(q, &st);
	assert_int_equal(st.recipients, 20000);
	q = queue_free(q);
	q = open_queue();
	queue_stats(q, &st);
	assert_int_equal(st.messages, 1);
	assert_int_equal(st.recipients, 20000);
	struct buf out;
	buf_init(&out, 64u << 20);
	assert_int_equal(queue_show(q, id, true, &out), 0);
	assert_non_null(strstr(out.ptr, "\"user19999@example.org\""));
	assert_non_null(strstr(out.ptr, "\"size\":1048576"));
	buf_done(&out);
	assert_int_equal(queue_delete(q, id), 0);
	queue_free(q);
}

/* ---- selections (queue_select.c), a table ---- */

#define MIN_US (UINT64_C(60) * 1000000)
#define NOW_US (UINT64_C(1800000000) * 1000000)

/* An index entry: sender, recipients "addr:S:N" (status S, next attempt N minutes from
 * now, negative = past), held or not, arrived age minutes ago. */
static struct qentry *entry(const char *id, const char *sender, const char *const *rcpts,
			    bool held, uint64_t age_min)
{
	char names[512];
	size_t len = 0, n = 0;
	len += (size_t)snprintf(names + len, sizeof(names) - len, "%s", sender) + 1;
	for (; rcpts[n]; n++)
		len += (size_t)snprintf(names + len, sizeof(names) - len, "%.*s",
					(int)strcspn(rcpts[n], ":"), rcpts[n]) + 1;
	struct qentry *e = qentry_new(id, NOW_US - age_min * MIN_US, 100, names, len, n);
	assert_non_null(e);
	for (size_t i = 0; i < n; i++) {
		const char *c = strchr(rcpts[i], ':');
		assert_non_null(c);
		qentry_status(e)[i] = c[1];
		long next = strtol(c + 3, NULL, 10);
		qentry_rcpt(e)[i].next_us = next > 0 ? NOW_US + (uint64_t)next * MIN_US
					   : next < 0 ? NOW_US - (uint64_t)-next * MIN_US : 0;
	}
	e->control[QUEUE_CTL_HOLD] = held ? 'H' : '-';
	return e;
}

static void test_select_table(void **state)
{
	(void)state;
	static const char *const r0[] = { "a@example.com:T:30", "b@mx.example.net:T:0", NULL };
	static const char *const r1[] = { "c@Example.COM:U:-5", "d@other.org:D:0", NULL };
	static const char *const r2[] = { "e@sub.example.com:T:0", "f@example.com:F:0", NULL };
	static const char *const r3[] = { "g@other.org:T:120", NULL };
	struct qentry *e[4] = {
		entry("0000000000000001", "Alice@Example.net", r0, false, 3),
		entry("0000000000000002", "", r1, false, 90),
		entry("0000000000000003", "bob@example.org", r2, true, 2000),
		entry("0000000000000004", "carol@example.net", r3, false, 30),
	};
	static const char ids13[][QUEUE_ID_LEN + 1] = { "0000000000000001", "0000000000000003" };
	static const struct {
		struct queue_select sel;
		const char *want; /* '1' per selected entry */
	} cases[] = {
		{ { 0 }, "1111" },
		/* domain: exact without regard to case, .suffix for subdomains only, pending
		 * recipients only (f@example.com of 3 is F) */
		{ { .domain = "example.com" }, "1100" },
		{ { .domain = "EXAMPLE.com" }, "1100" },
		{ { .domain = ".example.com" }, "0010" },
		{ { .domain = ".example.net" }, "1000" },
		{ { .domain = "example.net" }, "0000" },
		{ { .domain = "other.org" }, "0001" }, /* d@other.org of 2 is delivered */
		{ { .domain = "nowhere.test" }, "0000" },
		/* sender: exact, @domain, the null sender */
		{ { .sender = "alice@example.net" }, "1000" },
		{ { .sender = "@example.net" }, "1001" },
		{ { .sender = "@EXAMPLE.ORG" }, "0010" },
		{ { .sender = "<>" }, "0100" },
		{ { .sender = "" }, "0100" },
		{ { .sender = "example.net" }, "0000" },
		/* older than */
		{ { .older_us = 30 * MIN_US }, "0111" },
		{ { .older_us = 31 * MIN_US }, "0110" },
		{ { .older_us = 1 * MIN_US }, "1111" },
		/* states */
		{ { .state = QUEUE_SEL_DEFERRED }, "1001" },
		{ { .state = QUEUE_SEL_TODO }, "1110" },
		{ { .state = QUEUE_SEL_HELD }, "0010" },
		{ { .state = QUEUE_SEL_UNCERTAIN }, "0100" },
		/* domain and state are asked of the same recipient */
		{ { .domain = "example.com", .state = QUEUE_SEL_DEFERRED }, "1000" },
		{ { .domain = "mx.example.net", .state = QUEUE_SEL_DEFERRED }, "0000" },
		{ { .domain = "mx.example.net", .state = QUEUE_SEL_TODO }, "1000" },
		{ { .domain = "example.com", .state = QUEUE_SEL_UNCERTAIN }, "0100" },
		{ { .domain = "sub.example.com", .state = QUEUE_SEL_HELD }, "0010" },
		/* IDs, and everything together */
		{ { .ids = ids13, .nids = 2 }, "1010" },
		{ { .ids = ids13, .nids = 0 }, "0000" },
		{ { .ids = ids13, .nids = 2, .sender = "@example.net" }, "1000" },
		{ { .sender = "@example.net", .older_us = 10 * MIN_US,
		    .state = QUEUE_SEL_DEFERRED, .domain = "other.org" }, "0001" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char got[5] = "0000";
		for (size_t k = 0; k < 4; k++)
			got[k] = queue_select_match(&cases[i].sel, e[k], NOW_US) ? '1' : '0';
		if (strcmp(got, cases[i].want) != 0)
			fail_msg("case %zu: selected %s, expected %s", i, got, cases[i].want);
	}
	for (size_t k = 0; k < 4; k++)
		qentry_free(e[k]);

	enum queue_select_state st;
	assert_int_equal(queue_select_state_parse("deferred", &st), 0);
	assert_int_equal(st, QUEUE_SEL_DEFERRED);
	assert_int_equal(queue_select_state_parse("uncertain", &st), 0);
	assert_int_equal(st, QUEUE_SEL_UNCERTAIN);
	assert_int_equal(queue_select_state_parse("Deferred", &st), -EINVAL);
	assert_int_equal(queue_select_state_parse("", &st), -EINVAL);
	assert_string_equal(queue_addr_domain("a@b@c.example"), "c.example");
	assert_string_equal(queue_addr_domain("postmaster"), "");
}

/* ---- the summary's buckets and counts ---- */

static void test_summary_buckets(void **state)
{
	(void)state;
	static const struct {
		uint64_t age_s;
		unsigned bucket;
	} ages[] = {
		{ 0, 0 },	  { 299, 0 },	    { 300, 1 },	      { 599, 1 },
		{ 600, 2 },	  { 1199, 2 },	    { 1200, 3 },      { 2400, 4 },
		{ 4800, 5 },	  { 9600, 6 },	    { 19200, 7 },     { 38400, 8 },
		{ 76799, 8 },	  { 76800, 9 },	    { 864000, 9 },
	};
	for (size_t i = 0; i < sizeof(ages) / sizeof(ages[0]); i++)
		if (queue_summary_bucket(ages[i].age_s * 1000000) != ages[i].bucket)
			fail_msg("age %" PRIu64 " s: bucket %u, expected %u", ages[i].age_s,
				 queue_summary_bucket(ages[i].age_s * 1000000), ages[i].bucket);
	assert_string_equal(queue_summary_bucket_name(0), "5m");
	assert_string_equal(queue_summary_bucket_name(8), "1280m");
	assert_string_equal(queue_summary_bucket_name(9), "1280m+");

	/* counts by key, without regard to case, through the table's growth */
	struct queue_summary sum;
	queue_summary_init(&sum);
	for (unsigned i = 0; i < 1000; i++) {
		char key[32];
		snprintf(key, sizeof(key), "d%u.example", i % 200);
		assert_int_equal(queue_summary_add(&sum, key, (uint64_t)i * 1000000), 0);
	}
	for (unsigned i = 0; i < 7; i++)
		assert_int_equal(queue_summary_add(&sum, i % 2 ? "BIG.example" : "big.example",
						   UINT64_C(100000) * 1000000), 0);
	assert_int_equal(sum.n, 201);
	assert_int_equal(sum.total.total, 1007);
	const struct queue_summary_row **rows = NULL;
	size_t n = 0;
	assert_int_equal(queue_summary_top(&sum, 3, &rows, &n), 0);
	assert_int_equal(n, 3);
	assert_string_equal(rows[0]->key, "big.example");
	assert_int_equal(rows[0]->total, 7);
	assert_int_equal(rows[0]->count[9], 7);
	/* then the 5-count rows in the order of their keys */
	assert_string_equal(rows[1]->key, "d0.example");
	assert_string_equal(rows[2]->key, "d1.example");
	/* d0: ages 0, 200, 400, 600, 800 s: buckets 0, 0, 1, 2, 2 */
	assert_int_equal(rows[1]->count[0], 2);
	assert_int_equal(rows[1]->count[1], 1);
	assert_int_equal(rows[1]->count[2], 2);
	uint64_t cols = 0;
	for (unsigned b = 0; b < QUEUE_SUMMARY_BUCKETS; b++)
		cols += sum.total.count[b];
	assert_int_equal(cols, 1007);
	free(rows);
	queue_summary_clear(&sum);
}

/* ---- walks in batches ---- */

struct events {
	pthread_mutex_t lock;
	int bounce;
	char last[QUEUE_ID_LEN + 1];
};

static void on_event(void *arg, enum queue_event ev, const char *id)
{
	struct events *evs = arg;
	pthread_mutex_lock(&evs->lock);
	if (ev == QUEUE_EV_BOUNCE) {
		evs->bounce++;
		snprintf(evs->last, sizeof(evs->last), "%s", id);
	}
	pthread_mutex_unlock(&evs->lock);
}

static void test_walks(void **state)
{
	(void)state;
	struct waiter w = WAITER_INIT;
	struct queue *q = open_queue();
	struct events evs = { .lock = PTHREAD_MUTEX_INITIALIZER };
	queue_set_listener(q, on_event, &evs);
	enum { N = 40 };
	char ids[N][QUEUE_ID_LEN + 1];
	for (int i = 0; i < N; i++)
		put(q, i % 4 ? "s@example.net" : "", (size_t)(1 + i % 3), "Subject: x\r\n\r\nx\r\n",
		    ids[i], &w, i + 1);
	/* a deferral on one recipient of every 5th message */
	for (int i = 0; i < N; i += 5)
		assert_int_equal(queue_set_retry(q, ids[i], 0, realtime_ns() / 1000 + 3600000000u, 2), 0);

	/* a listing 3 at a time: each message once, in order, whatever changes meanwhile */
	struct queue_select all = { 0 };
	struct queue_cursor c = { 0 };
	struct queue_list_totals tot = { 0 };
	struct buf out;
	buf_init(&out, 1 << 20);
	int steps = 0;
	while (!c.done) {
		assert_int_equal(queue_list_step(q, &all, realtime_ns() / 1000, true, 3, &c, &tot,
						 &out), 0);
		if (++steps == 2)
			assert_int_equal(queue_delete(q, ids[N - 1]), 0); /* not reached yet */
	}
	assert_int_equal(tot.messages, N - 1);
	size_t lines = 0;
	const char *prev = NULL;
	for (const char *p = out.ptr; p && p < out.ptr + out.len; p = strchr(p, '\n') + 1) {
		assert_true(strncmp(p, "{\"id\":\"", 7) == 0);
		assert_true(!prev || strncmp(prev + 7, p + 7, QUEUE_ID_LEN) < 0);
		prev = p;
		lines++;
		if (!strchr(p, '\n'))
			break;
	}
	assert_int_equal(lines, N - 1);
	assert_non_null(strstr(out.ptr, "\"next_attempt_us\":0,\"attempts\":0,\"last_reply\":null"));
	assert_non_null(strstr(out.ptr, ",\"attempts\":2,"));

	/* the deferred ones, by ID and by state */
	struct queue_select deferred = { .state = QUEUE_SEL_DEFERRED };
	char got[N][QUEUE_ID_LEN + 1];
	size_t n = 0, total = 0;
	memset(&c, 0, sizeof(c));
	while (!c.done) {
		assert_int_equal(queue_select_ids(q, &deferred, realtime_ns() / 1000, 2, &c,
						  got + total, &n), 0);
		total += n;
	}
	assert_int_equal(total, N / 5);
	for (size_t i = 0; i < total; i++)
		assert_string_equal(got[i], ids[i * 5]);
	assert_int_equal(queue_flush(q, ids[0]), 0);
	memset(&c, 0, sizeof(c));
	total = 0;
	while (!c.done) {
		queue_select_ids(q, &deferred, realtime_ns() / 1000, 100, &c, got + total, &n);
		total += n;
	}
	assert_int_equal(total, N / 5 - 1);

	/* IDs, some not in the queue */
	char set[3][QUEUE_ID_LEN + 1];
	snprintf(set[0], sizeof(set[0]), "%s", ids[3]);
	snprintf(set[1], sizeof(set[1]), "%s", ids[7]);
	snprintf(set[2], sizeof(set[2]), "%s", ids[N - 1]); /* deleted */
	struct queue_select byid = { .ids = (const char(*)[QUEUE_ID_LEN + 1])set, .nids = 3 };
	memset(&c, 0, sizeof(c));
	total = 0;
	while (!c.done) {
		queue_select_ids(q, &byid, realtime_ns() / 1000, 1, &c, got + total, &n);
		total += n;
	}
	assert_int_equal(total, 2);
	assert_int_equal(c.missing, 1);

	/* the summary: pending recipients by domain (all at example.org, all new) */
	struct queue_summary sum;
	queue_summary_init(&sum);
	memset(&c, 0, sizeof(c));
	while (!c.done)
		assert_int_equal(queue_summary_step(q, &all, realtime_ns() / 1000, false, &c, &sum), 0);
	uint64_t want = 0;
	for (int i = 0; i < N - 1; i++)
		want += (uint64_t)(1 + i % 3);
	assert_int_equal(sum.n, 1);
	assert_int_equal(sum.total.total, want);
	assert_int_equal(sum.total.count[0], want);
	queue_summary_clear(&sum);
	/* by sender: "<>" for the null sender */
	queue_summary_init(&sum);
	memset(&c, 0, sizeof(c));
	while (!c.done)
		queue_summary_step(q, &all, realtime_ns() / 1000, true, &c, &sum);
	assert_int_equal(sum.n, 2);
	queue_summary_clear(&sum);

	/* bounce: an event for the relay, nothing else changes */
	assert_int_equal(queue_bounce(q, ids[2]), 0);
	assert_int_equal(queue_bounce(q, ids[N - 1]), -ENOENT);
	assert_int_equal(evs.bounce, 1);
	assert_string_equal(evs.last, ids[2]);

	/* queue show: each recipient's retry state */
	buf_reset(&out);
	assert_int_equal(queue_show(q, ids[5], false, &out), 0);
	assert_non_null(strstr(out.ptr, "T <user0@example.org>  deferred: next attempt in "));
	assert_non_null(strstr(out.ptr, ", 2 attempts"));
	buf_reset(&out);
	assert_int_equal(queue_show(q, ids[5], true, &out), 0);
	assert_non_null(strstr(out.ptr, "\"attempts\":2,\"last_reply\":null"));
	buf_done(&out);
	queue_set_listener(q, NULL, NULL);
	queue_free(q);
}

/* The last reply of each recipient, from its attempt log, in a listing. */
static void test_last_reply(void **state)
{
	(void)state;
	struct waiter w = WAITER_INIT;
	struct queue *q = open_queue();
	char id[QUEUE_ID_LEN + 1];
	put(q, "s@example.net", 2, "Subject: x\r\n\r\nx\r\n", id, &w, 1);
	uint64_t now = realtime_ns() / 1000;
	assert_int_equal(queue_set_retry(q, id, 1, now + 7000000000u, 3), 0);
	static const char *const lines[] = {
		"ts=1 rcpt=1 status=deferred lane=isp mta=m dsn=- reply=451 4.3.0 first",
		"ts=2 rcpt=0 status=deferred lane=isp mta=m dsn=- reply=450 4.2.0 zero",
		"ts=3 rcpt=1 status=deferred lane=isp mta=m dsn=- reply=450 4.2.1 \"quoted\" last",
	};
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(queue_log_append(queue_directory(q), id, str_cstr(lines[i])), 0);
	struct buf out;
	buf_init(&out, 1 << 20);
	assert_int_equal(list_all(q, NULL, false, &out, NULL), 0);
	assert_non_null(strstr(out.ptr, "T <user0@example.org>  to do: next attempt now\n"
					"        last reply: 450 4.2.0 zero\n"));
	assert_non_null(strstr(out.ptr, "T <user1@example.org>  deferred: next attempt in 1h56m, "
					"3 attempts\n        last reply: 450 4.2.1 \"quoted\" last\n"));
	buf_reset(&out);
	assert_int_equal(list_all(q, NULL, true, &out, NULL), 0);
	assert_non_null(strstr(out.ptr, ",\"attempts\":3,\"last_reply\":\"450 4.2.1 \\\"quoted\\\" last\"}"));
	buf_reset(&out);
	assert_int_equal(queue_show(q, id, false, &out), 0);
	assert_non_null(strstr(out.ptr, "      last reply: 450 4.2.1 \"quoted\" last\n"));
	buf_done(&out);
	queue_free(q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_commit_list_reopen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_abort_and_drain, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_recipients, setup, teardown),
		cmocka_unit_test(test_select_table),
		cmocka_unit_test(test_summary_buckets),
		cmocka_unit_test_setup_teardown(test_walks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_last_reply, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
