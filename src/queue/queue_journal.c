/*
 * queue_journal -- the retry journal's generations (queue_journal.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "queue_journal.h"
#include "util.h"

#define TMP_NAME "retry.tmp"
#define MAX_FILE (1ull << 34) /* a generation larger than 16 GiB is not read */

struct queue_journal {
	int dirfd;
	int fd;                   /* the generation appended to */
	uint64_t cur;             /* its number */
	uint64_t *old;            /* generations before cur, ascending */
	size_t nold;
	int tmp;                  /* retry.tmp while a snapshot is written, else -1 */
};

/* "retry.N" with N decimal, 1 to 2^63: N, else 0. */
static uint64_t gen_of(const char *name)
{
	if (strncmp(name, "retry.", 6) != 0)
		return 0;
	const char *p = name + 6;
	if (*p < '1' || *p > '9' || strlen(p) > 18)
		return 0;
	uint64_t n = 0;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		n = n * 10 + (uint64_t)(*p - '0');
	}
	return n;
}

static void gen_name(char out[32], uint64_t g)
{
	fmt_fixed(out, 32, "retry.%" PRIu64, g);
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int open_gen(int dirfd, uint64_t g, bool excl)
{
	char name[32];
	gen_name(name, g);
	int fd = openat(dirfd, name, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW |
				     (excl ? O_EXCL : 0), 0600);
	return fd < 0 ? -errno : fd;
}

struct queue_journal *queue_journal_free(struct queue_journal *j)
{
	if (!j)
		return NULL;
	if (j->fd >= 0)
		close(j->fd);
	if (j->tmp >= 0)
		queue_journal_snapshot_abort(j);
	free(j->old);
	free(j);
	return NULL;
}

int queue_journal_open(int dirfd, struct queue_journal **ret)
{
	struct queue_journal *j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->dirfd = dirfd;
	j->fd = -1;
	j->tmp = -1;
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		int e = -errno;
		if (fd >= 0)
			close(fd);
		free(j);
		return e;
	}
	size_t cap = 0;
	int rc = 0;
	for (struct dirent *de; rc == 0 && (errno = 0, de = readdir(d));) {
		if (strcmp(de->d_name, TMP_NAME) == 0) {
			/* a compaction that did not finish: the generations are all there */
			unlinkat(dirfd, TMP_NAME, 0);
			continue;
		}
		uint64_t g = gen_of(de->d_name);
		if (!g)
			continue;
		if (j->nold == cap) {
			cap = cap ? cap * 2 : 8;
			uint64_t *n = realloc(j->old, cap * sizeof(*n));
			if (!n) {
				rc = -ENOMEM;
				break;
			}
			j->old = n;
		}
		j->old[j->nold++] = g;
	}
	if (rc == 0 && errno)
		rc = -errno;
	closedir(d);
	if (rc == 0) {
		if (j->nold)
			qsort(j->old, j->nold, sizeof(*j->old), u64_cmp);
		j->cur = j->nold ? j->old[j->nold - 1] + 1 : 1;
		struct stat st;
		char name[32];
		if (j->nold) {
			gen_name(name, j->old[j->nold - 1]);
			if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISREG(st.st_mode) && st.st_size == 0) {
				/* the newest is empty: append to it, read nothing of it */
				j->cur = j->old[--j->nold];
			}
		}
		/* Not flushed: a generation whose name a power cut loses held only records
		 * the page cache had, which the cut loses anyway (an early retry). */
		j->fd = open_gen(dirfd, j->cur, false);
		if (j->fd < 0)
			rc = j->fd;
	}
	if (rc < 0) {
		queue_journal_free(j);
		return rc;
	}
	*ret = j;
	return 0;
}

int queue_journal_append(struct queue_journal *j, const void *p, size_t len)
{
	ssize_t w;
	do
		w = write(j->fd, p, len);
	while (w < 0 && errno == EINTR);
	return w < 0 ? -errno : (size_t)w != len ? -EIO : 0;
}

/* A generation's bytes, or NULL (missing, unreadable, too large). */
static unsigned char *read_gen(int dirfd, uint64_t g, size_t *ret_len)
{
	char name[32];
	gen_name(name, g);
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return NULL;
	struct stat st;
	unsigned char *p = NULL;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < MAX_FILE &&
	    (p = malloc((size_t)st.st_size + 1))) {
		size_t got = 0, want = (size_t)st.st_size;
		while (got < want) {
			ssize_t r = pread(fd, p + got, want - got, (off_t)got);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
			got += (size_t)r;
		}
		*ret_len = got;
	}
	close(fd);
	return p;
}

struct load_ctx {
	int (*fn)(void *arg, const struct queue_retry_rec *r);
	void *arg;
};

static int load_one(void *arg, const struct queue_retry_rec *r, size_t off)
{
	struct load_ctx *c = arg;
	(void)off;
	return r->kind == QUEUE_RETRY_STATE ? c->fn(c->arg, r) : 0;
}

int queue_journal_load(struct queue_journal *j,
		       int (*fn)(void *arg, const struct queue_retry_rec *r), void *arg,
		       struct queue_journal_load_stats *ret_stats)
{
	struct queue_journal_load_stats st = { 0 };
	/* the newest generation that starts with a snapshot record */
	size_t from = 0;
	for (size_t i = j->nold; i-- > 0;) {
		char name[32];
		gen_name(name, j->old[i]);
		unsigned char head[QUEUE_RETRY_RECORD];
		struct queue_retry_rec r;
		int fd = openat(j->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0)
			continue;
		ssize_t n = pread(fd, head, sizeof(head), 0);
		close(fd);
		if (n == (ssize_t)sizeof(head) && queue_retry_decode(head, sizeof(head), &r) == 0 &&
		    r.kind == QUEUE_RETRY_SNAPSHOT) {
			from = i;
			break;
		}
	}
	struct load_ctx c = { fn, arg };
	int rc = 0;
	for (size_t i = from; rc == 0 && i < j->nold; i++) {
		size_t len = 0;
		unsigned char *p = read_gen(j->dirfd, j->old[i], &len);
		if (!p)
			continue;
		struct queue_retry_scan_stats ss;
		rc = queue_retry_scan(p, len, load_one, &c, &ss);
		free(p);
		st.files++;
		st.records += ss.records;
		st.skipped_bytes += ss.skipped_bytes;
	}
	if (ret_stats)
		*ret_stats = st;
	return rc;
}

int queue_journal_rotate(struct queue_journal *j)
{
	uint64_t *n = realloc(j->old, (j->nold + 1) * sizeof(*n));
	if (!n)
		return -ENOMEM;
	j->old = n;
	int fd = open_gen(j->dirfd, j->cur + 1, true);
	if (fd < 0)
		return fd;
	close(j->fd);
	j->old[j->nold++] = j->cur;
	j->fd = fd;
	j->cur++;
	return 0;
}

int queue_journal_snapshot_begin(struct queue_journal *j, uint64_t now_us)
{
	if (j->tmp >= 0 || !j->nold)
		return -EINVAL;
	int fd = openat(j->dirfd, TMP_NAME, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
			0600);
	if (fd < 0)
		return -errno;
	j->tmp = fd;
	unsigned char rec[QUEUE_RETRY_RECORD];
	struct queue_retry_rec r = { .kind = QUEUE_RETRY_SNAPSHOT, .next_us = now_us };
	queue_retry_encode(&r, rec);
	int rc = queue_journal_snapshot_write(j, rec, sizeof(rec));
	if (rc < 0)
		queue_journal_snapshot_abort(j);
	return rc;
}

int queue_journal_snapshot_write(struct queue_journal *j, const void *p, size_t len)
{
	const unsigned char *b = p;
	while (len) {
		ssize_t w = write(j->tmp, b, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		b += w;
		len -= (size_t)w;
	}
	return 0;
}

int queue_journal_snapshot_commit(struct queue_journal *j)
{
	if (j->tmp < 0 || !j->nold)
		return -EINVAL;
	char name[32];
	gen_name(name, j->old[j->nold - 1]);
	int rc = fsync(j->tmp) < 0 ? -errno : 0;
	if (rc == 0 && renameat(j->dirfd, TMP_NAME, j->dirfd, name) < 0)
		rc = -errno;
	if (rc < 0) {
		queue_journal_snapshot_abort(j);
		return rc;
	}
	close(j->tmp);
	j->tmp = -1;
	/* the rename is durable before any older generation goes: a reader always finds
	 * either the old generations or the snapshot */
	if (fsync(j->dirfd) < 0)
		return -errno;
	for (size_t i = 0; i + 1 < j->nold; i++) {
		gen_name(name, j->old[i]);
		unlinkat(j->dirfd, name, 0);
	}
	j->old[0] = j->old[j->nold - 1];
	j->nold = 1;
	return 0;
}

void queue_journal_snapshot_abort(struct queue_journal *j)
{
	if (j->tmp < 0)
		return;
	close(j->tmp);
	j->tmp = -1;
	unlinkat(j->dirfd, TMP_NAME, 0);
}
