/*
 * util -- small generic helpers: clocks, fd flags, bounded formatting.
 */
#ifndef SLUICE_UTIL_H
#define SLUICE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

#include "str.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Monotonic clock in nanoseconds / milliseconds. */
static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Wall-clock time in ns (CLOCK_REALTIME): for state that must survive a restart. */
static inline uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t now_ms(void)
{
	return now_ns() / 1000000u;
}

static inline struct timeval timeval_from_ms(uint64_t ms)
{
	return (struct timeval){ .tv_sec = (time_t)(ms / 1000),
				 .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
}

int fd_set_nonblock(int fd);
int fd_set_cloexec(int fd);
/* The descriptors the process holds (from /proc/self/fd), or -1 when it cannot tell. */
int64_t fd_count(void);

/* snprintf that reports truncation: 0, or -ENOBUFS when the output did not fit. */
int fmt_fixed(char *dst, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An RFC 5322 date ("Sun, 22 Nov 2026 05:12:00 +0100") of t at utc_offset seconds east of
 * UTC, for Date: and Received: fields; English names whatever the locale.  32 bytes do. */
void fmt_rfc5322_date(char *out, size_t len, time_t t, long utc_offset);

/* A random number from a per-thread generator (xorshift64*, seeded from getrandom):
 * for spreading retries, never for secrets. */
uint64_t random_u64(void);
/* FNV-1a (64 bits), for hash tables and names whose keys are not chosen by peers (a table
 * keyed by peer input uses a keyed hash): fnv1a64_str(FNV1A64_INIT, s), chained by passing
 * the previous value; fnv1a64_u64 folds a number in as one step. */
#define FNV1A64_INIT UINT64_C(14695981039346656037)
#define FNV1A64_PRIME UINT64_C(1099511628211)
static inline uint64_t fnv1a64_str(uint64_t h, const char *s)
{
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * FNV1A64_PRIME;
	return h;
}
static inline uint64_t fnv1a64_u64(uint64_t h, uint64_t v)
{
	return (h ^ v) * FNV1A64_PRIME;
}
/* The value of a hex digit (either case), or -1. */
int hex_value(char c);

/* v spread at random over [v - below% of v, v + above% of v]: retries of clients
 * refused together, or reconnections after one failure, do not come back at once. */
uint64_t jitter(uint64_t v, unsigned below_pct, unsigned above_pct);

/* A duration for a person, in one of three styles:
 *   DURATION_EXACT  the largest unit that divides it, as sluice.conf writes it:
 *                   90000 -> "90s", 3600000 -> "1h", 1500 -> "1500ms", "2w";
 *   DURATION_UP     at most two units, rounded up (never less than the real wait):
 *                   "45s", "3m20s", "2h5m", "1d3h" (whole seconds; ms rounded up);
 *   DURATION_BRIEF  a short reading for tables and listings, to the minute past an
 *                   hour: "250ms", "1.5s", "2m05s", "1h02m", "3d04h"; UINT64_MAX is
 *                   "never".
 * ms is milliseconds; the result is cut to fit len. */
enum duration_style { DURATION_EXACT, DURATION_UP, DURATION_BRIEF };
const char *fmt_duration(char *out, size_t len, uint64_t ms, enum duration_style style);

/*
 * Peer text made safe for a log line, a reply or a report: printable ASCII only, any
 * other byte '?'.  At most max bytes are written (and never more than dstlen - 1: dst
 * is always terminated).  Flags:
 *   TEXT_NO_QUOTES   '"' becomes '?' too (text shown between quotes);
 *   TEXT_FOLD_SPACE  one line from many: NUL dropped, white space (CR, LF, tabs, runs of
 *                    spaces) one space, none at either end;
 *   TEXT_MARK_CUT    "..." after text that was cut, when it fits.
 * Returns the length written.
 */
enum { TEXT_NO_QUOTES = 1, TEXT_FOLD_SPACE = 2, TEXT_MARK_CUT = 4 };
size_t text_sanitize(char *dst, size_t dstlen, struct str s, size_t max, unsigned flags);

/*
 * Is given the secret want?  In time that depends on want's length only, never on where
 * the first differing byte is, so that a peer guessing a password learns nothing from
 * how long a refusal takes (the compiler may not end the loop early: the bytes are
 * gathered through a volatile).
 */
bool secret_equal(struct str given, struct str want);

/* Read a whole file (<= max bytes) into a malloc'ed NUL-terminated buffer. */
int file_read_all(const char *path, size_t max, char **ret, size_t *ret_len);

/* fsync the directory path: the names created, renamed or removed in it are then on
 * disk.  0 or -errno. */
int dir_sync(const char *path);

/* dir_sync of the directory that holds path (its last component's parent). */
int dir_sync_parent(const char *path);

/* The event loop the calling thread runs, set by that thread when its loop starts (the
 * engine's workers, the daemon's main thread); NULL on other threads.  Backends that
 * answer asynchronously (the Redis store) find their connection for this loop by it. */
struct event_base;
void thread_set_base(struct event_base *b);
struct event_base *thread_base(void);

/* Per-thread shards of hot counters.  thread_shard() is the calling thread's shard, fixed
 * for its life: the first THREAD_SHARDS - 1 threads to ask get one each, which they alone
 * write (counter_add() then needs no locked instruction); later threads share the last
 * one (and add atomically).  Each shard's counters sit on cache lines of their own, so
 * the workers' increments do not bounce lines; readers add the shards up. */
#define THREAD_SHARDS 32
unsigned thread_shard(void);

/* Add v to a counter of shard `shard` (relaxed: readers only sum). */
static inline void counter_add(_Atomic uint64_t *c, unsigned shard, uint64_t v)
{
	if (shard < THREAD_SHARDS - 1)
		atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
				      memory_order_relaxed);
	else
		atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

#endif
