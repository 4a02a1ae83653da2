/*
 * request -- requests and their deadlines, and who makes room at max_sessions (see
 * engine.h for the promise, engine_int.h for the rooms).
 *
 * A session has at most one open request.  An implicit one is what the service left
 * partial in the input buffer: it starts at the first byte left unconsumed and restarts
 * only when the service consumed bytes (finished a request), so bytes that trickle in
 * move nothing.  An explicit one (session_request_begin) is consumed as it comes, and its
 * deadline may grow with its bytes (min_rate) up to a maximum.  Each worker keeps, per
 * service, its sessions with an open request in order of start; the oldest start is
 * published for the main thread, which sends a connection over max_sessions to that
 * worker.  Work per event is bounded (law 8): list operations are O(1), and the choice of
 * whom to evict looks at EVICT_LOOK sessions.
 *
 * This room calls nothing in engine.c: what a session does about its request (time it,
 * end it at its deadline, give way to a newcomer, log) is the engine's, which carries out
 * the decisions made here -- whether a request opens, how long it has left, whom to evict.
 */
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdatomic.h>

#include "engine_int.h"
#include "util.h"

#define EVICT_LOOK 8 /* open requests looked at, oldest first, for the slowest to evict */
/* Data with no minimum rate gives way only past this share of its deadline (of 1024). */
#define EVICT_MIN_SLOW 512

/* The time an explicit request's bytes earned at its minimum rate (0 without one). */
static uint64_t request_earned_ms(const struct session *s)
{
	uint64_t r = s->rb.min_rate;
	return r ? s->req_bytes / r * 1000 + s->req_bytes % r * 1000 / r : 0;
}

/* How long the open request may take in all, from its start: command_timeout, or for an
 * explicit request its base plus what its bytes earned, within its maximum. */
uint64_t request_allowed_ms(const struct session *s)
{
	if (!s->req_explicit)
		return atomic_load(&s->svc->command_timeout_ms);
	uint64_t ms = s->rb.base_ms + request_earned_ms(s);
	return ms < s->rb.max_ms ? ms : s->rb.max_ms;
}

/* The request's age; 0 rather than a wrap if the clock read now is older than its start. */
uint64_t request_elapsed(const struct session *s, uint64_t now)
{
	return now > s->req_start_ms ? now - s->req_start_ms : 0;
}

static void request_publish_oldest(struct worker *w, unsigned idx)
{
	struct session *h = w->reqs[idx].head;
	atomic_store_explicit(&w->req_oldest_ms[idx], h ? h->req_start_ms : UINT64_MAX,
			      memory_order_relaxed);
}

void request_close(struct session *s)
{
	if (!s->req_listed)
		return;
	struct req_list *l = &s->w->reqs[s->svc->idx];
	bool was_head = l->head == s;
	if (s->rprev)
		s->rprev->rnext = s->rnext;
	else
		l->head = s->rnext;
	if (s->rnext)
		s->rnext->rprev = s->rprev;
	else
		l->tail = s->rprev;
	s->rprev = s->rnext = NULL;
	s->req_listed = false;
	s->req_explicit = false;
	if (s->req_armed)
		event_del(s->deadline);
	s->req_armed = false;
	if (was_head)
		request_publish_oldest(s->w, s->svc->idx);
}

/* A request opens now: at the tail of its service's list (the lists are in order of
 * start), unarmed (request_arm times it).  b NULL: an implicit request, bound by
 * command_timeout.  An open request is closed first. */
void request_open(struct session *s, const struct request_bound *b)
{
	request_close(s);
	struct req_list *l = &s->w->reqs[s->svc->idx];
	s->req_start_ms = now_ms();
	s->req_listed = true;
	s->req_explicit = b != NULL;
	s->req_bytes = 0;
	if (b)
		s->rb = *b;
	s->rprev = l->tail;
	s->rnext = NULL;
	if (l->tail)
		l->tail->rnext = s;
	else
		l->head = s;
	l->tail = s;
	if (l->head == s)
		request_publish_oldest(s->w, s->svc->idx);
}

void request_arm(struct session *s, struct timeval tv)
{
	event_add(s->deadline, &tv);
	s->req_armed = true;
}

void session_request_end(struct session *s)
{
	if (s->req_explicit)
		request_close(s);
}

/*
 * After the service took input: an implicit request (a partial one left in the buffer)
 * starts, goes on, restarts or ends.  It restarts only when the service consumed bytes,
 * that is finished a request; bytes that come and stay unconsumed move nothing.  A
 * connection's first request is listed from the connection, unarmed (the idle timeout
 * bounds a client that sends nothing): its deadline starts with its first partial bytes.
 * Returns REQUEST_START when an implicit request is to open now, timed (the engine opens
 * it: request_open, request_arm).
 */
enum request_step request_track(struct session *s, size_t consumed)
{
	if (s->req_explicit) {
		s->req_bytes += consumed;
		return REQUEST_GOES_ON;
	}
	bool partial = !s->paused && !s->closing &&
		       evbuffer_get_length(bufferevent_get_input(s->bev)) > 0;
	if (!partial) {
		request_close(s);
		return REQUEST_GOES_ON;
	}
	if (s->req_listed && s->req_armed && consumed == 0)
		return REQUEST_GOES_ON;
	return REQUEST_START;
}

/*
 * Whether the open request may give way to a newcomer, and how slow it is against its
 * deadline (elapsed over allowed, of 1024).  A partial request, or a connection that has
 * sent nothing yet, may: a client's request is whole within milliseconds, and any age
 * threshold would let a flood of new connections hold the slots against a legitimate
 * client as well as they do (the choice goes to the slowest of the oldest, so a request
 * in flight gives way only when it is among them).  Data that has kept its minimum rate
 * never does, and data without one only past EVICT_MIN_SLOW of its deadline.
 */
bool request_evictable(const struct session *s, uint64_t now, uint64_t *ret_slow)
{
	if (s->closing || s->paused)
		return false;
	uint64_t elapsed = request_elapsed(s, now);
	uint64_t allowed = request_allowed_ms(s);
	uint64_t slow = elapsed * 1024 / (allowed ? allowed : 1);
	if (s->req_explicit && s->rb.min_rate && request_earned_ms(s) >= elapsed)
		return false;
	if (s->req_explicit && !s->rb.min_rate && slow < EVICT_MIN_SLOW)
		return false;
	*ret_slow = slow;
	return true;
}

/* The session to evict for a newcomer of svc at now: of the EVICT_LOOK oldest open
 * requests, the slowest that may give way.  NULL if none.  Bounded work, whatever the
 * number of sessions. */
struct session *request_victim(const struct worker *w, const struct service *svc, uint64_t now)
{
	struct session *best = NULL;
	uint64_t best_slow = 0;
	int n = 0;
	for (struct session *s = w->reqs[svc->idx].head; s && n < EVICT_LOOK; s = s->rnext, n++) {
		uint64_t slow;
		if (!request_evictable(s, now, &slow))
			continue;
		if (!best || slow > best_slow) {
			best = s;
			best_slow = slow;
		}
	}
	return best;
}

/* The time the open request has left at now, against what it is allowed in all; 0 when
 * its deadline has passed (an explicit request whose bytes earned more has time left). */
uint64_t request_time_left(const struct session *s, uint64_t now)
{
	uint64_t elapsed = request_elapsed(s, now);
	uint64_t allowed = request_allowed_ms(s);
	return elapsed < allowed ? allowed - elapsed : 0;
}

/* Whether a line on making room (an eviction, or a refusal when none could give way) is
 * due on w at now: one a second, with the count of those not logged since. */
bool request_log_due(struct worker *w, uint64_t now, uint64_t *ret_unlogged)
{
	if (now - w->evict_logged_ms < REQUEST_LOG_MS) {
		w->evict_unlogged++;
		return false;
	}
	*ret_unlogged = w->evict_unlogged;
	w->evict_logged_ms = now;
	w->evict_unlogged = 0;
	return true;
}

/* The worker with the oldest open request of svc, or NULL when none has one. */
struct worker *request_worker_to_evict(struct engine *e, const struct service *svc)
{
	struct worker *best = NULL;
	uint64_t oldest = 0;
	for (unsigned i = 0; i < e->nworkers; i++) {
		uint64_t t = atomic_load_explicit(&e->workers[i].req_oldest_ms[svc->idx],
						  memory_order_relaxed);
		if (t != UINT64_MAX && (!best || t < oldest)) {
			best = &e->workers[i];
			oldest = t;
		}
	}
	return best;
}
