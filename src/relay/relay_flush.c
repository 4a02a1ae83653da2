/*
 * relay_flush -- the flusher: one helper thread that fdatasyncs the status bytes a
 * transaction wrote, so that a slow disk never stalls the connections of the relay's
 * loop.  Its answers go back through the relay's mailbox (MB_SETTLED).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "dsn.h"
#include "relay_int.h"
#include "util.h"

/* ---- the flusher ---- */

void *flush_main(void *arg)
{
	struct relay *r = arg;
	pthread_mutex_lock(&r->fl_lock);
	for (;;) {
		while (!r->fl_head && !r->fl_hist && !r->fl_stop)
			pthread_cond_wait(&r->fl_cond, &r->fl_lock);
		/* the send history first: transactions wait for it before their MAIL FROM,
		 * while nothing waits for a message's statuses but its removal */
		struct flush_req *f = r->fl_hist;
		if (f) {
			r->fl_hist = NULL;
		} else if ((f = r->fl_head)) {
			r->fl_head = f->next;
			if (!r->fl_head)
				r->fl_tail = &r->fl_head;
		} else {
			break;
		}
		pthread_mutex_unlock(&r->fl_lock);
		struct mb_item *it = calloc(1, sizeof(*it));
		int rc = fdatasync(f->fd) < 0 ? -errno : 0;
		close(f->fd);
		if (it) {
			it->kind = f->hist_seq ? MB_HIST_SYNCED : MB_SETTLED;
			it->hist_seq = f->hist_seq;
			it->rc = rc;
			snprintf(it->id, sizeof(it->id), "%s", f->id);
			if (base_post(r, it) < 0)
				free(it);
		}
		free(f);
		pthread_mutex_lock(&r->fl_lock);
	}
	pthread_mutex_unlock(&r->fl_lock);
	return NULL;
}

/*
 * The status bytes a transaction wrote go to disk on the flusher's thread; the message
 * is removed or bounced only once they are there (MB_SETTLED).  Without the flusher (or
 * memory for it), the flush is made here.
 */
void flush_post(struct relay *r, struct rmsg *m)
{
	struct flush_req *f = r->flusher_started ? calloc(1, sizeof(*f)) : NULL;
	int fd = f && m->open ? fcntl(m->qm->fd, F_DUPFD_CLOEXEC, 0) : -1;
	if (fd < 0) {
		free(f);
		int e = m->open ? queue_msg_sync(m->qm) : 0;
		if (e < 0)
			base_logf(r, LOG_LEVEL_ERROR, "qid=%s statuses cannot be flushed: %s", m->id,
			     strerror(-e));
		else
			m->dirty = false;
		return;
	}
	m->dirty = false; /* what was written is the flusher's to sync (msg_check_done waits) */
	f->fd = fd;
	snprintf(f->id, sizeof(f->id), "%s", m->id);
	m->flushing++;
	pthread_mutex_lock(&r->fl_lock);
	*r->fl_tail = f;
	r->fl_tail = &f->next;
	pthread_cond_signal(&r->fl_cond);
	pthread_mutex_unlock(&r->fl_lock);
}

/* The send history written so far, to disk on the flusher's thread (MB_HIST_SYNCED);
 * false when there is no flusher (or memory for it): the caller flushes it itself. */
bool flush_post_hist(struct relay *r)
{
	struct flush_req *f = r->flusher_started ? calloc(1, sizeof(*f)) : NULL;
	int fd = f ? fcntl(r->hist_fd, F_DUPFD_CLOEXEC, 0) : -1;
	if (fd < 0) {
		free(f);
		return false;
	}
	f->fd = fd;
	f->hist_seq = r->hist_seq;
	pthread_mutex_lock(&r->fl_lock);
	r->fl_hist = f; /* one at a time (hist_syncing): the slot is free */
	pthread_cond_signal(&r->fl_cond);
	pthread_mutex_unlock(&r->fl_lock);
	return true;
}
