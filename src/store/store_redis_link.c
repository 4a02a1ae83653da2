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
 * Rooms (store_redis_int.h): the link is four files, each calling only files after it:
 * store_redis_loop.c makes each loop's part, flushes its queue and runs its timer; this
 * file holds the connections, Sentinel, the slot map, the replies and their redirections,
 * the scripts' table and the store's up/down state; store_redis_req.c the requests, their
 * deadline list and the send queue; store_redis_addr.c addresses, key slots and what the
 * cluster's replies say, and the blocking start-up probe.  None of them calls the
 * operations: the scripts' table is here (every connection loads them), and what comes
 * back for the operations (an answer, a failure, decisions to send again with the
 * script's text, the copy of a withdrawn decision) goes through the callbacks that
 * store_redis.c registered in struct rstore (st->cb).
 *
 * Threads: all of it runs on the thread of the loop it belongs to, but for
 * redis_conn_free(), which redis_links_free() calls once every loop has stopped.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/adapters/libevent.h>

#include "redis_scripts.h"
#include "store_redis_int.h"
#include "util.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define STALL_MIN_MS 1000          /* no reply for this long with requests out: drop it */
#define TRYAGAIN_MS 25

static bool addr_same(const struct addr *a, const struct addr *b)
{
	return a->port == b->port && strcmp(a->host, b->host) == 0;
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

/* ---- connections ---------------------------------------------------------------------- */

static void conn_down(struct redis_conn *c, const char *why);

static size_t stall_ms(const struct rstore *st)
{
	return st->conf.timeout_ms * 20 > STALL_MIN_MS ? st->conf.timeout_ms * 20 : STALL_MIN_MS;
}

static uint64_t quiet_since(const struct redis_conn *c)
{
	return c->last_reply_ms > c->busy_since_ms ? c->last_reply_ms : c->busy_since_ms;
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
	redis_timer_at(c->timer, at);
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
	redis_conn_start(arg);
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
		redis_map_ask(c->loop);  /* its slots may have moved to a promoted replica */
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
	c->connect_deadline_ms = now_ms() + REDIS_CONNECT_TIMEOUT_MS;
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
	c->connect_deadline_ms = now_ms() + REDIS_CONNECT_TIMEOUT_MS;
}

void redis_conn_start(struct redis_conn *c)
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

struct redis_conn *redis_conn_new(struct rloop *l, const struct addr *a)
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

void redis_conn_free(struct redis_conn *c)
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
	struct redis_conn *c = redis_conn_new(l, a);
	if (c)
		redis_conn_start(c);
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
			redis_conn_start(c);
		conn_mark(c, c->healthy, c->err);
	}
	return 0;
}

/* Ask a usable connection of the loop for the slot map (one question at a time). */
void redis_map_ask(struct rloop *l)
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
		if (c->st->cluster &&
		    (!l->map_known || now_ms() - l->map_at_ms >= REDIS_MAP_RETRY_MS))
			redis_map_ask(l);
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
	rloop_timer_arm(l);
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
				redis_conn_start(to);
			}
			note_address(st, &a);
		}
		redis_map_ask(l);
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
		redis_map_ask(l);
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

/* ---- sending requests ------------------------------------------------------------------ */

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
