/*
 * queue -- the queue as the daemon runs it (doc/QUEUE.md): its directory, the committer
 * thread that flushes new messages in batches, and an in-memory index of what is queued.
 *
 * New messages are written by the intake on its worker thread (queue_new_*: write() into
 * tmp/, which only reaches the page cache), then handed to the committer, one helper
 * thread that makes them durable in groups: one syncfs, the renames, one fsync per msg/H
 * directory (queue_dir.c).  The session is told the result through a callback that runs
 * on the committer thread (the intake bounces it to its own worker with worker_call()).
 *
 * The index (queue_table.h) holds, for each committed message, what `sluice queue` lists
 * and what the relay schedules from: id, arrival, size, sender, hold flag, and each
 * recipient with its status and its retry state (next attempt, attempts made).  It is
 * filled by the loader, a helper thread that queue_start() starts to recover msg/ in the
 * background, in order of arrival, announcing each message to the listener as it goes
 * in (delivery starts as the queue loads), and by each commit; it is kept under a mutex:
 * the loader and the committer insert, control commands on any worker and the relay read
 * and change it.
 *
 * Retry state survives a restart in the retry journal (queue_journal.h, doc/QUEUE.md
 * "Retry times"): each change is one record appended, no queue file is rewritten.  The
 * loader reads the journal before the messages and applies its last record of each
 * recipient as the message goes in; once the load is over it also compacts the journal.
 *
 * Invariants: a message is in the index only after its commit point; a failed batch
 * leaves nothing in tmp/ or msg/ (queue_dir.c) and nothing in the index; queue_free()
 * answers every commit handed over before it returns.
 */
#ifndef SLUICE_QUEUE_H
#define SLUICE_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "queue_dir.h"
#include "queue_file.h"
#include "queue_select.h"
#include "str.h"

struct queue;
struct queue_new;

struct queue_conf {
	const char *dir;
	unsigned commit_batch;   /* messages per batch at most */
	/* the retry journal is compacted when it holds more records than this and than
	 * twice the recipients with a retry state; 0: 65536 */
	uint64_t retry_compact_min;
};

/* Recovery's events, for the daemon's log: tmp/'s on the thread of queue_open(), the
 * others on the loader thread; the last is QUEUE_RECOVER_LOADED. */
typedef void queue_report_fn(void *arg, const struct queue_recover_event *ev);

/*
 * Open the directory (creating its layout, taking its lock), clean tmp/ and open the
 * retry journal: only what is quick, whatever the queue holds.  The index is empty
 * until queue_start()'s loader fills it.  0 and *ret, or <0 with err set (the daemon
 * refuses to start: the directory is missing and cannot be made, not writable, locked
 * by another sluiced).  Each recovery event is passed to report.  Nothing is committed
 * before queue_start().
 */
int queue_open(const struct queue_conf *conf, queue_report_fn *report, void *arg,
	       struct queue **ret, char *err, size_t errlen);
/* Start the committer thread and the loader: after the daemon has forked into the
 * background (a fork keeps only the calling thread; the lock taken by queue_open()
 * survives it).  0 or -errno. */
int queue_start(struct queue *q);
/* Wait until the loader has put every message of msg/ in the index (tests and tools):
 * 0, or -EAGAIN when the load was stopped or never started. */
int queue_wait_loaded(struct queue *q);
/*
 * At shutdown, while the workers still run: stop the loader (at its next file; what it
 * did not reach is loaded at the next start) and wait for it, refuse new commits
 * (-ESHUTDOWN) and wait until every commit handed over is done and its done() called,
 * so that every answer is posted to its worker before the workers stop.  After it the
 * listener is called no more.
 */
void queue_drain(struct queue *q);
/* Stop the committer (what was handed over is committed and answered first), close
 * everything. */
struct queue *queue_free(struct queue *q);

/* ---- a new message ---- */
/*
 * Begin a message: make its ID, create tmp/ID, write the start, envelope and control
 * records (env->id and env->arrival_us are filled in here).  0 and *ret, or <0: -errno
 * of the file system (ENOSPC: the disk is full), -EINVAL (a field over its limit).
 */
int queue_new_begin(struct queue *q, struct queue_envelope *env, struct queue_new **ret);
const char *queue_new_id(const struct queue_new *n);
/* Body bytes given so far (the message as stored). */
uint64_t queue_new_size(const struct queue_new *n);
/* Recipients: all of them before the first body chunk. */
int queue_new_rcpt(struct queue_new *n, struct str addr);
/* With its DSN parameters (queue_write_rcpt_dsn() in queue_file.h). */
int queue_new_rcpt_dsn(struct queue_new *n, struct str addr, unsigned notify, struct str orcpt);
/* Body bytes, any length; written to the file when 64 KiB have gathered. */
int queue_new_body(struct queue_new *n, struct str data);
/*
 * Write the end record and hand the message to the committer; n belongs to the queue
 * from here on.  done(arg, r) is called once, on the committer thread: r = 0 when the
 * message is committed (its commit point passed), or -errno (ENOSPC: disk full) and
 * nothing of it is left.  Returns <0 (and calls nothing; n is freed and its file
 * removed) when the end cannot even be written.
 */
int queue_new_commit(struct queue_new *n, void (*done)(void *arg, int r), void *arg);
/* Give up a message before its commit: its file is removed.  NULL is accepted. */
void queue_new_abort(struct queue_new *n);

/* ---- the index ---- */
struct queue_stats {
	uint64_t messages;       /* in the queue now */
	uint64_t recipients;     /* of those: recipients not finished (T or U) */
	uint64_t held;
	uint64_t oldest_us;      /* arrival of the oldest message, 0 if empty */
	uint64_t commits;        /* messages committed since start */
	uint64_t batches;        /* commit batches */
	uint64_t syncs;          /* syncfs() calls */
	uint64_t dir_syncs;      /* directory fsync() calls */
	uint64_t commit_errors;  /* messages whose commit failed */
	uint64_t bytes;          /* sizes of the messages in the queue now */
	uint64_t accepted_bytes; /* sizes of the messages committed since start */
	uint64_t rcpt_todo;      /* recipients by status byte: T, U, D, F */
	uint64_t rcpt_uncertain;
	uint64_t rcpt_delivered;
	uint64_t rcpt_failed;
	/* the load of msg/ at start (the index is partial while loading) */
	bool loading;
	uint64_t load_total;     /* messages found in msg/ (0 until they are listed) */
	uint64_t load_done;      /* of those, processed (loaded, repaired or set aside) */
	uint64_t load_ms;        /* how long it took, or has taken so far */
	/* the retry journal */
	uint64_t retry_live;     /* recipients with a retry state */
	uint64_t retry_records;  /* records in the journal's files (about) */
};
void queue_stats(struct queue *q, struct queue_stats *ret);

/*
 * Walks of the index for `sluice queue`, in batches: each call holds the index's lock
 * once, for at most QUEUE_WALK_SCAN messages, and moves the cursor past the last one it
 * looked at; the next call goes on from the ID after it, so a message committed or
 * removed meanwhile is seen or not, and none is seen twice.  With sel->ids the walk goes
 * through those IDs instead of the index (c->missing counts the ones not in it).
 */
#define QUEUE_WALK_SCAN 4096
struct queue_cursor {
	char last[QUEUE_ID_LEN + 1]; /* the last ID looked at; "" before the first */
	size_t next_id;              /* with sel->ids: the next of them */
	uint64_t missing;            /* with sel->ids: IDs not in the index */
	bool done;                   /* the walk is over */
};
struct queue_list_totals {
	uint64_t messages, recipients, bytes; /* recipients: pending (T or U) */
};
/* The last bytes of a message's attempt log that a listing reads, for each recipient's
 * last reply (a recipient whose last line is older than that shows none). */
#define QUEUE_LIST_LOG_MAX 16384
/*
 * `sluice queue`: the next (at most max) messages that sel selects, appended to out: in
 * text, a line for the message ("ID[!] SIZE ARRIVAL <SENDER>") and one for each
 * recipient (status, next attempt, attempts) with its last reply; with json, one object
 * a line.  The entries are copied under the lock; their attempt logs are read and the
 * text formatted after it is released.  now_us: the clock for "next attempt in ...".
 * 0, or -ENOMEM (the cursor is where it was).
 */
int queue_list_step(struct queue *q, const struct queue_select *sel, uint64_t now_us,
		    bool json, size_t max, struct queue_cursor *c,
		    struct queue_list_totals *tot, struct buf *out);
/* The IDs of the next (at most max) messages that sel selects, into ret[]. */
int queue_select_ids(struct queue *q, const struct queue_select *sel, uint64_t now_us,
		     size_t max, struct queue_cursor *c, char (*ret)[QUEUE_ID_LEN + 1],
		     size_t *ret_n);
/* `sluice queue summary`: count the pending recipients of the next messages that sel
 * selects into sum, by recipient domain (or by_sender: by the sender's domain, "<>" for
 * the null sender).  With a recipient selector (domain, state) only the recipients it
 * picks count.  0 or -ENOMEM (a recipient counted in the total only). */
int queue_summary_step(struct queue *q, const struct queue_select *sel, uint64_t now_us,
		       bool by_sender, struct queue_cursor *c, struct queue_summary *sum);
/* Is the loader still filling the index?  With its progress. */
bool queue_loading(struct queue *q, uint64_t *ret_done, uint64_t *ret_total);
/* `sluice queue show ID`: envelope, control and status bytes, the attempt history. */
int queue_show(struct queue *q, const char *id, bool json, struct buf *out);
/* Hold ('H') or release ('-') a message: one byte written and flushed.  0, -ENOENT (also
 * for a message the loader has not reached yet). */
int queue_hold(struct queue *q, const char *id, bool hold);
/* Remove a message from the queue (its file and its log).  0, -ENOENT (also for a
 * message the loader has not reached yet). */
int queue_delete(struct queue *q, const char *id);
/* Make a message eligible for its next delivery attempt at once, whatever its retry time
 * (the relay still keeps its lane's budget): every recipient's next attempt becomes 0
 * (journaled; attempts are kept) and the listener gets QUEUE_EV_FLUSH.  0, -ENOENT, or
 * the errno of the journal's write (the index is changed all the same). */
int queue_flush(struct queue *q, const char *id);
/* Fail the message's pending recipients now, with a DSN to its sender ("5.0.0 returned
 * by the administrator"): the listener gets QUEUE_EV_BOUNCE and the relay, which owns the
 * status bytes, does it.  0, -ENOENT (also for a message the loader has not reached). */
int queue_bounce(struct queue *q, const char *id);
/* The IDs of every message, in arrival order; *ret is malloc'ed. */
int queue_ids(struct queue *q, char (**ret)[QUEUE_ID_LEN + 1], size_t *ret_n);

/* ---- the relay's side ---- */

/* What happened to a message, for the relay (which keeps its own view of what to send). */
enum queue_event {
	QUEUE_EV_NEW = 0,     /* committed: its commit point passed */
	QUEUE_EV_HOLD,        /* `sluice queue hold` */
	QUEUE_EV_RELEASE,
	QUEUE_EV_DELETE,
	QUEUE_EV_FLUSH,       /* `sluice queue flush`: eligible now (budgets still apply) */
	QUEUE_EV_BOUNCE,      /* `sluice queue bounce`: its pending recipients fail now */
};
/*
 * fn(arg, ev, id) is called after each event, on the thread that caused it (the
 * committer for NEW, a control worker for the others), with no queue lock held.  Set it
 * before queue_start(); NULL removes it.
 */
typedef void queue_listen_fn(void *arg, enum queue_event ev, const char *id);
void queue_set_listener(struct queue *q, queue_listen_fn *fn, void *arg);
/* The directory, for queue_msg_open() and the attempt log. */
struct queue_dir *queue_directory(struct queue *q);
/* Bytes free on the queue's file system (see queue_dir_free_space); 0 or -errno. */
int queue_free_space(struct queue *q, uint64_t *ret_bytes);
/*
 * Recipient i of the open message m becomes status (T, U, D, F): its byte is written
 * (not flushed: queue_settle) and the index follows.  0 or as queue_msg_set_status().
 */
int queue_set_status(struct queue *q, struct queue_msg *m, size_t i, char status);
/*
 * Control byte `which` of m becomes byte (queue_msg_set_control), and the index follows.
 */
int queue_set_control(struct queue *q, struct queue_msg *m, unsigned which, char byte);
/*
 * Flush the status writes made on m (one fdatasync), then, when m is finished (no T or U,
 * and no F or its bounce sent), remove it: its file, its log and its index entry.  m is
 * left open (the caller closes it).  0 with *ret_state, or the errno of the flush (the
 * message then stays: nothing is removed).
 */
int queue_settle(struct queue *q, struct queue_msg *m, enum queue_msg_state *ret_state);
/* Remove a finished message whose status bytes are already flushed: its file, its log
 * and its index entry (no event).  0 or -ENOENT. */
int queue_remove_finished(struct queue *q, const char *id);

/*
 * Recipient rcpt of message id: its next attempt (µs since the epoch, 0 = at once) and
 * the attempts made so far.  The index changes, and one record is appended to the
 * retry journal (one write, no flush: it survives kill -9; a power cut may lose the last
 * records, which means an early retry).  0, -ENOENT (no such message in the index),
 * -EINVAL (rcpt past its recipients), or the errno of the write (the index is changed
 * all the same: the journal then has the previous value, a late or early retry after
 * a restart, never a lost message).  Any thread; O(log n).
 */
int queue_set_retry(struct queue *q, const char *id, size_t rcpt, uint64_t next_us,
		    uint32_t attempts);
/*
 * The retry state of the first nrcpt recipients of message id, from the index, into
 * ret_next_us[] and ret_attempts[] (either may be NULL; entries past the message's
 * recipients get 0).  0 or -ENOENT (untouched).  Any thread; O(log n + nrcpt).
 */
int queue_get_retry(struct queue *q, const char *id, size_t nrcpt, uint64_t *ret_next_us,
		    uint32_t *ret_attempts);

#endif
