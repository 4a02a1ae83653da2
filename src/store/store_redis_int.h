/*
 * store_redis_int.h -- the rooms of the Redis store, and what they share.
 *
 *   store_redis.c       the store: its life (configuration, addresses, the local store
 *                       on_failure uses), its ops table, statistics, the lanes' windows.
 *   store_redis_decide.c  the calls Redis answers and what answers them when it cannot:
 *                       decisions (batched into script calls, split over a cluster's
 *                       slots), refunds, class slots; the callbacks the link calls.
 *   store_redis_argv.c  a command's arguments in one allocation; a lane's or class's key.
 *   store_redis_loop.c  each event loop's part of the store: made on first use, its
 *                       send queue flushed once per pass (decisions batched), its timer
 *                       (deadlines, TRYAGAIN, the slot map's refresh), freed at the end.
 *   store_redis_link.c  how a request gets there: each loop's connections, their setup
 *                       and backoff, Sentinel, the cluster's slot map and redirections,
 *                       the replies; the scripts' table; the store's up/down state.
 *   store_redis_req.c   a loop's requests: their life, the deadline list (in deadline
 *                       order) and the send queue, the loop's timer armed.
 *   store_redis_addr.c  pure and blocking helpers: addresses, key slots, CLUSTER SLOTS
 *                       and MOVED/ASK parsed (fuzzed), the cluster's start-up probe.
 *   store_redis_ov.c    the run-time per-key limits: the {ov} hash in Redis, and the
 *                       thread of its own (one synchronous connection) that polls it
 *                       and makes `sluice limits set|unset` changes.
 *
 * Calls go one way, down this list: store_redis.c calls the others; store_redis_decide.c
 * the arguments, the run-time limits and the link's rooms; store_redis_argv.c and
 * store_redis_ov.c the link's rooms; and within the link store_redis_loop.c calls
 * store_redis_link.c and store_redis_req.c, store_redis_link.c calls store_redis_req.c
 * and store_redis_addr.c, and those two call none.  The link's rooms call none of the
 * operations':
 * the scripts' table is the link's, a command's arguments are freed by an inline of this
 * header, and what the link must hand back to the operations (an answer, a failure, a
 * batch of decisions to send again, a withdrawn decision's copy) goes through the
 * callbacks store_redis.c registered in struct rstore (struct redis_callbacks,
 * store_redis_decide.c's).
 *
 * Threads: every structure below but struct rstore belongs to one event loop (a worker's
 * or the main loop) and is touched only by the thread that runs it.  struct rstore is
 * shared: its configuration is read-only after store_redis_new(); its counters are atomic;
 * its state text and loop table are under its lock.
 *
 * A request (struct rreq) is one thing a caller waits for, or one command nobody waits
 * for (a release, a refund).  It is queued on its loop, sent by the loop's flush (which
 * batches the decisions bound for one connection -- and one slot, on a cluster -- into one
 * script call), and answered exactly once: by its reply, by its deadline, or by on_failure
 * when its connection cannot take it; unless its caller withdrew first.  Memory: a
 * request in flight is freed by the reply callback of the command that carries it (hiredis
 * runs it, with no reply, when a connection goes away); a queued one by the flush that
 * finds it answered.
 */
#ifndef SLUICE_STORE_REDIS_INT_H
#define SLUICE_STORE_REDIS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "store.h"
#include "util.h"

#define REDIS_MAX_LOOPS 256         /* event loops: workers + main */
#define REDIS_MAX_NODES 64          /* cluster masters one loop talks to */
#define REDIS_MAX_INFLIGHT 100000   /* commands out on one connection */
#define REDIS_MAX_REQS 100000       /* requests of one loop, queued or out */
#define REDIS_SLOTS 16384
#define REDIS_NO_NODE 0xff          /* a slot whose master is not known */
#define REDIS_MAX_REDIRECTS 5       /* MOVED/ASK/TRYAGAIN followed per request */
#define REDIS_BATCH_DECISIONS 64    /* decisions in one script call */
#define REDIS_BATCH_KEYS 512        /* keys in one script call */
#define REDIS_CONNECT_TIMEOUT_MS 2000
#define REDIS_MAP_REFRESH_MS 10000  /* the slot map, asked again */
#define REDIS_MAP_RETRY_MS 1000     /* ... while a master is unreachable or the map unknown */

enum script_id {
	SC_GCRA = 0, SC_REFUND, SC_SLOT_ENTER, SC_SLOT_RELEASE, SC_SLOT_RENEW, SC_SLIDE,
	SC_OV_SET, SC_OV_DEL, SC_OV_READ, /* run-time limits: the sync thread's, EVAL'd */
	SC_COUNT,
};

/* The scripts' text and SHA1, loaded on every connection (store_redis_link.c). */
struct redis_script {
	const char *text;
	size_t len;
	const char *sha1;
};
extern const struct redis_script redis_scripts[SC_COUNT];

struct addr {
	char host[256];  /* IP literal, or the socket path */
	int port;        /* 0: unix socket */
};

/* ---- store_redis_argv.c: a command's arguments, in one allocation ---- */
struct argv_buf {
	const char **argv;
	size_t *len;
	size_t n, cap;
	char *text;        /* all argument text, back to back */
	size_t used, size;
};

int argv_init(struct argv_buf *a, size_t cap, size_t text);
/* Free a's buffer.  Inline: the link frees a request's command without calling up. */
static inline void argv_clear(struct argv_buf *a)
{
	free(a->argv);
	a->argv = NULL;
}
int argv_add_cstr(struct argv_buf *a, const char *v);
int argv_add_u64(struct argv_buf *a, uint64_t v);
int argv_add(struct argv_buf *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int argv_add_bytes(struct argv_buf *a, const char *p, size_t n);
char *argv_room(struct argv_buf *a, size_t n);
/* The keys a decision names in gcra.lua (two for a distinct item): store_redis_link.c's,
 * for the batches of store_redis_loop.c, which count them. */
struct store_call;
size_t redis_call_keys(const struct store_call *call);
int argv_commit(struct argv_buf *a, size_t n);
/* EVALSHA sha nkeys, or EVAL text nkeys */
int argv_script_head(struct argv_buf *a, enum script_id sc, bool eval, uint64_t nkeys);
struct rstore;
/* A lane's or a class's key: PREFIX KIND NAME SUFFIX, or PREFIX KIND "{" NAME "}" SUFFIX on
 * a cluster (its slot comes from the name alone), the slot in *ret_slot (0 off a
 * cluster). */
int argv_add_named_key(struct argv_buf *a, const struct rstore *st, const char *kind,
		       const char *name, const char *suffix, uint16_t *ret_slot);

enum req_kind {
	REQ_DECIDE = 0,  /* a decision (batched): call */
	REQ_SLOT,        /* a class slot: slot */
	REQ_SLIDE,       /* a lane's windows: slide */
	REQ_OTHER,       /* a command nobody waits for (refund, release, renewal) */
};

struct rloop;
struct redis_conn;

/* What a pending store_call's req points to: a request, or a decision split over slots. */
enum req_holder { HOLD_REQ = 0, HOLD_JOIN };

struct rreq {
	enum req_holder holder;     /* HOLD_REQ (first: see struct djoin) */
	struct rloop *loop;
	struct rreq *prev, *next;   /* the loop's unanswered requests, in deadline order */
	struct rreq *qnext;         /* the loop's send queue */
	enum req_kind kind;
	enum script_id script;
	bool waiting;               /* in the deadline list: not answered yet */
	bool queued;                /* in the send queue */
	bool orphan;                /* call is the store's copy of a withdrawn decision */
	uint8_t redirects;
	uint16_t slot;              /* cluster: the slot of every key it touches */
	struct redis_conn *ask;     /* send once to this node, after ASKING */
	uint64_t deadline_ms;       /* monotonic; 0: none (REQ_OTHER) */
	uint64_t not_before_ms;     /* TRYAGAIN: not sent again before this */
	struct store_call *call;
	struct store_slot_call *slotc;
	struct store_slide_call *slide;
	struct argv_buf cmd;        /* every kind but REQ_DECIDE: the command, kept to resend */
	size_t reply_len;           /* REQ_DECIDE: its elements in a batch's reply */
	const char *what;
};

/* One command sent: what its reply answers.  hiredis's privdata. */
enum sent_kind { SENT_REQS = 0, SENT_SETUP, SENT_MAP };

struct rsent {
	struct redis_conn *conn;
	enum sent_kind kind;
	int script;                 /* SENT_SETUP: the script it loads, or -1 */
	const char *what;
	bool eval;                  /* sent with the script's text */
	bool decisions;             /* r[] are decisions of one gcra.lua call (its reply is
				     * their parts, in order) */
	size_t n;
	struct rreq *r[];           /* SENT_REQS: the requests it carries, in reply order */
};

struct redis_conn {
	struct rloop *loop;
	struct rstore *st;
	redisAsyncContext *ac;      /* NULL while down */
	redisAsyncContext *sac;     /* asking a sentinel */
	bool connected;             /* TCP up, setup sent */
	bool ready;                 /* setup answered: requests may go */
	bool healthy;               /* the last attempt worked (optimistic at first) */
	bool counted_down;          /* counted in st->down */
	bool retired;               /* cluster: no slot maps here any more */
	uint8_t index;              /* in loop->conns */
	unsigned next_sentinel;
	unsigned setup_left;        /* setup replies still awaited */
	struct addr addr;           /* where ac goes */
	struct event *timer;        /* connect timeout, stall check */
	struct event *retry;        /* reconnect backoff */
	uint64_t backoff_ms;
	uint64_t last_reply_ms;
	uint64_t busy_since_ms;     /* when inflight last went from 0 to 1 */
	uint64_t connect_deadline_ms;
	size_t inflight;            /* commands sent and not answered */
	char err[128];
};

struct rloop {
	struct rstore *st;
	struct event_base *base;
	struct redis_conn *conns[REDIS_MAX_NODES];  /* single server: conns[0] */
	size_t nconns;
	uint8_t *map;               /* cluster: slot -> index in conns (REDIS_NO_NODE) */
	bool map_known;
	bool map_asking;            /* a CLUSTER SLOTS is out */
	uint64_t map_at_ms;         /* when the map was last asked for */
	size_t nreqs;               /* requests allocated (REDIS_MAX_REQS at most) */
	struct rreq *head, *tail;   /* unanswered requests, deadline order */
	struct rreq *q_head, *q_tail; /* not sent yet */
	struct event *flush;        /* sends the queue, once per loop pass */
	struct event *timer;        /* deadlines, TRYAGAIN, the map's refresh */
};

/*
 * What the link calls back in the operations (store_redis.c), which store_redis_new()
 * copies into struct rstore before any loop exists: so the link names no function of the
 * room above it, at the cost of one indirect call (no allocation, no lookup).  All run on
 * the request's loop.
 */
struct redis_callbacks {
	/* Answer r's caller by on_failure (a lane, which has none, by err); r leaves the
	 * deadline list.  Nothing for a request already answered. */
	void (*fail)(struct rreq *r, int err);
	/* Send the decisions q[0..n), bound for one connection (and one slot), as one
	 * script call: 0, or <0 (nothing sent; the caller fails them). */
	int (*send_decisions)(struct redis_conn *c, struct rreq **q, size_t n, bool eval,
			      bool asking);
	/* A copy of a decision in flight whose caller withdrew: its done() refunds what the
	 * answer says was charged.  NULL for a decision that charges nothing, or no memory. */
	struct store_call *(*orphan)(const struct store_call *c);
	/* Answer the requests of a reply that is no redirection or connection error. */
	void (*answer)(struct rsent *s, redisReply *rep);
};

struct rstore {
	struct redis_callbacks cb;  /* set by store_redis_new(), read-only after */
	struct store *local;        /* on_failure = local */
	struct store_redis_conf conf;
	char *user, *password, *prefix, *master_name, *node_id;
	struct addr server_addr;
	struct addr *sentinels;
	size_t nsentinels;
	struct addr *seeds;         /* cluster */
	size_t nseeds;
	bool cluster;
	pthread_mutex_t lock;       /* adding loops, the state text, the addresses logged */
	struct rloop *loops[REDIS_MAX_LOOPS];
	_Atomic size_t nloops;
	_Atomic unsigned down;      /* connections not healthy */
	_Atomic bool announced;     /* the first connection was logged */
	_Atomic uint64_t decisions, errors, fallbacks, timeouts, reconnects, redirects, calls;
	_Atomic uint64_t slide_seq; /* lane sends taken by this process: member ids */
	_Atomic unsigned masters;   /* cluster: masters in the last map */
	char member_base[32];       /* "NODE:RANDOM": see redis_slide_start() */
	char state[160];            /* under lock */
	uint64_t down_since;        /* realtime ns, under lock */
	struct addr logged[16];     /* announced addresses outside the seeds' (under lock) */
	size_t nlogged;
	struct store *self;         /* the store this is the ctx of */
	/* the run-time limits' thread (store_redis_ov.c): started by the main thread's first
	 * timer call (redis_ov_ensure), read by any thread */
	_Atomic(struct rov *) ov_sync;
	bool ov_failed;             /* main thread: it could not start (logged once) */
};

/* ---- store_redis_decide.c: decisions, refunds, class slots, and their answers ---- */

/* What the link calls back (st->cb), set by store_redis_new(). */
extern const struct redis_callbacks redis_decide_callbacks;
/* The store's ops (store.h) of these calls. */
int redis_decide(void *ctx, struct store_item *items, size_t n, enum store_mode mode,
		 uint64_t now);
int redis_decide_start(void *ctx, struct store_call *call);
void redis_cancel(void *ctx, struct store_call *call);
void redis_refund(void *ctx, const struct store_item *items, size_t n, uint64_t now);
int redis_slot_enter(void *ctx, struct store_slot_call *sc);
void redis_slot_cancel(void *ctx, struct store_slot_call *sc);
void redis_slot_release(void *ctx, const char *cls);
void redis_slots_renew(void *ctx, const char *const *cls, const unsigned *counts, size_t n);

/* ---- store_redis_ov.c: the run-time limits (the {ov} hash) and their sync thread ---- */
struct rov;
/* Start the thread that keeps s->ov in step with Redis: NULL with err on failure. */
struct rov *redis_ov_start(struct rstore *st, struct store *s, char *err, size_t errlen);
/* Start it unless it runs (or failed): from the main thread's timers (expire, lease
 * renewals), which run only once sluiced has detached, never before a fork. */
void redis_ov_ensure(struct rstore *st);
/* Stop and join it; changes still queued are answered -ECANCELED.  Accepts NULL. */
void redis_ov_stop(struct rov *o);
/* ops->ov_change: queue the change for the thread (STORE_PENDING). */
int redis_ov_change(void *ctx, struct store_ov_call *c);
/* The hash's value of e: its length, or -ENOSPC. */
int redis_ov_format(const struct store_ov_entry *e, char *buf, size_t len);

/* ---- store_redis_loop.c: each event loop's part ---- */

/* This thread's loop, made on first use (its connections start then).  NULL when the
 * thread has no event loop or on allocation failure. */
struct rloop *rloop_get(struct rstore *st);
/* Free the loops and their connections, after every loop has stopped. */
void redis_links_free(struct rstore *st);

/* ---- store_redis_link.c: connections, Sentinel, the slot map, replies ---- */

/* Send one command carrying q[0..n) on c (after ASKING when asking): 0, or <0 (nothing
 * sent: the caller answers them). */
int redis_conn_send_reqs(struct redis_conn *c, struct rreq **q, size_t n, bool eval, bool asking,
			 const char *what, int argc, const char **argv, const size_t *len);
/* A connection of loop l to a (not started), or NULL (REDIS_MAX_NODES, no memory). */
struct redis_conn *redis_conn_new(struct rloop *l, const struct addr *a);
/* Connect c (asking Sentinel first when configured), unless it has a connection or a
 * question to a sentinel out, or is retired. */
void redis_conn_start(struct redis_conn *c);
/* Close c and free it, its hiredis contexts and events. */
void redis_conn_free(struct redis_conn *c);
/* Ask a usable connection of the loop for the slot map (one question at a time). */
void redis_map_ask(struct rloop *l);
/* Is every connection usable?  (Readers: stats.) */
void redis_set_state(struct rstore *st, bool up, const char *why);

/* ---- store_redis_req.c: a loop's requests ---- */

/* A new request of this loop; NULL at the loop's bound (REDIS_MAX_REQS: the caller
 * answers by on_failure) or on allocation failure. */
struct rreq *rreq_new(struct rloop *l, enum req_kind kind, enum script_id sc);
/* Queue r for sending (this loop pass); with a deadline it waits in the deadline list. */
void rreq_submit(struct rreq *r);
/* Into the send queue; kick: flush it in this loop pass. */
void rreq_queue(struct rreq *r, bool kick);
/* The caller gives up on r: nobody is answered (a decision that may have charged is
 * replaced by the store's copy, whose answer refunds it). */
void rreq_withdraw(struct rreq *r);
/* r leaves the deadline list (answered): nothing for one already out of it. */
void rreq_leave(struct rreq *r);
/* Free r (it must have left the queue, and no command may carry it). */
void rreq_free_one(struct rreq *r);
/* Arm the loop's timer for its next moment: the first deadline, a TRYAGAIN's time, the
 * slot map's refresh. */
void rloop_timer_arm(struct rloop *l);

/* The operations' answers, through what store_redis.c registered (st->cb): the link's
 * rooms name no function of the operations'.  Nothing for a NULL request.  (The member's
 * name in parentheses: a test's framework may define a macro fail().) */
static inline void rreq_fail(struct rreq *r, int err)
{
	if (r)
		(r->loop->st->cb.fail)(r, err);
}

/* Arm ev for the monotonic time at (ms), or stop it for UINT64_MAX.  An inline, as
 * rloop_map_interval(): the loop's and its connections' timers are armed from more than
 * one room, on paths a decision takes. */
static inline void redis_timer_at(struct event *ev, uint64_t at)
{
	if (at == UINT64_MAX) {
		evtimer_del(ev);
		return;
	}
	uint64_t now = now_ms();
	struct timeval tv = timeval_from_ms(at > now ? at - now : 0);
	evtimer_add(ev, &tv);
}

/* How long the slot map is used before it is asked again: a second while it is unknown
 * or a master holding slots is not ready, else REDIS_MAP_REFRESH_MS. */
static inline uint64_t rloop_map_interval(const struct rloop *l)
{
	bool down = !l->map_known;
	for (size_t i = 0; i < l->nconns && !down; i++)
		down = !l->conns[i]->retired && !l->conns[i]->ready;
	return down ? REDIS_MAP_RETRY_MS : REDIS_MAP_REFRESH_MS;
}

/* ---- store_redis_addr.c: addresses, key slots, the cluster's replies parsed ---- */

/* "unix:/path", "/path", "host:port", "[v6]:port", "host" (port 6379), a host name
 * resolved once: 0, or -EINVAL with err. */
int redis_addr_parse(const char *text, struct addr *ret, char *err, size_t errlen);
void redis_addr_format(const struct addr *a, char *buf, size_t len);
/* Ask one seed for the cluster's slot map, blocking, at start: 0, or -1 with err. */
int redis_cluster_probe(struct rstore *st, char *err, size_t errlen);
/* One range of a cluster's slot map. */
struct redis_slot_range {
	uint16_t first, last;
	struct addr master;
};
/* A CLUSTER SLOTS reply (asked of the node at asked) into ret[0..max): how many ranges,
 * or -EPROTO for a reply of the wrong shape.  Pure: for the fuzzer and map_take(). */
int redis_slots_parse(const redisReply *rep, const struct addr *asked,
		      struct redis_slot_range *ret, size_t max);
/* "MOVED 3999 127.0.0.1:6381" / "ASK 3999 [::1]:6381": the slot and the address; 0, or
 * -EPROTO with both untouched.  Pure: for the fuzzer and the store. */
int redis_redirect_parse(const char *text, unsigned *ret_slot, struct addr *ret);
/* The cluster slot of a key's hash tag (CRC16/XMODEM of tag, mod 16384). */
uint16_t redis_key_slot(const char *tag, size_t len);

#endif
