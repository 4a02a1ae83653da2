/*
 * store_redis_req -- a loop's requests for the Redis store (store_redis_int.h).
 *
 * A request is made by an operation (rreq_new(), within REDIS_MAX_REQS per loop), then
 * submitted: it enters the loop's deadline list, kept in deadline order so that the loop's
 * one timer watches the first only, and its send queue, which the loop's flush empties
 * once per pass (store_redis_loop.c).  It leaves the deadline list when it is answered
 * (rreq_leave()), and is freed once it has also left the queue and no command carries it
 * (rreq_free_one()).  A caller that gives up withdraws it (rreq_withdraw()): a decision
 * that may have charged is then replaced by the store's copy, which waits for the answer
 * to refund it.  rloop_timer_arm() sets the loop's timer for its next moment: the first
 * deadline, a request's TRYAGAIN time, the slot map's refresh.
 *
 * Calls no other room of the store; the operations are reached only through st->cb.
 * Runs on the thread of the request's loop.
 */
#include <stdlib.h>

#include "store_redis_int.h"
#include "util.h"

struct rreq *rreq_new(struct rloop *l, enum req_kind kind, enum script_id sc)
{
	if (l->nreqs >= REDIS_MAX_REQS)
		return NULL;
	struct rreq *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	l->nreqs++;
	r->loop = l;
	r->kind = kind;
	r->script = sc;
	r->deadline_ms = now_ms() + l->st->conf.timeout_ms;
	return r;
}

void rreq_leave(struct rreq *r)
{
	struct rloop *l = r->loop;
	if (!r->waiting)
		return;
	if (r->prev)
		r->prev->next = r->next;
	else
		l->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		l->tail = r->prev;
	r->prev = r->next = NULL;
	r->waiting = false;
}

void rreq_free_one(struct rreq *r)
{
	rreq_leave(r);
	if (r->orphan && r->call) {
		free(r->call);
		r->call = NULL;
	}
	if (r->kind != REQ_DECIDE)
		argv_clear(&r->cmd);
	r->loop->nreqs--;
	free(r);
}

/* Into the deadline list, kept in deadline order (a request sent again keeps its first
 * deadline, so it may go before later ones). */
static void rreq_wait(struct rreq *r)
{
	struct rloop *l = r->loop;
	struct rreq *after = l->tail;
	while (after && after->deadline_ms > r->deadline_ms)
		after = after->prev;
	r->waiting = true;
	r->prev = after;
	r->next = after ? after->next : l->head;
	if (r->next)
		r->next->prev = r;
	else
		l->tail = r;
	if (after)
		after->next = r;
	else
		l->head = r;
	if (l->head == r)
		rloop_timer_arm(l);
}

/* Into the send queue; kick: flush it in this loop pass (not for what the flush itself
 * keeps back: it waits for a connection, the map or its time, which flush again).
 * Static, so that rreq_submit(), on every decision's path, keeps it inline. */
static void rreq_enqueue(struct rreq *r, bool kick)
{
	struct rloop *l = r->loop;
	r->queued = true;
	r->qnext = NULL;
	if (l->q_tail)
		l->q_tail->qnext = r;
	else
		l->q_head = r;
	l->q_tail = r;
	if (kick)
		event_active(l->flush, EV_TIMEOUT, 0);
}

/* For the flush and the redirections (store_redis_loop.c, store_redis_link.c). */
void rreq_queue(struct rreq *r, bool kick)
{
	rreq_enqueue(r, kick);
}

void rreq_submit(struct rreq *r)
{
	if (!r->waiting)
		rreq_wait(r);
	rreq_enqueue(r, true);
}

/* The loop's timer, for the first deadline, the first TRYAGAIN time of the queue, and the
 * slot map's refresh on a cluster. */
void rloop_timer_arm(struct rloop *l)
{
	uint64_t at = UINT64_MAX;
	if (l->head)
		at = l->head->deadline_ms;
	for (struct rreq *r = l->q_head; r; r = r->qnext)
		if (r->not_before_ms && r->not_before_ms < at)
			at = r->not_before_ms;
	if (l->st->cluster) {
		uint64_t next = l->map_at_ms + rloop_map_interval(l);
		if (next < at)
			at = next;
	}
	redis_timer_at(l->timer, at);
}

void rreq_withdraw(struct rreq *r)
{
	if (!r)
		return;
	r->slotc = NULL;
	r->slide = NULL;
	if (r->kind == REQ_DECIDE && r->call && !r->orphan) {
		/* sent and maybe charged: the store's copy takes the answer and refunds it */
		struct store_call *copy = r->queued ? NULL : r->loop->st->cb.orphan(r->call);
		r->call = copy;
		r->orphan = copy != NULL;
		if (copy)
			return; /* still waits, within its deadline */
	}
	r->call = NULL;
	rreq_leave(r);
}
