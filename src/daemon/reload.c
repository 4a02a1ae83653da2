/*
 * reload -- a new configuration for the running daemon, on the main thread alone:
 * loaded beside the running one (daemon_config_load(), all or nothing), compared with
 * it (what takes effect only at the next restart is said in the log, one warning for
 * each group of config_restart_changes()), and swapped in, each service given its part;
 * sessions keep the rule set they started with.  A load that fails keeps the running
 * configuration and says why, with file, line and key.
 *
 * SIGHUP asks for a reload; so does `sluice reload`, whose control session waits on its
 * worker (reload_ask()) for the main thread to load the file and answer it through
 * worker_call(): the configuration is never loaded on a loop that serves sessions.  The
 * asks are a list under reload_lock; the main thread takes the whole list as a reload
 * begins, so each ask is answered by a reload that began after it was made.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "config_schema.h"
#include "daemon_int.h"
#include "engine.h"
#include "intake_service.h"
#include "log.h"
#include "milter_session.h"
#include "notify.h"
#include "pfpolicy_service.h"
#include "relay.h"
#include "store.h"
#include "util.h"

/* A `sluice reload` waiting for the main thread. */
struct reload_ask {
	struct reload_ask *next;  /* in d->reload_asked, under reload_lock */
	struct control_wait *w;   /* read on the worker only (the session may be gone) */
	struct worker *worker;    /* the session's, where reload_back() runs */
	bool cancelled;           /* the session went away: the answer is dropped (worker) */
	bool ok;                  /* the answer, written by the main thread before */
	char text[1100];          /*   worker_call() hands the ask back */
};

static void notify_reloading(void)
{
	struct timespec ts;
	char msg[96];
	clock_gettime(CLOCK_MONOTONIC, &ts);
	fmt_fixed(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
		  (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
	notify_send(msg);
}

/*
 * Load the file again and swap the new configuration in: 0, or -1 with what failed in
 * err, the running configuration kept (both logged).  The file is read again as the
 * daemon's user: /etc/sluice must be readable by it.
 */
static int reload_load(struct daemon *d, char *err, size_t errlen)
{
	struct sluice_config *nc = NULL;
	int r = daemon_config_load(d->config_path, &nc, err, errlen);
	if (r < 0) {
		log_error("reload failed, keeping the running configuration: %s", err);
		return -1;
	}
	struct sluice_config *old = d->cfg;
	unsigned restart = config_restart_changes(old, nc); /* the tables' restart column */
	for (unsigned g = 1; g < CONFIG_RESTART_COUNT; g++)
		if (restart & (1u << g))
			log_warning("reload: %s", config_restart_text((enum config_restart)g));
	policy_set_store(daemon_config_of(nc)->rules, d->store);
	struct milter_handler *h = d->milter ? daemon_services_milter_handler(nc) : NULL;
	if (d->milter && !h) {
		log_error("reload failed: out of memory; keeping the running configuration");
		fmt_fixed(err, errlen, "reload failed: out of memory");
		daemon_config_free(nc);
		return -1;
	}
	log_setup(nc->log.target, nc->log.facility, nc->log.level);
	if (d->milter) {
		milter_service_set_handler(d->milter, h);
		struct milter_service_conf mc = daemon_services_milter_conf(nc);
		milter_service_set_conf(d->milter, &mc);
	}
	if (d->policy) {
		pfpolicy_service_set_policy(d->policy, daemon_config_of(nc)->rules);
		struct pfpolicy_conf pc = daemon_services_pfpolicy_conf(nc);
		pfpolicy_service_set_conf(d->policy, &pc);
	}
	if (d->intake && nc->intake.enabled) {
		struct intake_conf ic = daemon_services_intake_conf(nc);
		if (intake_service_set_conf(d->intake, &ic) < 0)
			log_error("reload: out of memory; the intake keeps its settings");
	}
	if (d->relay && relay_reconfigure(d->relay, &daemon_config_of(nc)->relay,
					  daemon_config_of(nc)->rules) < 0)
		log_error("reload: the relay keeps its settings (out of memory)");
	if (!d->relay && daemon_config_of(nc)->relay.nroutes)
		log_warning("reload: routes were added; the relay starts at the next restart");
	if (!store_is_shared(d->store))
		store_memory_set_max_keys(d->store, nc->store.max_keys);
	pthread_mutex_lock(&d->cfg_lock);
	d->cfg = nc;
	d->reloads++;
	pthread_mutex_unlock(&d->cfg_lock);
	daemon_services_limits(d, nc);
	daemon_fds_check(d, nc, false);
	daemon_timers_rearm(d);
	daemon_config_free(old);
	log_notice("configuration reloaded from %s", d->config_path);
	return 0;
}

/* On the session's worker, once the main thread reloaded. */
static void reload_back(void *arg)
{
	struct reload_ask *a = arg;
	if (a->cancelled) {
		free(a);
		return;
	}
	struct control_wait *w = a->w;
	buf_append_cstr(w->out, a->text);
	*w->ok = a->ok;
	w->cancel = NULL;
	free(a);
	w->done(w);
}

static void reload_cancel(struct control_wait *w)
{
	/* the ask is still the main thread's: reload_back() or reload_forget() frees it */
	struct reload_ask *a = w->cmd;
	a->cancelled = true;
}

/* Hand each ask of the list its answer, on its worker. */
static void reload_answer(struct reload_ask *a, bool ok, const char *path, const char *err)
{
	while (a) {
		struct reload_ask *next = a->next;
		a->ok = ok;
		if (ok)
			fmt_fixed(a->text, sizeof(a->text), "reloading %s\n", path);
		else
			fmt_fixed(a->text, sizeof(a->text), "%s\nthe running configuration is kept\n",
				  err);
		/* XXX: if this allocation fails (or the workers are already stopped) the
		 * session waits for its timeout and the ask leaks; the reload is done either
		 * way */
		worker_call(a->worker, reload_back, a);
		a = next;
	}
}

void reload_run(struct daemon *d)
{
	pthread_mutex_lock(&d->reload_lock);
	struct reload_ask *asked = d->reload_asked;
	d->reload_asked = NULL;
	pthread_mutex_unlock(&d->reload_lock);
	char err[1024] = "";
	notify_reloading();
	int r = reload_load(d, err, sizeof(err));
	notify_send("READY=1\nSTATUS=running");
	reload_answer(asked, r == 0, d->config_path, err);
}

int reload_ask(struct daemon *d, struct buf *out, bool *ret_ok, struct control_wait *w)
{
	if (!w || !w->worker) {
		buf_append_cstr(out, "reload: cannot wait for the main thread here\n");
		*ret_ok = false;
		return 0;
	}
	struct reload_ask *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->w = w;
	a->worker = w->worker;
	w->cmd = a;
	w->cancel = reload_cancel;
	pthread_mutex_lock(&d->reload_lock);
	a->next = d->reload_asked;
	d->reload_asked = a;
	pthread_mutex_unlock(&d->reload_lock);
	/* the main thread reloads on the signal, as when an init system sends it; asks made
	 * while a reload runs are answered by the next, which their own signal asks for */
	kill(getpid(), SIGHUP);
	return 1;
}

void reload_forget(struct daemon *d)
{
	pthread_mutex_lock(&d->reload_lock);
	struct reload_ask *a = d->reload_asked;
	d->reload_asked = NULL;
	pthread_mutex_unlock(&d->reload_lock);
	while (a) {
		struct reload_ask *next = a->next;
		free(a);
		a = next;
	}
}
