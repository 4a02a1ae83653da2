/*
 * relay_conn -- a lane's connections and DNS, on the relay's thread: looking up the
 * smarthost or the domain's MX hosts (mx.c), opening a connection (a host class slot,
 * DANE's decision, smtp_out's session), what a failed setup means for the lane, idle
 * connections and their timers, and closing.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include <event2/event.h>

#include "relay_int.h"
#include "util.h"

static void on_ready(void *arg, struct smtp_out *c, const struct smtp_out_result *failure);
static void on_resolved(void *arg, int error, const struct mx_target *t, size_t n);

/* ---- connections ---- */

/* The connection's memory goes with its smtp_out's (which may finish a QUIT after the
 * relay is done with it): the configuration it points to stays until then. */
static void on_conn_freed(void *arg)
{
	struct lane_conn *rc = arg;
	rc->crt->users--;
	free(rc->dane);
	free(rc); /* a retired configuration it used goes at the next sweep (relay.c) */
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

void conn_close_idle(struct lane *l)
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

void conn_resolve(struct lane *l)
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
			group_lost(l, text);
			return;
		}
		if (l->rt->conf->mx) {
			base_logf(r, LOG_LEVEL_NOTICE, "lane=%s %s: its recipients fail", l->name, text);
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
	if (l->group && !group_matches(l, t, n)) {
		char text[400];
		snprintf(text, sizeof(text), "%.200s is no longer one of its domains", name);
		group_lost(l, text);
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
	l->targets_until = relay_now(l->r) + mx_ttl_ms(t[0].ttl, (uint64_t)c->dns_min_ttl_ms,
							 (uint64_t)c->dns_max_ttl_ms) * 1000000u;
	l->next_target = 0;
	l->targets_fresh = true;
	if (!l->group && l->rt->conf->mx && l->rt->conf->lanes != ROUTE_LANES_DOMAIN &&
	    group_join(l))
		return; /* its mail went to the group's lane, which is kicked */
	lane_kick(l);
}


/* The shared store's answer for the class slot of a lane's next connection. */
static void slot_done(void *arg, int rc)
{
	struct lane *l = arg;
	l->slot_wait = NULL;
	/* XXX a reload meanwhile may leave this the last reference: the old rules are then
	 * freed on the relay's loop (rare: a reload within one store timeout) */
	policy_unref(l->slot_rules);
	l->slot_rules = NULL;
	if (rc == 1) {
		l->slot_granted = true;
		conn_open(l);
		return;
	}
	base_logf(l->r, LOG_LEVEL_DEBUG, "lane=%s its host class is full on the cluster: the "
		  "mail waits", l->name);
	lane_arm(l, UINT64_C(1000000000));
}

void conn_open(struct lane *l)
{
	struct relay *r = l->r;
	uint64_t now = relay_now(l->r);
	if (!l->ntargets || (now >= l->targets_until && !l->targets_fresh)) {
		conn_resolve(l);
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
	if (dane) {
		char why[600];
		switch (dane_prepare(l, tg, &tls, &dh, &until, why, sizeof(why))) {
		case DANE_GO:
			break;
		case DANE_WAIT:
			return; /* the TLSA lookup's end kicks the lane */
		case DANE_POLL:
			lane_arm(l, UINT64_C(1000000000));
			return;
		case DANE_NEXT_MX:
			lane_arm(l, 0);
			return;
		case DANE_DEFER:
			lane_defer_due(l, tg->host, DANE_DSN, "DANE", why);
			return;
		}
	}
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
							   &cls, slot_done, l, &l->slot_wait);
		if (in == 2) {
			/* the rules stay while the pending call points into them (a reload may
			 * replace r->rules meanwhile) */
			l->slot_rules = policy_ref(r->rules);
			return; /* the shared store answers: slot_done() */
		}
		slot = l->slot;
		l->slot = NULL;
		if (in == 0) {
			base_logf(r, LOG_LEVEL_DEBUG, "lane=%s class %s is full: the mail waits", l->name,
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
	base_reply_text(failure, failure->reply.code ? &failure->reply : NULL, text, sizeof(text));
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
	base_logf(r, LOG_LEVEL_NOTICE, "lane=%s mta=%s session failed at %s: \"%s\"", l->name, peer,
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
		dane_defer_status(l, peer, why);
		lane_defer_due(l, peer, DANE_DSN, "DANE", why);
		return;
	}
	struct classify_result cr;
	signal_classify(l, cls, failure->stage, failure->error,
			failure->reply.code ? &failure->reply : NULL, NULL, &cr);
	if (cr.verdict != CLASSIFY_SLOW)
		cr.verdict = CLASSIFY_SUSPEND; /* no recipient was involved */
	lane_signal(l, &cr, text);
	lane_kick(l);
}

/* Idle connections whose DNS answers are over (DANE: dane_reusable()) go. */
void conn_close_stale(struct lane *l, uint64_t now)
{
	struct lane_conn *rc, *next;
	for (rc = TAILQ_FIRST(&l->conns); rc; rc = next) {
		next = TAILQ_NEXT(rc, link);
		if (rc->st == RC_IDLE && !dane_reusable(rc, now))
			conn_close(rc, true);
	}
}

struct lane_conn *conn_find_idle(struct lane *l)
{
	struct lane_conn *rc;
	TAILQ_FOREACH(rc, &l->conns, link)
		if (rc->st == RC_IDLE)
			return rc;
	return NULL;
}

