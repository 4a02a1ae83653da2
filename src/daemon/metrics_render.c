/*
 * metrics_render -- sluice's metrics page (see metrics_render.h and sluiced(8)).
 *
 * Each family is written whole (HELP, TYPE, then its samples), as the format requires.
 * Errors of the buffer (the page's maximum) stick: the first one is returned at the end.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "build_config.h"
#include "engine.h"
#include "live_sessions.h"
#include "metrics.h"
#include "metrics_render.h"
#include "policy.h"
#include "queue.h"
#include "relay.h"
#include "store.h"
#include "util.h"

#define MAX_LANES 1000   /* lanes on the page at most (MX lanes: one per domain) */
#define MAX_CLASSES 256

struct page {
	struct buf *out;
	int err;
};

static void fam(struct page *p, const char *name, const char *type, const char *help)
{
	int r = metrics_family(p->out, name, type, help);
	if (r < 0 && !p->err)
		p->err = r;
}

static void u64(struct page *p, const char *name, const struct metrics_label *l, size_t nl,
		uint64_t v)
{
	int r = metrics_sample_u64(p->out, name, l, nl, v);
	if (r < 0 && !p->err)
		p->err = r;
}

static void dbl(struct page *p, const char *name, const struct metrics_label *l, size_t nl,
		double v)
{
	int r = metrics_sample(p->out, name, l, nl, v);
	if (r < 0 && !p->err)
		p->err = r;
}

/* Families of one sample without labels, from a table. */
struct single {
	const char *name, *type, *help;
	uint64_t v;
};

static void singles(struct page *p, const struct single *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		fam(p, rows[i].name, rows[i].type, rows[i].help);
		u64(p, rows[i].name, NULL, 0, rows[i].v);
	}
}

static void hist(struct page *p, const char *name, const struct metrics_label *l, size_t nl,
		 const struct stat_hist *h)
{
	int r = metrics_histogram(p->out, name, l, nl, h);
	if (r < 0 && !p->err)
		p->err = r;
}

/* A family with one sample per row of a table (classes, lanes): the label is the row's
 * name, which is its first member; the value a member at off, unsigned or uint64_t. */
struct column {
	const char *name, *type, *help;
	size_t off;
	bool narrow;                 /* an unsigned, not a uint64_t */
};

static void by_row(struct page *p, const struct column *c, const char *label, const void *rows,
		   size_t stride, size_t n)
{
	fam(p, c->name, c->type, c->help);
	for (size_t i = 0; i < n; i++) {
		const char *row = (const char *)rows + i * stride;
		uint64_t v;
		if (c->narrow) {
			unsigned u;
			memcpy(&u, row + c->off, sizeof(u));
			v = u;
		} else {
			memcpy(&v, row + c->off, sizeof(v));
		}
		struct metrics_label l = { label, row };
		u64(p, c->name, &l, 1, v);
	}
}

/* ---- the process ---- */

/* /proc/stat's btime, read once (it is long: a line per CPU and the interrupts). */
static uint64_t boot_time(void)
{
	static _Atomic uint64_t cached;
	uint64_t bt = atomic_load(&cached);
	if (bt)
		return bt;
	FILE *f = fopen("/proc/stat", "re");
	if (!f)
		return 0;
	char *line = NULL;
	size_t cap = 0;
	while (!bt && getline(&line, &cap, f) > 0)
		bt = metrics_boot_time_parse(line);
	free(line);
	fclose(f);
	atomic_store(&cached, bt);
	return bt;
}

/* The figures of /proc/self/stat: one read per scrape.  0 or -errno (then the samples
 * are left out: a counter at 0 would read as a reset). */
static int proc_stat_read(uint64_t btime, struct metrics_proc_stat *ret)
{
	char buf[1024];
	int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -EIO;
	buf[n] = '\0';
	return metrics_proc_stat_parse(buf, sysconf(_SC_CLK_TCK), sysconf(_SC_PAGESIZE),
				       btime, ret);
}

static uint64_t max_fds(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return 0;
	return (uint64_t)rl.rlim_cur;
}

/* The process_* families as Prometheus's client libraries write them (names, types and
 * HELP of client_golang's process collector), so that the usual dashboards work. */
static void render_process(struct page *p, const struct metrics_sources *src)
{
	struct metrics_label v = { "version", SLUICE_VERSION };
	struct metrics_proc_stat ps = { 0 };
	uint64_t btime = boot_time(); /* once: the start time below is from this one */
	bool have_ps = proc_stat_read(btime, &ps) == 0;
	if (have_ps) {
		fam(p, "process_cpu_seconds_total", "counter",
		    "Total user and system CPU time spent in seconds.");
		dbl(p, "process_cpu_seconds_total", NULL, 0, ps.cpu_seconds);
	}
	int64_t fds = fd_count();
	if (fds >= 0) {
		fam(p, "process_open_fds", "gauge", "Number of open file descriptors.");
		u64(p, "process_open_fds", NULL, 0, (uint64_t)fds);
	}
	const struct single rows[] = {
		{ "process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds() },
		{ "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", ps.vsize },
		{ "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", ps.rss },
	};
	singles(p, rows, have_ps ? ARRAY_SIZE(rows) : 1);
	/* as client_golang: /proc/self/stat's starttime after /proc/stat's btime */
	if (have_ps && btime) {
		fam(p, "process_start_time_seconds", "gauge",
		    "Start time of the process since unix epoch in seconds.");
		dbl(p, "process_start_time_seconds", NULL, 0, ps.start_time);
	}

	fam(p, "sluice_build_info", "gauge", "The running version of sluiced (always 1).");
	u64(p, "sluice_build_info", &v, 1, 1);
	fam(p, "sluice_reloads_total", "counter", "Configuration reloads that succeeded.");
	u64(p, "sluice_reloads_total", NULL, 0, src->reloads);
	fam(p, "sluice_double_use_sessions_total", "counter",
	    "SMTP sessions that both the milter and the policy service served (one MTA using "
	    "both counts each event twice).");
	u64(p, "sluice_double_use_sessions_total", NULL, 0, live_sessions_doubles());
	if (have_ps) {
		fam(p, "sluice_threads", "gauge", "Threads of the process.");
		u64(p, "sluice_threads", NULL, 0, ps.threads);
	}
}

/* ---- services ---- */

static void render_services(struct page *p, const struct metrics_sources *src)
{
	struct service_stats st[16];
	size_t n = 0;
	for (; n < 16 && engine_service(src->engine, n); n++)
		service_stats(engine_service(src->engine, n), false, &st[n]);
	static const struct {
		const char *name, *type, *help;
	} fams[] = {
		{ "sluice_sessions", "gauge", "Sessions open now, per service." },
		{ "sluice_connections_total", "counter", "Connections accepted, per service." },
		{ "sluice_sessions_total", "counter", "Sessions ended, per service." },
		{ "sluice_sessions_refused_total", "counter",
		  "Connections refused (over max_sessions, or by the protocol), per service." },
		{ "sluice_protocol_errors_total", "counter",
		  "Sessions closed for a peer's protocol error, per service." },
		{ "sluice_session_timeouts_total", "counter",
		  "Sessions closed by their idle or command timeout, per service." },
		{ "sluice_request_deadlines_total", "counter",
		  "Sessions closed because a request was not whole within its deadline (also "
		  "counted as timeouts), per service." },
		{ "sluice_sessions_evicted_total", "counter",
		  "Sessions closed at max_sessions to serve a new connection, the slowest "
		  "request first, per service." },
	};
	for (size_t f = 0; f < ARRAY_SIZE(fams); f++) {
		fam(p, fams[f].name, fams[f].type, fams[f].help);
		for (size_t i = 0; i < n; i++) {
			struct metrics_label l = { "service", st[i].name };
			const struct service_counters *c = &st[i].total;
			uint64_t v[] = { st[i].current, c->connections, c->sessions, c->refused,
					 c->protocol_errors, c->timeouts, c->deadlines,
					 c->evicted };
			u64(p, fams[f].name, &l, 1, v[f]);
		}
	}
	fam(p, "sluice_session_duration_seconds", "histogram",
	    "Length of the sessions that ended, per service.");
	for (size_t i = 0; i < n; i++) {
		struct metrics_label l = { "service", st[i].name };
		hist(p, "sluice_session_duration_seconds", &l, 1, &st[i].total.duration.hist);
	}
	fam(p, "sluice_session_work_seconds", "histogram",
	    "Time the sessions that ended spent in sluice's handlers, per service.");
	for (size_t i = 0; i < n; i++) {
		struct metrics_label l = { "service", st[i].name };
		hist(p, "sluice_session_work_seconds", &l, 1, &st[i].total.work.hist);
	}
}

/* ---- rules and classes ---- */

static void render_rules(struct page *p, const struct metrics_sources *src)
{
	size_t n = policy_rule_count(src->rules);
	uint64_t *near = calloc(n ? n : 1, sizeof(*near));
	if (!near) {
		p->err = p->err ? p->err : -ENOMEM;
		return;
	}
	fam(p, "sluice_rule_decisions_total", "counter",
	    "Decisions per rule: verdict continue when within its limits, else the rule's "
	    "action (warn is a shadow rule's hit).  Reset by a reload.");
	for (size_t i = 0; i < n; i++) {
		const struct policy_rule *r = policy_rule_at(src->rules, i);
		uint64_t v[POLICY_ACTION_COUNT];
		policy_rule_counters(r, v, &near[i]);
		enum policy_action a = policy_rule_action(r);
		struct metrics_label l[2] = { { "rule", policy_rule_name(r) }, { "verdict", "continue" } };
		u64(p, "sluice_rule_decisions_total", l, 2, v[POLICY_ACCEPT]);
		l[1].value = policy_action_name(a);
		u64(p, "sluice_rule_decisions_total", l, 2, v[a]);
	}
	fam(p, "sluice_rule_near_limit_total", "counter",
	    "Decisions within a rule's limits that left a window above 80% of its burst.  "
	    "Reset by a reload.");
	for (size_t i = 0; i < n; i++) {
		struct metrics_label l = { "rule", policy_rule_name(policy_rule_at(src->rules, i)) };
		u64(p, "sluice_rule_near_limit_total", &l, 1, near[i]);
	}
	free(near);

	struct class_stats *cs = calloc(MAX_CLASSES, sizeof(*cs));
	if (!cs) {
		p->err = p->err ? p->err : -ENOMEM;
		return;
	}
	size_t nc = policy_class_stats(src->rules, cs, MAX_CLASSES);
	static_assert(offsetof(struct class_stats, name) == 0, "by_row() labels with the name");
	static const struct column cols[] = {
		{ "sluice_class_slots", "gauge",
		  "Sessions holding a slot of the host class now, incoming and outgoing.",
		  offsetof(struct class_stats, used), true },
		{ "sluice_class_entered_total", "counter", "Slots taken in the host class.",
		  offsetof(struct class_stats, entered), false },
		{ "sluice_class_refused_total", "counter",
		  "Sessions refused (or outgoing mail held back) because the host class was full.",
		  offsetof(struct class_stats, refused), false },
	};
	for (size_t c = 0; c < ARRAY_SIZE(cols); c++)
		by_row(p, &cols[c], "class", cs, sizeof(*cs), nc);
	fam(p, "sluice_class_slots_limit", "gauge",
	    "A host class's caps: direction inbound (incoming sessions are refused at it) and "
	    "total (sessions, incoming plus outgoing).");
	for (size_t i = 0; i < nc; i++) {
		struct metrics_label l[2] = { { "class", cs[i].name }, { "direction", "inbound" } };
		u64(p, "sluice_class_slots_limit", l, 2, cs[i].inbound);
		l[1].value = "total";
		u64(p, "sluice_class_slots_limit", l, 2, cs[i].sessions);
	}
	free(cs);
}

/* ---- the store ---- */

static void render_store(struct page *p, const struct metrics_sources *src)
{
	struct store *s = src->store;
	uint64_t decisions, errors;
	struct stat_hist lat;
	store_metrics_get(s, &decisions, &errors, &lat);
	struct store_stats ss;
	memset(&ss, 0, sizeof(ss));
	s->ops->stats(s->ctx, &ss);
	struct metrics_label l = { "store", s->type };
	fam(p, "sluice_store_decisions_total", "counter", "Decisions asked of the limits store.");
	u64(p, "sluice_store_decisions_total", &l, 1, decisions);
	fam(p, "sluice_store_errors_total", "counter",
	    "Decisions the store could not answer (the event passed, or was tempfailed by "
	    "on_failure = tempfail).");
	u64(p, "sluice_store_errors_total", &l, 1, errors);
	fam(p, "sluice_store_decision_seconds", "histogram",
	    "Time from asking the store for a decision to its answer.");
	hist(p, "sluice_store_decision_seconds", &l, 1, &lat);
	fam(p, "sluice_store_up", "gauge",
	    "1 when every connection of the store is usable (always 1 for memory).");
	u64(p, "sluice_store_up", &l, 1, !ss.shared || ss.up);
	fam(p, "sluice_store_on_failure", "gauge",
	    "1 while Redis cannot be reached and decisions follow on_failure.");
	u64(p, "sluice_store_on_failure", &l, 1, ss.shared && !ss.up);
	fam(p, "sluice_store_fallbacks_total", "counter", "Decisions answered by on_failure.");
	u64(p, "sluice_store_fallbacks_total", &l, 1, ss.fallbacks);
	fam(p, "sluice_store_keys", "gauge", "Records (key and window) the memory store holds.");
	u64(p, "sluice_store_keys", &l, 1, ss.keys);
	fam(p, "sluice_store_evicted_total", "counter",
	    "Records dropped because the memory store was full.");
	u64(p, "sluice_store_evicted_total", &l, 1, ss.evicted);
}

/* ---- the queue ---- */

static void render_queue(struct page *p, const struct metrics_sources *src)
{
	struct queue_stats q;
	queue_stats(src->queue, &q);
	fam(p, "sluice_queue_messages", "gauge", "Messages in the queue, by state (queued or held).");
	struct metrics_label l = { "state", "queued" };
	u64(p, "sluice_queue_messages", &l, 1, q.messages - q.held);
	l.value = "held";
	u64(p, "sluice_queue_messages", &l, 1, q.held);
	fam(p, "sluice_queue_recipients", "gauge",
	    "Recipients of the messages in the queue, by status: todo (T), uncertain (U), "
	    "delivered (D), failed (F).");
	static const char *const names[] = { "todo", "uncertain", "delivered", "failed" };
	uint64_t v[] = { q.rcpt_todo, q.rcpt_uncertain, q.rcpt_delivered, q.rcpt_failed };
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		l.value = names[i];
		u64(p, "sluice_queue_recipients", &l, 1, v[i]);
	}
	fam(p, "sluice_queue_bytes", "gauge", "Size of the messages in the queue.");
	u64(p, "sluice_queue_bytes", NULL, 0, q.bytes);
	uint64_t now_us = realtime_ns() / 1000;
	fam(p, "sluice_queue_oldest_message_age_seconds", "gauge",
	    "Age of the oldest message in the queue (0 when empty).");
	dbl(p, "sluice_queue_oldest_message_age_seconds", NULL, 0,
	    q.oldest_us && now_us > q.oldest_us ? (double)(now_us - q.oldest_us) / 1e6 : 0.0);
	fam(p, "sluice_queue_commits_total", "counter", "Messages committed to the queue.");
	u64(p, "sluice_queue_commits_total", NULL, 0, q.commits);
	fam(p, "sluice_queue_commit_batches_total", "counter",
	    "Commit batches (messages flushed to disk together).");
	u64(p, "sluice_queue_commit_batches_total", NULL, 0, q.batches);
	fam(p, "sluice_queue_fsyncs_total", "counter",
	    "Flushes to disk made by commits (syncfs, fdatasync and directory fsync calls).");
	u64(p, "sluice_queue_fsyncs_total", NULL, 0, q.syncs + q.dir_syncs);
	fam(p, "sluice_queue_commit_errors_total", "counter", "Messages whose commit failed.");
	u64(p, "sluice_queue_commit_errors_total", NULL, 0, q.commit_errors);
	fam(p, "sluice_queue_accepted_bytes_total", "counter", "Size of the messages committed.");
	u64(p, "sluice_queue_accepted_bytes_total", NULL, 0, q.accepted_bytes);
}

/* ---- the relay ---- */

/* XXX the lanes are read on the relay's loop, and this thread waits for the answer: a
 * loop busy for long (loading a large queue at start) delays the page -- never a worker,
 * never the mail.  After the loop has ended (stopping) the page goes without them. */
static void render_relay(struct page *p, const struct metrics_sources *src)
{
	struct relay_lane_metrics *lm = calloc(MAX_LANES, sizeof(*lm));
	size_t n = 0;
	struct relay_stats st;
	int e = lm ? relay_lane_metrics(src->relay, lm, MAX_LANES, &n, &st) : -ENOMEM;
	if (e < 0) {
		free(lm);
		return; /* stopping: the page goes without the relay */
	}
	size_t shown = n < MAX_LANES ? n : MAX_LANES;
	const struct single rows[] = {
		{ "sluice_relay_lanes", "gauge", "Lanes the relay knows (each lane is one budget).",
		  n },
		{ "sluice_relay_transactions_total", "counter", "Transactions started by the relay.",
		  st.transactions },
		{ "sluice_relay_connections", "gauge", "Outgoing connections open now.",
		  st.active_connections },
		{ "sluice_relay_connections_total", "counter", "Outgoing connections opened.",
		  st.connections },
	};
	singles(p, rows, ARRAY_SIZE(rows));
	fam(p, "sluice_relay_dsn_total", "counter",
	    "Delivery status notifications queued: kind bounce or delay (notice).");
	struct metrics_label k = { "kind", "bounce" };
	u64(p, "sluice_relay_dsn_total", &k, 1, st.dsn_sent - st.dsn_delay_sent);
	k.value = "delay";
	u64(p, "sluice_relay_dsn_total", &k, 1, st.dsn_delay_sent);

	static_assert(offsetof(struct relay_lane_metrics, name) == 0, "by_row() labels with it");
	static const struct column cols[] = {
		{ "sluice_lane_sends_total", "counter",
		  "Transactions the lane's budget admitted (each counted in every window).",
		  offsetof(struct relay_lane_metrics, sends), false },
		{ "sluice_lane_suspensions_total", "counter", "Suspensions of the lane.",
		  offsetof(struct relay_lane_metrics, suspensions), false },
		{ "sluice_lane_connections", "gauge", "Connections the lane has open now.",
		  offsetof(struct relay_lane_metrics, connections), true },
	};
	for (size_t c = 0; c < ARRAY_SIZE(cols); c++)
		by_row(p, &cols[c], "lane", lm, sizeof(*lm), shown);
	fam(p, "sluice_lane_recipients_total", "counter",
	    "Recipients by result: delivered, deferred (a retry scheduled), failed.");
	for (size_t i = 0; i < shown; i++) {
		struct metrics_label l[2] = { { "lane", lm[i].name }, { "result", "delivered" } };
		u64(p, "sluice_lane_recipients_total", l, 2, lm[i].delivered);
		l[1].value = "deferred";
		u64(p, "sluice_lane_recipients_total", l, 2, lm[i].deferred);
		l[1].value = "failed";
		u64(p, "sluice_lane_recipients_total", l, 2, lm[i].failed);
	}
	static const char *const bfam[] = { "sluice_lane_budget_used", "sluice_lane_budget_limit" };
	static const char *const bhelp[] = {
		"Sends counted in the lane's window now (window: its length).",
		"Sends the lane's window allows now (below the configured rate while slowed).",
	};
	for (size_t f = 0; f < 2; f++) {
		fam(p, bfam[f], "gauge", bhelp[f]);
		for (size_t i = 0; i < shown; i++)
			for (unsigned w = 0; w < lm[i].nwin; w++) {
				char win[32];
				fmt_fixed(win, sizeof(win), "%gs", lm[i].window_s[w]);
				struct metrics_label l[2] = { { "lane", lm[i].name }, { "window", win } };
				u64(p, bfam[f], l, 2, f ? lm[i].limit[w] : lm[i].used[w]);
			}
	}
	fam(p, "sluice_lane_rate_factor", "gauge",
	    "Adaptive shaping: the share of the configured rate the lane sends at (1 = all).");
	for (size_t i = 0; i < shown; i++) {
		struct metrics_label l = { "lane", lm[i].name };
		dbl(p, "sluice_lane_rate_factor", &l, 1, lm[i].rate_factor);
	}
	fam(p, "sluice_lane_suspended", "gauge", "1 while the lane is suspended.");
	for (size_t i = 0; i < shown; i++) {
		struct metrics_label l = { "lane", lm[i].name };
		u64(p, "sluice_lane_suspended", &l, 1, lm[i].suspended);
	}
	fam(p, "sluice_lane_suspension_info", "gauge",
	    "The reason of a suspended lane's suspension (1; suspended lanes only).");
	for (size_t i = 0; i < shown; i++) {
		if (!lm[i].suspended)
			continue;
		struct metrics_label l[2] = { { "lane", lm[i].name }, { "reason", lm[i].reason } };
		u64(p, "sluice_lane_suspension_info", l, 2, 1);
	}
	free(lm);
}

int metrics_render(const struct metrics_sources *src, struct buf *out)
{
	struct page p = { .out = out };
	render_process(&p, src);
	render_services(&p, src);
	render_rules(&p, src);
	render_store(&p, src);
	if (src->queue)
		render_queue(&p, src);
	if (src->relay)
		render_relay(&p, src);
	return p.err;
}
