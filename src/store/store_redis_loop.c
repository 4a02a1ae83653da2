/*
 * store_redis_loop -- each event loop's part of the Redis store (store_redis_int.h).
 *
 * A thread's struct rloop is made the first time it uses the store (rloop_get(): a
 * worker's loop, or the main loop for the lease heartbeats), with its connections, which
 * start at once.  Its flush runs once per loop pass: it sends what its queue holds, the
 * decisions bound for one connection -- and one slot, on a cluster -- batched into one
 * script call (at most REDIS_BATCH_DECISIONS decisions and REDIS_BATCH_KEYS keys), keeps
 * back what waits for a connection, the slot map or its TRYAGAIN time, and answers by
 * on_failure what has nowhere to go.  Its timer answers the requests past their deadline
 * and asks for the slot map when it is due.  redis_links_free() frees every loop at the
 * end.
 *
 * Calls the connections (store_redis_link.c) and the requests (store_redis_req.c), never
 * the operations but through st->cb.  A loop is touched only by the thread that runs it
 * (the loop table is under st->lock), but redis_links_free(), once every loop has stopped.
 */
#include <stdlib.h>
#include <string.h>

#include "store_redis_int.h"
#include "util.h"

/* Where r goes now: a ready connection; NULL with *ret_wait set when it should wait in
 * the queue (a first connection or the slot map on its way), else NULL (on_failure). */
static struct redis_conn *route(struct rloop *l, const struct rreq *r, bool *ret_wait)
{
	struct redis_conn *c = r->ask;
	*ret_wait = false;
	if (!c) {
		if (!l->st->cluster) {
			c = l->conns[0];
		} else if (!l->map_known || l->map[r->slot] == REDIS_NO_NODE) {
			*ret_wait = !l->map_known;
			return NULL;
		} else {
			c = l->conns[l->map[r->slot]];
		}
	}
	if (c->ready && c->ac && c->inflight < REDIS_MAX_INFLIGHT)
		return c;
	/* a connection on its first attempt (or between two after a success) is waited
	 * for; one that failed is not */
	*ret_wait = c->healthy && (c->ac || c->sac);
	return NULL;
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
	struct rloop *l = arg;
	(void)fd;
	(void)what;
	struct rreq *q = l->q_head;
	l->q_head = l->q_tail = NULL;
	uint64_t now = now_ms();
	struct rreq *batch[REDIS_BATCH_DECISIONS];
	size_t nb = 0, keys = 0;
	struct redis_conn *bc = NULL;
	uint16_t bslot = 0;
	while (q || nb) {
		struct rreq *r = q;
		struct redis_conn *c = NULL;
		bool wait = false;
		if (r) {
			q = r->qnext;
			r->qnext = NULL;
			r->queued = false;
			if (!r->waiting) {
				rreq_free_one(r);
				continue;
			}
			if (r->not_before_ms > now) {
				rreq_queue(r, false);
				continue;
			}
			c = route(l, r, &wait);
			if (!c) {
				if (wait)
					rreq_queue(r, false);
				else {
					rreq_fail(r, -EAGAIN);
					rreq_free_one(r);
				}
				continue;
			}
		}
		bool batchable = r && r->kind == REQ_DECIDE && !r->ask &&
				 r->call->mode != STORE_RESET;
		/* the batch so far goes when r cannot join it */
		if (nb && (!r || !batchable || c != bc || (l->st->cluster && r->slot != bslot) ||
			   nb == REDIS_BATCH_DECISIONS || keys + redis_call_keys(r->call) > REDIS_BATCH_KEYS)) {
			if (l->st->cb.send_decisions(bc, batch, nb, false, false) < 0)
				for (size_t i = 0; i < nb; i++) {
					rreq_fail(batch[i], -EAGAIN);
					rreq_free_one(batch[i]);
				}
			nb = keys = 0;
		}
		if (!r)
			break;
		if (batchable) {
			batch[nb++] = r;
			keys += redis_call_keys(r->call);
			bc = c;
			bslot = r->slot;
			continue;
		}
		int rc;
		if (r->kind == REQ_DECIDE)
			rc = l->st->cb.send_decisions(c, &r, 1, false, r->ask != NULL);
		else
			rc = redis_conn_send_reqs(c, &r, 1, false, r->ask != NULL, r->what,
						  (int)r->cmd.n, r->cmd.argv, r->cmd.len);
		r->ask = NULL;
		if (rc < 0) {
			rreq_fail(r, -EAGAIN);
			rreq_free_one(r);
		}
	}
	rloop_timer_arm(l);
}
static void on_loop_timer(evutil_socket_t fd, short what, void *arg)
{
	struct rloop *l = arg;
	struct rstore *st = l->st;
	uint64_t now = now_ms();
	(void)fd;
	(void)what;
	while (l->head && l->head->deadline_ms <= now) {
		if (l->head->kind != REQ_OTHER)
			atomic_fetch_add(&st->timeouts, 1);
		rreq_fail(l->head, -ETIMEDOUT);
	}
	if (st->cluster && !l->map_asking) {
		if (now - l->map_at_ms >= rloop_map_interval(l)) {
			l->map_at_ms = now; /* also when no connection can ask: not before the next */
			redis_map_ask(l);
		}
	}
	if (l->q_head)
		event_active(l->flush, EV_TIMEOUT, 0);
	rloop_timer_arm(l);
}

struct rloop *rloop_get(struct rstore *st)
{
	struct event_base *base = thread_base();
	if (!base)
		return NULL;
	size_t n = atomic_load(&st->nloops);
	for (size_t i = 0; i < n; i++)
		if (st->loops[i]->base == base)
			return st->loops[i];
	struct rloop *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->st = st;
	l->base = base;
	l->flush = event_new(base, -1, 0, on_flush, l);
	l->timer = evtimer_new(base, on_loop_timer, l);
	if (st->cluster) {
		l->map = malloc(REDIS_SLOTS);
		if (l->map)
			memset(l->map, REDIS_NO_NODE, REDIS_SLOTS);
	}
	bool ok = l->flush && l->timer && (!st->cluster || l->map);
	if (ok && st->cluster) {
		for (size_t i = 0; i < st->nseeds && ok; i++)
			ok = redis_conn_new(l, &st->seeds[i]) != NULL;
	} else if (ok) {
		ok = redis_conn_new(l, &st->server_addr) != NULL;
	}
	pthread_mutex_lock(&st->lock);
	n = atomic_load(&st->nloops);
	ok = ok && n < REDIS_MAX_LOOPS;
	if (ok) {
		st->loops[n] = l;
		atomic_store(&st->nloops, n + 1);
	}
	pthread_mutex_unlock(&st->lock);
	if (!ok) {
		for (size_t i = 0; i < l->nconns; i++)
			redis_conn_free(l->conns[i]);
		if (l->flush)
			event_free(l->flush);
		if (l->timer)
			event_free(l->timer);
		free(l->map);
		free(l);
		return NULL;
	}
	for (size_t i = 0; i < l->nconns; i++)
		redis_conn_start(l->conns[i]);
	return l;
}

/*
 * After every loop has stopped (the engine's workers joined, the main loop left): the
 * connections are freed here, on whichever thread, which is safe because no loop runs
 * them any more; their pending calls belong to sessions that are gone.
 */
void redis_links_free(struct rstore *st)
{
	size_t n = atomic_load(&st->nloops);
	for (size_t i = 0; i < n; i++) {
		struct rloop *l = st->loops[i];
		while (l->head) {
			struct rreq *r = l->head;
			r->slotc = NULL;
			r->slide = NULL;
			if (!r->orphan)
				r->call = NULL;
			rreq_leave(r);
		}
		/* queued requests are freed here; those in flight by hiredis, below */
		for (struct rreq *r = l->q_head, *next; r; r = next) {
			next = r->qnext;
			rreq_free_one(r);
		}
		l->q_head = l->q_tail = NULL;
		for (size_t k = 0; k < l->nconns; k++)
			redis_conn_free(l->conns[k]);
		event_free(l->flush);
		event_free(l->timer);
		free(l->map);
		free(l);
	}
	atomic_store(&st->nloops, 0);
}
