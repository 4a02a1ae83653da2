/*
 * queue -- the running queue: new messages, the committer thread, the index (queue.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "queue_int.h"
#include "queue_journal.h"
#include "queue_retry.h"
#include "queue_select.h"
#include "queue_table.h"
#include "util.h"

void queue_notify(struct queue *q, enum queue_event ev, const char *id)
{
	if (q->listen)
		q->listen(q->listen_arg, ev, id);
}

/* ---- the index ---- */

/* Under ix_lock. */
struct qentry *queue_ix_get(struct queue *q, const char *id)
{
	if (!id || !queue_id_valid(str_make(id, strnlen(id, QUEUE_ID_LEN + 1))))
		return NULL;
	return queue_table_get(&q->ix, id);
}

/* Under ix_lock: wake the loader for a compaction when the journal holds far more
 * records than there are recipients with a retry state. */
void queue_maybe_compact(struct queue *q)
{
	if (q->loading || q->compacting || q->compact_wanted)
		return;
	if (q->jr_records <= q->compact_min || q->jr_records <= q->compact_floor ||
	    q->jr_records <= 2 * q->ix.retry_live)
		return;
	q->compact_wanted = true;
	pthread_cond_signal(&q->hk_cond);
}

/* ---- recovery into the index (the loader) ---- */

static int pending_cmp(const void *a, const void *b)
{
	const struct pending *x = a, *y = b;
	int c = memcmp(x->id, y->id, QUEUE_ID_LEN);
	if (c)
		return c;
	if (x->rcpt != y->rcpt)
		return x->rcpt < y->rcpt ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

struct pending_buf {
	struct pending *p;
	size_t n, cap;
};

static int pending_add(void *arg, const struct queue_retry_rec *r)
{
	struct pending_buf *b = arg;
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 1024;
		struct pending *n = realloc(b->p, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		b->p = n;
		b->cap = cap;
	}
	struct pending *p = &b->p[b->n];
	memcpy(p->id, r->id, QUEUE_ID_LEN);
	p->rcpt = r->rcpt;
	p->attempts = r->attempts;
	p->next_us = r->next_us;
	p->seq = b->n++;
	return 0;
}

/* The journal, read into q->pend: sorted, the last record of each recipient only. */
static void load_journal(struct queue *q)
{
	struct pending_buf b = { 0 };
	struct queue_journal_load_stats st = { 0 };
	int r = queue_journal_load(q->jr, pending_add, &b, &st);
	if (r < 0) {
		/* without memory for it: every retry time is lost, an early retry */
		free(b.p);
		b = (struct pending_buf){ 0 };
	}
	if (b.n > 1)
		qsort(b.p, b.n, sizeof(*b.p), pending_cmp);
	size_t k = 0;
	for (size_t i = 0; i < b.n; i++) {
		if (i + 1 < b.n && memcmp(b.p[i].id, b.p[i + 1].id, QUEUE_ID_LEN) == 0 &&
		    b.p[i].rcpt == b.p[i + 1].rcpt)
			continue; /* a later record of the same recipient follows */
		b.p[k++] = b.p[i];
	}
	q->pend = b.p;
	q->npend = k;
	q->pend_at = 0;
	pthread_mutex_lock(&q->ix_lock);
	q->jr_records += st.records;
	pthread_mutex_unlock(&q->ix_lock);
}

/* The journal's last word on each recipient of e (messages load in order of ID, so the
 * records are met in order; those of messages gone are passed over). */
static void apply_pending(struct queue *q, struct qentry *e)
{
	while (q->pend_at < q->npend && memcmp(q->pend[q->pend_at].id, e->id, QUEUE_ID_LEN) < 0)
		q->pend_at++;
	struct qrcpt *r = qentry_rcpt(e);
	for (; q->pend_at < q->npend &&
	       memcmp(q->pend[q->pend_at].id, e->id, QUEUE_ID_LEN) == 0; q->pend_at++) {
		const struct pending *p = &q->pend[q->pend_at];
		if (p->rcpt < e->nrcpt) {
			r[p->rcpt].next_us = p->next_us;
			r[p->rcpt].attempts = p->attempts;
		}
	}
}

static void recover_report(void *arg, const struct queue_recover_event *ev)
{
	struct queue *q = arg;
	if (q->report)
		q->report(q->report_arg, ev);
}

static int recover_message(void *arg, const struct queue_msg *m)
{
	struct queue *q = arg;
	const struct queue_index *ix = &m->ix;
	struct buf names;
	buf_init(&names, SIZE_MAX / 2);
	int r = buf_append_str(&names, ix->env.sender);
	if (r == 0)
		r = buf_append_byte(&names, 0);
	for (size_t i = 0; r == 0 && i < ix->nrcpt; i++) {
		r = buf_append_str(&names, ix->rcpt[i].addr);
		if (r == 0)
			r = buf_append_byte(&names, 0);
	}
	struct qentry *e = r == 0 ? qentry_new(ix->env.id, ix->env.arrival_us, ix->body_len,
					       names.ptr, names.len, ix->nrcpt)
				  : NULL;
	buf_done(&names);
	if (!e)
		return -ENOMEM;
	memcpy(e->control, ix->control, sizeof(e->control));
	char *status = qentry_status(e);
	for (size_t i = 0; i < ix->nrcpt; i++)
		status[i] = ix->rcpt[i].status;
	apply_pending(q, e);
	pthread_mutex_lock(&q->ix_lock);
	r = queue_table_insert(&q->ix, e);
	pthread_mutex_unlock(&q->ix_lock);
	if (r == -EEXIST) {
		/* committed since the start, after the loader listed msg/: the commit put it
		 * in the index already */
		qentry_free(e);
		r = 0;
	} else if (r < 0) {
		qentry_free(e);
	} else {
		q->inserted = true;
	}
	return r;
}

static void report_error(struct queue *q, const char *name, const char *what, int error)
{
	recover_report(q, &(struct queue_recover_event){ .what = QUEUE_RECOVER_ERROR,
							 .name = name, .reason = what,
							 .error = error });
}

static void compact(struct queue *q);

/* The loader: every message of msg/ in order of arrival into the index, each announced
 * to the relay as it goes in; then it waits for compactions of the journal. */
static void *loader_main(void *arg)
{
	struct queue *q = arg;
	load_journal(q);
	char (*ids)[QUEUE_ID_LEN + 1] = NULL;
	size_t n = 0;
	int r = queue_recovery_list(q->rec, &ids, &n);
	if (r < 0)
		report_error(q, "msg/", "listing the queue's messages", r);
	pthread_mutex_lock(&q->ix_lock);
	q->load_total = n;
	pthread_mutex_unlock(&q->ix_lock);
	size_t i = 0;
	for (; i < n && !atomic_load(&q->load_stop); i++) {
		q->inserted = false;
		r = queue_recovery_message(q->rec, ids[i]);
		if (r < 0)
			report_error(q, ids[i], "loading into the index", r);
		if (q->inserted)
			queue_notify(q, QUEUE_EV_NEW, ids[i]);
		pthread_mutex_lock(&q->ix_lock);
		q->load_done = i + 1;
		pthread_mutex_unlock(&q->ix_lock);
	}
	free(ids);
	free(q->pend);
	q->pend = NULL;
	q->npend = 0;
	bool stopped = i < n;
	/* after msg/: the logs of messages it removed are gone, the logs of messages it
	 * moved to corrupt/ are orphans now */
	if (!stopped && (r = queue_recovery_logs(q->rec)) < 0)
		report_error(q, "log/", "removing orphan logs", r);
	struct queue_recover_stats st = { 0 };
	if ((r = queue_recovery_finish(q->rec, &st)) < 0)
		report_error(q, "the queue's directories", "flushing", r);
	q->rec = NULL;

	pthread_mutex_lock(&q->ix_lock);
	q->loading = false;
	q->load_ms = now_ms() - q->load_started_ms;
	pthread_cond_broadcast(&q->load_cond);
	uint64_t ms = q->load_ms;
	pthread_mutex_unlock(&q->ix_lock);
	if (!stopped)
		recover_report(q, &(struct queue_recover_event){ .what = QUEUE_RECOVER_LOADED,
								 .name = "", .count = st.messages,
								 .elapsed_ms = ms });

	pthread_mutex_lock(&q->ix_lock);
	queue_maybe_compact(q);
	for (;;) {
		while (!atomic_load(&q->load_stop) && !q->compact_wanted)
			pthread_cond_wait(&q->hk_cond, &q->ix_lock);
		if (atomic_load(&q->load_stop))
			break;
		q->compact_wanted = false;
		q->compacting = true;
		pthread_mutex_unlock(&q->ix_lock);
		compact(q);
		pthread_mutex_lock(&q->ix_lock);
		q->compacting = false;
		/* appends during the compaction went uncounted against the thresholds */
		queue_maybe_compact(q);
	}
	pthread_mutex_unlock(&q->ix_lock);
	return NULL;
}

/* ---- the retry journal's compaction (on the loader) ---- */

#define COMPACT_CHUNK 1024  /* entries read per hold of ix_lock */

/*
 * Rotate (appends go to a new generation), then write the live retry state into a
 * snapshot, a chunk of the index at a time, and put it in place of the old generations.
 * The chunks need not be one consistent picture: every change made after the rotation
 * is also in the new generation, which a reader applies after the snapshot.
 */
static void compact(struct queue *q)
{
	pthread_mutex_lock(&q->ix_lock);
	uint64_t before = q->jr_records;
	int r = queue_journal_rotate(q->jr);
	bool rotated = r == 0;
	if (rotated)
		q->jr_records = 0;
	pthread_mutex_unlock(&q->ix_lock);
	if (r == 0)
		r = queue_journal_snapshot_begin(q->jr, realtime_ns() / 1000);
	uint64_t written = 0;
	char last[QUEUE_ID_LEN + 1] = "";
	unsigned char *buf = r == 0 ? malloc(64 * QUEUE_RETRY_RECORD) : NULL;
	if (r == 0 && !buf)
		r = -ENOMEM;
	bool more = r == 0;
	while (more && !atomic_load(&q->load_stop)) {
		pthread_mutex_lock(&q->ix_lock);
		struct qentry *e = last[0] ? queue_table_after(&q->ix, last)
					   : queue_table_first(&q->ix);
		size_t len = 0;
		/* a chunk ends at an entry's end, so that `last` says where to go on */
		for (size_t k = 0; e && k < COMPACT_CHUNK && r == 0; k++, e = queue_table_next(e)) {
			const struct qrcpt *rc = qentry_rcpt(e);
			for (size_t i = 0; i < e->nrcpt && r == 0; i++) {
				if (!rc[i].next_us && !rc[i].attempts)
					continue;
				struct queue_retry_rec rec = { .kind = QUEUE_RETRY_STATE,
							       .rcpt = (uint32_t)i,
							       .attempts = rc[i].attempts,
							       .next_us = rc[i].next_us };
				memcpy(rec.id, e->id, sizeof(rec.id));
				queue_retry_encode(&rec, buf + len);
				len += QUEUE_RETRY_RECORD;
				written++;
				if (len == 64 * QUEUE_RETRY_RECORD) {
					/* a write under the lock, of 3 KiB to the page cache */
					r = queue_journal_snapshot_write(q->jr, buf, len);
					len = 0;
				}
			}
			memcpy(last, e->id, sizeof(last));
		}
		more = e != NULL;
		pthread_mutex_unlock(&q->ix_lock);
		if (r == 0 && len)
			r = queue_journal_snapshot_write(q->jr, buf, len);
		if (r < 0)
			more = false;
	}
	free(buf);
	if (r == 0 && atomic_load(&q->load_stop))
		r = -ECANCELED;
	if (r == 0)
		r = queue_journal_snapshot_commit(q->jr);
	else
		queue_journal_snapshot_abort(q->jr);
	pthread_mutex_lock(&q->ix_lock);
	if (r == 0) {
		q->jr_records += written;
		q->compact_floor = 0;
	} else {
		/* the old generations stay: they count, and the next try waits for more */
		if (rotated)
			q->jr_records += before;
		q->compact_floor = 2 * q->jr_records;
	}
	pthread_mutex_unlock(&q->ix_lock);
	if (r < 0 && r != -ECANCELED)
		report_error(q, "retry journal", "compaction", r);
}

/* ---- the committer ---- */

static struct queue_new *new_free(struct queue_new *n)
{
	if (!n)
		return NULL;
	if (n->fd >= 0)
		close(n->fd);
	queue_writer_free(n->w);
	buf_done(&n->out);
	buf_done(&n->names);
	free(n);
	return NULL;
}

static void commit_batch(struct queue *q, struct queue_new *batch, size_t n)
{
	const char **ids = malloc(n * sizeof(*ids));
	struct queue_new *it = batch;
	for (size_t i = 0; ids && i < n; i++, it = it->next)
		ids[i] = it->id;
	struct queue_commit_stats st = { 0 };
	int r = ids ? queue_commit(q->qd, ids, n, &st) : -ENOMEM;
	bool no_ids = !ids;
	free(ids);
	for (it = batch; no_ids && it; it = it->next)
		queue_tmp_abandon(q->qd, it->id); /* queue_commit() does this on its failures */

	pthread_mutex_lock(&q->ix_lock);
	q->cst.batches += st.batches;
	q->cst.messages += st.messages;
	q->cst.failed_batches += st.failed_batches;
	q->cst.failed_messages += st.failed_messages;
	q->cst.syncfs += st.syncfs;
	q->cst.file_syncs += st.file_syncs;
	q->cst.dir_syncs += st.dir_syncs;
	for (it = batch; r == 0 && it; it = it->next) {
		struct qentry *e = qentry_new(it->id, it->arrival_us, it->size, it->names.ptr,
					      it->names.len, it->nrcpt);
		/* XXX without memory for the index the message is still committed and safe:
		 * it shows up in the index at the next start. */
		if (e && queue_table_insert(&q->ix, e) < 0)
			qentry_free(e);
		q->accepted_bytes += it->size;
	}
	if (r < 0)
		q->commit_errors += n;
	pthread_mutex_unlock(&q->ix_lock);

	while (batch) {
		struct queue_new *next = batch->next;
		if (r == 0)
			queue_notify(q, QUEUE_EV_NEW, batch->id);
		batch->done(batch->arg, r);
		new_free(batch);
		batch = next;
	}
}

static void *committer_main(void *arg)
{
	struct queue *q = arg;
	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (!q->head && !q->stop)
			pthread_cond_wait(&q->cond, &q->lock);
		if (!q->head)
			break;
		/* Everything that came while the previous batch was being flushed goes into
		 * this one, up to batch_max. */
		struct queue_new *batch = q->head, *last = batch;
		size_t n = 1;
		while (last->next && n < q->batch_max) {
			last = last->next;
			n++;
		}
		q->head = last->next;
		if (!q->head)
			q->tail = &q->head;
		last->next = NULL;
		q->busy = true;
		pthread_mutex_unlock(&q->lock);
		commit_batch(q, batch, n);
		pthread_mutex_lock(&q->lock);
		q->busy = false;
		pthread_cond_broadcast(&q->idle);
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

/* ---- open and free ---- */

int queue_open(const struct queue_conf *conf, queue_report_fn *report, void *arg,
	       struct queue **ret, char *err, size_t errlen)
{
	struct queue *q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->batch_max = conf->commit_batch ? conf->commit_batch : 256;
	q->compact_min = conf->retry_compact_min ? conf->retry_compact_min : 65536;
	q->tail = &q->head;
	q->report = report;
	q->report_arg = arg;
	q->loading = true;
	q->load_started_ms = now_ms();
	queue_table_init(&q->ix);
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	pthread_cond_init(&q->idle, NULL);
	pthread_mutex_init(&q->ix_lock, NULL);
	pthread_cond_init(&q->hk_cond, NULL);
	pthread_cond_init(&q->load_cond, NULL);
	uint32_t seed;
	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != sizeof(seed))
		seed = (uint32_t)now_ns() ^ (uint32_t)getpid();
	atomic_store(&q->seq, seed);

	int r = queue_dir_open(conf->dir, &q->qd, err, errlen);
	if (r < 0) {
		queue_free(q);
		return r;
	}
	r = queue_journal_open(queue_dir_root(q->qd), &q->jr);
	if (r < 0) {
		snprintf(err, errlen, "queue %s: the retry journal: %s", conf->dir, strerror(-r));
		queue_free(q);
		return r;
	}
	/* tmp/ at once, before the intake writes there; msg/ on the loader */
	static const struct queue_recover_ops ops = {
		.report = recover_report,
		.message = recover_message,
	};
	r = queue_recovery_new(q->qd, &ops, q, &q->rec);
	if (r == 0)
		r = queue_recovery_tmp(q->rec);
	if (r < 0) {
		snprintf(err, errlen, "queue %s: recovery failed: %s", conf->dir, strerror(-r));
		queue_free(q);
		return r;
	}
	*ret = q;
	return 0;
}

int queue_start(struct queue *q)
{
	int r = -pthread_create(&q->committer, NULL, committer_main, q);
	if (r < 0)
		return r;
	q->started = true;
	pthread_mutex_lock(&q->ix_lock);
	q->load_started_ms = now_ms();
	pthread_mutex_unlock(&q->ix_lock);
	r = -pthread_create(&q->loader, NULL, loader_main, q);
	if (r == 0)
		q->loader_started = true;
	return r;
}

int queue_wait_loaded(struct queue *q)
{
	pthread_mutex_lock(&q->ix_lock);
	while (q->loading && q->loader_started)
		pthread_cond_wait(&q->load_cond, &q->ix_lock);
	bool loading = q->loading;
	pthread_mutex_unlock(&q->ix_lock);
	return loading ? -EAGAIN : 0;
}

/* Stop the loader (at its next file) and wait for it: after this nothing of the queue
 * calls the listener from the loader. */
static void stop_loader(struct queue *q)
{
	if (!q->loader_started)
		return;
	pthread_mutex_lock(&q->ix_lock);
	atomic_store(&q->load_stop, true);
	pthread_cond_signal(&q->hk_cond);
	pthread_mutex_unlock(&q->ix_lock);
	pthread_join(q->loader, NULL);
	q->loader_started = false;
}

void queue_drain(struct queue *q)
{
	stop_loader(q);
	pthread_mutex_lock(&q->lock);
	q->closing = true;
	while (q->started && (q->head || q->busy))
		pthread_cond_wait(&q->idle, &q->lock);
	pthread_mutex_unlock(&q->lock);
}

struct queue *queue_free(struct queue *q)
{
	if (!q)
		return NULL;
	stop_loader(q);
	if (q->started) {
		pthread_mutex_lock(&q->lock);
		q->stop = true;
		pthread_cond_signal(&q->cond);
		pthread_mutex_unlock(&q->lock);
		pthread_join(q->committer, NULL);
	}
	queue_recovery_finish(q->rec, NULL);
	free(q->pend);
	queue_table_clear(&q->ix);
	queue_journal_free(q->jr);
	queue_dir_free(q->qd);
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->cond);
	pthread_cond_destroy(&q->idle);
	pthread_mutex_destroy(&q->ix_lock);
	pthread_cond_destroy(&q->hk_cond);
	pthread_cond_destroy(&q->load_cond);
	free(q);
	return NULL;
}

/* ---- a new message ---- */

/* Write what has gathered in n->out to the file. */
static int new_flush(struct queue_new *n)
{
	size_t off = 0;
	while (off < n->out.len) {
		ssize_t w = write(n->fd, n->out.ptr + off, n->out.len - off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		off += (size_t)w;
	}
	buf_reset(&n->out);
	return 0;
}

/* A writer step that found the buffer full (-ENOBUFS): write the buffer out, then the
 * caller tries the step once more. */
static bool new_full(struct queue_new *n, int *r)
{
	if (*r != -ENOBUFS)
		return false;
	*r = new_flush(n);
	return *r == 0;
}

int queue_new_begin(struct queue *q, struct queue_envelope *env, struct queue_new **ret)
{
	struct queue_new *n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->q = q;
	n->fd = -1;
	buf_init(&n->out, OUT_MAX);
	buf_init(&n->names, SIZE_MAX / 2);
	n->arrival_us = realtime_ns() / 1000;
	queue_id_make(n->id, n->arrival_us, atomic_fetch_add(&q->seq, 1));
	memcpy(env->id, n->id, sizeof(env->id));
	env->arrival_us = n->arrival_us;
	int r = -ENOMEM;
	if (!(n->w = queue_writer_new(&n->out)))
		goto fail;
	if ((r = buf_append_str(&n->names, env->sender)) < 0 ||
	    (r = buf_append_byte(&n->names, 0)) < 0)
		goto fail;
	if ((r = queue_write_head(n->w, env)) < 0)
		goto fail;
	int fd = queue_tmp_create(q->qd, n->id);
	if (fd < 0) {
		r = fd;
		goto fail;
	}
	n->fd = fd;
	*ret = n;
	return 0;
fail:
	new_free(n);
	return r;
}

const char *queue_new_id(const struct queue_new *n)
{
	return n->id;
}

uint64_t queue_new_size(const struct queue_new *n)
{
	return n->size;
}

int queue_new_rcpt(struct queue_new *n, struct str addr)
{
	return queue_new_rcpt_dsn(n, addr, 0, STR_NULL);
}

int queue_new_rcpt_dsn(struct queue_new *n, struct str addr, unsigned notify, struct str orcpt)
{
	if (n->body_started)
		return -EINVAL;
	int r = queue_write_rcpt_dsn(n->w, addr, notify, orcpt);
	if (new_full(n, &r))
		r = queue_write_rcpt_dsn(n->w, addr, notify, orcpt);
	if (r == 0 && (r = buf_append_str(&n->names, addr)) == 0 &&
	    (r = buf_append_byte(&n->names, 0)) == 0)
		n->nrcpt++;
	return r;
}

int queue_new_body(struct queue_new *n, struct str data)
{
	n->body_started = true;
	while (data.len) {
		size_t k = data.len < QUEUE_BODY_CHUNK ? data.len : QUEUE_BODY_CHUNK;
		struct str chunk = str_make(data.ptr, k);
		int r = queue_write_body(n->w, chunk);
		if (new_full(n, &r))
			r = queue_write_body(n->w, chunk);
		if (r < 0)
			return r;
		n->size += k;
		data.ptr += k;
		data.len -= k;
		if (n->out.len >= FLUSH_AT && (r = new_flush(n)) < 0)
			return r;
	}
	return 0;
}

int queue_new_commit(struct queue_new *n, void (*done)(void *arg, int r), void *arg)
{
	int r = n->nrcpt ? queue_write_end(n->w) : -EINVAL;
	if (new_full(n, &r))
		r = queue_write_end(n->w);
	if (r == 0)
		r = new_flush(n);
	if (r < 0) {
		queue_new_abort(n);
		return r;
	}
	/* The data is in the page cache; the committer's syncfs takes it to the disk.  The
	 * descriptor is not needed for that (queue_dir.h). */
	close(n->fd);
	n->fd = -1;
	n->done = done;
	n->arg = arg;
	struct queue *q = n->q;
	pthread_mutex_lock(&q->lock);
	if (q->closing) {
		pthread_mutex_unlock(&q->lock);
		queue_new_abort(n);
		return -ESHUTDOWN;
	}
	*q->tail = n;
	q->tail = &n->next;
	pthread_cond_signal(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

void queue_new_abort(struct queue_new *n)
{
	if (!n)
		return;
	queue_tmp_abandon(n->q->qd, n->id);
	new_free(n);
}

/* ---- the index, for operators ---- */

void queue_stats(struct queue *q, struct queue_stats *ret)
{
	struct queue_stats st = { 0 };
	pthread_mutex_lock(&q->ix_lock);
	const struct queue_table *t = &q->ix;
	st.messages = t->n;
	st.rcpt_todo = t->rcpt_todo;
	st.rcpt_uncertain = t->rcpt_uncertain;
	st.rcpt_delivered = t->rcpt_delivered;
	st.rcpt_failed = t->rcpt_failed;
	st.held = t->held;
	st.bytes = t->bytes;
	st.recipients = st.rcpt_todo + st.rcpt_uncertain;
	st.accepted_bytes = q->accepted_bytes;
	const struct qentry *first = queue_table_first(t);
	st.oldest_us = first ? first->arrival_us : 0;
	st.commits = q->cst.messages;
	st.batches = q->cst.batches;
	st.syncs = q->cst.syncfs + q->cst.file_syncs;
	st.dir_syncs = q->cst.dir_syncs;
	st.commit_errors = q->commit_errors;
	st.loading = q->loading;
	st.load_total = q->load_total;
	st.load_done = q->load_done;
	st.load_ms = q->loading ? now_ms() - q->load_started_ms : q->load_ms;
	st.retry_live = t->retry_live;
	st.retry_records = q->jr_records;
	pthread_mutex_unlock(&q->ix_lock);
	*ret = st;
}

/* ---- the relay's side ---- */

void queue_set_listener(struct queue *q, queue_listen_fn *fn, void *arg)
{
	q->listen = fn;
	q->listen_arg = arg;
}

struct queue_dir *queue_directory(struct queue *q)
{
	return q->qd;
}

int queue_free_space(struct queue *q, uint64_t *ret_bytes)
{
	return queue_dir_free_space(q->qd, ret_bytes);
}

int queue_set_status(struct queue *q, struct queue_msg *m, size_t i, char status)
{
	int r = queue_msg_set_status(m, i, status);
	if (r < 0)
		return r;
	pthread_mutex_lock(&q->ix_lock);
	struct qentry *e = queue_ix_get(q, m->ix.env.id);
	if (e && i < e->nrcpt)
		queue_table_set_status(&q->ix, e, i, status);
	pthread_mutex_unlock(&q->ix_lock);
	return 0;
}

int queue_set_control(struct queue *q, struct queue_msg *m, unsigned which, char byte)
{
	int r = queue_msg_set_control(m, which, byte);
	if (r < 0)
		return r;
	pthread_mutex_lock(&q->ix_lock);
	struct qentry *e = queue_ix_get(q, m->ix.env.id);
	if (e && which < QUEUE_CONTROL_LEN)
		queue_table_set_control(&q->ix, e, which, byte);
	pthread_mutex_unlock(&q->ix_lock);
	return 0;
}

/* The file and its index entry (the entry goes even when the file is already gone). */
int queue_remove_message(struct queue *q, const char *id)
{
	int r = queue_msg_remove(q->qd, id);
	pthread_mutex_lock(&q->ix_lock);
	qentry_free(queue_table_remove(&q->ix, id));
	pthread_mutex_unlock(&q->ix_lock);
	return r;
}

int queue_remove_finished(struct queue *q, const char *id)
{
	return queue_remove_message(q, id);
}

int queue_settle(struct queue *q, struct queue_msg *m, enum queue_msg_state *ret_state)
{
	int r = queue_msg_sync(m);
	if (r < 0)
		return r;
	enum queue_msg_state st = queue_msg_state(m);
	if (st == QUEUE_MSG_FINISHED) {
		/* Not flushed: a finished message that comes back after a crash is removed
		 * again by recovery (its statuses were flushed above). */
		queue_remove_message(q, m->ix.env.id);
	}
	*ret_state = st;
	return 0;
}
