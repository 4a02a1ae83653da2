/*
 * relay_int -- the relay's private declarations, shared by its rooms (relay.h is the
 * public side).
 *
 * The rooms, split by object (a function's prefix names its file), from the floor up,
 * and the thread each runs on (the relay's, but where said):
 *   relay_base.c    base_*: log lines, a reply as text, the mailbox (base_post from any
 *                   thread, base_call_sync from control workers); calls no other room
 *   relay_flush.c   flush_*: the flusher, a helper thread that fdatasyncs status bytes
 *                   and the send history
 *   outcome.c       outcome_decide: the pure decision of a recipient's fate
 *   relay_msg.c     msg_*: the message index, loading, routing (through relay.up),
 *                   items and their schedule, msg_rcpt_settle (the one writer of a
 *                   recipient's status, next try and attempts) and a message's end
 *   relay_hist.c    hist_*: the persisted send history, state_dir/relay.lanes
 *   relay_bounce.c  bounce_*: delivery status notifications of failed, delayed and
 *                   relayed recipients; expiry and the operator's bounce
 *   relay_signal.c  signal_*: what a reply means in a lane, with the signals'
 *                   thresholds (threshold.c, pure, counts them)
 *   relay_dane.c    dane_*: TLSA answers per MX host and DANE's verdict for a
 *                   connection; the lane acts on it
 *   relay_sched.c   sched_*: the pure scheduler that lane_kick asks (no I/O)
 *   relay_lane.c    lane_*: lanes, their timers, lane_kick and lane_pick, suspension,
 *                   failing and deferring a lane's due recipients, shared budgets
 *   relay_conn.c    conn_*: DNS and connections (setup, idle, close)
 *   relay_tx.c      tx_*: one transaction: what it takes, the history it waits for,
 *                   and its recipients' outcomes
 *   relay_group.c   group_*: provider and MX-set lanes (a domain's lane forwards to its
 *                   group's)
 *   relay_view.c    `sluice lanes`, the metrics' lanes, stats, suspend/resume (run on the
 *                   relay's thread through base_call_sync)
 *   relay.c         the top: relay_new/start/stop/free (the daemon's main thread), the
 *                   thread, the mailbox's dispatch, the sweep, reload; called by none
 * Lanes, connections, transactions and groups call each other (the event loop's turns);
 * every other call runs down this list, and what a room below asks of the lanes goes
 * through relay.up (struct relay_up), which the lane room registers.
 *
 * Not for use outside src/relay/.
 */
#ifndef SLUICE_RELAY_INT_H
#define SLUICE_RELAY_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/event.h>

#include "classify.h"
#include "htab.h"
#include "lane.h"
#include "log.h"
#include "mailbox.h"
#include "mx.h"
#include "outcome.h"
#include "policy.h"
#include "queue.h"
#include "relay.h"
#include "relay_sched.h"
#include "smtp_out.h"
#include "store.h"
#include "threshold.h"
#include "util.h"

#define HISTORY_FILE "relay.lanes"
#define HISTORY_MAX (64u << 20)
#define MAX_LANES 100000
#define SWEEP_MS 30000
#define DSN_MAX (64u << 20)
/* The client recorded in the envelope of the DSNs the relay queues: how it knows, after
 * a restart too, that a failed message from <> is its own bounce (never bounced again,
 * not even to the postmaster: no loops). */
#define DSN_CLIENT "[127.0.0.1] sluice-dsn"

struct conf_rt;
struct dane_cache;
struct dane_host;
struct flush_req;
struct hist_entry;
struct lane;
struct lane_conn;
struct mb_item;
struct rmsg;
struct tx;

/* What the rooms below the lanes ask of them (relay.up, set by lane_register): the
 * message room's lane for a recipient's domain (*ret_routed false: no route takes it;
 * NULL: none could be made), DANE's kick of a lane its lookup held. */
struct relay_up {
	struct lane *(*lane_for)(struct relay *r, const char *domain, bool *ret_routed);
	void (*kick)(struct lane *l);
};

struct relay {
	struct conf_rt *crt;          /* current */
	struct relay_up up;
	uint64_t (*clock)(void);      /* a test's clock (relay_now), or NULL: the system's */
	struct conf_rt *retired;
	struct queue *q;
	struct queue_dir *qd;
	struct store *store;
	struct policy *rules;         /* host classes (a reference) */
	relay_log_fn *log;
	void *log_arg;

	pthread_t thread;
	bool started;
	struct event_base *base;
	struct mailbox mb;            /* of struct mb_item * */
	pthread_mutex_t call_lock;    /* an MB_CALL's done, and call_cond */
	pthread_cond_t call_cond;

	struct mx_resolver *dns;
	struct event *sweep;
	bool stopping;
	struct event *stop_timer;
	int64_t stop_deadline_ms;

	TAILQ_HEAD(rmsg_list, rmsg) msgs; /* in arrival order (msg_insert) */
	struct rmsg *insert_hint;     /* the last one inserted: the loader's next goes after */
	struct rmsg *warned_upto;     /* the delay notices' walk is done up to this one */
	char (*recheck)[QUEUE_ID_LEN + 1]; /* messages whose end could not be settled: the
				       * sweep asks msg_check_done() again */
	size_t nrecheck, recheck_cap;
	struct htab msg_idx;          /* the messages by id */
	/* Messages whose file stays open though no transaction uses it, least recently used
	 * first: a post to many lanes is read and checked once, not once per transaction
	 * (at most MSG_OPEN_IDLE_MAX). */
	TAILQ_HEAD(, rmsg) open_idle;
	uint64_t route_gen;           /* msg_route()'s runs */
	unsigned nopen_idle;
	uint64_t open_idle_bytes;
	uint64_t msg_seq;             /* messages loaded: their struct rmsg's seq */
	TAILQ_HEAD(, lane) lanes;
	unsigned nlanes;
	struct htab lane_idx;         /* the lanes by name: names hold peers' domains */
	struct dane_cache *dane;      /* MX hosts' TLSA answers (relay_dane.c), or NULL */
	struct sched sched;           /* the lanes' wake-ups */
	struct event *wake;           /* one timer for all of them, at sched_next_wake() */
	uint64_t wake_at;             /* when it is armed for (SCHED_NEVER: not armed) */
	struct relay_stats st;

	/* the flusher: one helper thread that fdatasyncs the statuses a transaction wrote,
	 * so that a slow disk never stalls the connections of the relay's loop */
	pthread_t flusher;
	bool flusher_started, fl_stop;
	pthread_mutex_t fl_lock;
	pthread_cond_t fl_cond;
	struct flush_req *fl_head, **fl_tail;
	struct flush_req *fl_hist;    /* the send history's flush, taken before fl_head */

	int hist_fd;
	uint64_t hist_lines;
	/* lines written to relay.lanes, and how many of them are known to be on disk: a
	 * transaction's MAIL FROM waits until its send is (hist_wait), so that a power cut
	 * cannot take a send the next hop counted out of the budget */
	uint64_t hist_seq, hist_synced;
	bool hist_syncing;            /* a flush of the history is with the flusher */
	TAILQ_HEAD(, tx) hist_wait;
	uint64_t late_logged_ns;      /* the last "went out late" line (one per 10 s) */
	struct hist_entry *hist;      /* loaded at start, for lanes not made yet */
	size_t nhist;
	uint64_t seq;                 /* member ids of shared sends */
};

/* The relay's time (CLOCK_REALTIME ns): every room reads it here, so that a test can
 * give the relay a clock of its own (relay.clock). */
static inline uint64_t relay_now(const struct relay *r)
{
	return r->clock ? r->clock() : realtime_ns();
}

/*
 * Each room's structs and functions, from the floor up (struct relay, which every room
 * reaches, is above).  A room calls the rooms listed before it; lanes, connections,
 * transactions and groups (the event loop's own circle) call each other; the top,
 * relay.c, is called by none.  What a room below must ask of the lanes goes through
 * relay.up, registered by the lane room (lane_register).
 */

/* ---- relay_base.c: the floor: log lines, reply text, the mailbox (struct mb_item) ---- */
enum mb_kind { MB_QUEUE = 0, MB_DSN_DONE, MB_CALL, MB_STOP, MB_SETTLED, MB_HIST_SYNCED };

struct mb_item {
	enum mb_kind kind;
	enum queue_event ev;
	char id[QUEUE_ID_LEN + 1];
	int rc;
	int64_t deadline_ms;          /* MB_STOP */
	uint64_t hist_seq;            /* MB_HIST_SYNCED: the history's lines now on disk */
	bool delayed;                 /* MB_DSN_DONE: a delay notice, not a bounce */
	int (*fn)(struct relay *r, void *arg);
	void *arg;
	bool done;
};

void base_logf(struct relay *r, enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* A server's reply (or, without one, what res says went wrong) as one line of text. */
void base_reply_text(const struct smtp_out_result *res, const struct smtp_reply *rep,
		     char *out, size_t len);
/* Post it to the relay's mailbox, from any thread: 0, -ESHUTDOWN or -ENOMEM. */
int base_post(struct relay *r, struct mb_item *it);
/* Run fn on the relay's loop and wait for its result (control commands, metrics, a
 * reload); before the relay's thread runs, at once. */
int base_call_sync(struct relay *r, int (*fn)(struct relay *r, void *arg), void *arg);

/* ---- relay_flush.c: the flusher (struct flush_req) ---- */
/* A message's status bytes to flush, off the relay's loop (fd: a dup of its file's); or,
 * with hist_seq, the send history up to that line (fd: a dup of relay.lanes'). */
struct flush_req {
	int fd;
	uint64_t hist_seq;
	char id[QUEUE_ID_LEN + 1];
	struct flush_req *next;
};

void *flush_main(void *arg);
/* m's status bytes written so far go to disk on the flusher (MB_SETTLED answers). */
void flush_post(struct relay *r, struct rmsg *m);
bool flush_post_hist(struct relay *r);

/* ---- relay_msg.c: messages (struct rrcpt, struct lane_item, struct rmsg) ---- */
struct rrcpt {
	struct lane *lane;            /* NULL: no route (waits for a reload) */
	uint64_t next_try;            /* CLOCK_REALTIME ns; 0: at once */
	uint32_t attempts;
	uint32_t item;                /* its lane's item: m->items[item] (when lane is set) */
	char status;                  /* T U D F N, as on disk */
	bool busy;                    /* in a transaction */
	uint8_t notify;               /* its NOTIFY= (enum queue_notify), 0: none */
	bool relayed;                 /* this delivery (NOTIFY=SUCCESS to a server without
					 DSN) owes a "relayed" notice: it is written N, not
					 D, and the N is what the bounce reads */
};

/* Does the recipient's NOTIFY (RFC 3461 4.1) ask for the notice of kind bit
 * (QUEUE_NOTIFY_FAILURE, _DELAY, _SUCCESS)?  Without NOTIFY: failures and delays, as
 * before DSN was offered (RFC 3461 leaves DELAY to the MTA then). */
static inline bool rcpt_notify_wants(const struct rrcpt *rr, unsigned bit)
{
	if (rr->notify == 0)
		return bit != QUEUE_NOTIFY_SUCCESS;
	return (rr->notify & bit) != 0;
}

/* One message's recipients in one lane: what the scheduler orders (relay_sched.h). */
struct lane_item {
	struct sched_item s;          /* first: a struct sched_item * is a lane_item's */
	struct rmsg *m;
	struct lane *lane;
	size_t pending;               /* recipients of m in this lane that are T or U */
	uint32_t scan;                /* its recipients before this one are done */
	uint32_t nri, ri_cap;         /* its recipients (indexes into m->r, routing order);
					 ri_cap 0: the one there is is in ri_one */
	union {
		uint32_t *ri_many;
		uint32_t ri_one;
	};
	TAILQ_ENTRY(lane_item) link;
};

/* Message files kept open between their transactions (relay.open_idle). */
#define MSG_OPEN_IDLE_MAX 64
#define MSG_OPEN_IDLE_BYTES (UINT64_C(64) << 20) /* their files' sizes, summed */

/* The indexes of it's recipients: it->nri of them. */
static inline uint32_t *item_rcpts(struct lane_item *it)
{
	return it->ri_cap ? it->ri_many : &it->ri_one;
}

struct rmsg {
	char id[QUEUE_ID_LEN + 1];
	uint64_t arrival_us;
	uint64_t size;
	uint32_t flags;
	char *block;                  /* sender, then each recipient, NUL-terminated */
	const char *sender;
	const char **addr;
	struct rrcpt *r;
	size_t nrcpt;
	struct lane_item *items;      /* linked into lanes and the scheduler by address */
	size_t nitems;
	uint64_t seq;                 /* load order: ties of arrival */
	unsigned busy;                /* transactions under way */
	bool held, deleted, bouncing;  /* bouncing: a DSN of it is being committed */
	bool warned;                  /* control byte QUEUE_CTL_WARNED is 'W' */
	bool is_dsn;                  /* a DSN this relay made: never bounced itself */
	bool recheck;                 /* its id is in relay.recheck */
	bool bounce_asked;            /* `sluice queue bounce` while it was busy */
	char bounce;                  /* control byte QUEUE_CTL_BOUNCE */
	bool open;
	bool open_idle;               /* open and in relay.open_idle */
	bool dirty;                   /* bytes written since the last flush was handed over */
	size_t npending;              /* recipients that are T or U */
	unsigned flushing;            /* status flushes handed to the flusher, not yet done */
	struct queue_msg *qm;         /* while open */
	TAILQ_ENTRY(rmsg) link;
	TAILQ_ENTRY(rmsg) idle_link;  /* in relay.open_idle */
	struct htab_node hnode;       /* in the relay's table by id */
};

/* A message's body as the pieces of its mapped file (msg_body_collect). */
struct msg_body {
	struct str *part;             /* as many as the queue index's nbody */
	size_t n;
};

/* 1: loaded now (*ret_m) and routed; 0: it was loaded already (*ret_m); or -errno. */
int msg_load(struct relay *r, const char *id, struct rmsg **ret_m);
struct rmsg *msg_find(struct relay *r, const char *id);
int msg_open_file(struct relay *r, struct rmsg *m);
void msg_close_file(struct relay *r, struct rmsg *m);
/* m's items go without touching their lanes (the relay is stopping: the lanes are gone). */
void msg_forget_lanes(struct rmsg *m);
void msg_free(struct relay *r, struct rmsg *m);
/* queue_file_body()'s callback: the pieces of a body into a struct msg_body. */
int msg_body_collect(void *arg, struct str chunk);
/* Route every unfinished recipient of m to its lane (relay.up.lane_for) and link m's
 * items into those lanes.  -ENOMEM when a recipient found no lane. */
int msg_route(struct relay *r, struct rmsg *m);
/* m's recipients in lane from go to lane to (a domain joined a group's lane): only the
 * item of from changes, in O(items + recipients), the others stay as they are. */
void msg_move_lane(struct relay *r, struct rmsg *m, struct lane *from, struct lane *to);
/* Put m's items where the scheduler wants them (after a change of its recipients' retry
 * times, busy flags, or of held, deleted and bouncing). */
void msg_schedule(struct relay *r, struct rmsg *m);
/* The same for m's item in lane l alone. */
void msg_schedule_lane(struct relay *r, struct rmsg *m, struct lane *l);
/* When it is due again, from its own recipients (those from it->scan on). */
void msg_item_schedule(struct relay *r, struct lane_item *it);
/* The item of recipient i of m (routed), or NULL. */
struct lane_item *msg_rcpt_item(struct rmsg *m, size_t i);
/* The one writer of a recipient's status, next try and attempts, its log lines and the
 * counters: recipient i of m becomes what o (outcome_decide) says; l is the lane that
 * acted (its counters move), or NULL. */
void msg_rcpt_settle(struct relay *r, struct rmsg *m, size_t i, struct lane *l, const char *mta,
		     const struct outcome *o, const char *text);
/* The operator's `sluice queue flush`: every recipient of m is due at once. */
void msg_flush_now(struct relay *r, struct rmsg *m);
/* Recipient i of m is taken by a transaction (busy, one more attempt), and released. */
void msg_rcpt_take(struct rmsg *m, size_t i);
void msg_rcpt_release(struct rmsg *m, size_t i);
/* Whether m is finished: removed when its statuses are on disk and nothing is owed
 * (true: its bounce is due, and marked so on disk; the caller starts it, as
 * bounce_check does).  m may be freed. */
bool msg_check_done(struct relay *r, struct rmsg *m);
/* m's end (its bounce, its removal) failed for now: the next sweep tries again. */
void msg_recheck_later(struct relay *r, struct rmsg *m);

/* ---- relay_hist.c: the send history, state_dir/relay.lanes (struct hist_entry) ---- */
/* What relay.lanes held at start, sorted by name (then by line) once loaded, so that a
 * lane made later finds its own entries by binary search (hist_find). */
struct hist_entry {
	char *name;
	uint64_t us;                  /* a send; or, for a suspension, its end (0: resumed) */
	char *why;                    /* a suspension's reason; NULL for a send */
	size_t line;                  /* its order in the file */
	bool taken;                   /* a lane was made for it and has it */
};

void hist_append(struct relay *r, const char *lane, uint64_t t_ns);
void hist_append_suspension(struct relay *r, const struct lane *l);
void hist_compact(struct relay *r);
/* Lines written but not known to be on disk; hist_sync() flushes them (on the flusher,
 * or here without one), hist_synced() records the flush's end. */
bool hist_pending(const struct relay *r);
void hist_sync(struct relay *r);
void hist_synced(struct relay *r, uint64_t seq, int rc);
int hist_load(struct relay *r, char *err, size_t errlen);
/* The loaded history entries of a lane: the index of the first, and how many (0: none). */
size_t hist_find(const struct relay *r, const char *name, size_t *ret_n);

/* ---- relay_bounce.c: bounces, delay and relayed notices; a message's end ---- */
void bounce_start(struct relay *r, struct rmsg *m, bool delayed);
void bounce_done(struct relay *r, struct rmsg *m);
/* msg_check_done(), and m's bounce started when it is due.  m may be freed. */
void bounce_check(struct relay *r, struct rmsg *m);
/*
 * Every recipient of m still to do fails now with dsn and text (the end of its
 * lifetime, or the operator's `sluice queue bounce`), and its bounce follows.  m may be
 * freed.  -EBUSY while a transaction holds some of its recipients.
 */
int bounce_fail_pending(struct relay *r, struct rmsg *m, const char *dsn, const char *text);
/* The operator's `sluice queue bounce` (QUEUE_EV_BOUNCE): now, or when m's transactions
 * and its delay notice are over.  m may be freed. */
void bounce_by_operator(struct relay *r, struct rmsg *m);

/* ---- relay_signal.c: the signals' thresholds (struct signal_once) ---- */
/* What one transaction's replies did to the signals' counts (zeroed before its first
 * reply; signal_classify fills it, signal_once_clear frees it). */
struct signal_once {
	unsigned char *seen;          /* per signal: 0 not matched, 1 counted, 2 acted */
	size_t n;
};
void signal_once_clear(struct signal_once *o);
/* classify_reply() for a reply in lane l, with the signals' thresholds: a signal with
 * after = N acts on the N-th matching reply within its window, a transaction counting
 * once (once: NULL for a reply outside one).  Before the N-th, a suspend, slow or retry
 * signal's reply is a RETRY of the recipient (never a bounce: law 5); a fail signal's is
 * classified as if that signal did not match. */
void signal_classify(struct lane *l, const struct classify *cls, enum smtp_out_stage stage,
		     int error, const struct smtp_reply *rep, struct signal_once *once,
		     struct classify_result *ret);
/* The signals' counts toward their thresholds, for `sluice lanes`. */
void signal_view(const struct lane *l, bool json, struct buf *b, uint64_t now);

/* ---- relay_dane.c: DANE for mx lanes (struct dane_cache, struct dane_host) ---- */
#define DANE_DSN "4.7.5"              /* RFC 3463: cryptographic failure */
enum dane_verdict {
	DANE_GO = 0,                  /* connect with *ret_tls (and *ret_dh's records) */
	DANE_WAIT,                    /* a TLSA lookup is under way: its end kicks the lane */
	DANE_POLL,                    /* no memory, or the cache is full: try in a second */
	DANE_NEXT_MX,                 /* l->next_target is the next MX host: try it now */
	DANE_DEFER,                   /* every MX host was tried: the lane defers its due
				       * recipients, why says why */
};
/* The TLS for a connection of l to tg under tls = "dane" / "dane-only".  *ret_until:
 * when the answers the decision rests on end (no reuse of the connection after).  DANE
 * decides; the lane acts on the verdict. */
enum dane_verdict dane_prepare(struct lane *l, const struct mx_target *tg,
			       enum smtp_out_tls *ret_tls, const struct dane_host **ret_dh,
			       uint64_t *ret_until, char *why, size_t whylen);
/* Whether rc may carry another transaction: its MX and TLSA answers still hold. */
bool dane_reusable(const struct lane_conn *rc, uint64_t now);
/* Give rc its copy of dh's records (rc->dane, rc->oc).  0 or -ENOMEM. */
int dane_attach(struct lane_conn *rc, const struct dane_host *dh);
/* DANE found no server of l it may send to: `sluice lanes` says why. */
void dane_defer_status(struct lane *l, const char *mta, const char *text);
/* A DANE connection is set up: log and show how the server was authenticated. */
void dane_on_ready(struct lane_conn *rc, struct smtp_out *c);
void dane_free(struct lane *l);
/* The relay's TLSA answers go (after the resolver: its lookups are cancelled). */
void dane_cache_free(struct relay *r);

/* ---- relay_lane.c: lanes (struct route_rt, struct conf_rt, struct lane) ---- */
/* A route as the relay runs it: the configuration and what is built from it. */
struct route_rt {
	const struct route_conf *conf;
	struct classify *cls;
	struct smtp_out_conf oc;
};

/* One configuration with its routes; retired ones live until no connection uses them. */
struct conf_rt {
	struct relay_conf conf;
	struct route_rt *routes;
	unsigned users;               /* connections made under it */
	struct conf_rt *next;         /* retired list */
};

struct lane {
	struct relay *r;
	char *name;
	struct htab_node hnode;       /* the relay's index of lanes by name (lane_find) */
	char *domain;                 /* MX lanes: the destination domain (a group lane: the
				       * domain whose MX answer it uses) */
	struct route_rt *rt;          /* NULL: its route is gone (after a reload) */
	/* lanes = "mx" or "provider" (doc/RELAY.md, Provider lanes): a domain's lane whose
	 * MX answer matched a group forwards to the group's lane while that answer is used;
	 * the group lane lists those domain lanes (its members) */
	bool group;
	bool dnssec_seen;             /* a group: a member's MX answer was validated (DANE) */
	char *provider_name;          /* a provider's lane */
	const struct provider_conf *provider; /* its configuration, in r->crt */
	struct lane *fwd;
	TAILQ_HEAD(, lane) members;
	TAILQ_ENTRY(lane) member;
	size_t nmembers;
	/* the signals' thresholds: a counter per signal of the classifier thr_serial */
	uint64_t thr_serial;          /* classify_serial() of the classifier counted for */
	struct threshold *thr;
	uint64_t *thr_key;            /* classify_threshold_key() of each */
	size_t nthr;
	struct lane_budget b;
	TAILQ_HEAD(, lane_item) items;
	uint32_t item_hint;           /* where the last message asked had its item in this
				       * lane (msg_item(): a guess, checked before use) */
	uint64_t route_gen;           /* == relay.route_gen: the message msg_route() routes
				       * has its item in this lane at item_hint */
	struct sched_lane s;          /* its items by due time and arrival; its wake-up */
	size_t waiting;               /* the items' pending recipients, summed */
	TAILQ_HEAD(, lane_conn) conns;
	unsigned nconns, nidle, nconnecting;
	struct mx_target *targets;
	size_t ntargets;
	uint64_t targets_until;       /* their TTL (relay.dns_min_ttl, dns_max_ttl) ends */
	bool targets_fresh;           /* serve the attempts that asked for them, even past
				       * targets_until (TTL 0), until one connects or all failed */
	unsigned dns_failures;        /* lookups failed in a row: the retry's backoff */
	unsigned next_target;
	struct mx_query *query;
	bool deciding;                /* a shared budget's answer is awaited */
	struct store_slide_call *call;
	struct policy_pending *slot_wait; /* the shared store's answer for a class slot */
	struct policy *slot_rules;    /* a reference to the rules it was asked under */
	struct class_slot *slot;      /* granted for the next connection (slot_granted) */
	bool slot_granted;
	uint64_t delivered, failed, deferred, suspensions, transactions;
	char last[200];               /* the last reply or error, for `sluice lanes` */
	struct dane_host *dane_wait;  /* tls = "dane": the TLSA lookup it waits for */
	char dane_status[400];        /* tls = "dane": the last connection's, for `sluice lanes` */
	TAILQ_ENTRY(lane) link;
};

uint64_t lane_guard_ns(const struct route_conf *rc);
struct lane *lane_find(struct relay *r, const char *name);
struct lane *lane_get(struct relay *r, struct route_rt *rt, const char *domain);
struct lane *lane_make(struct relay *r, struct route_rt *rt, const char *name, const char *domain,
		       const struct provider_conf *p);
/* Take a lane out of the relay's list and index (before lane_free). */
void lane_unlink(struct relay *r, struct lane *l);
/* Free a lane that nothing refers to any more (its items and connections are gone). */
void lane_free(struct lane *l);
/* After a reload: l's route is rt now (NULL: gone); its forward is dropped (every domain
 * is grouped again from a new MX answer), its budget takes the new rate. */
void lane_reconf(struct lane *l, struct route_rt *rt);
unsigned lane_max_conns(const struct lane *l);
/* Set relay.up: what the rooms below ask of the lanes. */
void lane_register(struct relay *r);
void lane_arm(struct lane *l, uint64_t wait_ns);
/* The relay's one timer: armed for the earliest wake-up of any lane; it kicks every lane
 * whose moment has come. */
void lane_wake_rearm(struct relay *r);
void lane_on_wake(evutil_socket_t fd, short what, void *arg);
void lane_kick(struct lane *l);
/* Every lane m has recipients in looks at its work again. */
void lane_kick_msg(struct rmsg *m);
/* The oldest item with recipients due in l; up to max of them into idx (relay_sched.h). */
struct lane_item *lane_pick(struct lane *l, uint64_t now, size_t max, size_t *idx,
			    size_t *ret_n, uint64_t *next);
void lane_signal(struct lane *l, const struct classify_result *cr, const char *text);
/* Every recipient of l still to do (and not in a transaction) fails with dsn and text. */
void lane_fail_all(struct lane *l, const char *dsn, const char *text);
/* l's due recipients wait for their retry without a transaction (their backoff), with
 * dsn and text; what names the part that decided ("DANE"). */
void lane_defer_due(struct lane *l, const char *mta, const char *dsn, const char *what,
		    const char *text);
/* The sweep's part: lanes of a domain that hold nothing and count no send go. */
void lane_sweep(struct relay *r, uint64_t now);

/* ---- relay_conn.c: connections and DNS (struct lane_conn) ---- */
enum rconn_state { RC_CONNECTING = 0, RC_IDLE, RC_BUSY };

struct lane_conn {
	struct relay *r;
	struct lane *lane;
	struct conf_rt *crt;
	struct classify *cls;         /* of the route it was made for (in crt) */
	struct smtp_out_conf oc;      /* the route's, with the MX host's name for TLS */
	struct class_slot *slot;      /* in the host class of the peer, or NULL */
	char host[256];
	struct smtp_out *c;
	enum rconn_state st;
	struct event *idle_timer;
	struct tx *tx;
	unsigned target;
	struct smtp_out_dane *dane;   /* its TLSA records (oc.dane), owned */
	bool dane_tls;                /* TLS made mandatory by TLSA records (tls = "dane") */
	uint64_t until;               /* not reused from then on (its DNS answers' end), or 0 */
	TAILQ_ENTRY(lane_conn) link;
};

/* Look the smarthost or l's MX hosts up (the answer kicks the lane). */
void conn_resolve(struct lane *l);
/* Open a connection of l to its next target (its ready callback kicks the lane). */
void conn_open(struct lane *l);
void conn_idle(struct lane_conn *rc);
void conn_close(struct lane_conn *rc, bool quit);
void conn_close_idle(struct lane *l);
/* Idle connections whose DNS answers are over (DANE: dane_reusable()) go. */
void conn_close_stale(struct lane *l, uint64_t now);
struct lane_conn *conn_find_idle(struct lane *l);

/* ---- relay_tx.c: transactions (struct tx) ---- */
struct tx {
	struct lane_conn *rc;
	struct rmsg *m;
	struct lane *lane;
	size_t n;
	size_t *idx;
	struct str *addrs;
	struct smtp_out_rcpt_dsn *dsn; /* the recipients' DSN parameters */
	struct msg_body body;
	struct smtp_out_msg msg;      /* what smtp_out sends: valid until done() */
	/* waiting for the send history to be on disk before its MAIL FROM goes out */
	TAILQ_ENTRY(tx) hist_link;
	uint64_t hist_seq;            /* the history's lines it waits for */
	bool parked;
	/* when its sends were counted (0: counted elsewhere, a shared lane), how many, and
	 * how often counted again because the history's flush made them late */
	uint64_t t_counted;
	uint64_t ncounted;
	unsigned recounts;
};

/* Start a transaction on the idle connection rc (budget_taken: a shared lane's budget was
 * granted for one send).  False when nothing was started and the lane must wait. */
bool tx_start(struct lane *l, struct lane_conn *rc, uint64_t now, bool budget_taken);
/* Its MAIL FROM goes out: its send is in the history on disk. */
void tx_send(struct tx *t);
/* The history is on disk up to relay.hist_synced: the transactions parked for it go. */
void tx_hist_synced(struct relay *r);
struct tx *tx_free(struct tx *t);

/* ---- relay_group.c: provider and MX-set lanes ---- */
/* l's MX answer is in: when it matches a group (a provider; a set of MX hosts), l
 * forwards to the group's lane and its mail moves there.  True when it moved. */
bool group_join(struct lane *l);
/* Whether an MX answer (of the domain a group lane l looks up) still puts the domain in
 * l's group. */
bool group_matches(const struct lane *l, const struct mx_target *t, size_t n);
/* A group lane's own MX lookup failed for good, or no longer matches (the domain it used
 * is gone, or moved): that domain is grouped again from its next answer, and the lane
 * takes another member's domain and looks up again, else waits (a suspension). */
void group_lost(struct lane *l, const char *text);
/* l no longer forwards (and will look its domain up again). */
void group_unforward(struct lane *l);
/* Before l is freed: it forwards no more, and no lane forwards to it. */
void group_leave(struct lane *l);
/* Whether the sweep must keep l although it holds no mail: a group with members, a
 * domain's lane that still forwards. */
bool group_keeps(const struct lane *l, uint64_t now);
/* Its members or its group, for `sluice lanes`. */
void group_view(const struct lane *l, bool json, struct buf *b);

/* ---- relay_view.c: views (sluice lanes, metrics, stats, suspend and resume) ---- */
/* A wait in ns as ms for fmt_duration(), UINT64_MAX ("never") kept. */
static inline uint64_t ns_to_ms(uint64_t ns)
{
	return ns == UINT64_MAX ? UINT64_MAX : ns / 1000000u;
}

/* ---- relay.c: the top (the thread, its mailbox's dispatch, the sweep, reload) ----
 * Its functions are relay.h's; none of the rooms calls it. */

#endif
