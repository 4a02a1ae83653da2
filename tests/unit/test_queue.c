/*
 * test_queue -- the running queue (src/queue/queue.c): new messages through the
 * committer thread, the index, hold/release/delete, abort, drain, and the index rebuilt
 * by recovery at the next open.
 */
#include <dirent.h>
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

#include "queue.h"

struct waiter {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done;
	int result;
};

static void on_done(void *arg, int r)
{
	struct waiter *w = arg;
	pthread_mutex_lock(&w->lock);
	w->done++;
	w->result = r;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static void wait_for(struct waiter *w, int n)
{
	pthread_mutex_lock(&w->lock);
	while (w->done < n)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/test_queue.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
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
	wait_for(w, expect_done);
	assert_int_equal(w->result, 0);
}

static void test_commit_list_reopen(void **state)
{
	(void)state;
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
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
	assert_int_equal(queue_list(q, NULL, false, &out), 0);
	assert_non_null(strstr(out.ptr, a));
	assert_non_null(strstr(out.ptr, "<s@example.net>"));
	assert_non_null(strstr(out.ptr, "T <user1@example.org>"));
	assert_non_null(strstr(out.ptr, "-- 2 messages, 3 recipients"));
	buf_reset(&out);
	assert_int_equal(queue_list(q, b, true, &out), 0);
	assert_non_null(strstr(out.ptr, "\"sender\":\"\""));
	buf_reset(&out);

	/* hold: the index and the file's control byte */
	assert_int_equal(queue_hold(q, a, true), 0);
	assert_int_equal(queue_show(q, a, false, &out), 0);
	assert_non_null(strstr(out.ptr, "(held)"));
	buf_reset(&out);
	assert_int_equal(queue_list(q, a, false, &out), 0);
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
	buf_clear(&out);
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
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
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
	buf_clear(&out);
	assert_int_equal(queue_delete(q, id), 0);
	queue_free(q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_commit_list_reopen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_abort_and_drain, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_recipients, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
