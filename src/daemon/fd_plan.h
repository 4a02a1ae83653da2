/*
 * fd_plan -- how sluiced's file descriptors are shared out under RLIMIT_NOFILE.
 *
 * The daemon's own descriptors (threads' loops, the queue's directories, the relay's
 * files and connections, metrics, Redis, listeners) and a reserve for the operator's
 * control socket and the queue's recovery are held back; the sessions of the milter,
 * policy and intake services share the rest (engine_set_fds_held()).  A pure function of
 * the configuration and of what is open already, so that the start-up check and its
 * message are tested as a table.
 */
#ifndef SLUICE_FD_PLAN_H
#define SLUICE_FD_PLAN_H

#include <stddef.h>
#include <stdint.h>

struct daemon_config;

/* The control service's sessions at once: not counted with the others, they come out of
 * the reserve, which keeps as many again for the queue's recovery and the relay. */
#define FD_PLAN_CONTROL_SESSIONS 16
#define FD_PLAN_RESERVE (2 * FD_PLAN_CONTROL_SESSIONS)

struct fd_plan {
	unsigned open;      /* open before the daemon starts its parts */
	unsigned threads;   /* the main loop, the workers' loops and mailboxes */
	unsigned listeners; /* one per listen address */
	unsigned queue;     /* its directories, lock and journal; the committer and loader */
	unsigned relay;     /* its loop, idle-open message files and connections */
	unsigned metrics;   /* its loop and scrapers */
	unsigned store;     /* Redis connections */
	unsigned reserve;
	unsigned held;      /* the sum of the above */
	/* Descriptors the sessions need: one session of each service, and every service at
	 * its max_sessions (UINT64_MAX when one has no limit). */
	uint64_t sessions_min, sessions_max;
};

/* The plan for configuration c run by `workers` worker threads, with `open` descriptors
 * open now. */
void fd_plan_make(const struct daemon_config *dc, unsigned workers, unsigned open,
		  struct fd_plan *ret);
/* "5 open at start + 20 for the event loops + ... = N": the held descriptors, for a
 * message. */
void fd_plan_format(const struct fd_plan *p, char *out, size_t len);
/* Descriptors one session of the intake holds: its socket and its message file. */
#define FD_PLAN_INTAKE_SESSION 2

#endif
