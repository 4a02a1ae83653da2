/*
 * relay -- the relay's thread: lanes, transactions, recipient states, bounces (relay.h).
 *
 * Everything here runs on the relay's own loop, except the mailbox functions at the top
 * (post(), called by the queue's threads and control workers), the flusher (a helper
 * thread) and relay_new/start/stop/free (the daemon's main thread).
 *
 * The relay's view of the queue: a struct rmsg per message with work left, in arrival
 * order, each recipient routed to a lane.  A lane holds, in arrival order, the messages
 * with recipients for it (lane_item), so the oldest message is always served first and
 * nothing starves.  Statuses on disk change only through queue_set_status() on the
 * message's open file (a pwrite into the page cache: a killed daemon loses none), and
 * are flushed after every transaction by the flusher thread, so that a slow disk never
 * holds up the loop's connections; a message is removed, or its bounce queued, only
 * after its flushes are done.
 *
 * Scheduling, per lane (lane_kick): suspended -> sleep until the end; no recipient due ->
 * sleep until the earliest retry; a ready idle connection -> take the budget (exact: an
 * admitted send is counted now, just before MAIL FROM is written) and start a
 * transaction, or sleep exactly until the budget allows one; no connection -> open one
 * (only when the budget would admit a send now, so that no connection idles waiting for
 * budget), and its ready callback kicks the lane again.  Wake-ups are timers set to the
 * exact moment something can happen: a throttled lane wakes once per send.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "classify.h"
#include "dsn.h"
#include "lane.h"
#include "log.h"
#include "mx.h"
#include "policy.h"
#include "queue.h"
#include "relay.h"
#include "smtp_out.h"
#include "store.h"
#include "util.h"

#define HISTORY_FILE "relay.lanes"
#define HISTORY_MAX (64u << 20)
#define MAX_LANES 100000
#define SWEEP_MS 30000
#define TARGETS_TTL_NS (UINT64_C(300) * 1000000000u)
#define DSN_MAX (64u << 20)
/* The client recorded in the envelope of the DSNs the relay queues: how it knows, after
 * a restart too, that a failed message from <> is its own bounce (never bounced again,
 * not even to the postmaster: no loops). */
#define DSN_CLIENT "[127.0.0.1] sluice-dsn"

struct lane;
struct rmsg;
struct rconn;

struct rrcpt {
	struct lane *lane;            /* NULL: no route (waits for a reload) */
	uint64_t next_try;            /* CLOCK_REALTIME ns; 0: at once */
	uint32_t attempts;
	char status;                  /* T U D F, as on disk */
	bool busy;                    /* in a transaction */
};

struct lane_item {
	struct rmsg *m;
	struct lane *lane;
	size_t pending;               /* recipients of m in this lane that are T or U */
	size_t scan;                  /* recipients before this are done or elsewhere */
	TAILQ_ENTRY(lane_item) link;
};

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
	struct lane_item *items;
	size_t nitems;
	unsigned busy;                /* transactions under way */
	bool held, deleted, bouncing;  /* bouncing: a DSN of it is being committed */
	bool warned;                  /* control byte QUEUE_CTL_WARNED is 'W' */
	bool is_dsn;                  /* a DSN this relay made: never bounced itself */
	char bounce;                  /* control byte QUEUE_CTL_BOUNCE */
	bool open;
	unsigned flushing;            /* status flushes handed to the flusher, not yet done */
	struct queue_msg qm;
	TAILQ_ENTRY(rmsg) link;
	struct rmsg *hnext;           /* in the relay's table by id */
};

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
	char *domain;                 /* MX lanes: the destination domain */
	struct route_rt *rt;          /* NULL: its route is gone (after a reload) */
	struct lane_budget b;
	TAILQ_HEAD(, lane_item) items;
	TAILQ_HEAD(, rconn) conns;
	unsigned nconns, nidle, nconnecting;
	struct mx_target *targets;
	size_t ntargets;
	uint64_t targets_at;
	unsigned next_target;
	struct mx_query *query;
	bool deciding;                /* a shared budget's answer is awaited */
	struct store_slide_call *call;
	struct event *timer;
	uint64_t delivered, failed, deferred, suspensions, transactions;
	char last[200];               /* the last reply or error, for `sluice lanes` */
	TAILQ_ENTRY(lane) link;
};

enum rconn_state { RC_CONNECTING = 0, RC_IDLE, RC_BUSY };

struct rconn {
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
	TAILQ_ENTRY(rconn) link;
};

struct tx {
	struct rconn *rc;
	struct rmsg *m;
	struct lane *lane;
	size_t n;
	size_t *idx;
	struct str *addrs;
	struct str *body;
	size_t nbody;
	struct smtp_out_msg msg;      /* what smtp_out sends: valid until done() */
};

enum mb_kind { MB_QUEUE = 0, MB_DSN_DONE, MB_CALL, MB_STOP, MB_SETTLED };

/* A message's status bytes to flush, off the relay's loop (fd: a dup of its file's). */
struct flush_req {
	int fd;
	char id[QUEUE_ID_LEN + 1];
	struct flush_req *next;
};

struct mb_item {
	enum mb_kind kind;
	enum queue_event ev;
	char id[QUEUE_ID_LEN + 1];
	int rc;
	int64_t deadline_ms;          /* MB_STOP */
	bool delayed;                 /* MB_DSN_DONE: a delay notice, not a bounce */
	int (*fn)(struct relay *r, void *arg);
	void *arg;
	bool done;
	struct mb_item *next;
};

struct hist_entry {
	char *name;
	uint64_t us;                  /* a send; or, for a suspension, its end (0: resumed) */
	char *why;                    /* a suspension's reason; NULL for a send */
};

struct relay {
	struct conf_rt *crt;          /* current */
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
	int mb_fd;
	struct event *mb_ev;
	pthread_mutex_t mb_lock;
	pthread_cond_t mb_cond;
	struct mb_item *mb_head, **mb_tail;
	bool mb_closed;

	struct mx_resolver *dns;
	struct event *sweep;
	bool stopping;
	struct event *stop_timer;
	int64_t stop_deadline_ms;

	TAILQ_HEAD(rmsg_list, rmsg) msgs;
	struct rmsg **table;          /* by id: chained, a power of two of buckets */
	size_t table_size, nmsgs;
	TAILQ_HEAD(, lane) lanes;
	unsigned nlanes;
	struct relay_stats st;

	/* the flusher: one helper thread that fdatasyncs the statuses a transaction wrote,
	 * so that a slow disk never stalls the connections of the relay's loop */
	pthread_t flusher;
	bool flusher_started, fl_stop;
	pthread_mutex_t fl_lock;
	pthread_cond_t fl_cond;
	struct flush_req *fl_head, **fl_tail;

	int hist_fd;
	uint64_t hist_lines;
	struct hist_entry *hist;      /* loaded at start, for lanes not made yet */
	size_t nhist;
	uint64_t seq;                 /* member ids of shared sends */
};

static void fmt_dur(uint64_t ns, char *out, size_t len);
static void table_remove(struct relay *r, struct rmsg *m);

/* ---- logging ---- */

static void rlog(struct relay *r, enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void rlog(struct relay *r, enum log_level level, const char *fmt, ...)
{
	if (!r->log || (level == LOG_LEVEL_DEBUG && !log_enabled(LOG_LEVEL_DEBUG)))
		return;
	char line[1536];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	r->log(r->log_arg, level, line);
}

/* A peer's text for a log line or the attempt log: printable ASCII, quotes made safe,
 * at most max bytes. */
static void clean_text(const char *in, char *out, size_t max)
{
	size_t o = 0;
	for (const char *p = in; p && *p && o + 1 < max; p++) {
		unsigned char c = (unsigned char)*p;
		out[o++] = c < 0x20 || c >= 0x7f || c == '"' ? '?' : (char)c;
	}
	out[o] = '\0';
}

static void reply_text(const struct smtp_out_result *res, const struct smtp_reply *rep,
		       char *out, size_t len)
{
	char t[SMTP_REPLY_TEXT_MAX + 1];
	if (rep && rep->code) {
		clean_text(rep->text, t, sizeof(t));
		if (rep->enh_class)
			snprintf(out, len, "%d %d.%d.%d %s", rep->code, rep->enh_class,
				 rep->enh_subject, rep->enh_detail, t);
		else
			snprintf(out, len, "%d %s", rep->code, t);
		/* the text may already start with the enhanced code: keep it as the server
		 * sent it instead */
		if (rep->enh_class) {
			char enh[32];
			snprintf(enh, sizeof(enh), "%d.%d.%d", rep->enh_class, rep->enh_subject,
				 rep->enh_detail);
			if (strncmp(t, enh, strlen(enh)) == 0)
				snprintf(out, len, "%d %s", rep->code, t);
		}
	} else if (res) {
		snprintf(out, len, "%s: %s%s%s", smtp_out_stage_name(res->stage),
			 strerror(-res->error), res->why && *res->why ? ": " : "",
			 res->why ? res->why : "");
	} else {
		snprintf(out, len, "no reply");
	}
}

/* ---- mailbox: from other threads ---- */

static int post(struct relay *r, struct mb_item *it)
{
	pthread_mutex_lock(&r->mb_lock);
	if (r->mb_closed) {
		pthread_mutex_unlock(&r->mb_lock);
		return -ESHUTDOWN;
	}
	it->next = NULL;
	*r->mb_tail = it;
	r->mb_tail = &it->next;
	pthread_mutex_unlock(&r->mb_lock);
	uint64_t one = 1;
	ssize_t w = write(r->mb_fd, &one, sizeof(one));
	(void)w; /* an eventfd counter cannot overflow here */
	return 0;
}

static void on_queue_event(void *arg, enum queue_event ev, const char *id)
{
	struct relay *r = arg;
	struct mb_item *it = calloc(1, sizeof(*it));
	if (!it)
		return; /* XXX without memory, the relay learns of it only at the next start */
	it->kind = MB_QUEUE;
	it->ev = ev;
	snprintf(it->id, sizeof(it->id), "%s", id);
	if (post(r, it) < 0)
		free(it);
}

/* Run fn on the relay's loop and wait for its result (control commands).  The relay
 * never waits on a peer, so the wait is short. */
static int call_sync(struct relay *r, int (*fn)(struct relay *r, void *arg), void *arg)
{
	if (!r->started)
		return fn(r, arg);
	struct mb_item it = { .kind = MB_CALL, .fn = fn, .arg = arg };
	int rc = post(r, &it);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&r->mb_lock);
	while (!it.done)
		pthread_cond_wait(&r->mb_cond, &r->mb_lock);
	pthread_mutex_unlock(&r->mb_lock);
	return it.rc;
}

/* ---- the send history (state_dir/relay.lanes) ---- */

/*
 * One line of the history: "NAME US" for a send, "S NAME UNTIL_US WHY" for a suspension
 * (UNTIL 0: lifted; the last line of a lane wins, so a restart does not send into a ban).
 * The length, or -1 when it does not fit.
 */
static int hist_format(char *buf, size_t len, const char *name, uint64_t us, const char *why)
{
	int n = why ? snprintf(buf, len, "S %s %" PRIu64 " %s\n", name, us, why)
		    : snprintf(buf, len, "%s %" PRIu64 "\n", name, us);
	return n > 0 && (size_t)n < len ? n : -1;
}

static void hist_write(struct relay *r, const char *name, uint64_t us, const char *why)
{
	if (r->hist_fd < 0)
		return;
	char line[900];
	int n = hist_format(line, sizeof(line), name, us, why);
	if (n < 0)
		return;
	/* one write per line, O_APPEND: in the page cache at once, so a killed daemon loses
	 * none; a power failure may lose the last ones (XXX not flushed) */
	ssize_t w = write(r->hist_fd, line, (size_t)n);
	(void)w;
	r->hist_lines++;
}

static void hist_append(struct relay *r, const char *lane, uint64_t t_ns)
{
	hist_write(r, lane, (t_ns + 999) / 1000, NULL);
}

static void hist_append_suspension(struct relay *r, const struct lane *l)
{
	char why[300];
	clean_text(l->b.why, why, sizeof(why));
	hist_write(r, l->name, l->b.suspended_until / 1000, why);
}

/* Keep a loaded entry (copies name and why); false when out of memory. */
static bool hist_push(struct relay *r, const char *name, uint64_t us, const char *why)
{
	if (r->nhist % 1024 == 0) {
		struct hist_entry *h = realloc(r->hist, (r->nhist + 1024) * sizeof(*h));
		if (!h)
			return false;
		r->hist = h;
	}
	struct hist_entry *e = &r->hist[r->nhist];
	*e = (struct hist_entry){ .name = strdup(name), .us = us, .why = why ? strdup(why) : NULL };
	if (!e->name || (why && !e->why)) {
		free(e->name);
		free(e->why);
		return false;
	}
	r->nhist++;
	return true;
}

static uint64_t max_window_ns(const struct relay_conf *c)
{
	uint64_t m = 0;
	for (size_t i = 0; i < c->nroutes; i++)
		for (unsigned j = 0; j < c->routes[i].rate.n; j++) {
			uint64_t w = c->routes[i].rate.w[j].period_ns +
				     (uint64_t)c->routes[i].guard_ms * 1000000u;
			if (w > m)
				m = w;
		}
	return m;
}

/* Rewrite the history with what still counts: the lanes' remembered sends, and loaded
 * entries of lanes not made yet. */
static void hist_compact(struct relay *r)
{
	if (!r->crt->conf.state_dir)
		return;
	char path[4096], tmp[4200];
	snprintf(path, sizeof(path), "%s/%s", r->crt->conf.state_dir, HISTORY_FILE);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "we");
	if (!f)
		return;
	uint64_t now_us = realtime_ns() / 1000;
	uint64_t keep = max_window_ns(&r->crt->conf) / 1000 + 1;
	uint64_t lines = 0;
	char line[900];
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		const struct slide *best = NULL;
		for (unsigned i = 0; i < l->b.rate.n; i++)
			if (!best || l->b.win[i].len > best->len)
				best = &l->b.win[i];
		for (uint32_t k = 0; best && k < best->len; k++) {
			uint64_t us = best->at[(best->head + k) % best->cap];
			if (us + keep > now_us && hist_format(line, sizeof(line), l->name, us,
								      NULL) > 0) {
				fputs(line, f);
				lines++;
			}
		}
	}
	TAILQ_FOREACH(l, &r->lanes, link)
		if (l->b.suspended_until / 1000 > now_us) {
			char why[300];
			clean_text(l->b.why, why, sizeof(why));
			if (hist_format(line, sizeof(line), l->name, l->b.suspended_until / 1000,
					why) > 0) {
				fputs(line, f);
				lines++;
			}
		}
	for (size_t i = 0; i < r->nhist; i++) {
		if (!r->hist[i].name)
			continue;
		bool live = r->hist[i].why ? r->hist[i].us > now_us
					   : r->hist[i].us + keep > now_us;
		if (live && hist_format(line, sizeof(line), r->hist[i].name, r->hist[i].us,
					r->hist[i].why) > 0) {
			fputs(line, f);
			lines++;
		}
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0) {
		unlink(tmp);
		return;
	}
	if (r->hist_fd >= 0)
		close(r->hist_fd);
	r->hist_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	r->hist_lines = lines;
}

static int hist_load(struct relay *r, char *err, size_t errlen)
{
	r->hist_fd = -1;
	if (!r->crt->conf.state_dir)
		return 0;
	if (mkdir(r->crt->conf.state_dir, 0700) < 0 && errno != EEXIST) {
		snprintf(err, errlen, "state_dir %s: %s", r->crt->conf.state_dir, strerror(errno));
		return -errno;
	}
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", r->crt->conf.state_dir, HISTORY_FILE);
	char *text = NULL;
	size_t len = 0;
	int rc = file_read_all(path, HISTORY_MAX, &text, &len);
	if (rc < 0 && rc != -ENOENT) {
		snprintf(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	uint64_t now_us = realtime_ns() / 1000;
	uint64_t keep = max_window_ns(&r->crt->conf) / 1000 + 1;
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		if (strncmp(line, "S ", 2) == 0) {
			char *name = line + 2, *sp1 = strchr(name, ' ');
			char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
			if (!sp2)
				continue;
			*sp1 = *sp2 = '\0';
			unsigned long long until = strtoull(sp1 + 1, NULL, 10);
			/* the last line of a lane wins: drop an earlier one */
			for (size_t i = 0; i < r->nhist; i++)
				if (r->hist[i].why && strcmp(r->hist[i].name, name) == 0)
					r->hist[i].us = 0;
			if (until > now_us && !hist_push(r, name, until, sp2 + 1))
				break;
			continue;
		}
		char *sp = strrchr(line, ' ');
		if (!sp || sp == line)
			continue; /* a line cut by a crash: ignored */
		*sp = '\0';
		char *end;
		unsigned long long us = strtoull(sp + 1, &end, 10);
		if (*end || us + keep <= now_us || us > now_us + 60000000ull)
			continue;
		if (!hist_push(r, line, us, NULL))
			break;
	}
	free(text);
	r->hist_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (r->hist_fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	r->hist_lines = r->nhist;
	return 0;
}

/* ---- configuration ---- */

static void conf_rt_free(struct conf_rt *c)
{
	if (!c)
		return;
	for (size_t i = 0; c->routes && i < c->conf.nroutes; i++)
		classify_free(c->routes[i].cls);
	free(c->routes);
	relay_conf_clear(&c->conf);
	free(c);
}

static struct conf_rt *conf_rt_new(const struct relay_conf *src, char *err, size_t errlen)
{
	struct conf_rt *c = calloc(1, sizeof(*c));
	if (!c || relay_conf_copy(src, &c->conf) < 0) {
		free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->routes = calloc(c->conf.nroutes ? c->conf.nroutes : 1, sizeof(*c->routes));
	if (!c->routes) {
		conf_rt_free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < c->conf.nroutes; i++) {
		struct route_conf *rc = &c->conf.routes[i];
		struct route_rt *rt = &c->routes[i];
		rt->conf = rc;
		char e[256];
		rt->cls = classify_new(rc->signals, rc->nsignals, e, sizeof(e));
		if (!rt->cls) {
			snprintf(err, errlen, "route \"%s\": %s", rc->name, e);
			conf_rt_free(c);
			return NULL;
		}
		rt->oc.helo = rc->helo ? rc->helo : c->conf.hostname;
		rt->oc.server_name = rc->sni ? rc->sni : rc->mx ? NULL : rc->host;
		rt->oc.tls = rc->tls;
		rt->oc.ca_file = rc->ca_file;
		rt->oc.auth_user = rc->auth_user;
		rt->oc.auth_password = rc->auth_password;
		rt->oc.auth_mechanisms = rc->auth_mechanisms;
		rt->oc.auth_plaintext = rc->auth_plaintext;
		memcpy(rt->oc.timeout_ms, rc->timeout_ms, sizeof(rt->oc.timeout_ms));
	}
	return c;
}

static struct route_rt *route_rt_by_name(struct conf_rt *c, const char *name)
{
	for (size_t i = 0; i < c->conf.nroutes; i++)
		if (strcmp(c->conf.routes[i].name, name) == 0)
			return &c->routes[i];
	return NULL;
}

static void retired_sweep(struct relay *r)
{
	for (struct conf_rt **p = &r->retired; *p;) {
		if ((*p)->users == 0) {
			struct conf_rt *c = *p;
			*p = c->next;
			conf_rt_free(c);
		} else {
			p = &(*p)->next;
		}
	}
}

/* ---- lanes ---- */

static void lane_kick(struct lane *l);
static void on_lane_timer(evutil_socket_t fd, short what, void *arg);

static uint64_t guard_ns(const struct route_conf *rc)
{
	return (uint64_t)rc->guard_ms * 1000000u;
}

static struct lane *lane_find(struct relay *r, const char *name)
{
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link)
		if (strcmp(l->name, name) == 0)
			return l;
	return NULL;
}

static struct lane *lane_get(struct relay *r, struct route_rt *rt, const char *domain)
{
	char name[600];
	if (rt->conf->mx)
		snprintf(name, sizeof(name), "%s:%s", rt->conf->name, domain);
	else
		snprintf(name, sizeof(name), "%s", rt->conf->name);
	struct lane *l = lane_find(r, name);
	if (l)
		return l;
	if (r->nlanes >= MAX_LANES)
		return NULL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->r = r;
	l->rt = rt;
	l->name = strdup(name);
	l->domain = rt->conf->mx ? strdup(domain) : NULL;
	l->timer = evtimer_new(r->base, on_lane_timer, l);
	TAILQ_INIT(&l->items);
	TAILQ_INIT(&l->conns);
	if (!l->name || (rt->conf->mx && !l->domain) || !l->timer ||
	    lane_budget_init(&l->b, &rt->conf->rate, guard_ns(rt->conf)) < 0) {
		if (l->timer)
			event_free(l->timer);
		free(l->name);
		free(l->domain);
		free(l);
		return NULL;
	}
	uint64_t now = realtime_ns();
	for (size_t i = 0; i < r->nhist; i++)
		if (r->hist[i].name && strcmp(r->hist[i].name, name) == 0) {
			if (!r->hist[i].why) {
				lane_budget_remember(&l->b, r->hist[i].us * 1000);
			} else if (r->hist[i].us * 1000 > now) {
				/* suspended before the restart: still suspended */
				lane_budget_suspend(&l->b, now, (int64_t)(r->hist[i].us * 1000 - now), 0,
						    0, r->hist[i].why);
			}
			free(r->hist[i].name);
			free(r->hist[i].why);
			r->hist[i].name = NULL;
			r->hist[i].why = NULL;
		}
	TAILQ_INSERT_TAIL(&r->lanes, l, link);
	r->nlanes++;
	return l;
}

static void lane_arm(struct lane *l, uint64_t wait_ns)
{
	if (wait_ns == UINT64_MAX) {
		evtimer_del(l->timer);
		return;
	}
	/* evtimer takes microseconds: round up, never wake before the moment */
	uint64_t us = (wait_ns + 999) / 1000;
	/* from the clock now, not the loop's cached time: a timer set late in a callback
	 * would otherwise fire before the moment and find the budget still closed */
	event_base_update_cache_time(l->r->base);
	struct timeval tv = { .tv_sec = (time_t)(us / 1000000), .tv_usec = (suseconds_t)(us % 1000000) };
	evtimer_add(l->timer, &tv);
}

static void on_lane_timer(evutil_socket_t fd, short what, void *arg)
{
	lane_kick(arg);
}

/* ---- messages ---- */

static void msg_close_file(struct rmsg *m)
{
	if (m->open && m->busy == 0) {
		queue_msg_close(&m->qm);
		m->open = false;
	}
}

static void msg_free(struct relay *r, struct rmsg *m)
{
	for (size_t i = 0; i < m->nitems; i++) {
		struct lane_item *it = &m->items[i];
		if (it->lane)
			TAILQ_REMOVE(&it->lane->items, it, link);
	}
	if (m->open)
		queue_msg_close(&m->qm);
	table_remove(r, m);
	TAILQ_REMOVE(&r->msgs, m, link);
	free(m->items);
	free(m->r);
	free(m->addr);
	free(m->block);
	free(m);
}

/* FNV-1a of a queue id: ids are not chosen by peers (the queue makes them). */
static size_t id_hash(const char *id)
{
	uint64_t h = UINT64_C(1469598103934665603);
	for (; *id; id++)
		h = (h ^ (unsigned char)*id) * UINT64_C(1099511628211);
	return (size_t)(h ^ (h >> 32));
}

static struct rmsg *msg_find(struct relay *r, const char *id)
{
	if (!r->table_size)
		return NULL;
	for (struct rmsg *m = r->table[id_hash(id) & (r->table_size - 1)]; m; m = m->hnext)
		if (strcmp(m->id, id) == 0)
			return m;
	return NULL;
}

static int table_add(struct relay *r, struct rmsg *m)
{
	if (r->nmsgs + 1 > r->table_size) {
		size_t ns = r->table_size ? r->table_size * 2 : 1024;
		struct rmsg **nt = calloc(ns, sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		for (size_t i = 0; i < r->table_size; i++)
			for (struct rmsg *e = r->table[i], *next; e; e = next) {
				next = e->hnext;
				size_t b = id_hash(e->id) & (ns - 1);
				e->hnext = nt[b];
				nt[b] = e;
			}
		free(r->table);
		r->table = nt;
		r->table_size = ns;
	}
	size_t b = id_hash(m->id) & (r->table_size - 1);
	m->hnext = r->table[b];
	r->table[b] = m;
	r->nmsgs++;
	return 0;
}

static void table_remove(struct relay *r, struct rmsg *m)
{
	if (!r->table_size)
		return;
	for (struct rmsg **pp = &r->table[id_hash(m->id) & (r->table_size - 1)]; *pp;
	     pp = &(*pp)->hnext)
		if (*pp == m) {
			*pp = m->hnext;
			r->nmsgs--;
			return;
		}
}

static const char *addr_domain(const char *a)
{
	const char *at = strrchr(a, '@');
	return at ? at + 1 : "";
}

static struct lane_item *msg_item(struct rmsg *m, struct lane *l)
{
	for (size_t i = 0; i < m->nitems; i++)
		if (m->items[i].lane == l)
			return &m->items[i];
	return NULL;
}

/* Route every unfinished recipient to its lane and link m into those lanes (in arrival
 * order: messages are routed in arrival order, and a reload routes them again in the
 * same order). */
static int msg_route(struct relay *r, struct rmsg *m)
{
	for (size_t i = 0; i < m->nitems; i++)
		if (m->items[i].lane)
			TAILQ_REMOVE(&m->items[i].lane->items, &m->items[i], link);
	free(m->items);
	m->items = NULL;
	m->nitems = 0;
	size_t cap = 0;
	for (size_t i = 0; i < m->nrcpt; i++) {
		struct rrcpt *rr = &m->r[i];
		rr->lane = NULL;
		if (rr->status != QUEUE_TODO && rr->status != QUEUE_UNCERTAIN)
			continue;
		char dom[256];
		snprintf(dom, sizeof(dom), "%s", addr_domain(m->addr[i]));
		for (char *p = dom; *p; p++)
			if (*p >= 'A' && *p <= 'Z')
				*p = (char)(*p - 'A' + 'a');
		const struct route_conf *rc = relay_conf_route(&r->crt->conf, dom);
		if (!rc)
			continue;
		struct route_rt *rt = &r->crt->routes[rc - r->crt->conf.routes];
		struct lane *l = lane_get(r, rt, dom);
		if (!l)
			return -ENOMEM;
		rr->lane = l;
		if (msg_item(m, l))
			continue;
		if (m->nitems == cap) {
			size_t nc = cap ? cap * 2 : 2;
			struct lane_item *it = realloc(m->items, nc * sizeof(*it));
			if (!it)
				return -ENOMEM;
			/* items are linked into lanes by address: relink after a move */
			m->items = it;
			cap = nc;
		}
		m->items[m->nitems++] = (struct lane_item){ .m = m, .lane = l };
	}
	for (size_t i = 0; i < m->nrcpt; i++) {
		struct lane_item *it = m->r[i].lane ? msg_item(m, m->r[i].lane) : NULL;
		if (it)
			it->pending++;
	}
	/* Insert each item in arrival order (messages are loaded in arrival order; a
	 * reload routes in order too, so appending keeps the order). */
	for (size_t i = 0; i < m->nitems; i++)
		TAILQ_INSERT_TAIL(&m->items[i].lane->items, &m->items[i], link);
	return 0;
}

static void lanes_of_msg_kick(struct rmsg *m)
{
	for (size_t i = 0; i < m->nitems; i++)
		lane_kick(m->items[i].lane);
}

static void msg_check_done(struct relay *r, struct rmsg *m);

static int msg_load(struct relay *r, const char *id)
{
	if (msg_find(r, id))
		return 0;
	struct queue_msg qm;
	const char *why = NULL;
	int rc = queue_msg_open(r->qd, id, &qm, &why);
	if (rc < 0) {
		if (rc != -ENOENT)
			rlog(r, LOG_LEVEL_ERROR, "qid=%s cannot be opened for delivery: %s", id,
			     why ? why : strerror(-rc));
		return rc;
	}
	const struct queue_index *ix = &qm.ix;
	struct rmsg *m = calloc(1, sizeof(*m));
	size_t blen = ix->env.sender.len + 1;
	for (size_t i = 0; i < ix->nrcpt; i++)
		blen += ix->rcpt[i].addr.len + 1;
	if (m) {
		m->block = malloc(blen);
		m->addr = calloc(ix->nrcpt, sizeof(*m->addr));
		m->r = calloc(ix->nrcpt, sizeof(*m->r));
	}
	if (!m || !m->block || !m->addr || !m->r) {
		if (m) {
			free(m->block);
			free(m->addr);
			free(m->r);
			free(m);
		}
		queue_msg_close(&qm);
		return -ENOMEM;
	}
	snprintf(m->id, sizeof(m->id), "%s", ix->env.id);
	m->arrival_us = ix->env.arrival_us;
	m->size = ix->body_len;
	m->flags = ix->env.flags;
	char *p = m->block;
	memcpy(p, ix->env.sender.ptr, ix->env.sender.len);
	p[ix->env.sender.len] = '\0';
	m->sender = p;
	p += ix->env.sender.len + 1;
	m->nrcpt = ix->nrcpt;
	for (size_t i = 0; i < ix->nrcpt; i++) {
		memcpy(p, ix->rcpt[i].addr.ptr, ix->rcpt[i].addr.len);
		p[ix->rcpt[i].addr.len] = '\0';
		m->addr[i] = p;
		p += ix->rcpt[i].addr.len + 1;
		m->r[i].status = ix->rcpt[i].status;
	}
	m->held = ix->control[QUEUE_CTL_HOLD] == 'H';
	m->bounce = ix->control[QUEUE_CTL_BOUNCE];
	m->warned = ix->control[QUEUE_CTL_WARNED] == 'W';
	m->is_dsn = ix->env.sender.len == 0 && ix->env.client.len == strlen(DSN_CLIENT) &&
		    memcmp(ix->env.client.ptr, DSN_CLIENT, ix->env.client.len) == 0;
	queue_msg_close(&qm);
	TAILQ_INSERT_TAIL(&r->msgs, m, link);
	rc = table_add(r, m);
	if (rc == 0)
		rc = msg_route(r, m);
	if (rc < 0) {
		msg_free(r, m);
		return rc;
	}
	for (size_t i = 0; i < m->nrcpt; i++)
		if ((m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN) &&
		    !m->r[i].lane) {
			rlog(r, LOG_LEVEL_WARNING, "qid=%s rcpt=<%.200s> no route matches its domain: "
			     "it stays queued", m->id, m->addr[i]);
		}
	msg_check_done(r, m);
	return 0;
}

/* ---- attempts and statuses ---- */

static int msg_open_file(struct relay *r, struct rmsg *m)
{
	if (m->open)
		return 0;
	const char *why = NULL;
	int rc = queue_msg_open(r->qd, m->id, &m->qm, &why);
	if (rc < 0) {
		rlog(r, LOG_LEVEL_ERROR, "qid=%s cannot be opened: %s", m->id, why ? why : strerror(-rc));
		return rc;
	}
	m->open = true;
	return 0;
}

/* One line of the attempt history: "ts=US rcpt=I status=S lane=L mta=M dsn=X.Y.Z reply=..."
 * -- the reply last, as it may hold anything but a newline.  The DSN reads these back. */
static void attempt_log(struct relay *r, struct rmsg *m, size_t i, const char *status,
			const char *lane, const char *mta, const char *dsn, const char *reply)
{
	char line[1600];
	int n = snprintf(line, sizeof(line), "ts=%" PRIu64 " rcpt=%zu status=%s lane=%s mta=%s "
			 "dsn=%s reply=%s", realtime_ns() / 1000, i, status, lane,
			 mta && *mta ? mta : "-", dsn && *dsn ? dsn : "-", reply ? reply : "");
	if (n > 0)
		queue_log_append(r->qd, m->id, str_make(line, (size_t)n < sizeof(line) ? (size_t)n
								   : sizeof(line) - 1));
}

/*
 * The administrator's line for one recipient's attempt (sluiced(8), LOGGING), like
 * Postfix's "status=sent" lines:
 *   delivery qid=Q rcpt=<A> lane=L relay=NAME[IP]:PORT status=S dsn=X.Y.Z reply="..."
 *            delay=1.2s attempts=N
 * status: sent, deferred, bounced, suspended, uncertain.  The address and the reply are
 * quoted (log_quote): the reply is the relay's text, the address came from a client.
 */
static void delivery_log(struct relay *r, enum log_level level, const struct rmsg *m, size_t i,
			 const char *lane, const char *relay, const char *status, const char *dsn,
			 const char *reply, const char *note)
{
	char addr[820], text[1300];
	log_quote(addr, sizeof(addr), str_cstr(m->addr[i]), 200);
	log_quote(text, sizeof(text), str_cstr(reply ? reply : ""), 300);
	uint64_t now_us = realtime_ns() / 1000;
	double delay = m->arrival_us && now_us > m->arrival_us
			       ? (double)(now_us - m->arrival_us) / 1e6 : 0.0;
	rlog(r, level, "delivery qid=%s rcpt=<%s> lane=%s relay=%s status=%s dsn=%s reply=\"%s\" "
	     "delay=%.1fs attempts=%u%s%s", m->id, addr, lane && *lane ? lane : "-",
	     relay && *relay ? relay : "-", status, dsn && *dsn ? dsn : "-", text, delay,
	     (unsigned)m->r[i].attempts, note ? " " : "", note ? note : "");
}

static void set_status(struct relay *r, struct rmsg *m, size_t i, char st)
{
	struct rrcpt *rr = &m->r[i];
	bool was_pending = rr->status == QUEUE_TODO || rr->status == QUEUE_UNCERTAIN;
	int rc = m->open ? queue_set_status(r->q, &m->qm, i, st) : -EBADF;
	if (rc < 0) {
		/* the byte is not on disk: the recipient is sent again after a restart */
		rlog(r, LOG_LEVEL_ERROR, "qid=%s rcpt=%zu status %c cannot be written: %s", m->id, i, st,
		     strerror(-rc));
	}
	rr->status = st;
	bool pending = st == QUEUE_TODO || st == QUEUE_UNCERTAIN;
	if (was_pending && !pending && rr->lane) {
		struct lane_item *it = msg_item(m, rr->lane);
		if (it && it->pending)
			it->pending--;
	}
}

static uint64_t jitter(uint64_t ns)
{
	/* +-10%: retries of messages refused together spread out */
	uint64_t span = ns / 5;
	return ns - ns / 10 + (span ? (uint64_t)random() % span : 0);
}

static void rcpt_retry(struct relay *r, struct rmsg *m, size_t i, int64_t hint_ms)
{
	struct rrcpt *rr = &m->r[i];
	const struct relay_conf *c = &r->crt->conf;
	uint64_t d;
	if (hint_ms > 0) {
		d = (uint64_t)hint_ms * 1000000u;
	} else {
		d = (uint64_t)c->retry_min_ms * 1000000u;
		for (uint32_t k = 1; k < rr->attempts && d < (uint64_t)c->retry_max_ms * 1000000u; k++)
			d *= 2;
		if (d > (uint64_t)c->retry_max_ms * 1000000u)
			d = (uint64_t)c->retry_max_ms * 1000000u;
	}
	rr->next_try = realtime_ns() + jitter(d);
	r->st.deferred++;
	if (rr->lane)
		rr->lane->deferred++;
}

/* ---- the flusher ---- */

static void *flusher_main(void *arg)
{
	struct relay *r = arg;
	pthread_mutex_lock(&r->fl_lock);
	for (;;) {
		while (!r->fl_head && !r->fl_stop)
			pthread_cond_wait(&r->fl_cond, &r->fl_lock);
		struct flush_req *f = r->fl_head;
		if (!f)
			break;
		r->fl_head = NULL;
		r->fl_tail = &r->fl_head;
		pthread_mutex_unlock(&r->fl_lock);
		while (f) {
			struct flush_req *next = f->next;
			struct mb_item *it = calloc(1, sizeof(*it));
			int rc = fdatasync(f->fd) < 0 ? -errno : 0;
			close(f->fd);
			if (it) {
				it->kind = MB_SETTLED;
				it->rc = rc;
				snprintf(it->id, sizeof(it->id), "%s", f->id);
				if (post(r, it) < 0)
					free(it);
			}
			free(f);
			f = next;
		}
		pthread_mutex_lock(&r->fl_lock);
	}
	pthread_mutex_unlock(&r->fl_lock);
	return NULL;
}

/*
 * The status bytes a transaction wrote go to disk on the flusher's thread; the message
 * is removed or bounced only once they are there (MB_SETTLED).  Without the flusher (or
 * memory for it), the flush is made here.
 */
static void flush_post(struct relay *r, struct rmsg *m)
{
	struct flush_req *f = r->flusher_started ? calloc(1, sizeof(*f)) : NULL;
	int fd = f && m->open ? fcntl(m->qm.fd, F_DUPFD_CLOEXEC, 0) : -1;
	if (fd < 0) {
		free(f);
		int e = m->open ? queue_msg_sync(&m->qm) : 0;
		if (e < 0)
			rlog(r, LOG_LEVEL_ERROR, "qid=%s statuses cannot be flushed: %s", m->id,
			     strerror(-e));
		return;
	}
	f->fd = fd;
	snprintf(f->id, sizeof(f->id), "%s", m->id);
	m->flushing++;
	pthread_mutex_lock(&r->fl_lock);
	*r->fl_tail = f;
	r->fl_tail = &f->next;
	pthread_cond_signal(&r->fl_cond);
	pthread_mutex_unlock(&r->fl_lock);
}

/* ---- bounces ---- */

struct dsn_done_ctx {
	struct relay *r;
	char id[QUEUE_ID_LEN + 1];
	bool delayed;
};

static void on_dsn_committed(void *arg, int rc)
{
	struct dsn_done_ctx *d = arg;
	struct mb_item *it = calloc(1, sizeof(*it));
	if (it) {
		it->kind = MB_DSN_DONE;
		it->rc = rc;
		it->delayed = d->delayed;
		snprintf(it->id, sizeof(it->id), "%s", d->id);
		if (post(d->r, it) < 0)
			free(it);
	}
	free(d);
}

struct fail_info {
	char mta[256];
	char dsn[16];
	char reply[1100];
	uint64_t ts;
};

/* The value of " key=" in an attempt log line, up to the next space; "-" is empty. */
static void log_field(const char *line, const char *key, char *out, size_t len)
{
	const char *q = strstr(line, key);
	out[0] = '\0';
	if (!q)
		return;
	q += strlen(key);
	size_t n = strcspn(q, " ");
	snprintf(out, len, "%.*s", (int)n, q);
	if (strcmp(out, "-") == 0)
		out[0] = '\0';
}

/* The last line with status (failed, deferred) of each recipient, from the attempt log. */
static void read_failures(struct relay *r, struct rmsg *m, struct fail_info *fi,
			  const char *status)
{
	char want[32];
	snprintf(want, sizeof(want), " status=%s ", status);
	struct buf lb;
	buf_init(&lb, 8u << 20);
	if (queue_log_read(r->qd, m->id, &lb, 8u << 20) < 0 || lb.len == 0) {
		buf_clear(&lb);
		return;
	}
	buf_append_byte(&lb, 0);
	for (char *line = lb.ptr, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		char *p = strstr(line, " rcpt=");
		if (!p || !strstr(line, want))
			continue;
		size_t i = strtoul(p + 6, NULL, 10);
		if (i >= m->nrcpt)
			continue;
		struct fail_info *f = &fi[i];
		f->ts = strtoull(line + 3, NULL, 10);
		log_field(line, " mta=", f->mta, sizeof(f->mta));
		log_field(line, " dsn=", f->dsn, sizeof(f->dsn));
		const char *q = strstr(line, " reply=");
		snprintf(f->reply, sizeof(f->reply), "%s", q ? q + 7 : "");
	}
	buf_clear(&lb);
}

static int collect_body(void *arg, struct str chunk)
{
	struct tx *t = arg;
	t->body[t->nbody++] = chunk;
	return 0;
}

static void bounce_done(struct relay *r, struct rmsg *m)
{
	if (msg_open_file(r, m) < 0)
		return;
	queue_set_control(r->q, &m->qm, QUEUE_CTL_BOUNCE, 'S');
	m->bounce = 'S';
	enum queue_msg_state st;
	int rc = queue_settle(r->q, &m->qm, &st);
	m->bouncing = false;
	if (rc == 0 && st == QUEUE_MSG_FINISHED) {
		rlog(r, LOG_LEVEL_INFO, "qid=%s removed: finished", m->id);
		msg_free(r, m);
	} else {
		msg_close_file(m);
	}
}

/*
 * Queue the DSN of m: of its failed recipients (all of them at once: one DSN per
 * message), or, delayed, a delay notice for the recipients still waiting.
 */
static void dsn_start(struct relay *r, struct rmsg *m, bool delayed)
{
	const struct relay_conf *c = &r->crt->conf;
	const char *to = m->sender;
	if (!*to && delayed) {
		/* no delay notice for mail from <>, not even to the postmaster */
		m->warned = true;
		return;
	}
	if (!*to) {
		if (!c->postmaster || m->is_dsn) {
			rlog(r, LOG_LEVEL_NOTICE, "qid=%s bounce not sent: the sender is null <>%s; "
			     "failed recipients are in the attempt log", m->id,
			     m->is_dsn ? " (it is a bounce itself)" : "");
			r->st.dsn_skipped++;
			bounce_done(r, m);
			return;
		}
		to = c->postmaster;
	}
	if (msg_open_file(r, m) < 0)
		return;
	size_t nf = 0;
	for (size_t i = 0; i < m->nrcpt; i++)
		nf += delayed ? m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN
			      : m->r[i].status == QUEUE_FAILED;
	struct fail_info *fi = calloc(m->nrcpt, sizeof(*fi));
	struct dsn_rcpt *dr = calloc(nf ? nf : 1, sizeof(*dr));
	struct tx body = { 0 };
	body.body = calloc(m->qm.ix.nbody ? m->qm.ix.nbody : 1, sizeof(*body.body));
	struct buf out;
	buf_init(&out, DSN_MAX);
	int rc = fi && dr && body.body ? 0 : -ENOMEM;
	if (rc == 0) {
		read_failures(r, m, fi, delayed ? "deferred" : "failed");
		size_t k = 0;
		for (size_t i = 0; i < m->nrcpt; i++) {
			bool pending = m->r[i].status == QUEUE_TODO ||
				       m->r[i].status == QUEUE_UNCERTAIN;
			if (delayed ? !pending : m->r[i].status != QUEUE_FAILED)
				continue;
			dr[k++] = (struct dsn_rcpt){
				.addr = str_cstr(m->addr[i]),
				.action = delayed ? DSN_DELAYED : DSN_FAILED,
				.status = str_cstr(fi[i].dsn),
				.remote_mta = str_cstr(fi[i].mta),
				.diagnostic = str_cstr(fi[i].reply),
				.last_attempt_us = fi[i].ts,
			};
		}
		rc = queue_file_body(m->qm.map, m->qm.size, &m->qm.ix, collect_body, &body);
		struct dsn_info info = {
			.reporting_mta = str_cstr(c->hostname),
			.sender = str_cstr(to),
			.queue_id = str_cstr(m->id),
			.arrival_us = m->arrival_us,
			.now_us = realtime_ns() / 1000,
			.boundary_seed = str_cstr(m->id),
		};
		if (rc == 0)
			rc = dsn_format(&info, dr, k, body.body, body.nbody, &out);
	}
	struct queue_new *qn = NULL;
	if (rc == 0) {
		struct queue_envelope env = {
			.sender = STR_NULL,
			.client = str_cstr(DSN_CLIENT),
			.helo = str_cstr(c->hostname),
		};
		/* an address that needs SMTPUTF8, and 8-bit original headers (dsn.h): say so
		 * when sending */
		for (const char *p = to; *p; p++)
			if ((unsigned char)*p >= 0x80) {
				env.flags |= QUEUE_SMTPUTF8;
				break;
			}
		for (size_t i = 0; i < out.len; i++)
			if ((unsigned char)out.ptr[i] >= 0x80) {
				env.flags |= QUEUE_8BITMIME;
				break;
			}
		rc = queue_new_begin(r->q, &env, &qn);
		if (rc == 0)
			rc = queue_new_rcpt(qn, str_cstr(to));
		if (rc == 0)
			rc = queue_new_body(qn, str_make(out.ptr, out.len));
	}
	if (rc == 0) {
		struct dsn_done_ctx *d = calloc(1, sizeof(*d));
		if (!d) {
			rc = -ENOMEM;
		} else {
			d->r = r;
			d->delayed = delayed;
			snprintf(d->id, sizeof(d->id), "%s", m->id);
			char dsn_id[QUEUE_ID_LEN + 1];
			snprintf(dsn_id, sizeof(dsn_id), "%s", queue_new_id(qn));
			rc = queue_new_commit(qn, on_dsn_committed, d);
			qn = NULL;
			if (rc < 0) {
				free(d);
			} else {
				m->bouncing = true;
				rlog(r, LOG_LEVEL_INFO, "qid=%s %s queued as %s to <%.200s>: %zu %s "
				     "recipient(s)", m->id, delayed ? "delay notice" : "bounce", dsn_id,
				     to, nf, delayed ? "waiting" : "failed");
			}
		}
	}
	queue_new_abort(qn);
	if (rc < 0)
		rlog(r, LOG_LEVEL_ERROR, "qid=%s bounce cannot be queued: %s (tried again later)", m->id,
		     strerror(-rc));
	buf_clear(&out);
	free(body.body);
	free(dr);
	free(fi);
	msg_close_file(m);
}

static void msg_check_done(struct relay *r, struct rmsg *m)
{
	if (m->busy || m->bouncing || m->flushing)
		return;
	if (m->deleted) {
		msg_free(r, m);
		return;
	}
	bool failed = false;
	for (size_t i = 0; i < m->nrcpt; i++) {
		char s = m->r[i].status;
		if (s == QUEUE_TODO || s == QUEUE_UNCERTAIN)
			return;
		failed |= s == QUEUE_FAILED;
	}
	if (failed && m->bounce != 'S') {
		if (m->bounce != 'P' && msg_open_file(r, m) == 0) {
			/* the bounce is due (doc/QUEUE.md): recovery queues it if we crash */
			queue_set_control(r->q, &m->qm, QUEUE_CTL_BOUNCE, 'P');
			queue_msg_sync(&m->qm);
			m->bounce = 'P';
			msg_close_file(m);
		}
		dsn_start(r, m, false);
		return;
	}
	/* finished, and every status byte is on disk (flushed where it was written) */
	if (m->open && queue_msg_sync(&m->qm) < 0)
		return;
	queue_remove_finished(r->q, m->id);
	rlog(r, LOG_LEVEL_INFO, "qid=%s removed: finished", m->id);
	msg_free(r, m);
}

/* ---- connections ---- */

/* The connection's memory goes with its smtp_out's (which may finish a QUIT after the
 * relay is done with it): the configuration it points to stays until then. */
static void on_conn_freed(void *arg)
{
	struct rconn *rc = arg;
	struct relay *r = rc->r;
	rc->crt->users--;
	free(rc);
	retired_sweep(r);
}

/* Take a connection out of its lane's books. */
static void conn_detach(struct rconn *rc)
{
	struct lane *l = rc->lane;
	struct relay *r = rc->r;
	TAILQ_REMOVE(&l->conns, rc, link);
	l->nconns--;
	if (rc->st == RC_IDLE)
		l->nidle--;
	else if (rc->st == RC_CONNECTING)
		l->nconnecting--;
	r->st.active_connections--;
	if (rc->idle_timer) {
		event_free(rc->idle_timer);
		rc->idle_timer = NULL;
	}
	class_slot_release(rc->slot);
	rc->slot = NULL;
	if (r->stopping && r->st.active_connections == 0)
		event_base_loopexit(r->base, NULL);
}

/* Close a connection: QUIT when it is usable and quit is asked (not while stopping),
 * else at once.  rc must not be used after this. */
static void conn_close(struct rconn *rc, bool quit)
{
	struct smtp_out *c = rc->c;
	bool stopping = rc->r->stopping;
	conn_detach(rc);
	rc->c = NULL;
	if (quit && !stopping && smtp_out_usable(c))
		smtp_out_quit(c);
	else
		smtp_out_free(c);
}

static void lane_close_idle(struct lane *l)
{
	struct rconn *rc, *next;
	for (rc = TAILQ_FIRST(&l->conns); rc; rc = next) {
		next = TAILQ_NEXT(rc, link);
		if (rc->st == RC_IDLE || rc->st == RC_CONNECTING)
			conn_close(rc, true);
	}
}

static void on_idle_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct rconn *rc = arg;
	conn_close(rc, true);
}

static void conn_idle(struct rconn *rc)
{
	rc->st = RC_IDLE;
	rc->lane->nidle++;
	struct timeval tv = timeval_from_ms((uint64_t)rc->r->crt->conf.idle_ms);
	evtimer_add(rc->idle_timer, &tv);
}

static void lane_signal(struct lane *l, const struct classify_result *cr, const char *text)
{
	struct relay *r = l->r;
	uint64_t now = realtime_ns();
	const struct relay_conf *c = &r->crt->conf;
	snprintf(l->last, sizeof(l->last), "%s", text);
	if (cr->verdict == CLASSIFY_SLOW) {
		lane_budget_slow(&l->b);
		rlog(r, LOG_LEVEL_WARNING, "lane=%s slowed to %u%% of its rate: \"%s\" (signal %s)",
		     l->name, (unsigned)(l->b.factor / 10000), text, cr->signal ? cr->signal : "-");
		if (cr->for_ms > 0) {
			lane_budget_suspend(&l->b, now, cr->for_ms * 1000000, 0, 0, text);
			l->suspensions++;
			r->st.suspensions++;
			hist_append_suspension(r, l);
			lane_close_idle(l);
		}
		return;
	}
	uint64_t len = lane_budget_suspend(&l->b, now, cr->for_ms >= 0 ? cr->for_ms * 1000000 : -1,
					   (uint64_t)c->suspend_min_ms * 1000000u,
					   (uint64_t)c->suspend_max_ms * 1000000u, text);
	l->suspensions++;
	r->st.suspensions++;
	hist_append_suspension(r, l);
	rlog(r, LOG_LEVEL_WARNING, "lane=%s suspended for %" PRIu64 "s: \"%s\" (signal %s); no "
	     "recipient changes state", l->name, (len + 999999999) / 1000000000, text,
	     cr->signal ? cr->signal : "-");
	lane_close_idle(l);
}

static void on_ready(void *arg, struct smtp_out *c, const struct smtp_out_result *failure);
static void lane_fail_all(struct lane *l, const char *dsn, const char *text);
static void on_resolved(void *arg, int error, const struct mx_target *t, size_t n);

static void lane_resolve(struct lane *l)
{
	const struct route_conf *rc = l->rt->conf;
	if (l->query)
		return;
	const char *name = rc->mx ? l->domain : rc->host;
	uint16_t port = rc->mx ? 25 : rc->port;
	struct mx_query *q = NULL;
	l->query = (struct mx_query *)1; /* resolving: done() may run before mx_lookup returns */
	int e = mx_lookup(l->r->dns, name, rc->mx, port, on_resolved, l, &q);
	if (e == -EINVAL && rc->mx) {
		/* not a name DNS can hold (raw UTF-8, an overlong label): permanent */
		l->query = NULL;
		char text[400];
		snprintf(text, sizeof(text), "%.200s is not a valid domain name", name);
		lane_fail_all(l, "5.1.2", text);
		return;
	}
	if (e < 0) {
		l->query = NULL;
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = -1,
					      .signal = "dns" };
		char text[300];
		snprintf(text, sizeof(text), "cannot look up %.200s: %s", name, strerror(-e));
		lane_signal(l, &cr, text);
		return;
	}
	if (l->query)
		l->query = q;
}

static void lane_fail_all(struct lane *l, const char *dsn, const char *text)
{
	struct relay *r = l->r;
	struct lane_item *it, *next;
	for (it = TAILQ_FIRST(&l->items); it; it = next) {
		next = TAILQ_NEXT(it, link);
		struct rmsg *m = it->m;
		if (m->held || m->deleted || m->bouncing || msg_open_file(r, m) < 0)
			continue;
		for (size_t i = 0; i < m->nrcpt; i++) {
			struct rrcpt *rr = &m->r[i];
			if (rr->lane != l || rr->busy ||
			    (rr->status != QUEUE_TODO && rr->status != QUEUE_UNCERTAIN))
				continue;
			set_status(r, m, i, QUEUE_FAILED);
			attempt_log(r, m, i, "failed", l->name, "", dsn, text);
			delivery_log(r, LOG_LEVEL_NOTICE, m, i, l->name, "", "bounced", dsn, text,
				     NULL);
			r->st.failed++;
			l->failed++;
		}
		if (m->busy == 0) {
			enum queue_msg_state st;
			queue_settle(r->q, &m->qm, &st);
		}
		msg_check_done(r, m);
	}
}

static void on_resolved(void *arg, int error, const struct mx_target *t, size_t n)
{
	struct lane *l = arg;
	struct relay *r = l->r;
	l->query = NULL;
	if (error == -ECANCELED || !l->rt)
		return;
	const char *name = l->rt->conf->mx ? l->domain : l->rt->conf->host;
	if (error == -ENOENT || error == -ENODATA) {
		char text[400];
		if (error == -ENODATA)
			snprintf(text, sizeof(text), "%.200s does not accept mail (null MX)", name);
		else
			snprintf(text, sizeof(text), "%.200s: no such domain, or no address", name);
		if (l->rt->conf->mx) {
			rlog(r, LOG_LEVEL_NOTICE, "lane=%s %s: its recipients fail", l->name, text);
			lane_fail_all(l, error == -ENODATA ? "5.1.10" : "5.1.2", text);
			return;
		}
		/* a smarthost that does not resolve is the operator's to fix: no bounce */
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = -1,
					      .signal = "dns" };
		lane_signal(l, &cr, text);
		lane_kick(l);
		return;
	}
	if (error < 0 || n == 0) {
		char text[300];
		snprintf(text, sizeof(text), "cannot look up %.200s: temporary DNS failure", name);
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = -1,
					      .signal = "dns" };
		lane_signal(l, &cr, text);
		lane_kick(l);
		return;
	}
	struct mx_target *copy = calloc(n, sizeof(*copy));
	if (!copy)
		return;
	memcpy(copy, t, n * sizeof(*copy));
	free(l->targets);
	l->targets = copy;
	l->ntargets = n;
	l->targets_at = realtime_ns();
	l->next_target = 0;
	lane_kick(l);
}

static void lane_connect(struct lane *l)
{
	struct relay *r = l->r;
	uint64_t now = realtime_ns();
	if (!l->ntargets || now - l->targets_at > TARGETS_TTL_NS) {
		lane_resolve(l);
		return;
	}
	/* an outgoing session takes a slot in its host class (Sendmail's XLA): none left,
	 * and the mail waits */
	const struct mx_target *tg = &l->targets[l->next_target % l->ntargets];
	struct class_slot *slot = NULL;
	if (r->rules) {
		struct ipaddr ip = { 0 };
		if (tg->addr.ss_family == AF_INET) {
			ip.family = 4;
			memcpy(ip.b, &((const struct sockaddr_in *)&tg->addr)->sin_addr, 4);
		} else {
			ip.family = 6;
			memcpy(ip.b, &((const struct sockaddr_in6 *)&tg->addr)->sin6_addr, 16);
		}
		const char *cls = NULL;
		if (policy_class_enter_outbound(r->rules, &ip, str_cstr(tg->host), &slot, &cls) == 0) {
			rlog(r, LOG_LEVEL_DEBUG, "lane=%s class %s is full: the mail waits", l->name,
			     cls ? cls : "?");
			/* XXX polled: a slot freed by an incoming session wakes no one */
			lane_arm(l, UINT64_C(1000000000));
			return;
		}
	}
	struct rconn *rc = calloc(1, sizeof(*rc));
	if (!rc) {
		class_slot_release(slot);
		return;
	}
	rc->slot = slot;
	rc->r = r;
	rc->lane = l;
	rc->crt = r->crt;
	rc->cls = l->rt->cls;
	rc->target = l->next_target % l->ntargets;
	const struct mx_target *t = &l->targets[rc->target];
	const struct route_conf *conf = l->rt->conf;
	rc->idle_timer = evtimer_new(r->base, on_idle_timeout, rc);
	/* the connection keeps pointers into its conf_rt, which lives while it is used */
	rc->oc = l->rt->oc;
	snprintf(rc->host, sizeof(rc->host), "%s", t->host);
	if (conf->mx && !conf->sni)
		rc->oc.server_name = rc->host; /* the MX host's name: what its certificate holds */
	const struct smtp_out_conf *oc = &rc->oc;
	rc->c = rc->idle_timer ? smtp_out_new(r->base, oc, (const struct sockaddr *)&t->addr,
					      t->addrlen,
					      conf->source.ss_family ? (const struct sockaddr *)&conf->source : NULL,
					      conf->sourcelen)
			       : NULL;
	if (!rc->c) {
		if (rc->idle_timer)
			event_free(rc->idle_timer);
		class_slot_release(rc->slot);
		free(rc);
		return;
	}
	smtp_out_set_peer_name(rc->c, t->host);
	smtp_out_set_ready(rc->c, on_ready, rc);
	smtp_out_set_freed(rc->c, on_conn_freed, rc);
	rc->st = RC_CONNECTING;
	r->crt->users++;
	TAILQ_INSERT_TAIL(&l->conns, rc, link);
	l->nconns++;
	l->nconnecting++;
	r->st.connections++;
	r->st.active_connections++;
}

static void on_ready(void *arg, struct smtp_out *c, const struct smtp_out_result *failure)
{
	struct rconn *rc = arg;
	struct lane *l = rc->lane;
	struct relay *r = rc->r;
	if (!failure) {
		if (rc->st == RC_CONNECTING)
			l->nconnecting--;
		l->next_target = rc->target;
		conn_idle(rc);
		if (r->stopping) {
			conn_close(rc, true);
			return;
		}
		lane_kick(l);
		return;
	}
	bool setup = rc->st == RC_CONNECTING;
	struct classify *cls = l->rt ? l->rt->cls : NULL;
	char text[1200];
	reply_text(failure, failure->reply.code ? &failure->reply : NULL, text, sizeof(text));
	char peer[300];
	snprintf(peer, sizeof(peer), "%s", smtp_out_peer(c));
	conn_close(rc, false);
	if (!setup || r->stopping || !cls) {
		lane_kick(l);
		return;
	}
	rlog(r, LOG_LEVEL_NOTICE, "lane=%s mta=%s session failed at %s: \"%s\"", l->name, peer,
	     smtp_out_stage_name(failure->stage), text);
	/* a host that cannot be reached: the next address first, before the lane waits */
	if (failure->error < 0 && failure->stage == SMTP_STAGE_CONNECT && l->ntargets > 1 &&
	    (l->next_target + 1) % l->ntargets != 0) {
		l->next_target++;
		lane_kick(l);
		return;
	}
	l->next_target = 0;
	struct classify_result cr;
	classify_reply(cls, failure->stage, failure->error,
		       failure->reply.code ? &failure->reply : NULL, &cr);
	if (cr.verdict != CLASSIFY_SLOW)
		cr.verdict = CLASSIFY_SUSPEND; /* no recipient was involved */
	lane_signal(l, &cr, text);
	lane_kick(l);
}

/* ---- transactions ---- */

static bool rcpt_due(const struct rmsg *m, size_t i, const struct lane *l, uint64_t now,
		     uint64_t *next)
{
	const struct rrcpt *rr = &m->r[i];
	if (rr->lane != l || rr->busy ||
	    (rr->status != QUEUE_TODO && rr->status != QUEUE_UNCERTAIN))
		return false;
	if (rr->next_try > now) {
		if (rr->next_try < *next)
			*next = rr->next_try;
		return false;
	}
	return true;
}

/* The oldest message with recipients due in l; up to max of them into idx.
 * XXX each call walks past the messages whose recipients all wait for a retry time: a
 * lane with many deferred messages pays for them at every transaction (a heap of retry
 * times per lane would not). */
static struct lane_item *lane_pick(struct lane *l, uint64_t now, size_t max, size_t *idx,
				   size_t *ret_n, uint64_t *next)
{
	struct lane_item *it;
	TAILQ_FOREACH(it, &l->items, link) {
		struct rmsg *m = it->m;
		if (!it->pending || m->held || m->deleted || m->bouncing)
			continue;
		while (it->scan < m->nrcpt &&
		       (m->r[it->scan].lane != l || (m->r[it->scan].status != QUEUE_TODO &&
						     m->r[it->scan].status != QUEUE_UNCERTAIN)))
			it->scan++;
		size_t n = 0;
		for (size_t i = it->scan; i < m->nrcpt && n < max; i++)
			if (rcpt_due(m, i, l, now, next))
				idx[n++] = i;
		if (n) {
			*ret_n = n;
			return it;
		}
	}
	return NULL;
}

static void tx_done(void *arg, struct smtp_out *c, const struct smtp_out_result *res);

static struct tx *tx_free(struct tx *t)
{
	if (t) {
		free(t->idx);
		free(t->addrs);
		free(t->body);
		free(t);
	}
	return NULL;
}

/*
 * Start a transaction on the idle connection rc.  budget_taken: a shared lane's budget
 * was already granted for one send.  Returns false when nothing was started and the
 * lane must wait (its timer is armed), true otherwise.
 */
static bool tx_start(struct lane *l, struct rconn *rc, uint64_t now, bool budget_taken)
{
	struct relay *r = l->r;
	const struct route_conf *conf = l->rt->conf;
	size_t max = conf->recipients_per_message ? conf->recipients_per_message : 100;
	struct tx *t = calloc(1, sizeof(*t));
	if (!t || !(t->idx = calloc(max, sizeof(*t->idx)))) {
		tx_free(t);
		return false;
	}
	uint64_t next = UINT64_MAX;
	struct lane_item *it = lane_pick(l, now, max, t->idx, &t->n, &next);
	if (!it) {
		tx_free(t);
		lane_arm(l, next == UINT64_MAX ? UINT64_MAX : next - now);
		return false;
	}
	if (!budget_taken) {
		uint64_t want = conf->count == ROUTE_COUNT_RECIPIENTS ? t->n : 1, wait = 0;
		uint64_t got = lane_budget_take(&l->b, want, now, &wait);
		if (got == 0) {
				tx_free(t);
			lane_arm(l, wait);
			return false;
		}
		for (uint64_t k = 0; k < got; k++)
			hist_append(r, l->name, now);
		if (conf->count == ROUTE_COUNT_RECIPIENTS)
			t->n = got;
	}
	struct rmsg *m = it->m;
	if (msg_open_file(r, m) < 0) {
		/* gone (deleted behind the relay's back) or unreadable: forget it */
		tx_free(t);
		if (m->busy == 0)
			msg_free(r, m);
		else
			m->deleted = true;
		return true;
	}
	t->body = calloc(m->qm.ix.nbody ? m->qm.ix.nbody : 1, sizeof(*t->body));
	t->addrs = calloc(t->n, sizeof(*t->addrs));
	if (!t->body || !t->addrs ||
	    queue_file_body(m->qm.map, m->qm.size, &m->qm.ix, collect_body, t) < 0) {
		tx_free(t);
		msg_close_file(m);
		return false;
	}
	for (size_t k = 0; k < t->n; k++) {
		t->addrs[k] = str_cstr(m->addr[t->idx[k]]);
		m->r[t->idx[k]].busy = true;
		m->r[t->idx[k]].attempts++;
	}
	m->busy++;
	t->m = m;
	t->lane = l;
	t->rc = rc;
	t->msg = (struct smtp_out_msg){
		.sender = str_cstr(m->sender),
		.rcpt = t->addrs,
		.nrcpt = t->n,
		.body = t->body,
		.nbody = t->nbody,
		.size = m->size,
		.eightbit = (m->flags & QUEUE_8BITMIME) != 0,
		.smtputf8 = (m->flags & QUEUE_SMTPUTF8) != 0,
	};
	evtimer_del(rc->idle_timer);
	rc->st = RC_BUSY;
	l->nidle--;
	rc->tx = t;
	l->transactions++;
	r->st.transactions++;
	rlog(r, LOG_LEVEL_DEBUG, "qid=%s lane=%s mta=%s transaction: %zu recipient(s)", m->id, l->name,
	     smtp_out_peer(rc->c), t->n);
	int e = smtp_out_send(rc->c, &t->msg, tx_done, t);
	if (e < 0) {
		struct smtp_out_result res = { .stage = SMTP_STAGE_MAIL, .error = e,
					       .why = "the connection cannot be used" };
		tx_done(t, rc->c, &res);
	}
	return true;
}

static void dsn_code(const struct smtp_reply *rep, char def, char *out, size_t len)
{
	if (rep && rep->enh_class)
		snprintf(out, len, "%d.%d.%d", rep->enh_class, rep->enh_subject, rep->enh_detail);
	else
		snprintf(out, len, "%c.0.0", def);
}

/* A recipient's own outcome. */
static void rcpt_outcome(struct relay *r, struct tx *t, size_t k, const struct classify_result *cr,
			 const struct smtp_reply *rep, const char *text, const char *mta,
			 struct classify_result *sig, char *sigtext, size_t siglen)
{
	struct rmsg *m = t->m;
	struct lane *l = t->lane;
	size_t i = t->idx[k];
	char dsn[16];
	switch (cr->verdict) {
	case CLASSIFY_OK:
		set_status(r, m, i, QUEUE_DELIVERED);
		attempt_log(r, m, i, "sent", l->name, mta, "", text);
		dsn_code(rep, '2', dsn, sizeof(dsn));
		delivery_log(r, LOG_LEVEL_INFO, m, i, l->name, mta, "sent", dsn, text, NULL);
		r->st.delivered++;
		l->delivered++;
		break;
	case CLASSIFY_FAIL:
		dsn_code(rep, '5', dsn, sizeof(dsn));
		set_status(r, m, i, QUEUE_FAILED);
		attempt_log(r, m, i, "failed", l->name, mta, dsn, text);
		delivery_log(r, LOG_LEVEL_NOTICE, m, i, l->name, mta, "bounced", dsn, text, NULL);
		r->st.failed++;
		l->failed++;
		break;
	case CLASSIFY_RETRY:
		if (rep && ((rep->code == 452 && (!rep->enh_class || (rep->enh_subject == 5 &&
									 rep->enh_detail == 3))) ||
			    (rep->code == 552 && rep->enh_class == 5 && rep->enh_subject == 5 &&
			     rep->enh_detail == 3))) {
			/* too many recipients (RFC 5321 4.5.3.1.10): the next transaction */
			m->r[i].next_try = 0;
			if (m->r[i].attempts)
				m->r[i].attempts--;
			attempt_log(r, m, i, "deferred", l->name, mta, "", text);
			dsn_code(rep, '4', dsn, sizeof(dsn));
			delivery_log(r, LOG_LEVEL_INFO, m, i, l->name, mta, "deferred", dsn, text,
				     "(too many recipients: the next transaction)");
			break;
		}
		rcpt_retry(r, m, i, cr->for_ms);
		attempt_log(r, m, i, "deferred", l->name, mta, "", text);
		dsn_code(rep, '4', dsn, sizeof(dsn));
		delivery_log(r, LOG_LEVEL_INFO, m, i, l->name, mta, "deferred", dsn, text, NULL);
		break;
	case CLASSIFY_SUSPEND:
	case CLASSIFY_SLOW:
		/* the lane's problem, not the recipient's: it stays as it was, due again as
		 * soon as the lane sends, and the attempt does not count for its backoff */
		m->r[i].next_try = 0;
		if (m->r[i].attempts)
			m->r[i].attempts--;
		dsn_code(rep, '4', dsn, sizeof(dsn));
		delivery_log(r, LOG_LEVEL_INFO, m, i, l->name, mta,
			     cr->verdict == CLASSIFY_SUSPEND ? "suspended" : "deferred", dsn, text,
			     "(the lane's throttling: the recipient stays queued)");
		if (sig->verdict != CLASSIFY_SUSPEND) {
			*sig = *cr;
			snprintf(sigtext, siglen, "%s", text);
		}
		break;
	}
}

/* Recipient k's RCPT reply (code 0: none). */
static const struct smtp_reply *rcpt_reply(const struct smtp_out_result *res, size_t k)
{
	static const struct smtp_reply none;
	return res->rcpt ? &res->rcpt[k] : &none;
}

static void tx_done(void *arg, struct smtp_out *c, const struct smtp_out_result *res)
{
	struct tx *t = arg;
	struct rconn *rc = t->rc;
	struct lane *l = t->lane;
	struct rmsg *m = t->m;
	struct relay *r = rc->r;
	const struct relay_conf *conf = &r->crt->conf;
	char mta[300];
	snprintf(mta, sizeof(mta), "%s", c ? smtp_out_peer(c) : "-");
	for (char *p = mta; *p; p++)
		if (*p == ' ')
			*p = '_';
	char text[1200];
	struct classify_result sig = { 0 };
	char sigtext[1200] = "";
	bool success = false;
	unsigned prior = c ? smtp_out_transactions(c) : 0;

	if (res->error == 0 && res->stage == SMTP_STAGE_DOT && res->reply.code / 100 == 2) {
		/* the message went: each recipient the server took is delivered */
		success = true;
		for (size_t k = 0; k < t->n; k++) {
			const struct smtp_reply *rep = rcpt_reply(res, k);
			struct classify_result cr;
			if (rep->code / 100 == 2) {
				cr = (struct classify_result){ .verdict = CLASSIFY_OK, .for_ms = -1 };
				reply_text(res, &res->reply, text, sizeof(text));
			} else {
				classify_reply(rc->cls, SMTP_STAGE_RCPT, 0, rep, &cr);
				reply_text(res, rep, text, sizeof(text));
			}
			rcpt_outcome(r, t, k, &cr, cr.verdict == CLASSIFY_OK ? &res->reply : rep, text,
				     mta, &sig, sigtext, sizeof(sigtext));
		}
	} else if (res->stage == SMTP_STAGE_DOT && res->error < 0) {
		/* the uncertain window: the server may have taken the message */
		reply_text(res, NULL, text, sizeof(text));
		for (size_t k = 0; k < t->n; k++) {
			const struct smtp_reply *rep = rcpt_reply(res, k);
			size_t i = t->idx[k];
			if (rep->code / 100 != 2) {
				struct classify_result cr;
				char rt[1200];
				classify_reply(rc->cls, SMTP_STAGE_RCPT, 0, rep, &cr);
				reply_text(res, rep, rt, sizeof(rt));
				rcpt_outcome(r, t, k, &cr, rep, rt, mta, &sig, sigtext, sizeof(sigtext));
				continue;
			}
			set_status(r, m, i, QUEUE_UNCERTAIN);
			attempt_log(r, m, i, "uncertain", l->name, mta, "", text);
			delivery_log(r, LOG_LEVEL_WARNING, m, i, l->name, mta, "uncertain", "4.4.2",
				     text, conf->uncertain == RELAY_UNCERTAIN_HOLD
				     ? "(lost after the message was sent: held)"
				     : "(lost after the message was sent: sent again later, possibly "
				       "twice)");
			r->st.uncertain++;
			rcpt_retry(r, m, i, -1);
		}
		if (conf->uncertain == RELAY_UNCERTAIN_HOLD) {
			/* written, so that `sluice queue` shows it and a restart keeps it */
			m->held = true;
			queue_set_control(r->q, &m->qm, QUEUE_CTL_HOLD, 'H');
		}
	} else if (res->error == 0 && res->reply.code && res->stage >= SMTP_STAGE_RCPT) {
		/* refused at RCPT (every recipient), DATA or the final dot */
		struct classify_result whole;
		classify_reply(rc->cls, res->stage, 0, &res->reply, &whole);
		char wtext[1200];
		reply_text(res, &res->reply, wtext, sizeof(wtext));
		for (size_t k = 0; k < t->n; k++) {
			const struct smtp_reply *rep = rcpt_reply(res, k);
			struct classify_result cr;
			if (res->stage != SMTP_STAGE_RCPT && rep->code / 100 == 2) {
				rcpt_outcome(r, t, k, &whole, &res->reply, wtext, mta, &sig, sigtext,
					     sizeof(sigtext));
				continue;
			}
			if (!rep->code) {
				m->r[t->idx[k]].next_try = 0;
				continue;
			}
			classify_reply(rc->cls, SMTP_STAGE_RCPT, 0, rep, &cr);
			reply_text(res, rep, text, sizeof(text));
			rcpt_outcome(r, t, k, &cr, rep, text, mta, &sig, sigtext, sizeof(sigtext));
		}
	} else {
		/* before any recipient: the session, MAIL FROM, or a connection lost before
		 * the dot */
		reply_text(res, res->reply.code ? &res->reply : NULL, text, sizeof(text));
		bool stale = res->error < 0 && prior > 0 && res->stage <= SMTP_STAGE_MAIL;
		struct classify_result cr;
		if (stale) {
			/* a reused connection the server had closed: not the lane's fault */
			cr = (struct classify_result){ .verdict = CLASSIFY_SUSPEND, .for_ms = -1 };
			for (size_t k = 0; k < t->n; k++)
				m->r[t->idx[k]].next_try = 0;
		} else if (res->error == -EMSGSIZE) {
			cr = (struct classify_result){ .verdict = CLASSIFY_FAIL, .for_ms = -1 };
			snprintf(text, sizeof(text), "552 5.3.4 message of %" PRIu64 " bytes exceeds "
				 "the server's limit of %" PRIu64, m->size, res->size_limit);
		} else if (res->error == -EPROTONOSUPPORT) {
			cr = (struct classify_result){ .verdict = CLASSIFY_FAIL, .for_ms = -1 };
			snprintf(text, sizeof(text), "553 5.6.7 the server does not support "
				 "SMTPUTF8, which the message needs");
		} else {
			classify_reply(rc->cls, res->stage, res->error,
				       res->reply.code ? &res->reply : NULL, &cr);
		}
		struct smtp_reply synth = { 0 };
		const struct smtp_reply *rep = res->reply.code ? &res->reply : &synth;
		if (res->error == -EMSGSIZE)
			synth = (struct smtp_reply){ .code = 552, .enh_class = 5, .enh_subject = 3,
						     .enh_detail = 4 };
		else if (res->error == -EPROTONOSUPPORT)
			synth = (struct smtp_reply){ .code = 553, .enh_class = 5, .enh_subject = 6,
						     .enh_detail = 7 };
		if (!stale) {
			for (size_t k = 0; k < t->n; k++)
				rcpt_outcome(r, t, k, &cr, rep, text, mta, &sig, sigtext,
					     sizeof(sigtext));
		}
	}

	for (size_t k = 0; k < t->n; k++)
		m->r[t->idx[k]].busy = false;
	m->busy--;
	flush_post(r, m);
	if (sig.signal || sig.verdict == CLASSIFY_SUSPEND || sig.verdict == CLASSIFY_SLOW)
		lane_signal(l, &sig, sigtext);
	else if (success)
		lane_budget_success(&l->b);

	rc->tx = NULL;
	bool keep = c && smtp_out_usable(c) && !r->stopping &&
		    (!l->rt || !l->rt->conf->messages_per_connection ||
		     smtp_out_transactions(c) < l->rt->conf->messages_per_connection) &&
		    !lane_budget_suspended(&l->b, realtime_ns());
	if (keep)
		conn_idle(rc);
	else
		conn_close(rc, true);
	tx_free(t);
	if (m->busy == 0) {
		msg_close_file(m);
		msg_check_done(r, m); /* waits for the flush */
	}
	lane_kick(l);
}

/* ---- the scheduler ---- */

static struct rconn *lane_idle_conn(struct lane *l)
{
	struct rconn *rc;
	TAILQ_FOREACH(rc, &l->conns, link)
		if (rc->st == RC_IDLE)
			return rc;
	return NULL;
}

static void lane_shared_take(struct lane *l, struct rconn *rc);

static void lane_kick(struct lane *l)
{
	struct relay *r = l->r;
	if (r->stopping || !l->rt || l->deciding)
		return;
	for (;;) {
		uint64_t now = realtime_ns();
		if (lane_budget_suspended(&l->b, now)) {
			lane_close_idle(l);
			lane_arm(l, l->b.suspended_until - now);
			return;
		}
		uint64_t next = UINT64_MAX;
		size_t one, n1;
		if (!lane_pick(l, now, 1, &one, &n1, &next)) {
			lane_arm(l, next == UINT64_MAX ? UINT64_MAX : next - now);
			return;
		}
		struct rconn *idle = lane_idle_conn(l);
		if (!idle) {
			const struct route_conf *conf = l->rt->conf;
			uint64_t wait = conf->shared ? 0 : lane_budget_wait(&l->b, now);
			if (wait) {
				lane_arm(l, wait);
				return;
			}
			unsigned cap = conf->connections ? conf->connections : 1;
			if (l->nconns < cap && l->nconnecting == 0)
				lane_connect(l);
			/* a connection's ready, or a transaction's end, kicks the lane again */
			return;
		}
		if (l->rt->conf->shared && r->store) {
			lane_shared_take(l, idle);
			return;
		}
		if (!tx_start(l, idle, now, false))
			return;
	}
}

/* ---- shared lanes: the budget is in Redis ---- */

static void on_shared(struct store_slide_call *call, int rc, uint64_t wait_ns)
{
	struct lane *l = call->arg;
	struct relay *r = l->r;
	l->deciding = false;
	l->call = NULL;
	free(call);
	if (r->stopping || !l->rt)
		return;
	uint64_t now = realtime_ns();
	if (rc < 0) {
		/* no answer: the lane stops rather than risk the shared limit */
		char text[200];
		snprintf(text, sizeof(text), "the shared budget cannot be reached: %s",
			 strerror(-rc));
		struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = 10000,
					      .signal = "store" };
		lane_signal(l, &cr, text);
		lane_kick(l);
		return;
	}
	if (rc == 0) {
		lane_arm(l, wait_ns);
		return;
	}
	/* admitted: remember it locally too (for `sluice lanes` and the history) */
	lane_budget_remember(&l->b, now);
	l->b.sends++;
	hist_append(r, l->name, now);
	struct rconn *idle = lane_idle_conn(l);
	if (!idle || !tx_start(l, idle, now, true)) {
		/* XXX the connection went away or nothing is due any more: the granted send
		 * is unused (the lane only sends less) */
	}
	lane_kick(l);
}

static void lane_shared_take(struct lane *l, struct rconn *rc)
{
	struct relay *r = l->r;
	struct store_slide_call *call = calloc(1, sizeof(*call));
	if (!call)
		return;
	call->name = l->name;
	call->nwin = l->b.rate.n;
	for (unsigned i = 0; i < l->b.rate.n; i++) {
		call->n[i] = lane_budget_limit(&l->b, i);
		call->window_ns[i] = lane_budget_window(&l->b, i);
	}
	call->take = true;
	call->now = 0; /* Redis's clock: the nodes share it */
	call->done = on_shared;
	call->arg = l;
	l->deciding = true;
	l->call = call;
	int e = store_slide_start(r->store, call);
	if (e == STORE_PENDING)
		return;
	l->deciding = false;
	l->call = NULL;
	free(call);
	if (e == -ENOTSUP) {
		/* not a cluster store: this node's own budget */
		tx_start(l, rc, realtime_ns(), false);
		return;
	}
	struct classify_result cr = { .verdict = CLASSIFY_SUSPEND, .for_ms = 10000,
				      .signal = "store" };
	lane_signal(l, &cr, "the shared budget cannot be asked");
}

/* ---- the sweep: expiry, bounces that could not be queued, history ---- */

static void expire(struct relay *r, struct rmsg *m, uint64_t now)
{
	const struct relay_conf *c = &r->crt->conf;
	if (!c->lifetime_ms || m->busy || m->bouncing || m->deleted || m->held)
		return; /* held mail waits for the operator, as Postfix's hold queue does */
	if (m->arrival_us * 1000 + (uint64_t)c->lifetime_ms * 1000000u > now)
		return;
	if (msg_open_file(r, m) < 0)
		return;
	char text[200], d[32];
	fmt_dur((uint64_t)c->lifetime_ms * 1000000u, d, sizeof(d));
	snprintf(text, sizeof(text), "delivery time expired: the message stayed in the queue "
		 "for %s", d);
	bool any = false;
	for (size_t i = 0; i < m->nrcpt; i++) {
		char s = m->r[i].status;
		if (s != QUEUE_TODO && s != QUEUE_UNCERTAIN)
			continue;
		set_status(r, m, i, QUEUE_FAILED);
		attempt_log(r, m, i, "failed", m->r[i].lane ? m->r[i].lane->name : "-", "", "4.4.7",
			    text);
		delivery_log(r, LOG_LEVEL_NOTICE, m, i, m->r[i].lane ? m->r[i].lane->name : "-", "",
			     "bounced", "4.4.7", text, NULL);
		r->st.failed++;
		any = true;
	}
	if (any) {
		enum queue_msg_state st;
		queue_settle(r->q, &m->qm, &st);
	}
	msg_close_file(m);
	msg_check_done(r, m);
}

/* Every 30 s, or a quarter of queue.lifetime when that is shorter. */
static void arm_sweep(struct relay *r)
{
	int64_t ms = SWEEP_MS;
	int64_t quarter = r->crt->conf.lifetime_ms / 4;
	if (quarter > 0 && quarter < ms)
		ms = quarter < 250 ? 250 : quarter;
	quarter = r->crt->conf.delay_warning_ms / 4;
	if (quarter > 0 && quarter < ms)
		ms = quarter < 250 ? 250 : quarter;
	struct timeval tv = timeval_from_ms((uint64_t)ms);
	evtimer_add(r->sweep, &tv);
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	uint64_t now = realtime_ns();
	struct rmsg *m, *next;
	for (m = TAILQ_FIRST(&r->msgs); m; m = next) {
		next = TAILQ_NEXT(m, link);
		expire(r, m, now);
	}
	for (m = TAILQ_FIRST(&r->msgs); m; m = next) {
		next = TAILQ_NEXT(m, link);
		msg_check_done(r, m);
	}
	int64_t dw = r->crt->conf.delay_warning_ms;
	TAILQ_FOREACH(m, &r->msgs, link) {
		if (dw <= 0 || m->warned || m->busy || m->bouncing || m->deleted || m->held ||
		    m->arrival_us * 1000 + (uint64_t)dw * 1000000u > now)
			continue;
		bool pending = false;
		for (size_t i = 0; i < m->nrcpt && !pending; i++)
			pending = m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN;
		if (pending)
			dsn_start(r, m, true);
	}
	/* an MX lane per destination domain: one that holds nothing and remembers no send
	 * that still counts goes (its history is in relay.lanes until compacted) */
	struct lane *l, *lnext;
	for (l = TAILQ_FIRST(&r->lanes); l; l = lnext) {
		lnext = TAILQ_NEXT(l, link);
		if (!l->domain || !TAILQ_EMPTY(&l->items) || !TAILQ_EMPTY(&l->conns) || l->query ||
		    l->call || lane_budget_suspended(&l->b, now))
			continue;
		bool counts = false;
		for (unsigned i = 0; i < l->b.rate.n && !counts; i++)
			counts = lane_budget_used(&l->b, i, now) > 0;
		if (counts)
			continue;
		TAILQ_REMOVE(&r->lanes, l, link);
		r->nlanes--;
		event_free(l->timer);
		lane_budget_done(&l->b);
		free(l->targets);
		free(l->name);
		free(l->domain);
		free(l);
	}
	if (r->hist_lines > 100000)
		hist_compact(r);
	arm_sweep(r);
}

/* ---- the mailbox, on the relay's loop ---- */

static void stop_now(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		while (!TAILQ_EMPTY(&l->conns)) {
			struct rconn *rc = TAILQ_FIRST(&l->conns);
			if (rc->tx) {
				/* its recipients stay T on disk: sent again after the restart */
				rc->tx->m->busy--;
				tx_free(rc->tx);
				rc->tx = NULL;
			}
			conn_close(rc, false);
		}
	}
	event_base_loopexit(r->base, NULL);
}

static void begin_stop(struct relay *r, int64_t deadline_ms)
{
	if (r->stopping) {
		/* a second stop: a shorter deadline wins */
		struct timeval tv = timeval_from_ms((uint64_t)(deadline_ms > 0 ? deadline_ms : 0));
		if (deadline_ms < r->stop_deadline_ms) {
			r->stop_deadline_ms = deadline_ms;
			evtimer_add(r->stop_timer, &tv);
		}
		return;
	}
	r->stopping = true;
	r->stop_deadline_ms = deadline_ms;
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		lane_close_idle(l);
		evtimer_del(l->timer);
		if (l->call) {
			store_slide_cancel(r->store, l->call);
			free(l->call);
			l->call = NULL;
			l->deciding = false;
		}
		if (l->query) {
			mx_cancel(l->query);
			l->query = NULL;
		}
	}
	if (r->st.active_connections == 0) {
		event_base_loopexit(r->base, NULL);
		return;
	}
	struct timeval tv = timeval_from_ms(r->stop_deadline_ms);
	evtimer_add(r->stop_timer, &tv);
}

static void on_mailbox(evutil_socket_t fd, short what, void *arg)
{
	struct relay *r = arg;
	uint64_t v;
	ssize_t n = read(r->mb_fd, &v, sizeof(v));
	(void)n;
	pthread_mutex_lock(&r->mb_lock);
	struct mb_item *it = r->mb_head;
	r->mb_head = NULL;
	r->mb_tail = &r->mb_head;
	pthread_mutex_unlock(&r->mb_lock);
	while (it) {
		struct mb_item *next = it->next;
		struct rmsg *m;
		switch (it->kind) {
		case MB_QUEUE:
			m = msg_find(r, it->id);
			switch (it->ev) {
			case QUEUE_EV_NEW:
				if (!m && msg_load(r, it->id) == 0 && (m = msg_find(r, it->id)))
					lanes_of_msg_kick(m);
				break;
			case QUEUE_EV_HOLD:
				if (m)
					m->held = true;
				break;
			case QUEUE_EV_RELEASE:
			case QUEUE_EV_FLUSH:
				if (!m) {
					if (msg_load(r, it->id) < 0 || !(m = msg_find(r, it->id)))
						break;
				}
				if (it->ev == QUEUE_EV_RELEASE)
					m->held = false;
				else
					for (size_t i = 0; i < m->nrcpt; i++)
						m->r[i].next_try = 0;
				lanes_of_msg_kick(m);
				break;
			case QUEUE_EV_DELETE:
				if (m) {
					m->deleted = true;
					msg_check_done(r, m);
				}
				break;
			}
			free(it);
			break;
		case MB_DSN_DONE:
			m = msg_find(r, it->id);
			if (it->rc == 0)
				r->st.dsn_sent++;
			if (it->rc == 0 && it->delayed)
				r->st.dsn_delay_sent++;
			if (m && it->rc == 0 && it->delayed) {
				m->bouncing = false;
				m->warned = true;
				if (msg_open_file(r, m) == 0) {
					queue_set_control(r->q, &m->qm, QUEUE_CTL_WARNED, 'W');
					queue_msg_sync(&m->qm);
					msg_close_file(m);
				}
				msg_check_done(r, m);
				lanes_of_msg_kick(m);
			} else if (m && it->rc == 0) {
				bounce_done(r, m);
			} else if (m) {
				m->bouncing = false;
				rlog(r, LOG_LEVEL_ERROR, "qid=%s bounce cannot be committed: %s (tried again "
				     "later)", it->id, strerror(-it->rc));
			}
			free(it);
			break;
		case MB_CALL:
			it->rc = it->fn(r, it->arg);
			pthread_mutex_lock(&r->mb_lock);
			it->done = true;
			pthread_cond_broadcast(&r->mb_cond);
			pthread_mutex_unlock(&r->mb_lock);
			break;
		case MB_STOP:
			begin_stop(r, it->deadline_ms);
			free(it);
			break;
		case MB_SETTLED:
			m = msg_find(r, it->id);
			if (it->rc < 0)
				rlog(r, LOG_LEVEL_ERROR, "qid=%s statuses cannot be flushed: %s", it->id,
				     strerror(-it->rc));
			if (m && m->flushing) {
				m->flushing--;
				if (it->rc < 0)
					m->flushing++; /* not on disk: never removed in this run */
				else
					msg_check_done(r, m);
			}
			free(it);
			break;
		}
		it = next;
	}
}

/* ---- the thread ---- */

static void load_queue(struct relay *r)
{
	char (*ids)[QUEUE_ID_LEN + 1] = NULL;
	size_t n = 0;
	if (queue_ids(r->q, &ids, &n) < 0) {
		rlog(r, LOG_LEVEL_ERROR, "the queue cannot be listed: out of memory");
		return;
	}
	for (size_t i = 0; i < n; i++)
		msg_load(r, ids[i]);
	free(ids);
	size_t msgs = 0, rcpts = 0;
	struct rmsg *m;
	TAILQ_FOREACH(m, &r->msgs, link) {
		msgs++;
		for (size_t i = 0; i < m->nrcpt; i++)
			rcpts += m->r[i].status == QUEUE_TODO || m->r[i].status == QUEUE_UNCERTAIN;
	}
	rlog(r, LOG_LEVEL_INFO, "started: %zu message(s) with %zu recipient(s) to deliver, "
	     "%zu route(s)", msgs, rcpts, r->crt->conf.nroutes);
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link)
		lane_kick(l);
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	thread_set_base(r->base);
	load_queue(r);
	arm_sweep(r);
	event_base_dispatch(r->base);
	/* The loop is over (stopping, and its connections are gone) before relay_stop()
	 * joins: calls posted from now on fail, and those already waiting are answered here,
	 * so that no thread (`sluice lanes` during the drain, a metrics scrape) waits for a
	 * loop that will not run again. */
	pthread_mutex_lock(&r->mb_lock);
	r->mb_closed = true;
	struct mb_item **pp = &r->mb_head;
	while (*pp) {
		struct mb_item *it = *pp;
		if (it->kind == MB_CALL) {
			*pp = it->next; /* before done: the caller's item is gone after it */
			it->rc = -ESHUTDOWN;
			it->done = true;
		} else {
			pp = &it->next;
		}
	}
	r->mb_tail = pp;
	pthread_cond_broadcast(&r->mb_cond);
	pthread_mutex_unlock(&r->mb_lock);
	/* connections still saying QUIT, and those cut by the deadline, go now */
	smtp_out_abandon_quitting(r->base);
	thread_set_base(NULL);
	return NULL;
}

/* ---- the public side ---- */

struct relay *relay_new(const struct relay_conf *conf, struct queue *q, struct store *store,
			struct policy *rules, relay_log_fn *log, void *log_arg, char *err,
			size_t errlen)
{
	struct relay *r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->q = q;
	r->qd = queue_directory(q);
	r->store = store;
	r->rules = rules ? policy_ref(rules) : NULL;
	r->log = log;
	r->log_arg = log_arg;
	r->mb_fd = -1;
	r->hist_fd = -1;
	TAILQ_INIT(&r->msgs);
	TAILQ_INIT(&r->lanes);
	pthread_mutex_init(&r->mb_lock, NULL);
	pthread_cond_init(&r->mb_cond, NULL);
	r->mb_tail = &r->mb_head;
	pthread_mutex_init(&r->fl_lock, NULL);
	pthread_cond_init(&r->fl_cond, NULL);
	r->fl_tail = &r->fl_head;
	r->crt = conf_rt_new(conf, err, errlen);
	if (!r->crt) {
		relay_free(r);
		return NULL;
	}
	for (size_t i = 0; i < r->crt->conf.nroutes; i++) {
		const struct route_conf *rc = &r->crt->conf.routes[i];
		if (rc->shared && (!store || !store_is_shared(store))) {
			snprintf(err, errlen, "route \"%s\": shared = true needs store { type = "
				 "\"redis\"; }", rc->name);
			relay_free(r);
			return NULL;
		}
	}
	if (hist_load(r, err, errlen) < 0) {
		relay_free(r);
		return NULL;
	}
	hist_compact(r);
	r->base = event_base_new();
	r->mb_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!r->base || r->mb_fd < 0) {
		snprintf(err, errlen, "cannot make the relay's event loop: %s", strerror(errno));
		relay_free(r);
		return NULL;
	}
	r->mb_ev = event_new(r->base, r->mb_fd, EV_READ | EV_PERSIST, on_mailbox, r);
	r->sweep = evtimer_new(r->base, on_sweep, r);
	r->stop_timer = evtimer_new(r->base, stop_now, r);
	if (!r->mb_ev || !r->sweep || !r->stop_timer || event_add(r->mb_ev, NULL) < 0) {
		snprintf(err, errlen, "out of memory");
		relay_free(r);
		return NULL;
	}
	r->dns = mx_resolver_new(r->base, r->crt->conf.dns_servers, err, errlen);
	if (!r->dns) {
		relay_free(r);
		return NULL;
	}
	queue_set_listener(q, on_queue_event, r);
	return r;
}

int relay_start(struct relay *r)
{
	int e = pthread_create(&r->flusher, NULL, flusher_main, r);
	if (e)
		return -e;
	r->flusher_started = true;
	e = pthread_create(&r->thread, NULL, relay_main, r);
	if (e)
		return -e;
	r->started = true;
	return 0;
}

static void flusher_stop(struct relay *r)
{
	if (!r->flusher_started)
		return;
	pthread_mutex_lock(&r->fl_lock);
	r->fl_stop = true;
	pthread_cond_signal(&r->fl_cond);
	pthread_mutex_unlock(&r->fl_lock);
	pthread_join(r->flusher, NULL); /* what was handed over is flushed first */
	r->flusher_started = false;
}

struct new_conf {
	struct conf_rt *crt;
	struct policy *rules;
};

static int apply_conf(struct relay *r, void *arg)
{
	struct new_conf *ncf = arg;
	struct conf_rt *nc = ncf->crt;
	struct policy *old_rules = r->rules;
	r->rules = ncf->rules;
	ncf->rules = old_rules; /* released by the caller, off the relay's loop */
	struct conf_rt *old = r->crt;
	r->crt = nc;
	old->next = r->retired;
	r->retired = old;
	struct lane *l;
	TAILQ_FOREACH(l, &r->lanes, link) {
		const char *route = l->rt ? l->rt->conf->name : NULL;
		char rname[300];
		if (!route) {
			/* a lane whose route had gone: its name starts with the route's */
			snprintf(rname, sizeof(rname), "%s", l->name);
			rname[strcspn(rname, ":")] = '\0';
			route = rname;
		}
		struct route_rt *rt = route_rt_by_name(nc, route);
		if (rt && (rt->conf->mx != (l->domain != NULL)))
			rt = NULL;
		bool moved = !l->rt || !rt || (rt->conf->host && l->rt->conf->host &&
					       strcmp(rt->conf->host, l->rt->conf->host) != 0) ||
			     (rt->conf->port != l->rt->conf->port);
		l->rt = rt;
		if (rt)
			lane_budget_set_rate(&l->b, &rt->conf->rate, guard_ns(rt->conf));
		if (moved) {
			free(l->targets);
			l->targets = NULL;
			l->ntargets = 0;
		}
		/* connections made with the old settings: the idle ones go */
		lane_close_idle(l);
	}
	struct rmsg *m;
	TAILQ_FOREACH(m, &r->msgs, link)
		msg_route(r, m);
	TAILQ_FOREACH(l, &r->lanes, link)
		lane_kick(l);
	retired_sweep(r);
	rlog(r, LOG_LEVEL_INFO, "configuration applied (%zu route(s)); budgets keep their "
	     "history", nc->conf.nroutes);
	return 0;
}

int relay_reconfigure(struct relay *r, const struct relay_conf *conf, struct policy *rules)
{
	char err[256];
	struct new_conf ncf = { .crt = conf_rt_new(conf, err, sizeof(err)),
				.rules = rules ? policy_ref(rules) : NULL };
	if (!ncf.crt) {
		if (ncf.rules)
			policy_unref(ncf.rules);
		return -ENOMEM;
	}
	int e = call_sync(r, apply_conf, &ncf);
	if (e < 0)
		conf_rt_free(ncf.crt);
	if (ncf.rules)
		policy_unref(ncf.rules);
	return e;
}

void relay_shutdown(struct relay *r, int64_t deadline_ms)
{
	if (!r || !r->started)
		return;
	struct mb_item *it = calloc(1, sizeof(*it));
	if (it) {
		it->kind = MB_STOP;
		it->deadline_ms = deadline_ms;
		if (post(r, it) < 0)
			free(it);
	}
}

void relay_stop(struct relay *r, int64_t deadline_ms)
{
	if (!r || !r->started)
		return;
	relay_shutdown(r, deadline_ms);
	pthread_join(r->thread, NULL);
	flusher_stop(r);
	r->started = false;
	pthread_mutex_lock(&r->mb_lock);
	r->mb_closed = true;
	pthread_mutex_unlock(&r->mb_lock);
}

struct relay *relay_free(struct relay *r)
{
	if (!r)
		return NULL;
	relay_stop(r, 0);
	queue_set_listener(r->q, NULL, NULL);
	/* first: a lookup cancelled here calls back into its lane, which must still exist */
	r->dns = mx_resolver_free(r->dns);
	struct lane *l;
	while ((l = TAILQ_FIRST(&r->lanes))) {
		while (!TAILQ_EMPTY(&l->conns)) {
			struct rconn *rc = TAILQ_FIRST(&l->conns);
			if (rc->tx) {
				rc->tx->m->busy--;
				rc->tx = tx_free(rc->tx);
			}
			conn_close(rc, false);
		}
		TAILQ_REMOVE(&r->lanes, l, link);
		free(l->call); /* cancelled when the relay stopped */
		if (l->timer)
			event_free(l->timer);
		lane_budget_done(&l->b);
		free(l->targets);
		free(l->name);
		free(l->domain);
		free(l);
	}
	struct rmsg *m;
	while ((m = TAILQ_FIRST(&r->msgs))) {
		m->nitems = 0; /* the lanes are gone */
		msg_free(r, m);
	}
	if (r->mb_ev)
		event_free(r->mb_ev);
	if (r->sweep)
		event_free(r->sweep);
	if (r->stop_timer)
		event_free(r->stop_timer);
	for (struct mb_item *it = r->mb_head, *next; it; it = next) {
		next = it->next;
		if (it->kind != MB_CALL)
			free(it);
	}
	if (r->base)
		event_base_free(r->base);
	if (r->mb_fd >= 0)
		close(r->mb_fd);
	if (r->hist_fd >= 0)
		close(r->hist_fd);
	for (size_t i = 0; i < r->nhist; i++) {
		free(r->hist[i].name);
		free(r->hist[i].why);
	}
	free(r->hist);
	free(r->table);
	conf_rt_free(r->crt);
	if (r->rules)
		policy_unref(r->rules);
	while (r->retired) {
		struct conf_rt *c = r->retired;
		r->retired = c->next;
		conf_rt_free(c);
	}
	flusher_stop(r); /* relay_start() may have started it alone */
	pthread_mutex_destroy(&r->mb_lock);
	pthread_cond_destroy(&r->mb_cond);
	pthread_mutex_destroy(&r->fl_lock);
	pthread_cond_destroy(&r->fl_cond);
	free(r);
	return NULL;
}

/* ---- `sluice lanes` ---- */

struct lanes_arg {
	bool json, brief;
	size_t max;
	struct buf *out;
	const char *name;
	int64_t for_ms;
	struct relay_stats *st;
};

static void fmt_dur(uint64_t ns, char *out, size_t len)
{
	if (ns == UINT64_MAX)
		snprintf(out, len, "never");
	else if (ns < 1000000000u)
		snprintf(out, len, "%" PRIu64 "ms", ns / 1000000);
	else if (ns < UINT64_C(120) * 1000000000u)
		snprintf(out, len, "%.1fs", (double)ns / 1e9);
	else if (ns < UINT64_C(7200) * 1000000000u)
		snprintf(out, len, "%" PRIu64 "m%02" PRIu64 "s", ns / 60000000000u,
			 ns / 1000000000u % 60);
	else if (ns < UINT64_C(172800) * 1000000000u)
		snprintf(out, len, "%" PRIu64 "h%02" PRIu64 "m", ns / 3600000000000u,
			 ns / 60000000000u % 60);
	else
		snprintf(out, len, "%" PRIu64 "d%02" PRIu64 "h", ns / 86400000000000u,
			 ns / 3600000000000u % 24);
}

static void json_str(struct buf *b, const char *s)
{
	buf_append_byte(b, '"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			buf_printf(b, "\\%c", *p);
		else if (*p < 0x20 || *p >= 0x7f)
			buf_printf(b, "\\u%04x", *p);
		else
			buf_append_byte(b, *p);
	}
	buf_append_byte(b, '"');
}

static size_t lane_waiting(const struct lane *l)
{
	size_t waiting = 0;
	const struct lane_item *it;
	TAILQ_FOREACH(it, &l->items, link)
		waiting += it->pending;
	return waiting;
}

static void lane_brief_line(struct buf *b, const struct lane *l, size_t waiting, bool susp,
			    uint64_t now)
{
	buf_printf(b, "lane %-14.14s", l->name);
	for (unsigned i = 0; i < l->b.rate.n && i < 2; i++) {
		char w[64];
		rate_window_format(&l->b.rate.w[i], w, sizeof(w));
		char *slash = strchr(w, '/');
		buf_printf(b, " %" PRIu64 "/%" PRIu64 "%s", lane_budget_used(&l->b, i, now),
			   lane_budget_limit(&l->b, i), slash ? slash : "");
	}
	if (!l->b.rate.n)
		buf_append_cstr(b, " unlimited");
	char d[32];
	uint64_t wait = lane_budget_wait(&l->b, now);
	fmt_dur(wait, d, sizeof(d));
	unsigned cap = l->rt ? l->rt->conf->connections : 0;
	buf_printf(b, "  next %s  conns %u/%u  waiting %zu  sent/def/fail %" PRIu64 "/%" PRIu64
		   "/%" PRIu64 "%s\n", wait ? d : "now", l->nconns, cap, waiting, l->delivered,
		   l->deferred, l->failed, susp ? "  SUSPENDED" : "");
}

/*
 * For `sluice top`: "lanes N" (how many), then up to max "lane ..." lines, the lanes an
 * operator looks at first: suspended ones, then those with mail waiting, then the rest.
 */
static void do_lanes_brief(struct relay *r, struct buf *b, uint64_t now, size_t max)
{
	buf_printf(b, "lanes %u\n", r->nlanes);
	size_t shown = 0;
	for (int pass = 0; pass < 3; pass++) {
		struct lane *l;
		TAILQ_FOREACH(l, &r->lanes, link) {
			if (shown >= max)
				return;
			size_t waiting = lane_waiting(l);
			bool susp = lane_budget_suspended(&l->b, now);
			int rank = susp ? 0 : waiting ? 1 : 2;
			if (rank != pass)
				continue;
			lane_brief_line(b, l, waiting, susp, now);
			shown++;
		}
	}
}

static int do_lanes(struct relay *r, void *arg)
{
	struct lanes_arg *a = arg;
	struct buf *b = a->out;
	uint64_t now = realtime_ns();
	bool first = true;
	if (a->json)
		buf_append_cstr(b, "[");
	struct lane *l;
	if (a->brief) {
		do_lanes_brief(r, b, now, a->max);
		return 0;
	}
	TAILQ_FOREACH(l, &r->lanes, link) {
		size_t waiting = lane_waiting(l);
		bool susp = lane_budget_suspended(&l->b, now);
		uint64_t wait = lane_budget_wait(&l->b, now);
		const char *route = l->rt ? l->rt->conf->name : "(removed)";
		unsigned cap = l->rt ? l->rt->conf->connections : 0;
		if (a->json) {
			buf_append_cstr(b, first ? "\n  {\"lane\": " : ",\n  {\"lane\": ");
			json_str(b, l->name);
			buf_append_cstr(b, ", \"route\": ");
			json_str(b, route);
			buf_append_cstr(b, ", \"windows\": [");
			for (unsigned i = 0; i < l->b.rate.n; i++)
				buf_printf(b, "%s{\"limit\": %" PRIu64 ", \"configured\": %" PRIu64
					   ", \"window_ms\": %" PRIu64 ", \"used\": %" PRIu64 "}",
					   i ? ", " : "", lane_budget_limit(&l->b, i),
					   l->b.rate.w[i].count, l->b.rate.w[i].period_ns / 1000000,
					   lane_budget_used(&l->b, i, now));
			buf_printf(b, "], \"next_send_ms\": %" PRIu64 ", \"rate_percent\": %u, "
				   "\"connections\": %u, \"busy\": %u, \"max_connections\": %u, "
				   "\"waiting\": %zu, \"sends\": %" PRIu64 ", \"delivered\": %" PRIu64
				   ", \"deferred\": %" PRIu64 ", \"failed\": %" PRIu64
				   ", \"suspensions\": %" PRIu64 ", \"suspended\": %s",
				   wait / 1000000, (unsigned)(l->b.factor / 10000), l->nconns,
				   l->nconns - l->nidle - l->nconnecting, cap, waiting, l->b.sends,
				   l->delivered, l->deferred, l->failed, l->suspensions,
				   susp ? "true" : "false");
			if (susp)
				buf_printf(b, ", \"suspended_for_ms\": %" PRIu64,
					   (l->b.suspended_until - now) / 1000000);
			buf_append_cstr(b, ", \"reason\": ");
			json_str(b, susp ? l->b.why : "");
			buf_append_cstr(b, ", \"last\": ");
			json_str(b, l->last);
			buf_append_cstr(b, "}");
		} else {
			buf_printf(b, "%s%s (route %s)\n", first ? "" : "\n", l->name, route);
			for (unsigned i = 0; i < l->b.rate.n; i++) {
				char w[64];
				rate_window_format(&l->b.rate.w[i], w, sizeof(w));
				buf_printf(b, "  window %-12s used %" PRIu64 "/%" PRIu64 "%s\n", w,
					   lane_budget_used(&l->b, i, now), lane_budget_limit(&l->b, i),
					   lane_budget_limit(&l->b, i) < l->b.rate.w[i].count
					   ? " (slowed)" : "");
			}
			if (!l->b.rate.n)
				buf_append_cstr(b, "  unlimited\n");
			char d[32];
			fmt_dur(wait, d, sizeof(d));
			buf_printf(b, "  next send    %s\n", wait ? d : "now");
			buf_printf(b, "  rate         %u%% of configured\n",
				   (unsigned)(l->b.factor / 10000));
			buf_printf(b, "  connections  %u open (%u busy) of %u\n", l->nconns,
				   l->nconns - l->nidle - l->nconnecting, cap);
			buf_printf(b, "  waiting      %zu recipient(s)\n", waiting);
			buf_printf(b, "  sends %" PRIu64 ", delivered %" PRIu64 ", deferred %" PRIu64
				   ", failed %" PRIu64 ", suspensions %" PRIu64 "\n", l->b.sends,
				   l->delivered, l->deferred, l->failed, l->suspensions);
			if (susp && l->b.suspended_until - now > UINT64_C(10) * 365 * 86400 * 1000000000) {
				buf_printf(b, "  SUSPENDED    until resumed: %s\n", l->b.why);
			} else if (susp) {
				fmt_dur(l->b.suspended_until - now, d, sizeof(d));
				buf_printf(b, "  SUSPENDED    for %s: %s\n", d, l->b.why);
			} else {
				buf_append_cstr(b, "  state        active\n");
			}
			if (l->last[0])
				buf_printf(b, "  last signal  %s\n", l->last);
		}
		first = false;
	}
	if (a->json)
		buf_append_cstr(b, first ? "]\n" : "\n]\n");
	else if (first)
		buf_append_cstr(b, "no lanes yet: nothing has been sent\n");
	return b->len && b->len == b->max ? -ENOBUFS : 0;
}

int relay_lanes(struct relay *r, bool json, struct buf *out)
{
	struct lanes_arg a = { .json = json, .out = out };
	return call_sync(r, do_lanes, &a);
}

int relay_lanes_brief(struct relay *r, size_t max, struct buf *out)
{
	struct lanes_arg a = { .brief = true, .max = max, .out = out };
	return call_sync(r, do_lanes, &a);
}

static int do_suspend(struct relay *r, void *arg)
{
	struct lanes_arg *a = arg;
	struct lane *l = lane_find(r, a->name);
	if (!l)
		return -ENOENT;
	uint64_t now = realtime_ns();
	int64_t ns = a->for_ms > 0 ? a->for_ms * 1000000 : INT64_C(100) * 365 * 86400 * 1000000000;
	/* the operator's length replaces any suspension under way */
	l->b.suspended_until = 0;
	lane_budget_suspend(&l->b, now, ns, 0, 0, "suspended by the operator");
	l->suspensions++;
	r->st.suspensions++;
	hist_append_suspension(r, l);
	rlog(r, LOG_LEVEL_WARNING, "lane=%s suspended by the operator", l->name);
	lane_close_idle(l);
	lane_kick(l);
	return 0;
}

static int do_resume(struct relay *r, void *arg)
{
	struct lanes_arg *a = arg;
	struct lane *l = lane_find(r, a->name);
	if (!l)
		return -ENOENT;
	lane_budget_resume(&l->b);
	hist_append_suspension(r, l);
	rlog(r, LOG_LEVEL_NOTICE, "lane=%s resumed by the operator", l->name);
	lane_kick(l);
	return 0;
}

int relay_lane_suspend(struct relay *r, const char *name, int64_t for_ms)
{
	struct lanes_arg a = { .name = name, .for_ms = for_ms };
	return call_sync(r, do_suspend, &a);
}

int relay_lane_resume(struct relay *r, const char *name)
{
	struct lanes_arg a = { .name = name };
	return call_sync(r, do_resume, &a);
}

static int do_stats(struct relay *r, void *arg)
{
	struct lanes_arg *a = arg;
	*a->st = r->st;
	a->st->lanes = r->nlanes;
	return 0;
}

struct lane_metrics_arg {
	struct relay_lane_metrics *out;
	size_t max, n;
	struct relay_stats st;
};

static int do_lane_metrics(struct relay *r, void *arg)
{
	struct lane_metrics_arg *a = arg;
	uint64_t now = realtime_ns();
	struct lane *l;
	a->st = r->st;
	a->st.lanes = r->nlanes;
	TAILQ_FOREACH(l, &r->lanes, link) {
		if (a->n < a->max) {
			struct relay_lane_metrics *m = &a->out[a->n];
			memset(m, 0, sizeof(*m));
			fmt_fixed(m->name, sizeof(m->name), "%s", l->name);
			fmt_fixed(m->route, sizeof(m->route), "%s", l->rt ? l->rt->conf->name : "");
			m->sends = l->b.sends;
			m->delivered = l->delivered;
			m->deferred = l->deferred;
			m->failed = l->failed;
			m->suspensions = l->suspensions;
			m->nwin = l->b.rate.n;
			for (unsigned i = 0; i < l->b.rate.n && i < RATE_MAX_WINDOWS; i++) {
				m->window_s[i] = (double)l->b.rate.w[i].period_ns / 1e9;
				m->limit[i] = lane_budget_limit(&l->b, i);
				m->configured[i] = l->b.rate.w[i].count;
				m->used[i] = lane_budget_used(&l->b, i, now);
			}
			m->rate_factor = (double)l->b.factor / 1e6;
			m->suspended = lane_budget_suspended(&l->b, now);
			if (m->suspended)
				clean_text(l->b.why, m->reason, sizeof(m->reason));
			m->connections = l->nconns;
			m->max_connections = l->rt ? l->rt->conf->connections : 0;
		}
		a->n++;
	}
	return 0;
}

int relay_lane_metrics(struct relay *r, struct relay_lane_metrics *ret, size_t max,
		       size_t *ret_n, struct relay_stats *ret_stats)
{
	struct lane_metrics_arg a = { .out = ret, .max = max };
	int e = call_sync(r, do_lane_metrics, &a);
	if (e < 0)
		return e;
	*ret_n = a.n;
	*ret_stats = a.st;
	return 0;
}

void relay_stats(struct relay *r, struct relay_stats *ret)
{
	struct lanes_arg a = { .st = ret };
	memset(ret, 0, sizeof(*ret));
	call_sync(r, do_stats, &a);
}
