/*
 * relay -- the top of the relay (relay.h): its thread, the dispatch of its mailbox, the
 * sweep (expiry, delay notices, lanes that hold nothing), start, stop and reload.  The
 * rooms of the relay are listed in relay_int.h; none of them calls this one.
 *
 * Everything here runs on the relay's own loop, except the queue's listener (the queue's
 * threads) and relay_new/start/stop/free (the daemon's main thread).
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

static void on_queue_event(void *arg, enum queue_event ev, const char *id)
{
	struct relay *r = arg;
	struct mb_item *it = calloc(1, sizeof(*it));
	if (!it)
		return; /* XXX without memory, the relay learns of it only at the next start */
	it->kind = MB_QUEUE;
	it->ev = ev;
	snprintf(it->id, sizeof(it->id), "%s", id);
	if (base_post(r, it) < 0)
		free(it);
}

/* ---- configuration ---- */

static void conf_rt_free(struct conf_rt *c)
{
	if (!c)
		return;
	for (size_t i = 0; c->routes && i < c->conf.nroutes; i++)
		classify_free(c->routes[i].cls);
	free(c->routes);
	relay_conf_clear(&c->conf);
	free(c);
}

static struct conf_rt *conf_rt_new(const struct relay_conf *src, char *err, size_t errlen)
{
	struct conf_rt *c = calloc(1, sizeof(*c));
	if (!c || relay_conf_copy(src, &c->conf) < 0) {
		free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->routes = calloc(c->conf.nroutes ? c->conf.nroutes : 1, sizeof(*c->routes));
	if (!c->routes) {
		conf_rt_free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < c->conf.nroutes; i++) {
		struct route_conf *rc = &c->conf.routes[i];
		struct route_rt *rt = &c->routes[i];
		rt->conf = rc;
		char e[256];
		rt->cls = classify_new(rc->signals, rc->nsignals, e, sizeof(e));
		if (!rt->cls) {
			snprintf(err, errlen, "route \"%s\": %s", rc->name, e);
			conf_rt_free(c);
			return NULL;
		}
		rt->oc.helo = rc->helo ? rc->helo : c->conf.hostname;
		rt->oc.server_name = rc->sni ? rc->sni : rc->mx ? NULL : rc->host;
		rt->oc.tls = rc->tls;
		rt->oc.ca_file = rc->ca_file;
		rt->oc.auth_user = rc->auth_user;
		rt->oc.auth_password = rc->auth_password;
		rt->oc.auth_mechanisms = rc->auth_mechanisms;
		rt->oc.auth_plaintext = rc->auth_plaintext;
		memcpy(rt->oc.timeout_ms, rc->timeout_ms, sizeof(rt->oc.timeout_ms));
	}
	return c;
}

static struct route_rt *route_rt_by_name(struct conf_rt *c, const char *name)
{
	for (size_t i = 0; i < c->conf.nroutes; i++)
		if (strcmp(c->conf.routes[i].name, name) == 0)
			return &c->routes[i];
	return NULL;
}

/* The configurations retired by reloads that no connection uses any more go (at each
 * reload, and at each sweep). */
static void retired_sweep(struct relay *r)
{
	for (struct conf_rt **p = &r->retired; *p;) {
		if ((*p)->users == 0) {
			struct conf_rt *c = *p;
			*p = c->next;
			conf_rt_free(c);
		} else {
			p = &(*p)->next;
		}
	}
}

/* ---- the mailbox, on the relay's loop ---- */

static void stop_now(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		while (!TAILQ_EMPTY(&l->conns)) {
			struct lane_conn *rc = TAILQ_FIRST(&l->conns);
			if (rc->tx) {
				/* its recipients stay T on disk: sent again after the restart */
				rc->tx->m->busy--;
				tx_free(rc->tx);
				rc->tx = NULL;
			}
			conn_close(rc, false);
		}
	}
	event_base_loopexit(r->base, NULL);
}

static void begin_stop(struct relay *r, int64_t deadline_ms)
{
	if (r->stopping) {
		/* a second stop: a shorter deadline wins */
		struct timeval tv = timeval_from_ms((uint64_t)(deadline_ms > 0 ? deadline_ms : 0));
		if (deadline_ms < r->stop_deadline_ms) {
			r->stop_deadline_ms = deadline_ms;
			evtimer_add(r->stop_timer, &tv);
		}
		return;
	}
	r->stopping = true;
	r->stop_deadline_ms = deadline_ms;
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		conn_close_idle(l);
		sched_wake(&r->sched, &l->s, SCHED_NEVER);
		if (l->call) {
			store_slide_cancel(r->store, l->call);
			free(l->call);
			l->call = NULL;
			l->deciding = false;
		}
		if (l->query) {
			mx_cancel(l->query);
			l->query = NULL;
		}
	}
	if (r->st.active_connections == 0) {
		event_base_loopexit(r->base, NULL);
		return;
	}
	struct timeval tv = timeval_from_ms(r->stop_deadline_ms);
	evtimer_add(r->stop_timer, &tv);
}

/* A call's answer, to the thread that waits for it (base_call_sync()). */
static void call_done(struct relay *r, struct mb_item *it, int rc)
{
	pthread_mutex_lock(&r->call_lock);
	it->rc = rc;
	it->done = true; /* the caller's item is gone after it */
	pthread_cond_broadcast(&r->call_cond);
	pthread_mutex_unlock(&r->call_lock);
}

/*
 * Message id, loaded (if it was not) and routed; one loaded now with nothing left to do
 * is settled (removed, or its bounce started).  NULL: gone, or it cannot be loaded.
 */
static struct rmsg *load(struct relay *r, const char *id)
{
	struct rmsg *m = NULL;
	int rc = msg_load(r, id, &m);
	if (rc < 0)
		return NULL;
	if (rc == 1) {
		bounce_check(r, m); /* may free it */
		return msg_find(r, id);
	}
	return m;
}

/* ---- the sweep: expiry, bounces that could not be queued, delay notices, lanes that
 * hold nothing, the history's compaction ---- */

static void expire(struct relay *r, struct rmsg *m, uint64_t now)
{
	const struct relay_conf *c = &r->crt->conf;
	if (!c->lifetime_ms || m->busy || m->bouncing || m->deleted || m->held)
		return; /* held mail waits for the operator, as Postfix's hold queue does */
	if (m->arrival_us * 1000 + (uint64_t)c->lifetime_ms * 1000000u > now)
		return;
	char text[200], d[32];
	fmt_duration(d, sizeof(d), (uint64_t)c->lifetime_ms, DURATION_BRIEF);
	snprintf(text, sizeof(text), "delivery time expired: the message stayed in the queue "
		 "for %s", d);
	bounce_fail_pending(r, m, "4.4.7", text);
}

/* Every 30 s, or a quarter of queue.lifetime when that is shorter. */
static void sweep_arm(struct relay *r)
{
	int64_t ms = SWEEP_MS;
	int64_t quarter = r->crt->conf.lifetime_ms / 4;
	if (quarter > 0 && quarter < ms)
		ms = quarter < 250 ? 250 : quarter;
	quarter = r->crt->conf.delay_warning_ms / 4;
	if (quarter > 0 && quarter < ms)
		ms = quarter < 250 ? 250 : quarter;
	struct timeval tv = timeval_from_ms((uint64_t)ms);
	evtimer_add(r->sweep, &tv);
}

/*
 * The sweep walks no more than what is due: the messages are in arrival order, so
 * expiry stops at the first one younger than the lifetime (it passes over the held and
 * busy ones before it), delay notices go on from where their last walk stopped, and only
 * the messages whose end could not be settled are looked at again.
 */
static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	uint64_t now = relay_now(r);
	struct rmsg *m, *next;
	uint64_t life = (uint64_t)r->crt->conf.lifetime_ms * 1000000u;
	for (m = TAILQ_FIRST(&r->msgs); life && m && m->arrival_us * 1000 + life <= now; m = next) {
		next = TAILQ_NEXT(m, link);
		expire(r, m, now);
	}
	char (*ids)[QUEUE_ID_LEN + 1] = r->recheck;
	size_t nids = r->nrecheck;
	r->recheck = NULL;
	r->nrecheck = r->recheck_cap = 0;
	for (size_t i = 0; i < nids; i++)
		if ((m = msg_find(r, ids[i]))) {
			m->recheck = false;
			bounce_check(r, m);
		}
	free(ids);
	int64_t dw = r->crt->conf.delay_warning_ms;
	for (m = r->warned_upto ? TAILQ_NEXT(r->warned_upto, link) : TAILQ_FIRST(&r->msgs);
	     dw > 0 && m && m->arrival_us * 1000 + (uint64_t)dw * 1000000u <= now; m = next) {
		next = TAILQ_NEXT(m, link);
		if (m->busy || m->bouncing)
			break; /* again at the next sweep */
		r->warned_upto = m;
		/* held mail waits for the operator, and gets no notice */
		if (m->warned || m->deleted || m->held)
			continue;
		bool pending = false;
		for (size_t i = 0; i < m->nrcpt && !pending; i++)
			pending = m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN;
		if (pending)
			bounce_start(r, m, true);
	}
	lane_sweep(r, now);
	retired_sweep(r);
	if (r->hist_lines > 100000)
		hist_compact(r);
	sweep_arm(r);
}

static void on_mailbox(void *items, size_t n, void *arg)
{
	struct relay *r = arg;
	struct mb_item **its = items;
	for (size_t k = 0; k < n; k++) {
		struct mb_item *it = its[k];
		struct rmsg *m;
		switch (it->kind) {
		case MB_QUEUE:
			m = msg_find(r, it->id);
			switch (it->ev) {
			case QUEUE_EV_NEW:
				if (!m && (m = load(r, it->id)))
					lane_kick_msg(m);
				break;
			case QUEUE_EV_HOLD:
				if (m) {
					m->held = true;
					msg_schedule(r, m);
				}
				break;
			case QUEUE_EV_RELEASE:
			case QUEUE_EV_FLUSH:
				if (!m) {
					if (!(m = load(r, it->id)))
						break;
				}
				if (it->ev == QUEUE_EV_RELEASE)
					m->held = false;
				else
					msg_flush_now(r, m);
				msg_schedule(r, m);
				lane_kick_msg(m);
				break;
			case QUEUE_EV_DELETE:
				if (m) {
					m->deleted = true;
					bounce_check(r, m);
				}
				break;
			case QUEUE_EV_BOUNCE:
				if (!m && !(m = load(r, it->id)))
					break;
				bounce_by_operator(r, m);
				break;
			}
			free(it);
			break;
		case MB_DSN_DONE:
			m = msg_find(r, it->id);
			if (it->rc == 0)
				r->st.dsn_sent++;
			if (it->rc == 0 && it->delayed)
				r->st.dsn_delay_sent++;
			if (m && it->rc == 0 && it->delayed) {
				m->bouncing = false;
				m->warned = true;
				if (msg_open_file(r, m) == 0) {
					queue_set_control(r->q, m->qm, QUEUE_CTL_WARNED, 'W');
					queue_msg_sync(m->qm);
					msg_close_file(r, m);
				}
				msg_schedule(r, m);
				lane_kick_msg(m);
				if (m->bounce_asked)
					bounce_by_operator(r, m); /* last: it may free m */
				else
					bounce_check(r, m);
			} else if (m && it->rc == 0) {
				bounce_done(r, m);
			} else if (m) {
				m->bouncing = false;
				base_logf(r, LOG_LEVEL_ERROR, "qid=%s bounce cannot be committed: %s (tried again "
				     "later)", it->id, strerror(-it->rc));
				if (it->delayed)
					r->warned_upto = TAILQ_PREV(m, rmsg_list, link);
				else
					msg_recheck_later(r, m);
				msg_schedule(r, m);
				lane_kick_msg(m);
				if (m->bounce_asked)
					bounce_by_operator(r, m);
			}
			free(it);
			break;
		case MB_CALL:
			call_done(r, it, it->fn(r, it->arg));
			break;
		case MB_STOP:
			begin_stop(r, it->deadline_ms);
			free(it);
			break;
		case MB_HIST_SYNCED:
			hist_synced(r, it->hist_seq, it->rc);
			tx_hist_synced(r);
			free(it);
			break;
		case MB_SETTLED:
			m = msg_find(r, it->id);
			if (it->rc < 0)
				base_logf(r, LOG_LEVEL_ERROR, "qid=%s statuses cannot be flushed: %s", it->id,
				     strerror(-it->rc));
			if (m && m->flushing) {
				m->flushing--;
				if (it->rc < 0)
					m->flushing++; /* not on disk: never removed in this run */
				else
					bounce_check(r, m);
			}
			free(it);
			break;
		}
	}
}

/* ---- the thread ---- */

static void load_queue(struct relay *r)
{
	char (*ids)[QUEUE_ID_LEN + 1] = NULL;
	size_t n = 0;
	if (queue_ids(r->q, &ids, &n) < 0) {
		base_logf(r, LOG_LEVEL_ERROR, "the queue cannot be listed: out of memory");
		return;
	}
	for (size_t i = 0; i < n; i++)
		load(r, ids[i]);
	free(ids);
	size_t msgs = 0, rcpts = 0;
	struct rmsg *m;
	TAILQ_FOREACH(m, &r->msgs, link) {
		msgs++;
		for (size_t i = 0; i < m->nrcpt; i++)
			rcpts += m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN;
	}
	base_logf(r, LOG_LEVEL_INFO, "started: %zu message(s) with %zu recipient(s) to deliver, "
	     "%zu route(s)", msgs, rcpts, r->crt->conf.nroutes);
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link)
		lane_kick(l);
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	thread_set_base(r->base);
	load_queue(r);
	sweep_arm(r);
	event_base_dispatch(r->base);
	/* The loop is over (stopping, and its connections are gone) before relay_stop()
	 * joins: calls posted from now on fail, and those already waiting are answered here,
	 * so that no thread (`sluice lanes` during the drain, a metrics scrape) waits for a
	 * loop that will not run again. */
	mailbox_shut(&r->mb);
	size_t n;
	struct mb_item **its = mailbox_take(&r->mb, &n);
	for (size_t k = 0; k < n; k++) {
		if (its[k]->kind == MB_CALL)
			call_done(r, its[k], -ESHUTDOWN);
		else
			free(its[k]); /* never handled: the loop will not run again */
	}
	free(its);
	/* connections still saying QUIT, and those cut by the deadline, go now */
	smtp_out_abandon_quitting(r->base);
	thread_set_base(NULL);
	return NULL;
}

/* ---- the public side ---- */

struct relay *relay_new(const struct relay_conf *conf, struct queue *q, struct store *store,
			struct policy *rules, relay_log_fn *log, void *log_arg, char *err,
			size_t errlen)
{
	struct relay *r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->q = q;
	r->qd = queue_directory(q);
	r->store = store;
	r->rules = rules ? policy_ref(rules) : NULL;
	r->log = log;
	r->log_arg = log_arg;
	r->hist_fd = -1;
	sched_init(&r->sched);
	r->wake_at = SCHED_NEVER;
	lane_register(r);
	TAILQ_INIT(&r->msgs);
	TAILQ_INIT(&r->open_idle);
	TAILQ_INIT(&r->lanes);
	mailbox_init(&r->mb, sizeof(struct mb_item *));
	pthread_mutex_init(&r->call_lock, NULL);
	pthread_cond_init(&r->call_cond, NULL);
	pthread_mutex_init(&r->fl_lock, NULL);
	pthread_cond_init(&r->fl_cond, NULL);
	r->fl_tail = &r->fl_head;
	TAILQ_INIT(&r->hist_wait);
	r->crt = conf_rt_new(conf, err, errlen);
	if (!r->crt) {
		relay_free(r);
		return NULL;
	}
	for (size_t i = 0; i < r->crt->conf.nroutes; i++) {
		const struct route_conf *rc = &r->crt->conf.routes[i];
		if (rc->shared && (!store || !store_is_shared(store))) {
			snprintf(err, errlen, "route \"%s\": shared = true needs store { type = "
				 "\"redis\"; }", rc->name);
			relay_free(r);
			return NULL;
		}
	}
	if (hist_load(r, err, errlen) < 0) {
		relay_free(r);
		return NULL;
	}
	hist_compact(r);
	r->base = event_base_new();
	int e = r->base ? mailbox_attach(&r->mb, r->base, on_mailbox, r) : -ENOMEM;
	if (e < 0) {
		snprintf(err, errlen, "cannot make the relay's event loop: %s", strerror(-e));
		relay_free(r);
		return NULL;
	}
	r->sweep = evtimer_new(r->base, on_sweep, r);
	r->stop_timer = evtimer_new(r->base, stop_now, r);
	r->wake = evtimer_new(r->base, lane_on_wake, r);
	if (!r->sweep || !r->stop_timer || !r->wake) {
		snprintf(err, errlen, "out of memory");
		relay_free(r);
		return NULL;
	}
	r->dns = mx_resolver_new(r->base, r->crt->conf.dns_servers, err, errlen);
	if (!r->dns) {
		relay_free(r);
		return NULL;
	}
	queue_set_listener(q, on_queue_event, r);
	return r;
}

int relay_start(struct relay *r)
{
	int e = pthread_create(&r->flusher, NULL, flush_main, r);
	if (e)
		return -e;
	r->flusher_started = true;
	e = pthread_create(&r->thread, NULL, relay_main, r);
	if (e)
		return -e;
	r->started = true;
	return 0;
}

static void flusher_stop(struct relay *r)
{
	if (!r->flusher_started)
		return;
	pthread_mutex_lock(&r->fl_lock);
	r->fl_stop = true;
	pthread_cond_signal(&r->fl_cond);
	pthread_mutex_unlock(&r->fl_lock);
	pthread_join(r->flusher, NULL); /* what was handed over is flushed first */
	r->flusher_started = false;
}

struct new_conf {
	struct conf_rt *crt;
	struct policy *rules;
};

static int apply_conf(struct relay *r, void *arg)
{
	struct new_conf *ncf = arg;
	struct conf_rt *nc = ncf->crt;
	struct policy *old_rules = r->rules;
	r->rules = ncf->rules;
	ncf->rules = old_rules; /* released by the caller, off the relay's loop */
	struct conf_rt *old = r->crt;
	r->crt = nc;
	old->next = r->retired;
	r->retired = old;
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		const char *route = l->rt ? l->rt->conf->name : NULL;
		char rname[300];
		if (!route) {
			/* a lane whose route had gone: its name starts with the route's */
			snprintf(rname, sizeof(rname), "%s", l->name);
			rname[strcspn(rname, ":")] = '\0';
			route = rname;
		}
		struct route_rt *rt = route_rt_by_name(nc, route);
		if (rt && (rt->conf->mx != (l->domain != NULL)))
			rt = NULL;
		bool moved = !l->rt || !rt || (rt->conf->host && l->rt->conf->host &&
					       strcmp(rt->conf->host, l->rt->conf->host) != 0) ||
			     (rt->conf->port != l->rt->conf->port) ||
			     (rt->conf->mx_port != l->rt->conf->mx_port);
		lane_reconf(l, rt);
		if (moved) {
			free(l->targets);
			l->targets = NULL;
			l->ntargets = 0;
		}
		/* connections made with the old settings: the idle ones go */
		conn_close_idle(l);
	}
	struct rmsg *m;
	TAILQ_FOREACH(m, &r->msgs, link)
		msg_route(r, m);
	TAILQ_FOREACH(l, &r->lanes, link)
		lane_kick(l);
	retired_sweep(r);
	base_logf(r, LOG_LEVEL_INFO, "configuration applied (%zu route(s)); budgets keep their "
	     "history", nc->conf.nroutes);
	return 0;
}

int relay_reconfigure(struct relay *r, const struct relay_conf *conf, struct policy *rules)
{
	char err[256];
	struct new_conf ncf = { .crt = conf_rt_new(conf, err, sizeof(err)),
				.rules = rules ? policy_ref(rules) : NULL };
	if (!ncf.crt) {
		if (ncf.rules)
			policy_unref(ncf.rules);
		return -ENOMEM;
	}
	int e = base_call_sync(r, apply_conf, &ncf);
	if (e < 0)
		conf_rt_free(ncf.crt);
	if (ncf.rules)
		policy_unref(ncf.rules);
	return e;
}

void relay_shutdown(struct relay *r, int64_t deadline_ms)
{
	if (!r || !r->started)
		return;
	struct mb_item *it = calloc(1, sizeof(*it));
	if (it) {
		it->kind = MB_STOP;
		it->deadline_ms = deadline_ms;
		if (base_post(r, it) < 0)
			free(it);
	}
}

void relay_stop(struct relay *r, int64_t deadline_ms)
{
	if (!r || !r->started)
		return;
	relay_shutdown(r, deadline_ms);
	pthread_join(r->thread, NULL);
	flusher_stop(r);
	r->started = false;
	mailbox_shut(&r->mb);
}

struct relay *relay_free(struct relay *r)
{
	if (!r)
		return NULL;
	relay_stop(r, 0);
	queue_set_listener(r->q, NULL, NULL);
	/* first: a lookup cancelled here calls back into its lane, which must still exist */
	r->dns = mx_resolver_free(r->dns);
	struct lane *l;
	while ((l = TAILQ_FIRST(&r->lanes))) {
		while (!TAILQ_EMPTY(&l->conns)) {
			struct lane_conn *rc = TAILQ_FIRST(&l->conns);
			if (rc->tx) {
				rc->tx->m->busy--;
				rc->tx = tx_free(rc->tx);
			}
			conn_close(rc, false);
		}
		lane_unlink(r, l);
		free(l->call); /* cancelled when the relay stopped */
		lane_free(l);
	}
	dane_cache_free(r);
	struct rmsg *m;
	while ((m = TAILQ_FIRST(&r->msgs))) {
		msg_forget_lanes(m); /* the lanes are gone */
		msg_free(r, m);
	}
	if (r->sweep)
		event_free(r->sweep);
	if (r->stop_timer)
		event_free(r->stop_timer);
	if (r->wake)
		event_free(r->wake);
	sched_done(&r->sched);
	size_t n;
	struct mb_item **its = mailbox_take(&r->mb, &n);
	for (size_t k = 0; k < n; k++)
		if (its[k]->kind != MB_CALL)
			free(its[k]);
	free(its);
	mailbox_done(&r->mb); /* before the base: its event */
	if (r->base)
		event_base_free(r->base);
	if (r->hist_fd >= 0)
		close(r->hist_fd);
	for (size_t i = 0; i < r->nhist; i++) {
		free(r->hist[i].name);
		free(r->hist[i].why);
	}
	free(r->hist);
	htab_clear(&r->msg_idx);
	htab_clear(&r->lane_idx);
	free(r->recheck);
	conf_rt_free(r->crt);
	if (r->rules)
		policy_unref(r->rules);
	while (r->retired) {
		struct conf_rt *c = r->retired;
		r->retired = c->next;
		conf_rt_free(c);
	}
	flusher_stop(r); /* relay_start() may have started it alone */
	pthread_mutex_destroy(&r->call_lock);
	pthread_cond_destroy(&r->call_cond);
	pthread_mutex_destroy(&r->fl_lock);
	pthread_cond_destroy(&r->fl_cond);
	free(r);
	return NULL;
}
