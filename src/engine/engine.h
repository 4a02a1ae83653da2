/*
 * engine -- listeners, a fixed pool of worker threads, and sessions as state machines.
 *
 * Each worker thread runs its own libevent loop over the sessions it owns; a session never
 * moves between workers, so protocol code needs no locks.  The main thread runs the
 * listeners: it accepts, checks the service's max_sessions, and hands the socket to the
 * least-loaded worker through that worker's queue (an eventfd wakes it).  No thread ever
 * blocks on a peer, and the number of threads is fixed by configuration: 1 main + N workers.
 *
 * A service is a protocol (milter, control, ...) given as a table of callbacks, with its
 * limits and statistics; a listener binds one address for one service.
 *
 * Invariants: a session is freed only on its own worker; freeing it first cancels its
 * timer and its bufferevent; ops->close is called exactly once for every ops->open that
 * succeeded.
 */
#ifndef SLUICE_ENGINE_H
#define SLUICE_ENGINE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "stats.h"

struct event_base;
struct evbuffer;
struct sockaddr;
struct engine;
struct service;
struct session;
struct worker;

struct service_ops {
	/* On the worker: set up protocol state (session_set_data).  <0 refuses the session
	 * (close is not called). */
	int (*open)(struct session *s);
	/* On the worker: new bytes are in `in`; consume what is used (evbuffer_drain). */
	void (*input)(struct session *s, struct evbuffer *in);
	/* On the worker: the session ends (EOF, error, timeout, close, shutdown); free state. */
	void (*close)(struct session *s);
	/* Optional, on the worker: the session timed out and is about to be freed; it may
	 * session_write() a last reply (written if the socket takes it at once). */
	void (*timeout)(struct session *s);
	/* Optional, on the worker: the daemon is stopping (engine_drain()).  A service whose
	 * connections may end between requests (the policy protocol) closes the idle ones
	 * at once and ends the others after their request, instead of holding the
	 * shutdown until its deadline. */
	void (*drain)(struct session *s);
	/* Optional bytes written when a connection is refused over max_sessions. */
	const char *refuse_msg;
	/* Optional: free the service's arg when the engine is freed. */
	void (*free_arg)(void *arg);
};

struct service_limits {
	unsigned max_sessions;       /* 0: no limit */
	uint64_t idle_timeout_ms;    /* nothing buffered and nothing to write */
	/* The deadline of one request, from its first byte to its last, whatever the peer
	 * sends meanwhile; also how long a reply may wait for the peer to read it. */
	uint64_t command_timeout_ms;
	size_t max_input;            /* bytes buffered from the peer before reading pauses */
	/* Descriptors one session holds (0 counts as 1; the intake's: its socket and its
	 * message file).  A reserved service (control) is left out of the count, and its
	 * listeners accept at the descriptor limit from a spare kept for them. */
	unsigned fds_per_session;
	bool reserved;
};

/*
 * A request that the service consumes as it comes (an SMTP message's data): it must end
 * within base_ms, plus one second for every min_rate bytes it brought, and never later than
 * max_ms after it began.  min_rate 0: base_ms alone.
 */
struct request_bound {
	uint64_t base_ms;
	uint64_t min_rate; /* bytes per second */
	uint64_t max_ms;
};

/* The engine.  workers = 0 means the number of online CPUs.  main_base runs listeners. */
struct engine *engine_new(unsigned workers, struct event_base *main_base);
int engine_start(struct engine *e);
unsigned engine_workers(const struct engine *e);
/* Close every listener (unix sockets are unlinked); sessions go on. */
void engine_stop_listening(struct engine *e);
/* Call the drain op of every open session that has one, each on its worker (any thread;
 * once the listeners are closed). */
void engine_drain(struct engine *e);
/*
 * Descriptors: `held` of RLIMIT_NOFILE are the daemon's own (threads, queue, relay,
 * listeners) and a reserve for the operator and the queue's recovery; the sessions of the
 * services that are not reserved share the rest, and a connection past it is refused as
 * over max_sessions.  The limit is read again at most once a second (prlimit may lower
 * it).  0: no such check.  Main thread.
 */
void engine_set_fds_held(struct engine *e, unsigned held);
/* Descriptors the sessions of the services that are not reserved may hold now (main
 * thread: the limit is read and kept there). */
uint64_t engine_fds_for_sessions(struct engine *e);

/* Sessions open across all services. */
unsigned engine_sessions(const struct engine *e);
/* Close every session now, stop and join the worker threads. */
void engine_stop(struct engine *e);
struct engine *engine_free(struct engine *e);

struct service *service_new(struct engine *e, const char *name, const struct service_ops *ops,
			    void *arg);
const char *service_name(const struct service *svc);
void *service_arg(const struct service *svc);
/* May be called at any time from the main thread (reload); applies to new events. */
void service_set_limits(struct service *svc, const struct service_limits *lim);
/*
 * Bind and listen on a socket string of sockspec.h ("unix:/path", "inet:host:port",
 * "inet:port@host", ...).  mode (e.g.
 * 0660) applies to unix sockets; a stale unix socket (nobody accepting) is removed, a live
 * one or a non-socket file at that path is an error.  Returns 0 or -errno with err set.
 */
int service_listen(struct service *svc, const char *address, unsigned mode, char *err,
		   size_t errlen);
/*
 * Take a socket bound and listening already (listen_open(), e.g. before privileges were
 * dropped).  The listener owns fd from then on, also on failure (closed, unix path
 * unlinked).  0 or -ENOMEM with err.
 */
struct listen_addr;
int service_adopt(struct service *svc, const struct listen_addr *a, int fd, char *err,
		  size_t errlen);
/*
 * The service's statistics (any thread).  reset_interval ends the interval in progress:
 * ret->interval is then the one that ended, which becomes ret->last from now on.
 */
void service_stats(struct service *svc, bool reset_interval, struct service_stats *ret);
struct service *engine_service(struct engine *e, size_t i); /* NULL past the last */

/* Sessions (all on the session's own worker thread). */
void *session_data(const struct session *s);
void session_set_data(struct session *s, void *data);
struct service *session_service(const struct session *s);
struct event_base *session_base(const struct session *s);
uint64_t session_id(const struct session *s);
const char *session_peer(const struct session *s);
/* The session's socket, for getsockopt() (SO_PEERCRED); never to read or close. */
int session_fd(const struct session *s);
/* The peer's address as accept() gave it (sa_family AF_INET, AF_INET6 or AF_UNIX). */
const struct sockaddr *session_peer_addr(const struct session *s);
/* The worker that owns the session, for worker_call(). */
struct worker *session_worker(const struct session *s);
/*
 * From any thread: run fn(arg) on the worker's loop (a helper thread hands back a result
 * this way).  0 or -ENOMEM.  A call posted before engine_stop() runs even when the
 * sessions are gone -- fn must find out (through arg) whether what it completes still
 * exists; calls posted after engine_stop() never run, so helper threads stop first.
 */
int worker_call(struct worker *w, void (*fn)(void *arg), void *arg);
/* Queue bytes for the peer; 0 or -ENOMEM. */
int session_write(struct session *s, const void *p, size_t n);
/*
 * Requests and their deadlines.  A request the service leaves in the input buffer until it
 * is whole (a command line, a milter packet, a policy request) needs nothing: the engine
 * starts its deadline (command_timeout) at the first byte left unconsumed, restarts it
 * when the service consumes a request, and stops it when nothing partial is left.  A byte
 * a second moves nothing.  A client that connects and sends nothing has idle_timeout.  A
 * request consumed as it comes is bracketed by the service with session_request_begin()
 * and session_request_end(); the deadline then follows `b`.
 * When a service is at max_sessions, a new connection takes the place of the session whose
 * open request is slowest against its deadline (it is told what its timeout would tell it),
 * if there is one; else it is refused.
 */
void session_request_begin(struct session *s, const struct request_bound *b);
void session_request_end(struct session *s);

/* Stop reading until session_resume() (a decision is pending); the session stays open. */
void session_pause(struct session *s);
/* Bytes received from the peer and not consumed yet. */
size_t session_input_length(const struct session *s);
/* Bytes written with session_write() that the peer has not taken yet (a service that
 * streams a long reply writes more only while this stays small). */
size_t session_output_length(const struct session *s);
/* Start reading again, and deliver input that arrived meanwhile. */
void session_resume(struct session *s);
/* End the session once its output is written. */
void session_close(struct session *s);
/* Log, count a protocol error, and end the session at once (nothing more is written). */
void session_protocol_error(struct session *s, const char *why);
/* Log a line prefixed with "sid=... peer=... svc=..." */
void session_log(struct session *s, enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* session_log(s, level, "%s", line) for code that takes a line sink (void *s). */
void session_log_line(void *s, enum log_level level, const char *line);

#endif
