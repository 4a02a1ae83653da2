/*
 * stats -- online statistics and their rendering (see stats.h).
 */
#include <math.h>
#include <stdio.h>

#include "stats.h"

/* From one millisecond (a milter command answered from memory) to a minute (a session
 * left open by a slow client): Prometheus's usual 1-2.5-5 steps. */
const double stat_hist_le[STAT_HIST_EDGES] = {
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
};

unsigned stat_hist_index(double v)
{
	/* a binary search: four comparisons on the hot path */
	unsigned lo = 0, hi = STAT_HIST_EDGES;
	if (!(v > stat_hist_le[0]))
		return 0;
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		if (v <= stat_hist_le[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

void stat_hist_add(struct stat_hist *h, double v)
{
	h->bucket[stat_hist_index(v)]++;
	h->sum += v;
}

void stat_hist_merge(struct stat_hist *into, const struct stat_hist *b)
{
	for (unsigned i = 0; i < STAT_HIST_BUCKETS; i++)
		into->bucket[i] += b->bucket[i];
	into->sum += b->sum;
}

uint64_t stat_hist_count(const struct stat_hist *h)
{
	uint64_t n = 0;
	for (unsigned i = 0; i < STAT_HIST_BUCKETS; i++)
		n += h->bucket[i];
	return n;
}

void stat_acc_add(struct stat_acc *a, double v)
{
	stat_hist_add(&a->hist, v);
	if (a->n == 0 || v < a->min)
		a->min = v;
	if (a->n == 0 || v > a->max)
		a->max = v;
	a->n++;
	double d = v - a->mean;
	a->mean += d / (double)a->n;
	a->m2 += d * (v - a->mean);
}

void stat_acc_merge(struct stat_acc *into, const struct stat_acc *b)
{
	if (b->n == 0)
		return;
	stat_hist_merge(&into->hist, &b->hist);
	if (into->n == 0) {
		*into = *b;
		return;
	}
	double n1 = (double)into->n, n2 = (double)b->n, n = n1 + n2;
	double d = b->mean - into->mean;
	into->m2 += b->m2 + d * d * n1 * n2 / n;
	into->mean += d * n2 / n;
	into->n += b->n;
	if (b->min < into->min)
		into->min = b->min;
	if (b->max > into->max)
		into->max = b->max;
}

double stat_acc_stddev(const struct stat_acc *a)
{
	return a->n > 1 ? sqrt(a->m2 / (double)(a->n - 1)) : 0.0;
}

void service_counters_merge(struct service_counters *into, const struct service_counters *b)
{
	into->connections += b->connections;
	into->refused += b->refused;
	into->protocol_errors += b->protocol_errors;
	into->timeouts += b->timeouts;
	into->deadlines += b->deadlines;
	into->evicted += b->evicted;
	into->sessions += b->sessions;
	stat_acc_merge(&into->duration, &b->duration);
	stat_acc_merge(&into->work, &b->work);
}

/* "300 s", "2.5 h", "3.0 d": an interval's length in a few columns. */
static void format_span(char *out, size_t len, double s)
{
	if (s < 600)
		snprintf(out, len, "%.0f s", s);
	else if (s < 36000)
		snprintf(out, len, "%.0f min", s / 60);
	else if (s < 3 * 86400)
		snprintf(out, len, "%.1f h", s / 3600);
	else
		snprintf(out, len, "%.1f d", s / 86400);
}

/* One row of a min / mean / max / std-dev table, the values multiplied by scale. */
static int format_acc_row(struct buf *out, const char *name, const char *label,
			  const struct stat_acc *a, double scale)
{
	if (a->n == 0)
		return buf_printf(out, "%-8s %-15s %9d %9s %9s %9s %9s\n", name, label, 0, "-",
				  "-", "-", "-");
	return buf_printf(out, "%-8s %-15s %9llu %9.3f %9.3f %9.3f %9.3f\n", name, label,
			  (unsigned long long)a->n, a->min * scale, a->mean * scale,
			  a->max * scale, stat_acc_stddev(a) * scale);
}

static int format_acc_table(struct buf *out, const char *title, const struct service_stats *st,
			    size_t n, bool work)
{
	double scale = work ? 1000.0 : 1.0;
	int r = buf_printf(out, "%-24s %9s %9s %9s %9s %9s\n", title, "sessions", "min", "mean",
			   "max", "std-dev");
	for (size_t i = 0; r == 0 && i < n; i++) {
		char span[32], label[48];
		format_span(span, sizeof(span), st[i].last_seconds);
		snprintf(label, sizeof(label), "%s %s", st[i].last_complete ? "last" : "so far",
			 span);
		const struct service_counters *l = &st[i].last, *t = &st[i].total;
		r = format_acc_row(out, st[i].name, label, work ? &l->work : &l->duration, scale);
		if (r == 0)
			r = format_acc_row(out, "", "since start", work ? &t->work : &t->duration,
					   scale);
	}
	return r;
}

int service_stats_format(struct buf *out, const struct service_stats *st, size_t n)
{
	/* the counters since start, and the errors of the last interval beside them */
	int r = buf_printf(out, "%-8s %11s %6s %6s %8s %10s %9s %9s\n", "service", "connections",
			   "now", "peak", "refused", "proto-err", "timeouts", "last-err");
	for (size_t i = 0; r == 0 && i < n; i++) {
		const struct service_counters *t = &st[i].total, *l = &st[i].last;
		r = buf_printf(out, "%-8s %11llu %6llu %6llu %8llu %10llu %9llu %9llu\n",
			       st[i].name, (unsigned long long)t->connections,
			       (unsigned long long)st[i].current, (unsigned long long)st[i].peak,
			       (unsigned long long)t->refused,
			       (unsigned long long)t->protocol_errors,
			       (unsigned long long)t->timeouts,
			       (unsigned long long)(l->refused + l->protocol_errors + l->timeouts));
	}
	if (r == 0)
		r = buf_append_byte(out, '\n');
	if (r == 0)
		r = format_acc_table(out, "session duration (s)", st, n, false);
	if (r == 0)
		r = buf_append_byte(out, '\n');
	if (r == 0)
		r = format_acc_table(out, "work time (ms)", st, n, true);
	return r;
}

static int json_acc(struct buf *out, const char *what, const struct stat_acc *a)
{
	return buf_printf(out,
			  "\"%s\":{\"count\":%llu,\"min\":%.9f,\"mean\":%.9f,\"max\":%.9f,"
			  "\"stddev\":%.9f}",
			  what, (unsigned long long)a->n, a->n ? a->min : 0.0, a->mean,
			  a->n ? a->max : 0.0, stat_acc_stddev(a));
}

static int json_counters(struct buf *out, double seconds, const struct service_counters *c)
{
	int r = buf_printf(out,
			   "{\"seconds\":%.3f,\"connections\":%llu,\"sessions\":%llu,"
			   "\"refused\":%llu,\"protocol_errors\":%llu,\"timeouts\":%llu,"
			   "\"deadlines\":%llu,\"evicted\":%llu,",
			   seconds, (unsigned long long)c->connections,
			   (unsigned long long)c->sessions, (unsigned long long)c->refused,
			   (unsigned long long)c->protocol_errors, (unsigned long long)c->timeouts,
			   (unsigned long long)c->deadlines, (unsigned long long)c->evicted);
	if (r == 0)
		r = json_acc(out, "duration", &c->duration);
	if (r == 0)
		r = buf_append_byte(out, ',');
	if (r == 0)
		r = json_acc(out, "work", &c->work);
	if (r == 0)
		r = buf_append_byte(out, '}');
	return r;
}

int service_stats_json(struct buf *out, const struct service_stats *st)
{
	/* Service names are configuration constants ("milter", "control"): no escaping. */
	int r = buf_printf(out,
			   "\"%s\":{\"sessions_current\":%llu,\"sessions_peak\":%llu,"
			   "\"connections\":%llu,\"refused\":%llu,\"protocol_errors\":%llu,"
			   "\"timeouts\":%llu,\"deadlines\":%llu,\"evicted\":%llu,",
			   st->name, (unsigned long long)st->current, (unsigned long long)st->peak,
			   (unsigned long long)st->total.connections,
			   (unsigned long long)st->total.refused,
			   (unsigned long long)st->total.protocol_errors,
			   (unsigned long long)st->total.timeouts,
			   (unsigned long long)st->total.deadlines,
			   (unsigned long long)st->total.evicted);
	if (r == 0)
		r = json_acc(out, "duration", &st->total.duration);
	if (r == 0)
		r = buf_append_byte(out, ',');
	if (r == 0)
		r = json_acc(out, "work", &st->total.work);
	if (r == 0)
		r = buf_append_cstr(out, ",\"since_start\":");
	if (r == 0)
		r = json_counters(out, st->uptime_seconds, &st->total);
	if (r == 0)
		r = buf_append_cstr(out, ",\"interval\":");
	if (r == 0)
		r = json_counters(out, st->interval_seconds, &st->interval);
	if (r == 0)
		r = buf_printf(out, ",\"last_interval_complete\":%s,\"last_interval\":",
			       st->last_complete ? "true" : "false");
	if (r == 0)
		r = json_counters(out, st->last_seconds, &st->last);
	if (r == 0)
		r = buf_append_byte(out, '}');
	return r;
}
