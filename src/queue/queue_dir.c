/*
 * queue_dir -- the queue's files on disk: layout and lock, tmp/ files, the group commit,
 * committed messages and their status bytes, the attempt logs, recovery (see
 * queue_dir.h and doc/QUEUE.md).
 *
 * Every path is reached through a directory fd opened once by queue_dir_open() (openat,
 * renameat, unlinkat), so nothing here builds a path string, and the struct never
 * changes after it is opened: threads share it without a lock, except for the commit,
 * which holds commit_lock (see queue_commit).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "queue_dir.h"
#include "util.h"

/* The QID alphabet (Crockford base32, as queue_file.c writes it): the H directories. */
static const char alphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

struct queue_dir {
	int root;
	int lock;
	int tmp;
	int corrupt;
	int msg[QUEUE_NBUCKETS];
	int log[QUEUE_NBUCKETS];
	pthread_mutex_t commit_lock;
	bool file_sync;            /* under commit_lock: flush file by file (queue_commit) */
};

/* A NUL-terminated QID?  (queue_id_valid takes a slice; a longer string must not pass.) */
static bool id_ok(const char *id)
{
	return id && strnlen(id, QUEUE_ID_LEN + 1) == QUEUE_ID_LEN &&
	       queue_id_valid(str_make(id, QUEUE_ID_LEN));
}

/* The H directory of a valid QID: its character QUEUE_ID_BUCKET (queue_file.h). */
static int bucket(const char *id)
{
	return (int)(strchr(alphabet, id[QUEUE_ID_BUCKET]) - alphabet);
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

int queue_dir_free_space(struct queue_dir *qd, uint64_t *ret_bytes)
{
	struct statvfs sv;
	if (fstatvfs(qd->root, &sv) < 0)
		return -errno;
	*ret_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
	return 0;
}

struct queue_dir *queue_dir_free(struct queue_dir *qd)
{
	if (!qd)
		return NULL;
	close_fd(&qd->root);
	close_fd(&qd->tmp);
	close_fd(&qd->corrupt);
	for (int h = 0; h < QUEUE_NBUCKETS; h++) {
		close_fd(&qd->msg[h]);
		close_fd(&qd->log[h]);
	}
	close_fd(&qd->lock); /* last: releases the flock */
	pthread_mutex_destroy(&qd->commit_lock);
	free(qd);
	return NULL;
}

/* Open (creating it 0700 if missing) the directory name under parent, on device dev. */
static int subdir(int parent, const char *name, dev_t dev, bool *created, int *ret_fd)
{
	if (mkdirat(parent, name, 0700) == 0)
		*created = true;
	else if (errno != EEXIST)
		return -errno;
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	if (st.st_dev != dev) {
		close(fd);
		return -EXDEV;
	}
	*ret_fd = fd;
	return 0;
}

static const char *subdir_error(int rc)
{
	return rc == -EXDEV ? "is on another filesystem than the queue directory (renames "
			      "must stay on one filesystem)"
			    : strerror(-rc);
}

/* tmp/, corrupt/, msg/H/, log/H/; the parents of what was created are flushed, so that a
 * message committed into a new msg/H cannot lose its directory in a crash. */
static int make_layout(struct queue_dir *qd, dev_t dev, const char *path, char *err,
		       size_t errlen)
{
	bool root_new = false;
	int rc = subdir(qd->root, "tmp", dev, &root_new, &qd->tmp);
	if (rc == 0)
		rc = subdir(qd->root, "corrupt", dev, &root_new, &qd->corrupt);
	if (rc < 0) {
		fmt_fixed(err, errlen, "queue directory %.200s: tmp/ or corrupt/: %s", path,
			  subdir_error(rc));
		return rc;
	}
	static const char *const tops[2] = { "msg", "log" };
	for (int t = 0; t < 2; t++) {
		int *fds = t == 0 ? qd->msg : qd->log;
		int top = -1;
		bool top_new = false;
		rc = subdir(qd->root, tops[t], dev, &root_new, &top);
		for (int h = 0; rc == 0 && h < QUEUE_NBUCKETS; h++) {
			char name[2] = { alphabet[h], '\0' };
			rc = subdir(top, name, dev, &top_new, &fds[h]);
			if (rc < 0)
				fmt_fixed(err, errlen, "queue directory %.200s: %s/%s: %s", path,
					  tops[t], name, subdir_error(rc));
		}
		if (rc == 0 && top_new && fsync(top) < 0) {
			rc = -errno;
			fmt_fixed(err, errlen, "queue directory %.200s: fsync of %s/: %s", path,
				  tops[t], strerror(errno));
		}
		if (rc < 0 && top < 0)
			fmt_fixed(err, errlen, "queue directory %.200s: %s/: %s", path, tops[t],
				  subdir_error(rc));
		close_fd(&top);
		if (rc < 0)
			return rc;
	}
	if (root_new && fsync(qd->root) < 0) {
		rc = -errno;
		fmt_fixed(err, errlen, "queue directory %.200s: fsync: %s", path, strerror(errno));
	}
	return rc;
}

int queue_dir_open(const char *path, struct queue_dir **ret, char *err, size_t errlen)
{
	char dummy[1];
	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	err[0] = '\0';
	struct queue_dir *qd = calloc(1, sizeof(*qd));
	if (!qd) {
		fmt_fixed(err, errlen, "queue directory %.200s: out of memory", path);
		return -ENOMEM;
	}
	qd->root = qd->lock = qd->tmp = qd->corrupt = -1;
	for (int h = 0; h < QUEUE_NBUCKETS; h++)
		qd->msg[h] = qd->log[h] = -1;
	int rc = -pthread_mutex_init(&qd->commit_lock, NULL);
	if (rc < 0) {
		free(qd);
		fmt_fixed(err, errlen, "queue directory %.200s: %s", path, strerror(-rc));
		return rc;
	}
	struct stat st;
	qd->root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (qd->root < 0) {
		rc = -errno;
		fmt_fixed(err, errlen, "queue directory %.200s: %s", path,
			  rc == -ENOENT ? "does not exist" :
			  rc == -ENOTDIR ? "is not a directory" : strerror(-rc));
		goto fail;
	}
	if (fstat(qd->root, &st) < 0) {
		rc = -errno;
		fmt_fixed(err, errlen, "queue directory %.200s: %s", path, strerror(-rc));
		goto fail;
	}
	if (faccessat(qd->root, ".", W_OK | X_OK, AT_EACCESS) < 0) {
		rc = -errno;
		fmt_fixed(err, errlen, "queue directory %.200s: not writable by this process "
			  "(uid %u): %s", path, (unsigned)geteuid(), strerror(-rc));
		goto fail;
	}
	qd->lock = openat(qd->root, "lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (qd->lock < 0) {
		rc = -errno;
		fmt_fixed(err, errlen, "queue directory %.200s: lock file: %s", path, strerror(-rc));
		goto fail;
	}
	if (flock(qd->lock, LOCK_EX | LOCK_NB) < 0) {
		rc = -errno;
		if (rc == -EWOULDBLOCK) {
			rc = -EAGAIN;
			fmt_fixed(err, errlen, "queue directory %.200s: another sluiced uses this "
				  "queue directory (%.200s/lock is locked)", path, path);
		} else {
			fmt_fixed(err, errlen, "queue directory %.200s: flock of lock: %s", path,
				  strerror(-rc));
		}
		goto fail;
	}
	rc = make_layout(qd, st.st_dev, path, err, errlen);
	if (rc < 0)
		goto fail;
	*ret = qd;
	return 0;
fail:
	queue_dir_free(qd);
	return rc;
}

/* ---- a message being written ---- */

int queue_tmp_create(struct queue_dir *qd, const char *id)
{
	if (!id_ok(id))
		return -EINVAL;
	int fd = openat(qd->tmp, id, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	return fd < 0 ? -errno : fd;
}

int queue_tmp_abandon(struct queue_dir *qd, const char *id)
{
	if (!id_ok(id))
		return -EINVAL;
	if (unlinkat(qd->tmp, id, 0) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

/* ---- the group commit ---- */

/*
 * rename() that never replaces an existing target.  A filesystem without
 * RENAME_NOREPLACE: link() (which refuses an existing name), then unlink() -- a crash
 * between them leaves both names, and recovery removes the one in tmp/.
 */
static int rename_noreplace(int odir, const char *oname, int ndir, const char *nname)
{
	if (renameat2(odir, oname, ndir, nname, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	if (linkat(odir, oname, ndir, nname, 0) < 0)
		return -errno;
	if (unlinkat(odir, oname, 0) < 0) {
		int e = -errno;
		unlinkat(ndir, nname, 0);
		return e;
	}
	return 0;
}

/* Flush one tmp file's data (and its size) through a descriptor of its own: it reports
 * any writeback error still pending on the file, whoever wrote it. */
static int sync_tmp_file(struct queue_dir *qd, const char *id)
{
	int fd = openat(qd->tmp, id, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	int rc = fdatasync(fd) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

int queue_commit(struct queue_dir *qd, const char *const *ids, size_t n,
		 struct queue_commit_stats *st)
{
	struct queue_commit_stats dummy;
	if (!st)
		st = &dummy;
	if (n == 0)
		return 0;
	int rc = 0;
	for (size_t i = 0; i < n; i++)
		if (!id_ok(ids[i]))
			rc = -EINVAL;
	pthread_mutex_lock(&qd->commit_lock);
	size_t renamed = 0;
	uint32_t touched = 0;
	if (rc < 0)
		goto fail;
	/* 1. the data of every file of the batch on the disk */
	if (!qd->file_sync) {
		if (syncfs(qd->root) == 0) {
			st->syncfs++;
		} else if (errno == ENOSYS) {
			qd->file_sync = true;
		} else {
			rc = -errno;
			st->syncfs++;
			/* see the XXX of queue_commit in queue_dir.h */
			qd->file_sync = true;
			goto fail;
		}
	}
	if (qd->file_sync) {
		for (size_t i = 0; i < n; i++) {
			rc = sync_tmp_file(qd, ids[i]);
			st->file_syncs++;
			if (rc < 0)
				goto fail;
		}
	}
	/* 2. each under its final name */
	for (; renamed < n; renamed++) {
		const char *id = ids[renamed];
		int h = bucket(id);
		rc = rename_noreplace(qd->tmp, id, qd->msg[h], id);
		if (rc < 0)
			goto fail;
		touched |= 1u << h;
	}
	/* 3. the names on the disk: the commit point */
	for (int h = 0; h < QUEUE_NBUCKETS; h++) {
		if (!(touched & (1u << h)))
			continue;
		st->dir_syncs++;
		if (fsync(qd->msg[h]) < 0) {
			rc = -errno;
			goto fail;
		}
	}
	st->batches++;
	st->messages += n;
	pthread_mutex_unlock(&qd->commit_lock);
	return 0;
fail:
	/* nothing of the batch stays: renamed ones leave msg/, the others tmp/ */
	for (size_t i = 0; i < n; i++) {
		if (!id_ok(ids[i]))
			continue;
		if (i < renamed)
			unlinkat(qd->msg[bucket(ids[i])], ids[i], 0);
		else
			unlinkat(qd->tmp, ids[i], 0);
	}
	/* best effort, so that a crash does not bring back a message answered 451 (if it
	 * did, it would be delivered: a duplicate, never a loss) */
	for (int h = 0; h < QUEUE_NBUCKETS; h++) {
		if (touched & (1u << h)) {
			st->dir_syncs++;
			fsync(qd->msg[h]);
		}
	}
	st->failed_batches++;
	st->failed_messages += n;
	pthread_mutex_unlock(&qd->commit_lock);
	return rc;
}

/* ---- a committed message ---- */

static bool status_ok(const struct queue_msg *m, char s)
{
	return s == QUEUE_TODO || s == QUEUE_UNCERTAIN || s == QUEUE_DELIVERED || s == QUEUE_FAILED ||
	       (s == QUEUE_RELAYED && m->ix.version >= 2); /* the loader's rule */
}

static size_t *count_of(struct queue_msg *m, char s)
{
	switch (s) {
	case QUEUE_TODO:
		return &m->todo;
	case QUEUE_UNCERTAIN:
		return &m->uncertain;
	case QUEUE_DELIVERED:
		return &m->delivered;
	case QUEUE_RELAYED:
		return &m->relayed;
	default:
		return &m->failed;
	}
}

/*
 * Read the file once through (64 KiB at a time) so that a disk read error is an error
 * here, not a SIGBUS at the first touch of the map.  The pages stay in the page cache,
 * so the loader's pass over the map costs no second read.  The bytes read, in *ret_n
 * (less than size if the file shrank meanwhile: the map must not pass its end).
 */
static int read_through(int fd, size_t size, size_t *ret_n)
{
	enum { CHUNK = 65536 };
	char *b = malloc(CHUNK);
	if (!b)
		return -ENOMEM;
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	size_t off = 0;
	int rc = 0;
	while (off < size) {
		size_t want = size - off < CHUNK ? size - off : CHUNK;
		ssize_t r = pread(fd, b, want, (off_t)off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		if (r == 0)
			break;
		off += (size_t)r;
	}
	free(b);
	if (rc == 0)
		*ret_n = off;
	return rc;
}

int queue_msg_open(struct queue_dir *qd, const char *id, struct queue_msg *ret,
		   const char **ret_why)
{
	const char *why = NULL;
	int rc;
	struct queue_msg m = { .fd = -1 };
	if (!id_ok(id)) {
		why = "the name is not a queue ID";
		rc = -EINVAL;
		goto fail;
	}
	/* O_NONBLOCK and O_NOCTTY: something else than a file under a QID's name must not
	 * block or take a terminal (it is refused below); ignored for regular files */
	m.fd = openat(qd->msg[bucket(id)], id,
		      O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
	if (m.fd < 0) {
		rc = -errno;
		if (rc == -ELOOP || rc == -EISDIR || rc == -ENXIO) {
			why = "not a regular file";
			rc = -EINVAL;
		}
		goto fail;
	}
	struct stat st;
	if (fstat(m.fd, &st) < 0) {
		rc = -errno;
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		why = "not a regular file";
		rc = -EINVAL;
		goto fail;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		why = "larger than this process can map";
		rc = -EFBIG;
		goto fail;
	}
	rc = read_through(m.fd, (size_t)st.st_size, &m.size);
	if (rc < 0) {
		if (rc != -ENOMEM) {
			why = "a read error";
			rc = -EIO;
		}
		goto fail;
	}
	if (m.size) {
		void *p = mmap(NULL, m.size, PROT_READ, MAP_PRIVATE, m.fd, 0);
		if (p == MAP_FAILED) {
			rc = -errno;
			goto fail;
		}
		m.map = p;
	}
	rc = queue_file_load(m.size ? (const void *)m.map : "", m.size, &m.ix, &why);
	if (rc < 0)
		goto fail;
	if (strcmp(m.ix.env.id, id) != 0) {
		why = "the envelope's queue ID is not the file's name";
		rc = -EINVAL;
		queue_index_clear(&m.ix);
		goto fail;
	}
	for (size_t i = 0; i < m.ix.nrcpt; i++)
		(*count_of(&m, m.ix.rcpt[i].status))++;
	*ret = m;
	return 0;
fail:
	if (m.map)
		munmap((void *)m.map, m.size);
	if (m.fd >= 0)
		close(m.fd);
	if (ret_why)
		*ret_why = why;
	return rc;
}

void queue_msg_close(struct queue_msg *m)
{
	queue_index_clear(&m->ix);
	if (m->map)
		munmap((void *)m->map, m->size);
	m->map = NULL;
	m->size = 0;
	close_fd(&m->fd);
	m->todo = m->uncertain = m->delivered = m->failed = m->relayed = 0;
}

static int write_byte(int fd, char c, uint64_t off)
{
	for (;;) {
		ssize_t w = pwrite(fd, &c, 1, (off_t)off);
		if (w == 1)
			return 0;
		if (w < 0 && errno == EINTR)
			continue;
		return w < 0 ? -errno : -EIO;
	}
}

int queue_msg_set_status(struct queue_msg *m, size_t rcpt_index, char status)
{
	if (rcpt_index >= m->ix.nrcpt || !status_ok(m, status))
		return -EINVAL;
	struct queue_rcpt *r = &m->ix.rcpt[rcpt_index];
	int rc = write_byte(m->fd, status, r->status_off);
	if (rc < 0)
		return rc;
	(*count_of(m, r->status))--;
	(*count_of(m, status))++;
	r->status = status;
	return 0;
}

int queue_msg_set_control(struct queue_msg *m, unsigned which, char byte)
{
	bool ok;
	switch (which) {
	case QUEUE_CTL_HOLD:
		ok = byte == '-' || byte == 'H';
		break;
	case QUEUE_CTL_BOUNCE:
		ok = byte == '-' || byte == 'P' || byte == 'S';
		break;
	case QUEUE_CTL_WARNED:
		ok = byte == '-' || byte == 'W';
		break;
	default:
		ok = which < QUEUE_CONTROL_LEN && byte == '-';
		break;
	}
	if (!ok)
		return -EINVAL;
	int rc = write_byte(m->fd, byte, m->ix.control_off + which);
	if (rc == 0)
		m->ix.control[which] = byte;
	return rc;
}

int queue_msg_sync(struct queue_msg *m)
{
	return fdatasync(m->fd) < 0 ? -errno : 0;
}

enum queue_msg_state queue_msg_state(const struct queue_msg *m)
{
	if (m->todo || m->uncertain)
		return QUEUE_MSG_ACTIVE;
	/* N: delivered, a relayed notice owed (made with the bounce) */
	if ((m->failed || m->relayed) && m->ix.control[QUEUE_CTL_BOUNCE] != 'S')
		return QUEUE_MSG_BOUNCE_DUE;
	return QUEUE_MSG_FINISHED;
}

int queue_msg_remove(struct queue_dir *qd, const char *id)
{
	if (!id_ok(id))
		return -EINVAL;
	int h = bucket(id);
	/* the message first: a crash between the two leaves an orphan log, which recovery
	 * removes, never a message without its history */
	int rc = unlinkat(qd->msg[h], id, 0) < 0 ? -errno : 0;
	if (unlinkat(qd->log[h], id, 0) < 0 && errno != ENOENT && rc == 0)
		rc = -errno;
	return rc;
}

/* ---- attempt history ---- */

int queue_log_append(struct queue_dir *qd, const char *id, struct str line)
{
	if (!id_ok(id) || line.len == 0)
		return -EINVAL;
	size_t len = line.len;
	bool nl = line.ptr[len - 1] == '\n';
	if (nl)
		len--;
	if (len == 0 || len > QUEUE_LOG_MAX_LINE || memchr(line.ptr, '\n', len))
		return -EINVAL;
	int fd = openat(qd->log[bucket(id)], id,
			O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	struct iovec iov[2] = { { (void *)line.ptr, line.len }, { (void *)"\n", 1 } };
	size_t total = line.len + (nl ? 0 : 1);
	ssize_t w;
	do
		w = writev(fd, iov, nl ? 1 : 2);
	while (w < 0 && errno == EINTR);
	int rc = w < 0 ? -errno : (size_t)w != total ? -EIO : 0;
	close(fd);
	return rc;
}

int queue_log_read(struct queue_dir *qd, const char *id, struct buf *out, size_t max)
{
	if (!id_ok(id))
		return -EINVAL;
	int fd = openat(qd->log[bucket(id)], id, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	uint64_t size = (uint64_t)st.st_size;
	uint64_t off = size > max ? size - max : 0;
	size_t want = (size_t)(size - off);
	size_t mark = out->len;
	int rc = buf_reserve(out, want);
	size_t got = 0;
	while (rc == 0 && got < want) {
		ssize_t r = pread(fd, out->ptr + mark + got, want - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			rc = -errno;
		else if (r == 0)
			break;
		else
			got += (size_t)r;
	}
	close(fd);
	if (rc < 0) {
		buf_truncate(out, mark);
		return rc;
	}
	size_t skip = 0;
	if (off > 0 && got) {
		/* cut inside a line: keep whole lines only */
		const char *nl = memchr(out->ptr + mark, '\n', got);
		skip = nl ? (size_t)(nl - (out->ptr + mark)) + 1 : got;
		memmove(out->ptr + mark, out->ptr + mark + skip, got - skip);
	}
	buf_truncate(out, mark + got - skip);
	return 0;
}

/* ---- walking the queue ---- */

/* Call fn for each entry of dirfd but "." and "..", through a descriptor of its own (a
 * readdir offset is per open file: scans on several threads do not disturb each other). */
static int dir_each(int dirfd, int (*fn)(void *arg, int h, const struct dirent *de),
		    void *arg, int h)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = -errno;
		close(fd);
		return e;
	}
	int rc = 0;
	for (;;) {
		errno = 0;
		struct dirent *de = readdir(d);
		if (!de) {
			rc = errno ? -errno : 0;
			break;
		}
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		rc = fn(arg, h, de);
		if (rc < 0)
			break;
	}
	closedir(d);
	return rc;
}

struct scan {
	int (*fn)(void *arg, const char *id);
	void *arg;
};

static int scan_one(void *arg, int h, const struct dirent *de)
{
	struct scan *s = arg;
	if (!id_ok(de->d_name) || bucket(de->d_name) != h)
		return 0;
	return s->fn(s->arg, de->d_name);
}

int queue_scan(struct queue_dir *qd, int (*fn)(void *arg, const char *id), void *arg)
{
	struct scan s = { fn, arg };
	for (int h = 0; h < QUEUE_NBUCKETS; h++) {
		int rc = dir_each(qd->msg[h], scan_one, &s, h);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* ---- recovery ---- */

struct queue_recovery {
	struct queue_dir *qd;
	const struct queue_recover_ops *ops;
	void *arg;
	struct queue_recover_stats st;
	/* directories to flush at the end */
	bool tmp_dirty, corrupt_dirty;
	uint32_t msg_dirty, log_dirty;
};

static void report(struct queue_recovery *r, const struct queue_recover_event *ev)
{
	if (r->ops && r->ops->report)
		r->ops->report(r->arg, ev);
}

static void report_error(struct queue_recovery *r, const char *name, const char *what, int error)
{
	r->st.errors++;
	report(r, &(struct queue_recover_event){ .what = QUEUE_RECOVER_ERROR, .name = name,
						 .reason = what, .error = error });
}

static int recover_tmp(void *arg, int h, const struct dirent *de)
{
	struct queue_recovery *r = arg;
	(void)h;
	if (unlinkat(r->qd->tmp, de->d_name, 0) < 0) {
		if (errno != ENOENT)
			report_error(r, de->d_name, "unlink of a file in tmp/", -errno);
		return 0;
	}
	r->tmp_dirty = true;
	r->st.tmp_removed++;
	report(r, &(struct queue_recover_event){ .what = QUEUE_RECOVER_TMP_REMOVED,
						 .name = de->d_name });
	return 0;
}

/* msg/H/name to corrupt/name, or name.1, name.2, ... if taken. */
static void move_corrupt(struct queue_recovery *r, int h, const char *name, const char *reason)
{
	char dest[NAME_MAX + 1];
	int rc = -EEXIST;
	for (unsigned k = 0; k < 1000 && rc == -EEXIST; k++) {
		/* a name as found may be up to NAME_MAX long: room for the suffix */
		if (k == 0)
			fmt_fixed(dest, sizeof(dest), "%.240s", name);
		else
			fmt_fixed(dest, sizeof(dest), "%.240s.%u", name, k);
		rc = rename_noreplace(r->qd->msg[h], name, r->qd->corrupt, dest);
	}
	if (rc == -ENOENT)
		return;
	if (rc < 0) {
		report_error(r, name, "move to corrupt/", rc);
		return;
	}
	r->msg_dirty |= 1u << h;
	r->corrupt_dirty = true;
	r->st.corrupt++;
	report(r, &(struct queue_recover_event){ .what = QUEUE_RECOVER_CORRUPT, .name = name,
						 .reason = reason, .dest = dest });
}

/* A message that loaded: U back to T, a missing 'P' written, then finished or live. */
static int recover_loaded(struct queue_recovery *r, int h, struct queue_msg *m)
{
	const char *id = m->ix.env.id;
	size_t uncertain = m->uncertain;
	bool mark = false;
	int rc = 0;
	for (size_t i = 0; rc == 0 && uncertain && i < m->ix.nrcpt; i++)
		if (m->ix.rcpt[i].status == QUEUE_UNCERTAIN)
			rc = queue_msg_set_status(m, i, QUEUE_TODO);
	if (rc == 0 && !m->todo && !m->uncertain && (m->failed || m->relayed) &&
	    m->ix.control[QUEUE_CTL_BOUNCE] == '-') {
		/* the relay set the last F (or N) and crashed before writing 'P' */
		mark = true;
		rc = queue_msg_set_control(m, QUEUE_CTL_BOUNCE, 'P');
	}
	if (rc == 0 && (uncertain || mark))
		rc = queue_msg_sync(m);
	if (rc < 0) {
		report_error(r, id, "a status or control byte write", rc);
		return 0;
	}
	if (uncertain) {
		r->st.uncertain_reset += uncertain;
		report(r, &(struct queue_recover_event){ .what = QUEUE_RECOVER_UNCERTAIN,
							 .name = id, .count = uncertain });
	}
	if (mark) {
		r->st.bounce_marked++;
		report(r, &(struct queue_recover_event){ .what = QUEUE_RECOVER_BOUNCE_MARKED,
							 .name = id });
	}
	enum queue_msg_state state = queue_msg_state(m);
	if (state == QUEUE_MSG_BOUNCE_DUE && r->ops && r->ops->bounce_due) {
		rc = r->ops->bounce_due(r->arg, m);
		if (rc < 0)
			return rc;
		state = queue_msg_state(m);
	}
	if (state == QUEUE_MSG_FINISHED) {
		if (unlinkat(r->qd->msg[h], id, 0) < 0) {
			if (errno != ENOENT)
				report_error(r, id, "unlink of a finished message", -errno);
			return 0;
		}
		r->msg_dirty |= 1u << h;
		if (unlinkat(r->qd->log[h], id, 0) == 0)
			r->log_dirty |= 1u << h;
		else if (errno != ENOENT)
			report_error(r, id, "unlink of a finished message's log", -errno);
		r->st.finished++;
		report(r, &(struct queue_recover_event){ .what = QUEUE_RECOVER_FINISHED,
							 .name = id });
		return 0;
	}
	r->st.messages++;
	r->st.rcpt_todo += m->todo;
	r->st.rcpt_delivered += m->delivered + m->relayed;
	r->st.rcpt_failed += m->failed;
	if (m->ix.control[QUEUE_CTL_HOLD] == 'H')
		r->st.held++;
	if (state == QUEUE_MSG_BOUNCE_DUE)
		r->st.bounce_due++;
	if (r->ops && r->ops->message)
		return r->ops->message(r->arg, m);
	return 0;
}

/* The checks of a name found in msg/H: 0 when it is a QID of that H that may be a
 * regular file, else it is moved to corrupt/ and 1 is returned. */
static int check_msg_name(struct queue_recovery *r, int h, const struct dirent *de)
{
	const char *name = de->d_name;
	char where[64];
	if (!id_ok(name)) {
		move_corrupt(r, h, name, "the name is not a queue ID");
		return 1;
	}
	if (bucket(name) != h) {
		fmt_fixed(where, sizeof(where), "in msg/%c/ instead of msg/%c/", alphabet[h],
			  name[QUEUE_ID_BUCKET]);
		move_corrupt(r, h, name, where);
		return 1;
	}
	if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) {
		/* not opened: a device or a FIFO could do something when opened */
		move_corrupt(r, h, name, "not a regular file");
		return 1;
	}
	return 0;
}

/* One message file whose name passed check_msg_name(). */
static int recover_one(struct queue_recovery *r, const char *name)
{
	int h = bucket(name);
	struct queue_msg m;
	const char *why = NULL;
	int rc = queue_msg_open(r->qd, name, &m, &why);
	if (rc == -EINVAL || rc == -EIO) {
		move_corrupt(r, h, name, why ? why : "damaged");
		return 0;
	}
	if (rc == -ENOENT)
		return 0;
	if (rc < 0) {
		report_error(r, name, "open", rc);
		return 0;
	}
	rc = recover_loaded(r, h, &m);
	queue_msg_close(&m);
	return rc;
}

/* The names of msg/, gathered by queue_recovery_list(). */
struct id_list {
	struct queue_recovery *r;
	char (*ids)[QUEUE_ID_LEN + 1];
	size_t n, cap;
};

static int list_msg(void *arg, int h, const struct dirent *de)
{
	struct id_list *l = arg;
	if (check_msg_name(l->r, h, de))
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 1024;
		char (*n)[QUEUE_ID_LEN + 1] = realloc(l->ids, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		l->ids = n;
		l->cap = cap;
	}
	memcpy(l->ids[l->n++], de->d_name, QUEUE_ID_LEN + 1);
	return 0;
}

static int id_cmp(const void *a, const void *b)
{
	return memcmp(a, b, QUEUE_ID_LEN);
}

static int recover_log(void *arg, int h, const struct dirent *de)
{
	struct queue_recovery *r = arg;
	const char *name = de->d_name;
	if (!id_ok(name) || bucket(name) != h) {
		char path[NAME_MAX + 16];
		fmt_fixed(path, sizeof(path), "log/%c/%.255s", alphabet[h], name);
		r->st.strays++;
		report(r, &(struct queue_recover_event){
			.what = QUEUE_RECOVER_STRAY, .name = path,
			.reason = "not the log of a queue ID of this directory: left alone" });
		return 0;
	}
	struct stat st;
	if (fstatat(r->qd->msg[h], name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return 0;
	if (errno != ENOENT) {
		report_error(r, name, "stat of a log's message", -errno);
		return 0;
	}
	if (unlinkat(r->qd->log[h], name, 0) < 0) {
		if (errno != ENOENT)
			report_error(r, name, "unlink of an orphan log", -errno);
		return 0;
	}
	r->log_dirty |= 1u << h;
	r->st.orphan_logs++;
	report(r, &(struct queue_recover_event){ .what = QUEUE_RECOVER_ORPHAN_LOG, .name = name });
	return 0;
}

int queue_recovery_new(struct queue_dir *qd, const struct queue_recover_ops *ops, void *arg,
		       struct queue_recovery **ret)
{
	struct queue_recovery *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->qd = qd;
	r->ops = ops;
	r->arg = arg;
	*ret = r;
	return 0;
}

int queue_recovery_tmp(struct queue_recovery *r)
{
	return dir_each(r->qd->tmp, recover_tmp, r, 0);
}

int queue_recovery_list(struct queue_recovery *r, char (**ret)[QUEUE_ID_LEN + 1],
			size_t *ret_n)
{
	struct id_list l = { .r = r };
	int rc = 0;
	for (int h = 0; rc == 0 && h < QUEUE_NBUCKETS; h++)
		rc = dir_each(r->qd->msg[h], list_msg, &l, h);
	if (rc < 0) {
		free(l.ids);
		return rc;
	}
	if (l.n > 1)
		qsort(l.ids, l.n, sizeof(*l.ids), id_cmp);
	*ret = l.ids;
	*ret_n = l.n;
	return 0;
}

int queue_recovery_message(struct queue_recovery *r, const char *id)
{
	if (!id_ok(id))
		return -EINVAL;
	return recover_one(r, id);
}

int queue_recovery_logs(struct queue_recovery *r)
{
	int rc = 0;
	for (int h = 0; rc == 0 && h < QUEUE_NBUCKETS; h++)
		rc = dir_each(r->qd->log[h], recover_log, r, h);
	return rc;
}

int queue_recovery_finish(struct queue_recovery *r, struct queue_recover_stats *ret_stats)
{
	if (!r)
		return 0;
	struct queue_dir *qd = r->qd;
	/* one flush per directory changed, even after a failure: what was done stays done */
	int frc = 0;
	if (r->tmp_dirty && fsync(qd->tmp) < 0)
		frc = -errno;
	if (r->corrupt_dirty && fsync(qd->corrupt) < 0 && frc == 0)
		frc = -errno;
	for (int h = 0; h < QUEUE_NBUCKETS; h++) {
		if ((r->msg_dirty & (1u << h)) && fsync(qd->msg[h]) < 0 && frc == 0)
			frc = -errno;
		if ((r->log_dirty & (1u << h)) && fsync(qd->log[h]) < 0 && frc == 0)
			frc = -errno;
	}
	if (ret_stats)
		*ret_stats = r->st;
	free(r);
	return frc;
}

int queue_recover(struct queue_dir *qd, const struct queue_recover_ops *ops, void *arg,
		  struct queue_recover_stats *ret_stats)
{
	struct queue_recovery *r;
	int rc = queue_recovery_new(qd, ops, arg, &r);
	if (rc < 0)
		return rc;
	char (*ids)[QUEUE_ID_LEN + 1] = NULL;
	size_t n = 0;
	rc = queue_recovery_tmp(r);
	if (rc == 0)
		rc = queue_recovery_list(r, &ids, &n);
	for (size_t i = 0; rc == 0 && i < n; i++)
		rc = queue_recovery_message(r, ids[i]);
	free(ids);
	/* after msg/: the logs of messages it removed are gone, the logs of messages it
	 * moved to corrupt/ are orphans now */
	if (rc == 0)
		rc = queue_recovery_logs(r);
	struct queue_recover_stats st;
	int frc = queue_recovery_finish(r, &st);
	if (rc == 0)
		rc = frc;
	if (rc == 0 && ret_stats)
		*ret_stats = st;
	return rc;
}

int queue_dir_root(const struct queue_dir *qd)
{
	return qd->root;
}
