/*
 * engine_int.h -- the engine's rooms and what they share (private to src/engine).
 *
 *   engine.c   services, sessions on their workers, the workers, listeners and accept
 *              (main thread: accept and hand-off; workers: their sessions); it carries
 *              out what request.c decides: times requests, ends them at their deadline,
 *              evicts a session to make room
 *   request.c  requests, their lists and the decisions on their deadlines and on the
 *              session that makes room at max_sessions (workers; request_worker_to_evict
 *              on the main thread).  It calls nothing in engine.c.
 *
 * Invariants: a session, its lists and its timers are touched only on its own worker;
 * what the main thread reads of a worker is in atomics (nsessions, req_oldest_ms).
 */
#ifndef SLUICE_ENGINE_INT_H
#define SLUICE_ENGINE_INT_H

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "engine.h"
#include "mailbox.h"

#define ENGINE_MAX_WORKERS 256
#define ENGINE_MAX_SERVICES 16
/* Evictions, and refusals when none could give way, are logged once a second per worker,
 * with a count. */
#define REQUEST_LOG_MS 1000

struct listener;

struct stats_shard {
	pthread_mutex_t lock;
	struct service_counters total;
	struct service_counters interval;
};

struct service {
	struct engine *e;
	unsigned idx; /* in e->services, and in each worker's lists of open requests */
	char *name;
	const struct service_ops *ops;
	void *arg;
	_Atomic unsigned max_sessions;
	_Atomic uint64_t idle_timeout_ms;
	_Atomic uint64_t command_timeout_ms;
	_Atomic size_t max_input;
	_Atomic unsigned fds_per_session;
	_Atomic bool reserved;
	_Atomic uint64_t current;
	_Atomic uint64_t peak;
	struct stats_shard *shards; /* one per worker, plus one for the main thread */
	uint64_t interval_start_ns;
	pthread_mutex_t interval_lock;
	/* the last interval that ended, under interval_lock */
	struct service_counters last;
	double last_seconds;
	bool have_last;
	/* A burst of refusals over max_sessions, logged at its start, every
	 * REFUSE_REMIND_MS while it lasts and at its end, not once per connection (a flood
	 * would flood the log).  Main thread only: the listeners run there. */
	bool refusing;
	uint64_t refuse_start_ms, refuse_logged_ms, refused_burst, refused_unlogged;
	/* Refusals made on a worker (a connection sent to make room where, by the time it
	 * came, none could give way), for the main thread to count in the burst. */
	_Atomic uint64_t refused_on_workers;
};

/* A worker's sessions of one service that have a request open, oldest first. */
struct req_list {
	struct session *head, *tail;
};

enum worker_msg_type {
	WORKER_MSG_SESSION = 0,
	WORKER_MSG_STOP,
	WORKER_MSG_CALL,
};

struct worker_msg {
	enum worker_msg_type type;
	int fd;
	struct service *svc;
	void (*call)(void *arg);  /* WORKER_MSG_CALL */
	void *arg;
	bool evict; /* the service is at max_sessions: make room, or refuse */
	unsigned hops; /* workers that could not make room for it already */
	unsigned fds; /* descriptors counted for the session at accept */
	char peer[64];
	struct sockaddr_storage addr;
};

struct session {
	struct session *prev, *next; /* worker's list */
	struct worker *w;
	struct service *svc;
	struct bufferevent *bev;
	void *data;
	uint64_t id;
	uint64_t start_ns;
	uint64_t work_ns;
	unsigned fds; /* counted at accept, given back at the end */
	bool opened;
	bool closing;
	bool paused;
	bool read_off;          /* paused, and input came: reading is switched off */
	bool peer_eof;          /* the peer half-closed while paused: end after resuming */
	bool out_blocked;       /* output over OUTPUT_HIGH: reading stops until it drains */
	bool in_input; /* inside ops->input: defer frees */
	bool dead;     /* freed when in_input unwinds */
	bool timed_out;
	bool deadline_hit; /* a request passed its deadline */
	bool proto_error;
	bool req_listed;   /* a request is open: in the worker's list of its service */
	bool req_explicit; /* the request is the service's (session_request_begin) */
	bool req_armed;    /* its deadline is set (a connection's first: not until bytes) */
	uint8_t timeout_kind; /* TIMEOUT_* currently set on the bufferevent */
	/* The request open now (req_listed): in the worker's list of its service, timed by
	 * `deadline` (made at the first request that needs it). */
	struct session *rprev, *rnext;
	struct event *deadline;
	uint64_t req_start_ms;
	uint64_t req_bytes; /* consumed since an explicit request began */
	struct request_bound rb;
	char peer[64];
	struct sockaddr_storage addr;
};

enum {
	TIMEOUT_NONE = 0,
	TIMEOUT_IDLE,
	TIMEOUT_COMMAND,
};

struct worker {
	struct engine *e;
	unsigned idx;
	pthread_t thread;
	struct event_base *base;
	struct mailbox inbox;   /* of struct worker_msg */
	_Atomic unsigned nsessions;
	struct session *sessions;
	struct req_list reqs[ENGINE_MAX_SERVICES];
	/* The start of the oldest open request of each service, UINT64_MAX for none: the main
	 * thread reads it to send a connection over max_sessions where a slow request can go. */
	_Atomic uint64_t req_oldest_ms[ENGINE_MAX_SERVICES];
	uint64_t evict_logged_ms, evict_unlogged;
	/* libevent "common timeouts": timers of one duration kept in a queue instead of the
	 * heap, so 10,000 idle sessions cost O(1) per re-arm instead of O(log n). */
	struct {
		uint64_t ms;
		const struct timeval *tv;
	} common[8];
	size_t ncommon;
};

struct engine {
	struct event_base *main_base;
	unsigned nworkers;
	struct worker *workers;
	struct service *services[ENGINE_MAX_SERVICES];
	size_t nservices;
	struct listener *listeners;
	bool started;
	uint64_t start_ns;
	/* descriptors (engine_set_fds_held): what sessions of unreserved services hold, and
	 * the limit as last read (main thread) */
	_Atomic uint64_t fds_sessions;
	unsigned fds_held;
	uint64_t nofile, nofile_read_ms;
	int spare_fd; /* for a reserved listener at the descriptor limit; -1 when used */
};

/* request.c */
/* What the engine does after request_track. */
enum request_step {
	REQUEST_GOES_ON = 0, /* nothing: the request goes on, or it closed */
	REQUEST_START,       /* an implicit request opens now: request_open, then request_arm */
};
/* List a request that opens now (closing the one open), unarmed.  b NULL: an implicit
 * request (a connection's first is listed so: its deadline starts with partial bytes). */
void request_open(struct session *s, const struct request_bound *b);
/* Time the open request: its deadline (s->deadline, made by the engine) fires after tv. */
void request_arm(struct session *s, struct timeval tv);
/* The open request ends (listed or not); its timer stops. */
void request_close(struct session *s);
/* After the input callback consumed `consumed` bytes. */
enum request_step request_track(struct session *s, size_t consumed);
/* Whether a line on making room (an eviction, or a refusal when none could give way) is
 * due on w now: one a second, with the count of those not logged since. */
bool request_log_due(struct worker *w, uint64_t now, uint64_t *ret_unlogged);
/* Main thread: the worker with the oldest open request of svc, or NULL. */
struct worker *request_worker_to_evict(struct engine *e, const struct service *svc);
/* The decisions, pure functions of the session's request and the clock (table-tested):
 * how long the open request may take in all, how long it has been open, how long it has
 * left (0: its deadline passed), whether it may give way to a newcomer (with how slow it
 * is against its deadline, of 1024), and the session of w that gives way to a newcomer of
 * svc at max_sessions (NULL: none may). */
uint64_t request_allowed_ms(const struct session *s);
uint64_t request_elapsed(const struct session *s, uint64_t now);
uint64_t request_time_left(const struct session *s, uint64_t now);
bool request_evictable(const struct session *s, uint64_t now, uint64_t *ret_slow);
struct session *request_victim(const struct worker *w, const struct service *svc, uint64_t now);

#endif
