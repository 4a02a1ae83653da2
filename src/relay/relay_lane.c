/*
 * relay_lane -- lanes on the relay's thread: making them, their timers, lane_kick (the
 * loop side of scheduling) and lane_pick (the item a transaction takes), suspension on a
 * throttling signal, failing or deferring a lane's due recipients (through the message
 * room's one writer), and shared budgets asked of the store.  Connections and DNS are
 * relay_conn.c's.
 *
 * Scheduling, per lane (lane_kick): suspended -> sleep until the end; no recipient due ->
 * sleep until the earliest retry; a ready idle connection -> take the budget (exact: an
 * admitted send is counted now, just before MAIL FROM is written) and start a
 * transaction, or sleep exactly until the budget allows one; no connection -> open one
 * (only when the budget would admit a send now, so that no connection idles waiting for
 * budget), and its ready callback kicks the lane again.  Wake-ups are timers set to the
 * exact moment something can happen: a throttled lane wakes once per send.
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

/* ---- lanes ---- */


uint64_t lane_guard_ns(const struct route_conf *rc)
{
	return (uint64_t)rc->guard_ms * 1000000u;
}

/*
 * The lanes by name, for routing each recipient (law 8: no walk over the lanes, of
 * which an mx route has one per domain).  Names hold recipients' domains, which peers
 * choose: htab's hash is keyed with a secret of the process.
 */
struct lane *lane_find(struct relay *r, const char *name)
{
	uint64_t h = htab_hash(&r->lane_idx, name, strlen(name));
	for (struct htab_node *n = htab_chain(&r->lane_idx, h); n; n = n->next) {
		struct lane *l = HTAB_ENTRY(n, struct lane, hnode);
		if (n->hash == h && strcmp(l->name, name) == 0)
			return l;
	}
	return NULL;
}

static int lane_index_add(struct relay *r, struct lane *l)
{
	return htab_add(&r->lane_idx, &l->hnode, htab_hash(&r->lane_idx, l->name, strlen(l->name)));
}

void lane_unlink(struct relay *r, struct lane *l)
{
	TAILQ_REMOVE(&r->lanes, l, link);
	r->nlanes--;
	htab_remove(&r->lane_idx, &l->hnode);
}

struct lane *lane_get(struct relay *r, struct route_rt *rt, const char *domain)
{
	char name[600];
	if (rt->conf->mx)
		snprintf(name, sizeof(name), "%s:%s", rt->conf->name, domain);
	else
		snprintf(name, sizeof(name), "%s", rt->conf->name);
	struct lane *l = lane_find(r, name);
	if (l && l->fwd && group_keeps(l, relay_now(r)))
		return l->fwd; /* its MX answer put the domain in a group's lane */
	if (l) {
		group_unforward(l); /* an answer too old: the domain is looked up again */
		return l;
	}
	return lane_make(r, rt, name, rt->conf->mx ? domain : NULL, NULL);
}

struct lane *lane_make(struct relay *r, struct route_rt *rt, const char *name, const char *domain,
		       const struct provider_conf *p)
{
	if (r->nlanes >= MAX_LANES)
		return NULL;
	struct lane *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->r = r;
	l->rt = rt;
	l->provider = p;
	l->name = strdup(name);
	l->domain = domain ? strdup(domain) : NULL;
	l->provider_name = p ? strdup(p->name) : NULL;
	TAILQ_INIT(&l->items);
	TAILQ_INIT(&l->conns);
	TAILQ_INIT(&l->members);
	sched_lane_init(&l->s);
	if (!l->name || (domain && !l->domain) || (p && !l->provider_name) ||
	    lane_budget_init(&l->b, p ? &p->rate : &rt->conf->rate, lane_guard_ns(rt->conf)) < 0) {
		free(l->name);
		free(l->domain);
		free(l->provider_name);
		free(l);
		return NULL;
	}
	/* indexed first: a failure there leaves the loaded history to a later lane */
	if (lane_index_add(r, l) < 0) {
		lane_free(l);
		return NULL;
	}
	uint64_t now = relay_now(r);
	size_t nh, first = hist_find(r, name, &nh);
	for (size_t i = first; i < first + nh; i++) {
		struct hist_entry *h = &r->hist[i];
		if (h->taken)
			continue;
		if (!h->why) {
			lane_budget_remember(&l->b, h->us * 1000);
		} else if (h->us * 1000 > now) {
			/* suspended before the restart: still suspended */
			lane_budget_suspend(&l->b, now, (int64_t)(h->us * 1000 - now), 0, 0, h->why);
		}
		h->taken = true; /* the lane has it now (its name stays: the order) */
	}
	TAILQ_INSERT_TAIL(&r->lanes, l, link);
	r->nlanes++;
	return l;
}

unsigned lane_max_conns(const struct lane *l)
{
	if (l->provider)
		return l->provider->connections;
	return l->rt ? l->rt->conf->connections : 0;
}

/* After a reload: l's route is rt now (NULL: gone); its forward is dropped (every domain
 * is grouped again from a new MX answer), its budget takes the new rate. */
void lane_reconf(struct lane *l, struct route_rt *rt)
{
	group_unforward(l);
	if (rt && l->group &&
	    rt->conf->lanes != (l->provider_name ? ROUTE_LANES_PROVIDER : ROUTE_LANES_MX))
		rt = NULL; /* the route groups otherwise now: this lane's mail goes elsewhere */
	l->provider = NULL;
	if (rt && l->provider_name) {
		const struct relay_conf *c = &l->r->crt->conf;
		for (size_t i = 0; i < c->nproviders && !l->provider; i++)
			if (strcmp(c->providers[i].name, l->provider_name) == 0)
				l->provider = &c->providers[i];
		if (!l->provider)
			rt = NULL; /* the provider is gone */
	}
	l->rt = rt;
	if (rt)
		lane_budget_set_rate(&l->b, l->provider ? &l->provider->rate : &rt->conf->rate,
				     lane_guard_ns(rt->conf));
}

void lane_free(struct lane *l)
{
	group_leave(l);
	for (size_t i = 0; i < l->nthr; i++)
		threshold_clear(&l->thr[i]);
	free(l->thr);
	free(l->thr_key);
	free(l->provider_name);
	policy_pending_cancel(l->slot_wait);
	l->slot_wait = NULL;
	policy_unref(l->slot_rules);
	l->slot_rules = NULL;
	if (l->slot_granted && l->slot && l->r->rules)
		policy_class_release(l->r->rules, l->slot);
	else if (l->slot_granted)
		class_slot_release(l->slot);
	sched_wake(&l->r->sched, &l->s, SCHED_NEVER);
	sched_lane_done(&l->s);
	lane_budget_done(&l->b);
	dane_free(l);
	free(l->targets);
	free(l->name);
	free(l->domain);
	free(l);
}

/* Wake l in wait_ns (UINT64_MAX: only when something happens to it). */
void lane_arm(struct lane *l, uint64_t wait_ns)
{
	struct relay *r = l->r;
	/* never "now": a lane kicked by the timer and armed again at once would be popped
	 * again in the same round */
	uint64_t at = wait_ns == UINT64_MAX ? SCHED_NEVER : relay_now(l->r) + (wait_ns ? wait_ns : 1);
	if (sched_wake(&r->sched, &l->s, at) < 0) {
		/* XXX without memory for the heap the lane waits for its next event */
		base_logf(r, LOG_LEVEL_ERROR, "lane=%s cannot be woken: out of memory", l->name);
		return;
	}
	lane_wake_rearm(r);
}

void lane_wake_rearm(struct relay *r)
{
	uint64_t next = sched_next_wake(&r->sched);
	if (next == r->wake_at)
		return;
	r->wake_at = next;
	if (next == SCHED_NEVER) {
		evtimer_del(r->wake);
		return;
	}
	uint64_t now = relay_now(r);
	/* evtimer takes microseconds: round up, never wake before the moment */
	uint64_t us = next > now ? (next - now + 999) / 1000 : 0;
	/* from the clock now, not the loop's cached time: a timer set late in a callback
	 * would otherwise fire before the moment and find the budget still closed */
	event_base_update_cache_time(r->base);
	struct timeval tv = { .tv_sec = (time_t)(us / 1000000), .tv_usec = (suseconds_t)(us % 1000000) };
	evtimer_add(r->wake, &tv);
}

void lane_on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	r->wake_at = SCHED_NEVER;
	uint64_t now = relay_now(r);
	struct sched_lane *s;
	while ((s = sched_pop(&r->sched, now))) {
		struct lane *l = (struct lane *)((char *)s - offsetof(struct lane, s));
		lane_kick(l);
	}
	lane_wake_rearm(r);
}

void lane_signal(struct lane *l, const struct classify_result *cr, const char *text)
{
	struct relay *r = l->r;
	uint64_t now = relay_now(l->r);
	const struct relay_conf *c = &r->crt->conf;
	snprintf(l->last, sizeof(l->last), "%s", text);
	if (cr->verdict == CLASSIFY_SLOW) {
		lane_budget_slow(&l->b);
		base_logf(r, LOG_LEVEL_WARNING, "lane=%s slowed to %u%% of its rate: \"%s\" (signal %s)",
		     l->name, (unsigned)(l->b.factor / 10000), text, cr->signal ? cr->signal : "-");
		if (cr->for_ms > 0) {
			lane_budget_suspend(&l->b, now, cr->for_ms * 1000000, 0, 0, text);
			l->suspensions++;
			r->st.suspensions++;
			hist_append_suspension(r, l);
			conn_close_idle(l);
		}
		return;
	}
	uint64_t len = lane_budget_suspend(&l->b, now, cr->for_ms >= 0 ? cr->for_ms * 1000000 : -1,
					   (uint64_t)c->suspend_min_ms * 1000000u,
					   (uint64_t)c->suspend_max_ms * 1000000u, text);
	l->suspensions++;
	r->st.suspensions++;
	hist_append_suspension(r, l);
	base_logf(r, LOG_LEVEL_WARNING, "lane=%s suspended for %" PRIu64 "s: \"%s\" (signal %s); no "
	     "recipient changes state", l->name, (len + 999999999) / 1000000000, text,
	     cr->signal ? cr->signal : "-");
	conn_close_idle(l);
}

/* Every recipient of l still to do and not in a transaction fails now with dsn and text
 * (its domain cannot take mail), and the bounces follow. */
void lane_fail_all(struct lane *l, const char *dsn, const char *text)
{
	struct relay *r = l->r;
	struct outcome o;
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_FAIL, .dsn = dsn }, &o);
	struct lane_item *it, *next;
	for (it = TAILQ_FIRST(&l->items); it; it = next) {
		next = TAILQ_NEXT(it, link);
		struct rmsg *m = it->m;
		if (m->held || m->deleted || m->bouncing || msg_open_file(r, m) < 0)
			continue;
		const uint32_t *ri = item_rcpts(it);
		bool any = false;
		for (size_t k = it->scan; k < it->nri; k++) {
			size_t i = ri[k];
			struct rrcpt *rr = &m->r[i];
			if (rr->lane != l || rr->busy ||
			    (rr->status != QUEUE_TODO && rr->status != QUEUE_UNCERTAIN))
				continue;
			msg_rcpt_settle(r, m, i, l, "", &o, text);
			any = true;
		}
		if (any)
			flush_post(r, m);
		msg_close_file(r, m);
		bounce_check(r, m); /* after the flush, and after its transactions */
	}
}

/*
 * l's due recipients wait for their next retry, without a transaction (DANE found no
 * server it may send to): dsn and text say why in the attempt log and the log, and
 * what names the part that decided ("DANE").  Each due recipient once, as a transaction
 * would take them, and at most LANE_DEFER_BATCH messages per call (law 8): the lane is
 * kicked for the rest.
 */
#define LANE_DEFER_BATCH 256

void lane_defer_due(struct lane *l, const char *mta, const char *dsn, const char *what,
		    const char *text)
{
	struct relay *r = l->r;
	size_t idx[64], n = 0, total = 0, msgs = 0;
	uint64_t now = relay_now(l->r), next = UINT64_MAX;
	struct lane_item *it;
	char note[64];
	snprintf(note, sizeof(note), "(%s)", what);
	struct outcome o;
	outcome_decide(&(struct outcome_in){ .ev = OUTCOME_DEFER, .dsn = dsn, .note = note }, &o);
	while (msgs++ < LANE_DEFER_BATCH &&
	       (it = lane_pick(l, now, sizeof(idx) / sizeof(idx[0]), idx, &n, &next)) != NULL) {
		struct rmsg *m = it->m;
		if (msg_open_file(r, m) < 0) {
			/* gone (deleted behind the relay's back) or unreadable: forgotten, as
			 * tx_start() does */
			if (m->busy == 0)
				msg_free(r, m);
			else
				m->deleted = true;
			continue;
		}
		for (size_t k = 0; k < n; k++)
			msg_rcpt_settle(r, m, idx[k], l, mta, &o, text);
		total += n;
		msg_item_schedule(r, it);
		msg_close_file(r, m);
	}
	base_logf(r, LOG_LEVEL_WARNING, "lane=%s mta=%s %s: %s: %zu recipient(s) deferred",
		  l->name, mta, what, text, total);
	lane_arm(l, 0); /* the rest, if any, on the next round */
}

/* ---- the scheduler ---- */

static bool rcpt_due(const struct rmsg *m, size_t i, const struct lane *l, uint64_t now,
		     uint64_t *next)
{
	const struct rrcpt *rr = &m->r[i];
	if (rr->lane != l || rr->busy ||
	    (rr->status != QUEUE_TODO && rr->status != QUEUE_UNCERTAIN))
		return false;
	if (rr->next_try > now) {
		if (rr->next_try < *next)
			*next = rr->next_try;
		return false;
	}
	return true;
}

/*
 * The oldest message with recipients due in l (the scheduler's answer, relay_sched.h); up
 * to max of them into idx.  An item the scheduler holds as due but that has nothing to
 * send (its message was held, or its recipients finished or went busy since) is put back
 * where it belongs and the next one asked.  Costs O(log n) in the lane's messages plus
 * the chosen message's recipients; *next is when the lane's next item is due otherwise.
 */
struct lane_item *lane_pick(struct lane *l, uint64_t now, size_t max, size_t *idx,
			    size_t *ret_n, uint64_t *next)
{
	struct sched_item *s;
	while ((s = sched_next(&l->s, now))) {
		struct lane_item *it = (struct lane_item *)s;
		struct rmsg *m = it->m;
		size_t n = 0;
		if (it->pending && !m->held && !m->deleted && !m->bouncing) {
			const uint32_t *ri = item_rcpts(it);
			while (it->scan < it->nri &&
			       m->r[ri[it->scan]].status != QUEUE_TODO &&
			       m->r[ri[it->scan]].status != QUEUE_UNCERTAIN)
				it->scan++;
			for (size_t k = it->scan; k < it->nri && n < max; k++)
				if (rcpt_due(m, ri[k], l, now, next))
					idx[n++] = ri[k];
		}
		if (n) {
			*ret_n = n;
			return it;
		}
		msg_item_schedule(l->r, it);
	}
	*next = sched_lane_next_due(&l->s);
	return NULL;
}

static void lane_shared_take(struct lane *l, struct lane_conn *rc);

void lane_kick(struct lane *l)
{
	struct relay *r = l->r;
	if (r->stopping || !l->rt || l->deciding)
		return;
	for (;;) {
		uint64_t now = relay_now(l->r);
		const struct route_conf *conf = l->rt->conf;
		if (l->nidle && (l->rt->oc.tls == SMTP_TLS_DANE || l->rt->oc.tls == SMTP_TLS_DANE_ONLY))
			conn_close_stale(l, now);
		struct sched_lane_state st = {
			.suspended_until = lane_budget_suspended(&l->b, now) ? l->b.suspended_until : 0,
			.budget_shared = conf->shared,
			.idle = l->nidle,
			.conns = l->nconns,
			.connecting = l->nconnecting,
			.max_conns = lane_max_conns(l),
		};
		if (!st.suspended_until) {
			uint64_t next = SCHED_NEVER;
			size_t one, n1;
			st.work_due = lane_pick(l, now, 1, &one, &n1, &next) != NULL;
			st.next_due = next;
			if (st.work_due && !st.idle && !conf->shared)
				st.budget_wait = lane_budget_wait(&l->b, now);
		}
		struct sched_decision d;
		sched_decide(&st, now, &d);
		if (d.close_idle)
			conn_close_idle(l);
		if (d.action == SCHED_SLEEP) {
			lane_arm(l, d.wake == SCHED_NEVER ? UINT64_MAX : d.wake > now ? d.wake - now : 0);
			return;
		}
		if (d.action == SCHED_CONNECT)
			conn_open(l);
		/* SCHED_CONNECT, SCHED_HOLD: a connection's ready, or a transaction's end,
		 * kicks the lane again */
		if (d.action != SCHED_SEND)
			return;
		struct lane_conn *idle = conn_find_idle(l);
		if (!idle)
			return; /* l->nidle says otherwise: cannot be */
		if (l->rt->conf->shared && r->store) {
			lane_shared_take(l, idle);
			return;
		}
		if (!tx_start(l, idle, now, false))
			return;
	}
}

/* The sweep's part (relay.c): an MX lane per destination domain that holds nothing and
 * remembers no send that still counts goes (its history is in relay.lanes until
 * compacted). */
void lane_sweep(struct relay *r, uint64_t now)
{
	struct lane *l, *lnext;
	for (l = TAILQ_FIRST(&r->lanes); l; l = lnext) {
		lnext = TAILQ_NEXT(l, link);
		if (!l->domain || group_keeps(l, now) || !TAILQ_EMPTY(&l->items) ||
		    !TAILQ_EMPTY(&l->conns) || l->query || l->call ||
		    lane_budget_suspended(&l->b, now))
			continue;
		bool counts = false;
		for (unsigned i = 0; i < l->b.rate.n && !counts; i++)
			counts = lane_budget_used(&l->b, i, now) > 0;
		if (counts)
			continue;
		lane_unlink(r, l);
		lane_free(l);
	}
}

/* Every lane m has recipients in looks at its work again. */
void lane_kick_msg(struct rmsg *m)
{
	for (size_t i = 0; i < m->nitems; i++)
		lane_kick(m->items[i].lane);
}

/* The message room's way to a lane (r->up.lane_for): the lane of the route that takes
 * domain (lower case), made if need be; *ret_routed false when no route takes it; NULL
 * without memory or past MAX_LANES. */
static struct lane *lane_for(struct relay *r, const char *domain, bool *ret_routed)
{
	const struct route_conf *rc = relay_conf_route(&r->crt->conf, domain);
	if (!rc) {
		*ret_routed = false;
		return NULL;
	}
	*ret_routed = true;
	return lane_get(r, &r->crt->routes[rc - r->crt->conf.routes], domain);
}

/* What the rooms below ask of the lanes (relay_new registers it). */
void lane_register(struct relay *r)
{
	r->up.lane_for = lane_for;
	r->up.kick = lane_kick;
}

/* ---- shared lanes: the budget is in Redis ---- */

static void on_shared(struct store_slide_call *call, int rc, uint64_t wait_ns)
{
	struct lane *l = call->arg;
	struct relay *r = l->r;
	l->deciding = false;
	l->call = NULL;
	free(call);
	if (r->stopping || !l->rt)
		return;
	uint64_t now = relay_now(l->r);
	if (rc < 0) {
		/* no answer: the lane stops rather than risk the shared limit */
		char text[200];
		snprintf(text, sizeof(text), "the shared budget cannot be reached: %s",
			 strerror(-rc));
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = 10000,
					      .signal = "store" };
		lane_signal(l, &cr, text);
		lane_kick(l);
		return;
	}
	if (rc == 0) {
		lane_arm(l, wait_ns);
		return;
	}
	/* admitted: remember it locally too (for `sluice lanes` and the history) */
	lane_budget_remember(&l->b, now);
	l->b.sends++;
	hist_append(r, l->name, now);
	struct lane_conn *idle = conn_find_idle(l);
	if (!idle || !tx_start(l, idle, now, true)) {
		/* XXX the connection went away or nothing is due any more: the granted send
		 * is unused (the lane only sends less) */
	}
	lane_kick(l);
}

static void lane_shared_take(struct lane *l, struct lane_conn *rc)
{
	struct relay *r = l->r;
	struct store_slide_call *call = calloc(1, sizeof(*call));
	if (!call)
		return;
	call->name = l->name;
	call->nwin = l->b.rate.n;
	for (unsigned i = 0; i < l->b.rate.n; i++) {
		call->n[i] = lane_budget_limit(&l->b, i);
		call->window_ns[i] = lane_budget_window(&l->b, i);
	}
	call->take = true;
	call->now = 0; /* Redis's clock: the nodes share it */
	call->done = on_shared;
	call->arg = l;
	l->deciding = true;
	l->call = call;
	int e = store_slide_start(r->store, call);
	if (e == STORE_PENDING)
		return;
	l->deciding = false;
	l->call = NULL;
	free(call);
	if (e == -ENOTSUP) {
		/* not a cluster store: this node's own budget */
		tx_start(l, rc, relay_now(l->r), false);
		return;
	}
	struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = 10000,
				      .signal = "store" };
	lane_signal(l, &cr, "the shared budget cannot be asked");
}
