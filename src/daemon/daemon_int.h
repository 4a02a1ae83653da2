/*
 * daemon_int -- the rooms of sluiced behind daemon.h, and the state they share.
 *
 *   daemon.c           the program shell: start, privileges, signals, detach, pid file,
 *                      listeners, the main loop
 *   daemon_control.c   the table binding each control command to its handler, and the
 *                      handlers of status, stats, decisions, top, reload and help
 *   reload.c           a new configuration loaded, compared with the running one, and
 *                      swapped in, on the main thread alone
 *   daemon_timers.c    the main loop's timers: statistics, the store's snapshot, expiry
 *                      sweep and leases, the overrides files' checks
 *   daemon_services.c  what the services are given from a loaded configuration (their
 *                      parts of it, the milter's handler, the sessions' limits), and the
 *                      rule set they run now
 *   daemon_fds.c       the file descriptor limit, and what of it is held back from the
 *                      sessions (fd_plan.c's share-out)
 *
 * Calls go down that list and never up: daemon.c calls every room and is called by
 * none; daemon_control.c calls reload_ask() and the rooms below reload.c; reload.c calls
 * the three floor rooms (timers, services, fds), which call no other room.
 *
 * Invariants: only the main thread writes d->cfg (at start, then reload.c's swap), under
 * cfg_lock; the other threads (control sessions on the workers, the metrics thread)
 * read it under that lock, and the main thread reads it without.
 */
#ifndef SLUICE_DAEMON_INT_H
#define SLUICE_DAEMON_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>

#include "buf.h"
#include "config.h"
#include "control_service.h"
#include "daemon.h"
#include "daemon_config.h"
#include "engine.h"
#include "intake_service.h"
#include "lease.h"
#include "listen.h"
#include "milter_session.h"
#include "pfpolicy_service.h"
#include "policy.h"

struct event;
struct event_base;
struct metrics;
struct queue;
struct relay;
struct reload_ask;
struct store;

/* A socket bound before the drop, waiting for its service. */
struct bound {
	const char *svc;
	struct listen_addr addr;
	int fd;
};

struct daemon {
	struct lease lease;      /* what the last lease renewal renewed */
	struct bound bound[4 * CONFIG_MAX_LISTEN];
	size_t nbound;
	struct event_base *base;
	struct engine *e;
	struct sluice_config *cfg; /* the conf of a daemon_config (daemon_config_of()) */
	pthread_mutex_t cfg_lock; /* cfg is read by control sessions on workers */
	struct service *milter;
	struct service *policy;
	struct service *control;
	struct control_owner control_owner; /* the control service runs our handlers */
	struct service *intake;
	struct queue *queue;
	struct relay *relay;
	struct store *store;
	struct metrics *metrics;
	struct event *ev_term, *ev_int, *ev_hup, *ev_stats, *ev_drain;
	struct event *ev_snapshot, *ev_expire, *ev_overrides, *ev_lease;
	const char *config_path;
	uint64_t drain_deadline_ms;
	uint64_t started_ms;
	bool stopping;
	bool daemonized;
	char *pid_file;
	unsigned long reloads;
	rlim_t nofile;
	unsigned fds_open; /* descriptors open before the parts started (fd_plan) */
	unsigned fds_held; /* held back from the sessions: the plan's, or as counted once up */
	pthread_mutex_t reload_lock;     /* guards reload_asked */
	struct reload_ask *reload_asked; /* `sluice reload`s waiting for the next reload */
};

/* ---- daemon_control.c ---- */

/* Does the table of handlers bind exactly the commands control_cmds.h gives the daemon?
 * 0, or -EINVAL with the first difference in err. */
int daemon_control_check(char *err, size_t errlen);
/* The owner the control service runs the daemon's handlers through. */
struct control_owner daemon_control_owner(struct daemon *d);

/* ---- reload.c ---- */

/* Load the configuration again and swap it in, or keep the running one (logged); then
 * answer every `sluice reload` that asked before it began.  Main thread (SIGHUP). */
void reload_run(struct daemon *d);
/* `sluice reload`, on a control session's worker: ask the main thread for a reload (as
 * SIGHUP does) and answer through w once it is done.  Returns as control_owner.run(). */
int reload_ask(struct daemon *d, struct buf *out, bool *ret_ok, struct control_wait *w);
/* Free the asks the main thread never took (once the workers are stopped). */
void reload_forget(struct daemon *d);

/* ---- daemon_timers.c: on the main loop ---- */

/* Make and arm the timers (fatal() when they cannot be made); with a shared store the
 * first lease renewal is made at once, which connects the main loop to it. */
void daemon_timers_start(struct daemon *d);
/* Arm again the timers whose period is the configuration's, after a reload. */
void daemon_timers_rearm(struct daemon *d);
void daemon_timers_free(struct daemon *d);
/* Log each service's statistics of the interval; reset: a new interval begins. */
void daemon_timers_stats(struct daemon *d, bool reset);
/* Save the memory store's snapshot now (the stop's last one). */
void daemon_timers_snapshot(struct daemon *d);

/* ---- daemon_services.c ---- */

/* The sessions' limits of configuration c, given to every service that runs. */
void daemon_services_limits(struct daemon *d, const struct sluice_config *c);
/* The milter handler for a configuration: the rules, or the fixed replies for testing;
 * NULL when out of memory. */
struct milter_handler *daemon_services_milter_handler(struct sluice_config *c);
struct milter_service_conf daemon_services_milter_conf(const struct sluice_config *c);
struct pfpolicy_conf daemon_services_pfpolicy_conf(const struct sluice_config *c);
struct intake_conf daemon_services_intake_conf(const struct sluice_config *c);
/* The running rule set, with a reference the caller drops (policy_unref()); any thread. */
struct policy *daemon_services_rules(struct daemon *d);

/* ---- daemon_fds.c: on the main thread ---- */

/* At start: raise the soft limit to the hard one, count what is open, and plan;
 * -EMFILE (logged with the sum) when too low to start. */
int daemon_fds_raise(struct daemon *d);
/* Descriptors for configuration c at start (-EMFILE when too few to start) or after a
 * reload (0, with a warning when the sessions may want more than is left). */
int daemon_fds_check(struct daemon *d, const struct sluice_config *c, bool start);
/* Once every part is up and before the first connection: count again what is held. */
void daemon_fds_recount(struct daemon *d);

#endif
