/*
 * queue_int -- the running queue's private declarations, shared by queue.c (the
 * committer, the loader, the index and its changes, removal included) and queue_walk.c
 * (listings and their formatting, selections and the summary, which walk the index in
 * batches).  Calls go one way: queue_walk.c calls queue.c, never the reverse.
 */
#ifndef SLUICE_QUEUE_INT_H
#define SLUICE_QUEUE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "queue.h"
#include "queue_journal.h"
#include "queue_retry.h"
#include "queue_select.h"
#include "queue_table.h"

#define FLUSH_AT QUEUE_BODY_CHUNK       /* bytes gathered before a write() */
#define OUT_MAX (4 * QUEUE_BODY_CHUNK)  /* the buffer's hard limit */

/* A journal record of a message being loaded (sorted by id, rcpt, then seq). */
struct pending {
	char id[QUEUE_ID_LEN];
	uint32_t rcpt;
	uint32_t attempts;
	uint64_t next_us;
	uint64_t seq;
};

struct queue_new {
	struct queue *q;
	struct queue_new *next;  /* the committer's list */
	char id[QUEUE_ID_LEN + 1];
	int fd;
	struct buf out;
	struct queue_writer *w;
	uint64_t arrival_us;
	uint64_t size;
	bool body_started;
	struct buf names;        /* sender, then each recipient, NUL-terminated */
	size_t nrcpt;
	void (*done)(void *arg, int r);
	void *arg;
};

struct queue {
	struct queue_dir *qd;
	unsigned batch_max;
	_Atomic uint32_t seq;

	pthread_t committer;
	bool started;
	pthread_mutex_t lock;            /* the committer's list and stop */
	pthread_cond_t cond;
	struct queue_new *head, **tail;
	bool stop;
	bool closing;                    /* queue_drain(): no new commits */
	bool busy;                       /* a batch is being flushed */
	pthread_cond_t idle;             /* signalled when a batch is done */

	pthread_mutex_t ix_lock;         /* the index, the counters, the journal's appends */
	struct queue_table ix;
	struct queue_commit_stats cst;
	uint64_t commit_errors;
	uint64_t accepted_bytes;

	/* the retry journal: appends under ix_lock; loading and compaction on the loader */
	struct queue_journal *jr;
	uint64_t jr_records;             /* records its files hold (about) */
	uint64_t compact_min;            /* compaction needs more records than this */
	uint64_t compact_floor;          /* ... and than this, after a failed one */
	bool compact_wanted, compacting;
	pthread_cond_t hk_cond;          /* with ix_lock: wakes the loader once it is done */

	/* the loader (queue_start): recovery of msg/ into the index, then compactions */
	pthread_t loader;
	bool loader_started;
	_Atomic bool load_stop;
	struct queue_recovery *rec;      /* from queue_open() to the loader's end */
	queue_report_fn *report;
	void *report_arg;
	bool loading;                    /* under ix_lock, as the four below */
	uint64_t load_total, load_done, load_ms;
	uint64_t load_started_ms;
	pthread_cond_t load_cond;        /* with ix_lock: the load is over */
	struct pending *pend;            /* the loader's: journal records of old messages */
	size_t npend, pend_at;
	bool inserted;                   /* the loader's: the last message went in */

	queue_listen_fn *listen;         /* the relay; set before queue_start() */
	void *listen_arg;
};


/* ---- queue.c ---- */
void queue_notify(struct queue *q, enum queue_event ev, const char *id);
struct qentry *queue_ix_get(struct queue *q, const char *id);
void queue_maybe_compact(struct queue *q);
int queue_remove_message(struct queue *q, const char *id);

/* ---- queue_walk.c: nothing the other room calls ---- */

#endif
