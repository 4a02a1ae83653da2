/*
 * daemon -- sluiced: configuration, services, signals, statistics, control commands.
 */
#ifndef SLUICE_DAEMON_H
#define SLUICE_DAEMON_H

#include "buf.h"
#include "str.h"

struct daemon;

/* The whole program; main() only calls this. */
int daemon_main(int argc, char **argv);

/*
 * A control command that answers later: it waits for the shared store (Redis), which no
 * thread may block on.  The command fills out and *ok, then calls done(w) on the same
 * thread; if the session ends first, the service calls cancel(w) instead, and done must
 * not be called after that.
 */
struct control_wait {
	struct buf *out;
	bool *ok;
	void (*done)(struct control_wait *w);   /* set by the service */
	void (*cancel)(struct control_wait *w); /* set by the command */
	/* Set by a command that streams its reply (daemon_control() returned 2): the service
	 * calls it each time the peer has taken what was written; it appends the next part
	 * to out and returns 1 while more follows, or 0 with the last part in out and *ok
	 * set (or <0); either way it has freed the command's state.  cancel is called
	 * instead when the session ends first. */
	int (*step)(struct control_wait *w);
	void *cmd;                              /* the command's state */
	void *svc;                              /* the service's state */
};

/* True once a stop signal came (any thread): a control session ends after its answer,
 * so that a `sluice top` left open does not hold the shutdown until its deadline. */
bool daemon_stopping(const struct daemon *d);

/* Control commands (run on a worker thread): status, stats [--json], reload, limits,
 * test.  Returns 0 (answered in out), 1 (answers later through w), 2 (out holds the
 * first part of a reply that w->step goes on with: control.h's "more" parts), or <0. */
int daemon_control(struct daemon *d, size_t argc, const struct str *argv, struct buf *out,
		   bool *ret_ok, struct control_wait *w);

/* control { admin = ...; } of the running configuration: true for "root" (only root and
 * the daemon's user may run commands that change state). */
bool daemon_control_admin_root(struct daemon *d);

#endif
