/*
 * relay_view -- what the relay shows: `sluice lanes` (text, JSON, and the brief lines of
 * `sluice top`), the lanes of the metrics page, the stats, and an operator's suspend and
 * resume.  Each runs on the relay's thread (call_sync from a control worker or the
 * metrics thread), so it reads the lanes without locks.
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
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "dsn.h"
#include "relay_int.h"
#include "util.h"

/* ---- `sluice lanes` ---- */

struct lanes_arg {
	bool json, brief;
	size_t max;
	struct buf *out;
	const char *name;
	int64_t for_ms;
	struct relay_stats *st;
};

static size_t lane_waiting(const struct lane *l)
{
	return l->waiting;
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
	fmt_duration(d, sizeof(d), ns_to_ms(wait), DURATION_BRIEF);
	unsigned cap = lane_max_conns(l);
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
	uint64_t now = relay_now(r);
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
		unsigned cap = lane_max_conns(l);
		if (a->json) {
			buf_append_cstr(b, first ? "\n  {\"lane\": " : ",\n  {\"lane\": ");
			buf_append_json_string(b, l->name);
			buf_append_cstr(b, ", \"route\": ");
			buf_append_json_string(b, route);
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
			buf_append_json_string(b, susp ? l->b.why : "");
			buf_append_cstr(b, ", \"last\": ");
			buf_append_json_string(b, l->last);
			if (l->dane_status[0]) {
				buf_append_cstr(b, ", \"dane\": ");
				buf_append_json_string(b, l->dane_status);
			}
			group_view(l, true, b);
			signal_view(l, true, b, now);
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
			fmt_duration(d, sizeof(d), ns_to_ms(wait), DURATION_BRIEF);
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
				fmt_duration(d, sizeof(d), ns_to_ms(l->b.suspended_until - now),
					     DURATION_BRIEF);
				buf_printf(b, "  SUSPENDED    for %s: %s\n", d, l->b.why);
			} else {
				buf_append_cstr(b, "  state        active\n");
			}
			if (l->last[0])
				buf_printf(b, "  last signal  %s\n", l->last);
			if (l->dane_status[0])
				buf_printf(b, "  dane         %s\n", l->dane_status);
			group_view(l, false, b);
			signal_view(l, false, b, now);
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
	return base_call_sync(r, do_lanes, &a);
}

int relay_lanes_brief(struct relay *r, size_t max, struct buf *out)
{
	struct lanes_arg a = { .brief = true, .max = max, .out = out };
	return base_call_sync(r, do_lanes, &a);
}

static int do_suspend(struct relay *r, void *arg)
{
	struct lanes_arg *a = arg;
	struct lane *l = lane_find(r, a->name);
	if (!l)
		return -ENOENT;
	uint64_t now = relay_now(r);
	int64_t ns = a->for_ms > 0 ? a->for_ms * 1000000 : INT64_C(100) * 365 * 86400 * 1000000000;
	/* the operator's length replaces any suspension under way */
	l->b.suspended_until = 0;
	lane_budget_suspend(&l->b, now, ns, 0, 0, "suspended by the operator");
	l->suspensions++;
	r->st.suspensions++;
	hist_append_suspension(r, l);
	base_logf(r, LOG_LEVEL_WARNING, "lane=%s suspended by the operator", l->name);
	conn_close_idle(l);
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
	base_logf(r, LOG_LEVEL_NOTICE, "lane=%s resumed by the operator", l->name);
	lane_kick(l);
	return 0;
}

int relay_lane_suspend(struct relay *r, const char *name, int64_t for_ms)
{
	struct lanes_arg a = { .name = name, .for_ms = for_ms };
	return base_call_sync(r, do_suspend, &a);
}

int relay_lane_resume(struct relay *r, const char *name)
{
	struct lanes_arg a = { .name = name };
	return base_call_sync(r, do_resume, &a);
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
	uint64_t now = relay_now(r);
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
				text_sanitize(m->reason, sizeof(m->reason), str_cstr(l->b.why), SIZE_MAX,
					      TEXT_NO_QUOTES);
			m->connections = l->nconns;
			m->max_connections = lane_max_conns(l);
		}
		a->n++;
	}
	return 0;
}

int relay_lane_metrics(struct relay *r, struct relay_lane_metrics *ret, size_t max,
		       size_t *ret_n, struct relay_stats *ret_stats)
{
	struct lane_metrics_arg a = { .out = ret, .max = max };
	int e = base_call_sync(r, do_lane_metrics, &a);
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
	base_call_sync(r, do_stats, &a);
}
