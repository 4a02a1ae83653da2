/*
 * queue_journal -- the retry journal's files (doc/QUEUE.md, "Retry times"): the
 * generations retry.N in the queue directory, appended to in records of queue_retry.h,
 * read back at start, and compacted into a snapshot.
 *
 * Appends go to the newest generation, one write() each (O_APPEND, no flush: kill -9
 * loses nothing, a power cut at worst the last records = an early retry).  Compaction
 * first rotates (appends go to a new generation from then on), then writes the live
 * state into retry.tmp, which starts with a snapshot record, flushes it and renames it
 * over the last old generation; the older ones are then unlinked.  A reader starts at
 * the newest generation that begins with a snapshot record and applies every record
 * from there in order: the last record of a recipient wins.
 *
 * Threads: queue_journal_append() and queue_journal_rotate() under the caller's lock
 * (queue.c's ix_lock); everything else on one thread (the queue's loader), which alone
 * loads and compacts.
 */
#ifndef SLUICE_QUEUE_JOURNAL_H
#define SLUICE_QUEUE_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "queue_retry.h"

struct queue_journal;

/*
 * Find the generations under the directory dirfd (kept, not closed here), remove a
 * retry.tmp left by a crash, and open the generation appends go to: a new one, or the
 * newest when it is empty.  0 with *ret, or -errno.  Reads no record.
 */
int queue_journal_open(int dirfd, struct queue_journal **ret);
struct queue_journal *queue_journal_free(struct queue_journal *j);

/* Append len bytes (whole records) in one write().  0 or -errno (-EIO: short). */
int queue_journal_append(struct queue_journal *j, const void *p, size_t len);

struct queue_journal_load_stats {
	size_t files;             /* generations read */
	size_t records;           /* intact STATE records */
	size_t skipped_bytes;     /* torn or damaged */
};
/*
 * Read the generations that were there at open, from the newest snapshot on, calling
 * fn(arg, rec) for each intact STATE record in order.  A file that cannot be read is
 * skipped (counted nowhere: its records are lost, an early retry).  0, or fn's < 0.
 */
int queue_journal_load(struct queue_journal *j,
		       int (*fn)(void *arg, const struct queue_retry_rec *r), void *arg,
		       struct queue_journal_load_stats *ret_stats);

/* Compaction.  rotate: appends go to a new generation (under the caller's lock); 0 or
 * -errno (appends then stay where they were). */
int queue_journal_rotate(struct queue_journal *j);
/* Create retry.tmp and write its snapshot record (taken at now_us).  0 or -errno. */
int queue_journal_snapshot_begin(struct queue_journal *j, uint64_t now_us);
/* Write records to retry.tmp.  0 or -errno. */
int queue_journal_snapshot_write(struct queue_journal *j, const void *p, size_t len);
/* fsync retry.tmp, rename it over the last generation before the rotation, fsync the
 * directory, unlink the older ones.  0 or -errno (then as abort). */
int queue_journal_snapshot_commit(struct queue_journal *j);
/* Remove retry.tmp: the generations stay as they are, and load the same. */
void queue_journal_snapshot_abort(struct queue_journal *j);

#endif
