/*
 * queue_dir -- the queue's files on disk (doc/QUEUE.md): the directory layout and its
 * lock, creating a message under tmp/, the group commit into msg/H/, opening a committed
 * message and changing its status and control bytes in place, the attempt history in
 * log/H/, and recovery at start.
 *
 * Synchronous system calls only: no threads of its own, no event loop.  The daemon's
 * committer (a helper thread) and the intake call it; the relay changes statuses.
 *
 * Invariants kept:
 *   - A file appears under msg/H/QID only through queue_commit(), after a flush of its
 *     data, and is durable when queue_commit() returns 0 (the commit point of
 *     doc/QUEUE.md).  A failed commit leaves nothing of its batch in tmp/ or msg/.
 *   - A committed file is never rewritten, truncated or replaced: status and control
 *     bytes change by one-byte pwrite()s at the offsets the loader indexed.
 *   - This layer logs nothing above debug.  Events go back to the caller as return values
 *     and recovery reports (queue_recover_ops.report), so the daemon logs each once, with
 *     context.
 *
 * Thread safety: a struct queue_dir holds only file descriptors opened by
 * queue_dir_open() and never changed after it, plus the commit lock.  queue_tmp_create(),
 * queue_tmp_abandon(), queue_commit(), queue_msg_open(), queue_msg_remove(),
 * queue_log_append(), queue_log_read() and queue_scan() may be called from several threads
 * at the same time on one queue_dir.  queue_commit() serialises its callers on the commit
 * lock (a second syncfs running at the same time would flush nothing more, and a
 * writeback error must be reported to exactly one batch).  A struct queue_msg belongs to
 * one thread at a time.  queue_recover() must run alone, before any of the others;
 * recovery in steps (queue_recovery_*) may run beside them.  queue_dir_free() after
 * every user is done.
 *
 * Errors: functions return 0 (or a file descriptor, where said) or a negative errno;
 * out-parameters start with ret_ and are untouched on failure.
 */
#ifndef SLUICE_QUEUE_DIR_H
#define SLUICE_QUEUE_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "queue_file.h"
#include "str.h"

/* H directories: one per Crockford base32 character, character QUEUE_ID_BUCKET of a QID. */
#define QUEUE_NBUCKETS 32
/* The longest line queue_log_append() takes. */
#define QUEUE_LOG_MAX_LINE 4096

struct queue_dir;

/*
 * Open the queue directory path (which must exist): check that it is a directory this
 * process can write, take flock(LOCK_EX|LOCK_NB) on path/lock (two sluiced never share a
 * queue), create tmp/, msg/<H>/ (32), log/<H>/ (32) and corrupt/ where missing (mode 0700,
 * owned by the calling process: call it after dropping privileges, or chown), flush the
 * directories it created, and check that all of them are on path's filesystem (renames
 * must be atomic and one syncfs must cover them).  Keeps a directory fd of the root, of
 * tmp/, corrupt/ and each msg/H and log/H open until queue_dir_free().
 *
 * 0 with *ret, or a negative errno with a sentence for the operator in err (which names
 * the path; "another sluiced uses this queue directory" when the lock is held: -EAGAIN).
 */
int queue_dir_open(const char *path, struct queue_dir **ret, char *err, size_t errlen);
/* Close everything and release the lock.  NULL is fine; returns NULL. */
struct queue_dir *queue_dir_free(struct queue_dir *qd);
/* Bytes the queue's file system has free for an unprivileged writer (statvfs f_bavail),
 * in *ret_bytes; 0 or the errno of fstatvfs(). */
int queue_dir_free_space(struct queue_dir *qd, uint64_t *ret_bytes);

/* ---- a message being written ---- */

/*
 * Create tmp/ID (O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, 0600) and return its fd (>= 0), the
 * caller's to write and close; -EINVAL for an ID that is not a QID, -EEXIST, or the
 * errno of openat().
 */
int queue_tmp_create(struct queue_dir *qd, const char *id);
/* Unlink tmp/ID (RSET, QUIT, a refused DATA, a failed write).  0 also when it is already
 * gone.  The caller closes its fd whenever it likes. */
int queue_tmp_abandon(struct queue_dir *qd, const char *id);

/* ---- the group commit ---- */

/*
 * Counters of queue_commit(), added to (never reset) under the commit lock, so several
 * committers may share one.  Flushes = syncfs + file_syncs + dir_syncs; the benchmark
 * reports flushes per message.
 */
struct queue_commit_stats {
	uint64_t batches;          /* calls that committed their batch */
	uint64_t messages;         /* messages committed */
	uint64_t failed_batches;
	uint64_t failed_messages;
	uint64_t syncfs;           /* syncfs() calls */
	uint64_t file_syncs;       /* fdatasync() of a tmp file (see queue_commit) */
	uint64_t dir_syncs;        /* fsync() of a msg/H directory */
};

/*
 * Commit the written files tmp/ids[0..n-1] (each complete, end record written): one
 * syncfs() of the queue's filesystem, then renameat(tmp/ID, msg/H/ID) for each (never
 * over an existing msg/H/ID), then one fsync() per msg/H directory touched.  When this
 * returns 0 every message of the batch is committed: the caller may answer 250.
 *
 * All or nothing: on any failure every file of the batch is unlinked (from msg/H where
 * it was already renamed, from tmp/ otherwise) and the first error is returned: -ENOSPC
 * or -EDQUOT (the disk is full: 452 4.3.1), -EINVAL (an ID that is not a QID), -ENOENT
 * (a tmp file that does not exist), -EEXIST (msg/H/ID already exists), -EIO and others
 * (451 4.3.0).
 *
 * The caller need not close the tmp fds first: syncfs() flushes the data of files still
 * open, and a rename does not care about open descriptors.  After a success its fd
 * refers to the committed file: close it, and write nothing more through it (queue files
 * are never rewritten).  After a failure its fd refers to an unlinked file: close it.
 *
 * Per-file fdatasync() instead of syncfs(): only where syncfs() is unavailable (ENOSYS),
 * and after a syncfs() has once failed on this queue_dir.  XXX syncfs() reports a
 * writeback error once, to one caller, and cannot say which file it hit: an error in a
 * file still being written could have been reported to an earlier batch, and a later
 * syncfs() would succeed although that file lost data.  A file's own error stays
 * pending on it until an fsync of that file, so after the first syncfs() failure every
 * batch flushes file by file for the rest of the process's life (slower, exact).  The
 * daemon should log the first failure loudly.  Linux reports writeback errors to
 * syncfs() since 5.8.
 *
 * st may be NULL.
 */
int queue_commit(struct queue_dir *qd, const char *const *ids, size_t n,
		 struct queue_commit_stats *st);

/* ---- a committed message ---- */

/*
 * An open committed message.  Read the fields; change them only through the functions
 * below.  ix's slices point into map.
 */
struct queue_msg {
	int fd;                    /* msg/H/ID, O_RDWR */
	const unsigned char *map;  /* the file, mapped read-only (MAP_PRIVATE) */
	size_t size;
	struct queue_index ix;     /* kept current by queue_msg_set_status/_control */
	/* recipients by status, kept current by queue_msg_set_status(); relayed: N */
	size_t todo, uncertain, delivered, failed, relayed;
};

/*
 * Open msg/H/ID: open it O_RDWR, read it through once (so that a disk read error is
 * -EIO here, not a SIGBUS later through the map), map it, index it with
 * queue_file_load(), and check that the envelope's ID is the file's name.
 *
 * 0 with *ret filled; -ENOENT when the file is gone; -EINVAL with *ret_why (a static
 * string) when it is damaged or not a regular file; -EIO with *ret_why when it cannot be
 * read; -EFBIG (with *ret_why) when it is larger than the address space; -ENOMEM; other
 * errnos of open/fstat/mmap.  ret_why may be NULL.
 *
 * XXX while mapped the file must not shrink (queue files never do): a read of a page past
 * its end, or a page the disk fails to read again after the check, raises SIGBUS.
 */
int queue_msg_open(struct queue_dir *qd, const char *id, struct queue_msg *ret,
		   const char **ret_why);
/* Unmap, close, free the index.  Only on a message queue_msg_open() filled; it may be
 * closed once. */
void queue_msg_close(struct queue_msg *m);

/*
 * Recipient rcpt_index's status byte becomes status (T, U, D, F, or N in a version 2
 * file): one pwrite() of one
 * byte at its indexed offset; the index and the counts follow.  -EINVAL for a bad status
 * or index, -EIO for a short write, or the errno of pwrite().  Not flushed: see
 * queue_msg_sync().  O(1).
 */
int queue_msg_set_status(struct queue_msg *m, size_t rcpt_index, char status);
/*
 * Control byte which (enum queue_control) becomes byte: QUEUE_CTL_HOLD '-' or 'H',
 * QUEUE_CTL_BOUNCE '-', 'P' or 'S', the reserved ones only '-'.  One pwrite() of one
 * byte; not flushed.
 */
int queue_msg_set_control(struct queue_msg *m, unsigned which, char byte);
/* Flush the status and control changes made so far: one fdatasync() for all of them. */
int queue_msg_sync(struct queue_msg *m);

/* The state of a message (doc/QUEUE.md, "States of a message"), from its counts. */
enum queue_msg_state {
	QUEUE_MSG_ACTIVE = 0,      /* some T or U */
	QUEUE_MSG_BOUNCE_DUE,      /* no T/U, some F or N, control[1] is not 'S' */
	QUEUE_MSG_FINISHED,        /* no T/U, and no F/N or control[1] = 'S' */
};
enum queue_msg_state queue_msg_state(const struct queue_msg *m);

/*
 * Unlink msg/H/ID, then log/H/ID (a log that does not exist is fine).  -ENOENT when the
 * message did not exist (its log is unlinked all the same).  Not flushed: a finished
 * message that comes back after a crash is removed again by recovery.
 */
int queue_msg_remove(struct queue_dir *qd, const char *id);

/* ---- attempt history ---- */

/*
 * Append line to log/H/ID (created 0600 if missing; O_APPEND), adding '\n' if it has
 * none, in one write(): lines of concurrent writers never interleave.  No fsync: the log
 * is advisory history, and a line lost in a crash loses nothing of the mail.  -EINVAL for
 * a bad ID, an empty line, a '\n' inside the line or more than QUEUE_LOG_MAX_LINE bytes.
 */
int queue_log_append(struct queue_dir *qd, const char *id, struct str line);
/*
 * Append the last max bytes (at most) of log/H/ID to out, starting at a line's start
 * when the log was cut.  0 with nothing appended when the message has no log; -ENOBUFS
 * when out cannot take them (out keeps what it had).
 */
int queue_log_read(struct queue_dir *qd, const char *id, struct buf *out, size_t max);

/* ---- walking the queue ---- */

/*
 * Call fn with the ID of each file in msg/ (names that are QIDs in their right H
 * directory), in no order.  fn returns < 0 to stop, and that is returned.  Files may come
 * and go during the scan: one committed or removed meanwhile may or may not be seen.
 */
int queue_scan(struct queue_dir *qd, int (*fn)(void *arg, const char *id), void *arg);

/* ---- recovery at start ---- */

enum queue_recover_what {
	QUEUE_RECOVER_TMP_REMOVED = 0, /* name: a file of tmp/ was unlinked */
	QUEUE_RECOVER_CORRUPT,         /* name moved to corrupt/dest: reason */
	QUEUE_RECOVER_UNCERTAIN,       /* name: count recipients U set back to T */
	QUEUE_RECOVER_BOUNCE_MARKED,   /* name: no T/U, an F or N, control[1] '-': set to 'P' */
	QUEUE_RECOVER_FINISHED,        /* name: finished, unlinked with its log */
	QUEUE_RECOVER_ORPHAN_LOG,      /* name: log/H/name without its message, unlinked */
	QUEUE_RECOVER_STRAY,           /* name (a path under the queue): not sluice's, left */
	QUEUE_RECOVER_ERROR,           /* name: reason failed with error; left in place */
	QUEUE_RECOVER_LOADED,          /* the queue (queue.c's loader) is loaded: count
					* live messages in elapsed_ms */
};

struct queue_recover_event {
	enum queue_recover_what what;
	const char *name;          /* the QID, or the file's name as found (any bytes but
				    * '/' and NUL: quote it in a log line) */
	const char *reason;        /* CORRUPT, STRAY, ERROR: why (static or short-lived) */
	const char *dest;          /* CORRUPT: the name under corrupt/ (may have a suffix) */
	size_t count;              /* UNCERTAIN */
	int error;                 /* ERROR: a negative errno */
	uint64_t elapsed_ms;       /* LOADED */
};

/*
 * The caller's part of recovery.  Any member may be NULL.  m is valid only during the
 * call (it is closed after): copy what you keep.  A callback returning < 0 stops
 * recovery, and that is returned.
 */
struct queue_recover_ops {
	/* every event worth a log line */
	void (*report)(void *arg, const struct queue_recover_event *ev);
	/* A message whose bounce is due (no T/U, some F or N, control[1] 'P').  The caller may
	 * commit the DSN, then queue_msg_set_control(m, QUEUE_CTL_BOUNCE, 'S') and
	 * queue_msg_sync(m): the message is then finished and removed.  Otherwise it stays,
	 * and message() is called for it next. */
	int (*bounce_due)(void *arg, struct queue_msg *m);
	/* Every message that stays in the queue (active, held, bounce due), after its U
	 * recipients were set back to T: for the daemon's in-memory index. */
	int (*message)(void *arg, const struct queue_msg *m);
};

struct queue_recover_stats {
	size_t messages;           /* live messages handed to message() */
	size_t rcpt_todo;          /* their recipients by status (U were set to T) */
	size_t rcpt_delivered;     /* D and N */
	size_t rcpt_failed;
	size_t held;               /* live messages with control[0] 'H' */
	size_t bounce_due;         /* live messages whose bounce is due */
	size_t tmp_removed;
	size_t corrupt;            /* files moved to corrupt/ */
	size_t finished;           /* finished messages removed */
	size_t uncertain_reset;    /* recipients U set back to T */
	size_t bounce_marked;      /* messages whose control[1] was set to 'P' */
	size_t orphan_logs;
	size_t strays;             /* files left alone (not sluice's, not in msg/) */
	size_t errors;             /* files an operation failed on, left in place */
};

/*
 * Recovery, per the table of doc/QUEUE.md:
 *   - tmp/: every file is unlinked;
 *   - msg/H/NAME: a NAME that is not a QID, or not in its H, or not a regular file, or a
 *     file that does not load (queue_msg_open's reason), is moved to corrupt/NAME (or
 *     corrupt/NAME.1, .2, ...: never over an existing file);
 *   - recipients U are set back to T (one-byte writes, one fdatasync per message);
 *   - no T/U, an F and control[1] '-' (the relay crashed between the last F and 'P';
 *     not in the table of doc/QUEUE.md): control[1] is set to 'P', then as below;
 *   - bounce due: ops->bounce_due(), then finished or live as it left the message;
 *   - finished: msg/H/QID and log/H/QID are unlinked;
 *   - live: ops->message();
 *   - log/H/QID without msg/H/QID is unlinked; a name in log/ that is not a QID of
 *     that H is reported STRAY and left alone (not in the table);
 * and at the end one fsync of each directory it changed.
 *
 * A failure on one file (an unlink, a rename, a status write, ENOMEM while loading) is
 * reported QUEUE_RECOVER_ERROR, counted in errors, and leaves that file where it was
 * (a message so left is not handed to message(): it waits for the next start).  A
 * failure to read a directory, or to flush one at the end, returns its errno.  A second
 * run finds nothing more to do.  0 with *ret_stats (may be NULL).
 */
int queue_recover(struct queue_dir *qd, const struct queue_recover_ops *ops, void *arg,
		  struct queue_recover_stats *ret_stats);

/*
 * Recovery in steps, for a caller that recovers the queue while it already runs (the
 * daemon's loader thread, queue.c): queue_recover() is these in order.  One struct
 * queue_recovery belongs to one thread; the other functions of this file may run on
 * other threads meanwhile (new messages get IDs no file of msg/ has, and recovery
 * touches only the files it found).  ops and arg are kept until queue_recovery_finish().
 *
 *   queue_recovery_tmp()      unlink every file of tmp/ -- before anything is written
 *                             there;
 *   queue_recovery_list()     the QIDs of msg/, sorted (= in order of arrival), in a
 *                             malloc'ed array; a name that is not a QID of its H, or a
 *                             file that is not regular, is moved to corrupt/ on the way;
 *   queue_recovery_message()  one of them, as the table says (a file gone meanwhile is
 *                             skipped);
 *   queue_recovery_logs()     orphan logs;
 *   queue_recovery_finish()   one fsync of each directory changed, the counts, and r
 *                             is freed (NULL is fine).
 *
 * Each returns 0 or a negative errno as queue_recover() does.
 */
struct queue_recovery;
int queue_recovery_new(struct queue_dir *qd, const struct queue_recover_ops *ops, void *arg,
		       struct queue_recovery **ret);
int queue_recovery_tmp(struct queue_recovery *r);
int queue_recovery_list(struct queue_recovery *r, char (**ret)[QUEUE_ID_LEN + 1],
			size_t *ret_n);
int queue_recovery_message(struct queue_recovery *r, const char *id);
int queue_recovery_logs(struct queue_recovery *r);
int queue_recovery_finish(struct queue_recovery *r, struct queue_recover_stats *ret_stats);

/* The queue directory's own descriptor (for the retry journal's files beside msg/). */
int queue_dir_root(const struct queue_dir *qd);

#endif
