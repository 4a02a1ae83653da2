/*
 * store -- the limiter state behind every rate limit: one GCRA timestamp per key and window.
 *
 * A backend is a function table (store_memory.c: the embedded default; store_redis.c for
 * clusters).  The unit of work is a decision over a batch of items, one per (rule, key)
 * that an SMTP event touches, decided atomically: no other decision sees a state between
 * the check and the charge of the batch (law 4, doc/ARCHITECTURE.md).
 *
 * GCRA, per window (count N per period P, burst B; emission interval T = ceil(P / N)):
 *   state: TAT, the theoretical arrival time (ns since the epoch, CLOCK_REALTIME);
 *          a missing key is TAT = now.
 *   an event of cost c conforms iff  max(TAT, now) + c*T - now <= B*T;
 *   when it is charged, TAT := max(TAT, now) + c*T.
 *   retry (when it does not conform) = max(TAT, now) + c*T - B*T - now, the exact wait
 *   until it would; an item's retry is the largest over its windows.  (A cost above the
 *   burst never conforms; its retry is still what the formula gives.)
 *   Products are taken in 128 bits; a TAT or retry past 2^64 ns saturates at UINT64_MAX.
 *   So over any interval of length t, at most B + floor(t / T) units are admitted.
 *   A cost of 0 is checked as a cost of 1 and charges nothing ("is there room at all").
 *   used(window) = ceil((max(TAT, now) - now) / T), the units not yet restored.
 * A key whose TAT <= now in every window holds no information and may be dropped.
 *
 * Thread-safe: all workers share one store.
 *
 * Asynchronous backends (Redis) answer through store_decide_start(): the decision is
 * sent on the calling thread's event loop (engine_thread_base()) and its callback runs
 * on that loop, never on another thread.  The memory store answers at once through the
 * same call, so callers write one path.
 */
#ifndef SLUICE_STORE_H
#define SLUICE_STORE_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rate.h"
#include "stats.h"
#include "str.h"
#include "util.h"

enum store_item_flags {
	STORE_BLOCKING = 1u << 0,       /* a refusal by this item refuses the whole event */
	STORE_COUNT_REJECTED = 1u << 1, /* charge even when the event is refused */
	STORE_DISTINCT = 1u << 2,       /* count value_hash once per window (see below) */
};

struct store_item {
	/* in */
	uint64_t key_hash;  /* store_key_hash(rule name, key text): the (rule, key) identity */
	struct str rule;    /* rule name and key text: kept for `limits top` (may be empty) */
	struct str key;
	const struct rate_limits *limits; /* n >= 1 windows */
	uint64_t cost;
	unsigned flags;     /* enum store_item_flags */
	uint64_t block_ns;  /* STORE_CHECK, the item over its limits: stays refused this long */
	uint64_t value_hash; /* STORE_DISTINCT: the value counted (a keyed hash, never 0) */
	/* out */
	bool known;         /* STORE_DISTINCT: value_hash was counted in every window */
	bool blocked;       /* a block runs: the item is over until it ends (retry_ns) */
	bool ok;            /* every window has room for cost */
	bool charged;       /* this decision charged cost to every window */
	uint64_t retry_ns;  /* !ok: wait until it would conform (the largest over windows) */
	uint64_t used[RATE_MAX_WINDOWS]; /* after the decision, per window */
};

enum store_mode {
	STORE_CHECK = 0,    /* decide and charge */
	STORE_PEEK,         /* decide, charge nothing (explain, `sluice test`) */
	STORE_RESET,        /* store_decide_start() only: forget every window of each item;
			     * the result is 1 if any of them existed, else 0 */
};

/*
 * A decision over items[0..n):
 *   every item's ok, retry_ns and used are computed;
 *   the event passes iff every item with STORE_BLOCKING is ok;
 *   STORE_CHECK, event passes: every ok item is charged (a non-blocking item that is not
 *     ok -- a warn or tag rule over its limit -- is not);
 *   STORE_CHECK, event refused: only ok items with STORE_COUNT_REJECTED are charged.
 * Returns 1 if the event passes, 0 if it is refused, <0 on a store error (-ENOMEM when
 * the store cannot hold a new key even after evicting).  now is CLOCK_REALTIME ns.
 *
 * Blocks (a penalty box): an item with block_ns also has a block record per (rule, key)
 * under its windows (as its TATs: other limits for the key start afresh), the time its
 * block ends.  While it is ahead of now the item is over (blocked), its
 * retry at least the time left, whatever room its windows have.  STORE_CHECK, an item
 * that is over with no block running starts one: now + block_ns, and its retry is then at
 * least block_ns (the attempts a block refuses do not extend it).  `limits reset` forgets the block with the windows.
 *
 * Distinct values (STORE_DISTINCT): each window also remembers which values it counted,
 * one record per (key, value, window) that lasts the window's period after the value was
 * last seen.  In a window that remembers value_hash the item costs 0 (checked as nothing
 * at all, not as "is there room"); in the others it costs cost.  An item that is charged
 * (or known everywhere, when the event passes) refreshes the value's records.  So at most
 * B + t/T new values per window get through in any interval t, and a value seen within
 * the window passes again for free.  Distinct charges are not refunded.
 */
struct store_top_entry;
struct store_stats;
struct store_ov_call;

/* A decision refused because the store is unavailable and is configured to say so
 * (redis on_failure = tempfail): the caller answers with a temporary failure. */
#define STORE_TEMPFAIL (-EAGAIN)
/* store_decide_start(), store_slot_enter(): the answer comes later through done(). */
#define STORE_PENDING 2

/*
 * One decision in flight.  The caller owns the call and its items, and keeps both valid
 * until done() has run or store_call_cancel() has returned.  done() runs on the thread
 * that started the call, from its event loop, with rc as decide() returns.
 */
struct store_call {
	struct store_item *items;
	size_t n;
	enum store_mode mode;
	uint64_t now;
	void (*done)(struct store_call *c, int rc);
	void *arg;
	void *req;      /* the backend's request while pending */
	/* store.c's, while pending: the caller's done, and when the call started */
	void (*caller_done)(struct store_call *c, int rc);
	struct store *store;
	uint64_t started_ns;
};

/*
 * A concurrency slot of a host class (Sendmail XLA), shared by the nodes of a cluster.
 * local_used is this node's count with this session's slot already reserved (the caller
 * reserves first, so a node never holds more than it says).  Answer: 1 entered, 0 full,
 * or STORE_TEMPFAIL when Redis did not answer and on_failure = tempfail (no verdict).
 */
struct store_slot_call {
	const char *cls;
	unsigned cap;
	unsigned local_used;
	bool fallback;      /* out: on_failure answered (Redis did not): nothing was taken
			     * there, and with on_failure = tempfail a 0 is no verdict */
	void (*done)(struct store_slot_call *c, int rc);
	void *arg;
	void *req;
};

/*
 * A lane's exact sliding windows (slide.h) shared by the nodes of a cluster: one atomic
 * script (redis/slide.lua) over every window of the lane, so that the nodes together never
 * send more than n[i] in any window of length window_ns[i].  A take is admitted iff every
 * window admits it, and then counts in every window; a refused take charges nothing.
 *
 * The caller owns the call (and name) and keeps it valid until done() has run or
 * store_slide_cancel() has returned.  done() runs on the thread that started the call,
 * from its event loop (never inside store_slide_start()), with
 *   rc = 1   admitted (take: counted in every window; wait_ns = 0),
 *   rc = 0   refused: wait_ns is the exact wait until every window would admit (the
 *            largest over the refusing windows; UINT64_MAX when some n[i] is 0),
 *   rc < 0   no answer: -ETIMEDOUT (none within the store's timeout), -EAGAIN (Redis
 *            unreachable, or the connection was lost), -EPROTO (an error or malformed
 *            reply).  The caller must not send: the take may or may not have counted
 *            (a timed-out script may still run), which can only make the lane send less.
 * count[] is then set for rc >= 0: the sends that count in each window (after a take).
 *
 * There is no on_failure for lanes.  `local` (each node enforcing n / nodes alone) is a
 * fair compromise for inbound limits, but not here: the sends made before Redis went away
 * are known only to Redis, so a node could send its whole share into a window that is
 * already full, and nodes that still reach Redis (a partition, not an outage) keep using
 * the whole budget -- together over the provider's limit, which is what gets a relay's
 * account banned.  A shared lane stops instead; its mail waits in the queue (law 5,
 * doc/ARCHITECTURE.md).
 *
 * Keys: PREFIX "lane:" NAME ":" I, one sorted set per window, I its index in n[] (the
 * order must stay the same across calls and nodes: the lane's configured order).
 */
struct store_slide_call {
	/* in */
	const char *name;                       /* the lane: non-empty, <= STORE_SLIDE_NAME bytes */
	unsigned nwin;                          /* 1 .. RATE_MAX_WINDOWS */
	uint64_t n[RATE_MAX_WINDOWS];           /* sends allowed per window (0: none, ever) */
	uint64_t window_ns[RATE_MAX_WINDOWS];   /* window lengths */
	bool take;                              /* false: peek, write nothing */
	uint64_t now;                           /* CLOCK_REALTIME ns; 0: Redis's clock (TIME),
						 * which every node then shares */
	void (*done)(struct store_slide_call *c, int rc, uint64_t wait_ns);
	void *arg;
	/* out */
	char member[48];                        /* this send's unique id in the sets (take) */
	uint64_t count[RATE_MAX_WINDOWS];
	void *req;                              /* the backend's request while pending */
};

#define STORE_SLIDE_NAME 256

/* The windows of a configured rate list ("8/1m", "10000/1d"): n = count, window = period
 * (a burst means nothing to an exact window).  l->n must be 1 .. RATE_MAX_WINDOWS. */
static inline void store_slide_set_limits(struct store_slide_call *c, const struct rate_limits *l)
{
	c->nwin = l->n;
	for (unsigned i = 0; i < l->n && i < RATE_MAX_WINDOWS; i++) {
		c->n[i] = l->w[i].count;
		c->window_ns[i] = l->w[i].period_ns;
	}
}

struct store_ops {
	int (*decide)(void *ctx, struct store_item *items, size_t n, enum store_mode mode,
		      uint64_t now);
	/* Optional (NULL: decide() answers at once).  STORE_PENDING or decide()'s result. */
	int (*decide_start)(void *ctx, struct store_call *c);
	void (*cancel)(void *ctx, struct store_call *c);
	/* Optional shared class slots (NULL: the node's own counters are the whole truth).
	 * slot_enter: 1, 0 or STORE_PENDING.  slot_release gives one back (no answer).
	 * slots_renew renews this node's leases with its current counts, from a timer. */
	int (*slot_enter)(void *ctx, struct store_slot_call *c);
	void (*slot_cancel)(void *ctx, struct store_slot_call *c);
	void (*slot_release)(void *ctx, const char *cls);
	void (*slots_renew)(void *ctx, const char *const *cls, const unsigned *counts, size_t n);
	/* Optional shared lane windows (NULL: lanes keep their own slide.c).  slide_start:
	 * STORE_PENDING or <0, never done() from inside it; the call is checked already. */
	int (*slide_start)(void *ctx, struct store_slide_call *c);
	void (*slide_cancel)(void *ctx, struct store_slide_call *c);
	/* Give back what items with charged set took (TAT -= cost*T, not below now). */
	void (*refund)(void *ctx, const struct store_item *items, size_t n, uint64_t now);
	/* Forget a (rule, key): every window of limits.  Returns 1 if it existed, else 0. */
	int (*reset)(void *ctx, uint64_t key_hash, const struct rate_limits *limits);
	/* Keys nearest their limits (see struct store_top_entry); returns how many filled. */
	size_t (*top)(void *ctx, struct store_top_entry *ret, size_t max, uint64_t now);
	/* Drop idle keys; called from a timer.  Returns how many were dropped. */
	size_t (*expire)(void *ctx, uint64_t now);
	void (*stats)(void *ctx, struct store_stats *ret);
	/* Persist state (memory store: snapshot file).  0 or -errno with err. */
	int (*save)(void *ctx, char *err, size_t errlen);
	void (*destroy)(void *ctx);
	/* Optional: change a run-time limit where the truth lives (Redis); NULL: the local
	 * table is the truth.  As store_ov_change(). */
	int (*ov_change)(void *ctx, struct store_ov_call *c);
};

#define STORE_TOP_RULE 64
#define STORE_TOP_KEY 192

struct store_top_entry {
	char rule[STORE_TOP_RULE];  /* truncated copies, NUL-terminated */
	char key[STORE_TOP_KEY];
	uint64_t key_hash;
	struct rate_limits limits;
	uint64_t used[RATE_MAX_WINDOWS];
	unsigned fill_ppm;          /* the fullest window: used / burst, in millionths */
};

struct store_stats {
	bool shared;            /* a cluster store: the fields below describe its link */
	bool up;                /* every connection is usable */
	char state[160];        /* "connected to ...", "unreachable since ...: deciding locally" */
	uint64_t fallbacks;     /* decisions answered by on_failure */
	uint64_t timeouts;
	uint64_t reconnects;
	uint64_t redirects;     /* cluster: MOVED, ASK and TRYAGAIN followed */
	uint64_t calls;         /* script calls that carried decisions (below decisions:
				 * several went as one) */
	uint64_t keys;          /* (key, window) records held */
	uint64_t max_keys;
	uint64_t bytes;         /* memory held by the tables */
	uint64_t evicted;       /* records dropped because the store was full */
	uint64_t expired;
	uint64_t decisions;
	uint64_t errors;
};

/* What the front counts of every decision, whatever the backend: relaxed atomics in
 * per-thread shards (thread_shard()), 152 bytes used of 256 so that two shards never
 * share a cache line. */
struct store_metrics {
	_Atomic uint64_t decisions;             /* answered (any mode) */
	_Atomic uint64_t errors;                /* answered < 0 */
	_Atomic uint64_t latency[STAT_HIST_BUCKETS]; /* seconds from the call to the answer */
	_Atomic uint64_t latency_sum_ns;
	char pad[256 - (STAT_HIST_BUCKETS + 3) * sizeof(uint64_t)];
};

struct store {
	const char *type;       /* "memory", "redis" */
	const struct store_ops *ops;
	void *ctx;
	uint64_t seed;          /* hash key of store_key_hash() */
	struct store_ov *ov;    /* run-time limits (store_ov.c); made by the constructor,
				 * freed by store_free() */
	struct store_metrics m[THREAD_SHARDS];
};

/* The (rule, key) identity: a keyed 64-bit hash (XXH3 with the store's seed). */
uint64_t store_key_hash(const struct store *s, struct str rule, struct str key);
/* The same with a given seed (a snapshot's, before it is loaded). */
uint64_t store_key_hash_seed(uint64_t seed, struct str rule, struct str key);

/* A decision answered now (the backend's decide()), counted in s->m. */
int store_decide(struct store *s, struct store_item *items, size_t n, enum store_mode mode,
		 uint64_t now);
/* The decisions, errors and latency histogram counted so far (any thread). */
void store_metrics_get(const struct store *s, uint64_t *ret_decisions, uint64_t *ret_errors,
		       struct stat_hist *ret_latency);

/* Start a decision: its result now (as decide()), or STORE_PENDING. */
int store_decide_start(struct store *s, struct store_call *c);
/* The caller no longer wants the answer: done() will not run.  Accepts a finished call. */
void store_call_cancel(struct store *s, struct store_call *c);
/* Shared slots: see struct store_slot_call.  Without a shared store: 1. */
int store_slot_enter(struct store *s, struct store_slot_call *c);
void store_slot_cancel(struct store *s, struct store_slot_call *c);
void store_slot_release(struct store *s, const char *cls);
/*
 * Shared lane windows: see struct store_slide_call.  STORE_PENDING (done() will run), or
 * at once -ENOTSUP when the store is not shared (the memory store: the lane then uses
 * slide.c itself), -EINVAL for a call out of bounds (no name, nwin, a name too long,
 * no done), -EAGAIN when Redis cannot be asked now (down, or this thread has no event
 * loop), -ENOMEM.  c->req is NULL on every immediate answer.
 */
int store_slide_start(struct store *s, struct store_slide_call *c);
/* The caller no longer wants the answer: done() will not run.  Accepts a finished call.
 * (A take already sent may still count: cancelling can only make the lane send less.) */
void store_slide_cancel(struct store *s, struct store_slide_call *c);

static inline void store_refund(struct store *s, const struct store_item *items, size_t n,
				uint64_t now)
{
	s->ops->refund(s->ctx, items, n, now);
}

/* Destroy the backend (ops->destroy) and free s, which the backend's constructor allocated
 * with malloc.  Does not save: the daemon calls ops->save first at shutdown.  Accepts NULL;
 * returns NULL. */
struct store *store_free(struct store *s);

/*
 * ---- run-time per-key limits (store_ov.c) ----
 *
 * `sluice limits set RULE KEY RATE... [--for D]`: limits for one (rule, key) that win over
 * the overrides file and the rule's rates (doc/LIMITS.md, "Run-time limits").  Each store
 * keeps a table of them, looked up by key_hash by every decision without a lock (one
 * atomic load when the table is empty).  The memory store writes it into its snapshot;
 * the Redis store keeps the truth in Redis (PREFIX "{ov}", a hash, and PREFIX "{ov}:v",
 * its version) and each node a copy, renewed by a thread of its own (store_redis_ov.c)
 * within a second of a change.
 */
#define STORE_OV_MAX 100000     /* entries in a table */
#define STORE_OV_RULE 63        /* bytes of a rule name */

struct store_ov_entry {
	uint64_t key_hash;          /* store_key_hash(rule, key) */
	uint64_t until_ns;          /* CLOCK_REALTIME; 0: until unset */
	struct rate_limits limits;  /* n = 0: unlimited (the rule does not apply) */
	struct str rule;            /* 1 .. STORE_OV_RULE bytes, no space, no NUL */
	struct str key;             /* 1 .. RATE_MAX_OVERRIDE_KEY bytes (normalized) */
};

struct store_ov;
struct store_ov *store_ov_new(void);
/* Frees the current table; tables replaced before go with the ebr list.  Accepts NULL. */
struct store_ov *store_ov_free(struct store_ov *ov);
/* The limits of key_hash (1, *ret and *ret_until if not NULL) or 0 when it has none live
 * at now.  Any thread, no lock; ov may be NULL. */
int store_ov_find(const struct store_ov *ov, uint64_t key_hash, uint64_t now,
		  struct rate_limits *ret, uint64_t *ret_until);
/* Local changes (writers; O(n)).  put: 0, -EINVAL (a bad entry), -E2BIG (STORE_OV_MAX
 * live entries already), -ENOMEM.  del: 1 removed, 0 there was none, -ENOMEM.  replace:
 * the whole table becomes e[0..n) but the entries expired at now (0, -EINVAL, -E2BIG,
 * -ENOMEM; the table is unchanged on error).  Entries expired at now are dropped. */
int store_ov_put(struct store_ov *ov, const struct store_ov_entry *e, uint64_t now);
int store_ov_del(struct store_ov *ov, uint64_t key_hash, uint64_t now);
int store_ov_replace(struct store_ov *ov, const struct store_ov_entry *e, size_t n,
		     uint64_t now);
/* A copy of the live entries: *ret (one allocation holding the texts too: free(*ret))
 * and *ret_n.  0 or -ENOMEM. */
int store_ov_list(struct store_ov *ov, uint64_t now, struct store_ov_entry **ret,
		  size_t *ret_n);
size_t store_ov_count(struct store_ov *ov, uint64_t now);
bool store_ov_entry_valid(const struct store_ov_entry *e);

/*
 * A change of a run-time limit (the operator's set or unset).  The caller owns the call
 * and the texts of e until done() has run.
 */
struct store_ov_call {
	/* in */
	bool unset;                 /* remove e.key_hash; else set e */
	struct store_ov_entry e;
	/* runs on the store's sync thread, only when store_ov_change() said STORE_PENDING */
	void (*done)(struct store_ov_call *c, int rc);
	void *arg;
	/* out: a message when rc < 0 (which server refused, why) */
	char err[160];
	struct store_ov_call *next;  /* the backend's, while pending */
};
/*
 * Set (0) or unset (1 removed, 0 there was none) now in the local table, or with Redis
 * STORE_PENDING: done() runs later on another thread with that result, once Redis took
 * the change and this node's table has it too.  <0: -EINVAL, -E2BIG (the table is full),
 * -EAGAIN (Redis unreachable: nothing changed), -ENOMEM, -ENOTSUP (no table).
 */
int store_ov_change(struct store *s, struct store_ov_call *c);

/* ---- the memory store ---- */
struct store_memory_conf {
	uint64_t max_keys;        /* (key, window) records; default 1,000,000 */
	const char *snapshot;     /* file path, or NULL for none */
};

/*
 * Create the memory store; if the snapshot file exists it is loaded (keys whose windows
 * are full again are skipped).  A snapshot that cannot be read or is corrupt is renamed
 * to "<path>.corrupt" and the store starts empty: *warn then holds a message for the log
 * (otherwise warn[0] = '\0').  Returns NULL only on allocation failure.
 */
struct store *store_memory_new(const struct store_memory_conf *conf, uint64_t now,
			       char *warn, size_t warnlen);
/* Change max_keys at reload (records over the new bound are evicted as keys are added). */
void store_memory_set_max_keys(struct store *s, uint64_t max_keys);
/*
 * Load a snapshot image (the file format of ops->save) from memory into s, which should
 * be empty: its seed becomes the snapshot's.  Records whose TAT <= now are skipped, and so
 * are records past max_keys.  The image is checked whole before anything is loaded:
 * returns 0, -EINVAL (s unchanged) for any inconsistency, or -ENOMEM.  For the fuzzer and
 * store_memory_new().
 */
int store_memory_load_buffer(struct store *s, const void *p, size_t n, uint64_t now);

/* ---- the Redis store (store_redis.c) ---- */
enum store_failure {
	STORE_FAIL_LOCAL = 0, /* each node enforces its share (limit / nodes) in memory */
	STORE_FAIL_ACCEPT,    /* let everything through */
	STORE_FAIL_TEMPFAIL,  /* answer every decision with a temporary failure */
};

struct store_redis_conf {
	const char *server;      /* "host:port", "[v6]:port", "unix:/path"; NULL with sentinels
				  * or seeds */
	const char *user;        /* ACL user, or NULL */
	const char *password;    /* or NULL */
	unsigned db;
	const char *prefix;      /* of every key; "sluice:" */
	uint64_t timeout_ms;     /* the longest a decision waits for Redis */
	const char *const *sentinels; /* "host:port" each; with master_name */
	size_t nsentinels;
	const char *master_name;
	const char *const *seeds;     /* a Redis Cluster: "host:port" of some of its nodes */
	size_t nseeds;
	bool probe;                   /* a cluster: ask a seed for the slot map now (blocking,
				       * at start), and fail with err when none gives one or
				       * one is no cluster node */
	enum store_failure on_failure;
	unsigned nodes;          /* for local shares */
	const char *node_id;     /* lease owner, unique per running process */
	uint64_t lease_ms;       /* class slots held by a silent node expire after this */
	uint64_t local_max_keys; /* the fallback memory store's bound */
	/* State changes for the daemon's log (may run on any thread; may be NULL). */
	void (*notify)(void *arg, bool bad, const char *msg);
	void *notify_arg;
};

/* Create the Redis store; connections are made on first use by each thread's loop.
 * NULL with err on a bad address or allocation failure. */
struct store *store_redis_new(const struct store_redis_conf *conf, char *err, size_t errlen);
/*
 * The decision script's reply (a hiredis redisReply) into items[0..n), whose limits must
 * be set: 1 or 0 as decide() returns, or -EPROTO for a reply of the wrong shape (the
 * items may then be partly written).  For the fuzzer; the store uses it for every reply.
 */
int store_redis_parse_decide(const void *reply, struct store_item *items, size_t n,
			     enum store_mode mode);
/*
 * The reply of ov_read.lua, the run-time limits in Redis ({VERSION, {FIELD, VALUE, ...}};
 * store_redis_ov.c).  0 with *ret_version and *ret (malloc'd; free it), *ret_n entries
 * whose texts point into reply, and *ret_skipped, the pairs that were malformed or past
 * STORE_OV_MAX; -EPROTO for a reply of the wrong shape; -ENOMEM.  Pure, for the fuzzer.
 */
int store_redis_ov_parse(const void *reply, uint64_t *ret_version,
			 struct store_ov_entry **ret, size_t *ret_n, size_t *ret_skipped);
/* One field (16 hex digits) and value ("1 UNTIL_NS WINDOWS RULE KEY") into *ret, whose
 * texts point into value: 0 or -EPROTO. */
int store_redis_ov_parse_entry(struct str field, struct str value,
			       struct store_ov_entry *ret);
/* Does this store keep state apart from this process (a cluster store)? */
bool store_is_shared(const struct store *s);

/* GCRA on one window, exposed for tests and for the store backends. */
struct gcra_result {
	bool ok;
	uint64_t new_tat;   /* the TAT if charged (cost 0: tat as given) */
	uint64_t retry_ns;  /* !ok: exact wait */
	uint64_t used;      /* units not yet restored, after charging if ok */
};
void gcra_check(const struct rate_window *w, uint64_t tat, uint64_t now, uint64_t cost,
		struct gcra_result *ret);
/* The emission interval T = ceil(period / count), in ns. */
uint64_t gcra_interval(const struct rate_window *w);
/* TAT after giving back cost units. */
uint64_t gcra_refund(const struct rate_window *w, uint64_t tat, uint64_t now, uint64_t cost);
/* Units not yet restored at now. */
uint64_t gcra_used(const struct rate_window *w, uint64_t tat, uint64_t now);

#endif
