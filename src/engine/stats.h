/*
 * stats -- running min / mean / max / standard deviation, and per-service counters.
 *
 * Welford's online algorithm keeps the variance numerically stable over millions of
 * samples; two accumulators merge exactly (Chan et al.), so workers keep their own shard
 * and the reader merges them.
 */
#ifndef SLUICE_STATS_H
#define SLUICE_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/*
 * A histogram over fixed bucket edges, in seconds: 1 ms ... 60 s, the same for every
 * histogram sluice keeps, so shards merge by adding counts.  bucket[i] counts the values
 * v <= stat_hist_le[i] not counted by a lower bucket; bucket[STAT_HIST_EDGES] counts the
 * rest (+Inf).  Counts are per bucket, not cumulative: the exposition adds them up.
 */
#define STAT_HIST_EDGES 15
#define STAT_HIST_BUCKETS (STAT_HIST_EDGES + 1)
extern const double stat_hist_le[STAT_HIST_EDGES];

struct stat_hist {
	uint64_t bucket[STAT_HIST_BUCKETS];
	double sum;
};

/* The bucket of a value (NaN and negative values go to the first). */
unsigned stat_hist_index(double v);
void stat_hist_add(struct stat_hist *h, double v);
void stat_hist_merge(struct stat_hist *into, const struct stat_hist *b);
uint64_t stat_hist_count(const struct stat_hist *h);

struct stat_acc {
	uint64_t n;
	double min, max, mean, m2;
	struct stat_hist hist;
};

void stat_acc_add(struct stat_acc *a, double v);
void stat_acc_merge(struct stat_acc *into, const struct stat_acc *b);
double stat_acc_stddev(const struct stat_acc *a);

struct service_counters {
	uint64_t connections;     /* accepted */
	uint64_t refused;         /* over max_sessions, or refused by the protocol */
	uint64_t protocol_errors; /* sessions closed for a peer's protocol error */
	uint64_t timeouts;        /* sessions closed by idle or command timeout */
	uint64_t deadlines;       /* of the timeouts: a request over its deadline */
	uint64_t evicted;         /* closed at max_sessions to make room, slowest first */
	uint64_t sessions;        /* finished */
	struct stat_acc duration; /* seconds, per finished session */
	struct stat_acc work;     /* seconds in handlers, per finished session */
};

void service_counters_merge(struct service_counters *into, const struct service_counters *b);

/*
 * An interval ends at each stats_interval tick (when the daemon logs its stats lines) and
 * at each `sluice stats --reset`.  `last` is the most recent interval that ended; before
 * one has, it is a copy of the interval in progress and last_complete is false.
 */
struct service_stats {
	const char *name;
	uint64_t current;
	uint64_t peak;
	struct service_counters total;    /* since start */
	struct service_counters interval; /* the interval in progress */
	struct service_counters last;     /* the last complete interval (see above) */
	double interval_seconds;
	double last_seconds;
	bool last_complete;
	double uptime_seconds;
};

/*
 * Human text: one table of all n services (counters, then session duration in seconds and
 * work time in milliseconds, each for the last interval and since start), within 80
 * columns.  Appends to out; returns 0 or -ENOSPC.
 */
int service_stats_format(struct buf *out, const struct service_stats *st, size_t n);
/* One JSON member, "name":{...} (see sluice(1), STATS). */
int service_stats_json(struct buf *out, const struct service_stats *st);

#endif
