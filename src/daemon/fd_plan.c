/*
 * fd_plan -- the share-out of descriptors (see fd_plan.h).
 *
 * The figures per part were counted on a running sluiced (ls /proc/PID/fd): each
 * worker's loop holds 4 (epoll, its mailbox's eventfd, libevent's notification pair),
 * the main loop about 8, the queue 64 directories (msg/ and log/, 32 each) and about 8
 * more, the relay about 8 before it opens anything.  They are rounded up: a plan that
 * holds back a few too many costs a few sessions, one that holds too few fails later.
 */
#include <stdio.h>

#include "config.h"
#include "daemon_config.h"
#include "fd_plan.h"
#include "relay.h"
#include "util.h"

#define FDS_MAIN 12
#define FDS_PER_WORKER 4
#define FDS_QUEUE (64 + 12)
#define FDS_RELAY 16
#define FDS_RELAY_IDLE_FILES 64 /* message files kept open between transactions */
#define FDS_RELAY_MX_LANES 64   /* mx routes: other lanes' connections, c-ares sockets */
#define FDS_METRICS 8
#define FDS_STORE_EXTRA 4       /* Redis: the main loop's, the run-time limits' thread */

static unsigned relay_fds(const struct relay_conf *r)
{
	if (!r->nroutes)
		return 0;
	unsigned n = FDS_RELAY + FDS_RELAY_IDLE_FILES;
	bool mx = false;
	for (size_t i = 0; i < r->nroutes; i++) {
		const struct route_conf *rc = &r->routes[i];
		n += rc->connections ? rc->connections : rc->mx ? 4 : 2;
		mx = mx || rc->mx;
	}
	for (size_t i = 0; i < r->nproviders; i++)
		n += r->providers[i].connections;
	return mx ? n + FDS_RELAY_MX_LANES : n;
}

/* max_sessions * fds, 0 meaning no limit (UINT64_MAX). */
static uint64_t service_max(unsigned max, unsigned fds)
{
	return max ? (uint64_t)max * fds : UINT64_MAX;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

void fd_plan_make(const struct daemon_config *dc, unsigned workers, unsigned open,
		  struct fd_plan *ret)
{
	const struct sluice_config *c = &dc->conf;
	struct fd_plan p = { .open = open, .reserve = FD_PLAN_RESERVE };
	p.threads = FDS_MAIN + FDS_PER_WORKER * workers;
	p.listeners = (unsigned)(c->milter.listen.n + c->policy.listen.n + c->control.n +
				 (c->intake.enabled ? c->intake.listen.n : 0));
	if (c->intake.enabled || dc->relay.nroutes)
		p.queue = FDS_QUEUE;
	p.relay = relay_fds(&dc->relay);
	if (c->metrics.enabled)
		p.metrics = FDS_METRICS + c->metrics.max_connections;
	if (c->store.redis)
		p.store = workers + FDS_STORE_EXTRA;
	p.held = p.open + p.threads + p.listeners + p.queue + p.relay + p.metrics + p.store +
		 p.reserve;
	if (c->milter.listen.n) {
		p.sessions_min += 1;
		p.sessions_max = add_sat(p.sessions_max, service_max(c->milter.max_sessions, 1));
	}
	if (c->policy.listen.n) {
		p.sessions_min += 1;
		p.sessions_max = add_sat(p.sessions_max, service_max(c->policy.max_sessions, 1));
	}
	if (c->intake.enabled) {
		p.sessions_min += FD_PLAN_INTAKE_SESSION;
		p.sessions_max = add_sat(p.sessions_max, service_max(c->intake.max_sessions,
								   FD_PLAN_INTAKE_SESSION));
	}
	*ret = p;
}

void fd_plan_format(const struct fd_plan *p, char *out, size_t len)
{
	/* 9 numbers and their words: 400 bytes hold them; a shorter buffer gets a cut line */
	(void)fmt_fixed(out, len,
			"%u open at start + %u for the event loops + %u listeners + %u for the "
			"queue + %u for the relay + %u for metrics + %u for Redis + %u kept in "
			"reserve = %u",
			p->open, p->threads, p->listeners, p->queue, p->relay, p->metrics,
			p->store, p->reserve, p->held);
}
