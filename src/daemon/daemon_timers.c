/*
 * daemon_timers -- the main loop's timers: the statistics interval (one log line per
 * service, class and store), the memory store's snapshot and expiry sweep, the
 * overrides files' checks, and the renewal of this node's leases in a shared store
 * (lease.c).  They run on the main loop only; a reload arms again those whose period is
 * the configuration's (daemon_timers_rearm()).
 */
#include <event2/event.h>
#include <pthread.h>

#include "daemon_int.h"
#include "engine.h"
#include "lease.h"
#include "log.h"
#include "policy.h"
#include "stats.h"
#include "store.h"
#include "util.h"

static void log_class_stats(struct daemon *d)
{
	struct class_stats cs[64];
	pthread_mutex_lock(&d->cfg_lock);
	size_t n = policy_class_stats(daemon_config_of(d->cfg)->rules, cs, ARRAY_SIZE(cs));
	pthread_mutex_unlock(&d->cfg_lock);
	for (size_t i = 0; i < n; i++)
		log_info("stats class=%s used=%u peak=%u inbound=%u sessions=%u entered=%llu "
			 "refused=%llu", cs[i].name, cs[i].used, cs[i].peak, cs[i].inbound,
			 cs[i].sessions, (unsigned long long)cs[i].entered,
			 (unsigned long long)cs[i].refused);
	struct store_stats ss;
	d->store->ops->stats(d->store->ctx, &ss);
	log_info("stats store=%s keys=%llu max_keys=%llu bytes=%llu evicted=%llu expired=%llu "
		 "decisions=%llu errors=%llu", d->store->type, (unsigned long long)ss.keys,
		 (unsigned long long)ss.max_keys, (unsigned long long)ss.bytes,
		 (unsigned long long)ss.evicted, (unsigned long long)ss.expired,
		 (unsigned long long)ss.decisions, (unsigned long long)ss.errors);
}

void daemon_timers_stats(struct daemon *d, bool reset)
{
	for (size_t i = 0; engine_service(d->e, i); i++) {
		struct service_stats st;
		service_stats(engine_service(d->e, i), reset, &st);
		const struct service_counters *c = &st.interval;
		log_info("stats svc=%s interval=%.0fs connections=%llu sessions=%llu current=%llu "
			 "peak=%llu refused=%llu protocol_errors=%llu timeouts=%llu "
			 "deadlines=%llu evicted=%llu "
			 "duration_min=%.6f duration_mean=%.6f duration_max=%.6f duration_sd=%.6f "
			 "work_min=%.6f work_mean=%.6f work_max=%.6f work_sd=%.6f",
			 st.name, st.interval_seconds, (unsigned long long)c->connections,
			 (unsigned long long)c->sessions, (unsigned long long)st.current,
			 (unsigned long long)st.peak, (unsigned long long)c->refused,
			 (unsigned long long)c->protocol_errors, (unsigned long long)c->timeouts,
			 (unsigned long long)c->deadlines, (unsigned long long)c->evicted,
			 c->duration.n ? c->duration.min : 0.0, c->duration.mean,
			 c->duration.n ? c->duration.max : 0.0, stat_acc_stddev(&c->duration),
			 c->work.n ? c->work.min : 0.0, c->work.mean, c->work.n ? c->work.max : 0.0,
			 stat_acc_stddev(&c->work));
	}
}

static void arm_stats(struct daemon *d)
{
	event_del(d->ev_stats);
	int64_t ms = d->cfg->stats_interval_ms;
	if (ms <= 0)
		return;
	struct timeval tv = timeval_from_ms((uint64_t)ms);
	event_add(d->ev_stats, &tv);
}

static void on_stats(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	(void)fd;
	(void)what;
	daemon_timers_stats(d, true);
	log_class_stats(d);
	arm_stats(d);
}

/* XXX the snapshot is written on the main thread: it holds one shard lock at a time, and
 * the listeners wait for the write and fsync (milliseconds for a million keys). */
void daemon_timers_snapshot(struct daemon *d)
{
	char err[512];
	if (d->store->ops->save(d->store->ctx, err, sizeof(err)) < 0)
		log_error("cannot save the limits snapshot: %s", err);
}

static void arm_timer(struct event *ev, int64_t ms)
{
	event_del(ev);
	if (ms > 0) {
		struct timeval tv = timeval_from_ms((uint64_t)ms);
		event_add(ev, &tv);
	}
}

static void on_snapshot(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	(void)fd;
	(void)what;
	daemon_timers_snapshot(d);
	arm_timer(d->ev_snapshot, d->cfg->store.snapshot_interval_ms);
}

static void on_expire(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	(void)fd;
	(void)what;
	d->store->ops->expire(d->store->ctx, realtime_ns());
	arm_timer(d->ev_expire, 1000);
}

static void on_overrides(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	(void)fd;
	(void)what;
	struct buf err;
	buf_init(&err, 64 * 1024);
	int n = policy_reload_overrides(daemon_config_of(d->cfg)->rules, &err);
	if (err.len)
		log_error("%.*s", (int)(err.len - 1), err.ptr);
	if (n > 0)
		log_notice("reloaded %d overrides file%s", n, n == 1 ? "" : "s");
	buf_done(&err);
	arm_timer(d->ev_overrides, d->cfg->store.overrides_check_ms);
}

/* Renew this node's leases in the shared store, with its own counts. */
static void on_lease(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	(void)fd;
	(void)what;
	lease_renew(&d->lease, d->store);
	uint64_t every = (uint64_t)d->cfg->store.lease_ms / 3;
	arm_timer(d->ev_lease, (int64_t)(every ? every : 1000));
}

void daemon_timers_start(struct daemon *d)
{
	d->ev_stats = evtimer_new(d->base, on_stats, d);
	d->ev_snapshot = evtimer_new(d->base, on_snapshot, d);
	d->ev_expire = evtimer_new(d->base, on_expire, d);
	d->ev_overrides = evtimer_new(d->base, on_overrides, d);
	d->ev_lease = evtimer_new(d->base, on_lease, d);
	if (!d->ev_stats || !d->ev_snapshot || !d->ev_expire || !d->ev_overrides || !d->ev_lease)
		fatal("cannot create timers");
	if (store_is_shared(d->store))
		on_lease(-1, 0, d); /* connects at once, and renews from then on */
	arm_stats(d);
	arm_timer(d->ev_snapshot, d->cfg->store.snapshot_interval_ms);
	arm_timer(d->ev_expire, 1000);
	arm_timer(d->ev_overrides, d->cfg->store.overrides_check_ms);
}

void daemon_timers_rearm(struct daemon *d)
{
	arm_stats(d);
	arm_timer(d->ev_snapshot, d->cfg->store.snapshot_interval_ms);
	arm_timer(d->ev_overrides, d->cfg->store.overrides_check_ms);
}

void daemon_timers_free(struct daemon *d)
{
	event_free(d->ev_stats);
	event_free(d->ev_snapshot);
	event_free(d->ev_expire);
	event_free(d->ev_overrides);
	event_free(d->ev_lease);
	d->ev_stats = d->ev_snapshot = d->ev_expire = d->ev_overrides = d->ev_lease = NULL;
}
