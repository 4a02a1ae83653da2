/*
 * test_queue_dir -- the queue on disk (src/queue/queue_dir.c): the layout and its lock, the
 * group commit and its all-or-nothing failure, status and control bytes changed by single
 * bytes, the attempt log, scans, and recovery from every row of the recovery table of
 * doc/QUEUE.md, each state built on disk by the test, followed by a second recovery that
 * must find nothing more to do.  Every test runs in its own mkdtemp() directory under
 * /tmp, removed after.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
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

#include "queue_dir.h"
#include "util.h"

#define T0 1795309607134392ULL /* arrival time of the IDs, µs */
static const char b32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

struct fx {
	char dir[64];
	struct queue_dir *qd;
	char path[4][512]; /* p() results, round robin */
	int pi;
};

/* A path under the queue directory. */
static const char *p(struct fx *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *p(struct fx *f, const char *fmt, ...)
{
	char rel[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	assert_true(n > 0 && (size_t)n < sizeof(rel));
	char *out = f->path[f->pi++ % 4];
	assert_int_equal(fmt_fixed(out, sizeof(f->path[0]), "%s/%s", f->dir, rel), 0);
	return out;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void rm_tree(const char *dir)
{
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	strcpy(f->dir, "/tmp/sluice-qd-XXXXXX");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	char err[256];
	if (queue_dir_open(f->dir, &f->qd, err, sizeof(err)) < 0) {
		print_error("%s\n", err);
		rm_tree(f->dir);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	queue_dir_free(f->qd);
	rm_tree(f->dir);
	free(f);
	return 0;
}

/* An ID whose H (character QUEUE_ID_BUCKET: time bits 12-16) is b32[seq % 32]. */
static void make_id(char id[QUEUE_ID_LEN + 1], uint32_t seq)
{
	uint64_t t = (T0 & ~((UINT64_C(1) << 17) - 1)) | (uint64_t)(seq % 32) << 12 | seq / 32;
	queue_id_make(id, t, seq);
}

static int bucket_char(const char *id)
{
	return id[QUEUE_ID_BUCKET];
}

/* A whole message file for envelope ID env_id: nrcpt recipients, a short body; end
 * record only if end. */
static void build(struct buf *b, const char *env_id, size_t nrcpt, bool end)
{
	struct queue_envelope e = { .arrival_us = queue_id_time_us(env_id),
				    .sender = str_cstr("list@example.org"),
				    .client = str_cstr("mx [192.0.2.1]"),
				    .helo = str_cstr("mx.example"), .rcpt_dsn = true };
	memcpy(e.id, env_id, QUEUE_ID_LEN + 1);
	buf_init(b, 1 << 26);
	struct queue_writer *w = queue_writer_new(b);
	assert_non_null(w);
	assert_int_equal(queue_write_head(w, &e), 0);
	for (size_t i = 0; i < nrcpt; i++) {
		char r[64];
		snprintf(r, sizeof(r), "user%zu@example.net", i);
		/* the first with NOTIFY (a version 2 file, which may hold the status N) */
		assert_int_equal(queue_write_rcpt_dsn(w, str_cstr(r), i ? 0 : QUEUE_NOTIFY_SUCCESS,
						      STR_NULL), 0);
	}
	assert_int_equal(queue_write_body(w, str_cstr("Subject: hi\r\n\r\nbody\r\n")), 0);
	if (end)
		assert_int_equal(queue_write_end(w), 0);
	queue_writer_free(w);
}

static void write_all(int fd, const void *data, size_t n)
{
	assert_int_equal(write(fd, data, n), (ssize_t)n);
}

/* tmp/ID written (fd left open if ret_fd), its bytes in *b. */
static void put_tmp(struct fx *f, const char *id, size_t nrcpt, struct buf *b, int *ret_fd)
{
	build(b, id, nrcpt, true);
	int fd = queue_tmp_create(f->qd, id);
	assert_true(fd >= 0);
	write_all(fd, b->ptr, b->len);
	if (ret_fd)
		*ret_fd = fd;
	else
		close(fd);
}

/* A committed message of nrcpt recipients. */
static void put_msg(struct fx *f, const char *id, size_t nrcpt)
{
	struct buf b;
	put_tmp(f, id, nrcpt, &b, NULL);
	const char *ids[] = { id };
	assert_int_equal(queue_commit(f->qd, ids, 1, NULL), 0);
	buf_done(&b);
}

/* A file written as is at a path under the queue. */
static void put_raw(const char *path, const void *data, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	write_all(fd, data, n);
	close(fd);
}

static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

static size_t read_file(const char *path, char **ret)
{
	size_t n = 0;
	assert_int_equal(file_read_all(path, 1 << 26, ret, &n), 0);
	return n;
}

static size_t count_entries(const char *path)
{
	DIR *d = opendir(path);
	assert_non_null(d);
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

/* Files in all of msg/H (or log/H). */
static size_t count_tree(struct fx *f, const char *top)
{
	size_t n = 0;
	for (int h = 0; h < 32; h++)
		n += count_entries(p(f, "%s/%c", top, b32[h]));
	return n;
}

static void assert_same_file(const char *path, const struct buf *b)
{
	char *data;
	size_t n = read_file(path, &data);
	assert_int_equal(n, b->len);
	assert_memory_equal(data, b->ptr, n);
	free(data);
}

/* ---- layout and lock ---- */

static void test_open_layout(void **state)
{
	struct fx *f = *state;
	static const char *const top[] = { "tmp", "corrupt", "msg", "log" };
	for (size_t i = 0; i < ARRAY_SIZE(top); i++) {
		struct stat st;
		assert_int_equal(stat(p(f, "%s", top[i]), &st), 0);
		assert_true(S_ISDIR(st.st_mode));
		assert_int_equal(st.st_mode & 0077, 0);
	}
	for (int h = 0; h < 32; h++) {
		struct stat st;
		assert_int_equal(stat(p(f, "msg/%c", b32[h]), &st), 0);
		assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
		assert_int_equal(stat(p(f, "log/%c", b32[h]), &st), 0);
		assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
	}
	assert_false(exists(p(f, "msg/I")) || exists(p(f, "msg/L")) || exists(p(f, "msg/O")) ||
		     exists(p(f, "msg/U")));
	assert_true(exists(p(f, "lock")));

	/* a second sluiced on the same directory is refused while the first holds it */
	struct queue_dir *q2 = NULL;
	char err[512];
	assert_int_equal(queue_dir_open(f->dir, &q2, err, sizeof(err)), -EAGAIN);
	assert_null(q2);
	assert_non_null(strstr(err, "another sluiced uses this queue directory"));
	assert_non_null(strstr(err, f->dir));

	/* released by free; an existing layout is opened as it is */
	f->qd = queue_dir_free(f->qd);
	assert_int_equal(queue_dir_open(f->dir, &f->qd, err, sizeof(err)), 0);

	/* not a directory, missing */
	assert_int_equal(queue_dir_open(p(f, "lock"), &q2, err, sizeof(err)), -ENOTDIR);
	assert_non_null(strstr(err, "is not a directory"));
	assert_int_equal(queue_dir_open(p(f, "nothere"), &q2, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "does not exist"));
	/* a layout part that is not a directory */
	char sub[64];
	snprintf(sub, sizeof(sub), "%s", p(f, "sub"));
	assert_int_equal(mkdir(sub, 0700), 0);
	put_raw(p(f, "sub/tmp"), "x", 1);
	assert_int_equal(queue_dir_open(sub, &q2, err, sizeof(err)), -ENOTDIR);
	assert_non_null(strstr(err, "tmp/"));
	/* not writable (root may write anywhere: only checked for others) */
	if (geteuid() != 0) {
		assert_int_equal(unlink(p(f, "sub/tmp")), 0);
		assert_int_equal(chmod(sub, 0500), 0);
		assert_int_equal(queue_dir_open(sub, &q2, err, sizeof(err)), -EACCES);
		assert_non_null(strstr(err, "not writable"));
		chmod(sub, 0700);
	}
	assert_null(q2);
}

static void test_tmp(void **state)
{
	struct fx *f = *state;
	char id[QUEUE_ID_LEN + 1];
	make_id(id, 1);
	int fd = queue_tmp_create(f->qd, id);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	assert_int_equal(queue_tmp_create(f->qd, id), -EEXIST);
	assert_true(exists(p(f, "tmp/%s", id)));
	assert_int_equal(queue_tmp_abandon(f->qd, id), 0);
	assert_false(exists(p(f, "tmp/%s", id)));
	assert_int_equal(queue_tmp_abandon(f->qd, id), 0); /* already gone */
	close(fd);
	assert_int_equal(queue_tmp_create(f->qd, "../lock"), -EINVAL);
	assert_int_equal(queue_tmp_create(f->qd, "0123456789ABCDEFG"), -EINVAL);
	assert_int_equal(queue_tmp_abandon(f->qd, "0123456789abcdef"), -EINVAL);
}

struct seen {
	char ids[64][QUEUE_ID_LEN + 1];
	size_t n;
	size_t stop_at;
};

static int collect_id(void *arg, const char *id)
{
	struct seen *s = arg;
	if (s->n == s->stop_at)
		return -ECANCELED;
	assert_true(s->n < ARRAY_SIZE(s->ids));
	memcpy(s->ids[s->n++], id, QUEUE_ID_LEN + 1);
	return 0;
}

/* ---- commit ---- */

static void test_commit(void **state)
{
	struct fx *f = *state;
	struct queue_commit_stats st = { 0 };
	char id[QUEUE_ID_LEN + 1];
	make_id(id, 5);
	struct buf b;
	put_tmp(f, id, 2, &b, NULL);
	const char *one[] = { id };
	assert_int_equal(queue_commit(f->qd, one, 1, &st), 0);
	assert_same_file(p(f, "msg/%c/%s", bucket_char(id), id), &b);
	assert_int_equal(count_entries(p(f, "tmp")), 0);
	/* a message alone: one syncfs, one directory fsync */
	assert_true(st.batches == 1 && st.messages == 1 && st.syncfs == 1 && st.dir_syncs == 1 &&
		    st.file_syncs == 0 && st.failed_batches == 0);
	buf_done(&b);

	/* a batch of 12 over 3 H directories, fds still open (they need not be closed) */
	enum { N = 12 };
	char ids[N][QUEUE_ID_LEN + 1];
	const char *list[N];
	struct buf bufs[N];
	int fds[N];
	for (int i = 0; i < N; i++) {
		make_id(ids[i], (uint32_t)(64 + i * 32 + i % 3));
		list[i] = ids[i];
		put_tmp(f, ids[i], (size_t)i + 1, &bufs[i], &fds[i]);
	}
	memset(&st, 0, sizeof(st));
	assert_int_equal(queue_commit(f->qd, list, N, &st), 0);
	assert_true(st.batches == 1 && st.messages == N && st.syncfs == 1 && st.dir_syncs == 3);
	assert_int_equal(count_entries(p(f, "tmp")), 0);
	assert_int_equal(count_tree(f, "msg"), N + 1);
	for (int i = 0; i < N; i++) {
		close(fds[i]);
		assert_same_file(p(f, "msg/%c/%s", bucket_char(ids[i]), ids[i]), &bufs[i]);
		buf_done(&bufs[i]);
	}
	assert_int_equal(queue_commit(f->qd, list, 0, &st), 0);
}

static void test_commit_failure(void **state)
{
	struct fx *f = *state;
	struct queue_commit_stats st = { 0 };
	char ids[4][QUEUE_ID_LEN + 1];
	struct buf b;
	for (int i = 0; i < 4; i++)
		make_id(ids[i], (uint32_t)(100 + i));

	/* the missing tmp file last (two renamed, then taken back from msg/), then first
	 * (nothing renamed yet) */
	for (int order = 0; order < 2; order++) {
		const char *list[3];
		for (int i = 0; i < 3; i++)
			list[i] = ids[(i + order * 2) % 3]; /* ids[2] is never written */
		put_tmp(f, ids[0], 1, &b, NULL);
		buf_done(&b);
		put_tmp(f, ids[1], 1, &b, NULL);
		buf_done(&b);
		assert_int_equal(queue_commit(f->qd, list, 3, &st), -ENOENT);
		assert_int_equal(count_entries(p(f, "tmp")), 0);
		assert_int_equal(count_tree(f, "msg"), 0);
	}
	assert_true(st.failed_batches == 2 && st.failed_messages == 6 && st.batches == 0);

	/* an ID that is not a QID */
	put_tmp(f, ids[0], 1, &b, NULL);
	buf_done(&b);
	const char *bad[] = { ids[0], "not-an-id" };
	assert_int_equal(queue_commit(f->qd, bad, 2, &st), -EINVAL);
	assert_int_equal(count_entries(p(f, "tmp")), 0);
	assert_int_equal(count_tree(f, "msg"), 0);

	/* a name already committed is never replaced */
	put_msg(f, ids[3], 2);
	char *before;
	size_t n = read_file(p(f, "msg/%c/%s", bucket_char(ids[3]), ids[3]), &before);
	put_tmp(f, ids[0], 1, &b, NULL);
	buf_done(&b);
	put_tmp(f, ids[3], 5, &b, NULL);
	buf_done(&b);
	const char *dup[] = { ids[0], ids[3] };
	assert_int_equal(queue_commit(f->qd, dup, 2, &st), -EEXIST);
	assert_int_equal(count_entries(p(f, "tmp")), 0);
	assert_int_equal(count_tree(f, "msg"), 1);
	char *after;
	assert_int_equal(read_file(p(f, "msg/%c/%s", bucket_char(ids[3]), ids[3]), &after), n);
	assert_memory_equal(before, after, n);
	free(before);
	free(after);

	/* the same ID twice in one batch */
	put_tmp(f, ids[1], 1, &b, NULL);
	buf_done(&b);
	const char *twice[] = { ids[1], ids[1] };
	assert_int_equal(queue_commit(f->qd, twice, 2, &st), -ENOENT);
	assert_int_equal(count_entries(p(f, "tmp")), 0);
	assert_int_equal(count_tree(f, "msg"), 1);
}

/* Several committers at once (the committer thread and an injector, say): each creates,
 * writes and commits its own messages, sharing one queue_dir and one stats struct. */
enum { THREADS = 4, PER_THREAD = 64, BATCH = 8 };

struct committer {
	struct fx *f;
	int t;
	struct queue_commit_stats *st;
	int rc;
};

static void *commit_thread(void *arg)
{
	struct committer *c = arg;
	char ids[BATCH][QUEUE_ID_LEN + 1];
	const char *list[BATCH];
	for (int i = 0; i < PER_THREAD && c->rc == 0; i += BATCH) {
		for (int j = 0; j < BATCH; j++) {
			make_id(ids[j], (uint32_t)(5000 + (c->t * PER_THREAD + i + j) * 5));
			list[j] = ids[j];
			struct buf b;
			build(&b, ids[j], 2, true);
			int fd = queue_tmp_create(c->f->qd, ids[j]);
			if (fd < 0 || write(fd, b.ptr, b.len) != (ssize_t)b.len)
				c->rc = -EIO;
			buf_done(&b);
			if (fd >= 0)
				close(fd);
			/* an abandoned one in between, as a RSET would */
			char gone[QUEUE_ID_LEN + 1];
			make_id(gone, (uint32_t)(900000 + c->t * PER_THREAD + i + j));
			fd = queue_tmp_create(c->f->qd, gone);
			if (fd < 0 || queue_tmp_abandon(c->f->qd, gone) < 0)
				c->rc = -EIO;
			if (fd >= 0)
				close(fd);
		}
		if (c->rc == 0)
			c->rc = queue_commit(c->f->qd, list, BATCH, c->st);
	}
	return NULL;
}

static void test_concurrent_commit(void **state)
{
	struct fx *f = *state;
	struct queue_commit_stats st = { 0 };
	pthread_t th[THREADS];
	struct committer c[THREADS];
	for (int t = 0; t < THREADS; t++) {
		c[t] = (struct committer){ .f = f, .t = t, .st = &st };
		assert_int_equal(pthread_create(&th[t], NULL, commit_thread, &c[t]), 0);
	}
	for (int t = 0; t < THREADS; t++) {
		pthread_join(th[t], NULL);
		assert_int_equal(c[t].rc, 0);
	}
	assert_int_equal(st.messages, THREADS * PER_THREAD);
	assert_int_equal(st.batches, THREADS * PER_THREAD / BATCH);
	assert_int_equal(st.syncfs, st.batches);
	assert_int_equal(count_tree(f, "msg"), THREADS * PER_THREAD);
	assert_int_equal(count_entries(p(f, "tmp")), 0);
	struct queue_recover_stats rs;
	assert_int_equal(queue_recover(f->qd, NULL, NULL, &rs), 0);
	assert_true(rs.messages == THREADS * PER_THREAD && rs.corrupt == 0 && rs.tmp_removed == 0);
}

static size_t open_fds(void)
{
	return count_entries("/proc/self/fd");
}

/* Every descriptor the queue opens is closed again. */
static void test_no_fd_leak(void **state)
{
	struct fx *f = *state;
	f->qd = queue_dir_free(f->qd);
	size_t before = open_fds();
	char err[256];
	assert_int_equal(queue_dir_open(f->dir, &f->qd, err, sizeof(err)), 0);
	char id[QUEUE_ID_LEN + 1];
	make_id(id, 12);
	put_msg(f, id, 2);
	struct queue_msg m;
	const char *why;
	assert_int_equal(queue_msg_open(f->qd, id, &m, &why), 0);
	queue_msg_close(&m);
	assert_int_equal(queue_log_append(f->qd, id, str_cstr("x")), 0);
	struct buf out;
	buf_init(&out, 100);
	assert_int_equal(queue_log_read(f->qd, id, &out, 100), 0);
	buf_done(&out);
	struct seen s = { .stop_at = SIZE_MAX };
	assert_int_equal(queue_scan(f->qd, collect_id, &s), 0);
	put_raw(p(f, "msg/0/junk"), "x", 1);
	assert_int_equal(queue_recover(f->qd, NULL, NULL, NULL), 0);
	f->qd = queue_dir_free(f->qd);
	assert_int_equal(open_fds(), before);
	assert_int_equal(queue_dir_open(f->dir, &f->qd, err, sizeof(err)), 0);
}

/* ---- status and control bytes ---- */

static void test_status_control(void **state)
{
	struct fx *f = *state;
	char id[QUEUE_ID_LEN + 1];
	make_id(id, 7);
	put_msg(f, id, 3);
	const char *path = p(f, "msg/%c/%s", bucket_char(id), id);
	char *orig;
	size_t n = read_file(path, &orig);

	struct queue_msg m;
	const char *why = NULL;
	assert_int_equal(queue_msg_open(f->qd, id, &m, &why), 0);
	assert_int_equal(m.size, n);
	assert_string_equal(m.ix.env.id, id);
	assert_int_equal(m.ix.nrcpt, 3);
	assert_true(m.todo == 3 && m.uncertain == 0 && m.delivered == 0 && m.failed == 0);
	assert_int_equal(queue_msg_state(&m), QUEUE_MSG_ACTIVE);
	assert_true(str_eq_cstr(m.ix.rcpt[2].addr, "user2@example.net"));

	assert_int_equal(queue_msg_set_status(&m, 1, 'D'), 0);
	char *now;
	assert_int_equal(read_file(path, &now), n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(now[i], i == m.ix.rcpt[1].status_off ? 'D' : orig[i]);
	free(now);
	assert_int_equal(queue_msg_set_control(&m, QUEUE_CTL_HOLD, 'H'), 0);
	assert_int_equal(read_file(path, &now), n);
	for (size_t i = 0; i < n; i++) {
		char want = i == m.ix.rcpt[1].status_off ? 'D' :
			    i == m.ix.control_off + QUEUE_CTL_HOLD ? 'H' : orig[i];
		assert_int_equal(now[i], want);
	}
	free(now);

	/* refused without writing anything */
	assert_int_equal(queue_msg_set_status(&m, 0, 'X'), -EINVAL);
	assert_int_equal(queue_msg_set_status(&m, 0, '\0'), -EINVAL);
	assert_int_equal(queue_msg_set_status(&m, 3, 'D'), -EINVAL);
	assert_int_equal(queue_msg_set_control(&m, QUEUE_CTL_HOLD, 'P'), -EINVAL);
	assert_int_equal(queue_msg_set_control(&m, QUEUE_CTL_BOUNCE, 'H'), -EINVAL);
	assert_int_equal(queue_msg_set_control(&m, 5, 'x'), -EINVAL);
	assert_int_equal(queue_msg_set_control(&m, QUEUE_CONTROL_LEN, '-'), -EINVAL);

	assert_int_equal(queue_msg_set_status(&m, 0, 'U'), 0);
	assert_int_equal(queue_msg_set_status(&m, 0, 'F'), 0);
	assert_int_equal(queue_msg_set_status(&m, 2, 'D'), 0);
	assert_true(m.todo == 0 && m.uncertain == 0 && m.delivered == 2 && m.failed == 1);
	assert_int_equal(queue_msg_state(&m), QUEUE_MSG_BOUNCE_DUE);
	assert_int_equal(queue_msg_set_control(&m, QUEUE_CTL_BOUNCE, 'P'), 0);
	assert_int_equal(queue_msg_state(&m), QUEUE_MSG_BOUNCE_DUE);
	assert_int_equal(queue_msg_set_control(&m, QUEUE_CTL_BOUNCE, 'S'), 0);
	assert_int_equal(queue_msg_state(&m), QUEUE_MSG_FINISHED);
	assert_int_equal(queue_msg_sync(&m), 0);
	queue_msg_close(&m);

	/* the file still loads, checksum and all, with the new bytes */
	assert_int_equal(read_file(path, &now), n);
	struct queue_index ix;
	assert_int_equal(queue_file_load(now, n, &ix, &why), 0);
	assert_true(ix.rcpt[0].status == 'F' && ix.rcpt[1].status == 'D' && ix.rcpt[2].status == 'D');
	assert_true(ix.control[QUEUE_CTL_HOLD] == 'H' && ix.control[QUEUE_CTL_BOUNCE] == 'S');
	queue_index_clear(&ix);
	free(now);
	assert_int_equal(queue_msg_open(f->qd, id, &m, &why), 0);
	assert_true(m.failed == 1 && m.delivered == 2 && m.ix.control[QUEUE_CTL_HOLD] == 'H');
	queue_msg_close(&m);
	free(orig);

	/* gone, not a QID, damaged */
	char other[QUEUE_ID_LEN + 1];
	make_id(other, 8);
	assert_int_equal(queue_msg_open(f->qd, other, &m, &why), -ENOENT);
	why = NULL;
	assert_int_equal(queue_msg_open(f->qd, "nope", &m, &why), -EINVAL);
	assert_non_null(why);
	put_raw(p(f, "msg/%c/%s", bucket_char(other), other), "S", 1);
	assert_int_equal(queue_msg_open(f->qd, other, &m, &why), -EINVAL);
	assert_non_null(strstr(why, "cut short"));
	put_raw(p(f, "msg/%c/%s", bucket_char(other), other), "", 0);
	assert_int_equal(queue_msg_open(f->qd, other, &m, &why), -EINVAL);
	assert_non_null(strstr(why, "no end record"));
}

static void test_many_recipients(void **state)
{
	struct fx *f = *state;
	enum { N = 20000 };
	char id[QUEUE_ID_LEN + 1];
	make_id(id, 9);
	put_msg(f, id, N);
	static const char cycle[] = "DFUT";
	struct queue_msg m;
	const char *why;
	uint64_t t = now_ns();
	assert_int_equal(queue_msg_open(f->qd, id, &m, &why), 0);
	assert_int_equal(m.ix.nrcpt, N);
	for (size_t i = 0; i < N; i++)
		assert_int_equal(queue_msg_set_status(&m, i, cycle[i % 4]), 0);
	assert_true(m.delivered == N / 4 && m.failed == N / 4 && m.uncertain == N / 4 &&
		    m.todo == N / 4);
	assert_int_equal(queue_msg_sync(&m), 0);
	queue_msg_close(&m);
	assert_int_equal(queue_msg_open(f->qd, id, &m, &why), 0);
	for (size_t i = 0; i < N; i++)
		assert_int_equal(m.ix.rcpt[i].status, cycle[i % 4]);
	assert_true(str_eq_cstr(m.ix.rcpt[N - 1].addr, "user19999@example.net"));
	queue_msg_close(&m);
	/* linear: 20,000 one-byte writes and two loads take well under a second (a
	 * quadratic search over the recipients would take far longer) */
	uint64_t ms = (now_ns() - t) / 1000000;
	if (ms > 5000)
		fail_msg("20000 recipients took %llu ms", (unsigned long long)ms);
}

/* ---- remove, log, scan ---- */

static void test_remove_and_log(void **state)
{
	struct fx *f = *state;
	char id[QUEUE_ID_LEN + 1];
	make_id(id, 11);
	put_msg(f, id, 1);
	struct buf out;
	buf_init(&out, 1 << 16);
	assert_int_equal(queue_log_read(f->qd, id, &out, 1000), 0); /* no log yet */
	assert_int_equal(out.len, 0);
	assert_int_equal(queue_log_append(f->qd, id, str_cstr("first attempt: 451 busy")), 0);
	assert_int_equal(queue_log_append(f->qd, id, str_cstr("second attempt: 250 ok\n")), 0);
	assert_int_equal(queue_log_append(f->qd, id, str_cstr("")), -EINVAL);
	assert_int_equal(queue_log_append(f->qd, id, str_cstr("\n")), -EINVAL);
	assert_int_equal(queue_log_append(f->qd, id, str_cstr("two\nlines")), -EINVAL);
	char big[QUEUE_LOG_MAX_LINE + 2];
	memset(big, 'x', sizeof(big));
	assert_int_equal(queue_log_append(f->qd, id, str_make(big, QUEUE_LOG_MAX_LINE + 1)),
			 -EINVAL);
	assert_int_equal(queue_log_append(f->qd, id, str_make(big, QUEUE_LOG_MAX_LINE)), 0);
	assert_int_equal(queue_log_append(f->qd, "bad", str_cstr("x")), -EINVAL);

	const char *want = "first attempt: 451 busy\nsecond attempt: 250 ok\n";
	assert_int_equal(buf_append_cstr(&out, ">"), 0); /* appended after what out holds */
	assert_int_equal(queue_log_read(f->qd, id, &out, 1 << 20), 0);
	assert_int_equal(out.len, 1 + strlen(want) + QUEUE_LOG_MAX_LINE + 1);
	assert_memory_equal(out.ptr + 1, want, strlen(want));
	/* the tail, from a line's start */
	buf_reset(&out);
	assert_int_equal(queue_log_read(f->qd, id, &out, QUEUE_LOG_MAX_LINE + 10), 0);
	assert_int_equal(out.len, QUEUE_LOG_MAX_LINE + 1);
	assert_int_equal(out.ptr[0], 'x');
	buf_reset(&out);
	assert_int_equal(queue_log_read(f->qd, id, &out, 10), 0); /* no whole line */
	assert_int_equal(out.len, 0);
	/* out too small: unchanged */
	struct buf small;
	char mem[16];
	buf_init_fixed(&small, mem, sizeof(mem));
	assert_int_equal(buf_append_cstr(&small, "kept"), 0);
	assert_int_equal(queue_log_read(f->qd, id, &small, 1 << 20), -ENOBUFS);
	assert_int_equal(small.len, 4);
	assert_string_equal(small.ptr, "kept");

	assert_int_equal(queue_msg_remove(f->qd, id), 0);
	assert_false(exists(p(f, "msg/%c/%s", bucket_char(id), id)));
	assert_false(exists(p(f, "log/%c/%s", bucket_char(id), id)));
	assert_int_equal(queue_msg_remove(f->qd, id), -ENOENT);
	/* a message without a log */
	put_msg(f, id, 1);
	assert_int_equal(queue_msg_remove(f->qd, id), 0);
	assert_int_equal(queue_msg_remove(f->qd, "bad"), -EINVAL);
	buf_done(&out);
}

static void test_scan(void **state)
{
	struct fx *f = *state;
	char ids[5][QUEUE_ID_LEN + 1];
	for (int i = 0; i < 5; i++) {
		make_id(ids[i], (uint32_t)(200 + i * 7));
		put_msg(f, ids[i], 1);
	}
	put_raw(p(f, "msg/0/junk"), "x", 1);
	char wrong[QUEUE_ID_LEN + 1];
	make_id(wrong, 33); /* H = '1', placed in msg/2 */
	put_raw(p(f, "msg/2/%s", wrong), "x", 1);
	struct seen s = { .stop_at = SIZE_MAX };
	assert_int_equal(queue_scan(f->qd, collect_id, &s), 0);
	assert_int_equal(s.n, 5);
	for (int i = 0; i < 5; i++) {
		bool found = false;
		for (size_t j = 0; j < s.n; j++)
			found |= strcmp(s.ids[j], ids[i]) == 0;
		assert_true(found);
	}
	struct seen stop = { .stop_at = 2 };
	assert_int_equal(queue_scan(f->qd, collect_id, &stop), -ECANCELED);
	assert_int_equal(stop.n, 2);
}

/* ---- recovery ---- */

struct event {
	enum queue_recover_what what;
	char name[300];
	char reason[200];
	char dest[300];
	size_t count;
};

struct capture {
	struct event ev[64];
	size_t nev;
	char live[64][QUEUE_ID_LEN + 1];
	size_t nlive;
	size_t live_todo[64];
	char bounce[16][QUEUE_ID_LEN + 1];
	size_t nbounce;
	char send_bounce_for[QUEUE_ID_LEN + 1]; /* bounce_due() "sends" this one's DSN */
};

static void on_report(void *arg, const struct queue_recover_event *ev)
{
	struct capture *c = arg;
	assert_true(c->nev < ARRAY_SIZE(c->ev));
	struct event *e = &c->ev[c->nev++];
	e->what = ev->what;
	snprintf(e->name, sizeof(e->name), "%s", ev->name);
	snprintf(e->reason, sizeof(e->reason), "%s", ev->reason ? ev->reason : "");
	snprintf(e->dest, sizeof(e->dest), "%s", ev->dest ? ev->dest : "");
	e->count = ev->count;
	if (ev->what == QUEUE_RECOVER_ERROR)
		print_error("recovery error on %s: %s: %s\n", ev->name, ev->reason,
			    strerror(-ev->error));
}

static int on_bounce_due(void *arg, struct queue_msg *m)
{
	struct capture *c = arg;
	assert_true(c->nbounce < ARRAY_SIZE(c->bounce));
	assert_int_equal(m->ix.control[QUEUE_CTL_BOUNCE], 'P');
	assert_true(m->todo == 0 && m->uncertain == 0 && (m->failed > 0 || m->relayed > 0));
	memcpy(c->bounce[c->nbounce++], m->ix.env.id, QUEUE_ID_LEN + 1);
	if (strcmp(m->ix.env.id, c->send_bounce_for) == 0) {
		/* the DSN would be committed here */
		assert_int_equal(queue_msg_set_control(m, QUEUE_CTL_BOUNCE, 'S'), 0);
		assert_int_equal(queue_msg_sync(m), 0);
	}
	return 0;
}

static int on_message(void *arg, const struct queue_msg *m)
{
	struct capture *c = arg;
	assert_true(c->nlive < ARRAY_SIZE(c->live));
	assert_int_equal(m->uncertain, 0);
	c->live_todo[c->nlive] = m->todo;
	memcpy(c->live[c->nlive++], m->ix.env.id, QUEUE_ID_LEN + 1);
	return 0;
}

static const struct queue_recover_ops ops = {
	.report = on_report, .bounce_due = on_bounce_due, .message = on_message,
};

static const struct event *find_event(const struct capture *c, enum queue_recover_what what,
				      const char *name)
{
	for (size_t i = 0; i < c->nev; i++)
		if (c->ev[i].what == what && strcmp(c->ev[i].name, name) == 0)
			return &c->ev[i];
	fail_msg("no event %d for %s", (int)what, name);
	return NULL;
}

static bool in_list(char (*list)[QUEUE_ID_LEN + 1], size_t n, const char *id)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(list[i], id) == 0)
			return true;
	return false;
}

static size_t live_todo(const struct capture *c, const char *id)
{
	for (size_t i = 0; i < c->nlive; i++)
		if (strcmp(c->live[i], id) == 0)
			return c->live_todo[i];
	fail_msg("%s was not handed to message()", id);
	return 0;
}

/* Open a committed message, set statuses from a string ("TUD..") and control bytes
 * (hold, bounce; 0 leaves one as is). */
static void set_states(struct fx *f, const char *id, const char *statuses, char hold,
		       char bounce)
{
	struct queue_msg m;
	const char *why;
	assert_int_equal(queue_msg_open(f->qd, id, &m, &why), 0);
	assert_int_equal(m.ix.nrcpt, strlen(statuses));
	for (size_t i = 0; statuses[i]; i++)
		assert_int_equal(queue_msg_set_status(&m, i, statuses[i]), 0);
	if (hold)
		assert_int_equal(queue_msg_set_control(&m, QUEUE_CTL_HOLD, hold), 0);
	if (bounce)
		assert_int_equal(queue_msg_set_control(&m, QUEUE_CTL_BOUNCE, bounce), 0);
	assert_int_equal(queue_msg_sync(&m), 0);
	queue_msg_close(&m);
}

static void statuses_on_disk(struct fx *f, const char *id, const char *want)
{
	struct queue_msg m;
	const char *why;
	assert_int_equal(queue_msg_open(f->qd, id, &m, &why), 0);
	assert_int_equal(m.ix.nrcpt, strlen(want));
	for (size_t i = 0; want[i]; i++)
		assert_int_equal(m.ix.rcpt[i].status, want[i]);
	queue_msg_close(&m);
}

static const char *msg_path(struct fx *f, const char *id)
{
	return p(f, "msg/%c/%s", bucket_char(id), id);
}

static void test_recover(void **state)
{
	struct fx *f = *state;
	enum {
		TMP, TRUNC, FLIP, NOEND, WRONG_H, ENV_ID, UNCERTAIN, DONE_D, DONE_FS, BOUNCE_P,
		BOUNCE_SENT, BOUNCE_MARK, ORPHAN, COLLIDE, ACTIVE, HELD, DIRNAME, NIDS
	};
	char ids[NIDS][QUEUE_ID_LEN + 1];
	for (int i = 0; i < NIDS; i++)
		make_id(ids[i], (uint32_t)(1000 + i * 33)); /* several H directories */
	struct buf b;
	char *data;
	size_t n;

	/* anything in tmp/: a message being written, one written but not committed */
	put_tmp(f, ids[TMP], 2, &b, NULL);
	buf_done(&b);
	put_raw(p(f, "tmp/partial"), "S\x0c", 2);

	/* truncated after its commit */
	put_msg(f, ids[TRUNC], 2);
	assert_int_equal(truncate(msg_path(f, ids[TRUNC]), 40), 0);
	/* a body byte flipped: the checksum */
	put_msg(f, ids[FLIP], 2);
	n = read_file(msg_path(f, ids[FLIP]), &data);
	char *body = memmem(data, n, "body", 4);
	assert_non_null(body);
	body[0] ^= 0x20;
	put_raw(msg_path(f, ids[FLIP]), data, n);
	free(data);
	/* no end record */
	build(&b, ids[NOEND], 2, false);
	put_raw(msg_path(f, ids[NOEND]), b.ptr, b.len);
	buf_done(&b);
	/* a valid file under a valid QID in the wrong H directory */
	build(&b, ids[WRONG_H], 1, true);
	char wrong_h = bucket_char(ids[WRONG_H]) == '0' ? '1' : '0';
	put_raw(p(f, "msg/%c/%s", wrong_h, ids[WRONG_H]), b.ptr, b.len);
	buf_done(&b);
	/* a name that is not a QID */
	put_raw(p(f, "msg/3/notes.txt"), "operator's notes", 16);
	/* a file whose envelope ID is not its name (a valid file of ids[ACTIVE]'s) */
	build(&b, ids[ACTIVE], 1, true);
	put_raw(msg_path(f, ids[ENV_ID]), b.ptr, b.len);
	buf_done(&b);
	/* a directory under a QID's name */
	assert_int_equal(mkdir(msg_path(f, ids[DIRNAME]), 0700), 0);

	/* recipients U (and one delivered) */
	put_msg(f, ids[UNCERTAIN], 3);
	set_states(f, ids[UNCERTAIN], "UDU", 0, 0);
	/* finished: D only, with a log */
	put_msg(f, ids[DONE_D], 2);
	set_states(f, ids[DONE_D], "DD", 0, 0);
	assert_int_equal(queue_log_append(f->qd, ids[DONE_D], str_cstr("delivered")), 0);
	/* finished: an F, the bounce sent */
	put_msg(f, ids[DONE_FS], 2);
	set_states(f, ids[DONE_FS], "FD", 0, 'S');
	assert_int_equal(queue_log_append(f->qd, ids[DONE_FS], str_cstr("550 no")), 0);
	/* bounce pending: bounce_due() does not send it, so it stays */
	put_msg(f, ids[BOUNCE_P], 2);
	set_states(f, ids[BOUNCE_P], "DF", 0, 'P');
	/* bounce pending: bounce_due() sends it (sets 'S'), so it is then removed */
	put_msg(f, ids[BOUNCE_SENT], 1);
	set_states(f, ids[BOUNCE_SENT], "F", 0, 'P');
	/* the last F written, 'P' not yet (not in the table of doc/QUEUE.md) */
	put_msg(f, ids[BOUNCE_MARK], 2);
	set_states(f, ids[BOUNCE_MARK], "FF", 0, 0);
	/* a log without its message */
	put_raw(p(f, "log/%c/%s", bucket_char(ids[ORPHAN]), ids[ORPHAN]), "old\n", 4);
	/* a damaged file whose name is already taken in corrupt/ */
	put_raw(p(f, "corrupt/%s", ids[COLLIDE]), "earlier", 7);
	put_raw(msg_path(f, ids[COLLIDE]), "SLUICE", 6);
	/* active, and active held */
	put_msg(f, ids[ACTIVE], 1);
	put_msg(f, ids[HELD], 2);
	set_states(f, ids[HELD], "DT", 'H', 0);
	assert_int_equal(queue_log_append(f->qd, ids[HELD], str_cstr("451 later")), 0);
	/* a stray in log/ */
	put_raw(p(f, "log/0/README"), "x", 1);

	struct capture *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	memcpy(c->send_bounce_for, ids[BOUNCE_SENT], QUEUE_ID_LEN + 1);
	struct queue_recover_stats st;
	assert_int_equal(queue_recover(f->qd, &ops, c, &st), 0);

	/* tmp/ */
	assert_int_equal(count_entries(p(f, "tmp")), 0);
	assert_int_equal(st.tmp_removed, 2);
	find_event(c, QUEUE_RECOVER_TMP_REMOVED, ids[TMP]);
	find_event(c, QUEUE_RECOVER_TMP_REMOVED, "partial");

	/* corrupt/: each under its name, bytes untouched, with the reason */
	static const struct { int which; const char *reason; } damaged[] = {
		{ TRUNC, "" }, { FLIP, "checksum" }, { NOEND, "no end record" },
		{ WRONG_H, "instead of" }, { ENV_ID, "envelope's queue ID" },
		{ DIRNAME, "not a regular file" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(damaged); i++) {
		const char *id = ids[damaged[i].which];
		const struct event *e = find_event(c, QUEUE_RECOVER_CORRUPT, id);
		assert_string_equal(e->dest, id);
		if (!strstr(e->reason, damaged[i].reason))
			fail_msg("%s: reason \"%s\", expected \"%s\"", id, e->reason,
				 damaged[i].reason);
		assert_true(e->reason[0] != '\0');
		assert_true(exists(p(f, "corrupt/%s", id)));
		assert_false(exists(msg_path(f, id)));
	}
	assert_false(exists(p(f, "msg/%c/%s", wrong_h, ids[WRONG_H])));
	n = read_file(p(f, "corrupt/%s", ids[TRUNC]), &data);
	assert_int_equal(n, 40);
	free(data);
	const struct event *e = find_event(c, QUEUE_RECOVER_CORRUPT, "notes.txt");
	assert_non_null(strstr(e->reason, "not a queue ID"));
	n = read_file(p(f, "corrupt/notes.txt"), &data);
	assert_true(n == 16 && memcmp(data, "operator's notes", 16) == 0);
	free(data);
	/* the collision: the earlier file kept, the new one beside it */
	e = find_event(c, QUEUE_RECOVER_CORRUPT, ids[COLLIDE]);
	char dest[64];
	snprintf(dest, sizeof(dest), "%s.1", ids[COLLIDE]);
	assert_string_equal(e->dest, dest);
	n = read_file(p(f, "corrupt/%s", ids[COLLIDE]), &data);
	assert_true(n == 7 && memcmp(data, "earlier", 7) == 0);
	free(data);
	n = read_file(p(f, "corrupt/%s", dest), &data);
	assert_true(n == 6 && memcmp(data, "SLUICE", 6) == 0);
	free(data);
	assert_int_equal(st.corrupt, ARRAY_SIZE(damaged) + 2);
	assert_int_equal(count_entries(p(f, "corrupt")), ARRAY_SIZE(damaged) + 3);

	/* U set back to T by single bytes, the rest of the file as it was */
	e = find_event(c, QUEUE_RECOVER_UNCERTAIN, ids[UNCERTAIN]);
	assert_int_equal(e->count, 2);
	assert_int_equal(st.uncertain_reset, 2);
	statuses_on_disk(f, ids[UNCERTAIN], "TDT");
	assert_int_equal(live_todo(c, ids[UNCERTAIN]), 2);

	/* finished: gone with their logs */
	for (int w = DONE_D; w <= DONE_FS; w++) {
		find_event(c, QUEUE_RECOVER_FINISHED, ids[w]);
		assert_false(exists(msg_path(f, ids[w])));
		assert_false(exists(p(f, "log/%c/%s", bucket_char(ids[w]), ids[w])));
		assert_false(in_list(c->live, c->nlive, ids[w]));
	}
	/* bounce due: offered to bounce_due(); the one "sent" is finished and removed */
	assert_true(in_list(c->bounce, c->nbounce, ids[BOUNCE_P]));
	assert_true(in_list(c->bounce, c->nbounce, ids[BOUNCE_SENT]));
	assert_true(in_list(c->bounce, c->nbounce, ids[BOUNCE_MARK]));
	assert_int_equal(c->nbounce, 3);
	assert_true(exists(msg_path(f, ids[BOUNCE_P])));
	assert_true(in_list(c->live, c->nlive, ids[BOUNCE_P]));
	find_event(c, QUEUE_RECOVER_FINISHED, ids[BOUNCE_SENT]);
	assert_false(exists(msg_path(f, ids[BOUNCE_SENT])));
	assert_false(in_list(c->live, c->nlive, ids[BOUNCE_SENT]));
	assert_int_equal(st.finished, 3);
	/* the missing 'P' written */
	find_event(c, QUEUE_RECOVER_BOUNCE_MARKED, ids[BOUNCE_MARK]);
	assert_int_equal(st.bounce_marked, 1);
	struct queue_msg m;
	const char *why;
	assert_int_equal(queue_msg_open(f->qd, ids[BOUNCE_MARK], &m, &why), 0);
	assert_int_equal(m.ix.control[QUEUE_CTL_BOUNCE], 'P');
	queue_msg_close(&m);

	/* orphan log unlinked; the logs of live messages kept; the stray left alone */
	find_event(c, QUEUE_RECOVER_ORPHAN_LOG, ids[ORPHAN]);
	assert_int_equal(st.orphan_logs, 1);
	assert_false(exists(p(f, "log/%c/%s", bucket_char(ids[ORPHAN]), ids[ORPHAN])));
	assert_true(exists(p(f, "log/%c/%s", bucket_char(ids[HELD]), ids[HELD])));
	find_event(c, QUEUE_RECOVER_STRAY, "log/0/README");
	assert_true(exists(p(f, "log/0/README")));
	assert_int_equal(st.strays, 1);

	/* live: what message() received and the totals */
	assert_int_equal(c->nlive, 5); /* UNCERTAIN, BOUNCE_P, BOUNCE_MARK, ACTIVE, HELD */
	assert_int_equal(live_todo(c, ids[ACTIVE]), 1);
	assert_int_equal(live_todo(c, ids[HELD]), 1);
	assert_int_equal(st.messages, 5);
	assert_int_equal(st.rcpt_todo, 2 + 0 + 0 + 1 + 1);
	assert_int_equal(st.rcpt_delivered, 1 + 1 + 0 + 0 + 1);
	assert_int_equal(st.rcpt_failed, 0 + 1 + 2 + 0 + 0);
	assert_int_equal(st.held, 1);
	assert_int_equal(st.bounce_due, 2);
	assert_int_equal(st.errors, 0);
	assert_int_equal(count_tree(f, "msg"), 5);

	/* a second run finds nothing more to do */
	memset(c, 0, sizeof(*c));
	struct queue_recover_stats st2;
	assert_int_equal(queue_recover(f->qd, &ops, c, &st2), 0);
	assert_int_equal(c->nev, 1); /* the stray, left alone again */
	assert_int_equal(c->ev[0].what, QUEUE_RECOVER_STRAY);
	assert_true(st2.tmp_removed == 0 && st2.corrupt == 0 && st2.finished == 0 &&
		    st2.uncertain_reset == 0 && st2.bounce_marked == 0 && st2.orphan_logs == 0 &&
		    st2.errors == 0);
	assert_true(st2.messages == st.messages && st2.rcpt_todo == st.rcpt_todo &&
		    st2.rcpt_delivered == st.rcpt_delivered && st2.rcpt_failed == st.rcpt_failed &&
		    st2.held == st.held && st2.bounce_due == st.bounce_due);
	assert_int_equal(c->nbounce, 2); /* still due: the daemon has not sent them */
	assert_int_equal(count_entries(p(f, "corrupt")), ARRAY_SIZE(damaged) + 3);
	assert_int_equal(count_tree(f, "msg"), 5);

	free(c);
}

/* N (delivered, relayed notice owed) keeps the message for its notice, as an F keeps it
 * for its bounce: recovery writes the missing 'P' and offers it to bounce_due(); it is
 * removed only once the notice is sent ('S'); beside a T it waits, and is never set back. */
static void test_recover_relayed(void **state)
{
	struct fx *f = *state;
	enum { MARK, WAIT, SENT, NIDS };
	char ids[NIDS][QUEUE_ID_LEN + 1];
	for (int i = 0; i < NIDS; i++)
		make_id(ids[i], (uint32_t)(7000 + i * 33));
	put_msg(f, ids[MARK], 2);
	set_states(f, ids[MARK], "ND", 0, 0);
	put_msg(f, ids[WAIT], 2);
	set_states(f, ids[WAIT], "NT", 0, 0);
	put_msg(f, ids[SENT], 2);
	set_states(f, ids[SENT], "ND", 0, 'S');
	struct capture *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	struct queue_recover_stats st;
	assert_int_equal(queue_recover(f->qd, &ops, c, &st), 0);
	find_event(c, QUEUE_RECOVER_BOUNCE_MARKED, ids[MARK]);
	assert_int_equal(st.bounce_marked, 1);
	assert_int_equal(c->nbounce, 1);
	assert_true(in_list(c->bounce, c->nbounce, ids[MARK]));
	assert_true(in_list(c->live, c->nlive, ids[MARK]));
	struct queue_msg m;
	const char *why;
	assert_int_equal(queue_msg_open(f->qd, ids[MARK], &m, &why), 0);
	assert_int_equal(m.ix.control[QUEUE_CTL_BOUNCE], 'P');
	assert_true(m.relayed == 1 && m.delivered == 1 && m.failed == 0);
	assert_int_equal(queue_msg_state(&m), QUEUE_MSG_BOUNCE_DUE);
	queue_msg_close(&m);
	statuses_on_disk(f, ids[WAIT], "NT");
	assert_int_equal(live_todo(c, ids[WAIT]), 1);
	find_event(c, QUEUE_RECOVER_FINISHED, ids[SENT]);
	assert_false(exists(msg_path(f, ids[SENT])));
	assert_int_equal(st.messages, 2);
	assert_int_equal(st.rcpt_delivered, 2 + 1);
	assert_int_equal(st.bounce_due, 1);
	free(c);
}

static int fail_message(void *arg, const struct queue_msg *m)
{
	(void)arg;
	(void)m;
	return -ECANCELED;
}

static void test_recover_stops(void **state)
{
	struct fx *f = *state;
	char id[QUEUE_ID_LEN + 1];
	make_id(id, 3);
	put_msg(f, id, 1);
	struct queue_recover_ops o = { .message = fail_message };
	struct queue_recover_stats st = { .messages = 99 };
	assert_int_equal(queue_recover(f->qd, &o, NULL, &st), -ECANCELED);
	assert_int_equal(st.messages, 99); /* untouched on failure */
	assert_true(exists(msg_path(f, id)));
	/* an empty queue */
	assert_int_equal(queue_msg_remove(f->qd, id), 0);
	assert_int_equal(queue_recover(f->qd, &o, NULL, &st), 0);
	assert_int_equal(st.messages, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_open_layout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tmp, setup, teardown),
		cmocka_unit_test_setup_teardown(test_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_commit_failure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_concurrent_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_fd_leak, setup, teardown),
		cmocka_unit_test_setup_teardown(test_status_control, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_recipients, setup, teardown),
		cmocka_unit_test_setup_teardown(test_remove_and_log, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scan, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recover, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recover_relayed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recover_stops, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
