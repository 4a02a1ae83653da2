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

#include "queue.h"
#include "util.h"

#define FLUSH_AT QUEUE_BODY_CHUNK       /* bytes gathered before a write() */
#define OUT_MAX (4 * QUEUE_BODY_CHUNK)  /* the buffer's hard limit */

struct qrcpt {
	const char *addr;        /* into the entry's block, NUL-terminated */
	char status;
};

struct qentry {
	char id[QUEUE_ID_LEN + 1];
	uint64_t arrival_us;
	uint64_t size;           /* bytes of the message */
	char control[QUEUE_CONTROL_LEN];
	size_t nrcpt;
	struct qrcpt *rcpt;
	char *sender;            /* into block */
	uint64_t next_try_us;    /* the relay's next attempt; 0: at once (queue_flush) */
	char *block;             /* sender, then every address, each NUL-terminated */
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

	pthread_mutex_t ix_lock;         /* the index and the counters */
	struct qentry **ents;            /* sorted by id (= by arrival) */
	size_t nents, cap;
	struct queue_commit_stats cst;
	uint64_t commit_errors;
	uint64_t accepted_bytes;

	queue_listen_fn *listen;         /* the relay; set before queue_start() */
	void *listen_arg;
};

static void notify(struct queue *q, enum queue_event ev, const char *id)
{
	if (q->listen)
		q->listen(q->listen_arg, ev, id);
}

/* ---- the index ---- */

static struct qentry *qentry_free(struct qentry *e)
{
	if (e) {
		free(e->rcpt);
		free(e->block);
		free(e);
	}
	return NULL;
}

/* An entry from a sender and recipients given as NUL-terminated names in one block. */
static struct qentry *qentry_make(const char *id, uint64_t arrival_us, uint64_t size,
				  const char *names, size_t names_len, size_t nrcpt)
{
	struct qentry *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->block = malloc(names_len ? names_len : 1);
	e->rcpt = calloc(nrcpt ? nrcpt : 1, sizeof(*e->rcpt));
	if (!e->block || !e->rcpt)
		return qentry_free(e);
	memcpy(e->block, names, names_len);
	memcpy(e->id, id, QUEUE_ID_LEN + 1);
	e->arrival_us = arrival_us;
	e->size = size;
	memset(e->control, '-', sizeof(e->control));
	e->sender = e->block;
	const char *p = e->block + strlen(e->block) + 1;
	for (size_t i = 0; i < nrcpt; i++) {
		e->rcpt[i].addr = p;
		e->rcpt[i].status = QUEUE_TODO;
		p += strlen(p) + 1;
	}
	e->nrcpt = nrcpt;
	return e;
}

/* The slot of id: its index when found (*found), else where it goes. */
static size_t ix_find(const struct queue *q, const char *id, bool *found)
{
	size_t lo = 0, hi = q->nents;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = memcmp(q->ents[mid]->id, id, QUEUE_ID_LEN);
		if (c == 0) {
			*found = true;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = false;
	return lo;
}

/* Under ix_lock.  New IDs are mostly the largest: the insertion is mostly an append. */
static int ix_insert(struct queue *q, struct qentry *e)
{
	if (q->nents == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 256;
		struct qentry **n = realloc(q->ents, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		q->ents = n;
		q->cap = cap;
	}
	bool found;
	size_t at = ix_find(q, e->id, &found);
	if (found)
		return -EEXIST;
	memmove(q->ents + at + 1, q->ents + at, (q->nents - at) * sizeof(*q->ents));
	q->ents[at] = e;
	q->nents++;
	return 0;
}

static struct qentry *ix_get(struct queue *q, const char *id)
{
	if (!queue_id_valid(str_cstr(id)))
		return NULL;
	bool found;
	size_t at = ix_find(q, id, &found);
	return found ? q->ents[at] : NULL;
}

static void ix_remove(struct queue *q, const char *id)
{
	bool found;
	size_t at = ix_find(q, id, &found);
	if (!found)
		return;
	qentry_free(q->ents[at]);
	memmove(q->ents + at, q->ents + at + 1, (q->nents - at - 1) * sizeof(*q->ents));
	q->nents--;
}

/* ---- recovery ---- */

struct recover_ctx {
	struct queue *q;
	queue_report_fn *report;
	void *arg;
	int err;
};

static void recover_report(void *arg, const struct queue_recover_event *ev)
{
	struct recover_ctx *rc = arg;
	if (rc->report)
		rc->report(rc->arg, ev);
}

static int recover_message(void *arg, const struct queue_msg *m)
{
	struct recover_ctx *rc = arg;
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
	struct qentry *e = r == 0 ? qentry_make(ix->env.id, ix->env.arrival_us, ix->body_len,
						names.ptr, names.len, ix->nrcpt)
				  : NULL;
	buf_clear(&names);
	if (!e)
		return -ENOMEM;
	memcpy(e->control, ix->control, sizeof(e->control));
	for (size_t i = 0; i < ix->nrcpt; i++)
		e->rcpt[i].status = ix->rcpt[i].status;
	r = ix_insert(rc->q, e);
	if (r < 0)
		qentry_free(e);
	return r;
}

/* ---- the committer ---- */

static struct queue_new *new_free(struct queue_new *n)
{
	if (!n)
		return NULL;
	if (n->fd >= 0)
		close(n->fd);
	queue_writer_free(n->w);
	buf_clear(&n->out);
	buf_clear(&n->names);
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
		struct qentry *e = qentry_make(it->id, it->arrival_us, it->size, it->names.ptr,
					       it->names.len, it->nrcpt);
		/* XXX without memory for the index the message is still committed and safe:
		 * it shows up in the index at the next start. */
		if (e && ix_insert(q, e) < 0)
			qentry_free(e);
		q->accepted_bytes += it->size;
	}
	if (r < 0)
		q->commit_errors += n;
	pthread_mutex_unlock(&q->ix_lock);

	while (batch) {
		struct queue_new *next = batch->next;
		if (r == 0)
			notify(q, QUEUE_EV_NEW, batch->id);
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
	q->tail = &q->head;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	pthread_cond_init(&q->idle, NULL);
	pthread_mutex_init(&q->ix_lock, NULL);
	uint32_t seed;
	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != sizeof(seed))
		seed = (uint32_t)now_ns() ^ (uint32_t)getpid();
	atomic_store(&q->seq, seed);

	int r = queue_dir_open(conf->dir, &q->qd, err, errlen);
	if (r < 0) {
		queue_free(q);
		return r;
	}
	struct recover_ctx rc = { .q = q, .report = report, .arg = arg };
	const struct queue_recover_ops ops = {
		.report = recover_report,
		.message = recover_message,
	};
	r = queue_recover(q->qd, &ops, &rc, NULL);
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
	if (r == 0)
		q->started = true;
	return r;
}

void queue_drain(struct queue *q)
{
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
	if (q->started) {
		pthread_mutex_lock(&q->lock);
		q->stop = true;
		pthread_cond_signal(&q->cond);
		pthread_mutex_unlock(&q->lock);
		pthread_join(q->committer, NULL);
	}
	for (size_t i = 0; i < q->nents; i++)
		qentry_free(q->ents[i]);
	free(q->ents);
	queue_dir_free(q->qd);
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->cond);
	pthread_cond_destroy(&q->idle);
	pthread_mutex_destroy(&q->ix_lock);
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
	if (n->body_started)
		return -EINVAL;
	int r = queue_write_rcpt(n->w, addr);
	if (new_full(n, &r))
		r = queue_write_rcpt(n->w, addr);
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
	st.messages = q->nents;
	/* XXX one pass over the index under its lock: about a millisecond for 100,000
	 * messages, during which a commit or the relay waits */
	for (size_t i = 0; i < q->nents; i++) {
		const struct qentry *e = q->ents[i];
		for (size_t j = 0; j < e->nrcpt; j++) {
			switch (e->rcpt[j].status) {
			case QUEUE_TODO: st.rcpt_todo++; break;
			case QUEUE_UNCERTAIN: st.rcpt_uncertain++; break;
			case QUEUE_DELIVERED: st.rcpt_delivered++; break;
			case QUEUE_FAILED: st.rcpt_failed++; break;
			}
		}
		if (e->control[QUEUE_CTL_HOLD] == 'H')
			st.held++;
		st.bytes += e->size;
	}
	st.recipients = st.rcpt_todo + st.rcpt_uncertain;
	st.accepted_bytes = q->accepted_bytes;
	st.oldest_us = q->nents ? q->ents[0]->arrival_us : 0;
	st.commits = q->cst.messages;
	st.batches = q->cst.batches;
	st.syncs = q->cst.syncfs + q->cst.file_syncs;
	st.dir_syncs = q->cst.dir_syncs;
	st.commit_errors = q->commit_errors;
	pthread_mutex_unlock(&q->ix_lock);
	*ret = st;
}

static void format_time(uint64_t us, char *out, size_t len)
{
	time_t t = (time_t)(us / 1000000);
	struct tm tm;
	if (!gmtime_r(&t, &tm) || strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(out, len, "?");
}

static const char *status_name(char s)
{
	switch (s) {
	case QUEUE_TODO: return "to do";
	case QUEUE_UNCERTAIN: return "uncertain";
	case QUEUE_DELIVERED: return "delivered";
	case QUEUE_FAILED: return "failed";
	}
	return "?";
}

static int list_entry(const struct qentry *e, bool json, bool first, struct buf *out)
{
	char when[32];
	format_time(e->arrival_us, when, sizeof(when));
	int r;
	if (json) {
		r = buf_printf(out, "%s{\"id\":\"%s\",\"size\":%" PRIu64 ",\"arrival\":\"%s\","
			       "\"held\":%s,\"sender\":", first ? "" : ",", e->id, e->size, when,
			       e->control[QUEUE_CTL_HOLD] == 'H' ? "true" : "false");
		if (r == 0)
			r = buf_append_json_string(out, e->sender);
		if (r == 0)
			r = buf_append_cstr(out, ",\"recipients\":[");
		for (size_t i = 0; r == 0 && i < e->nrcpt; i++) {
			r = buf_printf(out, "%s{\"address\":", i ? "," : "");
			if (r == 0)
				r = buf_append_json_string(out, e->rcpt[i].addr);
			if (r == 0)
				r = buf_printf(out, ",\"status\":\"%c\"}", e->rcpt[i].status);
		}
		return r == 0 ? buf_append_cstr(out, "]}") : r;
	}
	r = buf_printf(out, "%s%c %10" PRIu64 "  %s  <%s>\n", e->id,
		       e->control[QUEUE_CTL_HOLD] == 'H' ? '!' : ' ', e->size, when, e->sender);
	for (size_t i = 0; r == 0 && i < e->nrcpt; i++)
		r = buf_printf(out, "%48s%c <%s>  (%s)\n", "", e->rcpt[i].status, e->rcpt[i].addr,
			       status_name(e->rcpt[i].status));
	return r;
}

int queue_list(struct queue *q, const char *id, bool json, struct buf *out)
{
	int r = 0;
	pthread_mutex_lock(&q->ix_lock);
	if (id) {
		struct qentry *e = ix_get(q, id);
		if (!e)
			r = -ENOENT;
		else if (json)
			r = buf_append_cstr(out, "{\"messages\":[");
		if (r == 0)
			r = list_entry(e, json, true, out);
		if (r == 0 && json)
			r = buf_append_cstr(out, "]}\n");
		pthread_mutex_unlock(&q->ix_lock);
		return r;
	}
	uint64_t bytes = 0, rcpts = 0;
	r = json ? buf_append_cstr(out, "{\"messages\":[") : 0;
	if (r == 0 && !json && q->nents)
		r = buf_printf(out, "%-17s %10s  %-20s  %s\n", "queue id (! held)", "size",
			       "arrival (UTC)", "sender / recipients (status)");
	for (size_t i = 0; r == 0 && i < q->nents; i++) {
		r = list_entry(q->ents[i], json, i == 0, out);
		bytes += q->ents[i]->size;
		rcpts += q->ents[i]->nrcpt;
	}
	if (r == 0)
		r = json ? buf_printf(out, "],\"count\":%zu,\"bytes\":%" PRIu64 "}\n", q->nents,
				      bytes)
			 : q->nents ? buf_printf(out, "-- %zu messages, %" PRIu64 " recipients, %"
						 PRIu64 " bytes\n", q->nents, rcpts, bytes)
				    : buf_append_cstr(out, "the queue is empty\n");
	pthread_mutex_unlock(&q->ix_lock);
	return r;
}

int queue_show(struct queue *q, const char *id, bool json, struct buf *out)
{
	if (!queue_id_valid(str_cstr(id)))
		return -ENOENT;
	struct queue_msg m;
	const char *why = NULL;
	int r = queue_msg_open(q->qd, id, &m, &why);
	if (r < 0)
		return r;
	const struct queue_envelope *env = &m.ix.env;
	char when[32];
	format_time(env->arrival_us, when, sizeof(when));
	struct buf log;
	buf_init(&log, 65536 + 1);
	queue_log_read(q->qd, id, &log, 65536);
	char *sender = strndup(env->sender.ptr ? env->sender.ptr : "", env->sender.len);
	char *client = strndup(env->client.ptr ? env->client.ptr : "", env->client.len);
	char *helo = strndup(env->helo.ptr ? env->helo.ptr : "", env->helo.len);
	char *logtext = strndup(log.ptr ? log.ptr : "", log.len);
	r = sender && client && helo && logtext ? 0 : -ENOMEM;
	if (r == 0 && json) {
		r = buf_printf(out, "{\"id\":\"%s\",\"arrival\":\"%s\",\"size\":%" PRIu64
			       ",\"declared_size\":%" PRIu64 ",\"8bitmime\":%s,\"smtputf8\":%s,"
			       "\"held\":%s,\"bounce\":\"%c\",\"control\":\"%.8s\",\"sender\":",
			       env->id, when, m.ix.body_len, env->size,
			       env->flags & QUEUE_8BITMIME ? "true" : "false",
			       env->flags & QUEUE_SMTPUTF8 ? "true" : "false",
			       m.ix.control[QUEUE_CTL_HOLD] == 'H' ? "true" : "false",
			       m.ix.control[QUEUE_CTL_BOUNCE], m.ix.control);
		if (r == 0)
			r = buf_append_json_string(out, sender);
		if (r == 0)
			r = buf_append_cstr(out, ",\"client\":");
		if (r == 0)
			r = buf_append_json_string(out, client);
		if (r == 0)
			r = buf_append_cstr(out, ",\"helo\":");
		if (r == 0)
			r = buf_append_json_string(out, helo);
		if (r == 0)
			r = buf_append_cstr(out, ",\"recipients\":[");
		for (size_t i = 0; r == 0 && i < m.ix.nrcpt; i++) {
			char *a = strndup(m.ix.rcpt[i].addr.ptr, m.ix.rcpt[i].addr.len);
			r = a ? buf_printf(out, "%s{\"address\":", i ? "," : "") : -ENOMEM;
			if (r == 0)
				r = buf_append_json_string(out, a);
			if (r == 0)
				r = buf_printf(out, ",\"status\":\"%c\"}", m.ix.rcpt[i].status);
			free(a);
		}
		if (r == 0)
			r = buf_append_cstr(out, "],\"log\":");
		if (r == 0)
			r = buf_append_json_string(out, logtext);
		if (r == 0)
			r = buf_append_cstr(out, "}\n");
	} else if (r == 0) {
		r = buf_printf(out, "id:        %s%s\narrival:   %s\nsize:      %" PRIu64
			       " bytes\nsender:    <%s>\nclient:    %s\nhelo:      %s\n"
			       "flags:     %s%s\ncontrol:   %.8s (hold %c, bounce %c)\n"
			       "recipients (%zu: %zu to do, %zu uncertain, %zu delivered, %zu "
			       "failed):\n",
			       env->id, m.ix.control[QUEUE_CTL_HOLD] == 'H' ? " (held)" : "", when,
			       m.ix.body_len, sender, client, helo,
			       env->flags & QUEUE_8BITMIME ? "8BITMIME " : "",
			       env->flags & QUEUE_SMTPUTF8 ? "SMTPUTF8" : "", m.ix.control,
			       m.ix.control[QUEUE_CTL_HOLD], m.ix.control[QUEUE_CTL_BOUNCE],
			       m.ix.nrcpt, m.todo, m.uncertain, m.delivered, m.failed);
		for (size_t i = 0; r == 0 && i < m.ix.nrcpt; i++)
			r = buf_printf(out, "  %c <%.*s>\n", m.ix.rcpt[i].status,
				       (int)m.ix.rcpt[i].addr.len, m.ix.rcpt[i].addr.ptr);
		if (r == 0)
			r = buf_printf(out, "attempts:\n%s", log.len ? logtext : "  (none yet)\n");
	}
	free(sender);
	free(client);
	free(helo);
	free(logtext);
	buf_clear(&log);
	queue_msg_close(&m);
	return r;
}

/*
 * XXX hold, release and show run on the control session's worker: each reads the whole
 * file through once (queue_msg_open checks it) and hold flushes it, so `hold --all` on a
 * deep queue holds up that worker's other sessions for as long.  They belong on a helper
 * thread answering through worker_call(), with hold writing at the control offset kept
 * in the index.
 */
int queue_hold(struct queue *q, const char *id, bool hold)
{
	if (!queue_id_valid(str_cstr(id)))
		return -ENOENT;
	struct queue_msg m;
	int r = queue_msg_open(q->qd, id, &m, NULL);
	if (r < 0)
		return r;
	r = queue_set_control(q, &m, QUEUE_CTL_HOLD, hold ? 'H' : '-');
	if (r == 0)
		r = queue_msg_sync(&m);
	queue_msg_close(&m);
	if (r == 0)
		notify(q, hold ? QUEUE_EV_HOLD : QUEUE_EV_RELEASE, id);
	return r;
}

/* The file and its index entry (the entry goes even when the file is already gone). */
static int remove_message(struct queue *q, const char *id)
{
	int r = queue_msg_remove(q->qd, id);
	pthread_mutex_lock(&q->ix_lock);
	ix_remove(q, id);
	pthread_mutex_unlock(&q->ix_lock);
	return r;
}

int queue_delete(struct queue *q, const char *id)
{
	if (!queue_id_valid(str_cstr(id)))
		return -ENOENT;
	int r = remove_message(q, id);
	if (r == 0)
		notify(q, QUEUE_EV_DELETE, id);
	return r;
}

int queue_flush(struct queue *q, const char *id)
{
	pthread_mutex_lock(&q->ix_lock);
	struct qentry *e = ix_get(q, id);
	if (e)
		e->next_try_us = 0;
	pthread_mutex_unlock(&q->ix_lock);
	if (e)
		notify(q, QUEUE_EV_FLUSH, id);
	return e ? 0 : -ENOENT;
}

int queue_ids(struct queue *q, char (**ret)[QUEUE_ID_LEN + 1], size_t *ret_n)
{
	pthread_mutex_lock(&q->ix_lock);
	char(*ids)[QUEUE_ID_LEN + 1] = malloc((q->nents ? q->nents : 1) * sizeof(*ids));
	if (!ids) {
		pthread_mutex_unlock(&q->ix_lock);
		return -ENOMEM;
	}
	for (size_t i = 0; i < q->nents; i++)
		memcpy(ids[i], q->ents[i]->id, QUEUE_ID_LEN + 1);
	*ret_n = q->nents;
	pthread_mutex_unlock(&q->ix_lock);
	*ret = ids;
	return 0;
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
	struct qentry *e = ix_get(q, m->ix.env.id);
	if (e && i < e->nrcpt)
		e->rcpt[i].status = status;
	pthread_mutex_unlock(&q->ix_lock);
	return 0;
}

int queue_set_control(struct queue *q, struct queue_msg *m, unsigned which, char byte)
{
	int r = queue_msg_set_control(m, which, byte);
	if (r < 0)
		return r;
	pthread_mutex_lock(&q->ix_lock);
	struct qentry *e = ix_get(q, m->ix.env.id);
	if (e && which < QUEUE_CONTROL_LEN)
		e->control[which] = byte;
	pthread_mutex_unlock(&q->ix_lock);
	return 0;
}

int queue_remove_finished(struct queue *q, const char *id)
{
	return remove_message(q, id);
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
		remove_message(q, m->ix.env.id);
	}
	*ret_state = st;
	return 0;
}
