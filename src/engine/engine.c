/*
 * engine -- worker pool, listeners and sessions (see engine.h).
 *
 * Threads: the caller's thread runs main_base (listeners, signals, timers of the daemon);
 * each worker runs its own event_base.  The only cross-thread paths are the workers'
 * inboxes (mailbox.h: mutex + eventfd), the per-service counters (atomics), and the
 * per-worker stats shards (a mutex each, taken once per session start/end and by the
 * stats reader).
 */
#include <errno.h>
#include <inttypes.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "engine_int.h"
#include "listen.h"
#include "mailbox.h"
#include "util.h"

#define ACCEPT_BATCH 64
#define ACCEPT_BACKOFF_MS 500
#define REFUSE_REMIND_MS 60000 /* a burst of refusals over max_sessions is logged again */
#define OUTPUT_HIGH (256 * 1024) /* bytes of unread replies before a session stops reading */


struct listener {
	struct listener *next;
	struct service *svc;
	struct listen_addr addr;
	int fd;
	struct event *ev;
	struct event *backoff;
	bool logged_exhaustion;
};

static _Atomic uint64_t session_seq;

/* ---- services ---- */

struct service *service_new(struct engine *e, const char *name, const struct service_ops *ops,
			    void *arg)
{
	if (e->nservices == ENGINE_MAX_SERVICES)
		return NULL;
	struct service *svc = calloc(1, sizeof(*svc));
	if (!svc)
		return NULL;
	svc->e = e;
	svc->idx = (unsigned)e->nservices;
	svc->name = strdup(name);
	svc->ops = ops;
	svc->arg = arg;
	svc->shards = calloc(e->nworkers + 1, sizeof(*svc->shards));
	if (!svc->name || !svc->shards) {
		free(svc->name);
		free(svc->shards);
		free(svc);
		return NULL;
	}
	for (unsigned i = 0; i <= e->nworkers; i++)
		pthread_mutex_init(&svc->shards[i].lock, NULL);
	pthread_mutex_init(&svc->interval_lock, NULL);
	svc->interval_start_ns = now_ns();
	struct service_limits lim = { .max_sessions = 0,
				      .idle_timeout_ms = 3600 * 1000,
				      .command_timeout_ms = 300 * 1000,
				      .max_input = 1 << 20 };
	service_set_limits(svc, &lim);
	e->services[e->nservices++] = svc;
	return svc;
}

static struct service *service_free(struct service *svc)
{
	if (!svc)
		return NULL;
	if (svc->ops->free_arg)
		svc->ops->free_arg(svc->arg);
	for (unsigned i = 0; i <= svc->e->nworkers; i++)
		pthread_mutex_destroy(&svc->shards[i].lock);
	pthread_mutex_destroy(&svc->interval_lock);
	free(svc->shards);
	free(svc->name);
	free(svc);
	return NULL;
}

const char *service_name(const struct service *svc)
{
	return svc->name;
}

void *service_arg(const struct service *svc)
{
	return svc->arg;
}

void service_set_limits(struct service *svc, const struct service_limits *lim)
{
	atomic_store(&svc->max_sessions, lim->max_sessions);
	atomic_store(&svc->idle_timeout_ms, lim->idle_timeout_ms);
	atomic_store(&svc->command_timeout_ms, lim->command_timeout_ms);
	atomic_store(&svc->max_input, lim->max_input);
	atomic_store(&svc->fds_per_session, lim->fds_per_session ? lim->fds_per_session : 1);
	atomic_store(&svc->reserved, lim->reserved);
}

/* The descriptors a session of svc counts for: 0 for a reserved service. */
static unsigned session_fds(const struct service *svc)
{
	return atomic_load(&svc->reserved) ? 0 : atomic_load(&svc->fds_per_session);
}

void engine_set_fds_held(struct engine *e, unsigned held)
{
	e->fds_held = held;
	e->nofile_read_ms = 0;
}

uint64_t engine_fds_for_sessions(struct engine *e)
{
	if (!e->fds_held)
		return UINT64_MAX;
	uint64_t now = now_ms();
	if (!e->nofile_read_ms || now - e->nofile_read_ms >= 1000) {
		struct rlimit rl;
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
			e->nofile = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
		e->nofile_read_ms = now;
	}
	return e->nofile > e->fds_held ? e->nofile - e->fds_held : 0;
}

struct service *engine_service(struct engine *e, size_t i)
{
	return i < e->nservices ? e->services[i] : NULL;
}

/* Count into the shard of the calling thread (idx nworkers = main thread). */
static void service_shard_count(struct service *svc, unsigned idx,
			void (*fn)(struct service_counters *c, const void *arg), const void *arg)
{
	struct stats_shard *sh = &svc->shards[idx];
	pthread_mutex_lock(&sh->lock);
	fn(&sh->total, arg);
	fn(&sh->interval, arg);
	pthread_mutex_unlock(&sh->lock);
}

static void count_connection(struct service_counters *c, const void *arg)
{
	(void)arg;
	c->connections++;
}

static void count_refused(struct service_counters *c, const void *arg)
{
	(void)arg;
	c->refused++;
}

static void count_evicted(struct service_counters *c, const void *arg)
{
	(void)arg;
	c->evicted++;
}

struct session_end {
	double duration, work;
	bool proto_error, timed_out, deadline;
};

static void count_end(struct service_counters *c, const void *arg)
{
	const struct session_end *se = arg;
	c->sessions++;
	stat_acc_add(&c->duration, se->duration);
	stat_acc_add(&c->work, se->work);
	if (se->proto_error)
		c->protocol_errors++;
	if (se->timed_out)
		c->timeouts++;
	if (se->deadline)
		c->deadlines++;
}

void service_stats(struct service *svc, bool reset_interval, struct service_stats *ret)
{
	struct service_stats st = { .name = svc->name };
	uint64_t now = now_ns();
	pthread_mutex_lock(&svc->interval_lock);
	st.interval_seconds = (double)(now - svc->interval_start_ns) / 1e9;
	if (reset_interval)
		svc->interval_start_ns = now;
	for (unsigned i = 0; i <= svc->e->nworkers; i++) {
		struct stats_shard *sh = &svc->shards[i];
		pthread_mutex_lock(&sh->lock);
		service_counters_merge(&st.total, &sh->total);
		service_counters_merge(&st.interval, &sh->interval);
		if (reset_interval)
			memset(&sh->interval, 0, sizeof(sh->interval));
		pthread_mutex_unlock(&sh->lock);
	}
	if (reset_interval) {
		/* the interval that just ended is the one returned and kept as the last */
		svc->last = st.interval;
		svc->last_seconds = st.interval_seconds;
		svc->have_last = true;
	}
	if (svc->have_last) {
		st.last = svc->last;
		st.last_seconds = svc->last_seconds;
		st.last_complete = true;
	} else {
		st.last = st.interval;
		st.last_seconds = st.interval_seconds;
	}
	pthread_mutex_unlock(&svc->interval_lock);
	st.current = atomic_load(&svc->current);
	st.peak = atomic_load(&svc->peak);
	st.uptime_seconds = (double)(now - svc->e->start_ns) / 1e9;
	*ret = st;
}

static int worker_post(struct worker *w, const struct worker_msg *m);

/* ---- sessions ---- */

void *session_data(const struct session *s)
{
	return s->data;
}

void session_set_data(struct session *s, void *data)
{
	s->data = data;
}

struct service *session_service(const struct session *s)
{
	return s->svc;
}

struct event_base *session_base(const struct session *s)
{
	return s->w->base;
}

uint64_t session_id(const struct session *s)
{
	return s->id;
}

int session_fd(const struct session *s)
{
	return (int)bufferevent_getfd(s->bev);
}

const char *session_peer(const struct session *s)
{
	return s->peer;
}

const struct sockaddr *session_peer_addr(const struct session *s)
{
	return (const struct sockaddr *)&s->addr;
}

struct worker *session_worker(const struct session *s)
{
	return s->w;
}

int worker_call(struct worker *w, void (*fn)(void *arg), void *arg)
{
	struct worker_msg m = { .type = WORKER_MSG_CALL, .fd = -1, .call = fn, .arg = arg };
	return worker_post(w, &m);
}

void session_log_line(void *s, enum log_level level, const char *line)
{
	session_log(s, level, "%s", line);
}

void session_log(struct session *s, enum log_level level, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_msg(level, "sid=%llx svc=%s peer=%s %s", (unsigned long long)s->id, s->svc->name,
		s->peer, msg);
}

/* Give back the slot a connection took at accept (service, worker and descriptor
 * counts; fds as counted at accept). */
static void slot_release(struct service *svc, struct worker *w, unsigned fds)
{
	atomic_fetch_sub(&svc->current, 1);
	atomic_fetch_sub(&w->nsessions, 1);
	atomic_fetch_sub(&svc->e->fds_sessions, fds);
}

/* Free s now (or once its input callback unwinds), its close op called. */
static void session_free(struct session *s)
{
	if (s->in_input) {
		s->dead = true;
		return;
	}
	struct worker *w = s->w;
	struct service *svc = s->svc;
	request_close(s);
	if (s->deadline)
		event_free(s->deadline);
	if (s->bev)
		bufferevent_free(s->bev); /* closes the fd; cancels its events and timeouts */
	if (s->opened && svc->ops->close)
		svc->ops->close(s);
	if (s->prev)
		s->prev->next = s->next;
	else
		w->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	struct session_end se = {
		.duration = (double)(now_ns() - s->start_ns) / 1e9,
		.work = (double)s->work_ns / 1e9,
		.proto_error = s->proto_error,
		.timed_out = s->timed_out,
		.deadline = s->deadline_hit,
	};
	service_shard_count(svc, w->idx, count_end, &se);
	slot_release(svc, w, s->fds);
	free(s);
}

/* The timeval for ms on w's base: a common timeout when a slot is free. */
static struct timeval worker_timeout(struct worker *w, uint64_t ms)
{
	for (size_t i = 0; i < w->ncommon; i++)
		if (w->common[i].ms == ms)
			return *w->common[i].tv;
	struct timeval tv = timeval_from_ms(ms);
	if (w->ncommon < ARRAY_SIZE(w->common)) {
		const struct timeval *c = event_base_init_common_timeout(w->base, &tv);
		if (c) {
			w->common[w->ncommon].ms = ms;
			w->common[w->ncommon++].tv = c;
			return *c;
		}
	}
	return tv; /* more distinct durations than slots (many reloads): plain timers */
}

/*
 * Timeouts ride on the bufferevent's own read and write events (EV_PERSIST events re-arm
 * their timeout whenever they fire), so a session costs no extra timer and a read costs
 * no timer update.  The value changes only when the session moves between idle (nothing
 * buffered) and command (a partial request buffered, a reply not written, a verdict
 * pending) -- rarely, since requests usually arrive whole.
 */
static void session_arm_timer(struct session *s)
{
	if (s->closing)
		return;
	uint8_t kind = TIMEOUT_IDLE;
	if (s->paused || s->req_explicit || evbuffer_get_length(bufferevent_get_input(s->bev)))
		kind = TIMEOUT_COMMAND;
	if (kind == s->timeout_kind)
		return;
	s->timeout_kind = kind;
	struct timeval rd = worker_timeout(s->w, kind == TIMEOUT_IDLE
							 ? atomic_load(&s->svc->idle_timeout_ms)
							 : atomic_load(&s->svc->command_timeout_ms));
	struct timeval wr = worker_timeout(s->w, atomic_load(&s->svc->command_timeout_ms));
	bufferevent_set_timeouts(s->bev, &rd, &wr);
}

/* The deadline of s's request: an explicit request whose bytes earned more time runs on;
 * otherwise the session ends as by a timeout, with its last word. */
static void session_on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct session *s = arg;
	(void)fd;
	(void)what;
	uint64_t left = request_time_left(s, now_ms());
	if (left) {
		request_arm(s, timeval_from_ms(left));
		return;
	}
	if (!s->closing)
		session_log(s, LOG_LEVEL_INFO, "request not complete within its deadline "
			    "(%" PRIu64 " ms%s), closing", request_allowed_ms(s),
			    s->req_explicit ? ", with the time its data earned" : "");
	s->timed_out = true;
	s->deadline_hit = true;
	if (!s->closing && s->svc->ops->timeout)
		s->svc->ops->timeout(s);
	session_free(s);
}

/* A request of s opens now, timed by its deadline (made at the first request that needs
 * it).  b NULL: an implicit request, bound by command_timeout: one duration for them all,
 * a common timeout, O(1) to arm. */
static void session_time_request(struct session *s, const struct request_bound *b)
{
	if (!s->deadline && !(s->deadline = evtimer_new(s->w->base, session_on_deadline, s))) {
		request_close(s); /* the request keeps the per-read timeouts alone */
		session_log(s, LOG_LEVEL_ERROR, "cannot time a request: out of memory");
		return;
	}
	request_open(s, b);
	request_arm(s, b ? timeval_from_ms(request_allowed_ms(s))
			 : worker_timeout(s->w, request_allowed_ms(s)));
}

void session_request_begin(struct session *s, const struct request_bound *b)
{
	if (s->closing)
		return;
	session_time_request(s, b);
	session_arm_timer(s);
}

/* The peer half-closed while the session was paused: now that it is not, end it once
 * its replies are written.  Returns false when s is gone. */
static bool session_finish_eof(struct session *s)
{
	if (!s->peer_eof || s->paused || s->closing)
		return true;
	bool written = evbuffer_get_length(bufferevent_get_output(s->bev)) == 0;
	session_close(s); /* frees s now when everything is written, else on_drained does */
	return !written;
}

/* A peer that sends commands and never reads their replies would grow the output
 * buffer without end: past OUTPUT_HIGH bytes the session reads nothing more until the
 * peer has taken what is written (on_drained), and the write timeout bounds the wait. */
static bool output_blocked(struct session *s)
{
	if (evbuffer_get_length(bufferevent_get_output(s->bev)) <= OUTPUT_HIGH)
		return false;
	s->out_blocked = true;
	bufferevent_disable(s->bev, EV_READ);
	return true;
}

/* Hand buffered input to the service.  Returns false when s is gone. */
static bool session_run_input(struct session *s)
{
	if (s->paused || s->closing || output_blocked(s))
		return true;
	struct evbuffer *in = bufferevent_get_input(s->bev);
	if (evbuffer_get_length(in) == 0)
		return session_finish_eof(s);
	uint64_t t0 = now_ns();
	size_t before = evbuffer_get_length(in);
	s->in_input = true;
	s->svc->ops->input(s, in);
	s->in_input = false;
	s->work_ns += now_ns() - t0;
	if (s->dead) {
		s->dead = false;
		session_free(s);
		return false;
	}
	size_t after = evbuffer_get_length(in);
	if (request_track(s, before > after ? before - after : 0) == REQUEST_START)
		session_time_request(s, NULL);
	if (!session_finish_eof(s))
		return false;
	output_blocked(s);
	session_arm_timer(s);
	return true;
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct session *s = arg;
	if (s->paused && !s->read_off) {
		/* input while a decision is pending: keep it, read no more until resumed */
		s->read_off = true;
		bufferevent_disable(bev, EV_READ);
		return;
	}
	session_run_input(s);
}

static void on_drained(struct bufferevent *bev, void *arg)
{
	struct session *s = arg;
	if (s->closing) {
		session_free(s);
		return;
	}
	if (s->out_blocked) {
		s->out_blocked = false;
		if (!s->read_off && !s->peer_eof)
			bufferevent_enable(bev, EV_READ);
		session_run_input(s); /* what came before reading stopped; may free s */
	}
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct session *s = arg;
	(void)bev;
	if (what & BEV_EVENT_TIMEOUT) {
		if (!s->closing) {
			bool idle = (what & BEV_EVENT_READING) && s->timeout_kind == TIMEOUT_IDLE;
			session_log(s, LOG_LEVEL_INFO, "%s timeout, closing", idle ? "idle" : "command");
		}
		s->timed_out = true;
		if (!s->closing && s->svc->ops->timeout)
			s->svc->ops->timeout(s); /* a last word (SMTP's 421), best effort */
		session_free(s);
		return;
	}
	if (what & BEV_EVENT_ERROR) {
		int err = EVUTIL_SOCKET_ERROR();
		if (err != ECONNRESET && err != EPIPE)
			session_log(s, LOG_LEVEL_INFO, "connection error: %s", strerror(err));
	}
	/* A half-close while the session waits (an SMTP client that sent the final dot and
	 * shut down its side): the answer under way is still owed.  Keep the session,
	 * read no more, and end it once it resumes and has written its replies. */
	if (!(what & BEV_EVENT_ERROR) && (what & BEV_EVENT_EOF) && s->paused && !s->closing) {
		s->peer_eof = true;
		s->read_off = true;
		bufferevent_disable(s->bev, EV_READ);
		return;
	}
	/* EOF: everything read before it has been delivered by on_read already.  EOF at any
	 * point is a normal end of session (ABORT + QUIT for milter). */
	session_free(s);
}

int session_write(struct session *s, const void *p, size_t n)
{
	if (s->closing)
		return 0;
	struct evbuffer *out = bufferevent_get_output(s->bev);
	if (evbuffer_get_length(out) == 0) {
		/* Nothing queued: write now.  Replies are small and the socket is almost always
		 * writable, so this saves registering for EV_WRITE and a loop iteration per
		 * reply; what does not fit is queued as usual.  An error is left for the
		 * bufferevent to find and report. */
		ssize_t w = send(bufferevent_getfd(s->bev), p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			p = (const char *)p + w;
			n -= (size_t)w;
		}
		if (n == 0)
			return 0;
	}
	if (bufferevent_write(s->bev, p, n) < 0)
		return -ENOMEM;
	return 0;
}

void session_pause(struct session *s)
{
	/* Input is not handed over, and the read timeout stops: the code that paused the
	 * session bounds its own wait (a pending decision has its own deadline).  Reading
	 * itself goes on until input actually comes (on_read switches it off): the peer is
	 * waiting for an answer and usually sends nothing, and switching reading off and on
	 * around every decision would cost two epoll_ctl calls each time.  So a paused
	 * session's input buffer may still grow, and a read may move the bytes of its last
	 * chain: a service that pauses keeps no pointer into its input across the pause
	 * (the milter drains each packet first, the policy service copies its request). */
	s->paused = true;
	if (!s->req_explicit)
		request_close(s); /* the request is whole; the wait has its own bound */
}

size_t session_input_length(const struct session *s)
{
	return evbuffer_get_length(bufferevent_get_input(s->bev));
}

size_t session_output_length(const struct session *s)
{
	return evbuffer_get_length(bufferevent_get_output(s->bev));
}

void session_resume(struct session *s)
{
	if (!s->paused)
		return;
	s->paused = false;
	if (s->read_off && !s->peer_eof && !s->out_blocked) {
		s->read_off = false;
		bufferevent_enable(s->bev, EV_READ);
	}
	if (s->in_input)
		return; /* the input loop goes on by itself */
	if (evbuffer_get_length(bufferevent_get_input(s->bev)) || s->peer_eof)
		session_run_input(s); /* may free s */
	else
		session_arm_timer(s);
}

void session_close(struct session *s)
{
	if (s->closing)
		return;
	s->closing = true;
	bufferevent_disable(s->bev, EV_READ);
	if (evbuffer_get_length(bufferevent_get_output(s->bev)) == 0) {
		session_free(s);
		return;
	}
	/* on_drained frees it; the write timeout bounds a peer that never reads. */
}

void session_protocol_error(struct session *s, const char *why)
{
	session_log(s, LOG_LEVEL_WARNING, "protocol error: %s; closing", why);
	s->proto_error = true;
	s->closing = true;
	session_free(s);
}

/* A connection refused (over max_sessions, or the descriptors): the service's refusal,
 * written if the socket takes it at once, and closed. */
static void refuse_connection(const struct service *svc, int fd)
{
	if (svc->ops->refuse_msg) {
		ssize_t wr = write(fd, svc->ops->refuse_msg, strlen(svc->ops->refuse_msg));
		(void)wr;
	}
	close(fd);
}

/* None of w's sessions may give way to the newcomer m (its oldest request is data on
 * time, say): the next worker tries, each at most once.  true when handed on. */
static bool evict_elsewhere(struct worker *w, const struct worker_msg *m)
{
	if (m->hops + 1 >= w->e->nworkers)
		return false;
	struct worker *next = &w->e->workers[(w->idx + 1) % w->e->nworkers];
	struct worker_msg fwd = *m;
	fwd.hops++;
	atomic_fetch_add(&next->nsessions, 1);
	if (worker_post(next, &fwd) < 0) {
		atomic_fetch_sub(&next->nsessions, 1);
		return false;
	}
	atomic_fetch_sub(&w->nsessions, 1);
	return true;
}

/* The service is at max_sessions and a connection came for it: the session of w that
 * request_victim chooses makes room for it, told what a timeout tells.  false: none could. */
static bool worker_make_room(struct worker *w, struct service *svc)
{
	struct session *v = request_victim(w, svc, now_ms());
	if (!v)
		return false;
	uint64_t now = now_ms(), unlogged;
	if (request_log_due(w, now, &unlogged))
		session_log(v, LOG_LEVEL_NOTICE, "max_sessions reached: closing this session, "
			    "whose request has been open %" PRIu64 " ms of its %" PRIu64 " ms, "
			    "to serve a new connection (%" PRIu64 " more closed the same way since "
			    "the last such line)", request_elapsed(v, now), request_allowed_ms(v),
			    unlogged);
	service_shard_count(svc, w->idx, count_evicted, NULL);
	if (svc->ops->timeout)
		svc->ops->timeout(v);
	session_free(v);
	return true;
}

static void session_start(struct worker *w, const struct worker_msg *m)
{
	struct service *svc = m->svc;
	if (m->evict && !worker_make_room(w, svc)) {
		if (evict_elsewhere(w, m))
			return;
		/* none may give way (the requests there are young, or ended meanwhile): refused
		 * as at the listener, logged once a second at most */
		uint64_t unlogged;
		if (request_log_due(w, now_ms(), &unlogged))
			log_notice("svc=%s peer=%s refused: the service is full and no session's "
				   "request is slow enough to give way (%" PRIu64 " more refused or "
				   "closed to make room since the last such line)", svc->name, m->peer,
				   unlogged);
		refuse_connection(svc, m->fd);
		atomic_fetch_add(&svc->refused_on_workers, 1);
		service_shard_count(svc, w->idx, count_refused, NULL);
		slot_release(svc, w, m->fds);
		return;
	}
	struct session *s = calloc(1, sizeof(*s));
	if (!s) {
		close(m->fd);
		goto undo;
	}
	s->w = w;
	s->svc = svc;
	s->fds = m->fds;
	s->id = atomic_fetch_add(&session_seq, 1) + 1;
	s->start_ns = now_ns();
	memcpy(s->peer, m->peer, sizeof(s->peer));
	s->peer[sizeof(s->peer) - 1] = '\0';
	s->addr = m->addr;
	s->bev = bufferevent_socket_new(w->base, m->fd, BEV_OPT_CLOSE_ON_FREE);
	if (!s->bev) {
		close(m->fd);
		free(s);
		goto undo;
	}
	s->next = w->sessions;
	if (w->sessions)
		w->sessions->prev = s;
	w->sessions = s;
	bufferevent_setcb(s->bev, on_read, on_drained, on_event, s);
	size_t hw = atomic_load(&svc->max_input);
	bufferevent_setwatermark(s->bev, EV_READ, 0, hw);
	if (svc->ops->open && svc->ops->open(s) < 0) {
		session_log(s, LOG_LEVEL_WARNING, "session refused by the protocol");
		session_free(s);
		return;
	}
	s->opened = true;
	bufferevent_enable(s->bev, EV_READ);
	session_arm_timer(s);
	/* The first request is listed from the connection: a client that connects and sends
	 * nothing is among the first to make room at max_sessions (clients of every service
	 * speak at once, the SMTP client after the greeting).  No timer yet: a request that
	 * arrives whole, the usual case, costs none. */
	if (!s->paused && !s->closing)
		request_open(s, NULL); /* unarmed */
	return;
undo:
	log_error("cannot start a session: out of memory");
	slot_release(svc, w, m->fds);
}

/* ---- workers ---- */

/* The inbox's batch, on the worker's loop: the whole queue at once, one lock per
 * wake-up, not per message. */
static void worker_on_inbox(void *items, size_t n, void *arg)
{
	struct worker *w = arg;
	struct worker_msg *q = items;
	for (size_t i = 0; i < n; i++) {
		if (q[i].type == WORKER_MSG_SESSION) {
			session_start(w, &q[i]);
			continue;
		}
		if (q[i].type == WORKER_MSG_CALL) {
			q[i].call(q[i].arg);
			continue;
		}
		while (w->sessions)
			session_free(w->sessions);
		event_base_loopbreak(w->base);
		for (size_t j = i + 1; j < n; j++)
			if (q[j].type == WORKER_MSG_SESSION) {
				close(q[j].fd);
				slot_release(q[j].svc, w, q[j].fds);
			} else if (q[j].type == WORKER_MSG_CALL) {
				q[j].call(q[j].arg); /* its session is gone: the call frees its work */
			}
		break;
	}
}

static int worker_post(struct worker *w, const struct worker_msg *m)
{
	return mailbox_post(&w->inbox, m);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	thread_set_base(w->base);
	event_base_dispatch(w->base);
	thread_set_base(NULL);
	return NULL;
}

/* ---- engine ---- */

struct engine *engine_new(unsigned nworkers, struct event_base *main_base)
{
	if (nworkers == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		nworkers = n > 0 ? (unsigned)n : 1;
	}
	if (nworkers > ENGINE_MAX_WORKERS)
		nworkers = ENGINE_MAX_WORKERS;
	struct engine *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->main_base = main_base;
	e->nworkers = nworkers;
	e->start_ns = now_ns();
	e->workers = calloc(nworkers, sizeof(*e->workers));
	if (!e->workers) {
		free(e);
		return NULL;
	}
	for (unsigned i = 0; i < nworkers; i++) {
		struct worker *w = &e->workers[i];
		w->e = e;
		w->idx = i;
		for (size_t k = 0; k < ENGINE_MAX_SERVICES; k++)
			atomic_init(&w->req_oldest_ms[k], UINT64_MAX);
		mailbox_init(&w->inbox, sizeof(struct worker_msg));
	}
	e->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return e;
}

unsigned engine_workers(const struct engine *e)
{
	return e->nworkers;
}

int engine_start(struct engine *e)
{
	for (unsigned i = 0; i < e->nworkers; i++) {
		struct worker *w = &e->workers[i];
		struct event_config *cfg = event_config_new();
		if (!cfg)
			return -ENOMEM;
		/* Each base is used by one thread only.  The epoll changelist folds the adds
		 * and deletes of one loop iteration into at most one epoll_ctl per socket:
		 * a Redis request adds its write event and its reply deletes it again, and
		 * without the changelist each is a system call.  (Its documented pitfall,
		 * dup()ed descriptors, does not arise: every socket here is its own.) */
		event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
		event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
		w->base = event_base_new_with_config(cfg);
		event_config_free(cfg);
		if (!w->base)
			return -errno ? -errno : -ENOMEM;
		int r = mailbox_attach(&w->inbox, w->base, worker_on_inbox, w);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < e->nworkers; i++) {
		struct worker *w = &e->workers[i];
		int r = pthread_create(&w->thread, NULL, worker_main, w);
		if (r != 0)
			return -r;
		char name[16];
		snprintf(name, sizeof(name), "sluiced-w%u", i % 1000);
		pthread_setname_np(w->thread, name);
	}
	e->started = true;
	return 0;
}

unsigned engine_sessions(const struct engine *e)
{
	unsigned n = 0;
	for (unsigned i = 0; i < e->nworkers; i++)
		n += atomic_load(&e->workers[i].nsessions);
	return n;
}

static struct worker *least_loaded(struct engine *e)
{
	struct worker *best = &e->workers[0];
	unsigned bn = atomic_load(&best->nsessions);
	for (unsigned i = 1; i < e->nworkers; i++) {
		unsigned n = atomic_load(&e->workers[i].nsessions);
		if (n < bn) {
			best = &e->workers[i];
			bn = n;
		}
	}
	return best;
}

static void format_peer(const struct sockaddr_storage *ss, socklen_t sl, int fd, char *out,
			size_t outlen)
{
	char host[INET6_ADDRSTRLEN];
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const void *)ss;
		inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
		snprintf(out, outlen, "%s:%u", host, ntohs(sin->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const void *)ss;
		inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
		snprintf(out, outlen, "[%s]:%u", host, ntohs(sin6->sin6_port));
	} else if (ss->ss_family == AF_UNIX) {
		struct ucred cred;
		socklen_t cl = sizeof(cred);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
			snprintf(out, outlen, "unix:pid=%ld,uid=%ld", (long)cred.pid, (long)cred.uid);
		else
			snprintf(out, outlen, "unix");
	} else {
		snprintf(out, outlen, "?");
	}
	(void)sl;
}

/* Main thread: a connection of svc taken by worker w -- its slot (the service's, the
 * worker's and its descriptors) counted, and posted; on failure closed and the slot given
 * back.  Returns the service's sessions counting this one. */
static uint64_t hand_off(struct service *svc, struct worker *w, const struct worker_msg *m)
{
	uint64_t cur = atomic_fetch_add(&svc->current, 1) + 1;
	atomic_fetch_add(&w->nsessions, 1);
	atomic_fetch_add(&svc->e->fds_sessions, m->fds);
	if (worker_post(w, m) < 0) {
		close(m->fd);
		slot_release(svc, w, m->fds);
		log_error("svc=%s: cannot hand a connection to a worker", svc->name);
	}
	return cur;
}

static void listener_resume(evutil_socket_t fd, short what, void *arg)
{
	struct listener *l = arg;
	(void)fd;
	(void)what;
	if (l->ev)
		event_add(l->ev, NULL);
}

/* Logs a connection refused over max_sessions: the first of a burst with what the peer
 * was told, then one reminder per REFUSE_REMIND_MS with the count; the end of the burst is
 * logged by the accept that follows it. */
/* The refusals the workers made since the main thread last looked (main thread). */
static uint64_t take_worker_refusals(struct service *svc)
{
	if (!atomic_load_explicit(&svc->refused_on_workers, memory_order_relaxed))
		return 0;
	return atomic_exchange(&svc->refused_on_workers, 0);
}

static void refuse_log(struct service *svc, const char *peer, unsigned max, bool fds)
{
	uint64_t now = now_ms();
	const char *msg = svc->ops->refuse_msg;
	uint64_t on_workers = take_worker_refusals(svc);
	svc->refused_burst += 1 + on_workers;
	if (!svc->refusing) {
		svc->refusing = true;
		svc->refuse_start_ms = svc->refuse_logged_ms = now;
		svc->refused_burst = 1 + on_workers; /* they came just before, in the same burst */
		svc->refused_unlogged = 0;
		/* the refusal's first line, without its line ending */
		int len = msg ? (int)strcspn(msg, "\r\n") : 0;
		char why[160];
		if (fds)
			snprintf(why, sizeof(why), "the sessions hold the descriptors the file "
				 "descriptor limit leaves them (%" PRIu64 ")",
				 engine_fds_for_sessions(svc->e));
		else
			snprintf(why, sizeof(why), "max_sessions (%u) reached", max);
		log_warning("svc=%s peer=%s refused: %s; %s%.*s%s "
			    "(further refusals are counted, not logged, until a session is "
			    "admitted again)",
			    svc->name, peer, why, msg ? "answered \"" : "closed the connection",
			    len, msg ? msg : "", msg ? "\"" : "");
		return;
	}
	svc->refused_unlogged += 1 + on_workers;
	if (now - svc->refuse_logged_ms >= REFUSE_REMIND_MS) {
		log_warning("svc=%s: still at max_sessions (%u): %" PRIu64 " connections refused "
			    "in the last %" PRIu64 " s",
			    svc->name, max, svc->refused_unlogged,
			    (now - svc->refuse_logged_ms) / 1000);
		svc->refuse_logged_ms = now;
		svc->refused_unlogged = 0;
	}
}

static void listener_on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct listener *l = arg;
	struct service *svc = l->svc;
	struct engine *e = svc->e;
	(void)what;
	if (e->spare_fd < 0) /* used by a reserved listener: taken back once one is free */
		e->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	for (int i = 0; i < ACCEPT_BATCH; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (errno == EMFILE && e->spare_fd >= 0 && atomic_load(&svc->reserved)) {
				/* the operator's socket: the spare descriptor makes room for it */
				close(e->spare_fd);
				e->spare_fd = -1;
				log_warning("listener %s (%s): at the file descriptor limit; accepting "
					    "with the descriptor kept for it", l->addr.text, svc->name);
				continue;
			}
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* Out of descriptors: stop accepting for a while instead of spinning on
				 * a readable listener; log once per episode. */
				if (!l->logged_exhaustion)
					log_error("listener %s (%s): cannot accept: %s; %u sessions open; "
						  "pausing accept (raise the file descriptor limit or "
						  "lower max_sessions)",
						  l->addr.text, svc->name, strerror(errno), engine_sessions(e));
				l->logged_exhaustion = true;
				event_del(l->ev);
				struct timeval tv = { 0, ACCEPT_BACKOFF_MS * 1000 };
				event_add(l->backoff, &tv);
				return;
			}
			log_error("listener %s (%s): accept: %s", l->addr.text, svc->name, strerror(errno));
			return;
		}
		if (l->logged_exhaustion) {
			log_notice("listener %s (%s): accepting again", l->addr.text, svc->name);
			l->logged_exhaustion = false;
		}
		service_shard_count(svc, e->nworkers, count_connection, NULL);
		unsigned max = atomic_load(&svc->max_sessions);
		uint64_t cur = atomic_load(&svc->current);
		struct worker_msg m = { .type = WORKER_MSG_SESSION, .fd = fd, .svc = svc,
					.fds = session_fds(svc) };
		format_peer(&ss, sl, fd, m.peer, sizeof(m.peer));
		memcpy(&m.addr, &ss, sl < sizeof(ss) ? sl : sizeof(ss));
		/* the descriptors the sessions may hold, beside the daemon's own and the reserve */
		bool fds_full = m.fds &&
				atomic_load(&e->fds_sessions) + m.fds > engine_fds_for_sessions(e);
		bool full = (max && cur >= max) || fds_full;
		struct worker *evict_w = NULL;
		if (full && (evict_w = request_worker_to_evict(e, svc))) {
			/* at max_sessions: the worker with the oldest open request of the service
			 * closes its slowest one and takes this connection (or refuses it) */
			m.evict = true;
			hand_off(svc, evict_w, &m);
			continue;
		}
		if (full) {
			refuse_connection(svc, fd);
			service_shard_count(svc, e->nworkers, count_refused, NULL);
			refuse_log(svc, m.peer, max, fds_full);
			continue;
		}
		/* outside a burst they were logged where they were made */
		uint64_t on_workers = take_worker_refusals(svc);
		if (svc->refusing) {
			svc->refused_burst += on_workers;
			uint64_t ms = now_ms() - svc->refuse_start_ms;
			log_notice("svc=%s: below max_sessions (%u) again: %" PRIu64 " connections "
				   "refused in %" PRIu64 ".%" PRIu64 " s",
				   svc->name, max, svc->refused_burst, ms / 1000, ms % 1000 / 100);
			svc->refusing = false;
		}
		uint64_t now_cur = hand_off(svc, least_loaded(e), &m);
		uint64_t pk = atomic_load(&svc->peak);
		while (now_cur > pk && !atomic_compare_exchange_weak(&svc->peak, &pk, now_cur))
			;
	}
}

int service_listen(struct service *svc, const char *address, unsigned mode, char *err,
		   size_t errlen)
{
	struct listen_addr a;
	int fd;
	int r = listen_addr_parse(address, &a, err, errlen);
	if (r == 0)
		r = listen_open(&a, mode, (uid_t)-1, (gid_t)-1, &fd, err, errlen);
	if (r == 0)
		r = service_adopt(svc, &a, fd, err, errlen);
	return r;
}

int service_adopt(struct service *svc, const struct listen_addr *a, int fd, char *err,
		  size_t errlen)
{
	struct engine *e = svc->e;
	struct listener *l = calloc(1, sizeof(*l));
	if (!l) {
		listen_close(a, fd);
		snprintf(err, errlen, "%s: out of memory", a->text);
		return -ENOMEM;
	}
	l->addr = *a;
	l->fd = fd;
	l->svc = svc;
	l->ev = event_new(e->main_base, l->fd, EV_READ | EV_PERSIST, listener_on_accept, l);
	l->backoff = evtimer_new(e->main_base, listener_resume, l);
	if (!l->ev || !l->backoff || event_add(l->ev, NULL) < 0) {
		if (l->ev)
			event_free(l->ev);
		if (l->backoff)
			event_free(l->backoff);
		listen_close(&l->addr, l->fd);
		snprintf(err, errlen, "%s: cannot register listener", a->text);
		free(l);
		return -ENOMEM;
	}
	l->next = e->listeners;
	e->listeners = l;
	return 0;
}

void engine_stop_listening(struct engine *e)
{
	while (e->listeners) {
		struct listener *l = e->listeners;
		e->listeners = l->next;
		event_free(l->ev);
		event_free(l->backoff);
		listen_close(&l->addr, l->fd);
		free(l);
	}
}

static void drain_worker(void *arg)
{
	struct worker *w = arg;
	struct session *next;
	for (struct session *s = w->sessions; s; s = next) {
		next = s->next; /* drain may free s, and only s */
		if (!s->closing && !s->dead && s->svc->ops->drain)
			s->svc->ops->drain(s);
	}
}

void engine_drain(struct engine *e)
{
	if (!e->started)
		return;
	for (unsigned i = 0; i < e->nworkers; i++)
		if (worker_call(&e->workers[i], drain_worker, &e->workers[i]) < 0)
			log_warning("worker %u: cannot ask its sessions to end: out of memory", i);
}

void engine_stop(struct engine *e)
{
	if (!e->started)
		return;
	for (unsigned i = 0; i < e->nworkers; i++) {
		struct worker_msg m = { .type = WORKER_MSG_STOP, .fd = -1 };
		if (worker_post(&e->workers[i], &m) < 0)
			fatal("cannot stop worker %u", i);
	}
	for (unsigned i = 0; i < e->nworkers; i++)
		pthread_join(e->workers[i].thread, NULL);
	e->started = false;
}

struct engine *engine_free(struct engine *e)
{
	if (!e)
		return NULL;
	engine_stop_listening(e);
	engine_stop(e);
	for (unsigned i = 0; i < e->nworkers; i++) {
		struct worker *w = &e->workers[i];
		size_t n;
		struct worker_msg *q = mailbox_take(&w->inbox, &n);
		for (size_t j = 0; j < n; j++)
			if (q[j].type == WORKER_MSG_SESSION)
				close(q[j].fd);
		free(q);
		mailbox_done(&w->inbox);
		if (w->base)
			event_base_free(w->base);
	}
	for (size_t i = 0; i < e->nservices; i++)
		service_free(e->services[i]);
	if (e->spare_fd >= 0)
		close(e->spare_fd);
	free(e->workers);
	free(e);
	return NULL;
}
