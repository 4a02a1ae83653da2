/*
 * relay_lane -- lanes on the relay's thread: making them, their timers, lane_kick (the
 * loop side of scheduling), DNS, connections and their setup failures, suspension on a
 * throttling signal, and shared budgets asked of the store.
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
	if (l && l->fwd && lane_keep(l, realtime_ns()))
		return l->fwd; /* its MX answer put the domain in a group's lane */
	if (l) {
		lane_unforward(l); /* an answer too old: the domain is looked up again */
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
	uint64_t now = realtime_ns();
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

void lane_free(struct lane *l)
{
	lane_ungroup(l);
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
	uint64_t at = wait_ns == UINT64_MAX ? SCHED_NEVER : realtime_ns() + (wait_ns ? wait_ns : 1);
	if (sched_wake(&r->sched, &l->s, at) < 0) {
		/* XXX without memory for the heap the lane waits for its next event */
		relay_logf(r, LOG_LEVEL_ERROR, "lane=%s cannot be woken: out of memory", l->name);
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
	uint64_t now = realtime_ns();
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
	uint64_t now = realtime_ns();
	struct sched_lane *s;
	while ((s = sched_pop(&r->sched, now))) {
		struct lane *l = (struct lane *)((char *)s - offsetof(struct lane, s));
		lane_kick(l);
	}
	lane_wake_rearm(r);
}

/* ---- connections ---- */

/* The connection's memory goes with its smtp_out's (which may finish a QUIT after the
 * relay is done with it): the configuration it points to stays until then. */
static void on_conn_freed(void *arg)
{
	struct lane_conn *rc = arg;
	struct relay *r = rc->r;
	rc->crt->users--;
	free(rc->dane);
	free(rc);
	relay_retired_sweep(r);
}

/* Take a connection out of its lane's books. */
static void conn_detach(struct lane_conn *rc)
{
	struct lane *l = rc->lane;
	struct relay *r = rc->r;
	TAILQ_REMOVE(&l->conns, rc, link);
	l->nconns--;
	if (rc->st == RC_IDLE)
		l->nidle--;
	else if (rc->st == RC_CONNECTING)
		l->nconnecting--;
	r->st.active_connections--;
	if (rc->idle_timer) {
		event_free(rc->idle_timer);
		rc->idle_timer = NULL;
	}
	if (r->rules)
		policy_class_release(r->rules, rc->slot); /* to the shared store too */
	else
		class_slot_release(rc->slot);
	rc->slot = NULL;
	if (r->stopping && r->st.active_connections == 0)
		event_base_loopexit(r->base, NULL);
}

/* Close a connection: QUIT when it is usable and quit is asked (not while stopping),
 * else at once.  rc must not be used after this. */
void conn_close(struct lane_conn *rc, bool quit)
{
	struct smtp_out *c = rc->c;
	bool stopping = rc->r->stopping;
	conn_detach(rc);
	rc->c = NULL;
	if (quit && !stopping && smtp_out_usable(c))
		smtp_out_quit(c);
	else
		smtp_out_free(c);
}

void lane_close_idle(struct lane *l)
{
	struct lane_conn *rc, *next;
	for (rc = TAILQ_FIRST(&l->conns); rc; rc = next) {
		next = TAILQ_NEXT(rc, link);
		if (rc->st == RC_IDLE || rc->st == RC_CONNECTING)
			conn_close(rc, true);
	}
}

static void on_idle_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct lane_conn *rc = arg;
	conn_close(rc, true);
}

void conn_idle(struct lane_conn *rc)
{
	rc->st = RC_IDLE;
	rc->lane->nidle++;
	struct timeval tv = timeval_from_ms((uint64_t)rc->r->crt->conf.idle_ms);
	evtimer_add(rc->idle_timer, &tv);
}

void lane_signal(struct lane *l, const struct classify_result *cr, const char *text)
{
	struct relay *r = l->r;
	uint64_t now = realtime_ns();
	const struct relay_conf *c = &r->crt->conf;
	snprintf(l->last, sizeof(l->last), "%s", text);
	if (cr->verdict == CLASSIFY_SLOW) {
		lane_budget_slow(&l->b);
		relay_logf(r, LOG_LEVEL_WARNING, "lane=%s slowed to %u%% of its rate: \"%s\" (signal %s)",
		     l->name, (unsigned)(l->b.factor / 10000), text, cr->signal ? cr->signal : "-");
		if (cr->for_ms > 0) {
			lane_budget_suspend(&l->b, now, cr->for_ms * 1000000, 0, 0, text);
			l->suspensions++;
			r->st.suspensions++;
			hist_append_suspension(r, l);
			lane_close_idle(l);
		}
		return;
	}
	uint64_t len = lane_budget_suspend(&l->b, now, cr->for_ms >= 0 ? cr->for_ms * 1000000 : -1,
					   (uint64_t)c->suspend_min_ms * 1000000u,
					   (uint64_t)c->suspend_max_ms * 1000000u, text);
	l->suspensions++;
	r->st.suspensions++;
	hist_append_suspension(r, l);
	relay_logf(r, LOG_LEVEL_WARNING, "lane=%s suspended for %" PRIu64 "s: \"%s\" (signal %s); no "
	     "recipient changes state", l->name, (len + 999999999) / 1000000000, text,
	     cr->signal ? cr->signal : "-");
	lane_close_idle(l);
}

static void on_ready(void *arg, struct smtp_out *c, const struct smtp_out_result *failure);
static void lane_fail_all(struct lane *l, const char *dsn, const char *text);
static void on_resolved(void *arg, int error, const struct mx_target *t, size_t n);

static void lane_resolve(struct lane *l)
{
	const struct route_conf *rc = l->rt->conf;
	if (l->query)
		return;
	const char *name = rc->mx ? l->domain : rc->host;
	uint16_t port = rc->mx ? (uint16_t)(rc->mx_port ? rc->mx_port : 25) : rc->port;
	struct mx_query *q = NULL;
	l->query = (struct mx_query *)1; /* resolving: done() may run before mx_lookup returns */
	int e = mx_lookup(l->r->dns, name, rc->mx, port, on_resolved, l, &q);
	if (e == -EINVAL && rc->mx) {
		/* not a name DNS can hold (raw UTF-8, an overlong label): permanent */
		l->query = NULL;
		char text[400];
		snprintf(text, sizeof(text), "%.200s is not a valid domain name", name);
		lane_fail_all(l, "5.1.2", text);
		return;
	}
	if (e < 0) {
		l->query = NULL;
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = -1,
					      .signal = "dns" };
		char text[300];
		snprintf(text, sizeof(text), "cannot look up %.200s: %s", name, strerror(-e));
		lane_signal(l, &cr, text);
		return;
	}
	if (l->query)
		l->query = q;
}

/* Every recipient of l still to do and not in a transaction fails now with dsn and text
 * (its domain cannot take mail), and the bounces follow. */
static void lane_fail_all(struct lane *l, const char *dsn, const char *text)
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
		msg_check_done(r, m); /* after the flush, and after its transactions */
	}
}

/*
 * l's due recipients wait for their next retry, without a transaction (DANE found no
 * server it may send to): dsn and text say why in the attempt log and the log, and
 * what names the part that decided ("DANE").  Each due recipient once, as a transaction would take them, and
 * at most LANE_DEFER_BATCH messages per call (law 8): the lane is kicked for the rest.
 */
#define LANE_DEFER_BATCH 256

void lane_defer_due(struct lane *l, const char *mta, const char *dsn, const char *what,
		    const char *text)
{
	struct relay *r = l->r;
	size_t idx[64], n = 0, total = 0, msgs = 0;
	uint64_t now = realtime_ns(), next = UINT64_MAX;
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
		item_schedule(r, it);
		msg_close_file(r, m);
	}
	relay_logf(r, LOG_LEVEL_WARNING, "lane=%s mta=%s %s: %s: %zu recipient(s) deferred",
		   l->name, mta, what, text, total);
	lane_arm(l, 0); /* the rest, if any, on the next round */
}

static void on_resolved(void *arg, int error, const struct mx_target *t, size_t n)
{
	struct lane *l = arg;
	struct relay *r = l->r;
	l->query = NULL;
	if (error == -ECANCELED || !l->rt)
		return;
	const char *name = l->rt->conf->mx ? l->domain : l->rt->conf->host;
	if (error == -ENOENT || error == -ENODATA) {
		char text[400];
		if (error == -ENODATA)
			snprintf(text, sizeof(text), "%.200s does not accept mail (null MX)", name);
		else
			snprintf(text, sizeof(text), "%.200s: no such domain, or no address", name);
		if (l->group) {
			lane_group_lost(l, text);
			return;
		}
		if (l->rt->conf->mx) {
			relay_logf(r, LOG_LEVEL_NOTICE, "lane=%s %s: its recipients fail", l->name, text);
			lane_fail_all(l, error == -ENODATA ? "5.1.10" : "5.1.2", text);
			return;
		}
		/* a smarthost that does not resolve is the operator's to fix: no bounce */
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = -1,
					      .signal = "dns" };
		lane_signal(l, &cr, text);
		lane_kick(l);
		return;
	}
	const struct relay_conf *c = &r->crt->conf;
	if (error < 0 || n == 0) {
		char text[300];
		snprintf(text, sizeof(text), "cannot look up %.200s: temporary DNS failure", name);
		/* asked again soon, then less often: relay.dns_retry_min doubling */
		l->dns_failures++;
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND,
					      .for_ms = (int64_t)mx_retry_ms(l->dns_failures,
						(uint64_t)c->dns_retry_min_ms, (uint64_t)c->dns_retry_max_ms),
					      .signal = "dns" };
		lane_signal(l, &cr, text);
		lane_kick(l);
		return;
	}
	if (l->group && !lane_group_matches(l, t, n)) {
		char text[400];
		snprintf(text, sizeof(text), "%.200s is no longer one of its domains", name);
		lane_group_lost(l, text);
		return;
	}
	struct mx_target *copy = calloc(n, sizeof(*copy));
	if (!copy)
		return;
	memcpy(copy, t, n * sizeof(*copy));
	free(l->targets);
	l->targets = copy;
	l->ntargets = n;
	l->dns_failures = 0;
	/* used for the answer's TTL, within relay.dns_min_ttl and dns_max_ttl */
	l->targets_until = realtime_ns() + mx_ttl_ms(t[0].ttl, (uint64_t)c->dns_min_ttl_ms,
						     (uint64_t)c->dns_max_ttl_ms) * 1000000u;
	l->next_target = 0;
	l->targets_fresh = true;
	if (!l->group && l->rt->conf->mx && l->rt->conf->lanes != ROUTE_LANES_DOMAIN &&
	    lane_group(l))
		return; /* its mail went to the group's lane, which is kicked */
	lane_kick(l);
}

static void lane_connect(struct lane *l);

/* The shared store's answer for the class slot of a lane's next connection. */
static void lane_slot_done(void *arg, int rc)
{
	struct lane *l = arg;
	l->slot_wait = NULL;
	/* XXX a reload meanwhile may leave this the last reference: the old rules are then
	 * freed on the relay's loop (rare: a reload within one store timeout) */
	policy_unref(l->slot_rules);
	l->slot_rules = NULL;
	if (rc == 1) {
		l->slot_granted = true;
		lane_connect(l);
		return;
	}
	relay_logf(l->r, LOG_LEVEL_DEBUG, "lane=%s its host class is full on the cluster: the "
		   "mail waits", l->name);
	lane_arm(l, UINT64_C(1000000000));
}

static void lane_connect(struct lane *l)
{
	struct relay *r = l->r;
	uint64_t now = realtime_ns();
	if (!l->ntargets || (now >= l->targets_until && !l->targets_fresh)) {
		lane_resolve(l);
		return;
	}
	/* an outgoing session takes a slot in its host class (Sendmail's XLA): none left,
	 * and the mail waits */
	const struct mx_target *tg = &l->targets[l->next_target % l->ntargets];
	struct class_slot *slot = NULL;
	if (l->slot_wait)
		return; /* its answer connects */
	enum smtp_out_tls tls = l->rt->oc.tls;
	const struct dane_host *dh = NULL;
	bool dane = tls == SMTP_TLS_DANE || tls == SMTP_TLS_DANE_ONLY;
	uint64_t until = 0;
	if (dane && dane_prepare(l, tg, &tls, &dh, &until) <= 0)
		return; /* a TLSA lookup's end kicks the lane; or the next host is tried, or its
			 * recipients were deferred */
	if (l->slot_granted) {
		slot = l->slot;
		l->slot = NULL;
		l->slot_granted = false;
	} else if (r->rules) {
		struct ipaddr ip = { 0 };
		if (tg->addr.ss_family == AF_INET) {
			ip.family = 4;
			memcpy(ip.b, &((const struct sockaddr_in *)&tg->addr)->sin_addr, 4);
		} else {
			ip.family = 6;
			memcpy(ip.b, &((const struct sockaddr_in6 *)&tg->addr)->sin6_addr, 16);
		}
		const char *cls = NULL;
		int in = policy_class_enter_outbound_start(r->rules, &ip, str_cstr(tg->host), &l->slot,
							   &cls, lane_slot_done, l, &l->slot_wait);
		if (in == 2) {
			/* the rules stay while the pending call points into them (a reload may
			 * replace r->rules meanwhile) */
			l->slot_rules = policy_ref(r->rules);
			return; /* the shared store answers: lane_slot_done() */
		}
		slot = l->slot;
		l->slot = NULL;
		if (in == 0) {
			relay_logf(r, LOG_LEVEL_DEBUG, "lane=%s class %s is full: the mail waits", l->name,
			     cls ? cls : "?");
			/* XXX polled: a slot freed by an incoming session wakes no one */
			lane_arm(l, UINT64_C(1000000000));
			return;
		}
	}
	struct lane_conn *rc = calloc(1, sizeof(*rc));
	if (!rc) {
		if (r->rules)
			policy_class_release(r->rules, slot);
		else
			class_slot_release(slot);
		return;
	}
	rc->slot = slot;
	rc->r = r;
	rc->lane = l;
	rc->crt = r->crt;
	rc->cls = l->rt->cls;
	rc->target = l->next_target % l->ntargets;
	const struct mx_target *t = &l->targets[rc->target];
	const struct route_conf *conf = l->rt->conf;
	rc->idle_timer = evtimer_new(r->base, on_idle_timeout, rc);
	/* the connection keeps pointers into its conf_rt, which lives while it is used */
	rc->oc = l->rt->oc;
	rc->oc.tls = tls;
	rc->dane_tls = dane && tls == SMTP_TLS_REQUIRE;
	rc->until = until;
	snprintf(rc->host, sizeof(rc->host), "%s", t->host);
	/* the MX host's name: what its certificate holds; under DANE the TLSA base domain,
	 * whatever the route's sni (RFC 7672 8.1) */
	if (conf->mx && (!conf->sni || dane))
		rc->oc.server_name = rc->host;
	const struct smtp_out_conf *oc = &rc->oc;
	bool ok = rc->idle_timer && (!dh || dane_attach(rc, dh) == 0); /* its TLSA records */
	rc->c = ok ? smtp_out_new(r->base, oc, (const struct sockaddr *)&t->addr,
					      t->addrlen,
					      conf->source.ss_family ? (const struct sockaddr *)&conf->source : NULL,
					      conf->sourcelen)
			       : NULL;
	if (!rc->c) {
		if (rc->idle_timer)
			event_free(rc->idle_timer);
		class_slot_release(rc->slot);
		free(rc->dane);
		free(rc);
		return;
	}
	smtp_out_set_peer_name(rc->c, t->host);
	smtp_out_set_ready(rc->c, on_ready, rc);
	smtp_out_set_freed(rc->c, on_conn_freed, rc);
	rc->st = RC_CONNECTING;
	r->crt->users++;
	TAILQ_INSERT_TAIL(&l->conns, rc, link);
	l->nconns++;
	l->nconnecting++;
	r->st.connections++;
	r->st.active_connections++;
}

static void on_ready(void *arg, struct smtp_out *c, const struct smtp_out_result *failure)
{
	struct lane_conn *rc = arg;
	struct lane *l = rc->lane;
	struct relay *r = rc->r;
	if (!failure && rc->crt != r->crt) {
		/* made under the settings before a reload: not used */
		conn_close(rc, true);
		lane_kick(l);
		return;
	}
	if (!failure) {
		if (rc->st == RC_CONNECTING)
			l->nconnecting--;
		l->next_target = rc->target;
		l->targets_fresh = false;
		if (l->rt && (l->rt->oc.tls == SMTP_TLS_DANE || l->rt->oc.tls == SMTP_TLS_DANE_ONLY))
			dane_on_ready(rc, c);
		conn_idle(rc);
		if (r->stopping) {
			conn_close(rc, true);
			return;
		}
		lane_kick(l);
		return;
	}
	bool setup = rc->st == RC_CONNECTING;
	struct classify *cls = l->rt ? l->rt->cls : NULL;
	char text[1200];
	relay_reply_text(failure, failure->reply.code ? &failure->reply : NULL, text, sizeof(text));
	char peer[300];
	snprintf(peer, sizeof(peer), "%s", smtp_out_peer(c));
	bool dane_failed = rc->dane_tls && failure->stage == SMTP_STAGE_STARTTLS &&
			   failure->error == -EPERM;
	enum smtp_out_dane_fail dfail = smtp_out_dane_failure(c);
	conn_close(rc, false);
	if (!setup || r->stopping || !cls) {
		lane_kick(l);
		return;
	}
	relay_logf(r, LOG_LEVEL_NOTICE, "lane=%s mta=%s session failed at %s: \"%s\"", l->name, peer,
	     smtp_out_stage_name(failure->stage), text);
	/* a host that cannot be reached, or whose certificate matches no TLSA record: the
	 * next address first, before the lane waits */
	if (failure->error < 0 && (failure->stage == SMTP_STAGE_CONNECT || dane_failed) &&
	    l->ntargets > 1 && (l->next_target + 1) % l->ntargets != 0) {
		l->next_target++;
		lane_kick(l);
		return;
	}
	l->next_target = 0;
	l->targets_fresh = false;
	if (dane_failed) {
		/* RFC 7672 2.2: no delivery to a server that fails DANE; the recipients wait
		 * (an attack, or a key rollover, passes), never bounced */
		char why[1300];
		snprintf(why, sizeof(why), "%s: %s",
			 dfail == SMTP_DANE_FAIL_NO_MATCH
			 ? "the server's certificate matches no TLSA record"
			 : dfail == SMTP_DANE_FAIL_NAME
			 ? "the server's certificate does not name the MX host (DANE-TA)"
			 : "the TLS its TLSA records require failed", text);
		dane_deferred(l, peer, why);
		return;
	}
	struct classify_result cr;
	lane_classify(l, cls, failure->stage, failure->error,
		      failure->reply.code ? &failure->reply : NULL, NULL, &cr);
	if (cr.verdict != CLASSIFY_SLOW)
		cr.verdict = CLASSIFY_SUSPEND; /* no recipient was involved */
	lane_signal(l, &cr, text);
	lane_kick(l);
}

/* ---- the scheduler ---- */

/* Idle connections whose DNS answers are over (DANE: dane_reusable()) go. */
static void lane_close_stale(struct lane *l, uint64_t now)
{
	struct lane_conn *rc, *next;
	for (rc = TAILQ_FIRST(&l->conns); rc; rc = next) {
		next = TAILQ_NEXT(rc, link);
		if (rc->st == RC_IDLE && !dane_reusable(rc, now))
			conn_close(rc, true);
	}
}

static struct lane_conn *lane_idle_conn(struct lane *l)
{
	struct lane_conn *rc;
	TAILQ_FOREACH(rc, &l->conns, link)
		if (rc->st == RC_IDLE)
			return rc;
	return NULL;
}

static void lane_shared_take(struct lane *l, struct lane_conn *rc);

void lane_kick(struct lane *l)
{
	struct relay *r = l->r;
	if (r->stopping || !l->rt || l->deciding)
		return;
	for (;;) {
		uint64_t now = realtime_ns();
		const struct route_conf *conf = l->rt->conf;
		if (l->nidle && (l->rt->oc.tls == SMTP_TLS_DANE || l->rt->oc.tls == SMTP_TLS_DANE_ONLY))
			lane_close_stale(l, now);
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
			lane_close_idle(l);
		if (d.action == SCHED_SLEEP) {
			lane_arm(l, d.wake == SCHED_NEVER ? UINT64_MAX : d.wake > now ? d.wake - now : 0);
			return;
		}
		if (d.action == SCHED_CONNECT)
			lane_connect(l);
		/* SCHED_CONNECT, SCHED_HOLD: a connection's ready, or a transaction's end,
		 * kicks the lane again */
		if (d.action != SCHED_SEND)
			return;
		struct lane_conn *idle = lane_idle_conn(l);
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
	uint64_t now = realtime_ns();
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
	struct lane_conn *idle = lane_idle_conn(l);
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
		tx_start(l, rc, realtime_ns(), false);
		return;
	}
	struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = 10000,
				      .signal = "store" };
	lane_signal(l, &cr, "the shared budget cannot be asked");
}
