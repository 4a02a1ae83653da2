/*
 * metrics -- the Prometheus endpoint: GET /metrics over HTTP (libevent's evhttp), on one
 * thread of its own with its own event loop, and the text exposition format (0.0.4).
 *
 * The thread is fixed (one, whatever the number of scrapers): it accepts at most
 * max_connections connections at once -- past that the listener stops accepting and
 * scrapers wait in the kernel's backlog -- and closes any connection idle or unfinished
 * after METRICS_TIMEOUT_S.  Requests are bounded: METRICS_MAX_HEADERS bytes of headers,
 * METRICS_MAX_BODY of body (413 past them).  GET or HEAD /metrics renders the page; any
 * other path is 404, any other method 405.  Rendering is the caller's callback, run on
 * this thread: it must read counters (atomics, short critical sections) and never wait
 * on a session's loop.
 */
#ifndef SLUICE_METRICS_H
#define SLUICE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "stats.h"

#define METRICS_TIMEOUT_S 10
#define METRICS_MAX_HEADERS 8192
#define METRICS_MAX_BODY 4096
#define METRICS_MAX_PAGE (16u << 20)

struct metrics;

/* Append the whole page to out; <0 answers 500. */
typedef int metrics_render_fn(void *arg, struct buf *out);

/*
 * Bind address (a socket string of sockspec.h: "inet:host:port", "inet:port@host", ...);
 * nothing is served until metrics_start().  0 and *ret, or -errno with err.
 */
int metrics_new(const char *address, unsigned max_connections, metrics_render_fn *render,
		void *arg, struct metrics **ret, char *err, size_t errlen);
/* Make the server and start its thread (after the daemon forks).  0 or -errno; then
 * metrics_free() cleans up. */
int metrics_start(struct metrics *m);

/* The address the endpoint is bound to (for the start's log line). */
const struct listen_addr *metrics_address(const struct metrics *m);
/* Stop the thread (waiting for a page being rendered), close the socket, free. */
struct metrics *metrics_free(struct metrics *m);

/* ---- the exposition format ---- */

struct metrics_label {
	const char *name;   /* [a-zA-Z_][a-zA-Z0-9_]* */
	const char *value;  /* any bytes: escaped (\\, \", \n); NULL is "" */
};

/* "# HELP name help\n# TYPE name type\n"; type: counter, gauge, histogram, untyped. */
int metrics_family(struct buf *out, const char *name, const char *type, const char *help);
/* "name{l1="v1",...} value\n"; integers print exactly. */
int metrics_sample_u64(struct buf *out, const char *name, const struct metrics_label *l,
		       size_t nl, uint64_t v);
int metrics_sample(struct buf *out, const char *name, const struct metrics_label *l, size_t nl,
		   double v);
/* The figures of a /proc/PID/stat line (proc(5)) that the process_* families need. */
struct metrics_proc_stat {
	double cpu_seconds;          /* utime + stime */
	double start_time;           /* seconds since the epoch: btime + starttime */
	uint64_t threads, vsize, rss;
};
/* Parses text (NUL-terminated) with the clock ticks per second tck, the page size and
 * the boot time btime (seconds since the epoch, /proc/stat's "btime").  0, or -EINVAL
 * for a line cut short or malformed (then *ret is unchanged). */
int metrics_proc_stat_parse(const char *text, long tck, long page, uint64_t btime,
			    struct metrics_proc_stat *ret);
/* The "btime" of a /proc/stat text (NUL-terminated), or 0 where there is none. */
uint64_t metrics_boot_time_parse(const char *text);
/* A histogram's _bucket (cumulative, le edges of stats.h, then +Inf), _sum and _count. */
int metrics_histogram(struct buf *out, const char *name, const struct metrics_label *l,
		      size_t nl, const struct stat_hist *h);

#endif
