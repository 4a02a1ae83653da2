/*
 * control_service -- the control socket service (see control_service.c).
 *
 * The service knows the protocol and who may talk; what a command does is its owner's
 * (the daemon's handlers of control_cmds.h's rows), reached through the control_owner
 * given at creation, so that this file depends on nothing above it.
 */
#ifndef SLUICE_CONTROL_SERVICE_H
#define SLUICE_CONTROL_SERVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "engine.h"
#include "str.h"

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
	/* Set by a command that streams its reply (run() returned 2): the service calls it
	 * each time the peer has taken what was written; it appends the next part to out
	 * and returns 1 while more follows, or 0 with the last part in out and *ok set (or
	 * <0); either way it has freed the command's state.  cancel is called instead when
	 * the session ends first. */
	int (*step)(struct control_wait *w);
	void *cmd;                              /* the command's state */
	struct worker *worker;                  /* the session's: where done() must run
						 * (worker_call() from another thread) */
	void *svc;                              /* the service's state */
};

/* What a peer may run. */
enum control_access {
	CONTROL_ACCESS_DENIED = 0,
	CONTROL_ACCESS_READ,  /* the forms that change nothing (control_cmds.h) */
	CONTROL_ACCESS_ADMIN, /* every form */
};

/* Whose commands the service runs; the owner keeps it for the service's life. */
struct control_owner {
	/* Run a request (on a worker thread): 0 (answered in out), 1 (answers later
	 * through w), 2 (out holds the first part of a reply that w->step goes on with:
	 * control.h's "more" parts), or <0. */
	int (*run)(void *arg, size_t argc, const struct str *argv, struct buf *out,
		   bool *ret_ok, struct control_wait *w);
	/* control { admin = "root"; } of the running configuration: only root and the
	 * daemon's user may run the commands that change state. */
	bool (*admin_root)(void *arg);
	/* An inet peer's password (any thread): what it may run by the running
	 * configuration's control.password_file and read_password_file, compared in
	 * constant time; CONTROL_ACCESS_DENIED when it is neither, or none is set. */
	enum control_access (*password_access)(void *arg, struct str secret);
	/* True once a stop signal came: a session ends after its answer, so that a
	 * `sluice top` left open does not hold the shutdown until its deadline. */
	bool (*stopping)(void *arg);
	void *arg;
};

struct service *control_service_new(struct engine *e, const struct control_owner *owner);

#endif
