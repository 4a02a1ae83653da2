/*
 * store_redis_link -- where the Redis store's requests go, and how they get there.
 *
 * Each event loop that uses the store (each worker, and the main loop for lease
 * heartbeats) has its own struct rloop, made on first use by the thread that runs it and
 * touched by no other thread: its connections (one to the server or Sentinel's master;
 * on a cluster one per master), a send queue flushed once per loop pass (decisions bound
 * for one connection -- and one slot -- go as one script call), and the deadlines of what
 * it waits for, watched by one timer.
 *
 * A connection is made, then set up (AUTH, SELECT, ROLE behind Sentinel, SCRIPT LOAD of
 * every script), and takes requests once every setup command has answered.  A request
 * that arrives meanwhile waits in the queue, within its deadline: a loop's first
 * decisions wait for its first connection, behind Sentinel too.  A connection that fails
 * is re-made with exponential backoff (100 ms to 5 s, jittered) and is not used
 * meanwhile: what would go there is answered by on_failure at once.  One that stops
 * answering for a while is dropped and re-made.
 *
 * Cluster.  The slot map comes from CLUSTER SLOTS, asked of a seed at first and then of
 * any master this loop reaches: at start, every 10 s, at once after a MOVED or a
 * CLUSTERDOWN, and every second while a master is unreachable (a replica promoted after
 * its master died shows up there).  MOVED re-routes the request and its slot; ASK sends
 * it once to the node named, after ASKING; TRYAGAIN sends it again 25 ms later; each
 * request follows at most REDIS_MAX_REDIRECTS of them within its deadline.  CLUSTERDOWN,
 * and a slot whose master cannot be reached, are answered by on_failure.  Addresses the
 * cluster announces outside the seeds' hosts are followed and logged once.
 *
 * This room calls no other: the scripts' table is here (every connection loads them), and
 * what comes back for the operations (an answer, a failure, decisions to send again with
 * the script's text, the copy of a withdrawn decision) goes through the callbacks that
 * store_redis.c registered in struct rstore (st->cb).
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <hiredis/adapters/libevent.h>

#include "redis_scripts.h"
#include "store_redis_int.h"
#include "util.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define STALL_MIN_MS 1000          /* no reply for this long with requests out: drop it */
#define CONNECT_TIMEOUT_MS 2000
#define MAP_REFRESH_MS 10000       /* the slot map, asked again */
#define MAP_RETRY_MS 1000          /* ... while a master is unreachable or the map unknown */
#define TRYAGAIN_MS 25

/* ---- addresses ------------------------------------------------------------------------ */

void redis_addr_format(const struct addr *a, char *buf, size_t len)
{
	if (a->port == 0)
		fmt_fixed(buf, len, "unix:%s", a->host);
	else if (strchr(a->host, ':'))
		fmt_fixed(buf, len, "[%s]:%d", a->host, a->port);
	else
		fmt_fixed(buf, len, "%s:%d", a->host, a->port);
}

/*
 * "unix:/path", "/path", "host:port", "[v6]:port", "host" (port 6379).  A host name is
 * resolved here, once (hiredis would resolve it, blocking, at every reconnection).
 */
int redis_addr_parse(const char *text, struct addr *ret, char *err, size_t errlen)
{
	memset(ret, 0, sizeof(*ret));
	if (strncmp(text, "unix:", 5) == 0 || text[0] == '/') {
		const char *path = text[0] == '/' ? text : text + 5;
		if (!*path || fmt_fixed(ret->host, sizeof(ret->host), "%s", path) < 0) {
			fmt_fixed(err, errlen, "bad socket path '%s'", text);
			return -EINVAL;
		}
		return 0;
	}
	char host[256];
	const char *port = NULL;
	if (text[0] == '[') {
		const char *end = strchr(text, ']');
		if (!end || (size_t)(end - text - 1) >= sizeof(host) || (end[1] && end[1] != ':')) {
			fmt_fixed(err, errlen, "bad address '%s' (expected [v6]:port)", text);
			return -EINVAL;
		}
		memcpy(host, text + 1, (size_t)(end - text - 1));
		host[end - text - 1] = '\0';
		port = end[1] ? end + 2 : NULL;
	} else {
		const char *colon = strrchr(text, ':');
		size_t n = colon ? (size_t)(colon - text) : strlen(text);
		if (n == 0 || n >= sizeof(host) || (colon && strchr(text, ':') != colon)) {
			fmt_fixed(err, errlen, "bad address '%s' (expected host:port)", text);
			return -EINVAL;
		}
		memcpy(host, text, n);
		host[n] = '\0';
		port = colon ? colon + 1 : NULL;
	}
	long p = 6379;
	if (port) {
		char *end;
		p = strtol(port, &end, 10);
		if (!*port || *end || p < 1 || p > 65535) {
			fmt_fixed(err, errlen, "bad port in '%s'", text);
			return -EINVAL;
		}
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	int r = getaddrinfo(host, NULL, &hints, &ai);
	if (r != 0 || !ai) {
		fmt_fixed(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(r));
		return -EINVAL;
	}
	char num[NI_MAXHOST];
	r = getnameinfo(ai->ai_addr, ai->ai_addrlen, num, sizeof(num), NULL, 0, NI_NUMERICHOST);
	freeaddrinfo(ai);
	if (r != 0) {
		fmt_fixed(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(r));
		return -EINVAL;
	}
	fmt_fixed(ret->host, sizeof(ret->host), "%s", num);
	ret->port = (int)p;
	return 0;
}

static bool addr_same(const struct addr *a, const struct addr *b)
{
	return a->port == b->port && strcmp(a->host, b->host) == 0;
}

/* CRC16/XMODEM (polynomial 0x1021, initial 0), as Redis Cluster hashes keys. */
uint16_t redis_key_slot(const char *tag, size_t len)
{
	uint16_t crc = 0;
	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)((unsigned char)tag[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc & (REDIS_SLOTS - 1);
}

/* ---- the store's state ---------------------------------------------------------------- */

void redis_set_state(struct rstore *st, bool up, const char *why)
{
	char msg[320], where[300];
	if (st->cluster)
		fmt_fixed(where, sizeof(where), "cluster (from %zu seed%s)", st->nseeds,
			  st->nseeds == 1 ? "" : "s");
	else if (st->nsentinels)
		fmt_fixed(where, sizeof(where), "master '%s' (through %zu sentinels)",
			  st->master_name, st->nsentinels);
	else
		redis_addr_format(&st->server_addr, where, sizeof(where));
	const char *fail = st->conf.on_failure == STORE_FAIL_ACCEPT	? "accept"
			   : st->conf.on_failure == STORE_FAIL_TEMPFAIL ? "tempfail"
									: "local";
	pthread_mutex_lock(&st->lock);
	if (up) {
		uint64_t was = st->down_since;
		st->down_since = 0;
		fmt_fixed(st->state, sizeof(st->state), "connected to %s", where);
		if (was)
			fmt_fixed(msg, sizeof(msg), "redis store: %s again after %.1fs; shared "
				  "limits are back", where, (double)(realtime_ns() - was) / 1e9);
		else
			fmt_fixed(msg, sizeof(msg), "redis store: connected to %s", where);
	} else {
		if (!st->down_since)
			st->down_since = realtime_ns();
		fmt_fixed(st->state, sizeof(st->state), "unreachable (%s): on_failure=%s", why, fail);
		fmt_fixed(msg, sizeof(msg), "redis store: %s unreachable (%s); deciding with "
			  "on_failure=%s until it is back", where, why, fail);
	}
	pthread_mutex_unlock(&st->lock);
	if (st->conf.notify)
		st->conf.notify(st->conf.notify_arg, !up, msg);
}

/* Does this connection's health count in the store's?  On a cluster, only a master
 * that holds slots (or a seed while no map is known). */
static bool conn_counts(const struct redis_conn *c)
{
	return !c->st->cluster || !c->loop->map_known || !c->retired;
}

static void conn_mark(struct redis_conn *c, bool healthy, const char *why)
{
	struct rstore *st = c->st;
	c->healthy = healthy;
	bool down = !healthy && conn_counts(c);
	if (down && !c->counted_down) {
		c->counted_down = true;
		char what[420];
		if (st->cluster) { /* which master: the others still decide their slots */
			char where[300];
			redis_addr_format(&c->addr, where, sizeof(where));
			fmt_fixed(what, sizeof(what), "master %s: %s", where,
				  why && *why ? why : "connection lost");
			why = what;
		}
		if (atomic_fetch_add(&st->down, 1) == 0)
			redis_set_state(st, false, why && *why ? why : "connection lost");
	} else if (!down && c->counted_down) {
		c->counted_down = false;
		if (atomic_fetch_sub(&st->down, 1) == 1)
			redis_set_state(st, true, NULL);
	} else if (healthy && !atomic_exchange(&st->announced, true)) {
		redis_set_state(st, true, NULL);
	}
}

/* ---- the scripts; the keys of a decision ---------------------------------------------- */

const struct redis_script redis_scripts[SC_COUNT] = {
	[SC_GCRA] = { script_gcra, sizeof(script_gcra) - 1, script_gcra_sha1 },
	[SC_REFUND] = { script_refund, sizeof(script_refund) - 1, script_refund_sha1 },
	[SC_SLOT_ENTER] = { script_slot_enter, sizeof(script_slot_enter) - 1, script_slot_enter_sha1 },
	[SC_SLOT_RELEASE] = { script_slot_release, sizeof(script_slot_release) - 1,
			      script_slot_release_sha1 },
	[SC_SLOT_RENEW] = { script_slot_renew, sizeof(script_slot_renew) - 1, script_slot_renew_sha1 },
	[SC_SLIDE] = { script_slide, sizeof(script_slide) - 1, script_slide_sha1 },
	[SC_OV_SET] = { script_ov_set, sizeof(script_ov_set) - 1, script_ov_set_sha1 },
	[SC_OV_DEL] = { script_ov_del, sizeof(script_ov_del) - 1, script_ov_del_sha1 },
	[SC_OV_READ] = { script_ov_read, sizeof(script_ov_read) - 1, script_ov_read_sha1 },
};

size_t redis_call_keys(const struct store_call *call)
{
	size_t k = call->n;
	for (size_t i = 0; i < call->n; i++)
		k += !!(call->items[i].flags & STORE_DISTINCT);
	return k;
}

/* ---- requests ------------------------------------------------------------------------- */

/* The operations' answers, through what store_redis.c registered (st->cb): this room
 * names no function of that one.  Nothing for a NULL request. */
static void rreq_fail(struct rreq *r, int err)
{
	if (r)
		r->loop->st->cb.fail(r, err);
}

static void loop_timer_arm(struct rloop *l);

struct rreq *rreq_new(struct rloop *l, enum req_kind kind, enum script_id sc)
{
	if (l->nreqs >= REDIS_MAX_REQS)
		return NULL;
	struct rreq *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	l->nreqs++;
	r->loop = l;
	r->kind = kind;
	r->script = sc;
	r->deadline_ms = now_ms() + l->st->conf.timeout_ms;
	return r;
}

void rreq_leave(struct rreq *r)
{
	struct rloop *l = r->loop;
	if (!r->waiting)
		return;
	if (r->prev)
		r->prev->next = r->next;
	else
		l->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		l->tail = r->prev;
	r->prev = r->next = NULL;
	r->waiting = false;
}

void rreq_free_one(struct rreq *r)
{
	rreq_leave(r);
	if (r->orphan && r->call) {
		free(r->call);
		r->call = NULL;
	}
	if (r->kind != REQ_DECIDE)
		argv_clear(&r->cmd);
	r->loop->nreqs--;
	free(r);
}

/* Into the deadline list, kept in deadline order (a request sent again keeps its first
 * deadline, so it may go before later ones). */
static void rreq_wait(struct rreq *r)
{
	struct rloop *l = r->loop;
	struct rreq *after = l->tail;
	while (after && after->deadline_ms > r->deadline_ms)
		after = after->prev;
	r->waiting = true;
	r->prev = after;
	r->next = after ? after->next : l->head;
	if (r->next)
		r->next->prev = r;
	else
		l->tail = r;
	if (after)
		after->next = r;
	else
		l->head = r;
	if (l->head == r)
		loop_timer_arm(l);
}

/* Into the send queue; kick: flush it in this loop pass (not for what the flush itself
 * keeps back: it waits for a connection, the map or its time, which flush again). */
static void rreq_queue(struct rreq *r, bool kick)
{
	struct rloop *l = r->loop;
	r->queued = true;
	r->qnext = NULL;
	if (l->q_tail)
		l->q_tail->qnext = r;
	else
		l->q_head = r;
	l->q_tail = r;
	if (kick)
		event_active(l->flush, EV_TIMEOUT, 0);
}

void rreq_submit(struct rreq *r)
{
	if (!r->waiting)
		rreq_wait(r);
	rreq_queue(r, true);
}

/* ---- connections ---------------------------------------------------------------------- */

static void conn_start(struct redis_conn *c);
static void conn_down(struct redis_conn *c, const char *why);
static void map_ask(struct rloop *l);

static size_t stall_ms(const struct rstore *st)
{
	return st->conf.timeout_ms * 20 > STALL_MIN_MS ? st->conf.timeout_ms * 20 : STALL_MIN_MS;
}

static uint64_t quiet_since(const struct redis_conn *c)
{
	return c->last_reply_ms > c->busy_since_ms ? c->last_reply_ms : c->busy_since_ms;
}

/* Arm ev for the monotonic time at (ms), or stop it for UINT64_MAX. */
static void timer_at(struct event *ev, uint64_t at)
{
	if (at == UINT64_MAX) {
		evtimer_del(ev);
		return;
	}
	uint64_t now = now_ms();
	struct timeval tv = timeval_from_ms(at > now ? at - now : 0);
	evtimer_add(ev, &tv);
}

static void conn_timer_arm(struct redis_conn *c)
{
	uint64_t at = UINT64_MAX;
	if (c->ac && !c->ready)
		at = c->connect_deadline_ms;
	if (c->ac && c->ready && c->inflight > 0) {
		uint64_t stall = quiet_since(c) + stall_ms(c->st);
		if (stall < at)
			at = stall;
	}
	timer_at(c->timer, at);
}

static void on_conn_timer(evutil_socket_t fd, short what, void *arg)
{
	struct redis_conn *c = arg;
	uint64_t now = now_ms();
	(void)fd;
	(void)what;
	if (c->ac && !c->ready && c->connect_deadline_ms <= now) {
		conn_down(c, c->connected ? "no answer to the connection's setup"
					  : "connection timed out");
		return;
	}
	if (c->ac && c->ready && c->inflight > 0 && now - quiet_since(c) >= stall_ms(c->st)) {
		char why[96];
		fmt_fixed(why, sizeof(why), "no reply for %zums", stall_ms(c->st));
		conn_down(c, why);
		return;
	}
	conn_timer_arm(c);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	conn_start(arg);
}

/* The connection is gone (c->err says why): mark it down and try again after the next
 * backoff step.  What waits for it in the queue is answered by the next flush. */
static void retry_later(struct redis_conn *c)
{
	c->ready = false;
	c->connected = false;
	conn_mark(c, false, c->err);
	event_active(c->loop->flush, EV_TIMEOUT, 0);
	if (c->st->cluster)
		map_ask(c->loop);  /* its slots may have moved to a promoted replica */
	if (c->retired)
		return;
	c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : BACKOFF_MIN_MS;
	if (c->backoff_ms > BACKOFF_MAX_MS)
		c->backoff_ms = BACKOFF_MAX_MS;
	struct timeval tv = timeval_from_ms(jitter(c->backoff_ms, 20, 20));
	evtimer_add(c->retry, &tv);
}

/* Give up on the current connection (from outside hiredis callbacks) and try again later. */
static void conn_down(struct redis_conn *c, const char *why)
{
	fmt_fixed(c->err, sizeof(c->err), "%s", why);
	if (c->sac) {
		redisAsyncContext *sac = c->sac;
		c->sac = NULL;
		sac->data = NULL;
		redisAsyncFree(sac);
	}
	if (c->ac) {
		redisAsyncContext *ac = c->ac;
		c->ac = NULL;
		ac->data = NULL; /* its disconnect callback must not schedule a second retry */
		redisAsyncFree(ac); /* runs every pending callback with no reply */
	}
	retry_later(c);
	conn_timer_arm(c);
}

/* Drop the connection from inside a hiredis callback: its disconnect callback follows. */
static void conn_drop(struct redis_conn *c, const char *why)
{
	if (!c->err[0]) /* the first reason of this attempt: later ones follow from it */
		fmt_fixed(c->err, sizeof(c->err), "%s", why);
	if (c->ac && !(c->ac->c.flags & REDIS_DISCONNECTING))
		redisAsyncDisconnect(c->ac);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
	struct redis_conn *c = ac->data;
	(void)status;
	if (!c || c->ac != ac)
		return; /* we dropped it ourselves */
	c->ac = NULL;
	if (ac->errstr[0])
		fmt_fixed(c->err, sizeof(c->err), "%s", ac->errstr);
	else if (!c->err[0])
		fmt_fixed(c->err, sizeof(c->err), "connection closed by the server");
	retry_later(c);
	conn_timer_arm(c);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
	struct redis_conn *c = ac->data;
	if (!c || c->ac != ac)
		return;
	if (status != REDIS_OK) {
		/* hiredis frees ac after this callback */
		c->ac = NULL;
		fmt_fixed(c->err, sizeof(c->err), "%s", ac->errstr[0] ? ac->errstr : "connect failed");
		retry_later(c);
		conn_timer_arm(c);
		return;
	}
	c->connected = true;
	c->last_reply_ms = now_ms();
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata);

/* Send a command on c with s as what its reply answers.  0, or -EIO (s freed). */
static int conn_send(struct redis_conn *c, struct rsent *s, int argc, const char **argv,
		     const size_t *len)
{
	if (redisAsyncCommandArgv(c->ac, on_reply, s, argc, argv, len) != REDIS_OK) {
		free(s);
		return -EIO;
	}
	if (c->inflight++ == 0) {
		/* the stall check starts with the first request out after a quiet spell */
		c->busy_since_ms = now_ms();
		conn_timer_arm(c);
	}
	return 0;
}

static struct rsent *sent_new(struct redis_conn *c, enum sent_kind kind, size_t n)
{
	struct rsent *s = calloc(1, sizeof(*s) + n * sizeof(s->r[0]));
	if (s) {
		s->conn = c;
		s->kind = kind;
		s->script = -1;
		s->n = n;
	}
	return s;
}

static void send_setup(struct redis_conn *c, const char *what, int script, int argc,
		       const char **argv, const size_t *len)
{
	struct rsent *s = sent_new(c, SENT_SETUP, 0);
	if (!s) {
		conn_drop(c, "out of memory");
		return;
	}
	s->what = what;
	s->script = script;
	if (conn_send(c, s, argc, argv, len) == 0)
		c->setup_left++;
}

/* Commands every new connection sends first (pipelined before any request). */
static void conn_setup(struct redis_conn *c)
{
	struct rstore *st = c->st;
	c->setup_left = 0;
	if (st->password) {
		const char *argv[3] = { "AUTH", st->user ? st->user : st->password, st->password };
		size_t len[3] = { 4, strlen(argv[1]), strlen(st->password) };
		send_setup(c, "AUTH", -1, st->user ? 3 : 2, argv, len);
	}
	if (st->conf.db && !st->cluster) {
		char db[16];
		fmt_fixed(db, sizeof(db), "%u", st->conf.db);
		const char *argv[2] = { "SELECT", db };
		size_t len[2] = { 6, strlen(db) };
		send_setup(c, "SELECT", -1, 2, argv, len);
	}
	if (st->nsentinels) {
		const char *argv[1] = { "ROLE" };
		size_t len[1] = { 4 };
		send_setup(c, "ROLE", -1, 1, argv, len);
	}
	for (int i = 0; i < SC_COUNT; i++) {
		const char *argv[3] = { "SCRIPT", "LOAD", redis_scripts[i].text };
		size_t len[3] = { 6, 4, redis_scripts[i].len };
		send_setup(c, "SCRIPT LOAD", i, 3, argv, len);
	}
}

static void connect_to(struct redis_conn *c)
{
	redisAsyncContext *ac = c->addr.port ? redisAsyncConnect(c->addr.host, c->addr.port)
					     : redisAsyncConnectUnix(c->addr.host);
	if (!ac || ac->err) {
		char why[160];
		fmt_fixed(why, sizeof(why), "%s", ac ? ac->errstr : "out of memory");
		if (ac)
			redisAsyncFree(ac);
		c->ac = NULL;
		conn_down(c, why);
		return;
	}
	ac->data = c;
	if (redisLibeventAttach(ac, c->loop->base) != REDIS_OK) {
		redisAsyncFree(ac);
		conn_down(c, "cannot attach to the event loop");
		return;
	}
	c->ac = ac;
	c->connected = false;
	c->ready = false;
	c->err[0] = '\0';
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	c->connect_deadline_ms = now_ms() + CONNECT_TIMEOUT_MS;
	conn_setup(c);
	conn_timer_arm(c);
}

static void sentinel_next(struct redis_conn *c);

static void on_sentinel_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct redis_conn *c = privdata;
	redisReply *r = reply;
	if (!c || c->sac != ac)
		return;
	c->sac = NULL;
	redisAsyncDisconnect(ac); /* freed by hiredis once this callback returns */
	if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
	    r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING) {
		long port = strtol(r->element[1]->str, NULL, 10);
		if (port > 0 && port < 65536 &&
		    fmt_fixed(c->addr.host, sizeof(c->addr.host), "%s", r->element[0]->str) == 0) {
			c->addr.port = (int)port;
			connect_to(c);
			return;
		}
	}
	fmt_fixed(c->err, sizeof(c->err), "sentinel does not know master '%s'",
		  c->st->master_name);
	c->next_sentinel++;
	if (c->next_sentinel % c->st->nsentinels == 0) {
		conn_down(c, c->err);
		return;
	}
	sentinel_next(c);
}

static void on_sentinel_disconnect(const redisAsyncContext *ac, int status)
{
	(void)status;
	struct redis_conn *c = ac->data;
	if (!c || c->sac != ac)
		return;
	c->sac = NULL; /* asked and lost: try the next one */
	c->next_sentinel++;
	if (c->next_sentinel % c->st->nsentinels == 0) {
		conn_down(c, "no sentinel answered");
		return;
	}
	sentinel_next(c);
}

static void on_sentinel_connect(const redisAsyncContext *ac, int status)
{
	(void)ac;
	(void)status; /* a failure comes to on_sentinel_disconnect */
}

/* Ask the next sentinel where the master is. */
static void sentinel_next(struct redis_conn *c)
{
	const struct addr *s = &c->st->sentinels[c->next_sentinel % c->st->nsentinels];
	redisAsyncContext *ac = s->port ? redisAsyncConnect(s->host, s->port)
				       : redisAsyncConnectUnix(s->host);
	if (!ac || ac->err || redisLibeventAttach(ac, c->loop->base) != REDIS_OK) {
		if (ac)
			redisAsyncFree(ac);
		conn_down(c, "cannot reach a sentinel");
		return;
	}
	ac->data = c;
	c->sac = ac;
	redisAsyncSetConnectCallback(ac, on_sentinel_connect);
	redisAsyncSetDisconnectCallback(ac, on_sentinel_disconnect);
	const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", c->st->master_name };
	size_t len[3] = { 8, 23, strlen(c->st->master_name) };
	if (redisAsyncCommandArgv(ac, on_sentinel_reply, c, 3, argv, len) != REDIS_OK)
		conn_down(c, "cannot ask a sentinel");
	/* the request deadlines stay the loop's: a request waits for the master's address
	 * within its own timeout, and is answered by on_failure past it */
	c->connect_deadline_ms = now_ms() + CONNECT_TIMEOUT_MS;
}

static void conn_start(struct redis_conn *c)
{
	if (c->ac || c->sac || c->retired)
		return;
	if (!c->healthy)
		atomic_fetch_add(&c->st->reconnects, 1);
	if (c->st->nsentinels) {
		sentinel_next(c);
		return;
	}
	connect_to(c);
}

static struct redis_conn *conn_new(struct rloop *l, const struct addr *a)
{
	if (l->nconns >= REDIS_MAX_NODES)
		return NULL;
	struct redis_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->loop = l;
	c->st = l->st;
	c->addr = *a;
	c->healthy = true;
	c->timer = evtimer_new(l->base, on_conn_timer, c);
	c->retry = evtimer_new(l->base, on_retry, c);
	if (!c->timer || !c->retry) {
		if (c->timer)
			event_free(c->timer);
		if (c->retry)
			event_free(c->retry);
		free(c);
		return NULL;
	}
	c->index = (uint8_t)l->nconns;
	l->conns[l->nconns++] = c;
	return c;
}

static void conn_free(struct redis_conn *c)
{
	if (c->sac) {
		c->sac->data = NULL;
		redisAsyncFree(c->sac);
	}
	if (c->ac) {
		redisAsyncContext *ac = c->ac;
		c->ac = NULL;
		ac->data = NULL;
		redisAsyncFree(ac);
	}
	event_free(c->timer);
	event_free(c->retry);
	free(c);
}

/* The connection of this loop to a, made (and started) if new. */
static struct redis_conn *conn_for(struct rloop *l, const struct addr *a)
{
	for (size_t i = 0; i < l->nconns; i++)
		if (addr_same(&l->conns[i]->addr, a))
			return l->conns[i];
	struct redis_conn *c = conn_new(l, a);
	if (c)
		conn_start(c);
	return c;
}

/* ---- the cluster's slot map ----------------------------------------------------------- */

/* Log once an address the cluster announced that is not a seed's host. */
static void note_address(struct rstore *st, const struct addr *a)
{
	for (size_t i = 0; i < st->nseeds; i++)
		if (strcmp(st->seeds[i].host, a->host) == 0)
			return;
	bool first = true;
	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < st->nlogged && first; i++)
		first = !addr_same(&st->logged[i], a);
	if (first && st->nlogged < sizeof(st->logged) / sizeof(st->logged[0]))
		st->logged[st->nlogged++] = *a;
	pthread_mutex_unlock(&st->lock);
	if (first && st->conf.notify) {
		char where[300], msg[400];
		redis_addr_format(a, where, sizeof(where));
		fmt_fixed(msg, sizeof(msg), "redis store: the cluster sends requests to %s, a host "
			  "not among the seeds; following it", where);
		st->conf.notify(st->conf.notify_arg, false, msg);
	}
}

/* A master's address from a CLUSTER SLOTS node entry [host, port, ...]; an empty host
 * (or "?") is the host of the node asked. */
static int slots_node_addr(const redisReply *n, const struct addr *asked, struct addr *ret)
{
	if (n->type != REDIS_REPLY_ARRAY || n->elements < 2 ||
	    n->element[0]->type != REDIS_REPLY_STRING || n->element[1]->type != REDIS_REPLY_INTEGER ||
	    n->element[1]->integer < 1 || n->element[1]->integer > 65535 ||
	    n->element[0]->len >= sizeof(ret->host) || memchr(n->element[0]->str, '\0',
							      n->element[0]->len))
		return -EPROTO;
	memset(ret, 0, sizeof(*ret));
	if (n->element[0]->len == 0 || strcmp(n->element[0]->str, "?") == 0)
		fmt_fixed(ret->host, sizeof(ret->host), "%s", asked->host);
	else
		memcpy(ret->host, n->element[0]->str, n->element[0]->len);
	ret->port = (int)n->element[1]->integer;
	return 0;
}

int redis_slots_parse(const redisReply *rep, const struct addr *asked,
		      struct redis_slot_range *ret, size_t max)
{
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements > max)
		return -EPROTO;
	for (size_t i = 0; i < rep->elements; i++) {
		const redisReply *e = rep->element[i];
		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER || e->element[0]->integer < 0 ||
		    e->element[1]->integer >= REDIS_SLOTS ||
		    e->element[0]->integer > e->element[1]->integer ||
		    slots_node_addr(e->element[2], asked, &ret[i].master) < 0)
			return -EPROTO;
		ret[i].first = (uint16_t)e->element[0]->integer;
		ret[i].last = (uint16_t)e->element[1]->integer;
	}
	return (int)rep->elements;
}

/* A CLUSTER SLOTS reply into the loop's map: 0, or <0 (the map unchanged). */
static int map_take(struct rloop *l, const redisReply *rep, const struct redis_conn *asked)
{
	size_t max = rep->type == REDIS_REPLY_ARRAY && rep->elements < REDIS_SLOTS ? rep->elements
										      : REDIS_SLOTS;
	struct redis_slot_range *ranges = calloc(max ? max : 1, sizeof(*ranges));
	uint8_t *map = malloc(REDIS_SLOTS);
	int n = ranges && map ? redis_slots_parse(rep, &asked->addr, ranges, max) : -ENOMEM;
	if (n < 0) {
		free(ranges);
		free(map);
		return n;
	}
	memset(map, REDIS_NO_NODE, REDIS_SLOTS);
	bool used[REDIS_MAX_NODES] = { false };
	unsigned masters = 0;
	for (int i = 0; i < n; i++) {
		struct redis_conn *c = conn_for(l, &ranges[i].master);
		if (!c)
			continue; /* over REDIS_MAX_NODES: those slots stay unknown (on_failure) */
		if (!used[c->index]) {
			used[c->index] = true;
			masters++;
			note_address(l->st, &ranges[i].master);
		}
		memset(map + ranges[i].first, c->index, (size_t)(ranges[i].last - ranges[i].first + 1));
	}
	free(ranges);
	free(l->map);
	l->map = map;
	l->map_known = true;
	atomic_store(&l->st->masters, masters);
	/* a master that holds no slot any more is not re-made, and its health no longer
	 * counts; one that holds slots again is */
	for (size_t i = 0; i < l->nconns; i++) {
		struct redis_conn *c = l->conns[i];
		bool was = c->retired;
		c->retired = !used[i];
		if (c->retired && !was && c->ac == NULL && c->sac == NULL)
			evtimer_del(c->retry);
		if (!c->retired && was)
			conn_start(c);
		conn_mark(c, c->healthy, c->err);
	}
	return 0;
}

/* Ask a usable connection of the loop for the slot map (one question at a time). */
static void map_ask(struct rloop *l)
{
	if (!l->st->cluster || l->map_asking)
		return;
	for (size_t k = 0; k < l->nconns; k++) {
		/* the masters in turn, from a different one each time */
		struct redis_conn *c = l->conns[(k + (size_t)l->map_at_ms) % l->nconns];
		if (!c->ready)
			continue;
		struct rsent *s = sent_new(c, SENT_MAP, 0);
		if (!s)
			return;
		s->what = "CLUSTER SLOTS";
		const char *argv[2] = { "CLUSTER", "SLOTS" };
		size_t len[2] = { 7, 5 };
		if (conn_send(c, s, 2, argv, len) == 0) {
			l->map_asking = true;
			l->map_at_ms = now_ms();
			return;
		}
	}
	/* none is ready: the first that becomes ready asks */
}

/* ---- replies -------------------------------------------------------------------------- */

/* An error reply that says the server is not the writable master any more. */
static bool reply_means_reconnect(const redisReply *r)
{
	return strncmp(r->str, "READONLY", 8) == 0 || strncmp(r->str, "LOADING", 7) == 0 ||
	       strncmp(r->str, "MASTERDOWN", 10) == 0 || strncmp(r->str, "NOAUTH", 6) == 0 ||
	       strncmp(r->str, "WRONGPASS", 9) == 0;
}

int redis_redirect_parse(const char *text, unsigned *ret_slot, struct addr *ret)
{
	const char *sp = strchr(text, ' ');
	if (!sp)
		return -EPROTO;
	char *end;
	unsigned long slot = strtoul(sp + 1, &end, 10);
	if (end == sp + 1 || *end != ' ' || slot >= REDIS_SLOTS)
		return -EPROTO;
	const char *where = end + 1;
	const char *colon = strrchr(where, ':');
	if (!colon || colon == where || (size_t)(colon - where) >= sizeof(ret->host))
		return -EPROTO;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port < 1 || port > 65535)
		return -EPROTO;
	memset(ret, 0, sizeof(*ret));
	const char *h = where;
	size_t hl = (size_t)(colon - where);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	memcpy(ret->host, h, hl);
	ret->port = (int)port;
	*ret_slot = (unsigned)slot;
	return 0;
}

/* Put the requests of s that still wait back in the queue (a redirection), with at most
 * REDIS_MAX_REDIRECTS each; the others are failed by err.  s->r[i] set to NULL when kept. */
static void requeue(struct rsent *s, uint64_t not_before, struct redis_conn *ask, int err)
{
	for (size_t i = 0; i < s->n; i++) {
		struct rreq *r = s->r[i];
		if (!r->waiting)
			continue;
		if (r->redirects++ >= REDIS_MAX_REDIRECTS) {
			rreq_fail(r, err);
			continue;
		}
		r->not_before_ms = not_before;
		r->ask = ask;
		rreq_queue(r, not_before == 0);
		s->r[i] = NULL;
	}
}

static void setup_reply(struct redis_conn *c, struct rsent *s, const redisReply *rep)
{
	if (rep->type == REDIS_REPLY_ERROR) {
		char why[160];
		fmt_fixed(why, sizeof(why), "%s: %.100s", s->what, rep->str);
		atomic_fetch_add(&c->st->errors, 1);
		conn_drop(c, why);
		return;
	}
	if (s->what && strcmp(s->what, "ROLE") == 0 && rep->type == REDIS_REPLY_ARRAY &&
	    rep->elements >= 1 && rep->element[0]->type == REDIS_REPLY_STRING &&
	    strcmp(rep->element[0]->str, "master") != 0) {
		char why[96];
		fmt_fixed(why, sizeof(why), "the server is a %.20s, not the master",
			  rep->element[0]->str);
		conn_drop(c, why);
		return;
	}
	if (c->setup_left > 0 && --c->setup_left == 0 && c->ac &&
	    !(c->ac->c.flags & REDIS_DISCONNECTING)) {
		/* the last setup reply: the connection works */
		c->ready = true;
		c->backoff_ms = 0;
		c->err[0] = '\0';
		conn_mark(c, true, NULL);
		conn_timer_arm(c);
		struct rloop *l = c->loop;
		if (c->st->cluster && (!l->map_known || now_ms() - l->map_at_ms >= MAP_RETRY_MS))
			map_ask(l);
		event_active(l->flush, EV_TIMEOUT, 0);
	}
}

static void map_reply(struct redis_conn *c, const redisReply *rep)
{
	struct rloop *l = c->loop;
	l->map_asking = false;
	if (rep->type == REDIS_REPLY_ERROR || map_take(l, rep, c) < 0) {
		char why[160];
		fmt_fixed(why, sizeof(why), "CLUSTER SLOTS: %.100s",
			  rep->type == REDIS_REPLY_ERROR ? rep->str : "a reply of the wrong shape");
		atomic_fetch_add(&c->st->errors, 1);
		fmt_fixed(c->err, sizeof(c->err), "%s", why);
		conn_mark(c, false, why); /* not a master of a working cluster */
		c->healthy = true;        /* ... but it may answer requests it holds */
	}
	event_active(l->flush, EV_TIMEOUT, 0);
	loop_timer_arm(l);
}

/* What the error reply of a command carrying requests means for them. */
static void reqs_error(struct redis_conn *c, struct rsent *s, const redisReply *rep)
{
	struct rstore *st = c->st;
	struct rloop *l = c->loop;
	unsigned slot;
	struct addr a;
	if (strncmp(rep->str, "NOSCRIPT", 8) == 0 && !s->eval && s->n > 0) {
		/* the script cache was flushed: send them again with the text (which caches it) */
		if (s->r[0]->kind == REQ_DECIDE) {
			size_t k = 0;
			for (size_t i = 0; i < s->n; i++)
				if (s->r[i]->waiting)
					s->r[k++] = s->r[i];
			for (size_t i = k; i < s->n; i++)
				s->r[i] = NULL; /* freed below by the caller: not waiting */
			if (k && st->cb.send_decisions(c, s->r, k, true, false) == 0) {
				for (size_t i = 0; i < k; i++)
					s->r[i] = NULL; /* now carried by the new command */
			}
			return;
		}
		struct rreq *r = s->r[0];
		if (r->waiting) {
			r->cmd.argv[0] = "EVAL";
			r->cmd.len[0] = 4;
			r->cmd.argv[1] = redis_scripts[r->script].text;
			r->cmd.len[1] = redis_scripts[r->script].len;
			struct rsent *again = sent_new(c, SENT_REQS, 1);
			if (again) {
				again->eval = true;
				again->what = r->what;
				again->r[0] = r;
				if (conn_send(c, again, (int)r->cmd.n, r->cmd.argv, r->cmd.len) == 0)
					s->r[0] = NULL;
			}
		}
		return;
	}
	if (st->cluster && strncmp(rep->str, "MOVED ", 6) == 0 && redis_redirect_parse(rep->str, &slot, &a) == 0) {
		atomic_fetch_add(&st->redirects, 1);
		struct redis_conn *to = conn_for(l, &a);
		if (to && l->map) {
			l->map[slot] = to->index;
			if (to->retired) {
				to->retired = false;
				conn_start(to);
			}
			note_address(st, &a);
		}
		map_ask(l);
		requeue(s, 0, NULL, -EAGAIN);
		return;
	}
	if (st->cluster && strncmp(rep->str, "ASK ", 4) == 0 && redis_redirect_parse(rep->str, &slot, &a) == 0) {
		atomic_fetch_add(&st->redirects, 1);
		struct redis_conn *to = conn_for(l, &a);
		if (to)
			note_address(st, &a);
		requeue(s, 0, to, -EAGAIN);
		return;
	}
	if (strncmp(rep->str, "TRYAGAIN", 8) == 0) {
		atomic_fetch_add(&st->redirects, 1);
		requeue(s, now_ms() + TRYAGAIN_MS, NULL, -EAGAIN);
		return;
	}
	atomic_fetch_add(&st->errors, 1);
	if (strncmp(rep->str, "CLUSTERDOWN", 11) == 0) {
		map_ask(l);
		for (size_t i = 0; i < s->n; i++)
			rreq_fail(s->r[i], -EAGAIN);
		return;
	}
	if (reply_means_reconnect(rep)) {
		char why[160];
		fmt_fixed(why, sizeof(why), "%s: %.100s", s->what ? s->what : "script", rep->str);
		conn_drop(c, why);
		for (size_t i = 0; i < s->n; i++)
			rreq_fail(s->r[i], -EAGAIN);
		return;
	}
	for (size_t i = 0; i < s->n; i++)
		rreq_fail(s->r[i], -EPROTO);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct rsent *s = privdata;
	struct redis_conn *c = s->conn;
	redisReply *rep = reply;
	(void)ac;
	c->inflight--;
	if (rep)
		c->last_reply_ms = now_ms();
	if (s->kind == SENT_MAP && !rep)
		c->loop->map_asking = false;
	if (!rep) {
		/* the connection went away: answered by on_failure (a lane: -EAGAIN) */
		for (size_t i = 0; i < s->n; i++)
			rreq_fail(s->r[i], -EAGAIN);
	} else if (s->kind == SENT_SETUP) {
		setup_reply(c, s, rep);
	} else if (s->kind == SENT_MAP) {
		map_reply(c, rep);
	} else if (rep->type == REDIS_REPLY_ERROR) {
		reqs_error(c, s, rep);
	} else {
		c->st->cb.answer(s, rep);
	}
	for (size_t i = 0; i < s->n; i++)
		if (s->r[i])
			rreq_free_one(s->r[i]);
	free(s);
	/* the stall timer is not moved per reply: when it fires it looks at the last reply
	 * (quiet_since) and sets itself again, or stops when nothing is out */
}

/* ---- the loop: its queue, its deadlines ---------------------------------------------- */

int redis_conn_send_reqs(struct redis_conn *c, struct rreq **q, size_t n, bool eval, bool asking,
			 const char *what, int argc, const char **argv, const size_t *len)
{
	if (asking) {
		struct rsent *a = sent_new(c, SENT_REQS, 0);
		const char *av[1] = { "ASKING" };
		size_t al[1] = { 6 };
		if (!a || conn_send(c, a, 1, av, al) < 0)
			return -EIO;
	}
	struct rsent *s = sent_new(c, SENT_REQS, n);
	if (!s)
		return -ENOMEM;
	s->eval = eval;
	s->what = what;
	s->decisions = n > 0 && q[0]->kind == REQ_DECIDE && q[0]->call &&
		       q[0]->call->mode != STORE_RESET;
	memcpy(s->r, q, n * sizeof(q[0]));
	return conn_send(c, s, argc, argv, len);
}

/* Where r goes now: a ready connection; NULL with *ret_wait set when it should wait in
 * the queue (a first connection or the slot map on its way), else NULL (on_failure). */
static struct redis_conn *route(struct rloop *l, const struct rreq *r, bool *ret_wait)
{
	struct redis_conn *c = r->ask;
	*ret_wait = false;
	if (!c) {
		if (!l->st->cluster) {
			c = l->conns[0];
		} else if (!l->map_known || l->map[r->slot] == REDIS_NO_NODE) {
			*ret_wait = !l->map_known;
			return NULL;
		} else {
			c = l->conns[l->map[r->slot]];
		}
	}
	if (c->ready && c->ac && c->inflight < REDIS_MAX_INFLIGHT)
		return c;
	/* a connection on its first attempt (or between two after a success) is waited
	 * for; one that failed is not */
	*ret_wait = c->healthy && (c->ac || c->sac);
	return NULL;
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
	struct rloop *l = arg;
	(void)fd;
	(void)what;
	struct rreq *q = l->q_head;
	l->q_head = l->q_tail = NULL;
	uint64_t now = now_ms();
	struct rreq *batch[REDIS_BATCH_DECISIONS];
	size_t nb = 0, keys = 0;
	struct redis_conn *bc = NULL;
	uint16_t bslot = 0;
	while (q || nb) {
		struct rreq *r = q;
		struct redis_conn *c = NULL;
		bool wait = false;
		if (r) {
			q = r->qnext;
			r->qnext = NULL;
			r->queued = false;
			if (!r->waiting) {
				rreq_free_one(r);
				continue;
			}
			if (r->not_before_ms > now) {
				rreq_queue(r, false);
				continue;
			}
			c = route(l, r, &wait);
			if (!c) {
				if (wait)
					rreq_queue(r, false);
				else {
					rreq_fail(r, -EAGAIN);
					rreq_free_one(r);
				}
				continue;
			}
		}
		bool batchable = r && r->kind == REQ_DECIDE && !r->ask &&
				 r->call->mode != STORE_RESET;
		/* the batch so far goes when r cannot join it */
		if (nb && (!r || !batchable || c != bc || (l->st->cluster && r->slot != bslot) ||
			   nb == REDIS_BATCH_DECISIONS || keys + redis_call_keys(r->call) > REDIS_BATCH_KEYS)) {
			if (l->st->cb.send_decisions(bc, batch, nb, false, false) < 0)
				for (size_t i = 0; i < nb; i++) {
					rreq_fail(batch[i], -EAGAIN);
					rreq_free_one(batch[i]);
				}
			nb = keys = 0;
		}
		if (!r)
			break;
		if (batchable) {
			batch[nb++] = r;
			keys += redis_call_keys(r->call);
			bc = c;
			bslot = r->slot;
			continue;
		}
		int rc;
		if (r->kind == REQ_DECIDE)
			rc = l->st->cb.send_decisions(c, &r, 1, false, r->ask != NULL);
		else
			rc = redis_conn_send_reqs(c, &r, 1, false, r->ask != NULL, r->what,
						  (int)r->cmd.n, r->cmd.argv, r->cmd.len);
		r->ask = NULL;
		if (rc < 0) {
			rreq_fail(r, -EAGAIN);
			rreq_free_one(r);
		}
	}
	loop_timer_arm(l);
}

/* How long the slot map is used before it is asked again: a second while it is unknown
 * or a master holding slots is not ready, else MAP_REFRESH_MS. */
static uint64_t map_interval(const struct rloop *l)
{
	bool down = !l->map_known;
	for (size_t i = 0; i < l->nconns && !down; i++)
		down = !l->conns[i]->retired && !l->conns[i]->ready;
	return down ? MAP_RETRY_MS : MAP_REFRESH_MS;
}

static void loop_timer_arm(struct rloop *l)
{
	uint64_t at = UINT64_MAX;
	if (l->head)
		at = l->head->deadline_ms;
	for (struct rreq *r = l->q_head; r; r = r->qnext)
		if (r->not_before_ms && r->not_before_ms < at)
			at = r->not_before_ms;
	if (l->st->cluster) {
		uint64_t next = l->map_at_ms + map_interval(l);
		if (next < at)
			at = next;
	}
	timer_at(l->timer, at);
}

static void on_loop_timer(evutil_socket_t fd, short what, void *arg)
{
	struct rloop *l = arg;
	struct rstore *st = l->st;
	uint64_t now = now_ms();
	(void)fd;
	(void)what;
	while (l->head && l->head->deadline_ms <= now) {
		if (l->head->kind != REQ_OTHER)
			atomic_fetch_add(&st->timeouts, 1);
		rreq_fail(l->head, -ETIMEDOUT);
	}
	if (st->cluster && !l->map_asking) {
		if (now - l->map_at_ms >= map_interval(l)) {
			l->map_at_ms = now; /* also when no connection can ask: not before the next */
			map_ask(l);
		}
	}
	if (l->q_head)
		event_active(l->flush, EV_TIMEOUT, 0);
	loop_timer_arm(l);
}

struct rloop *rloop_get(struct rstore *st)
{
	struct event_base *base = thread_base();
	if (!base)
		return NULL;
	size_t n = atomic_load(&st->nloops);
	for (size_t i = 0; i < n; i++)
		if (st->loops[i]->base == base)
			return st->loops[i];
	struct rloop *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->st = st;
	l->base = base;
	l->flush = event_new(base, -1, 0, on_flush, l);
	l->timer = evtimer_new(base, on_loop_timer, l);
	if (st->cluster) {
		l->map = malloc(REDIS_SLOTS);
		if (l->map)
			memset(l->map, REDIS_NO_NODE, REDIS_SLOTS);
	}
	bool ok = l->flush && l->timer && (!st->cluster || l->map);
	if (ok && st->cluster) {
		for (size_t i = 0; i < st->nseeds && ok; i++)
			ok = conn_new(l, &st->seeds[i]) != NULL;
	} else if (ok) {
		ok = conn_new(l, &st->server_addr) != NULL;
	}
	pthread_mutex_lock(&st->lock);
	n = atomic_load(&st->nloops);
	ok = ok && n < REDIS_MAX_LOOPS;
	if (ok) {
		st->loops[n] = l;
		atomic_store(&st->nloops, n + 1);
	}
	pthread_mutex_unlock(&st->lock);
	if (!ok) {
		for (size_t i = 0; i < l->nconns; i++)
			conn_free(l->conns[i]);
		if (l->flush)
			event_free(l->flush);
		if (l->timer)
			event_free(l->timer);
		free(l->map);
		free(l);
		return NULL;
	}
	for (size_t i = 0; i < l->nconns; i++)
		conn_start(l->conns[i]);
	return l;
}

void rreq_withdraw(struct rreq *r)
{
	if (!r)
		return;
	r->slotc = NULL;
	r->slide = NULL;
	if (r->kind == REQ_DECIDE && r->call && !r->orphan) {
		/* sent and maybe charged: the store's copy takes the answer and refunds it */
		struct store_call *copy = r->queued ? NULL : r->loop->st->cb.orphan(r->call);
		r->call = copy;
		r->orphan = copy != NULL;
		if (copy)
			return; /* still waits, within its deadline */
	}
	r->call = NULL;
	rreq_leave(r);
}

/*
 * After every loop has stopped (the engine's workers joined, the main loop left): the
 * connections are freed here, on whichever thread, which is safe because no loop runs
 * them any more; their pending calls belong to sessions that are gone.
 */
void redis_links_free(struct rstore *st)
{
	size_t n = atomic_load(&st->nloops);
	for (size_t i = 0; i < n; i++) {
		struct rloop *l = st->loops[i];
		while (l->head) {
			struct rreq *r = l->head;
			r->slotc = NULL;
			r->slide = NULL;
			if (!r->orphan)
				r->call = NULL;
			rreq_leave(r);
		}
		/* queued requests are freed here; those in flight by hiredis, below */
		for (struct rreq *r = l->q_head, *next; r; r = next) {
			next = r->qnext;
			rreq_free_one(r);
		}
		l->q_head = l->q_tail = NULL;
		for (size_t k = 0; k < l->nconns; k++)
			conn_free(l->conns[k]);
		event_free(l->flush);
		event_free(l->timer);
		free(l->map);
		free(l);
	}
	atomic_store(&st->nloops, 0);
}

/* ---- the start-up probe of a cluster --------------------------------------------------- */

int redis_cluster_probe(struct rstore *st, char *err, size_t errlen)
{
	char why[1024] = "";
	size_t wl = 0;
	bool found = false;
	for (size_t i = 0; i < st->nseeds; i++) {
		const struct addr *a = &st->seeds[i];
		char where[300], one[256];
		redis_addr_format(a, where, sizeof(where));
		struct timeval tv = timeval_from_ms(CONNECT_TIMEOUT_MS);
		redisContext *c = a->port ? redisConnectWithTimeout(a->host, a->port, tv)
					  : redisConnectUnixWithTimeout(a->host, tv);
		redisReply *rep = NULL;
		if (c && !c->err) {
			redisSetTimeout(c, tv);
			if (st->password) {
				rep = st->user ? redisCommand(c, "AUTH %s %s", st->user, st->password)
					       : redisCommand(c, "AUTH %s", st->password);
				if (rep && rep->type == REDIS_REPLY_ERROR)
					fmt_fixed(one, sizeof(one), "%.100s", rep->str);
				else
					one[0] = '\0';
				freeReplyObject(rep);
				rep = NULL;
			} else {
				one[0] = '\0';
			}
			if (!one[0])
				rep = redisCommand(c, "CLUSTER SLOTS");
			if (one[0]) {
				/* AUTH refused: said below */
			} else if (!rep) {
				fmt_fixed(one, sizeof(one), "%s", c->errstr[0] ? c->errstr : "no reply");
			} else if (rep->type == REDIS_REPLY_ERROR) {
				fmt_fixed(one, sizeof(one), "not a cluster node (%.100s)", rep->str);
				freeReplyObject(rep);
				redisFree(c);
				fmt_fixed(err, errlen, "cluster seed %s is %s", where, one);
				return -1;
			} else if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
				fmt_fixed(one, sizeof(one), "its cluster has no slots assigned yet");
			} else {
				found = true;
				one[0] = '\0';
			}
		} else {
			fmt_fixed(one, sizeof(one), "%s", c ? c->errstr : "out of memory");
		}
		if (rep)
			freeReplyObject(rep);
		if (c)
			redisFree(c);
		if (one[0] && wl < sizeof(why)) {
			int w = snprintf(why + wl, sizeof(why) - wl, "%s%s: %s", wl ? "; " : "",
					 where, one);
			if (w > 0)
				wl += (size_t)w;
		}
	}
	if (found)
		return 0;
	fmt_fixed(err, errlen, "no cluster seed answered with a slot map: %s", why);
	return -1;
}
