/*
 * store_redis -- limits shared by the nodes of a cluster, kept in Redis.
 *
 * Every decision is one Lua script run with EVALSHA (redis/gcra.lua: GCRA over all
 * windows of every rule of an event, atomically, with Redis's own clock so that nodes
 * with skewed clocks agree); refunds and class slots are scripts too.  Keys are
 *     PREFIX RULE ":" WINDOW ":" HASH      e.g. sluice:per-domain:10/1m:9f0c...
 * where HASH is the (rule, key) hash in hex (the seed is derived from the prefix, so
 * every node computes the same names); each key expires once it holds no information.
 *
 * Connections.  One hiredis asynchronous connection per event loop that uses the store
 * (each worker, and the main loop for lease heartbeats), made on first use by the
 * thread that runs the loop and used by no other thread.  Requests are pipelined; each
 * carries a deadline (`timeout`), and the one timer of a connection watches the oldest.
 *
 * Failure.  A decision never waits longer than `timeout`: past it, or at once while the
 * connection is down, it is answered by on_failure -- `local` (a memory store in this
 * process enforcing this node's share, limit / nodes), `accept` or `tempfail`.  A
 * connection that fails is re-made with exponential backoff (100 ms to 5 s, jittered);
 * one that stops answering for a second is dropped and re-made.  The store's state
 * (up, or down since when and why) is reported once per transition through notify().
 *
 * Sentinel.  With sentinels, each (re)connection first asks them in turn for the
 * master's address, and checks with ROLE that the server it reached is a master; a
 * READONLY reply (the master was demoted) makes the connection start over.
 *
 * Class slots are leases: per class a hash with, per node, its slot count and the expiry
 * of its lease; a heartbeat renews this node's leases with its own counts, and a node
 * that stops renewing (killed) stops counting once its lease expires.
 *
 * Lanes (the relay's exact sliding windows, store_slide_start()) are one sorted set per
 * window, PREFIX "lane:" NAME ":" INDEX, decided over all windows at once by
 * redis/slide.lua.  They have no on_failure: a timeout, a lost connection or an error is
 * answered as such, and the lane does not send (store.h says why).
 *
 * Invariants: a request is freed exactly once, by its hiredis callback (which hiredis
 * also runs, with no reply, when the connection goes away); a call is answered exactly
 * once (reply, timeout, failure) unless cancelled first; all state of a connection is
 * touched only by its own thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>
#include <xxhash.h>

#include "redis_scripts.h"
#include "store.h"
#include "util.h"

#define MAX_CONNS 256          /* event loops: workers + main */
#define MAX_INFLIGHT 100000    /* requests queued on one connection */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define STALL_MIN_MS 1000      /* no reply for this long with requests out: drop it */
#define CONNECT_TIMEOUT_MS 2000

enum script_id {
	SC_GCRA = 0, SC_REFUND, SC_SLOT_ENTER, SC_SLOT_RELEASE, SC_SLOT_RENEW, SC_SLIDE,
	SC_COUNT,
	SC_ROLE = SC_COUNT, /* setup commands that are not scripts */
	SC_NONE,
};

static const struct {
	const char *text;
	size_t len;
} scripts[SC_COUNT] = {
	[SC_GCRA] = { script_gcra, sizeof(script_gcra) - 1 },
	[SC_REFUND] = { script_refund, sizeof(script_refund) - 1 },
	[SC_SLOT_ENTER] = { script_slot_enter, sizeof(script_slot_enter) - 1 },
	[SC_SLOT_RELEASE] = { script_slot_release, sizeof(script_slot_release) - 1 },
	[SC_SLOT_RENEW] = { script_slot_renew, sizeof(script_slot_renew) - 1 },
	[SC_SLIDE] = { script_slide, sizeof(script_slide) - 1 },
};

struct addr {
	char host[256];  /* IP literal, or the socket path */
	int port;        /* 0: unix socket */
};

enum req_kind { REQ_DECIDE = 0, REQ_SLOT, REQ_SLIDE, REQ_OTHER, REQ_SETUP };

struct redis_conn;

struct rreq {
	struct redis_conn *conn;
	struct rreq *prev, *next;  /* the connection's unanswered requests, oldest first */
	enum req_kind kind;
	enum script_id script;
	bool waiting;              /* in the list: not answered yet */
	bool retried;              /* sent again with EVAL after NOSCRIPT */
	uint64_t deadline_ms;      /* monotonic */
	struct store_call *call;
	struct store_slot_call *slot;
	struct store_slide_call *slide;
	/* REQ_OTHER/REQ_SETUP: what a failed reply means for the connection */
	const char *what;
};

struct rstore;

struct redis_conn {
	struct rstore *st;
	struct event_base *base;
	redisAsyncContext *ac;     /* NULL while down */
	redisAsyncContext *sac;    /* asking a sentinel */
	bool connected;
	bool healthy;              /* usable: the last attempt worked (optimistic at first) */
	bool counted_down;         /* counted in st->down */
	unsigned next_sentinel;
	struct addr master;        /* where ac goes */
	struct event *timer;       /* request deadlines, connect timeout, stall check */
	struct event *retry;       /* reconnect backoff */
	uint64_t backoff_ms;
	uint64_t last_reply_ms;
	uint64_t busy_since_ms;    /* when inflight last went from 0 to 1 */
	uint64_t connect_deadline_ms;
	struct rreq *head, *tail;  /* unanswered requests */
	size_t inflight;           /* allocated requests (answered or not) */
	char sha[SC_COUNT][41];    /* from SCRIPT LOAD; "" until known: EVAL */
	char err[128];
};

struct rstore {
	struct store *local;       /* on_failure = local */
	struct store_redis_conf conf;
	char *user, *password, *prefix, *master_name, *node_id;
	struct addr server_addr;
	struct addr *sentinels;
	size_t nsentinels;
	pthread_mutex_t lock;      /* adding connections, the state text */
	struct redis_conn *conns[MAX_CONNS];
	_Atomic size_t nconns;
	_Atomic unsigned down;     /* connections not healthy */
	_Atomic bool announced;    /* the first connection was logged */
	_Atomic uint64_t decisions, errors, fallbacks, timeouts, reconnects;
	_Atomic uint64_t slide_seq;  /* lane sends taken by this process: member ids */
	char member_base[32];      /* "NODE:RANDOM": see redis_slide_start() */
	char state[160];           /* under lock */
	uint64_t down_since;       /* realtime ns, under lock */
};

static const struct store_ops redis_ops;

/* ---- small helpers -------------------------------------------------------------------- */

static const char *failure_name(enum store_failure f)
{
	switch (f) {
	case STORE_FAIL_LOCAL:
		return "local";
	case STORE_FAIL_ACCEPT:
		return "accept";
	case STORE_FAIL_TEMPFAIL:
		return "tempfail";
	}
	return "?";
}

static void addr_format(const struct addr *a, char *buf, size_t len)
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
static int addr_parse(const char *text, struct addr *ret, char *err, size_t errlen)
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

/* ---- store state (across connections) ------------------------------------------------ */

static void set_state(struct rstore *st, bool up, const char *why)
{
	char msg[256], where[300];
	if (st->nsentinels)
		fmt_fixed(where, sizeof(where), "master '%s' (through %zu sentinels)",
			  st->master_name, st->nsentinels);
	else
		addr_format(&st->server_addr, where, sizeof(where));
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
		fmt_fixed(st->state, sizeof(st->state), "unreachable (%s): on_failure=%s",
			  why, failure_name(st->conf.on_failure));
		fmt_fixed(msg, sizeof(msg), "redis store: %s unreachable (%s); deciding with "
			  "on_failure=%s until it is back", where, why,
			  failure_name(st->conf.on_failure));
	}
	pthread_mutex_unlock(&st->lock);
	if (st->conf.notify)
		st->conf.notify(st->conf.notify_arg, !up, msg);
}

static void conn_mark(struct redis_conn *c, bool healthy, const char *why)
{
	struct rstore *st = c->st;
	c->healthy = healthy;
	if (!healthy && !c->counted_down) {
		c->counted_down = true;
		if (atomic_fetch_add(&st->down, 1) == 0)
			set_state(st, false, why);
	} else if (healthy && c->counted_down) {
		c->counted_down = false;
		if (atomic_fetch_sub(&st->down, 1) == 1)
			set_state(st, true, NULL);
	} else if (healthy && !atomic_exchange(&st->announced, true)) {
		set_state(st, true, NULL);
	}
}

/* ---- answers -------------------------------------------------------------------------- */

static uint64_t share(uint64_t v, unsigned nodes)
{
	uint64_t s = nodes > 1 ? v / nodes : v;
	return s ? s : 1;
}

/* on_failure for a decision. */
static int fallback_decide(struct rstore *st, struct store_call *call)
{
	atomic_fetch_add(&st->fallbacks, 1);
	struct store_item *items = call->items;
	size_t n = call->n;
	switch (st->conf.on_failure) {
	case STORE_FAIL_ACCEPT:
		for (size_t i = 0; i < n; i++) {
			items[i].ok = true;
			items[i].charged = false;
			items[i].retry_ns = 0;
			memset(items[i].used, 0, sizeof(items[i].used));
		}
		return call->mode == STORE_RESET ? 0 : 1;
	case STORE_FAIL_TEMPFAIL:
		for (size_t i = 0; i < n; i++) {
			items[i].ok = false;
			items[i].charged = false;
		}
		return call->mode == STORE_RESET ? 0 : STORE_TEMPFAIL;
	case STORE_FAIL_LOCAL:
		break;
	}
	if (call->mode == STORE_RESET) {
		int any = 0;
		for (size_t i = 0; i < n; i++)
			any |= st->local->ops->reset(st->local->ctx, items[i].key_hash,
						     items[i].limits) > 0;
		return any;
	}
	/* this node's share of every window, for the time Redis is away */
	struct rate_limits scaled[64];
	const struct rate_limits *orig[64];
	int rc = 1;
	for (size_t off = 0; off < n; off += 64) {
		size_t k = n - off < 64 ? n - off : 64;
		for (size_t i = 0; i < k; i++) {
			struct store_item *it = &items[off + i];
			orig[i] = it->limits;
			scaled[i] = *it->limits;
			for (unsigned j = 0; j < scaled[i].n; j++) {
				scaled[i].w[j].count = share(scaled[i].w[j].count, st->conf.nodes);
				scaled[i].w[j].burst = share(scaled[i].w[j].burst, st->conf.nodes);
			}
			it->limits = &scaled[i];
		}
		int r = st->local->ops->decide(st->local->ctx, items + off, k, call->mode,
					       realtime_ns());
		for (size_t i = 0; i < k; i++)
			items[off + i].limits = orig[i];
		if (r < 0)
			return r;
		if (r == 0)
			rc = 0;
	}
	return rc;
}

static int fallback_slot(struct rstore *st, const struct store_slot_call *c)
{
	atomic_fetch_add(&st->fallbacks, 1);
	switch (st->conf.on_failure) {
	case STORE_FAIL_ACCEPT:
		return 1;
	case STORE_FAIL_TEMPFAIL:
		return 0;
	case STORE_FAIL_LOCAL:
		break;
	}
	return c->local_used <= share(c->cap, st->conf.nodes) ? 1 : 0;
}

static void req_unlink(struct rreq *r)
{
	struct redis_conn *c = r->conn;
	if (!r->waiting)
		return;
	if (r->prev)
		r->prev->next = r->next;
	else
		c->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		c->tail = r->prev;
	r->prev = r->next = NULL;
	r->waiting = false;
}

/* Answer r's caller by on_failure (timeout, error, connection lost); a lane, which has no
 * on_failure, by err (-ETIMEDOUT, -EAGAIN, -EPROTO). */
static void req_fail(struct rreq *r, int err)
{
	if (!r->waiting)
		return;
	req_unlink(r);
	struct rstore *st = r->conn->st;
	if (r->kind == REQ_SLIDE && r->slide) {
		struct store_slide_call *sl = r->slide;
		r->slide = NULL;
		sl->req = NULL;
		sl->done(sl, err, 0);
	} else if (r->kind == REQ_DECIDE && r->call) {
		struct store_call *call = r->call;
		r->call = NULL;
		call->req = NULL;
		call->done(call, fallback_decide(st, call));
	} else if (r->kind == REQ_SLOT && r->slot) {
		struct store_slot_call *sc = r->slot;
		r->slot = NULL;
		sc->req = NULL;
		sc->done(sc, fallback_slot(st, sc));
	}
}

static struct rreq *req_new(struct redis_conn *c, enum req_kind kind, enum script_id sc)
{
	if (c->inflight >= MAX_INFLIGHT)
		return NULL;
	struct rreq *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->conn = c;
	r->kind = kind;
	r->script = sc;
	r->deadline_ms = now_ms() + c->st->conf.timeout_ms;
	if (c->inflight++ == 0)
		c->busy_since_ms = now_ms();
	return r;
}

static void timer_arm(struct redis_conn *c);

/* Into the unanswered list, kept in deadline order (a request sent again after NOSCRIPT
 * keeps its first deadline, so it may go before later ones). */
static void req_wait(struct rreq *r)
{
	struct redis_conn *c = r->conn;
	struct rreq *after = c->tail;
	while (after && after->deadline_ms > r->deadline_ms)
		after = after->prev;
	r->waiting = true;
	r->prev = after;
	r->next = after ? after->next : c->head;
	if (r->next)
		r->next->prev = r;
	else
		c->tail = r;
	if (after)
		after->next = r;
	else
		c->head = r;
	if (c->head == r)
		timer_arm(c);
}

static void req_free(struct rreq *r)
{
	req_unlink(r);
	r->conn->inflight--;
	free(r);
}

/* ---- decisions: building the script's arguments --------------------------------------- */

struct argv_buf {
	const char **argv;
	size_t *len;
	size_t n, cap;
	char *text;        /* all argument text, back to back */
	size_t used, size;
};

/* One allocation for the pointers, the lengths and the text: a decision makes one. */
static int argv_init(struct argv_buf *a, size_t cap, size_t text)
{
	size_t ptrs = cap * (sizeof(*a->argv) + sizeof(*a->len));
	void *block = malloc(ptrs + text);
	if (!block)
		return -ENOMEM;
	a->argv = block;
	a->len = (size_t *)(a->argv + cap);
	a->text = (char *)block + ptrs;
	a->n = a->used = 0;
	a->cap = cap;
	a->size = text;
	return 0;
}

static void argv_clear(struct argv_buf *a)
{
	free(a->argv);
}

/* Room for n more bytes of text and one more argument, or NULL. */
static char *argv_room(struct argv_buf *a, size_t n)
{
	if (a->n == a->cap || a->size - a->used < n + 1)
		return NULL;
	return a->text + a->used;
}

static int argv_commit(struct argv_buf *a, size_t n)
{
	a->argv[a->n] = a->text + a->used;
	a->len[a->n] = n;
	a->text[a->used + n] = '\0';
	a->n++;
	a->used += n + 1;
	return 0;
}

static int argv_add_cstr(struct argv_buf *a, const char *v)
{
	size_t n = strlen(v);
	char *p = argv_room(a, n);
	if (!p)
		return -ENOBUFS;
	memcpy(p, v, n);
	return argv_commit(a, n);
}

/* A decimal number (every script argument but a few is one): no printf on this path. */
static int argv_add_u64(struct argv_buf *a, uint64_t v)
{
	char tmp[20];
	size_t n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	char *p = argv_room(a, n);
	if (!p)
		return -ENOBUFS;
	for (size_t i = 0; i < n; i++)
		p[i] = tmp[n - 1 - i];
	return argv_commit(a, n);
}

static int argv_add(struct argv_buf *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int argv_add(struct argv_buf *a, const char *fmt, ...)
{
	if (a->n == a->cap)
		return -ENOBUFS;
	va_list ap;
	va_start(ap, fmt);
	int w = vsnprintf(a->text + a->used, a->size - a->used, fmt, ap);
	va_end(ap);
	if (w < 0 || (size_t)w >= a->size - a->used)
		return -ENOBUFS;
	a->argv[a->n] = a->text + a->used;
	a->len[a->n] = (size_t)w;
	a->n++;
	a->used += (size_t)w + 1;
	return 0;
}

static int argv_add_bytes(struct argv_buf *a, const char *p, size_t n)
{
	if (a->n == a->cap)
		return -ENOBUFS;
	a->argv[a->n] = p;
	a->len[a->n] = n;
	a->n++;
	return 0;
}

/* The Redis key of one window of an item: PREFIX RULE ":" WINDOW ":" HASH16. */
static int add_key(struct argv_buf *a, const struct rstore *st, struct str rule,
		   const struct rate_window *w, uint64_t key_hash)
{
	static const char hex[] = "0123456789abcdef";
	char wt[64];
	rate_window_format(w, wt, sizeof(wt));
	size_t lp = strlen(st->prefix), lw = strlen(wt);
	char *p = argv_room(a, lp + rule.len + 1 + lw + 1 + 16);
	if (!p)
		return -ENOBUFS;
	char *q = p;
	memcpy(q, st->prefix, lp);
	q += lp;
	if (rule.len)
		memcpy(q, rule.ptr, rule.len);
	q += rule.len;
	*q++ = ':';
	memcpy(q, wt, lw);
	q += lw;
	*q++ = ':';
	for (int i = 15; i >= 0; i--)
		*q++ = hex[(key_hash >> (i * 4)) & 15];
	return argv_commit(a, (size_t)(q - p));
}

static uint64_t count_windows(const struct store_item *items, size_t n)
{
	uint64_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += items[i].limits->n;
	return k;
}

/* EVALSHA sha nkeys keys... args..., or EVAL with the text while the sha is unknown. */
static int script_head(struct argv_buf *a, const struct redis_conn *c, enum script_id sc, bool eval,
		       uint64_t nkeys)
{
	if (!eval && c->sha[sc][0]) {
		argv_add_cstr(a, "EVALSHA");
		argv_add_cstr(a, c->sha[sc]);
	} else {
		argv_add_cstr(a, "EVAL");
		argv_add_bytes(a, scripts[sc].text, scripts[sc].len);
	}
	return argv_add_u64(a, nkeys);
}

static int build_decide(struct argv_buf *a, const struct redis_conn *c, const struct store_call *call,
			bool eval)
{
	const struct rstore *st = c->st;
	uint64_t nk = count_windows(call->items, call->n);
	size_t text = 0;
	for (size_t i = 0; i < call->n; i++)
		text += call->items[i].rule.len + 160 + strlen(st->prefix);
	text = text * RATE_MAX_WINDOWS + 256;
	if (argv_init(a, 8 + (size_t)nk * 3 + call->n * 3, text) < 0)
		return -ENOMEM;
	enum script_id sc = call->mode == STORE_RESET ? SC_COUNT : SC_GCRA;
	if (sc == SC_COUNT) {
		argv_add_cstr(a, "DEL");
	} else {
		script_head(a, c, sc, eval, nk);
	}
	for (size_t i = 0; i < call->n; i++) {
		const struct store_item *it = &call->items[i];
		for (unsigned j = 0; j < it->limits->n; j++)
			if (add_key(a, st, it->rule, &it->limits->w[j], it->key_hash) < 0)
				goto overflow;
	}
	if (sc == SC_COUNT)
		return 0;
	argv_add_cstr(a, call->mode == STORE_PEEK ? "peek" : "check");
	argv_add_cstr(a, "");
	argv_add_u64(a, call->n);
	for (size_t i = 0; i < call->n; i++) {
		const struct store_item *it = &call->items[i];
		argv_add_u64(a, it->cost);
		argv_add_u64(a, it->flags & (STORE_BLOCKING | STORE_COUNT_REJECTED));
		argv_add_u64(a, it->limits->n);
		for (unsigned j = 0; j < it->limits->n; j++) {
			argv_add_u64(a, gcra_interval(&it->limits->w[j]));
			if (argv_add_u64(a, it->limits->w[j].burst) < 0)
				goto overflow;
		}
	}
	return 0;
overflow:
	argv_clear(a);
	return -ENOBUFS;
}

static uint64_t reply_u64(const redisReply *r)
{
	if (r->type == REDIS_REPLY_INTEGER)
		return r->integer < 0 ? 0 : (uint64_t)r->integer;
	if (r->type == REDIS_REPLY_STRING) {
		errno = 0;
		unsigned long long v = strtoull(r->str, NULL, 10);
		return errno == ERANGE ? UINT64_MAX : v;
	}
	return 0;
}

int store_redis_parse_decide(const void *reply, struct store_item *items, size_t n,
			     enum store_mode mode)
{
	const redisReply *r = reply;
	if (mode == STORE_RESET)
		return r->type == REDIS_REPLY_INTEGER ? r->integer > 0 : -EPROTO;
	if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
		return -EPROTO;
	size_t k = 1;
	for (size_t i = 0; i < n; i++) {
		struct store_item *it = &items[i];
		unsigned nw = it->limits->n <= RATE_MAX_WINDOWS ? it->limits->n : RATE_MAX_WINDOWS;
		if (k > r->elements || r->elements - k < 3 + (size_t)nw)
			return -EPROTO;
		it->ok = reply_u64(r->element[k]) != 0;
		it->charged = reply_u64(r->element[k + 1]) != 0;
		it->retry_ns = reply_u64(r->element[k + 2]);
		k += 3;
		for (unsigned j = 0; j < nw; j++)
			it->used[j] = reply_u64(r->element[k++]);
		/* a reply that contradicts itself is not believed */
		if (it->charged && !it->ok)
			return -EPROTO;
	}
	return reply_u64(r->element[0]) != 0;
}

static int parse_decide(const redisReply *r, struct store_call *call)
{
	return store_redis_parse_decide(r, call->items, call->n, call->mode);
}

/* ---- lanes: building the script's arguments, reading its reply ------------------------ */

/* EVALSHA slide nwin  PREFIX"lane:"NAME":"0 ...  take|peek now member  N_1 W_1 ... */
static int build_slide(struct argv_buf *a, const struct redis_conn *c,
		       const struct store_slide_call *sl, bool eval)
{
	const struct rstore *st = c->st;
	size_t key = strlen(st->prefix) + strlen(sl->name) + 16;
	if (argv_init(a, 8 + 3 * (size_t)sl->nwin, (key + 48) * sl->nwin + 256) < 0)
		return -ENOMEM;
	int bad = script_head(a, c, SC_SLIDE, eval, sl->nwin);
	for (unsigned i = 0; i < sl->nwin; i++)
		bad |= argv_add(a, "%slane:%s:%u", st->prefix, sl->name, i);
	bad |= argv_add_cstr(a, sl->take ? "take" : "peek");
	if (sl->now)
		bad |= argv_add_u64(a, sl->now);
	else
		bad |= argv_add_cstr(a, "");
	bad |= argv_add_cstr(a, sl->take ? sl->member : "");
	for (unsigned i = 0; i < sl->nwin; i++) {
		bad |= argv_add_u64(a, sl->n[i]);
		bad |= argv_add_u64(a, sl->window_ns[i]);
	}
	if (bad) {
		argv_clear(a);
		return -ENOBUFS;
	}
	return 0;
}

/*
 * slide.lua's reply { ok, wait_ns, count per window }: 1 or 0 with *ret_wait (0 when
 * admitted) and sl->count set, or -EPROTO (nothing set) for a reply of the wrong shape or
 * one that contradicts itself (admitted with a wait, refused with none).
 */
static int parse_slide(const redisReply *r, struct store_slide_call *sl, uint64_t *ret_wait)
{
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 + (size_t)sl->nwin)
		return -EPROTO;
	const redisReply *ok = r->element[0], *w = r->element[1];
	if (ok->type != REDIS_REPLY_INTEGER || (ok->integer != 0 && ok->integer != 1) ||
	    w->type != REDIS_REPLY_STRING || w->len == 0 || w->len > 20)
		return -EPROTO;
	uint64_t wait = 0;
	for (size_t i = 0; i < w->len; i++) {
		unsigned d = (unsigned char)w->str[i] - '0';
		if (d > 9 || __builtin_mul_overflow(wait, 10, &wait) ||
		    __builtin_add_overflow(wait, d, &wait))
			return -EPROTO;
	}
	if ((ok->integer == 1) != (wait == 0))
		return -EPROTO;
	uint64_t count[RATE_MAX_WINDOWS];
	for (unsigned i = 0; i < sl->nwin; i++) {
		const redisReply *e = r->element[2 + i];
		if (e->type != REDIS_REPLY_INTEGER || e->integer < 0)
			return -EPROTO;
		count[i] = (uint64_t)e->integer;
	}
	memcpy(sl->count, count, sl->nwin * sizeof(count[0]));
	*ret_wait = wait;
	return (int)ok->integer;
}

/* ---- the connection ------------------------------------------------------------------- */

static void conn_start(struct redis_conn *c);
static void conn_down(struct redis_conn *c, const char *why);
static int send_req(struct redis_conn *c, struct rreq *r, struct argv_buf *a);

/* An error reply that says the server is not the writable master any more. */
static bool reply_means_reconnect(const redisReply *r)
{
	return r->type == REDIS_REPLY_ERROR &&
	       (strncmp(r->str, "READONLY", 8) == 0 || strncmp(r->str, "LOADING", 7) == 0 ||
		strncmp(r->str, "MASTERDOWN", 10) == 0 || strncmp(r->str, "NOAUTH", 6) == 0 ||
		strncmp(r->str, "WRONGPASS", 9) == 0);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct rreq *r = privdata;
	struct redis_conn *c = r->conn;
	struct rstore *st = c->st;
	redisReply *rep = reply;
	(void)ac;
	if (rep)
		c->last_reply_ms = now_ms();
	if (!rep) {
		/* the connection went away: answered by on_failure (a lane: -EAGAIN) */
		req_fail(r, -EAGAIN);
		req_free(r);
		return;
	}
	if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0 &&
	    !r->retried && r->waiting &&
	    ((r->kind == REQ_DECIDE && r->call) || (r->kind == REQ_SLIDE && r->slide))) {
		/* the script cache was flushed: send it again with its text (which caches it) */
		struct rreq *again = req_new(c, r->kind, r->script);
		struct argv_buf a;
		int built = !again ? -ENOMEM : r->kind == REQ_DECIDE
						? build_decide(&a, c, r->call, true)
						: build_slide(&a, c, r->slide, true);
		if (built == 0) {
			struct store_call *call = r->call;
			struct store_slide_call *sl = r->slide;
			again->retried = true;
			again->call = call;
			again->slide = sl;
			if (call)
				call->req = again;
			if (sl)
				sl->req = again;
			again->deadline_ms = r->deadline_ms;
			r->call = NULL;
			r->slide = NULL;
			req_free(r);
			if (send_req(c, again, &a) < 0) {
				if (call) {
					call->req = NULL;
					call->done(call, fallback_decide(st, call));
				} else {
					sl->req = NULL;
					sl->done(sl, -EAGAIN, 0);
				}
			}
			return;
		}
		if (again)
			req_free(again);
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		atomic_fetch_add(&st->errors, 1);
		char why[160];
		fmt_fixed(why, sizeof(why), "%s: %.100s", r->what ? r->what : "script", rep->str);
		if ((reply_means_reconnect(rep) || r->kind == REQ_SETUP) && c->ac) {
			if (!c->err[0]) /* the first reason of this attempt: later ones follow */
				fmt_fixed(c->err, sizeof(c->err), "%s", why);
			redisAsyncDisconnect(c->ac); /* its callbacks run later, not in this one */
		}
		req_fail(r, reply_means_reconnect(rep) ? -EAGAIN : -EPROTO);
		req_free(r);
		return;
	}
	switch (r->kind) {
	case REQ_DECIDE:
		if (r->waiting && r->call) {
			req_unlink(r);
			struct store_call *call = r->call;
			r->call = NULL;
			call->req = NULL;
			int rc = parse_decide(rep, call);
			if (rc < 0) {
				atomic_fetch_add(&st->errors, 1);
				rc = fallback_decide(st, call);
			}
			call->done(call, rc);
		}
		break;
	case REQ_SLOT:
		if (r->waiting && r->slot) {
			req_unlink(r);
			struct store_slot_call *sc = r->slot;
			r->slot = NULL;
			sc->req = NULL;
			int rc;
			if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1)
				rc = reply_u64(rep->element[0]) ? 1 : 0;
			else {
				atomic_fetch_add(&st->errors, 1);
				rc = fallback_slot(st, sc);
			}
			sc->done(sc, rc);
		}
		break;
	case REQ_SLIDE:
		if (r->waiting && r->slide) {
			req_unlink(r);
			struct store_slide_call *sl = r->slide;
			r->slide = NULL;
			sl->req = NULL;
			uint64_t wait = 0;
			int rc = parse_slide(rep, sl, &wait);
			if (rc < 0)
				atomic_fetch_add(&st->errors, 1);
			sl->done(sl, rc, rc == 0 ? wait : 0);
		}
		break;
	case REQ_SETUP:
		/* SCRIPT LOAD: remember the sha; ROLE: must be a master */
		if (r->script < SC_COUNT && rep->type == REDIS_REPLY_STRING && rep->len == 40) {
			memcpy(c->sha[r->script], rep->str, 40);
			c->sha[r->script][40] = '\0';
			if (r->script == SC_COUNT - 1 && c->ac &&
			    !(c->ac->c.flags & REDIS_DISCONNECTING)) {
				/* the last setup reply: the connection works */
				c->backoff_ms = 0;
				c->err[0] = '\0';
				conn_mark(c, true, NULL);
			}
		} else if (r->script == SC_ROLE && rep->type == REDIS_REPLY_ARRAY &&
			   rep->elements >= 1 && rep->element[0]->type == REDIS_REPLY_STRING &&
			   strcmp(rep->element[0]->str, "master") != 0 && c->ac) {
			fmt_fixed(c->err, sizeof(c->err), "the server is a %.20s, not the master",
				  rep->element[0]->str);
			redisAsyncDisconnect(c->ac);
		}
		break;
	case REQ_OTHER:
		break;
	}
	req_free(r);
}

static int send_req(struct redis_conn *c, struct rreq *r, struct argv_buf *a)
{
	int rc = redisAsyncCommandArgv(c->ac, on_reply, r, (int)a->n, a->argv, a->len);
	argv_clear(a);
	if (rc != REDIS_OK) {
		req_free(r);
		return -EIO;
	}
	if (r->kind == REQ_DECIDE || r->kind == REQ_SLOT || r->kind == REQ_SLIDE)
		req_wait(r);
	return 0;
}

/* One command with fixed arguments (setup, releases, renewals). */
static void send_simple(struct redis_conn *c, enum req_kind kind, enum script_id sc, const char *what,
			int argc, const char **argv, const size_t *len)
{
	struct rreq *r = req_new(c, kind, sc);
	if (!r)
		return;
	r->what = what;
	if (redisAsyncCommandArgv(c->ac, on_reply, r, argc, argv, len) != REDIS_OK)
		req_free(r);
}

/* Since when requests have been waiting with no reply at all. */
static uint64_t quiet_since(const struct redis_conn *c)
{
	return c->last_reply_ms > c->busy_since_ms ? c->last_reply_ms : c->busy_since_ms;
}

static void timer_arm(struct redis_conn *c)
{
	uint64_t now = now_ms(), at = UINT64_MAX;
	if (c->head)
		at = c->head->deadline_ms;
	if (c->ac && !c->connected && c->connect_deadline_ms < at)
		at = c->connect_deadline_ms;
	if (c->ac && c->connected && c->inflight > 0) {
		uint64_t stall = quiet_since(c) + (c->st->conf.timeout_ms * 20 > STALL_MIN_MS ?
						   c->st->conf.timeout_ms * 20 : STALL_MIN_MS);
		if (stall < at)
			at = stall;
	}
	if (at == UINT64_MAX) {
		evtimer_del(c->timer);
		return;
	}
	struct timeval tv = timeval_from_ms(at > now ? at - now : 0);
	evtimer_add(c->timer, &tv);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct redis_conn *c = arg;
	struct rstore *st = c->st;
	uint64_t now = now_ms();
	(void)fd;
	(void)what;
	while (c->head && c->head->deadline_ms <= now) {
		atomic_fetch_add(&st->timeouts, 1);
		req_fail(c->head, -ETIMEDOUT);
	}
	if (c->ac && !c->connected && c->connect_deadline_ms <= now) {
		conn_down(c, "connection timed out");
		return;
	}
	uint64_t stall_ms = st->conf.timeout_ms * 20 > STALL_MIN_MS ? st->conf.timeout_ms * 20
								     : STALL_MIN_MS;
	if (c->ac && c->connected && c->inflight > 0 && now - quiet_since(c) >= stall_ms) {
		char why[96];
		fmt_fixed(why, sizeof(why), "no reply for %llums", (unsigned long long)stall_ms);
		conn_down(c, why);
		return;
	}
	timer_arm(c);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	conn_start(arg);
}

/* The connection is gone (c->err says why): answer what waits by on_failure, mark the
 * loop down, and try again after the next backoff step. */
static void retry_later(struct redis_conn *c)
{
	while (c->head)
		req_fail(c->head, -EAGAIN);
	conn_mark(c, false, c->err);
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
		c->connected = false;
		ac->data = NULL; /* its disconnect callback must not schedule a second retry */
		redisAsyncFree(ac); /* runs every pending callback with no reply */
	}
	retry_later(c);
	timer_arm(c);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
	struct redis_conn *c = ac->data;
	(void)status;
	if (!c || c->ac != ac)
		return; /* we dropped it ourselves */
	c->ac = NULL;
	c->connected = false;
	if (ac->errstr[0])
		fmt_fixed(c->err, sizeof(c->err), "%s", ac->errstr);
	else if (!c->err[0])
		fmt_fixed(c->err, sizeof(c->err), "connection closed by the server");
	retry_later(c);
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
		return;
	}
	/* usable once the setup commands have answered (a server that accepts connections
	 * but refuses the password, or does not answer, is not back) */
	c->connected = true;
	c->last_reply_ms = now_ms();
	timer_arm(c);
}

/* Commands every new connection sends first (pipelined before any decision). */
static void conn_setup(struct redis_conn *c)
{
	struct rstore *st = c->st;
	if (st->password) {
		const char *argv[3] = { "AUTH", st->user ? st->user : st->password, st->password };
		size_t len[3] = { 4, strlen(argv[1]), strlen(st->password) };
		send_simple(c, REQ_SETUP, SC_NONE, "AUTH", st->user ? 3 : 2, argv, len);
	}
	if (st->conf.db) {
		char db[16];
		fmt_fixed(db, sizeof(db), "%u", st->conf.db);
		const char *argv[2] = { "SELECT", db };
		size_t len[2] = { 6, strlen(db) };
		send_simple(c, REQ_SETUP, SC_NONE, "SELECT", 2, argv, len);
	}
	if (st->nsentinels) {
		const char *argv[1] = { "ROLE" };
		size_t len[1] = { 4 };
		send_simple(c, REQ_SETUP, SC_ROLE, "ROLE", 1, argv, len);
	}
	for (int i = 0; i < SC_COUNT; i++) {
		const char *argv[3] = { "SCRIPT", "LOAD", scripts[i].text };
		size_t len[3] = { 6, 4, scripts[i].len };
		send_simple(c, REQ_SETUP, (enum script_id)i, "SCRIPT LOAD", 3, argv, len);
	}
}

static void connect_master(struct redis_conn *c)
{
	redisAsyncContext *ac = c->master.port ? redisAsyncConnect(c->master.host, c->master.port)
					       : redisAsyncConnectUnix(c->master.host);
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
	if (redisLibeventAttach(ac, c->base) != REDIS_OK) {
		redisAsyncFree(ac);
		conn_down(c, "cannot attach to the event loop");
		return;
	}
	c->ac = ac;
	c->connected = false;
	c->err[0] = '\0';
	memset(c->sha, 0, sizeof(c->sha));
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	c->connect_deadline_ms = now_ms() + CONNECT_TIMEOUT_MS;
	conn_setup(c);
	timer_arm(c);
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
		    fmt_fixed(c->master.host, sizeof(c->master.host), "%s", r->element[0]->str) == 0) {
			c->master.port = (int)port;
			connect_master(c);
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

/* Ask the next sentinel where the master is. */
static void sentinel_next(struct redis_conn *c)
{
	const struct addr *s = &c->st->sentinels[c->next_sentinel % c->st->nsentinels];
	redisAsyncContext *ac = s->port ? redisAsyncConnect(s->host, s->port)
				       : redisAsyncConnectUnix(s->host);
	if (!ac || ac->err || redisLibeventAttach(ac, c->base) != REDIS_OK) {
		if (ac)
			redisAsyncFree(ac);
		conn_down(c, "cannot reach a sentinel");
		return;
	}
	ac->data = c;
	c->sac = ac;
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_sentinel_disconnect);
	const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", c->st->master_name };
	size_t len[3] = { 8, 23, strlen(c->st->master_name) };
	if (redisAsyncCommandArgv(ac, on_sentinel_reply, c, 3, argv, len) != REDIS_OK)
		conn_down(c, "cannot ask a sentinel");
}

static void conn_start(struct redis_conn *c)
{
	if (c->ac || c->sac)
		return;
	if (c->healthy == false)
		atomic_fetch_add(&c->st->reconnects, 1);
	if (c->st->nsentinels) {
		sentinel_next(c);
		return;
	}
	c->master = c->st->server_addr;
	connect_master(c);
}

/* This thread's connection, made on first use.  NULL when the thread has no loop. */
static struct redis_conn *conn_get(struct rstore *st)
{
	struct event_base *base = thread_base();
	if (!base)
		return NULL;
	size_t n = atomic_load(&st->nconns);
	for (size_t i = 0; i < n; i++)
		if (st->conns[i]->base == base)
			return st->conns[i];
	struct redis_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->st = st;
	c->base = base;
	c->healthy = true;
	c->timer = evtimer_new(base, on_timer, c);
	c->retry = evtimer_new(base, on_retry, c);
	pthread_mutex_lock(&st->lock);
	n = atomic_load(&st->nconns);
	bool room = n < MAX_CONNS && c->timer && c->retry;
	if (room) {
		st->conns[n] = c;
		atomic_store(&st->nconns, n + 1);
	}
	pthread_mutex_unlock(&st->lock);
	if (!room) {
		if (c->timer)
			event_free(c->timer);
		if (c->retry)
			event_free(c->retry);
		free(c);
		return NULL;
	}
	conn_start(c);
	return c;
}

/* A connection that can take a request now, or NULL (the caller uses on_failure; a lane
 * gets -EAGAIN).
 * XXX with sentinels, a loop's first decisions are answered by on_failure while its
 * connection asks the sentinels (without them they queue until the connection is up). */
static struct redis_conn *conn_usable(struct rstore *st)
{
	struct redis_conn *c = conn_get(st);
	if (!c || !c->healthy || !c->ac || c->inflight >= MAX_INFLIGHT)
		return NULL;
	return c;
}

/* ---- operations ----------------------------------------------------------------------- */

static int redis_decide_start(void *ctx, struct store_call *call)
{
	struct rstore *st = ctx;
	atomic_fetch_add(&st->decisions, 1);
	if (call->n == 0)
		return 1;
	struct redis_conn *c = conn_usable(st);
	struct rreq *r = c ? req_new(c, REQ_DECIDE, SC_GCRA) : NULL;
	struct argv_buf a;
	if (!r || build_decide(&a, c, call, false) < 0) {
		if (r)
			req_free(r);
		return fallback_decide(st, call);
	}
	r->call = call;
	call->req = r;
	if (send_req(c, r, &a) < 0) {
		call->req = NULL;
		return fallback_decide(st, call);
	}
	return STORE_PENDING;
}

/* The caller gave up on r: nobody is answered; r itself waits for its reply to be freed. */
static void req_withdraw(struct rreq *r)
{
	if (!r)
		return;
	r->call = NULL;
	r->slot = NULL;
	r->slide = NULL;
	req_unlink(r);
}

static void redis_cancel(void *ctx, struct store_call *call)
{
	(void)ctx;
	req_withdraw(call->req);
	call->req = NULL;
}

/* The synchronous decide(): only what on_failure would say (no thread waits on Redis). */
static int redis_decide(void *ctx, struct store_item *items, size_t n, enum store_mode mode,
			uint64_t now)
{
	struct rstore *st = ctx;
	struct store_call call = { .items = items, .n = n, .mode = mode, .now = now };
	return fallback_decide(st, &call);
}

static void redis_refund(void *ctx, const struct store_item *items, size_t n, uint64_t now)
{
	struct rstore *st = ctx;
	(void)now;
	/* the local share too: what it charged while Redis was away comes back the same way */
	if (st->local)
		st->local->ops->refund(st->local->ctx, items, n, now);
	struct redis_conn *c = conn_usable(st);
	if (!c || n == 0)
		return;
	uint64_t nk = 0;
	size_t text = 256;
	for (size_t i = 0; i < n; i++)
		if (items[i].charged && items[i].cost) {
			nk += items[i].limits->n;
			text += (items[i].rule.len + 160 + strlen(st->prefix)) * RATE_MAX_WINDOWS;
		}
	if (nk == 0)
		return;
	struct argv_buf a;
	if (argv_init(&a, 8 + (size_t)nk * 2 + n * 2, text) < 0)
		return;
	script_head(&a, c, SC_REFUND, false, nk);
	for (size_t i = 0; i < n; i++)
		if (items[i].charged && items[i].cost)
			for (unsigned j = 0; j < items[i].limits->n; j++)
				add_key(&a, st, items[i].rule, &items[i].limits->w[j], items[i].key_hash);
	argv_add_cstr(&a, "");
	size_t count = 0;
	for (size_t i = 0; i < n; i++)
		count += items[i].charged && items[i].cost;
	argv_add_u64(&a, count);
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		if (!items[i].charged || !items[i].cost)
			continue;
		argv_add_u64(&a, items[i].cost);
		argv_add_u64(&a, items[i].limits->n);
		for (unsigned j = 0; j < items[i].limits->n; j++)
			bad |= argv_add_u64(&a, gcra_interval(&items[i].limits->w[j]));
	}
	struct rreq *r = bad ? NULL : req_new(c, REQ_OTHER, SC_REFUND);
	if (!r) {
		argv_clear(&a);
		return;
	}
	r->what = "refund";
	send_req(c, r, &a);
}

static int redis_reset(void *ctx, uint64_t key_hash, const struct rate_limits *limits)
{
	/* only through store_decide_start() with STORE_RESET (it needs the rule name) */
	struct rstore *st = ctx;
	return st->local->ops->reset(st->local->ctx, key_hash, limits);
}

static size_t redis_top(void *ctx, struct store_top_entry *ret, size_t max, uint64_t now)
{
	(void)ctx;
	(void)ret;
	(void)max;
	(void)now;
	return 0; /* keys live in Redis; doc/CLUSTERS.md shows how to scan them */
}

static size_t redis_expire(void *ctx, uint64_t now)
{
	struct rstore *st = ctx;
	return st->local->ops->expire(st->local->ctx, now);
}

static void redis_stats(void *ctx, struct store_stats *ret)
{
	struct rstore *st = ctx;
	struct store_stats local;
	st->local->ops->stats(st->local->ctx, &local);
	memset(ret, 0, sizeof(*ret));
	ret->shared = true;
	ret->up = atomic_load(&st->announced) && atomic_load(&st->down) == 0;
	pthread_mutex_lock(&st->lock);
	if (st->state[0])
		fmt_fixed(ret->state, sizeof(ret->state), "%s", st->state);
	else
		fmt_fixed(ret->state, sizeof(ret->state), "not connected yet");
	pthread_mutex_unlock(&st->lock);
	ret->fallbacks = atomic_load(&st->fallbacks);
	ret->timeouts = atomic_load(&st->timeouts);
	ret->reconnects = atomic_load(&st->reconnects);
	ret->decisions = atomic_load(&st->decisions);
	ret->errors = atomic_load(&st->errors);
	/* what this process holds: the fallback's keys */
	ret->keys = local.keys;
	ret->max_keys = local.max_keys;
	ret->bytes = local.bytes;
	ret->evicted = local.evicted;
	ret->expired = local.expired;
}

static int redis_save(void *ctx, char *err, size_t errlen)
{
	(void)ctx;
	(void)err;
	(void)errlen;
	return 0; /* Redis keeps the state */
}

/* ---- lanes ---------------------------------------------------------------------------- */

/*
 * One script for every window of the lane (store.h, struct store_slide_call).  No
 * on_failure here: while Redis cannot answer, the lane does not send.
 *
 * A take's member id is MEMBER_BASE ":" SEQ, with MEMBER_BASE = NODE ":" RANDOM made once
 * per store: the node id alone is not enough, since a configured one survives a restart
 * and a counter that starts again at 1 would repeat an id still in a set -- a repeated
 * id moves its send instead of adding one, and the lane would count one send too few.
 * 48 random bits keep a restarted node apart from its earlier self.
 */
static int redis_slide_start(void *ctx, struct store_slide_call *sl)
{
	struct rstore *st = ctx;
	atomic_fetch_add(&st->decisions, 1);
	sl->member[0] = '\0';
	if (sl->take &&
	    fmt_fixed(sl->member, sizeof(sl->member), "%s:%" PRIx64, st->member_base,
		      atomic_fetch_add(&st->slide_seq, 1) + 1) < 0)
		return -EINVAL; /* cannot happen: the base is short */
	struct redis_conn *c = conn_usable(st);
	if (!c)
		return -EAGAIN;
	struct rreq *r = req_new(c, REQ_SLIDE, SC_SLIDE);
	if (!r)
		return c->inflight >= MAX_INFLIGHT ? -EAGAIN : -ENOMEM;
	struct argv_buf a;
	int rc = build_slide(&a, c, sl, false);
	if (rc < 0) {
		req_free(r);
		return rc == -ENOBUFS ? -EINVAL : rc;
	}
	r->slide = sl;
	r->what = "lane";
	sl->req = r;
	if (send_req(c, r, &a) < 0) {
		sl->req = NULL;
		return -EAGAIN;
	}
	return STORE_PENDING;
}

static void redis_slide_cancel(void *ctx, struct store_slide_call *sl)
{
	(void)ctx;
	req_withdraw(sl->req);
	sl->req = NULL;
}

/* ---- class slots ---------------------------------------------------------------------- */

static int redis_slot_enter(void *ctx, struct store_slot_call *sc)
{
	struct rstore *st = ctx;
	struct redis_conn *c = conn_usable(st);
	struct rreq *r = c ? req_new(c, REQ_SLOT, SC_SLOT_ENTER) : NULL;
	struct argv_buf a;
	if (!r || argv_init(&a, 16, 1024 + strlen(st->prefix) + strlen(sc->cls)) < 0) {
		if (r)
			req_free(r);
		return fallback_slot(st, sc);
	}
	script_head(&a, c, SC_SLOT_ENTER, false, 1);
	argv_add(&a, "%sclass:%s", st->prefix, sc->cls);
	argv_add_cstr(&a, st->node_id);
	argv_add_u64(&a, sc->cap);
	argv_add_u64(&a, st->conf.lease_ms);
	argv_add_cstr(&a, "");
	r->slot = sc;
	r->what = "slot";
	sc->req = r;
	if (send_req(c, r, &a) < 0) {
		sc->req = NULL;
		return fallback_slot(st, sc);
	}
	return STORE_PENDING;
}

static void redis_slot_cancel(void *ctx, struct store_slot_call *sc)
{
	(void)ctx;
	req_withdraw(sc->req);
	sc->req = NULL;
}

static void redis_slot_release(void *ctx, const char *cls)
{
	struct rstore *st = ctx;
	struct redis_conn *c = conn_usable(st);
	struct argv_buf a;
	if (!c || argv_init(&a, 8, 1024 + strlen(st->prefix) + strlen(cls)) < 0)
		return; /* the next renewal sets this node's count right */
	script_head(&a, c, SC_SLOT_RELEASE, false, 1);
	argv_add(&a, "%sclass:%s", st->prefix, cls);
	argv_add_cstr(&a, st->node_id);
	struct rreq *r = req_new(c, REQ_OTHER, SC_SLOT_RELEASE);
	if (!r) {
		argv_clear(&a);
		return;
	}
	r->what = "slot release";
	send_req(c, r, &a);
}

static void redis_slots_renew(void *ctx, const char *const *cls, const unsigned *counts, size_t n)
{
	struct rstore *st = ctx;
	struct redis_conn *c = conn_usable(st);
	if (!c || n == 0)
		return;
	size_t text = 256 + strlen(st->node_id);
	for (size_t i = 0; i < n; i++)
		text += strlen(st->prefix) + strlen(cls[i]) + 32;
	struct argv_buf a;
	if (argv_init(&a, 8 + 2 * n, text) < 0)
		return;
	script_head(&a, c, SC_SLOT_RENEW, false, n);
	for (size_t i = 0; i < n; i++)
		argv_add(&a, "%sclass:%s", st->prefix, cls[i]);
	argv_add_cstr(&a, st->node_id);
	argv_add_u64(&a, st->conf.lease_ms);
	argv_add_cstr(&a, "");
	for (size_t i = 0; i < n; i++)
		argv_add_u64(&a, counts[i]);
	struct rreq *r = req_new(c, REQ_OTHER, SC_SLOT_RENEW);
	if (!r) {
		argv_clear(&a);
		return;
	}
	r->what = "lease renewal";
	send_req(c, r, &a);
}

/* ---- life ----------------------------------------------------------------------------- */

/*
 * After every loop has stopped (the engine's workers joined, the main loop left): the
 * connections are freed here, on whichever thread, which is safe because no loop runs
 * them any more; their pending calls belong to sessions that are gone.
 */
static void redis_destroy(void *ctx)
{
	struct rstore *st = ctx;
	size_t n = atomic_load(&st->nconns);
	for (size_t i = 0; i < n; i++) {
		struct redis_conn *c = st->conns[i];
		while (c->head)
			req_withdraw(c->head);
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
	store_free(st->local);
	free(st->user);
	free(st->password);
	free(st->prefix);
	free(st->master_name);
	free(st->node_id);
	free(st->sentinels);
	pthread_mutex_destroy(&st->lock);
	free(st);
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

struct store *store_redis_new(const struct store_redis_conf *conf, char *err, size_t errlen)
{
	struct rstore *st = calloc(1, sizeof(*st));
	struct store *s = calloc(1, sizeof(*s));
	if (!st || !s)
		goto nomem;
	pthread_mutex_init(&st->lock, NULL);
	st->conf = *conf;
	st->prefix = strdup(conf->prefix ? conf->prefix : "sluice:");
	st->user = dup_or_null(conf->user);
	st->password = dup_or_null(conf->password);
	st->master_name = dup_or_null(conf->master_name);
	if (conf->node_id) {
		st->node_id = strdup(conf->node_id);
	} else {
		char host[128] = "node";
		uint32_t r = 0;
		gethostname(host, sizeof(host) - 1);
		host[sizeof(host) - 1] = '\0';
		if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
			r = (uint32_t)now_ns();
		char id[200];
		fmt_fixed(id, sizeof(id), "%s:%ld:%08x", host, (long)getpid(), r);
		st->node_id = strdup(id);
	}
	if (!st->prefix || !st->node_id || (conf->user && !st->user) ||
	    (conf->password && !st->password))
		goto nomem;
	st->conf.prefix = st->prefix;
	st->conf.node_id = st->node_id;
	uint64_t rnd = 0;
	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
		rnd = now_ns() ^ realtime_ns() ^ ((uint64_t)getpid() << 32);
	fmt_fixed(st->member_base, sizeof(st->member_base), "%.16s:%012" PRIx64, st->node_id,
		  (uint64_t)(rnd & 0xffffffffffffu));
	if (st->conf.timeout_ms == 0)
		st->conf.timeout_ms = 50;
	if (st->conf.lease_ms == 0)
		st->conf.lease_ms = 15000;
	if (st->conf.nodes == 0)
		st->conf.nodes = 1;
	if (conf->nsentinels) {
		if (!conf->master_name) {
			fmt_fixed(err, errlen, "sentinels need master_name");
			goto fail;
		}
		st->sentinels = calloc(conf->nsentinels, sizeof(*st->sentinels));
		if (!st->sentinels)
			goto nomem;
		for (size_t i = 0; i < conf->nsentinels; i++)
			if (addr_parse(conf->sentinels[i], &st->sentinels[i], err, errlen) < 0)
				goto fail;
		st->nsentinels = conf->nsentinels;
	} else if (addr_parse(conf->server ? conf->server : "127.0.0.1:6379", &st->server_addr,
			      err, errlen) < 0) {
		goto fail;
	}
	struct store_memory_conf mc = { .max_keys = conf->local_max_keys, .snapshot = NULL };
	char warn[64];
	st->local = store_memory_new(&mc, realtime_ns(), warn, sizeof(warn));
	if (!st->local)
		goto nomem;
	/* every node must name a (rule, key) alike: the seed comes from the shared prefix */
	st->local->seed = XXH64(st->prefix, strlen(st->prefix), 0x736c75696365ULL);
	s->type = "redis";
	s->ops = &redis_ops;
	s->ctx = st;
	s->seed = st->local->seed;
	return s;
nomem:
	fmt_fixed(err, errlen, "out of memory");
fail:
	if (st) {
		free(st->sentinels);
		store_free(st->local);
		free(st->user);
		free(st->password);
		free(st->prefix);
		free(st->master_name);
		free(st->node_id);
		free(st);
	}
	free(s);
	return NULL;
}

static const struct store_ops redis_ops = {
	.decide = redis_decide,
	.decide_start = redis_decide_start,
	.cancel = redis_cancel,
	.slot_enter = redis_slot_enter,
	.slot_cancel = redis_slot_cancel,
	.slot_release = redis_slot_release,
	.slots_renew = redis_slots_renew,
	.slide_start = redis_slide_start,
	.slide_cancel = redis_slide_cancel,
	.refund = redis_refund,
	.reset = redis_reset,
	.top = redis_top,
	.expire = redis_expire,
	.stats = redis_stats,
	.save = redis_save,
	.destroy = redis_destroy,
};
